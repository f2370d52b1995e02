// A run that pauses between steps (core/train/stepped_run.h), driven as the Python module drives
// it: advanced in chunks, held in the middle of an advance, read while paused, given collective
// work on every rank, finished, failed and destroyed anywhere. Whatever the chunks and holds, the
// run ends with the bits of an uninterrupted run_layout of the same config.
#include "core/base/error.h"
#include "core/comm/comm.h"
#include "core/io/state.h"
#include "core/train/stepped_run.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

using namespace px;
using Catch::Matchers::Contains;

namespace {

Config job_of(int dp, int tp, int pp) {
    Config c = test::with_tp_shapes(test::small_job());
    c.train.steps = 8;
    c.train.threads = 1;
    c.layout.dp = dp;
    c.layout.tp = tp;
    c.layout.pp = pp;
    if (pp > 1) c.layout.microbatches = 2;
    return c;
}

// The logical state of every rank's job, merged (each job's part: absorb).
LogicalState state_of(SteppedRun& run) {
    LogicalState s;
    for (int r = 0; r < run.world_size(); r++) REQUIRE(absorb(s, run.job(r)));
    return s;
}

LogicalState reference(const Config& c) {
    LogicalState s;
    run_layout(c, {}, test::inspecting([&](Job& job) { REQUIRE(absorb(s, job)); }));
    return s;
}

void wait_settled(SteppedRun& run) {
    while (!run.wait(10.0)) {
    }
}

bool same(const LogicalState& a, const LogicalState& b) {
    return a.params == b.params && a.m == b.m && a.v == b.v && a.history.size() == b.history.size();
}

}  // namespace

TEST_CASE("advanced in chunks, a stepped run pauses at each budget and ends with run_layout's bits") {
    for (const Config& c : {job_of(1, 1, 1), job_of(2, 2, 1), job_of(2, 1, 2)}) {
        SteppedRun run(c);
        wait_settled(run);
        CHECK(run.status() == SteppedRun::Status::paused);
        CHECK(run.steps_done() == 0);
        for (const i64 to : {1, 3, 3, 7, 100}) {  // a budget below the steps done, one past the end
            run.advance_to(to);
            wait_settled(run);
            CHECK(run.steps_done() == std::min<i64>(to, 8));
            for (int r = 0; r < run.world_size(); r++)
                CHECK(run.job(r).steps_done() == run.steps_done());
        }
        // Finished or not, the unsharded state is what one run_layout gives.
        LogicalState before = state_of(run);
        run.finish();
        wait_settled(run);
        CHECK(run.status() == SteppedRun::Status::finished);
        CHECK(same(state_of(run), before));
        CHECK(same(before, reference(c)));
    }
}

TEST_CASE("held in the middle of an advance, the ranks stop at one step boundary and go on bit for bit") {
    const Config c = job_of(2, 1, 1);
    SteppedRun run(c);
    wait_settled(run);
    run.advance_to(8);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    run.hold();
    wait_settled(run);
    const i64 held = run.steps_done();
    CHECK(held < 8);
    CHECK(run.status() == SteppedRun::Status::paused);
    for (int r = 0; r < run.world_size(); r++) CHECK(run.job(r).steps_done() == held);
    run.advance_to(8);
    wait_settled(run);
    CHECK(run.steps_done() == 8);
    CHECK(same(state_of(run), reference(c)));
}

TEST_CASE("work on every rank while paused may use collectives, and its errors come back") {
    SteppedRun run(job_of(2, 2, 1));
    wait_settled(run);
    run.advance_to(2);
    wait_settled(run);
    std::vector<std::vector<float>> params(4);
    run.on_each_rank([&](Job& job, comm::Communicator& world) {
        gather_full(job, &params[static_cast<size_t>(world.rank())], nullptr, nullptr);
    });
    for (int r = 1; r < 4; r++) CHECK(params[static_cast<size_t>(r)] == params[0]);
    CHECK_THROWS_WITH(run.on_each_rank([](Job&, comm::Communicator& world) {
        if (world.rank() == 2) throw ConfigError("rank 2 refuses");
    }),
                      Contains("rank 2 refuses"));
    run.advance_to(3);  // still usable
    wait_settled(run);
    CHECK(run.steps_done() == 3);
}

TEST_CASE("a rank that dies fails the run with the others' CommError; its jobs stay readable") {
    Config c = job_of(2, 1, 1);
    c.layout.timeout_s = 1.0;
    c.fault.kind = "kill";
    c.fault.rank = 1;
    c.fault.step = 3;
    SteppedRun run(c);
    wait_settled(run);
    run.advance_to(1);
    wait_settled(run);
    const float* w = run.job(0).model().params();
    run.advance_to(8);
    wait_settled(run);
    CHECK(run.status() == SteppedRun::Status::failed);
    CHECK_THAT(run.error(), Contains("rank 1"));
    CHECK_THROWS_AS(run.rethrow(), comm::CommError);
    CHECK_THROWS_AS(run.job(0), InternalError);
    CHECK(std::isfinite(w[0]));  // the memory is still the job's
}

TEST_CASE("a stepped run is destroyed anywhere without hanging, and bad layouts never start") {
    { SteppedRun run(job_of(2, 1, 2)); }  // while starting
    {
        SteppedRun run(job_of(2, 1, 2));
        run.advance_to(8);  // while running
    }
    Config bad = job_of(1, 3, 1);
    CHECK_THROWS_AS(SteppedRun(bad), ConfigError);
}
