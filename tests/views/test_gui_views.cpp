// The workbench's views of a job under every layout the runtime accepts (views/, no window):
// the trace measures a step of every rank and keeps every rank's memory under cp (ring and
// Ulysses), ep, tp with sequence parallelism, dp with ZeRO-3 and pp with four microbatches; the
// layout explorer's picks follow the job bar's fields until the person picks their own; a block
// that several ranks hold whole is one replicated block, not pieces of it.
#include "views/config_editor.h"
#include "views/job_controller.h"
#include "views/layout_explorer.h"
#include "tests/support/test_util.h"

#include <chrono>
#include <set>
#include <string>
#include <thread>

using namespace px;
using namespace px::views;
using namespace px::test;

namespace {

// Runs c in a JobController to `steps` and waits until it pauses there.
void run_paused(JobController& job, const Config& c, i64 steps) {
    job.start(c, false);
    job.run_to(steps);
    RunSnapshot s;
    const auto t0 = std::chrono::steady_clock::now();
    while (s.steps_done < steps && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
        job.poll();
        job.update(s);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE(s.steps_done == steps);
    // The last rank's step hook runs after the view's step: wait for every rank's record.
    for (int i = 0; i < 2000; i++) {
        bool all = true;
        for (const RankStep& r : job.trace()->last_steps()) all = all && r.step == steps;
        if (all) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

struct Case {
    const char* name;
    Config cfg;
};

std::vector<Case> layouts() {
    Config base = with_tp_shapes(small_job());
    base.train.steps = 3;
    base.train.threads = 1;
    base.model.seq_len = 64;  // cp2: four zig-zag chunks of one block each
    std::vector<Case> v;
    Config c = base;
    c.layout.cp = 2;
    v.push_back({"cp2", c});
    c.layout.cp_method = "ulysses";
    v.push_back({"cp2xulysses", c});
    c = small_moe_job(32);
    c.train.steps = 3;
    c.train.eval_every = 0;
    c.layout.dp = 2;
    c.layout.ep = 2;
    v.push_back({"ep2", c});
    c = base;
    c.layout.tp = 2;
    c.layout.sequence_parallel = true;
    v.push_back({"tp2xsp", c});
    c = base;
    c.layout.dp = 2;
    c.layout.zero = 3;
    v.push_back({"dp2xz3", c});
    c = base;
    c.layout.pp = 2;
    c.layout.microbatches = 4;
    v.push_back({"pp2xmb4", c});
    return v;
}

}  // namespace

TEST_CASE("the trace measures every rank of every layout: timeline, memory, collectives") {
    for (const Case& k : layouts()) {
        INFO(k.name);
        JobController job;
        run_paused(job, k.cfg, 2);
        const CommTrace& t = *job.trace();
        const int n = t.mesh().world_size();
        REQUIRE(n == 2);
        // Both ranks measured their own step (under cp, rank 1 is not rank 0 again).
        const std::vector<RankStep> steps = t.last_steps();
        for (const RankStep& r : steps) {
            CHECK(r.step == 2);
            CHECK(!r.compute.empty());
            CHECK(r.seconds > 0);
        }
        const Timeline tl = measured_timeline(t.mesh(), steps);
        INFO(tl.problem);
        REQUIRE(tl.problem.empty());
        CHECK(tl.lanes.size() == 2);
        std::set<int> lanes;
        for (const TimelineBar& b : tl.bars)
            if (b.kind == TimelineBar::forward || b.kind == TimelineBar::backward)
                lanes.insert(b.lane);
        CHECK(lanes == std::set<int>{0, 1});
        // Every rank's memory, each holding parameters.
        const std::vector<MemoryStats> mem = t.memory();
        REQUIRE(mem.size() == 2);
        for (const MemoryStats& m : mem) CHECK(m.params > 0);
        // Both ranks' books in the collective table.
        std::set<int> talked;
        for (const comm::StatRow& r : t.stat_rows())
            if (r.calls > 0) talked.insert(r.world_rank);
        CHECK(talked == std::set<int>{0, 1});
        const std::string name = k.name;
        if (name.starts_with("cp2")) {
            CHECK(tl.lanes[1].find("cp1") != std::string::npos);
            bool cp = false;
            for (const TimelineBar& b : tl.bars) cp = cp || b.label.starts_with("cp ");
            CHECK(cp);
        }
        if (name == "ep2") {  // the ep group's all-to-alls are traced and named
            bool ep = false;
            for (const RankStep& r : steps)
                for (const CommEvent& e : r.events) ep = ep || std::string(e.group) == "ep";
            CHECK(ep);
        }
        if (name == "dp2xz3") CHECK(mem[0].params < mem[0].peak_params);  // sharded between steps
        job.stop();
    }
}

TEST_CASE("held_blocks: a block several ranks hold whole is one replicated block") {
    TensorHolding t;
    t.rows = 4;
    t.cols = 8;
    // tp2 × dp2: each column half held whole by two dp replicas.
    t.weights = {{0, Slab{0, 4, 0, 4}}, {2, Slab{0, 4, 0, 4}}, {1, Slab{0, 4, 4, 4}},
                 {3, Slab{0, 4, 4, 4}}};
    t.moments = {{0, Slab{0, 2, 0, 4}}, {2, Slab{2, 2, 0, 4}}};  // ZeRO: each a piece
    const std::vector<HeldBlock> w = held_blocks(t, false);
    REQUIRE(w.size() == 2);
    CHECK(w[0].ranks == std::vector<int>{0, 2});
    CHECK(w[1].ranks == std::vector<int>{1, 3});
    CHECK(w[0].replicated());
    CHECK(w[0].slab.cols == 4);  // the whole half, not a quarter per holder
    const std::vector<HeldBlock> m = held_blocks(t, true);
    REQUIRE(m.size() == 2);
    CHECK(!m[0].replicated());
    CHECK(!m[1].replicated());
}

TEST_CASE("held_blocks of an explored dp2 job: every weight replicated on both ranks") {
    Config c = with_tp_shapes(small_job());
    c.layout.dp = 2;
    const ExplorerResult r = explore_layout(c);
    INFO(r.error);
    REQUIRE(r.error.empty());
    int matrices = 0;
    for (const TensorHolding& t : r.tensors) {
        const std::vector<HeldBlock> b = held_blocks(t, false);
        REQUIRE(b.size() == 1);
        CHECK(b[0].ranks == std::vector<int>{0, 1});
        CHECK(b[0].slab.rows == t.rows);
        CHECK(b[0].slab.cols == t.cols);
        matrices += t.rows > 1;
    }
    CHECK(matrices > 0);
}

TEST_CASE("explorer picks follow the job bar's fields until the person picks their own") {
    Config base = with_tp_shapes(small_job());
    ConfigEditor bar(base);
    ExplorerPicks p;
    follow_job_bar(p, bar);
    CHECK(p.block == 16);
    CHECK(p.tp == 1);
    REQUIRE(bar.set("layout.tp", "2"));
    REQUIRE(bar.set("layout.cp_method", "ulysses"));
    CHECK(follow_job_bar(p, bar));  // typed, no Start
    CHECK(p.tp == 2);
    CHECK(p.ulysses);
    CHECK(!follow_job_bar(p, bar));  // nothing new
    REQUIRE(bar.set("layout.tp", ""));  // half-typed: the last value stays
    CHECK(!follow_job_bar(p, bar));
    CHECK(p.tp == 2);
    REQUIRE(bar.set("numerics.block", "32"));
    CHECK(follow_job_bar(p, bar));
    CHECK(p.block == 32);
    // Picked here: the bar no longer moves them.
    p.follow = false;
    p.dp = 2;
    REQUIRE(bar.set("layout.tp", "4"));
    CHECK(!follow_job_bar(p, bar));
    CHECK(p.tp == 2);
    CHECK(p.dp == 2);
    // The config explored: the job's model with the picks; a dense model keeps ep at 1.
    p.ep = 2;
    const Config c = explored_config(p, base);
    CHECK(c.layout.dp == 2);
    CHECK(c.layout.tp == 2);
    CHECK(c.layout.cp_method == "ulysses");
    CHECK(c.layout.ep == 1);
    CHECK(c.numerics.block == 32);
    CHECK(c.model.hidden == base.model.hidden);
}
