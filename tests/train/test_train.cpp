// Training-level properties: thread, ISA and microbatch invariance in bitwise mode (bit for bit),
// convergence to the Markov source's entropy rate, and the CLI's behaviour on good and bad input.
#include "core/base/config.h"
#include "core/model/data.h"
#include "core/base/error.h"
#include "core/train/job.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

using namespace px;
using namespace px::test;

namespace {

using test::same_bits;
using test::small_job;
using test::temp_dir;

struct Snapshot {
    std::vector<float> params, m, v;
    std::vector<double> loss, grad_norm;
};

Snapshot train(const Config& c) {
    Job job(c);
    Snapshot s;
    for (int i = 0; i < c.train.steps; i++) {
        const StepMetrics m = job.step();
        s.loss.push_back(m.loss);
        s.grad_norm.push_back(m.grad_norm);
    }
    const i64 n = job.model().table().total;
    s.params.assign(job.model().params(), job.model().params() + n);
    s.m.assign(job.optimizer().m(), job.optimizer().m() + n);
    s.v.assign(job.optimizer().v(), job.optimizer().v() + n);
    return s;
}

void require_identical(const Snapshot& a, const Snapshot& b) {
    CHECK(same_bits(a.loss, b.loss));
    CHECK(same_bits(a.grad_norm, b.grad_norm));
    CHECK(same_bits(a.params, b.params));
    CHECK(same_bits(a.m, b.m));
    CHECK(same_bits(a.v, b.v));
}

}  // namespace

TEST_CASE("5 training steps are bit-identical on 1, 2 and 3 threads") {
    Config c = small_job();
    c.train.threads = 1;
    const Snapshot one = train(c);
    c.train.threads = 2;
    const Snapshot two = train(c);
    c.train.threads = 3;
    const Snapshot three = train(c);
    require_identical(one, two);
    require_identical(one, three);
    CHECK(one.loss.back() < one.loss.front());  // and it does train
}

TEST_CASE("5 training steps are bit-identical on every ISA path this CPU has") {
    Config c = small_job();
    c.numerics.isa = "scalar";
    const Snapshot scalar = train(c);
    for (const char* isa : {"avx2", "avx512"}) {
        c.numerics.isa = isa;
        Snapshot other;
        try {
            other = train(c);
        } catch (const ConfigError&) {
            WARN("this CPU has no " << isa << "; compared the paths it has");
            continue;
        }
        INFO("isa " << isa);
        require_identical(scalar, other);
    }
}

TEST_CASE("batch 8 as 1x8, 2x4 and 8x1 microbatches gives identical bits") {
    Config c = small_job();
    const Snapshot whole = train(c);
    for (int mb : {2, 4, 8}) {
        c.train.microbatches = mb;
        INFO("microbatches " << mb);
        require_identical(whole, train(c));
    }
}

TEST_CASE("microbatches that are not nodes of the token tree give identical bits; split blocks are refused") {
    Config c = small_job();
    c.train.batch_size = 6;
    const Snapshot whole = train(c);
    // 6 blocks in 3 microbatches: the tree splits [0,3) [3,6), so microbatch 1, blocks [2,4),
    // is the two nodes [2,3) and [3,4), each computed over its own rows.
    for (int mb : {3, 6}) {
        c.train.microbatches = mb;
        INFO("microbatches " << mb);
        require_identical(whole, train(c));
    }
    c.model.seq_len = 32;  // 32 tokens per microbatch: not whole blocks of 64
    c.train.batch_size = 8;
    c.train.microbatches = 8;
    CHECK_THROWS_WITH(Job(c), Catch::Contains("numerics.block"));
}

TEST_CASE("fast mode trains and agrees with bitwise mode within fp32 rounding at step 1") {
    Config c = small_job();
    c.train.steps = 1;
    const Snapshot bitwise = train(c);
    c.numerics.mode = Mode::fast;
    const Snapshot fast = train(c);
    // Same weights and data: the losses differ only by fp32 rounding in different orders,
    // bounded by ~(ops per value)·eps32 relative; 1e-5 leaves room for 100+ ops.
    CHECK(std::abs(fast.loss[0] - bitwise.loss[0]) <= 1e-5 * bitwise.loss[0]);
    CHECK(std::abs(fast.grad_norm[0] - bitwise.grad_norm[0]) <= 1e-3 * bitwise.grad_norm[0]);
}

TEST_CASE("tiny.toml converges to within 0.05 nats/token of the source's entropy rate") {
    Config c = load_config("examples/tiny.toml");
    c.output.run_file = false;
    Job job(c);
    job.run();
    const double val = job.history().back().val_loss;
    const double rate = job.entropy_rate();
    const double floor = job.loss_floor();
    INFO("val " << val << " entropy rate " << rate << " window floor " << floor);
    REQUIRE(rate > 0);
    CHECK(val - rate < 0.05);
    CHECK(val - floor < 0.05);
    // The floor is a true lower bound: only sampling noise (~0.015 here) may put val below it.
    CHECK(val > floor - 0.05);
}

TEST_CASE("llama-tiny.toml (the Llama-3 block) converges to within 0.02 nats/token of the floor") {
    Config c = load_config("examples/llama-tiny.toml");
    c.output.run_file = false;
    Job job(c);
    job.run();
    const double val = job.history().back().val_loss, floor = job.loss_floor();
    INFO("val " << val << " entropy rate " << job.entropy_rate() << " window floor " << floor);
    CHECK(val - floor < 0.02);
    CHECK(val > floor - 0.05);  // sampling noise only below the true floor
}

TEST_CASE("the copy source: the tiny model learns to copy 32 tokens back and reaches its floor") {
    // Windows of 65 tokens repeating their first 32 (uniform over 16 symbols): 31 of the 64
    // targets are new (ln 16 each), 33 are copies. A model that sees the whole window can reach
    // 31/64 ln 16 = 1.343; one that sees fewer than 32 tokens back, ln 16 = 2.773.
    Config c = load_config("examples/tiny.toml");
    c.output.run_file = false;
    c.model.vocab = 16;
    c.model.seq_len = 64;
    c.data.source = "copy";
    c.data.copy_distance = 32;
    c.train.threads = 1;
    Job job(c);
    job.run();
    const double val = job.history().back().val_loss, floor = job.loss_floor();
    const double shortsighted = CopySource::context_floor(16, 32, 64, 31);
    INFO("val " << val << ", floor " << floor << ", floor with 31 tokens of context "
                << shortsighted);
    CHECK(floor == Approx(31 * std::log(16.0) / 64).epsilon(1e-15));
    CHECK(shortsighted == Approx(std::log(16.0)).epsilon(1e-15));
    CHECK(job.entropy_rate() == -1);  // windows, not a stationary process: no rate
    CHECK(val - floor < 0.02);        // the copies learned: 1.43 nats below the short context's
    CHECK(val > floor - 0.02);
}

TEST_CASE("moe-small.toml reaches its floor with every expert in use and few drops") {
    Config c = load_config("examples/moe-small.toml");
    c.output.run_file = false;
    Job job(c);
    job.run();
    const double val = job.history().back().val_loss, floor = job.loss_floor();
    INFO("val " << val << ", floor " << floor);
    // 32 validation batches of 16 windows of 64 tokens: sampling noise about 0.006 nats.
    CHECK(val - floor < 0.03);
    CHECK(val > floor - 0.03);
    // The last step's routing: both layers MoE, every expert used, capacity 1.25 rarely full.
    REQUIRE(job.router_stats().size() == 2);
    for (const RouterStats& s : job.router_stats()) {
        CHECK(s.slots == c.train.batch_size * c.model.seq_len * 2);
        CHECK(double(s.dropped) / double(s.slots) < 0.05);
        for (i64 n : s.tokens) CHECK(n > s.slots / 8);  // at least half an even share
    }
}

TEST_CASE("CLI: the embedded default runs, and bad input exits 2 naming the key") {
    const std::string dir = temp_dir("cli");
    Cmd ok = run_cli("train --quiet --set train.steps=3 --set train.eval_every=2 --out " + dir);
    INFO(ok.out);
    CHECK(ok.rc == 0);
    CHECK_THAT(ok.out, Catch::Contains("summary"));
    CHECK(std::filesystem::exists(dir + "/run.h5"));

    Cmd bad_key = run_cli("train --quiet --set model.hiden=64 --out " + dir);
    CHECK(bad_key.rc == 2);
    CHECK_THAT(bad_key.out, Catch::Contains("model.hiden"));

    const std::string cfg = dir + "/bad.toml";
    FILE* f = std::fopen(cfg.c_str(), "w");
    std::fputs("[train]\nlr = -1.0\n", f);
    std::fclose(f);
    Cmd bad_range = run_cli("train --quiet " + cfg);
    CHECK(bad_range.rc == 2);
    CHECK_THAT(bad_range.out, Catch::Contains("train.lr"));

    Cmd help = run_cli("train --help");
    CHECK(help.rc == 0);
    CHECK_THAT(help.out, Catch::Contains("--set"));
}

TEST_CASE("weights exported as an llm.c checkpoint load back bit for bit through init_from") {
    const std::string dir = temp_dir("export");
    Config c = small_job();
    c.model.ffn = 4 * c.model.hidden;  // llm.c's format fixes the MLP at 4·C
    c.train.steps = 2;
    c.output.export_llmc = dir + "/model.bin";
    Job trained(c);
    trained.run();

    Config c2 = small_job();
    c2.model.ffn = c.model.ffn;
    c2.model.init_from = c.output.export_llmc;
    Job loaded(c2);
    const i64 n = trained.model().table().total;
    CHECK(std::memcmp(trained.model().params(), loaded.model().params(),
                      static_cast<size_t>(n) * sizeof(float)) == 0);

    c2.model.layers = 3;  // a checkpoint of another shape is refused, naming the key
    CHECK_THROWS_WITH(Job(c2), Catch::Contains("model.layers"));
}

TEST_CASE("data.markov_vocab draws from fewer symbols than the model's vocabulary") {
    Config c = small_job();
    c.model.vocab = 100;
    c.data.markov_vocab = 10;
    c.train.steps = 1;
    Job job(c);
    CHECK(job.source().vocab() == 10);
    job.step();
    CHECK(std::isfinite(job.history().back().loss));
}

TEST_CASE("training on llm.c token files, and a truncated file is named") {
    const std::string dir = temp_dir("bin");
    std::vector<std::uint16_t> toks(5000);
    for (size_t i = 0; i < toks.size(); i++) toks[i] = static_cast<std::uint16_t>((i * 7 + i / 13) % 32);
    write_llmc_tokens(dir + "/train.bin", toks);
    write_llmc_tokens(dir + "/val.bin", std::vector<std::uint16_t>(toks.begin(), toks.begin() + 1000));
    Config c = small_job();
    c.data.source = "bin";
    c.data.train_path = dir + "/train.bin";
    c.data.val_path = dir + "/val.bin";
    c.train.steps = 3;
    c.train.eval_every = 3;
    Job job(c);
    job.run();
    CHECK(job.history().back().val_loss > 0);
    CHECK(job.history().back().loss < job.history().front().loss);

    std::filesystem::resize_file(dir + "/train.bin", 256 * 4 + 2 * 4000);  // 1000 tokens short
    try {
        Job broken(c);
        FAIL("expected a DataError");
    } catch (const DataError& e) {
        CHECK_THAT(e.what(), Catch::Contains("train.bin"));
    }
}
