// The workbench's views of a job under every layout the runtime accepts (views/, no window):
// the trace measures a step of every rank and keeps every rank's memory under cp (ring and
// Ulysses), ep, tp with sequence parallelism, dp with ZeRO-3 and pp with four microbatches; the
// layout explorer's picks follow the job bar's fields until the person picks their own; a block
// that several ranks hold whole is one replicated block, not pieces of it; the attention heads
// on the tp ranks (query heads split, KV heads split or whole) are the rows the ranks hold; the
// plan view ranks a plan's rows, and a run's measured bytes per group are its predicted ones.
#include "views/config_editor.h"
#include "views/job_controller.h"
#include "views/layout_explorer.h"
#include "views/plan_view.h"
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

namespace {

// A Llama-shaped job: 4 query heads of 8 channels over 2 KV heads, blocks of 8 channels (one KV
// head), so tp2 splits the KV heads and tp4 holds them whole on every rank.
Config llama_job(int tp, i64 kv_heads) {
    Config c = small_job();
    c.model.arch = "llama";
    c.model.kv_heads = kv_heads;
    c.model.ffn = 64;
    c.model.rope_theta = 10000;
    c.numerics.block = 8;
    c.train.threads = 1;
    c.layout.tp = tp;
    return c;
}

// The heads whose rows of a (heads · head_dim, C) projection the slab holds.
HeadRange rows_as_heads(const Slab& s, int head_dim) {
    return {static_cast<int>(s.row0 / head_dim), static_cast<int>((s.row0 + s.rows) / head_dim)};
}

}  // namespace

TEST_CASE("head_layout: query heads split, KV heads split where tp divides them, else whole") {
    Config c = llama_job(2, 2);
    HeadLayout h = head_layout(c.model, 2);
    CHECK(std::string(h.kind()) == "grouped-query");
    CHECK(h.group == 2);
    CHECK(h.head_dim == 8);
    CHECK(h.split);
    REQUIRE(h.ranks.size() == 2);
    CHECK(h.ranks[0].q == HeadRange{0, 2});
    CHECK(h.ranks[1].q == HeadRange{2, 4});
    CHECK(h.ranks[0].kv == HeadRange{0, 1});
    CHECK(h.ranks[1].kv == HeadRange{1, 2});
    CHECK(h.ranks[1].kv_read == HeadRange{1, 2});
    CHECK(h.rank_text(0) == "tp rank 0: q heads 0-1, kv head 0 (split)");
    CHECK(h.summary().find("tp=2 divides kv_heads=2") != std::string::npos);

    h = head_layout(c.model, 4);  // 4 does not divide 2 KV heads: each rank holds both
    CHECK(!h.split);
    REQUIRE(h.ranks.size() == 4);
    for (int t = 0; t < 4; t++) {
        CHECK(h.ranks[t].q == HeadRange{t, t + 1});
        CHECK(h.ranks[t].kv == HeadRange{0, 2});
        CHECK(h.ranks[t].kv_read == HeadRange{t / 2, t / 2 + 1});
    }
    CHECK(h.rank_text(3) ==
          "tp rank 3: q head 3, kv heads 0-1 (whole on every rank: tp=4 does not divide "
          "kv_heads=2), reads kv head 1");
    CHECK(h.summary().find("does not divide kv_heads=2") != std::string::npos);

    c.model.kv_heads = 1;  // multi-query: one KV head, whole on every rank under tp2
    h = head_layout(c.model, 2);
    CHECK(std::string(h.kind()) == "multi-query");
    CHECK(!h.split);
    CHECK(h.ranks[1].kv == HeadRange{0, 1});
    CHECK(h.rank_text(1).find("kv head 0 (whole on every rank: tp=2 does not divide kv_heads=1)") !=
          std::string::npos);

    const Config gpt2 = with_tp_shapes(small_job());  // multi-head: KV heads are query heads
    h = head_layout(gpt2.model, 2);
    CHECK(std::string(h.kind()) == "multi-head");
    CHECK(h.split);
    CHECK(h.ranks[1].kv == h.ranks[1].q);
    CHECK(head_layout(gpt2.model, 1).rank_text(0) ==
          "tp rank 0: q heads 0-3, kv heads 0-3 (one rank holds every head)");
}

TEST_CASE("head_layout agrees with the rows of q_proj and k_proj the explored ranks hold") {
    for (const int tp : {2, 4}) {
        DYNAMIC_SECTION("tp" << tp) {
            Config c = llama_job(tp, 2);
            c.layout.dp = 2;  // the tp ranks of both replicas hold the same heads
            const ExplorerResult r = explore_layout(c);
            INFO(r.error);
            REQUIRE(r.error.empty());
            const HeadLayout& h = r.heads;
            CHECK(h == head_layout(c.model, tp));
            CHECK(h.split == (tp == 2));
            int checked = 0;
            for (const TensorHolding& t : r.tensors) {
                const bool q = t.name.find("self_attn.q_proj.weight") != std::string::npos;
                const bool k = t.name.find("self_attn.k_proj.weight") != std::string::npos ||
                               t.name.find("self_attn.v_proj.weight") != std::string::npos;
                if (!q && !k) continue;
                INFO(t.name);
                REQUIRE(t.weights.size() == static_cast<size_t>(2 * tp));
                for (const HeldPiece& p : t.weights) {
                    const RankHeads& mine = h.ranks[static_cast<size_t>(r.coords[static_cast<size_t>(p.rank)].tp)];
                    CHECK(rows_as_heads(p.slab, h.head_dim) == (q ? mine.q : mine.kv));
                    CHECK(p.slab.cols == t.cols);
                    checked++;
                }
                // Split: one shard per tp rank; whole: one block every rank holds.
                const std::vector<HeldBlock> b = held_blocks(t, false);
                CHECK(b.size() == static_cast<size_t>(q || h.split ? tp : 1));
            }
            CHECK(checked == 3 * 2 * 2 * tp);  // q, k, v of 2 layers on 2·tp ranks
        }
    }
}

TEST_CASE("the plan view: a job's measured bytes per group are its layout's predicted ones") {
    const plan::ClusterSpec cluster = plan::load_cluster("examples/clusters/cpu-inprocess.toml");
    Config base = with_tp_shapes(small_job());
    base.train.steps = 3;
    base.train.threads = 1;
    base.train.eval_every = 0;  // the last step's collectives are the step's own
    std::vector<Case> cases;
    Config c = base;
    c.layout.dp = 2;
    c.layout.zero = 1;
    cases.push_back({"dp2 zero1", c});
    c = base;
    c.layout.tp = 2;
    cases.push_back({"tp2", c});
    c = base;
    c.layout.pp = 2;
    c.layout.microbatches = 2;
    cases.push_back({"pp2", c});
    for (const Case& k : cases) {
        DYNAMIC_SECTION(k.name) {
            JobController job;
            run_paused(job, k.cfg, 3);
            RunSnapshot s;
            job.update(s);
            const MeasuredRun m = measured_run(s, job.trace());
            CHECK(m.memory.size() == 2);
            CHECK(m.step_s > 0);
            const PlanComparison cmp = compare_with_run(k.cfg, cluster, nullptr, m);
            REQUIRE(cmp.error.empty());
            CHECK(cmp.layout.find(k.name) != std::string::npos);
            int groups = 0;
            for (const PlanComparisonRow& r : cmp.rows) {
                INFO(r.what);
                if (r.what.rfind("memory", 0) == 0) CHECK((r.ratio() > 0.5 && r.ratio() < 2));
                if (r.what.rfind("comm ", 0) == 0 && r.measured >= 0) {
                    CHECK(r.measured == r.predicted);
                    groups += r.what.rfind("comm sent", 0) != 0;
                }
            }
            CHECK(groups >= 1);
        }
    }
}

TEST_CASE("the plan view: ranked rows, their largest terms, the cluster files, errors by name") {
    CHECK(default_cluster(cluster_files({"."})).ends_with("examples/clusters/cpu-inprocess.toml"));
    PlanRequest req;
    req.config = with_tp_shapes(small_job());
    req.gpus = 4;
    req.cluster = "examples/clusters/cpu-inprocess.toml";
    const PlanOutcome o = make_plan(req);
    REQUIRE(o.error.empty());
    REQUIRE(o.plan.fitting > 1);
    for (int i = 0; i + 1 < o.plan.fitting; i++)  // ties (within 1e-6) go to the one computing less
        CHECK(o.plan.candidates[i].time.step <= o.plan.candidates[i + 1].time.step * (1 + 1e-6));
    const plan::TimeTerms& t = o.plan.candidates.front().time;
    const std::vector<TermShare> top = top_terms(t, 3);
    REQUIRE(!top.empty());
    double sum = 0;
    for (size_t i = 0; i < top.size(); i++) {
        sum += top[i].seconds;
        if (i) CHECK(top[i - 1].seconds >= top[i].seconds);
    }
    CHECK(sum <= t.step * (1 + 1e-12));
    req.cluster = "no/such/cluster.toml";
    CHECK(make_plan(req).error.find("no/such/cluster.toml") != std::string::npos);
    Planner planner;  // the same on a thread
    req.cluster = "examples/clusters/cpu-inprocess.toml";
    planner.start(req);
    for (int i = 0; i < 6000 && (planner.busy() || planner.version() == 0); i++)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    CHECK(planner.outcome().plan.candidates.size() == o.plan.candidates.size());
}
