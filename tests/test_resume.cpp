// Checkpoints written under one layout resume under another (resharding): the resumed run ends
// bit-identical to the uninterrupted single-device run, in every weight, every Adam moment and
// every step's loss and grad norm. The checkpoint goes through the file (core/checkpoint.h).
#include "core/checkpoint.h"
#include "core/config.h"
#include "core/error.h"
#include "core/parallel/checkpointing.h"
#include "core/parallel/pipeline.h"
#include "core/parallel/runner.h"
#include "core/state.h"
#include "tests/test_util.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

using namespace px;

namespace {

struct Layout_ {
    int dp = 1, tp = 1, pp = 1, zero = 0, microbatches = 0;
    std::string name() const {
        std::string s = "dp" + std::to_string(dp);
        s += "·tp" + std::to_string(tp);
        s += "·pp" + std::to_string(pp);
        s += "·zero" + std::to_string(zero);
        return s;
    }
};

Config base() {
    Config c = test::small_job();
    c.train.steps = 6;
    c.train.threads = 1;
    c.train.eval_every = 3;
    c.train.val_batches = 1;
    c.model.ffn = 128;
    c.numerics.block = 8;  // tp4 shards of hidden 32 and ffn 128 are whole blocks
    return c;
}

Config with(Config c, const Layout_& l) {
    c.layout.dp = l.dp;
    c.layout.tp = l.tp;
    c.layout.pp = l.pp;
    c.layout.zero = l.zero;
    c.layout.microbatches = l.microbatches;
    return c;
}

// The run's logical state at its end, whatever the layout.
LogicalState run_any(const Config& c) {
    LogicalState s;
    if (c.layout.pp > 1) {
        run_pipeline(c, {}, [&](PipelineJob& stage) { s.absorb(stage); });
    } else if (world_size(c.layout) > 1) {
        run_layout(c, {}, [&](Job& job) { s.absorb(job); });
    } else {
        run_layout(c, {}, [&](Job& job) { s.absorb(job); });
    }
    return s;
}

// Layout `from` trains and checkpoints every 3 steps; layout `to` resumes from step 3.
void check_reshard(const Layout_& from, const Layout_& to) {
    INFO(from.name() << " -> " << to.name());
    const Config c = base();
    const LogicalState ref = test::single_device(c);
    const std::string dir = test::temp_dir("resume");
    Config w = with(c, from);
    w.checkpoint.dir = dir;
    w.checkpoint.every = 3;
    run_any(w);
    const std::string ckpt = checkpoint_path(dir, 3);
    REQUIRE(std::filesystem::exists(ckpt));
    REQUIRE(std::filesystem::exists(checkpoint_path(dir, 6)));

    Config r = with(c, to);
    r.checkpoint.resume = ckpt;
    const LogicalState got = run_any(r);
    REQUIRE(got.history.size() == 6);
    test::check_same_bits(ref, got);
    // The uninterrupted writer's final checkpoint holds the reference state too.
    const LogicalState last = read_checkpoint(checkpoint_path(dir, 6), c.model);
    CHECK(test::same_bits(ref.params, last.params));
    CHECK(test::same_bits(ref.m, last.m));
    CHECK(test::same_bits(ref.v, last.v));
}

}  // namespace

TEST_CASE("a checkpoint resumes under any other layout, bit-identical to the uninterrupted run") {
    check_reshard({2, 2, 1, 0}, {1, 4, 1, 0});        // dp2·tp2 -> tp4
    check_reshard({1, 1, 2, 0}, {2, 1, 1, 3});        // pp2 -> dp2·zero3
    check_reshard({4, 1, 1, 1}, {4, 1, 1, 3, 2});     // zero1 -> zero3 with 2 microbatches
    check_reshard({2, 1, 1, 3}, {1, 1, 1, 0});        // dp2·zero3 -> single device
    check_reshard({1, 1, 1, 0}, {2, 2, 2, 2});        // single device -> dp2·tp2·pp2·zero2
    check_reshard({2, 2, 2, 1}, {1, 2, 2, 0});        // dp2·tp2·pp2·zero1 -> tp2·pp2
}

TEST_CASE("resume auto takes the newest valid checkpoint and reports a corrupt newer one") {
    const Config c = base();
    const LogicalState ref = test::single_device(c);
    const std::string dir = test::temp_dir("resume_auto");
    Config w = c;
    w.checkpoint.dir = dir;
    w.checkpoint.every = 2;
    w.checkpoint.keep = 5;
    run_any(w);
    REQUIRE(std::filesystem::exists(checkpoint_path(dir, 4)));
    // The run was killed after step 4's checkpoint; step 6's exists but is cut short.
    std::filesystem::resize_file(checkpoint_path(dir, 6),
                                 std::filesystem::file_size(checkpoint_path(dir, 6)) / 2);
    std::string note;
    CheckpointConfig ck = w.checkpoint;
    ck.resume = "auto";
    CHECK(resume_source(ck, &note) == checkpoint_path(dir, 4));
    CHECK(note.find(checkpoint_path(dir, 6)) != std::string::npos);

    Config r = with(c, {2, 1, 1, 2});
    r.checkpoint.dir = dir;
    r.checkpoint.resume = "auto";
    const LogicalState got = run_any(r);
    test::check_same_bits(ref, got);
}

TEST_CASE("resuming with another data stream or model is refused, naming the file") {
    const Config c = base();
    const std::string dir = test::temp_dir("resume_bad");
    Config w = c;
    w.checkpoint.dir = dir;
    w.checkpoint.every = 3;
    run_any(w);
    Config other = c;
    other.train.seed = 7;
    other.checkpoint.resume = checkpoint_path(dir, 3);
    CHECK_THROWS_WITH(run_any(other), Catch::Contains(checkpoint_path(dir, 3)) &&
                                          Catch::Contains("data stream"));
    Config bigger = c;
    bigger.model.hidden = 64;
    bigger.checkpoint.resume = checkpoint_path(dir, 3);
    CHECK_THROWS_AS(run_any(bigger), CheckpointError);
}
