// Faults on in-process ranks (core/train/faults.h): every injected fault is caught and named.
// A bit flipped in one replica's weights or reduced gradient is found by the replica check; a
// transient one is re-run away, and the run ends bit-identical to the uninterrupted reference;
// a persistent one stops the job naming the rank and the step. A rank that dies or stalls past
// the timeout is named by the others' failed collective. (Processes under mpirun and the CLI's
// exit codes: tests/python/test_faults.py.)
#include "core/comm/comm.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/train/faults.h"
#include "core/parallel/pipeline.h"
#include "core/train/runner.h"
#include "core/io/state.h"
#include "tests/test_util.h"

#include <catch2/catch.hpp>

#include <string>

using namespace px;
using Catch::Matchers::Contains;

namespace {

Config base() {
    Config c = test::small_job();
    c.train.steps = 6;
    c.train.threads = 1;
    c.model.ffn = 128;
    c.numerics.block = 8;  // tp2 shards are whole blocks
    c.layout.timeout_s = 1.5;
    return c;
}

Config layout(Config c, int dp, int tp, int pp, int zero) {
    c.layout.dp = dp;
    c.layout.tp = tp;
    c.layout.pp = pp;
    c.layout.zero = zero;
    return c;
}

Config flip(Config c, const std::string& kind, int rank, i64 step, const std::string& tensor,
            i64 element, bool persistent) {
    c.fault.kind = kind;
    c.fault.rank = rank;
    c.fault.step = step;
    c.fault.tensor = tensor;
    c.fault.element = element;
    c.fault.persistent = persistent;
    return c;
}

// The run's final logical state; `agree`: whether every replica's agreed.
LogicalState run(const Config& c, bool* agree) {
    LogicalState s;
    *agree = true;
    run_layout(c, {}, test::inspecting([&](Job& stage) { *agree = absorb(s, stage) && *agree; }));
    return s;
}

LogicalState run(const Config& c) {
    bool agree = false;
    LogicalState s = run(c, &agree);
    CHECK(agree);
    return s;
}

std::string failure_of(const Config& c) {
    try {
        run(c);
    } catch (const std::exception& e) {
        return e.what();
    }
    FAIL("the run did not fail");
    return "";
}

}  // namespace

TEST_CASE("a transient bit flip is found by the replica check and re-run away, bit-identically",
          "[faults]") {
    struct Case {
        const char* name;
        Config cfg;
    };
    const Config c = base();
    const Case cases[] = {
        // weights of one of four replicas, found two steps later: the first run's majority
        {"dp4 flip_weight", flip(layout(c, 4, 1, 1, 0), "flip_weight", 2, 2, "h.1.mlp.c_fc.weight", 17, false)},
        // the reduced gradient under ZeRO-0: lands in that replica's weights and moments
        {"dp4 flip_grad", flip(layout(c, 4, 1, 1, 0), "flip_grad", 1, 3, "wte", 5, false)},
        // two replicas: no majority, checked every step, so the re-run names the rank
        {"dp2·tp2 flip_weight", flip(layout(c, 2, 2, 1, 1), "flip_weight", 3, 4, "h.0.attn.c_attn.weight", 40, false)},
        // a pipeline stage's replica; ZeRO-2 re-gathers weights each step, so check each step
        {"dp2·pp2 flip_weight", flip(layout(c, 2, 1, 2, 2), "flip_weight", 3, 2, "ln_f.weight", 3, false)},
    };
    for (const Case& k : cases) {
        INFO(k.name);
        Config cfg = k.cfg;
        Config ref_cfg = cfg;
        ref_cfg.fault = FaultConfig{};
        cfg.validate.replica_check_every = std::string(k.name).find("dp4") == 0 ? 3 : 1;
        const LogicalState ref = run(ref_cfg);
        const LogicalState got = run(cfg);
        REQUIRE(got.history.size() == 6);
        test::check_same_bits(ref, got);
    }
}

TEST_CASE("without the replica check the same flip changes the result (the test can fail)",
          "[faults]") {
    const Config c = layout(base(), 4, 1, 1, 0);
    const LogicalState ref = run(c);
    bool agree = true;
    const LogicalState got = run(flip(c, "flip_weight", 2, 2, "h.1.mlp.c_fc.weight", 17, false), &agree);
    CHECK_FALSE(agree);  // the replicas silently disagree
    CHECK_FALSE(test::same_bits(ref.params, got.params));
}

TEST_CASE("a persistent bit flip stops the job naming the rank and the step", "[faults]") {
    Config c = flip(layout(base(), 4, 1, 1, 0), "flip_weight", 2, 2, "wpe", 9, true);
    c.validate.replica_check_every = 3;
    try {
        run(c);
        FAIL("a persistent fault went through");
    } catch (const CorruptionError& e) {
        const std::string msg = e.what();
        CHECK_THAT(msg, Contains("world rank 2 ") && Contains("at step 2 of the re-run") &&
                            Contains("first seen at step 3") && Contains("persistent"));
    }
    // A persistent fault in a reduced gradient under pipeline parallelism.
    Config p = flip(layout(base(), 4, 1, 2, 0), "flip_grad", 5, 5, "h.1.ln_2.bias", 0, true);
    p.validate.replica_check_every = 2;
    try {
        run(p);
        FAIL("a persistent fault went through");
    } catch (const CorruptionError& e) {
        CHECK_THAT(std::string(e.what()), Contains("world rank 5 ") && Contains("at step 5 of the re-run"));
    }
}

TEST_CASE("a rank that dies or stalls past the timeout is named by the others", "[faults]") {
    const Config c = base();
    {
        Config k = layout(c, 2, 2, 1, 0);
        k.fault.kind = "kill";
        k.fault.rank = 3;
        k.fault.step = 3;
        CHECK_THAT(failure_of(k), Contains("world rank 3") && Contains("did not arrive within 1.50 s"));
    }
    {
        Config k = layout(c, 1, 1, 2, 0);
        k.fault.kind = "stall";
        k.fault.rank = 1;
        k.fault.step = 2;
        k.fault.stall_s = 0;  // until the others give up
        CHECK_THAT(failure_of(k), Contains("world rank 1") && Contains("within 1.50 s"));
    }
}

TEST_CASE("a stall shorter than the timeout only delays the step", "[faults]") {
    Config c = layout(base(), 2, 1, 1, 0);
    const LogicalState ref = run(c);
    c.layout.timeout_s = 20;
    c.fault.kind = "stall";
    c.fault.rank = 1;
    c.fault.step = 2;
    c.fault.stall_s = 0.3;
    test::check_same_bits(ref, run(c));
}

TEST_CASE("fault and replica-check settings that cannot work are refused, naming the key",
          "[faults]") {
    Config c = base();
    c.validate.replica_check_every = 2;
    CHECK_THROWS_WITH(validate_config(c), Contains("validate.replica_check_every") && Contains("layout.dp"));
    c = layout(c, 2, 1, 1, 3);
    CHECK_THROWS_WITH(validate_config(c), Contains("layout.zero = 3"));
    c = layout(base(), 2, 1, 1, 0);
    c.fault.kind = "flip";
    CHECK_THROWS_WITH(validate_config(c), Contains("fault.kind"));
    c.fault.kind = "kill";
    c.fault.rank = 2;
    CHECK_THROWS_WITH(run(c), Contains("fault.rank=2") && Contains("2 ranks"));
    c.fault.rank = 1;
    c.fault.step = 7;
    CHECK_THROWS_WITH(validate_config(c), Contains("fault.step=7") && Contains("train.steps=6"));
    c.fault.step = 1;
    c.fault.bit = 32;
    CHECK_THROWS_WITH(validate_config(c), Contains("fault.bit"));
    // Names checked against the rank's piece of the model.
    Config t = flip(layout(base(), 1, 1, 2, 0), "flip_weight", 0, 1, "ln_f.weight", 0, false);
    CHECK_THROWS_WITH(run(t), Contains("fault.tensor = \"ln_f.weight\"") && Contains("world rank 0"));
    t = flip(layout(base(), 1, 2, 1, 0), "flip_grad", 1, 1, "h.0.mlp.c_fc.weight", 64 * 32, false);
    CHECK_THROWS_WITH(run(t), Contains("fault.element = 2048") && Contains("2048 elements"));
    // One rank: nobody can give up on a rank that stalls until then, or is silenced.
    Config one = base();
    one.fault.kind = "stall";
    one.fault.stall_s = 0;
    CHECK_THROWS_WITH(run(one), Contains("fault.stall_s = 0") && Contains("one rank"));
    one.fault.kind = "kill";
    CHECK_THROWS_WITH(run(one), Contains("fault.kind = \"kill\"") && Contains("one rank"));
    one.fault.kind = "stall";
    one.fault.stall_s = 0.1;  // a bounded stall only delays the step
    CHECK_NOTHROW(run(one));
}
