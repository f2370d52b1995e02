// Expert parallelism (core/parallel/expert/expert_parallel.h): every layout of ep with dp,
// microbatches, pp and recomputation is bit-identical to the single device, router statistics
// included; a checkpoint written under ep2 resumes under ep4 (and back on one device) bit for
// bit; the all-to-all bytes are the formula's; layouts that cannot run say which keys to change.
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/parallel/mesh.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "core/io/checkpoint.h"
#include "core/io/state.h"
#include "tests/support/mutations.h"
#include "tests/support/test_util.h"
#include "validators/trace.h"
#include "validators/validate.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <vector>

using namespace px;

namespace {

// Four experts of 48 channels (an ep rank's share of each stacked tensor is whole blocks of 16
// up to ep4), top-2 with capacity 1 (tokens do drop), a shared expert, both auxiliary losses.
Config ep_job() {
    Config c = test::small_moe_job(48);
    c.model.moe_aux_loss = 0.01;
    c.model.moe_z_loss = 0.001;
    return c;
}

}  // namespace

TEST_CASE("expert-parallel layouts are bit-identical to the single device") {
    const Config base = ep_job();
    test::ValueLog ref_values;
    LogicalState ref;
    {
        Job job(base);
        job.add_observer(&ref_values);
        job.run();
        absorb(ref, job);
    }
    REQUIRE(ref_values.got.count("moe.h.0.drop_fraction") == 1);
    struct L {
        int dp, ep, pp, mb;
        const char* recompute;
        int zero = 0;
    };
    for (const L l : {L{2, 2, 1, 1, "none"}, L{4, 4, 1, 1, "none"}, L{4, 2, 1, 1, "none"},
                      L{2, 2, 2, 2, "none"}, L{2, 2, 1, 2, "full"}, L{4, 2, 1, 2, "none"},
                      L{4, 2, 1, 1, "none", 1}, L{4, 2, 2, 2, "full", 1}}) {
        Config c = base;
        c.layout.dp = l.dp, c.layout.ep = l.ep, c.layout.pp = l.pp;
        c.layout.microbatches = l.mb;
        c.layout.recompute = l.recompute;
        c.layout.zero = l.zero;
        INFO("dp" << l.dp << " ep" << l.ep << " pp" << l.pp << " mb" << l.mb << " "
                  << l.recompute << " zero" << l.zero);
        LogicalState got;
        test::ValueLog values;
        bool agree = true;
        bool sharded = true;
        RunHooks h = test::inspecting([&](Job& job) {
            agree = absorb(got, job) && agree;
            // the rank holds its E/ep experts only, and they came through the ep group
            const ParamTable& t = job.model().table();
            const int lo = job.model().part().chunks.front().lo;
            const int e = t.find("h." + std::to_string(lo) + ".moe.experts.c_fc.weight");
            sharded = sharded && e >= 0 &&
                      t.entries[static_cast<size_t>(e)].rows == 4 / l.ep * 48 &&
                      job.groups().ep != nullptr && job.groups().ep->stats()[comm::Op::all_to_all_v].bytes_sent > 0;
        });
        run_layout(c, {&values}, h);
        CHECK(agree);
        CHECK(sharded);
        test::check_same_bits(ref, got);
        CHECK(values.got == ref_values.got);
    }
}

TEST_CASE("MoE under tensor parallelism, with and without ep, is bit-identical to the single device") {
    // Every tp rank runs a MoE layer whole (router, experts and shared experts replicated over
    // tp); the dense layers around it are tensor-parallel. Layer 0 dense, layer 1 MoE.
    Config base = test::with_tp_shapes(ep_job());
    base.model.moe_every = 2;
    base.train.steps = 4;
    LogicalState ref;
    test::ValueLog ref_values;
    {
        Job job(base);
        job.add_observer(&ref_values);
        job.run();
        absorb(ref, job);
    }
    REQUIRE(ref_values.got.count("moe.h.1.drop_fraction") == 1);
    REQUIRE(ref_values.got.count("moe.h.0.drop_fraction") == 0);
    struct L {
        int dp, ep, tp, pp;
    };
    for (const L l : {L{1, 1, 2, 1}, L{2, 2, 2, 1}, L{4, 2, 2, 1}, L{2, 2, 2, 2}}) {
        Config c = base;
        c.layout.dp = l.dp, c.layout.ep = l.ep, c.layout.tp = l.tp, c.layout.pp = l.pp;
        c.layout.microbatches = l.pp > 1 ? 2 : 1;
        INFO("dp" << l.dp << " ep" << l.ep << " tp" << l.tp << " pp" << l.pp);
        LogicalState got;
        test::ValueLog values;
        bool agree = true;
        run_layout(c, {&values},
                   test::inspecting([&](Job& job) { agree = absorb(got, job) && agree; }));
        CHECK(agree);
        test::check_same_bits(ref, got);
        CHECK(values.got == ref_values.got);
    }
}

TEST_CASE("an ep2 checkpoint resumes under ep4 and on one device, bit-identical to the uninterrupted run") {
    Config c = ep_job();
    c.train.steps = 6;
    c.train.eval_every = 3;
    const LogicalState ref = test::single_device(c);
    const std::string dir = test::temp_dir("ep_resume");
    Config w = c;  // dp2 · ep2 writes step 3
    w.layout.dp = 2;
    w.layout.ep = 2;
    w.checkpoint.dir = dir;
    w.checkpoint.every = 3;
    run_layout(w);
    const std::string ckpt = checkpoint_path(dir, 3);
    REQUIRE(std::filesystem::exists(ckpt));
    struct L {
        int dp, ep, pp;
    };
    for (const L l : {L{4, 4, 1}, L{1, 1, 1}, L{4, 2, 1}, L{2, 2, 2}}) {
        Config r = c;
        r.layout.dp = l.dp, r.layout.ep = l.ep, r.layout.pp = l.pp;
        r.layout.microbatches = l.pp > 1 ? 2 : 1;
        r.checkpoint.resume = ckpt;
        INFO("resumed as dp" << l.dp << " ep" << l.ep << " pp" << l.pp);
        LogicalState got;
        run_layout(r, {}, test::inspecting([&](Job& job) { absorb(got, job); }));
        REQUIRE(got.history.size() == 6);
        test::check_same_bits(ref, got);
    }
    // And one written under ep4 with pp2 resumes as ep2, one of ep2×dp2 with ZeRO-1 as ep4.
    struct W {
        int dp, ep, pp, zero;
        const char* name;
        int r_dp, r_ep;
    };
    for (const W x : {W{4, 4, 2, 0, "ep4_pp2_resume", 2, 2}, W{4, 2, 1, 1, "ep2_z1_resume", 4, 4}}) {
        INFO("written under " << x.name);
        const std::string d = test::temp_dir(x.name);
        w.layout.dp = x.dp, w.layout.ep = x.ep, w.layout.pp = x.pp, w.layout.zero = x.zero;
        w.layout.microbatches = 1;
        w.checkpoint.dir = d;
        run_layout(w);
        Config r = c;
        r.layout.dp = x.r_dp, r.layout.ep = x.r_ep;
        r.checkpoint.resume = checkpoint_path(d, 3);
        LogicalState got;
        run_layout(r, {}, test::inspecting([&](Job& job) { absorb(got, job); }));
        test::check_same_bits(ref, got);
    }
}

TEST_CASE("expert-parallel layouts that cannot run say which keys to change") {
    Config c = ep_job();
    c.layout.dp = 3;
    c.layout.ep = 2;
    CHECK_THAT(test::error_of<ConfigError>([&] { make_layout(c); }),
               Catch::Contains("layout.ep=2 does not divide layout.dp=3"));
    c.layout.dp = 6;
    c.layout.ep = 3;
    CHECK_THAT(test::error_of<ConfigError>([&] { make_layout(c); }),
               Catch::Contains("layout.ep=3 does not divide model.moe_experts=4"));
    c.layout.dp = 4;
    c.layout.ep = 4;
    c.model.moe_ffn = 40;  // one expert's 40-wide bias is not whole blocks of 16
    CHECK_THAT(test::error_of<ConfigError>([&] { make_layout(c); }),
               Catch::Contains("numerics.block=16"));
    c.model.moe_ffn = 48;
    c.layout.zero = 2;
    CHECK_THAT(test::error_of<ConfigError>([&] { make_layout(c); }),
               Catch::Contains("layout.zero = 0 or 1"));
    c.layout.zero = 0;
    c.validate.replica_check_every = 2;
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(c); }),
               Catch::Contains("validate.replica_check_every = 0 or layout.ep = 1"));
    c.validate.replica_check_every = 0;
    c.model.moe_experts = 0;
    CHECK_THAT(test::error_of<ConfigError>([&] { make_layout(c); }),
               Catch::Contains("model.moe_experts = 0"));
    Config bad = ep_job();
    bad.layout.ep = 0;
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(bad); }),
               Catch::Contains("layout.ep"));
}

TEST_CASE("the ep all-to-alls send the formula's bytes when routing is even") {
    // Every token goes to every expert (top-k = E, dropless): each rank sends exactly (ep-1)/ep
    // of its routed rows away, the formula's even spread.
    for (const int ep : {2, 4})
        for (const char* recompute : {"none", "full"}) {
            Config c = ep_job();
            c.model.moe_top_k = 4;
            c.model.moe_capacity_factor = 0;
            c.layout.dp = 4;
            c.layout.ep = ep;
            c.layout.microbatches = 2;
            c.layout.recompute = recompute;
            INFO("ep" << ep << " recompute " << recompute);
            std::vector<EpStats> got(4);
            run_layout(c, {}, test::inspecting([&](Job& job) {
                           got[static_cast<size_t>(job.dp_rank())] = job.ep_stats();
                       }));
            for (const EpStats& s : got) {
                CHECK(s.ep == ep);
                CHECK(s.comm_bytes_per_step > 0);
                CHECK(s.comm_bytes_per_step == s.comm_bytes_formula);
            }
        }
}

TEST_CASE("validate reads epN, and every ep layout matches the reference") {
    const LayoutSpec l = parse_layout("ep2xdp4xpp2");
    CHECK((l.ep == 2 && l.dp == 4 && l.pp == 2));
    CHECK_THROWS_WITH(parse_layout("ep0"), Catch::Contains("\"ep0\" must be at least 1"));
    CHECK_THROWS_WITH(parse_layout("ep2xmoe"), Catch::Contains("epN"));
    const std::vector<LayoutSpec> axes = single_axis_parts(l);
    REQUIRE(axes.size() == 3);
    CHECK(axes[2].name == "ep2");
    Config c = ep_job();
    c.train.steps = 2;
    const Config ep2 = with_layout(c, parse_layout("ep2"));  // ep2 alone: the experts over dp2
    CHECK((ep2.layout.ep == 2 && ep2.layout.dp == 2));
    const ValidationReport rep = validate_layouts(
        c, {parse_layout("ep2"), parse_layout("ep4"), parse_layout("ep2xdp4xmb2"),
            parse_layout("ep2xpp2xmb2")},
        2);
    REQUIRE(rep.layouts.size() == 4);
    for (const LayoutResult& r : rep.layouts) {
        INFO(r.layout << ": " << r.verdict << " " << r.error << " " << r.first_op_note);
        CHECK(r.verdict == "match");
        CHECK(r.steps == 2);
    }
}

TEST_CASE("a golden trace of the single device checks ep layouts probe by probe") {
    Config c = ep_job();
    c.train.steps = 2;
    c.train.eval_every = 0;
    const std::string dir = test::temp_dir("ep_golden");
    record_trace(c, {"**"}, 1, 2, dir + "/trace.h5");
    const TraceReader trace(dir + "/trace.h5");
    const ValidationReport rep = validate_golden(
        c, {parse_layout("ep2"), parse_layout("ep4"), parse_layout("ep2xdp4")}, trace);
    REQUIRE(rep.layouts.size() == 3);
    for (const LayoutResult& r : rep.layouts) {
        INFO(r.layout << ": " << r.verdict << " " << r.error << " " << r.first_op.text());
        CHECK(r.verdict == "match");
    }
}

TEST_CASE("validate names the first op a flipped bit in the dispatch reaches, and its rank") {
    Config c = ep_job();
    c.train.steps = 2;
    RunHooks plant;
    // ep rank 1's first received all-to-all of rows (step 1, layer 0's forward: the rows ep rank
    // 0 routed to rank 1's experts)
    plant.wrap_ep_group = [](std::unique_ptr<comm::Communicator> g) {
        return std::unique_ptr<comm::Communicator>(
            std::make_unique<test::mutation::FlipFirstReceived>(
                std::move(g), 1, [](const comm::Request& r) {
                    return r.op == comm::Op::all_to_all_v && r.dtype == comm::Dtype::f32;
                }));
    };
    const ValidationReport rep = validate_layouts(c, {parse_layout("ep2")}, 2, nullptr, plant);
    REQUIRE(rep.layouts.size() == 1);
    const LayoutResult& r = rep.layouts[0];
    INFO(r.first_op.text() << " " << r.first_op_where << " " << r.first_op_note);
    CHECK(r.verdict == "diverged");
    CHECK(r.first_step == 1);
    // The row came from dp rank 0, whose tokens the expert's output is combined into.
    CHECK(r.first_op.name == "1/fwd/0/moe.combine/out");
    CHECK(r.first_op_where == "pp0 dp0 tp0");
}

TEST_CASE("fast mode: ep layouts train within the reference's error budget") {
    Config c = ep_job();
    c.numerics.mode = Mode::fast;
    c.train.steps = 3;
    const ValidationReport rep =
        validate_layouts(c, {parse_layout("ep2"), parse_layout("ep2xdp4")}, 3);
    REQUIRE(rep.layouts.size() == 2);
    for (const LayoutResult& r : rep.layouts) {
        INFO(r.layout << ": " << r.verdict << " " << r.error);
        CHECK(r.verdict == "within budget");
    }
}
