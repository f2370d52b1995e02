// llm.c GPT-2 checkpoints (round trip, version 1 by hand, every malformed input, config
// mismatches) and the HDF5 run file (read back with the HDF5 C API).
#include "core/io/checkpoint_llmc.h"
#include "core/model/data.h"
#include "core/base/error.h"
#include "core/train/job.h"
#include "core/base/rng.h"
#include "core/io/runfile.h"
#include "core/train/run_file_observer.h"
#include "tests/support/test_util.h"

#include <hdf5.h>

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

using namespace px;
using namespace px::test;
using Catch::Matchers::Contains;

namespace {

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() /
            ("px_test_ckpt_" + std::to_string(getpid()) + "_" + name))
        .string();
}

const char* const kLayerSuffixes[] = {
    "ln_1.weight",        "ln_1.bias",        "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",        "ln_2.bias",
    "mlp.c_fc.weight",    "mlp.c_fc.bias",    "mlp.c_proj.weight",  "mlp.c_proj.bias"};

// A model's parameters by name, sized from the config as Parallax lays them out.
struct Params {
    std::map<std::string, std::vector<float>> t;

    explicit Params(const ModelConfig& mc) {
        const i64 C = mc.hidden, F = mc.ffn;
        t["wte"].resize(mc.vocab * C);
        t["wpe"].resize(mc.seq_len * C);
        const i64 sizes[] = {C, C, 3 * C * C, 3 * C, C * C, C, C, C, F * C, F, C * F, C};
        for (i64 i = 0; i < mc.layers; i++)
            for (int j = 0; j < 12; j++)
                t["h." + std::to_string(i) + "." + kLayerSuffixes[j]].resize(sizes[j]);
        t["ln_f.weight"].resize(C);
        t["ln_f.bias"].resize(C);
    }
    void fill(u64 seed) {
        u32 id = 0;
        for (auto& [name, v] : t) fill_normal(v.data(), i64(v.size()), 0.0f, 1.0f, seed, id++, 0);
    }
    ParamLookup lookup() {
        return [this](const std::string& name) -> float* {
            auto it = t.find(name);
            return it == t.end() ? nullptr : it->second.data();
        };
    }
    i64 count() const {
        i64 n = 0;
        for (const auto& [name, v] : t) n += i64(v.size());
        return n;
    }
};

ModelConfig tiny() {
    ModelConfig mc;
    mc.vocab = 50;  // padded to 128 in version 3
    mc.seq_len = 16;
    mc.layers = 2;
    mc.heads = 2;
    mc.hidden = 8;
    mc.ffn = 32;
    return mc;
}

std::vector<char> read_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}
void write_bytes(const std::string& path, const std::vector<char>& b) {
    std::ofstream(path, std::ios::binary).write(b.data(), std::streamsize(b.size()));
}
std::int32_t* header_of(std::vector<char>& b) { return reinterpret_cast<std::int32_t*>(b.data()); }
float* floats_of(std::vector<char>& b) { return reinterpret_cast<float*>(b.data() + 1024); }

bool same_bits(const Params& a, const Params& b) {
    for (const auto& [name, v] : a.t)
        if (std::memcmp(v.data(), b.t.at(name).data(), v.size() * 4) != 0) return false;
    return true;
}

}  // namespace

TEST_CASE("llm.c checkpoint round trip is bit-exact", "[checkpoint]") {
    const ModelConfig mc = tiny();
    const std::string path = temp_path("rt.bin");
    Params a(mc);
    a.fill(42);
    write_llmc_checkpoint(path, mc, a.lookup());

    const LlmcHeader h = read_llmc_header(path);
    CHECK(h.version == 3);
    CHECK(h.max_T == 16);
    CHECK(h.V == 50);
    CHECK(h.Vp == 128);
    CHECK(h.L == 2);
    CHECK(h.NH == 2);
    CHECK(h.C == 8);
    const i64 floats = a.count() + (128 - 50) * 8;
    CHECK(i64(std::filesystem::file_size(path)) == 1024 + 4 * floats);

    // Pad rows of wte (rows 50..127, right after the 50 real rows) are zero.
    std::vector<char> bytes = read_bytes(path);
    const float* f = floats_of(bytes);
    for (i64 i = 50 * 8; i < 128 * 8; i++) REQUIRE(f[i] == 0.0f);
    CHECK(std::memcmp(f, a.t["wte"].data(), 50 * 8 * 4) == 0);

    Params b(mc);
    read_llmc_checkpoint(path, mc, b.lookup());
    CHECK(same_bits(a, b));
    // Nothing else left in the folder by the atomic write.
    for (const auto& e :
         std::filesystem::directory_iterator(std::filesystem::temp_directory_path()))
        CHECK(e.path().string().find(path + ".tmp") == std::string::npos);

    // Rewriting replaces the file whole.
    a.fill(43);
    write_llmc_checkpoint(path, mc, a.lookup());
    read_llmc_checkpoint(path, mc, b.lookup());
    CHECK(same_bits(a, b));
    std::remove(path.c_str());
}

TEST_CASE("llm.c version 1 checkpoint written by hand reads correctly", "[checkpoint]") {
    // The layout spelled out independently of the reader: each llm.c tensor holds all layers,
    // layer-major; version 1 has no padded vocabulary; the file has more positions (20) than
    // model.seq_len (16), and only the first 16 rows of wpe are taken.
    const ModelConfig mc = tiny();
    const i64 V = 50, maxT = 20, L = 2, C = 8;
    const char* names[16] = {"wte",      "wpe",      "ln1w", "ln1b", "qkvw", "qkvb",
                             "attprojw", "attprojb", "ln2w", "ln2b", "fcw",  "fcb",
                             "fcprojw",  "fcprojb",  "lnfw", "lnfb"};
    const i64 sizes[16] = {V * C,         maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C,
                           L * C * C,     L * C,    L * C, L * C, L * 4 * C * C, L * 4 * C,
                           L * C * 4 * C, L * C,    C,     C};
    // Element e of llm.c tensor t holds t * 10000 + e (exact in fp32).
    std::vector<std::int32_t> header(256, 0);
    header[0] = kLlmcCheckpointMagic;
    header[1] = 1;
    header[2] = std::int32_t(maxT);
    header[3] = std::int32_t(V);
    header[4] = std::int32_t(L);
    header[5] = 2;
    header[6] = std::int32_t(C);
    header[7] = 999;  // not a field in version 1; must be ignored
    const std::string path = temp_path("v1.bin");
    {
        std::ofstream f(path, std::ios::binary);
        f.write(reinterpret_cast<const char*>(header.data()), 1024);
        for (int t = 0; t < 16; t++)
            for (i64 e = 0; e < sizes[t]; e++) {
                const float v = float(t * 10000 + e);
                f.write(reinterpret_cast<const char*>(&v), 4);
            }
    }
    CHECK(read_llmc_header(path).Vp == V);
    Params p(mc);
    read_llmc_checkpoint(path, mc, p.lookup());

    auto check = [&](const std::string& name, int t, i64 offset) {
        const std::vector<float>& v = p.t.at(name);
        for (size_t j = 0; j < v.size(); j++)
            if (v[j] != float(t * 10000 + offset + i64(j))) {
                FAIL_CHECK(name << "[" << j << "] (from " << names[t] << ") = " << v[j]
                                << ", expected " << t * 10000 + offset + i64(j));
                return;
            }
    };
    check("wte", 0, 0);
    check("wpe", 1, 0);
    CHECK(p.t["wpe"].size() == 16 * 8);
    for (i64 i = 0; i < L; i++)
        for (int j = 0; j < 12; j++) {
            const i64 per = sizes[2 + j] / L;
            check("h." + std::to_string(i) + "." + kLayerSuffixes[j], 2 + j, i * per);
        }
    check("ln_f.weight", 14, 0);
    check("ln_f.bias", 15, 0);
    std::remove(path.c_str());
}

TEST_CASE("malformed llm.c checkpoints get their intended errors", "[checkpoint]") {
    const ModelConfig mc = tiny();
    const std::string good = temp_path("good.bin"), path = temp_path("bad.bin");
    Params a(mc);
    a.fill(7);
    write_llmc_checkpoint(good, mc, a.lookup());
    std::vector<char> bytes = read_bytes(good);
    const i64 size = i64(bytes.size());

    Params b(mc);
    b.fill(8);
    const Params before = b;
    auto load = [&] {
        return error_of<DataError>([&] { read_llmc_checkpoint(path, mc, b.lookup()); });
    };

    SECTION("missing") {
        std::remove(path.c_str());
        CHECK_THAT(load(), Contains(path) && Contains("cannot open"));
    }
    SECTION("shorter than the header") {
        bytes.resize(100);
        write_bytes(path, bytes);
        CHECK_THAT(load(), Contains(path) && Contains("100 bytes") && Contains("1024-byte"));
    }
    SECTION("wrong magic") {
        header_of(bytes)[0] = 777;
        write_bytes(path, bytes);
        CHECK_THAT(load(), Contains("magic number 777") && Contains("20240326"));
    }
    SECTION("token-file magic") {
        header_of(bytes)[0] = kLlmcTokenMagic;
        write_bytes(path, bytes);
        CHECK_THAT(load(),
                   Contains("20240520") && Contains("token-file") && Contains("data.train_path"));
    }
    SECTION("unsupported version") {
        for (int v : {2, 5}) {
            header_of(bytes)[1] = v;
            write_bytes(path, bytes);
            CHECK_THAT(load(), Contains("version " + std::to_string(v)) && Contains("1 and 3"));
        }
    }
    SECTION("corrupt header fields") {
        header_of(bytes)[6] = 0;
        write_bytes(path, bytes);
        CHECK_THAT(load(), Contains("channels = 0"));
        header_of(bytes)[6] = 8;
        header_of(bytes)[7] = 49;
        write_bytes(path, bytes);
        CHECK_THAT(load(), Contains("padded_vocab_size 49") && Contains("vocab_size 50"));
    }
    SECTION("truncated parameters") {
        bytes.resize(size_t(size - 12));
        write_bytes(path, bytes);
        CHECK_THAT(load(), Contains("truncated") && Contains(std::to_string(size) + " bytes") &&
                               Contains(std::to_string(size - 12) + " bytes"));
    }
    SECTION("trailing bytes") {
        bytes.resize(size_t(size + 4));
        write_bytes(path, bytes);
        CHECK_THAT(load(), Contains(std::to_string(size + 4) + " bytes") && Contains("corrupt"));
    }
    SECTION("non-finite parameter names the tensor") {
        // h.1.attn.c_proj.weight element 5: after wte (128*8), wpe (16*8), ln1w and ln1b (2*8
        // each), qkvw (2*3*8*8), qkvb (2*24) and layer 0 of attprojw (8*8).
        const i64 at = 128 * 8 + 16 * 8 + 2 * 8 + 2 * 8 + 2 * 3 * 64 + 2 * 24 + 64 + 5;
        floats_of(bytes)[at] = std::numeric_limits<float>::quiet_NaN();
        write_bytes(path, bytes);
        CHECK_THAT(load(), Contains("non-finite") &&
                               Contains("attprojw (h.1.attn.c_proj.weight) at element 5"));
    }
    SECTION("non-finite padding row") {
        floats_of(bytes)[60 * 8 + 3] = std::numeric_limits<float>::infinity();
        write_bytes(path, bytes);
        CHECK_THAT(load(), Contains("non-finite") && Contains("wte (padding row 60)"));
    }
    // Whatever failed, the model was not touched.
    CHECK(same_bits(b, before));
    std::remove(path.c_str());
    std::remove(good.c_str());
}

TEST_CASE("llm.c checkpoint that does not match the config names the key", "[checkpoint]") {
    const ModelConfig mc = tiny();
    const std::string path = temp_path("gpt2_tiny.bin");
    Params a(mc);
    a.fill(1);
    write_llmc_checkpoint(path, mc, a.lookup());
    auto load = [&](ModelConfig other) {
        Params p(other);
        return error_of<DataError>([&] { read_llmc_checkpoint(path, other, p.lookup()); });
    };
    ModelConfig m = mc;
    m.layers = 3;
    CHECK_THAT(load(m), Contains(path + " has 2 layers but model.layers = 3"));
    m = mc;
    m.hidden = 16;
    m.ffn = 64;
    CHECK_THAT(load(m), Contains("8 channels but model.hidden = 16"));
    m = mc;
    m.heads = 4;
    CHECK_THAT(load(m), Contains("2 heads but model.heads = 4"));
    m = mc;
    m.vocab = 64;
    CHECK_THAT(load(m), Contains("50 vocabulary entries but model.vocab = 64"));
    m = mc;
    m.seq_len = 32;
    CHECK_THAT(load(m), Contains("positions for 16 tokens but model.seq_len = 32"));
    m = mc;
    m.layers = 4;
    m.heads = 1;
    CHECK_THAT(load(m), Contains("model.layers = 4") && Contains("model.heads = 1"));
    // Fewer positions than the file has is fine: the first seq_len rows of wpe.
    m = mc;
    m.seq_len = 8;
    Params shorter(m);
    read_llmc_checkpoint(path, m, shorter.lookup());
    CHECK(std::memcmp(shorter.t["wpe"].data(), a.t["wpe"].data(), 8 * 8 * 4) == 0);
    // The MLP must be 4x.
    m = mc;
    m.ffn = 24;
    Params odd(m);
    CHECK_THAT(error_of<ConfigError>([&] { read_llmc_checkpoint(path, m, odd.lookup()); }),
               Contains("model.ffn = 24") && Contains("32"));
    CHECK_THAT(error_of<ConfigError>([&] { write_llmc_checkpoint(path, m, odd.lookup()); }),
               Contains("model.ffn = 24"));
    std::remove(path.c_str());
}

TEST_CASE("llm.c checkpoint writer refuses bad input and leaves no half file", "[checkpoint]") {
    const ModelConfig mc = tiny();
    const std::string path = temp_path("w.bin");
    Params a(mc);
    a.fill(3);
    write_llmc_checkpoint(path, mc, a.lookup());
    const std::vector<char> before = read_bytes(path);

    a.t["h.0.mlp.c_fc.bias"][7] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THAT(error_of<Error>([&] { write_llmc_checkpoint(path, mc, a.lookup()); }),
               Contains("fcb (h.0.mlp.c_fc.bias) at element 7") && Contains("non-finite"));
    CHECK(read_bytes(path) == before);  // the old file is intact

    a.fill(3);
    const std::string nowhere = temp_path("no_such_dir") + "/w.bin";
    CHECK_THAT(error_of<DataError>([&] { write_llmc_checkpoint(nowhere, mc, a.lookup()); }),
               Contains(nowhere));
    std::remove(path.c_str());
}

// ---------------------------------------------------------------------------------------------
// Run file

namespace {

std::string read_string_attr(hid_t file, const char* name) {
    const hid_t attr = H5Aopen(file, name, H5P_DEFAULT);
    REQUIRE(attr >= 0);
    const hid_t type = H5Aget_type(attr);
    REQUIRE(H5Tis_variable_str(type) > 0);
    CHECK(H5Tget_cset(type) == H5T_CSET_UTF8);
    char* s = nullptr;
    const hid_t mem = H5Tcopy(H5T_C_S1);
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5T_CSET_UTF8);
    REQUIRE(H5Aread(attr, mem, &s) >= 0);
    std::string out = s ? s : "";
    H5free_memory(s);
    H5Tclose(mem);
    H5Tclose(type);
    H5Aclose(attr);
    return out;
}

double read_double_attr(hid_t file, const char* name) {
    const hid_t attr = H5Aopen(file, name, H5P_DEFAULT);
    REQUIRE(attr >= 0);
    double v = 0;
    REQUIRE(H5Aread(attr, H5T_NATIVE_DOUBLE, &v) >= 0);
    H5Aclose(attr);
    return v;
}

template <class T>
std::vector<T> read_series(hid_t file, const std::string& name, hid_t mem_type) {
    const hid_t d = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
    REQUIRE(d >= 0);
    const hid_t space = H5Dget_space(d);
    hsize_t n = 0, maxn = 0;
    REQUIRE(H5Sget_simple_extent_dims(space, &n, &maxn) == 1);
    CHECK(maxn == H5S_UNLIMITED);
    std::vector<T> out(n);
    if (n > 0) REQUIRE(H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) >= 0);
    H5Sclose(space);
    H5Dclose(d);
    return out;
}

}  // namespace

TEST_CASE("run file holds the config and appended metrics", "[runfile]") {
    const std::string path = temp_path("run.h5");
    const std::string toml = "[model]\nvocab = 32  # \xc3\xa9\n\n[train]\nsteps = 3\n";
    {
        RunFile rf(path, toml);
        for (i64 s = 1; s <= 600; s++) rf.append("loss", s, 4.0 / double(s));  // crosses chunks
        rf.append("val_loss", 2, 3.5);
        rf.flush();
        RunFile moved = std::move(rf);  // RAII survives a move
        moved.append("val_loss", 3, std::numeric_limits<double>::quiet_NaN());
        moved.set_attr("final_loss", 1.25);
        moved.set_attr("final_loss", 1.5);  // replaced, not an error
        moved.set_attr("status", "finished");
        CHECK(moved.path() == path);
        CHECK_THAT(error_of<Error>([&] { moved.append("a/b", 1, 0); }),
                   Contains(path) && Contains("'/'"));
    }
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    REQUIRE(f >= 0);
    CHECK(read_string_attr(f, "config") == toml);
    CHECK(read_string_attr(f, "parallax_version") == "0.1.0");
    const std::string created = read_string_attr(f, "created");
    CHECK(created.size() == 20);
    CHECK(created[10] == 'T');
    CHECK(created.back() == 'Z');
    CHECK(read_string_attr(f, "status") == "finished");
    CHECK(read_double_attr(f, "final_loss") == 1.5);

    const auto steps = read_series<std::int64_t>(f, "/metrics/loss/step", H5T_NATIVE_INT64);
    const auto values = read_series<double>(f, "/metrics/loss/value", H5T_NATIVE_DOUBLE);
    REQUIRE(steps.size() == 600);
    REQUIRE(values.size() == 600);
    for (size_t i = 0; i < 600; i++) {
        CHECK(steps[i] == i64(i) + 1);
        CHECK(values[i] == 4.0 / double(i + 1));
    }
    const auto vsteps = read_series<std::int64_t>(f, "/metrics/val_loss/step", H5T_NATIVE_INT64);
    const auto vvalues = read_series<double>(f, "/metrics/val_loss/value", H5T_NATIVE_DOUBLE);
    CHECK(vsteps == std::vector<std::int64_t>{2, 3});
    REQUIRE(vvalues.size() == 2);
    CHECK(vvalues[0] == 3.5);
    CHECK(std::isnan(vvalues[1]));
    // Stored as int64 / float64 little-endian, chunked.
    const hid_t d = H5Dopen2(f, "/metrics/loss/step", H5P_DEFAULT);
    const hid_t type = H5Dget_type(d);
    CHECK(H5Tequal(type, H5T_STD_I64LE) > 0);
    const hid_t dcpl = H5Dget_create_plist(d);
    CHECK(H5Pget_layout(dcpl) == H5D_CHUNKED);
    H5Pclose(dcpl);
    H5Tclose(type);
    H5Dclose(d);
    H5Fclose(f);
    std::remove(path.c_str());
}

TEST_CASE("run file errors name the path", "[runfile]") {
    const std::string path = temp_path("no_such_dir") + "/run.h5";
    CHECK_THAT(error_of<Error>([&] { RunFile(path, ""); }),
               Contains(path) && Contains("cannot create"));
}

namespace {

// What a RunFileObserver reads of a run: the steps done (history's length) and the history.
class FakeRun : public RunView {
public:
    Config cfg;
    std::vector<StepMetrics> hist;
    const Config& config() const override { return cfg; }
    i64 num_params() const override { return 1; }
    i64 steps_done() const override { return static_cast<i64>(hist.size()); }
    const std::vector<StepMetrics>& history() const override { return hist; }
    int dp_size() const override { return 1; }
    double entropy_rate() const override { return -1; }
    double loss_floor() const override { return -1; }
    MemoryStats memory() const override { return {}; }
};

StepMetrics metrics_at(i64 step, double loss) {
    StepMetrics m;
    m.step = step;
    m.loss = loss;
    m.val_loss = step % 2 == 0 ? loss + 0.5 : -1;  // evaluated at even steps
    m.grad_norm = loss / 10;
    m.lr = 1e-3;
    return m;
}

std::vector<std::string> read_strings(hid_t file, const char* name) {
    const hid_t d = H5Dopen2(file, name, H5P_DEFAULT);
    REQUIRE(d >= 0);
    const hid_t space = H5Dget_space(d);
    hsize_t n = 0;
    H5Sget_simple_extent_dims(space, &n, nullptr);
    const hid_t mem = H5Tcopy(H5T_C_S1);
    H5Tset_size(mem, H5T_VARIABLE);
    H5Tset_cset(mem, H5T_CSET_UTF8);
    std::vector<char*> raw(n);
    if (n > 0) REQUIRE(H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, raw.data()) >= 0);
    std::vector<std::string> out(raw.begin(), raw.end());
    if (n > 0) H5Dvlen_reclaim(mem, space, H5P_DEFAULT, raw.data());
    H5Tclose(mem);
    H5Sclose(space);
    H5Dclose(d);
    return out;
}

}  // namespace

TEST_CASE("run file: a re-run step replaces its rows, a resume continues the file", "[runfile]") {
    const std::string path = temp_path("rerun.h5");
    std::remove(path.c_str());
    FakeRun run;
    const auto loss_rows = [&] {
        std::vector<i64> steps;
        std::vector<double> values;
        RunFile::reopen(path)->read("loss", &steps, &values);
        return std::make_pair(steps, values);
    };
    {
        RunFileObserver obs(path, run.cfg);
        obs.on_start(run);
        for (i64 s = 1; s <= 5; s++) {
            run.hist.push_back(metrics_at(s, 10.0 + double(s)));
            obs.on_step(run, run.hist.back());
        }
        for (i64 s = 4; s <= 5; s++) {  // steps 4 and 5 run again, with other values
            run.hist[size_t(s - 1)] = metrics_at(s, 20.0 + double(s));
            obs.on_step(run, run.hist[size_t(s - 1)]);
        }
        obs.on_end(run);
    }
    CHECK(loss_rows() == std::make_pair(std::vector<i64>{1, 2, 3, 4, 5},
                                        std::vector<double>{11, 12, 13, 24, 25}));
    {
        const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        REQUIRE(f >= 0);
        CHECK(read_series<std::int64_t>(f, "/metrics/val_loss/step", H5T_NATIVE_INT64) ==
              std::vector<std::int64_t>{2, 4});
        CHECK(read_series<double>(f, "/metrics/val_loss/value", H5T_NATIVE_DOUBLE) ==
              std::vector<double>{12.5, 24.5});
        CHECK(read_series<std::int64_t>(f, "/events/step", H5T_NATIVE_INT64) ==
              std::vector<std::int64_t>{4});
        CHECK(read_strings(f, "/events/kind") == std::vector<std::string>{"rerun"});
        H5Fclose(f);
    }

    // A resume at step 3 (a checkpoint's history) continues the file: the rows after 3 go.
    run.hist.resize(3);
    {
        RunFileObserver obs(path, run.cfg);
        obs.on_start(run);
        run.hist.push_back(metrics_at(4, 34));
        obs.on_step(run, run.hist.back());
        obs.on_end(run);
    }
    CHECK(loss_rows() == std::make_pair(std::vector<i64>{1, 2, 3, 4},
                                        std::vector<double>{11, 12, 13, 34}));
    {
        const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        REQUIRE(f >= 0);
        CHECK(read_strings(f, "/events/kind") == std::vector<std::string>{"rerun", "resume"});
        CHECK(read_series<std::int64_t>(f, "/events/step", H5T_NATIVE_INT64) ==
              std::vector<std::int64_t>{4, 3});
        CHECK_THAT(read_strings(f, "/events/message")[1], Contains("resumed at step 3"));
        H5Fclose(f);
    }

    // Without a run file, a resume writes a new one that starts with the restored steps.
    std::remove(path.c_str());
    {
        RunFileObserver obs(path, run.cfg);
        obs.on_start(run);
        run.hist.push_back(metrics_at(5, 45));
        obs.on_step(run, run.hist.back());
    }
    CHECK(loss_rows() == std::make_pair(std::vector<i64>{1, 2, 3, 4, 5},
                                        std::vector<double>{11, 12, 13, 34, 45}));

    // A file there that HDF5 cannot open (damaged) is moved aside, kept byte for byte, and a new
    // run file starts with the restored steps.
    {
        std::remove((path + ".damaged").c_str());
        std::ofstream(path, std::ios::binary | std::ios::trunc) << "not an HDF5 file";
        RunFileObserver obs(path, run.cfg);
        obs.on_start(run);
        run.hist.push_back(metrics_at(6, 56));
        obs.on_step(run, run.hist.back());
        std::ifstream in(path + ".damaged", std::ios::binary);
        CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == "not an HDF5 file");
    }
    CHECK(loss_rows() == std::make_pair(std::vector<i64>{1, 2, 3, 4, 5, 6},
                                        std::vector<double>{11, 12, 13, 34, 45, 56}));
    std::remove(path.c_str());
    std::remove((path + ".damaged").c_str());
}
