// Parallel layouts on in-process ranks against the single-device run: 5 steps, then loss, grad
// norm, every weight and every Adam moment compared bit for bit.
#include "core/config.h"
#include "core/error.h"
#include "core/job.h"
#include "core/parallel/runner.h"
#include "core/state.h"
#include "tests/test_util.h"

#include <catch2/catch.hpp>

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
    run_layout(c, {}, [&](Job& job) { replicas_agree = s.absorb(job) && replicas_agree; });
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
    // 3 replicas of 2 sequences: every microbatch is one block, but replica 1 owns blocks
    // [2,4) of 6, which is not a node of the tree ([0,6) splits into [0,3) and [3,6)).
    c.train.batch_size = 6;
    c.layout.microbatches = 2;
    CHECK_THROWS_WITH(run_layout(c, {}), Catch::Contains("[2,4)"));
}
