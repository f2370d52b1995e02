// HDF5 checkpoints (core/io/checkpoint.h): bit-exact round trip of a trained state, piecewise
// (hyperslab) writes equal to whole writes, the checksum, every damaged input (flipped bit,
// truncation, not HDF5, wrong version, wrong model), the folder (keep the last K, newest valid,
// unfinished writes) and `parallax inspect`'s exit codes.
#include "core/io/checkpoint.h"
#include "core/base/rng.h"
#include "tests/support/test_util.h"

#include <hdf5.h>
#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

using namespace px;
using namespace px::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

// A trained tiny state (5 steps of the small job), computed once.
const LogicalState& trained() {
    static const LogicalState s = single_device(small_job());
    return s;
}

// The meta of a checkpoint at `step`: its history is one row per step, in order (the trained
// state's rows, continued with copies of its last row when the step is later).
CheckpointMeta meta_of(const LogicalState& s, i64 step) {
    std::vector<StepMetrics> history(s.history.begin(),
                                     s.history.begin() + std::min<i64>(step, s.history.size()));
    while (static_cast<i64>(history.size()) < step) {
        history.push_back(s.history.back());
        history.back().step = static_cast<i64>(history.size());
    }
    CheckpointMeta m = make_checkpoint_meta(small_job(), step, history);
    m.created = "2026-01-01T00:00:00Z";  // fixed, so two files can be compared attribute by attribute
    return m;
}

// Flips one bit of element `element` of a contiguous float32 dataset, in the raw file bytes.
void flip_bit(const std::string& path, const std::string& dataset, i64 element, int bit) {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    REQUIRE(f >= 0);
    hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
    REQUIRE(d >= 0);
    const haddr_t off = H5Dget_offset(d);
    H5Dclose(d);
    H5Fclose(f);
    REQUIRE(off != HADDR_UNDEF);
    std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
    const std::streamoff pos = static_cast<std::streamoff>(off) + element * 4 + bit / 8;
    io.seekg(pos);
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ (1 << (bit % 8)));
    io.seekp(pos);
    io.write(&c, 1);
    REQUIRE(io.good());
}

// Replaces an int64 root attribute through the HDF5 API.
void set_root_i64(const std::string& path, const char* key, std::int64_t value) {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    REQUIRE(f >= 0);
    REQUIRE(H5Adelete(f, key) >= 0);
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, key, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    REQUIRE(H5Awrite(a, H5T_NATIVE_INT64, &value) >= 0);
    H5Aclose(a);
    H5Sclose(s);
    H5Fclose(f);
}

void copy_prefix(const std::string& from, const std::string& to, std::uintmax_t bytes) {
    std::ifstream in(from, std::ios::binary);
    std::vector<char> buf(bytes);
    in.read(buf.data(), static_cast<std::streamsize>(bytes));
    std::ofstream out(to, std::ios::binary | std::ios::trunc);
    out.write(buf.data(), static_cast<std::streamsize>(bytes));
}

// Every dataset's bytes (as floats or int64/float64 bit patterns) and stored checksum.
std::vector<std::pair<std::string, std::vector<std::uint64_t>>> contents(const std::string& path) {
    const CheckpointReader r(path);
    std::vector<std::pair<std::string, std::vector<std::uint64_t>>> out;
    for (const DatasetInfo& d : r.datasets()) {
        std::vector<std::uint64_t> v{d.checksum};
        if (d.dtype == "float32") {
            std::vector<float> x(static_cast<size_t>(d.numel()));
            r.read(d.path, x.data());
            for (float f : x) v.push_back(std::bit_cast<std::uint32_t>(f));
        }
        out.emplace_back(d.path, v);
    }
    return out;
}

}  // namespace

TEST_CASE("the checksum is order-free, piecewise and sees every flipped bit", "[checkpoint_h5]") {
    std::vector<float> x(1000);
    fill_normal(x.data(), 1000, 0.0f, 1.0f, 5, 1, 0);
    const std::uint64_t whole = checksum_f32(x.data(), 1000);
    // Pieces summed with their logical indices give the whole.
    CHECK(checksum_f32(x.data(), 300) + checksum_f32(x.data() + 300, 1, 300) +
              checksum_f32(x.data() + 301, 699, 301) ==
          whole);
    // Every single bit of a few elements.
    for (const i64 i : {i64{0}, i64{1}, i64{517}, i64{999}})
        for (int bit = 0; bit < 32; bit++) {
            std::vector<float> y = x;
            std::uint32_t b = std::bit_cast<std::uint32_t>(y[i]) ^ (1u << bit);
            y[i] = std::bit_cast<float>(b);
            CHECK(checksum_f32(y.data(), 1000) != whole);
        }
    // Swapped elements.
    std::vector<float> y = x;
    std::swap(y[3], y[700]);
    CHECK(checksum_f32(y.data(), 1000) != whole);
    // Big enough to go parallel: same as sums of small pieces.
    std::vector<float> big(1 << 18);
    fill_normal(big.data(), i64(big.size()), 0.0f, 1.0f, 6, 1, 0);
    std::uint64_t pieces = 0;
    for (i64 i = 0; i < i64(big.size()); i += 1000)
        pieces += checksum_f32(big.data() + i, std::min<i64>(1000, i64(big.size()) - i), i);
    CHECK(pieces == checksum_f32(big.data(), i64(big.size())));
}

TEST_CASE("a trained state round-trips bit for bit, with its meta", "[checkpoint_h5]") {
    const std::string dir = temp_dir("ckpt_roundtrip");
    const LogicalState& s = trained();
    const Config cfg = small_job();
    const CheckpointMeta meta = meta_of(s, 5);
    const std::string path = checkpoint_path(dir, 5);
    CHECK(fs::path(path).filename() == "ckpt-00000005.h5");
    write_checkpoint(path, s, meta, cfg.model);
    CHECK(fs::exists(path));
    CHECK(list_checkpoints(dir).size() == 1);  // no temporary file left

    CheckpointMeta back;
    const LogicalState r = read_checkpoint(path, cfg.model, &back);
    check_same_bits(s, r);
    REQUIRE(r.history.size() == 5);
    for (size_t i = 0; i < 5; i++) {
        CHECK(r.history[i].step == s.history[i].step);
        CHECK(same_bits(std::vector<double>{r.history[i].lr}, std::vector<double>{s.history[i].lr}));
    }
    CHECK(back.step == 5);
    CHECK(back.seed == cfg.train.seed);
    CHECK(back.adam_step == 5);
    CHECK(back.data_next_step == 5);
    CHECK(back.rng_counter_base == 5);
    CHECK(back.loss_scale == 1.0);
    CHECK(back.growth_tracker == 0);
    CHECK(back.created == "2026-01-01T00:00:00Z");
    CHECK(back.parallax_version == "0.1.0");
    CHECK(back.data_source == data_source_description(cfg));
    CHECK_THAT(back.data_source, Contains("source=markov") && Contains("seed=1337"));
    CHECK(parse_config(back.config_toml, "ckpt") == parse_config(config_to_toml(cfg), "ckpt"));
    CHECK_NOTHROW(check_same_data(back, cfg, path));
    Config other = cfg;
    other.train.batch_size = 4;
    CHECK_THAT(error_of<CheckpointError>([&] { check_same_data(back, other, path); }),
               Contains(path) && Contains("batch=8") && Contains("batch=4"));
    other = cfg;
    other.data.markov_alpha = 0.5;
    CHECK_THAT(error_of<CheckpointError>([&] { check_same_data(back, other, path); }),
               Contains("alpha=0.25") && Contains("alpha=0.5"));

    // Every dataset verifies, and the listing is what the header says.
    const CheckpointReader reader(path);
    CHECK_NOTHROW(reader.verify_all());
    CHECK_NOTHROW(reader.check_model(cfg.model));
    CHECK(reader.shape("model/wte") == std::vector<i64>{32, 32});
    CHECK(reader.shape("/optim/v/h.1.attn.c_attn.weight") == std::vector<i64>{96, 32});
    CHECK(reader.shape("model/h.0.ln_1.bias") == std::vector<i64>{32});
    CHECK(reader.has("history/grad_norm"));
    CHECK(reader.datasets().size() == 3 * s.table.entries.size() + 8);

    // A hyperslab and a flat range read back the same numbers as the whole.
    const TableEntry& e = s.table.entries[size_t(s.table.find("h.1.mlp.c_fc.weight"))];  // (80, 32)
    std::vector<float> slab(10 * 7);
    reader.read("optim/m/h.1.mlp.c_fc.weight", Slab{20, 10, 5, 7}, slab.data());
    for (i64 r0 = 0; r0 < 10; r0++)
        for (i64 c = 0; c < 7; c++)
            CHECK(std::bit_cast<std::uint32_t>(slab[size_t(r0 * 7 + c)]) ==
                  std::bit_cast<std::uint32_t>(s.m[size_t(e.offset + (20 + r0) * 32 + 5 + c)]));
    std::vector<float> range(100);
    reader.read_range("model/h.1.mlp.c_fc.weight", 45, 100, range.data());
    CHECK(std::memcmp(range.data(), s.params.data() + e.offset + 45, 400) == 0);
}

TEST_CASE("ranks writing disjoint hyperslabs give the file a whole write gives", "[checkpoint_h5]") {
    const std::string dir = temp_dir("ckpt_piecewise");
    const LogicalState& s = trained();
    const ModelConfig mc = small_job().model;
    const CheckpointMeta meta = meta_of(s, 5);
    const std::string whole = dir + "/whole.h5", pieces = dir + "/pieces.h5";
    write_checkpoint(whole, s, meta, mc);

    {
        // Three "ranks" in one process: rank k writes rows [k R/3, (k+1) R/3) of matrices,
        // columns of vectors, and the Adam v moments as flat ranges cut at odd places (a ZeRO
        // shard's view), in reverse order.
        CheckpointWriter w(pieces, meta, mc);
        CHECK(fs::path(w.temp_path()).filename().string().rfind(".pieces.h5.tmp-", 0) == 0);
        CHECK(w.tensor_datasets().size() == 3 * s.table.entries.size());
        for (int rank = 2; rank >= 0; rank--) {
            for (const TableEntry& e : s.table.entries) {
                for (const auto& [path, base] :
                     {std::pair{model_dataset(e.name), s.params.data()},
                      std::pair{moment_dataset('m', e.name), s.m.data()}}) {
                    const i64 R = e.rows, C = e.cols;
                    if (R > 1) {
                        const i64 r0 = R * rank / 3, r1 = R * (rank + 1) / 3;
                        std::vector<float> buf(size_t((r1 - r0) * C));
                        std::memcpy(buf.data(), base + e.offset + r0 * C, buf.size() * 4);
                        w.write(path, Slab{r0, r1 - r0, 0, C}, buf.data());
                    } else {
                        const i64 c0 = C * rank / 3, c1 = C * (rank + 1) / 3;
                        w.write(path, Slab{0, 1, c0, c1 - c0}, base + e.offset + c0);
                    }
                }
                const i64 n = e.numel();
                const i64 cut[4] = {0, n / 3 + 1 < n ? n / 3 + 1 : n, n - n / 4, n};
                w.write_range(moment_dataset('v', e.name), cut[rank], cut[rank + 1] - cut[rank],
                              s.v.data() + e.offset + cut[rank]);
            }
        }
        w.commit();
        CHECK(!fs::exists(w.temp_path()));
    }
    CHECK(contents(whole) == contents(pieces));
    check_same_bits(s, read_checkpoint(pieces, mc));
}

TEST_CASE("a piecewise write that misses or repeats elements is not committed", "[checkpoint_h5]") {
    const std::string dir = temp_dir("ckpt_incomplete");
    const LogicalState& s = trained();
    const ModelConfig mc = small_job().model;
    const std::string path = checkpoint_path(dir, 5);
    std::string temp;
    const std::string err = error_of<CheckpointError>([&] {
        CheckpointWriter w(path, meta_of(s, 5), mc);
        temp = w.temp_path();
        for (const TableEntry& e : s.table.entries)
            for (const std::string& p : {model_dataset(e.name), moment_dataset('m', e.name),
                                         moment_dataset('v', e.name)})
                if (p != "optim/m/wpe")
                    w.write_range(p, 0, e.numel(), s.params.data() + e.offset);
        w.write_range("optim/m/wpe", 0, 10, s.m.data());
        w.commit();
    });
    CHECK_THAT(err, Contains(path) && Contains("/optim/m/wpe got 10 elements written, it has 2048") &&
                        Contains("miss some") && Contains("Nothing was committed"));
    CHECK(!fs::exists(path));
    CHECK(!fs::exists(temp));  // the abandoned temporary file is removed

    CHECK_THAT(error_of<CheckpointError>([&] {
                   CheckpointWriter w(path, meta_of(s, 5), mc);
                   w.write("model/wte", Slab{30, 3, 0, 32}, s.params.data());
               }),
               Contains("slab rows [30, 33) x cols [0, 32) lies outside /model/wte of (32, 32)"));
    CHECK_THAT(error_of<CheckpointError>([&] {
                   CheckpointWriter w(path, meta_of(s, 5), mc);
                   w.write_range("model/h.9.ln_1.weight", 0, 1, s.params.data());
               }),
               Contains("no tensor dataset 'model/h.9.ln_1.weight'"));
}

TEST_CASE("a flipped bit is detected and named", "[checkpoint_h5]") {
    const std::string dir = temp_dir("ckpt_flip");
    const LogicalState& s = trained();
    const ModelConfig mc = small_job().model;
    const std::string path = checkpoint_path(dir, 5);
    write_checkpoint(path, s, meta_of(s, 5), mc);
    flip_bit(path, "/optim/v/h.1.mlp.c_fc.weight", 1234, 3);

    const CheckpointReader r(path);  // the meta is intact: the file opens
    const std::string err = error_of<CheckpointError>([&] { r.verify("optim/v/h.1.mlp.c_fc.weight"); });
    CHECK_THAT(err, Contains(path) && Contains("checksum mismatch in dataset /optim/v/h.1.mlp.c_fc.weight") &&
                        Contains("stored 0x") && Contains("computed 0x"));
    CHECK_NOTHROW(r.verify("optim/v/h.0.mlp.c_fc.weight"));
    int bad = 0;
    for (const DatasetCheck& c : r.check_all())
        if (!c.ok) {
            bad++;
            CHECK(c.info.path == "optim/v/h.1.mlp.c_fc.weight");
            CHECK(c.computed != c.info.checksum);
        }
    CHECK(bad == 1);
    CHECK_THAT(error_of<CheckpointError>([&] { read_checkpoint(path, mc); }),
               Contains("/optim/v/h.1.mlp.c_fc.weight"));
    std::vector<float> buf(80 * 32);
    CHECK_THAT(error_of<CheckpointError>([&] { r.read("optim/v/h.1.mlp.c_fc.weight", buf.data()); }),
               Contains("checksum mismatch"));
}

TEST_CASE("truncated, non-HDF5, missing, wrong-version and wrong-model files get clear errors",
          "[checkpoint_h5]") {
    const std::string dir = temp_dir("ckpt_bad");
    const LogicalState& s = trained();
    const ModelConfig mc = small_job().model;
    const std::string good = checkpoint_path(dir, 5);
    write_checkpoint(good, s, meta_of(s, 5), mc);
    const auto size = fs::file_size(good);

    SECTION("truncated at several sizes") {
        for (const std::uintmax_t cut : {std::uintmax_t{0}, std::uintmax_t{7}, std::uintmax_t{100},
                                         std::uintmax_t{2048}, size / 3, size / 2, size - 4096,
                                         size - 1}) {
            const std::string bad = dir + "/cut.h5";
            copy_prefix(good, bad, cut);
            INFO("cut at " << cut << " of " << size);
            const std::string err = error_of<CheckpointError>([&] {
                const CheckpointReader r(bad);
                r.verify_all();
            });
            CHECK_THAT(err, Contains("checkpoint " + bad));
            CHECK_THAT(err, Contains("truncated"));
        }
    }
    SECTION("not HDF5, missing, a folder") {
        const std::string text = dir + "/notes.h5";
        std::ofstream(text) << "these are not the tensors you are looking for\n";
        CHECK_THAT(error_of<CheckpointError>([&] { CheckpointReader r(text); }),
                   Contains("checkpoint " + text + ": is not an HDF5 file"));
        CHECK_THAT(error_of<CheckpointError>([&] { CheckpointReader r(dir + "/nope.h5"); }),
                   Contains("nope.h5: does not exist"));
        CHECK_THAT(error_of<CheckpointError>([&] { CheckpointReader r(dir); }),
                   Contains("is a folder"));
        // An HDF5 file that is not a checkpoint (a run file's kind).
        const std::string other = dir + "/other.h5";
        hid_t f = H5Fcreate(other.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        H5Fclose(f);
        CHECK_THAT(error_of<CheckpointError>([&] { CheckpointReader r(other); }),
                   Contains("is an HDF5 file but not a Parallax checkpoint"));
    }
    SECTION("wrong format_version names both versions") {
        set_root_i64(good, "format_version", 7);
        const std::string err = error_of<CheckpointError>([&] { CheckpointReader r(good); });
        CHECK_THAT(err, Contains(good) && Contains("has format_version 7") &&
                            Contains("reads format_version 1 only"));
    }
    SECTION("an altered attribute fails the meta checksum") {
        set_root_i64(good, "step", 6);
        CHECK_THAT(error_of<CheckpointError>([&] { CheckpointReader r(good); }),
                   Contains(good) && Contains("checksum mismatch in its attributes"));
    }
    SECTION("a config whose model differs") {
        ModelConfig wider = mc;
        wider.hidden = 64;
        CHECK_THAT(error_of<CheckpointError>([&] { read_checkpoint(good, wider); }),
                   Contains(good) && Contains("dataset /model/wte has shape (32, 32)") &&
                       Contains("needs (32, 64)") && Contains("use the config it was written with"));
        ModelConfig deeper = mc;
        deeper.layers = 3;
        CHECK_THAT(error_of<CheckpointError>([&] { read_checkpoint(good, deeper); }),
                   Contains("has no dataset /model/h.2.ln_1.weight"));
        ModelConfig shallower = mc;
        shallower.layers = 1;
        CHECK_THAT(error_of<CheckpointError>([&] { read_checkpoint(good, shallower); }),
                   Contains("holds 28 model tensors") && Contains("has 16"));
    }
    SECTION("a missing dataset") {
        const CheckpointReader r(good);
        CHECK_THAT(error_of<CheckpointError>([&] { r.verify("model/h.7.ln_1.weight"); }),
                   Contains(good) && Contains("has no dataset /model/h.7.ln_1.weight"));
    }
}

TEST_CASE("a folder keeps the last K and resumes from the newest valid one", "[checkpoint_h5]") {
    const std::string dir = temp_dir("ckpt_folder");
    const LogicalState& s = trained();
    const ModelConfig mc = small_job().model;

    SECTION("keep the last 3") {
        for (i64 step = 1; step <= 6; step++) save_checkpoint(dir, s, meta_of(s, step), mc, 3);
        const auto files = list_checkpoints(dir);
        REQUIRE(files.size() == 3);
        CHECK(files[0].step == 6);
        CHECK(files[1].step == 5);
        CHECK(files[2].step == 4);
        // A stale temporary file from another process is removed by the next prune.
        std::ofstream(dir + "/.ckpt-00000007.h5.tmp-999999") << "half a file";
        CHECK(list_checkpoints(dir).size() == 4);
        save_checkpoint(dir, s, meta_of(s, 8), mc, 2);
        const auto after = list_checkpoints(dir);
        REQUIRE(after.size() == 2);
        CHECK(after[0].step == 8);
        CHECK(after[1].step == 6);
    }
    SECTION("a corrupt newest, a truncated one and a stale temporary file are skipped") {
        for (const i64 step : {2, 4, 6, 8}) save_checkpoint(dir, s, meta_of(s, step), mc, 10);
        flip_bit(checkpoint_path(dir, 8), "/model/h.0.attn.c_proj.weight", 17, 30);
        const std::string six = checkpoint_path(dir, 6);
        fs::resize_file(six, fs::file_size(six) / 2);
        const std::string temp = dir + "/.ckpt-00000010.h5.tmp-424242";
        std::ofstream(temp) << "an unfinished write";

        LatestCheckpoint latest = find_latest_valid(dir);
        CHECK(latest.found());
        CHECK(latest.step == 4);
        CHECK(latest.path == checkpoint_path(dir, 4));
        REQUIRE(latest.skipped.size() == 3);
        CHECK(latest.skipped[0].path == checkpoint_path(dir, 8));
        CHECK_THAT(latest.skipped[0].reason, Contains("checksum mismatch in dataset /model/h.0.attn.c_proj.weight"));
        CHECK(latest.skipped[1].path == six);
        CHECK_THAT(latest.skipped[1].reason, Contains("truncated"));
        CHECK(latest.skipped[2].path == temp);
        CHECK_THAT(latest.skipped[2].reason, Contains("unfinished write"));
        CHECK(fs::exists(temp));
        latest = find_latest_valid(dir, true);
        CHECK(latest.step == 4);
        CHECK(!fs::exists(temp));
    }
    SECTION("a crash mid-write never shadows the previous checkpoint") {
        save_checkpoint(dir, s, meta_of(s, 4), mc, 3);
        const std::string crashed = dir + "/.ckpt-00000005.h5.tmp-424242";
        {
            CheckpointWriter w(checkpoint_path(dir, 5), meta_of(s, 5), mc);
            const TableEntry& e = s.table.entries[0];
            w.write_range(model_dataset(e.name), 0, e.numel(), s.params.data() + e.offset);
            // The process dies here: its temporary file stays, never renamed.
            fs::copy_file(w.temp_path(), crashed);
        }
        CHECK(!fs::exists(checkpoint_path(dir, 5)));
        const LatestCheckpoint latest = find_latest_valid(dir);
        CHECK(latest.step == 4);
        REQUIRE(latest.skipped.size() == 1);
        CHECK(latest.skipped[0].path == crashed);
        LogicalState saved = s;  // as saved at step 4: its history ends there
        saved.history = meta_of(s, 4).history;
        check_same_bits(saved, read_checkpoint(latest.path, mc));
    }
    SECTION("no checkpoints") {
        CHECK(!find_latest_valid(dir).found());
        CHECK(!find_latest_valid(dir + "/missing").found());
    }
}

TEST_CASE("parallax inspect: exit 0 when every checksum verifies, 2 otherwise", "[checkpoint_h5][cli]") {
    const std::string dir = temp_dir("ckpt_cli");
    const LogicalState& s = trained();
    const ModelConfig mc = small_job().model;
    const std::string a = save_checkpoint(dir, s, meta_of(s, 4), mc, 5);
    const std::string b = save_checkpoint(dir, s, meta_of(s, 5), mc, 5);

    Cmd ok = run_cli("inspect " + b);
    INFO(ok.out);
    CHECK(ok.rc == 0);
    CHECK_THAT(ok.out, Contains("format:   parallax-checkpoint, version 1") &&
                           Contains("step:     5") && Contains("L=2 C=32 NH=4 F=80 V=32 T=64") &&
                           Contains("/model/wte") && Contains("(32, 32)") &&
                           Contains("/history/loss") && Contains("ok") &&
                           Contains("0 failed"));
    CHECK_THAT(ok.out, !Contains("MISMATCH"));
    Cmd folder = run_cli("inspect " + dir);
    CHECK(folder.rc == 0);
    CHECK_THAT(folder.out, Contains("ckpt-00000005.h5") && Contains("2 valid, 0 invalid"));
    CHECK(folder.out.find("ckpt-00000005.h5") < folder.out.find("ckpt-00000004.h5"));

    flip_bit(b, "/model/h.1.ln_2.weight", 3, 0);
    Cmd bad = run_cli("inspect " + b);
    INFO(bad.out);
    CHECK(bad.rc == 2);
    CHECK_THAT(bad.out, Contains("MISMATCH") && Contains("checksum mismatch in dataset /model/h.1.ln_2.weight") &&
                            Contains("1 failed"));
    Cmd bad_folder = run_cli("inspect " + dir);
    CHECK(bad_folder.rc == 2);
    CHECK_THAT(bad_folder.out, Contains("INVALID") && Contains("1 valid, 1 invalid"));

    std::ofstream(dir + "/junk.h5") << "junk";
    Cmd junk = run_cli("inspect " + dir + "/junk.h5");
    CHECK(junk.rc == 2);
    CHECK_THAT(junk.out, Contains("junk.h5: is not an HDF5 file"));
    CHECK(run_cli("inspect " + dir + "/missing.h5").rc == 2);
    CHECK(run_cli("inspect " + temp_dir("ckpt_cli_empty")).rc == 2);
    CHECK(run_cli("inspect").rc == 2);
    CHECK(run_cli("inspect --help").rc == 0);
    (void)a;
}

// Some flips in HDF5's metadata make HDF5 1.10 leak internally on its error path (the reader
// still reports them); the library then prints "infinite loop closing library" at exit, which
// is harmless. PX_FUZZ_TRIALS=N runs N trials instead of 1000.
TEST_CASE("random damage anywhere in the file is an error or harmless, never a crash",
          "[checkpoint_h5]") {
    const std::string dir = temp_dir("ckpt_fuzz");
    const LogicalState& s = trained();
    const ModelConfig mc = small_job().model;
    const std::string good = checkpoint_path(dir, 5);
    write_checkpoint(good, s, meta_of(s, 5), mc);
    std::vector<char> bytes(fs::file_size(good));
    std::ifstream(good, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::mt19937_64 rng(17);
    int detected = 0, harmless = 0;
    const int trials = std::getenv("PX_FUZZ_TRIALS") ? std::atoi(std::getenv("PX_FUZZ_TRIALS")) : 1000;
    for (int trial = 0; trial < trials; trial++) {
        std::vector<char> bad = bytes;
        // Half the trials in the first 8 KiB, where HDF5 keeps most of its metadata.
        const size_t at = trial % 2 ? rng() % 8192 : rng() % bad.size();
        bad[at] = static_cast<char>(bad[at] ^ (1 << (rng() % 8)));
        const std::string path = dir + "/bad.h5";
        std::ofstream(path, std::ios::binary | std::ios::trunc).write(bad.data(), static_cast<std::streamsize>(bad.size()));
        INFO("trial " << trial << ", bit flipped in byte " << at);
        try {
            const LogicalState back = read_checkpoint(path, mc);
            // Read without complaint: then it must be exactly the state (the flip hit unused bytes).
            CHECK(same_bits(back.params, s.params));
            CHECK(same_bits(back.m, s.m));
            CHECK(same_bits(back.v, s.v));
            harmless++;
        } catch (const CheckpointError& e) {
            CHECK_THAT(e.what(), Contains(path));
            detected++;
        }
    }
    CHECK(detected > trials / 2);
    WARN(detected << " of " << trials << " single-bit flips detected, " << harmless << " harmless");
}

TEST_CASE("a history out of order, or of another length than the step, is refused",
          "[checkpoint_h5]") {
    const std::string dir = temp_dir("ckpt_history");
    LogicalState s = trained();
    const i64 n = static_cast<i64>(s.history.size());
    // Steps 1, 3, 2, 4, 5: every checksum is right, the order is not.
    std::swap(s.history[1], s.history[2]);
    const std::string swapped = dir + "/swapped.h5";
    write_checkpoint(swapped, s, make_checkpoint_meta(small_job(), n, s.history),
                     small_job().model);
    CHECK_THROWS_WITH(read_checkpoint(swapped, small_job().model),
                      Contains("/history/step row 1 is step 3, not 2") && Contains(swapped));
    // Four rows of history at step 5.
    LogicalState t = trained();
    t.history.pop_back();
    const std::string shorter = dir + "/shorter.h5";
    write_checkpoint(shorter, t, make_checkpoint_meta(small_job(), n, t.history),
                     small_job().model);
    CHECK_THROWS_WITH(read_checkpoint(shorter, small_job().model),
                      Contains("has 4 rows but the checkpoint's step is 5"));
    fs::remove_all(dir);
}
