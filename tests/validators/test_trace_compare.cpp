// validators/trace_compare.h: a probe's depth, traces of the same job in other summation orders
// within budget, and wrong runs named at the op and step where they first act.
#include "core/base/error.h"
#include "validators/budget.h"
#include "validators/trace.h"
#include "validators/trace_compare.h"

#include "tests/support/test_util.h"

#include <cmath>
#include <nlohmann/json.hpp>

using namespace px;

namespace {

// The suites' small GPT-2 job (2 blocks), 3 steps.
Config small_job() {
    Config c = test::small_job();
    c.train.steps = 3;
    return c;
}

std::string recorded(const Config& c, const std::string& dir, const std::string& name) {
    const std::string path = dir + "/" + name + ".h5";
    record_trace(c, {"**"}, 1, c.train.steps, path);
    return path;
}

}  // namespace

TEST_CASE("a probe's depth counts the layers since step 1 began", "[trace_compare]") {
    const int L = 4;  // S = 2L + 5 = 13 levels a step
    CHECK(probe_depth("1/fwd/-/embed/out", L) == 1);
    CHECK(probe_depth("1/fwd/0/ln_1/out", L) == 2);
    CHECK(probe_depth("1/fwd/3/mlp.proj/out", L) == 5);
    CHECK(probe_depth("1/fwd/-/loss/out", L) == 6);
    CHECK(probe_depth("1/bwd/-/loss/dinp", L) == 7);
    CHECK(probe_depth("1/bwd/3/ln_1/dinp", L) == 8);
    CHECK(probe_depth("1/bwd/0/ln_1/dinp", L) == 11);
    CHECK(probe_depth("1/grad/0/param/attn.c_attn.weight", L) == 11);
    CHECK(probe_depth("1/grad/-/param/wte", L) == 12);
    CHECK(probe_depth("1/grad/-/clip/norm", L) == 12);
    CHECK(probe_depth("1/optim/2/adam.v/ln_1.weight", L) == 13);
    CHECK(probe_depth("2/fwd/-/embed/out", L) == 14);
    CHECK(probe_depth("5/optim/-/param/wte", L) == 65);
    // The weights have their own κ; the moments and fp8 state share the optimizer's.
    CHECK(compare_kappa("optim", "param") == kCompareKappa.param);
    CHECK(compare_kappa("optim", "adam.m") == kCompareKappa.optim);
    CHECK(compare_kappa("mgrad", "param") == kCompareKappa.grad);
    for (const char* bad : {"fwd/0/ln_1/out", "0/fwd/0/ln_1/out", "1/fwd/x/ln_1/out", "1/fwd/0/ln_1",
                            "1/fwd/-1/ln_1/out"}) {
        INFO(bad);
        CHECK_THROWS_AS(probe_depth(bad, L), DataError);
    }
}

TEST_CASE("traces of the same job in other summation orders are consistent with rounding",
          "[trace_compare]") {
    const std::string dir = test::temp_dir("trace_compare_orders");
    const Config c = small_job();
    const TraceReader ref(recorded(c, dir, "ref"));

    SECTION("a trace against itself: every ratio 0") {
        const TraceComparison tc = compare_traces(ref, ref);
        CHECK(tc.within());
        CHECK(tc.max_ratio == 0);
        CHECK(tc.layers == 2);
        CHECK(tc.unit == unit_roundoff(DType::f32));
        CHECK(tc.only_ref.empty());
        CHECK(tc.verdict().rfind("consistent with rounding", 0) == 0);
    }
    SECTION("another canonical tree, and fast mode's kernels") {
        Config tree = c, fast = c;
        tree.numerics.block = 37;
        fast.numerics.mode = Mode::fast;
        for (const Config& alt : {tree, fast}) {
            const TraceReader run(recorded(alt, dir, "alt"));
            const TraceComparison tc = compare_traces(ref, run);
            INFO(tc.text());
            CHECK(tc.within());
            i64 differ = 0;
            for (const CompareRow& w : tc.rows) differ += w.rel > 0;
            CHECK(differ > static_cast<i64>(tc.rows.size()) / 2);  // the orders really differ
            CHECK(tc.max_ratio > 0.001);                           // and the budget is not loose
        }
    }
}

TEST_CASE("a wrong run is named at the first op and step it changes", "[trace_compare]") {
    const std::string dir = test::temp_dir("trace_compare_wrong");
    const Config c = small_job();
    const TraceReader ref(recorded(c, dir, "ref"));

    SECTION("a learning rate 10% high: step 1's first updated weight") {
        Config w = c;
        w.train.lr *= 1.1;
        const TraceReader run(recorded(w, dir, "lr"));
        const TraceComparison tc = compare_traces(ref, run);
        INFO(tc.text());
        REQUIRE(!tc.within());
        const CompareRow& first = tc.rows[static_cast<size_t>(tc.first_over)];
        CHECK(first.probe == "1/optim/-/param/wte");
        CHECK(first.ratio > 2);  // the weights have the loosest budget (kCompareKappa.param)
        // Everything before it in step 1 agrees bit for bit: the forward, the backward, the
        // gradients and their norm.
        for (i64 k = 0; k < tc.first_over; k++) CHECK(tc.rows[static_cast<size_t>(k)].error == 0);
    }
    SECTION("gradient clipping at another norm: step 1's clipped moments, not the gradients") {
        Config w = c;
        w.train.grad_clip = c.train.grad_clip * 0.5;
        const TraceReader run(recorded(w, dir, "clip"));
        const TraceComparison tc = compare_traces(ref, run);
        INFO(tc.text());
        REQUIRE(!tc.within());
        const CompareRow& first = tc.rows[static_cast<size_t>(tc.first_over)];
        CHECK(first.step == 1);
        CHECK(first.op().rfind("optim/", 0) == 0);
    }
    SECTION("another seed's tokens: step 1's embedding output") {
        Config w = c;
        w.data.markov_seed = c.data.markov_seed + 1;
        const TraceReader run(recorded(w, dir, "data"));
        const TraceComparison tc = compare_traces(ref, run);
        REQUIRE(!tc.within());
        CHECK(tc.rows[static_cast<size_t>(tc.first_over)].probe == "1/fwd/-/embed/out");
        CHECK(tc.verdict().find("step 1, fwd/-/embed/out") != std::string::npos);
        const auto j = nlohmann::json::parse(tc.json());
        CHECK(j["within"] == false);
        CHECK(j["first_over"]["probe"] == "1/fwd/-/embed/out");
        CHECK(j["rows"].size() == tc.rows.size());
    }
}

TEST_CASE("traces of different models are refused naming the probe", "[trace_compare]") {
    const std::string dir = test::temp_dir("trace_compare_bad");
    Config c = small_job();
    c.train.steps = 1;
    const TraceReader ref(recorded(c, dir, "ref"));
    Config wider = c;
    wider.model.hidden *= 2;
    const TraceReader run(recorded(wider, dir, "wider"));
    try {
        compare_traces(ref, run);
        FAIL("no error");
    } catch (const DataError& e) {
        const std::string m = e.what();
        CHECK(m.find("probe 1/fwd/-/embed/out has shape") != std::string::npos);
        CHECK(m.find("not of the same model") != std::string::npos);
    }
}
