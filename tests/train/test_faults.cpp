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
#include "core/parallel/pipeline/pipeline.h"
#include "core/train/runner.h"
#include "core/io/state.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
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

// What f wrote to stderr (the replica check's reports), while it still goes to a file.
template <class F>
std::string stderr_of(F&& f) {
    std::fflush(stderr);
    FILE* tmp = std::tmpfile();
    REQUIRE(tmp != nullptr);
    const int saved = dup(2);
    dup2(fileno(tmp), 2);
    std::string err;
    auto restore = [&] {
        std::fflush(stderr);
        dup2(saved, 2);
        close(saved);
        std::rewind(tmp);
        char buf[4096];
        size_t n;
        while ((n = std::fread(buf, 1, sizeof buf, tmp)) > 0) err.append(buf, n);
        std::fclose(tmp);
    };
    try {
        f();
    } catch (...) {
        restore();
        UNSCOPED_INFO("stderr: " << err);
        throw;
    }
    restore();
    return err;
}

// What each world rank holds of its stage's parameter table: its tensors, and under ZeRO its
// shard [lo, hi).
struct Holds {
    std::vector<TableEntry> entries;
    i64 total = 0, lo = 0, hi = 0;
};

std::vector<Holds> holdings(Config c) {
    c.fault = FaultConfig{};
    c.validate.replica_check_every = c.layout.dp > 1 ? 1 : 0;
    const Layout l = make_layout(c);
    const Mesh mesh(l);
    std::vector<Holds> out(static_cast<size_t>(l.world_size()));
    std::mutex mu;
    RunHooks h;
    h.setup = [&](Job& job) {
        Holds s;
        s.entries = job.model().table().entries;
        s.total = job.model().table().total;
        const ShardState own = job.data().own_shard();
        s.lo = own.lo, s.hi = own.hi;
        std::lock_guard<std::mutex> lock(mu);
        out[static_cast<size_t>(mesh.rank_of({job.pp_rank(), job.dp_rank(), job.tp_rank()}))] = s;
        job.stop_after(0);
    };
    run_layout(c, {}, h);
    return out;
}

// fault.tensor and fault.element for the table index i of a rank.
void aim(Config& c, const Holds& h, i64 i) {
    for (const TableEntry& e : h.entries)
        if (i >= e.offset && i < e.offset + e.numel()) {
            c.fault.tensor = e.name;
            c.fault.element = i - e.offset;
            return;
        }
    FAIL("no tensor holds table index " << i);
}

// A table index of the rank that only it updates (its ZeRO shard; without ZeRO, any), or one
// that it holds as a mere replica, outside its shard (ZeRO-1/2; the second copy of the next
// rank's shard that it keeps for the replica check is apart from its weights).
i64 owned_index(const Holds& h) {
    return h.hi > h.lo ? (h.lo + h.hi) / 2 : h.total / 2;
}
i64 replicated_index(const Holds& h) {
    for (i64 i = h.total / 3; i < h.total; i++)
        if (i < h.lo || i >= h.hi) return i;
    FAIL("the rank holds nothing that others own");
    return 0;
}

// dp3: each replica owns one token block of the batch (3 sequences of 64 tokens, blocks of 128).
Config dp3(Config c) {
    c.train.batch_size = 6;
    c.numerics.block = 128;
    return c;
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

namespace {

// A flip aimed at world rank `rank` at step `step`: at a table index only it updates (its ZeRO
// shard), or at one it holds as a mere replica (ZeRO-1/2: overwritten by the owner next step).
Config aimed(Config c, const std::string& kind, int rank, i64 step, bool replicated,
             bool persistent = false) {
    const std::vector<Holds> h = holdings(c);
    c = flip(c, kind, rank, step, "", 0, persistent);
    const Holds& mine = h[static_cast<size_t>(rank)];
    aim(c, mine, replicated ? replicated_index(mine) : owned_index(mine));
    return c;
}

// Runs a transient fault with the replica check: it is reported, re-run away, and the run ends
// bit-identical to the same layout without the fault. Returns the reports.
std::string recovers(const Config& cfg, int every) {
    Config ref_cfg = cfg;
    ref_cfg.fault = FaultConfig{};
    const LogicalState ref = run(ref_cfg);
    Config c = cfg;
    c.validate.replica_check_every = every;
    LogicalState got;
    const std::string err = stderr_of([&] { got = run(c); });
    INFO(err);
    REQUIRE(got.history.size() == static_cast<size_t>(c.train.steps));
    test::check_same_bits(ref, got);
    CHECK_THAT(err, Contains("parallax: replica check at step"));
    return err;
}

}  // namespace

TEST_CASE("under ZeRO, a fault in what only a shard's owner computes, or in a weight between "
          "checks, is found and re-run away bit-identically", "[faults]") {
    const Config c = base();
    SECTION("dp3·pp2 ZeRO-2, checked every 2 steps: a replica's weight flipped between checks") {
        // The flipped weight is used by step 4 and then overwritten by its owner's shard: before
        // the per-step hashes, the run exited 0 with a result apart from the run without it.
        const std::string err = recovers(aimed(layout(dp3(c), 3, 1, 2, 2), "flip_weight", 1, 3, true), 2);
        CHECK_THAT(err, Contains("replica check at step 4: the weights of world rank 1 differ from "
                                 "its data-parallel replicas' (at step 3)") &&
                            Contains("the fault on world rank 1 was transient"));
    }
    SECTION("dp3·pp2 ZeRO-2, checked every 2 steps: an owner's gradient shard") {
        const std::string err = recovers(aimed(layout(dp3(c), 3, 1, 2, 2), "flip_grad", 4, 3, false), 2);
        // World rank 4 is dp rank 1 of the second stage; dp rank 0 (world rank 3) keeps its copy.
        CHECK_THAT(err, Contains("world rank 4's reduced gradient shard differs from the second "
                                 "copy of it that world rank 3 keeps") &&
                            Contains("(at step 3)") && Contains("the fault on world rank 4 was transient"));
    }
    SECTION("dp2·pp2 ZeRO-2, checked every step: an owner's gradient shard") {
        const std::string err = recovers(aimed(layout(c, 2, 1, 2, 2), "flip_grad", 1, 3, false), 1);
        CHECK_THAT(err, Contains("replica check at step 3: world rank 1's reduced gradient shard") &&
                            Contains("the fault on world rank 1 was transient"));
    }
    SECTION("dp3 ZeRO-1, checked every step: an owner's gradient shard") {
        // Under ZeRO-1 the reduced gradient is whole on every replica: the flipped one is outvoted.
        const std::string err = recovers(aimed(layout(dp3(c), 3, 1, 1, 1), "flip_grad", 2, 3, false), 1);
        CHECK_THAT(err, Contains("replica check at step 3: the reduced gradients of world rank 2 "
                                 "differ from its data-parallel replicas'") &&
                            Contains("the fault on world rank 2 was transient"));
    }
    SECTION("dp2 ZeRO-3, checked every 2 steps: an owner's weight shard") {
        const std::string err = recovers(aimed(layout(c, 2, 1, 1, 3), "flip_weight", 0, 3, false), 2);
        CHECK_THAT(err, Contains("world rank 0's ZeRO shard (its weights and Adam moments) differs "
                                 "from the second copy of it that world rank 1 keeps") &&
                            Contains("the fault on world rank 0 was transient"));
    }
    SECTION("dp2·pp2 ZeRO-2 with microbatches, resumed from a checkpoint: the second copies "
            "start from the checkpoint's shards") {
        Config w = layout(c, 2, 1, 2, 2);
        w.layout.microbatches = 2;
        Config first = w;
        first.checkpoint.dir = test::temp_dir("faults_zero_resume");
        first.checkpoint.every = 2;
        run(first);
        w.checkpoint.resume = first.checkpoint.dir + "/ckpt-00000004.h5";
        const std::string err = recovers(aimed(w, "flip_grad", 1, 5, false), 1);
        CHECK_THAT(err, Contains("replica check at step 5: world rank 1's reduced gradient shard") &&
                            Contains("the fault on world rank 1 was transient"));
    }
}

TEST_CASE("under ZeRO, a persistent fault in an owner's gradient shard stops the job naming the "
          "owner and the rank that keeps the second copy", "[faults]") {
    Config c = aimed(layout(base(), 2, 1, 2, 2), "flip_grad", 3, 3, false, true);
    c.validate.replica_check_every = 2;
    std::string err;
    const std::string msg = test::error_of<CorruptionError>([&] { err = stderr_of([&] { run(c); }); });
    CHECK_THAT(msg, Contains("silent data corruption: world rank 3's reduced gradient shard and "
                             "world rank 2's second copy of it disagree again at step 3 of the "
                             "re-run (first seen at step 4)") &&
                        Contains("Take the nodes of world ranks 2 and 3 out"));
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
    CHECK_NOTHROW(validate_config(c));  // ZeRO-3: each shard's second copy is compared
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

// The fault matrix: every fault kind against dp, dp×pp and dp×tp under every ZeRO stage, with
// the replica check every 2 steps and each fault struck at step 3, between two checks. Each
// flip strikes where it is hardest to see: at an element only the struck rank updates (its
// ZeRO shard), or (flip_weight under ZeRO-1/2) one it holds as a mere replica, which the
// owner's shard overwrites at the next step. Every one is found, named and re-run away, ending
// bit-identical to the run without it; a killed or stalled rank is named by the others.
TEST_CASE("fault matrix: every fault kind under dp, dp×pp and dp×tp with ZeRO 0-3 is found and "
          "named, and a recovered run is bit-identical", "[faults][matrix]") {
    struct Shape {
        const char* name;
        int dp, tp, pp;
    };
    const Shape shapes[] = {{"dp3", 3, 1, 1}, {"dp2·pp2", 2, 1, 2}, {"dp2·tp2", 2, 2, 1}};
    const auto t0 = std::chrono::steady_clock::now();
    for (const Shape& sh : shapes)
        for (int zero = 0; zero <= 3; zero++) {
            Config c = layout(base(), sh.dp, sh.tp, sh.pp, zero);
            if (sh.dp == 3) c = dp3(c);
            const std::string name = std::string(sh.name) + " ZeRO-" + std::to_string(zero);
            for (const char* kind : {"flip_grad", "flip_weight"}) {
                INFO(name << " " << kind);
                const bool replicated = std::string(kind) == "flip_weight" && (zero == 1 || zero == 2);
                const std::string err = recovers(aimed(c, kind, 1, 3, replicated), 2);
                CHECK_THAT(err, Contains("replica check at step 4: ") &&
                                    Contains("the fault on world rank 1 was transient"));
            }
            Config lost = c;
            lost.validate.replica_check_every = 2;
            lost.layout.timeout_s = 1.0;
            lost.fault.rank = 1;
            lost.fault.step = 3;
            for (const char* kind : {"kill", "stall"}) {
                INFO(name << " " << kind);
                lost.fault.kind = kind;
                std::string msg;
                stderr_of([&] { msg = failure_of(lost); });
                // Named directly, or at the root of the waits of the rank that timed out first
                // (a rank that waits for the dead one is never blamed).
                CHECK_THAT(msg, Contains("within 1.00 s") &&
                                    (Contains("world rank 1") || Contains("rank 1 did not arrive")));
            }
        }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("fault matrix: 3 layouts x 4 ZeRO stages x 4 fault kinds in %.1f s\n", secs);
}
