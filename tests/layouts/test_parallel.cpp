// Parallel layouts on in-process ranks against the single-device run: 5 steps, then loss, grad
// norm, every weight and every Adam moment compared bit for bit.
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "core/parallel/data/zero.h"
#include "core/io/state.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <sched.h>

#include <cmath>
#include <cstring>
#include <vector>

using namespace px;

namespace {

using test::check_same_bits;
using test::series;
using test::single_device;

Config small_job() {
    Config c = test::small_job();
    c.train.eval_every = 5;  // validation loss compared too
    c.train.val_batches = 2;
    c.train.threads = 1;
    return c;
}

using State = LogicalState;

// Every replica's weights must equal the others'; moments are assembled from the ranks' shards.
State parallel(const Config& c, bool& replicas_agree) {
    State s;
    replicas_agree = true;
    run_layout(c, {}, test::inspecting([&](Job& job) { replicas_agree = absorb(s, job) && replicas_agree; }));
    return s;
}

using test::same_bits;

void check_layout(Config c, int dp, int zero, int microbatches) {
    const State ref = single_device(c);
    c.layout.dp = dp;
    c.layout.zero = zero;
    c.layout.microbatches = microbatches;
    bool agree = false;
    const State got = parallel(c, agree);
    INFO("dp" << dp << " zero" << zero << " microbatches " << microbatches);
    CHECK(agree);
    check_same_bits(ref, got);
}

}  // namespace

TEST_CASE("dp2 and dp4 are bit-identical to the single device") {
    check_layout(small_job(), 2, 0, 1);
    check_layout(small_job(), 4, 0, 1);
}

TEST_CASE("dp with microbatches is bit-identical to the single device") {
    check_layout(small_job(), 2, 0, 2);
    check_layout(small_job(), 2, 0, 4);
    check_layout(small_job(), 4, 0, 2);
}

TEST_CASE("every ZeRO stage under dp2 and dp4 is bit-identical to the single device") {
    for (int zero : {1, 2, 3}) {
        check_layout(small_job(), 2, zero, 1);
        check_layout(small_job(), 4, zero, 2);
    }
}

TEST_CASE("ZeRO shards cut tensors on canonical blocks, so small blocks and odd sizes work") {
    Config c = small_job();
    c.numerics.block = 8;   // many blocks per tensor, shard edges inside tensors
    c.model.ffn = 72;       // tensor sizes that are not multiples of 64
    for (int zero : {2, 3}) check_layout(c, 4, zero, 1);
}

TEST_CASE("dp8 on eight in-process ranks is bit-identical to the single device") {
    check_layout(small_job(), 8, 1, 1);
}

TEST_CASE("the gradient all-reduce must be canonical: a ring sum breaks bitwise equality") {
    // In fast mode the replicas combine with the ring algorithm; the run still trains, but its
    // bits differ from the single device's (this is what the canonical collectives buy).
    Config c = small_job();
    c.numerics.mode = Mode::fast;
    const State ref = single_device(c);
    c.layout.dp = 4;
    bool agree = false;
    const State got = parallel(c, agree);
    CHECK(agree);  // every replica still holds the same weights
    CHECK_FALSE(same_bits(ref.params, got.params));
}

TEST_CASE("layouts that are not available yet, or impossible, are refused with a sentence") {
    Config c = small_job();
    c.layout.tp = 2;
    c.numerics.block = 64;  // 16 channels per rank: a block would be cut between ranks
    CHECK_THROWS_WITH(run_layout(c, {}), Catch::Contains("not whole blocks"));
    c.layout.tp = 1;
    c.layout.dp = 3;  // batch 8 is not divisible by 3 replicas
    CHECK_THROWS_WITH(run_layout(c, {}), Catch::Contains("layout.dp"));
}

TEST_CASE("dp over 3, 5, 6 or 7 replicas with ordinary batches is bit-identical to the single device") {
    // A replica's or a microbatch's token range that is not one node of the batch's tree is
    // computed as its maximal nodes, which combine with the other replicas' in the tree.
    Config c = small_job();
    c.train.batch_size = 6;  // 3 replicas of 2 sequences: replica 1 owns blocks [2,4) of 6,
    check_layout(c, 3, 0, 2);  // not a node ([0,6) splits into [0,3) and [3,6)), in 2 microbatches
    check_layout(c, 3, 1, 1);
    check_layout(c, 2, 0, 3);  // each replica a node, its three microbatches not
    check_layout(c, 6, 2, 1);  // ZeRO-2/3 whose pieces are not nodes run dp-major (mesh.h)
    c.numerics.block = 32;     // two blocks per sequence: a node [0,3) ends inside sequence 1
    check_layout(c, 3, 3, 1);
    check_layout(c, 3, 2, 2);
    c.train.batch_size = 10;
    check_layout(c, 5, 0, 1);
    c.train.batch_size = 14;
    c.numerics.block = 16;
    check_layout(c, 7, 1, 2);
}

TEST_CASE("ZeRO-2/3 with several microbatches per replica are bit-identical to the single device") {
    // Under ZeRO-2/3 each microbatch of the batch is cut over the replicas and reduce-scattered
    // as soon as it is done (zero.h); the microbatch nodes then combine in the batch's tree.
    for (int zero : {2, 3}) {
        check_layout(small_job(), 2, zero, 4);
        check_layout(small_job(), 4, zero, 2);
    }
}

namespace {
// Rank 0's memory after each step of a dp4 run, with 8 blocks of 128 channels, so that every
// unit spans many pages.
struct MemoryProbe : Observer {
    std::vector<MemoryStats> seen;
    void on_step(const RunView& run, const StepMetrics&) override { seen.push_back(run.memory()); }
};

// Rank 0's share of a dp4 run: its shard of the table, and of the gradient buffer (its shard plus
// the LM-head entries that shadow its part of wte).
MemoryStats dp4_memory(int zero, int microbatches, i64& table_bytes, i64& grad_bytes,
                       i64& shard_bytes, i64& grad_shard_bytes) {
    Config c = small_job();
    c.train.batch_size = 16;
    c.model.vocab = 256;
    c.model.hidden = 128;
    c.model.ffn = 512;
    c.model.layers = 8;
    c.train.steps = 2;
    c.train.eval_every = 0;
    c.layout.dp = 4;
    c.layout.zero = zero;
    c.layout.microbatches = microbatches;
    MemoryProbe probe;
    run_layout(c, {&probe}, {});
    const GPT whole(c.model, make_numerics(c.numerics));
    table_bytes = whole.table().total * 4;
    grad_bytes = whole.grad_layout().total * 4;
    const ZeroShards shards(whole, 4, 0);
    const TableEntry& wte = whole.table().entries[static_cast<size_t>(whole.table().wte)];
    shard_bytes = (shards.hi() - shards.lo()) * 4;
    grad_shard_bytes = shard_bytes + 4 * std::max<i64>(0, std::min(shards.hi(), wte.offset + wte.numel()) -
                                                              std::max(shards.lo(), wte.offset));
    REQUIRE(probe.seen.size() == 2);
    return probe.seen.back();
}
}  // namespace

TEST_CASE("ZeRO-2 and ZeRO-3 hold only their shards between steps, and one unit more during one") {
    const i64 slop = 16 * 4096;  // partial pages at the ends of released ranges
    i64 P = 0, G = 0, S = 0, GS = 0;
    const MemoryStats z1 = dp4_memory(1, 1, P, G, S, GS);
    CHECK(z1.params == P);
    CHECK(z1.grads == G);
    CHECK(z1.optimizer == 2 * S);

    const MemoryStats z2 = dp4_memory(2, 1, P, G, S, GS);
    INFO("ZeRO-2: grads " << z2.grads << " peak " << z2.peak_grads << " of " << G << ", shard "
                          << GS);
    CHECK(z2.params == P);
    CHECK(z2.grads <= GS + slop);             // the shard
    CHECK(z2.peak_grads > z2.grads);          // a unit's full gradient while it is reduced
    CHECK(z2.peak_grads < G / 2);             // never the whole gradient

    // Four microbatches: the partials take two shards during the step (the tree over four
    // nodes waits for one sibling at a time), none between steps.
    const MemoryStats z2m = dp4_memory(2, 4, P, G, S, GS);
    INFO("ZeRO-2, 4 microbatches: grads " << z2m.grads << " peak " << z2m.peak_grads);
    CHECK(z2m.grads <= GS + slop);
    CHECK(z2m.peak_grads >= 2 * GS);
    CHECK(z2m.peak_grads < G);

    const MemoryStats z3 = dp4_memory(3, 1, P, G, S, GS);
    INFO("ZeRO-3: params " << z3.params << " peak " << z3.peak_params << " of " << P
                           << ", shard " << S);
    CHECK(z3.params <= S + slop);             // the shard
    CHECK(z3.peak_params > z3.params);        // a unit's gathered weights while it runs
    CHECK(z3.peak_params < P / 2);            // never the whole model
    CHECK(z3.grads <= GS + slop);
}

TEST_CASE("the default thread count follows the CPUs this process may run on") {
    cpu_set_t all;
    REQUIRE(sched_getaffinity(0, sizeof all, &all) == 0);
    const int n = usable_cores();
    CHECK(n >= 1);
    CHECK(n <= CPU_COUNT(&all));
    // Pinned to one CPU (as taskset or srun's binding would), a rank gets one thread, not the
    // machine's count.
    int first = 0;
    while (!CPU_ISSET(first, &all)) first++;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    REQUIRE(sched_setaffinity(0, sizeof one, &one) == 0);
    Config c = test::small_job();
    c.train.threads = 0;
    const int pinned = usable_cores(), per_rank = threads_per_rank(c, 1);
    c.train.threads = 3;
    const int chosen = threads_per_rank(c, 1);
    REQUIRE(sched_setaffinity(0, sizeof all, &all) == 0);
    CHECK(pinned == 1);
    CHECK(per_rank == 1);
    CHECK(chosen == 3);  // train.threads, when set, is taken as it is
    CHECK(usable_cores() == n);
}
