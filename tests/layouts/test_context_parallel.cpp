// Context parallelism (layout.cp) on in-process ranks against the single-device run: the zig-zag
// split, the mesh's cp groups, the refusals, and the bit-identity matrix (ring and Ulysses, alone
// and with dp, tp, sp, pp and recomputation): 5 steps, then loss, grad norm, validation loss,
// every weight and every Adam moment compared bit for bit.
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/io/state.h"
#include "core/model/data.h"
#include "core/parallel/context/context_parallel.h"
#include "core/parallel/mesh.h"
#include "core/train/checkpointing.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "tests/support/mutations.h"
#include "tests/support/test_util.h"
#include "validators/trace.h"
#include "validators/validate.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

using namespace px;

namespace {

using test::check_same_bits;
using test::single_device;

// T = 64 tokens in blocks of 8: cp2 gives chunks of 16 tokens (2 blocks), cp4 of 8 (1 block).
Config cp_job() {
    Config c = test::small_job();
    c.numerics.block = 8;
    c.train.eval_every = 5;  // validation loss compared too
    c.train.val_batches = 2;
    c.train.threads = 1;
    return c;
}

// c under its layout equals c on one device, bit for bit.
void check_cp(Config c) {
    Config one = c;
    one.layout = LayoutConfig{};
    one.layout.timeout_s = c.layout.timeout_s;
    one.layout.recompute = c.layout.recompute;
    const LogicalState ref = single_device(one);
    bool agree = false;
    const LogicalState got = test::layout_state(c, agree);
    INFO("cp" << c.layout.cp << " " << c.layout.cp_method << " dp" << c.layout.dp << " tp"
              << c.layout.tp << " pp" << c.layout.pp << " sp " << c.layout.sequence_parallel);
    CHECK(agree);
    check_same_bits(ref, got);
    CHECK(got.history.size() == 5);
}

}  // namespace

TEST_CASE("zig-zag: cp rank r holds chunks r and 2cp-1-r of every sequence", "[cp]") {
    const std::vector<PositionRun> r0 = zigzag_runs(64, 4, 0);
    REQUIRE(r0.size() == 2);
    CHECK((r0[0].lo == 0 && r0[0].hi == 8 && r0[0].pos == 0));
    CHECK((r0[1].lo == 8 && r0[1].hi == 16 && r0[1].pos == 56));
    // The middle rank's chunks are adjacent: one run.
    const std::vector<PositionRun> r3 = zigzag_runs(64, 4, 3);
    REQUIRE(r3.size() == 1);
    CHECK((r3[0].lo == 0 && r3[0].hi == 16 && r3[0].pos == 24));
    // Every position is held once.
    std::vector<int> seen(64, 0);
    for (int r = 0; r < 4; r++)
        for (i64 p : zigzag_positions(64, 4, r)) seen[static_cast<size_t>(p)]++;
    CHECK(std::count(seen.begin(), seen.end(), 1) == 64);
    // Blocks of the batch's token tree: sequences 1 and 2, blocks of 8 at cp2.
    const std::vector<Range> b = cp_owned_blocks(64, 2, 0, 8, 1, 3);
    CHECK(b == std::vector<Range>{{8, 10}, {14, 18}, {22, 24}});
}

TEST_CASE("the mesh puts cp between dp and tp (Megatron's tp, cp, dp, pp)", "[cp]") {
    Layout l;
    l.dp = 2;
    l.cp = 2;
    l.tp = 2;
    l.batch_size = 8;
    l.seq_len = 64;
    l.block = 8;
    l.hidden = 64;
    l.ffn = 128;
    const Mesh mesh(l);
    CHECK(mesh.world_size() == 8);
    CHECK(mesh.rank_of({0, 1, 1, 1}) == 7);  // pp 0, dp 1, tp 1, cp 1
    CHECK(mesh.coord_of(5) == Coord{0, 1, 1, 0});
    CHECK(mesh.groups(MeshDim::cp) ==
          std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
    CHECK(mesh.groups(MeshDim::dp) ==
          std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    CHECK(mesh.groups(MeshDim::tp) ==
          std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
    CHECK(mesh.data_group(3) == std::vector<int>{1, 3, 5, 7});
    CHECK(mesh.data_index(6) == 3);
}

TEST_CASE("cp layouts that cannot be exact are refused with a sentence naming the keys", "[cp]") {
    Config c = cp_job();
    c.layout.cp = 2;
    c.numerics.block = 32;  // chunks of 16 tokens cut a block
    CHECK_THROWS_WITH(make_layout(c), Catch::Contains("layout.cp=2") &&
                                          Catch::Contains("numerics.block=32") &&
                                          Catch::Contains("model.seq_len=64"));
    c = cp_job();
    c.layout.cp = 8;
    c.numerics.block = 4;
    c.layout.cp_method = "ulysses";  // 4 heads over 8 ranks
    CHECK_THROWS_WITH(make_layout(c),
                      Catch::Contains("ulysses") && Catch::Contains("model.heads=4"));
    c = cp_job();
    c.layout.cp = 2;
    c.layout.dp = 2;
    c.layout.zero = 1;
    CHECK_THROWS_WITH(make_layout(c),
                      Catch::Contains("layout.zero=1") && Catch::Contains("layout.cp=2"));
    c = cp_job();
    c.layout.cp = 2;
    c.model.moe_experts = 4;
    c.model.moe_top_k = 2;
    CHECK_THROWS_WITH(make_layout(c), Catch::Contains("model.moe_experts=4") &&
                                          Catch::Contains("layout.cp=2"));
    c = cp_job();
    c.layout.cp_method = "spiral";
    CHECK_THROWS_WITH(validate_config(c), Catch::Contains("layout.cp_method"));
}

TEST_CASE("ring cp2 and cp4 (zig-zag) are bit-identical to the single device", "[cp]") {
    for (int cp : {2, 4}) {
        Config c = cp_job();
        c.layout.cp = cp;
        check_cp(c);
    }
}

TEST_CASE("Ulysses cp2 and cp4 are bit-identical to the single device", "[cp]") {
    for (int cp : {2, 4}) {
        Config c = cp_job();
        c.layout.cp = cp;
        c.layout.cp_method = "ulysses";
        check_cp(c);
    }
}

TEST_CASE("cp2 × tp2 × dp2 is bit-identical to the single device", "[cp]") {
    for (const char* method : {"ring", "ulysses"}) {
        Config c = test::with_tp_shapes(cp_job());
        c.numerics.block = 8;  // T = 32: chunks of 8 tokens at cp2
        c.layout.cp = 2;
        c.layout.tp = 2;
        c.layout.dp = 2;
        c.layout.cp_method = method;
        check_cp(c);
    }
}

TEST_CASE("cp2 with tensor and sequence parallelism is bit-identical to the single device",
          "[cp]") {
    Config c = test::with_tp_shapes(cp_job());
    c.numerics.block = 8;
    c.layout.cp = 2;
    c.layout.tp = 2;
    c.layout.sequence_parallel = true;
    check_cp(c);
}

TEST_CASE("cp2 with pipeline stages, microbatches and recomputation is bit-identical", "[cp]") {
    Config c = cp_job();
    c.layout.cp = 2;
    c.layout.pp = 2;
    c.layout.microbatches = 2;
    check_cp(c);
    c = cp_job();
    c.layout.cp = 4;
    c.layout.recompute = "full";
    check_cp(c);
    c = cp_job();  // more than one sequence per dp rank and a dp rank's range not a node
    c.train.batch_size = 6;
    c.layout.cp = 2;
    c.layout.dp = 3;
    check_cp(c);
}

TEST_CASE("a cp2 checkpoint resumes on one device, and one device's under cp2 × tp2, bit for bit",
          "[cp]") {
    Config c = cp_job();
    c.train.steps = 6;
    c.train.eval_every = 3;
    c.train.val_batches = 1;
    c.model.ffn = 128;
    const LogicalState ref = single_device(c);
    auto run_any = [](const Config& cfg) {
        LogicalState s;
        run_layout(cfg, {}, test::inspecting([&](Job& job) { absorb(s, job); }));
        return s;
    };
    struct Case {
        int cp_from, tp_from, cp_to, tp_to;
        const char* method;
    };
    for (const Case& k :
         {Case{2, 1, 1, 1, "ring"}, Case{1, 1, 2, 2, "ring"}, Case{4, 1, 2, 1, "ulysses"}}) {
        INFO("cp" << k.cp_from << "·tp" << k.tp_from << " -> cp" << k.cp_to << "·tp" << k.tp_to
                  << " " << k.method);
        const std::string dir = test::temp_dir("cp_resume");
        Config w = c;
        w.layout.cp = k.cp_from;
        w.layout.tp = k.tp_from;
        w.layout.cp_method = k.method;
        w.checkpoint.dir = dir;
        w.checkpoint.every = 3;
        run_any(w);
        const std::string ckpt = checkpoint_path(dir, 3);
        REQUIRE(std::filesystem::exists(ckpt));
        // The writer's final checkpoint holds the reference state: cp shards no parameter.
        const LogicalState last = read_checkpoint(checkpoint_path(dir, 6), c.model);
        CHECK(test::same_bits(ref.params, last.params));
        CHECK(test::same_bits(ref.m, last.m));
        CHECK(test::same_bits(ref.v, last.v));
        Config r = c;
        r.layout.cp = k.cp_to;
        r.layout.tp = k.tp_to;
        r.layout.cp_method = k.method;
        r.checkpoint.resume = ckpt;
        const LogicalState got = run_any(r);
        REQUIRE(got.history.size() == 6);
        check_same_bits(ref, got);
    }
}

TEST_CASE("validate reads cpN and ulysses, and every cp layout matches the reference", "[cp]") {
    const LayoutSpec l = parse_layout("cp2xtp2xdp2");
    CHECK((l.cp == 2 && l.tp == 2 && l.dp == 2 && !l.ulysses));
    const LayoutSpec u = parse_layout("cp4xulysses");
    CHECK((u.cp == 4 && u.ulysses));
    CHECK_THROWS_WITH(parse_layout("cp0"), Catch::Contains("\"cp0\" must be at least 1"));
    CHECK_THROWS_WITH(parse_layout("cp2xspiral"), Catch::Contains("cpN"));
    const std::vector<LayoutSpec> axes = single_axis_parts(l);
    REQUIRE(axes.size() == 3);
    CHECK(axes[2].name == "cp2");
    Config c = test::with_tp_shapes(cp_job());
    c.numerics.block = 8;
    c.train.steps = 2;
    Config small_blocks = c;
    small_blocks.numerics.block = 4;  // T = 32 in 8 chunks of 4 tokens
    const Config cp4 = with_layout(small_blocks, u);
    CHECK((cp4.layout.cp == 4 && cp4.layout.cp_method == "ulysses"));
    const ValidationReport rep = validate_layouts(
        c, {parse_layout("cp2"), parse_layout("cp2xulysses"), l, parse_layout("cp2xtp2xsp")}, 2);
    REQUIRE(rep.layouts.size() == 4);
    for (const LayoutResult& r : rep.layouts) {
        INFO(r.layout << ": " << r.verdict << " " << r.first_op_note);
        CHECK(r.verdict == "match");
        CHECK(r.steps == 2);
    }
}

TEST_CASE(
    "a cp rank's traffic and attention memory are the formulas' (cp_costs), 1/cp of the "
    "attention matrix",
    "[cp]") {
    for (const char* method : {"ring", "ulysses"})
        for (int cp : {2, 4}) {
            Config c = cp_job();
            c.train.eval_every = 0;  // training steps only: the formula's
            c.layout.cp = cp;
            c.layout.cp_method = method;
            c.layout.recompute = cp == 4 ? "full" : "none";
            std::vector<CpStats> stats;
            run_layout(c, {}, test::inspecting([&](Job& job) { stats.push_back(job.cp_stats()); }));
            REQUIRE(stats.size() == static_cast<size_t>(cp));
            const double B = 8, NH = 4, T = 64, L = cp == 4 ? 1 : 2;  // layers of att kept
            for (const CpStats& s : stats) {
                INFO(method << " cp" << cp);
                CHECK(s.cp == cp);
                CHECK(s.method == method);
                CHECK(s.comm_bytes_per_step > 0);
                CHECK(s.comm_bytes_per_step == s.comm_bytes_formula);
                CHECK(s.attention_bytes == s.attention_bytes_formula);
                CHECK(s.attention_bytes * cp == 4 * B * NH * T * T * (L + 2));
            }
        }
}

TEST_CASE("validate names the first op a flipped K/V bit in the ring reaches, and its rank",
          "[cp]") {
    Config c = cp_job();
    c.train.steps = 2;
    RunHooks plant;
    plant.wrap_group =
        [](MeshDim d,
           std::unique_ptr<comm::Communicator> g) -> std::unique_ptr<comm::Communicator> {
        if (d != MeshDim::cp) return g;
        // cp rank 1's first received K/V block (step 1, layer 0's forward)
        return std::make_unique<test::mutation::FlipFirstReceived>(
            std::move(g), 1, [](const comm::Request& r) { return r.op == comm::Op::recv; });
    };
    const ValidationReport rep = validate_layouts(c, {parse_layout("cp2")}, 2, nullptr, plant);
    REQUIRE(rep.layouts.size() == 1);
    const LayoutResult& r = rep.layouts[0];
    INFO(r.first_op.text() << " " << r.first_op_where << " " << r.first_op_note << " ranks "
                           << r.first_op_ranks.size());
    CHECK(r.verdict == "diverged");
    CHECK(r.first_step == 1);
    CHECK(r.first_op.name == "1/fwd/0/attn.core/out");
    CHECK(r.first_op_rank == 1);
    CHECK(r.first_op_where == "pp0 dp0 cp1 tp0");
}

TEST_CASE("a golden trace of the single device checks cp layouts probe by probe, at every op",
          "[cp]") {
    // Every forward and backward op's output is placed at its tokens' logical positions, so each
    // rank's pieces equal the trace's tensors bit for bit.
    Config c = test::with_tp_shapes(cp_job());
    c.numerics.block = 8;
    c.train.steps = 2;
    c.train.eval_every = 0;
    const std::string dir = test::temp_dir("cp_golden");
    record_trace(c, {"**"}, 1, 2, dir + "/trace.h5");
    const TraceReader trace(dir + "/trace.h5");
    const ValidationReport rep =
        validate_golden(c,
                        {parse_layout("cp2"), parse_layout("cp2xulysses"),
                         parse_layout("cp2xtp2xsp"), parse_layout("cp2xdp2")},
                        trace);
    REQUIRE(rep.layouts.size() == 4);
    for (const LayoutResult& r : rep.layouts) {
        INFO(r.layout << ": " << r.verdict << " " << r.error << " " << r.first_op.text());
        CHECK(r.verdict == "match");
    }
}

TEST_CASE("fast mode: cp layouts train within the reference's error budget", "[cp]") {
    Config c = cp_job();
    c.numerics.mode = Mode::fast;
    c.train.steps = 3;
    const ValidationReport rep =
        validate_layouts(c, {parse_layout("cp2"), parse_layout("cp4xulysses")}, 3);
    REQUIRE(rep.layouts.size() == 2);
    for (const LayoutResult& r : rep.layouts) {
        INFO(r.layout << ": " << r.verdict << " " << r.error);
        CHECK(r.verdict == "within budget");
    }
}

TEST_CASE(
    "examples/long-context.toml reaches its floor, below the short-context best by the "
    "margin the floor predicts",
    "[cp]") {
    // The copy source at D = 48 of T = 64 under cp2: the floor (D-1)/T · ln V with the whole
    // window, ln V for any shorter context (CopySource::context_floor).
    Config c = load_config("examples/long-context.toml");
    c.output.run_file = false;
    c.train.threads = 1;
    REQUIRE(c.layout.cp == 2);
    const double floor = CopySource::context_floor(16, 48, 64, 64);
    const double shortsighted = CopySource::context_floor(16, 48, 64, 47);
    CHECK(floor == Approx(47 * std::log(16.0) / 64).epsilon(1e-15));
    CHECK(shortsighted == Approx(std::log(16.0)).epsilon(1e-15));
    std::vector<double> val;
    run_layout(c, {}, test::inspecting([&](Job& job) {
                   if (job.cp_rank() == 0) val.push_back(job.history().back().val_loss);
               }));
    REQUIRE(val.size() == 1);
    INFO("val " << val[0] << " floor " << floor);
    CHECK(std::abs(val[0] - floor) < 0.002);  // the validation windows' sampling noise
    CHECK(shortsighted - val[0] > (shortsighted - floor) - 0.002);
}

TEST_CASE(
    "the largest attention logit per layer (spike evidence) is the single device's under "
    "ring and Ulysses",
    "[cp]") {
    Config c = cp_job();
    c.train.steps = 2;
    c.train.eval_every = 0;
    Job one(c);
    one.watch_logits(true);
    one.run();
    const std::vector<float> want = one.logit_max();
    REQUIRE(want.size() == 2);
    for (const char* method : {"ring", "ulysses"}) {
        Config k = c;
        k.layout.cp = 4;
        k.layout.cp_method = method;
        RunHooks hooks;
        hooks.setup = [](Job& job) { job.watch_logits(true); };
        std::vector<std::vector<float>> got;
        hooks.inspect = [&](Job& job) { got.push_back(job.logit_max()); };
        run_layout(k, {}, hooks);
        REQUIRE(got.size() == 4);
        for (const auto& g : got) {
            INFO(method);
            CHECK(test::same_bits(g, want));
        }
    }
}
