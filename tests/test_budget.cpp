// The fast-mode error budget (validators/budget.h, DESIGN.md §2): every fast-mode layout of the
// matrix stays within a budget derived from the reference's own rounding error after 5 steps,
// and a deliberately wrong run does not.
//
// The references: the bitwise single device (r) and two other valid fp32 orderings of the same
// job on the single device, fast mode (oneDNN, any order) and bitwise with numerics.block = 32
// (another canonical tree); their spread estimates r's own rounding error per tensor.
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/train/job.h"
#include "core/parallel/pipeline.h"
#include "core/train/runner.h"
#include "core/io/state.h"
#include "tests/test_util.h"
#include "validators/budget.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using namespace px;

namespace {

using test::single_device;

// tp shares are whole blocks of 16 at tp = 2 (as tests/test_tp_model.cpp): C = 64, 4 heads,
// F = 128, V = 64; every layout of the matrix runs this one job.
Config job() {
    Config c = test::with_tp_shapes(test::small_job());
    c.train.threads = 1;
    return c;
}

// Any layout: pipeline layouts through run_pipeline, the others through run_layout.
LogicalState run(const Config& c) {
    LogicalState s;
    bool agree = true;
    run_layout(c, {}, test::inspecting([&](Job& j) { agree = absorb(s, j) && agree; }));
    CHECK(agree);
    CHECK(s.complete());
    return s;
}

struct References {
    LogicalState r, fast, block32;
    std::vector<const LogicalState*> alternates() const { return {&fast, &block32}; }
};

const References& references() {
    static const References refs = [] {
        References x;
        Config c = job();
        x.r = single_device(c);
        c.numerics.mode = Mode::fast;
        x.fast = single_device(c);
        c = job();
        c.numerics.block = 32;
        x.block32 = single_device(c);
        return x;
    }();
    return refs;
}

struct Case {
    const char* name;
    int dp, tp, pp, zero;
};

}  // namespace

TEST_CASE("the budget multiplier is q·√(k²+1) from the stated constants") {
    CHECK(budget_multiplier() == Approx(3.24 * std::sqrt(5.0)));
    CHECK(kFp32Unit == std::ldexp(1.0, -24));
}

TEST_CASE("the alternate references differ from the bitwise reference, by rounding only") {
    const References& x = references();
    // Different orderings: not the same bits. The block-32 tree is within the budget the fast
    // single device alone defines. (The converse does not hold: block 16 and block 32 share the
    // sequential order inside each block, a milder reordering than oneDNN's, which is why the
    // budget pools both alternates and σ̂ is dominated by the fast one; budget.h.)
    CHECK_FALSE(test::same_bits(x.r.params, x.fast.params));
    CHECK_FALSE(test::same_bits(x.r.params, x.block32.params));
    const BudgetReport b = error_budget(x.r, {&x.fast}, x.block32);
    INFO(b.text());
    CHECK(b.within);
}

TEST_CASE("every fast-mode layout of the matrix is within the error budget after 5 steps") {
    const References& x = references();
    const Case cases[] = {
        {"dp2", 2, 1, 1, 0},       {"dp4", 4, 1, 1, 0},       {"tp2", 1, 2, 1, 0},
        {"pp2", 1, 1, 2, 0},       {"dp2xtp2", 2, 2, 1, 0},   {"dp2xpp2", 2, 1, 2, 0},
        {"tp2xpp2", 1, 2, 2, 0},   {"dp2 zero1", 2, 1, 1, 1}, {"dp2 zero2", 2, 1, 1, 2},
        {"dp2 zero3", 2, 1, 1, 3},
    };
    for (const Case& k : cases) {
        Config c = job();
        c.numerics.mode = Mode::fast;
        c.layout.dp = k.dp;
        c.layout.tp = k.tp;
        c.layout.pp = k.pp;
        c.layout.zero = k.zero;
        if (k.pp > 1) {
            c.layout.schedule = "1f1b";
            c.layout.microbatches = 2;
        }
        const LogicalState got = run(c);
        const BudgetReport rep = error_budget(x.r, x.alternates(), got);
        std::printf("budget %-10s max ratio %.3f (%s)\n", k.name, rep.max_ratio, rep.worst.c_str());
        INFO(k.name << "\n" << rep.text());
        CHECK(rep.rows.size() == 3 * x.r.table.entries.size() + 2);
        CHECK(rep.within);
        // A fast-mode layout is not the bitwise reference's bits (the budget is doing work).
        CHECK(rep.max_ratio > 0);
    }
}

TEST_CASE("a wrong candidate is out of budget: another learning rate, or one weight perturbed") {
    const References& x = references();
    SECTION("learning rate 1% higher") {
        Config c = job();
        c.numerics.mode = Mode::fast;
        c.layout.dp = 2;
        c.train.lr *= 1.01;
        const BudgetReport rep = error_budget(x.r, x.alternates(), run(c));
        INFO(rep.text());
        CHECK_FALSE(rep.within);
        CHECK(rep.max_ratio > 1);
    }
    SECTION("the reference with one weight of wte perturbed by 1e-3 relative") {
        LogicalState bad = x.r;
        const TableEntry& e = bad.table.entries[static_cast<size_t>(bad.table.wte)];
        float& w = bad.params[static_cast<size_t>(e.offset + 7)];
        w *= 1.001f;
        const BudgetReport rep = error_budget(x.r, x.alternates(), bad);
        INFO(rep.text());
        CHECK_FALSE(rep.within);
        CHECK(rep.worst == "weights/wte");
        for (const TensorBudget& t : rep.rows)
            if (t.name != "weights/wte") CHECK(t.error == 0);
    }
}

TEST_CASE("error_budget refuses runs of another model") {
    const References& x = references();
    Config c = test::small_job();
    c.train.threads = 1;
    const LogicalState other = single_device(c);
    CHECK_THROWS_AS(error_budget(x.r, x.alternates(), other), InternalError);
    CHECK_THROWS_AS(error_budget(x.r, {}, x.fast), InternalError);
}
