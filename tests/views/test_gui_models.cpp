// The workbench's models, without a window (views/: the data model apart from the drawing):
// the layout-check panel's lockstep grid (a fast-mode check within budget; a planted mutation,
// tests/support/mutations.h, turns its cell red at the right step and the first op is named), the layout
// explorer on the runtime's own ranks (with cp, and
// with ep: a rank's experts and its rows of a stacked expert tensor), the job controller, the
// measured pipeline timeline, the teaching models, and the views of the FP8, spike and MoE router
// panels.
#include "views/config_editor.h"
#include "views/fp8_view.h"
#include "views/job_controller.h"
#include "views/layout_check.h"
#include "views/layout_explorer.h"
#include "views/router_view.h"
#include "views/run_files.h"
#include "views/spike_model.h"
#include "views/teaching.h"
#include "views/trace_view.h"
#include "core/io/runfile.h"
#include "core/train/run_file_observer.h"
#include "tests/support/test_util.h"
#include "tests/support/mutations.h"
#include "core/train/fp8_monitor.h"
#include "validators/trace.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

using namespace px;
using namespace px::views;
using namespace px::test;

namespace {

Config check_job() {
    Config c = with_tp_shapes(small_job());
    c.train.steps = 4;
    return c;
}

int row_of(const LayoutGrid& g, const std::string& name) {
    const auto it = std::find(g.tensors.begin(), g.tensors.end(), name);
    return it == g.tensors.end() ? -1 : static_cast<int>(it - g.tensors.begin());
}

bool is_red(std::uint32_t rgba) {  // 0xAABBGGRR: red full, green and blue low
    return (rgba & 0xFF) == 0xFF && ((rgba >> 8) & 0xFF) <= 120 && ((rgba >> 16) & 0xFF) <= 60;
}

}  // namespace

TEST_CASE("Layout check: a fast-mode check reports within budget", "[gui]") {
    Config c = check_job();
    c.numerics.mode = Mode::fast;
    LayoutCheck check;
    check.start(c, "dp2", 4);
    REQUIRE(check.wait(300));
    const CheckView v = check.view();
    INFO(v.error);
    REQUIRE(v.layouts.size() == 1);
    const LayoutGrid& g = v.layouts[0];
    CHECK(v.mode == "fast");
    CHECK(g.finished);
    CHECK(g.result.verdict == "within budget");
    CHECK(g.summary.find("within budget") != std::string::npos);
    CHECK(g.steps_done == 4);
    CHECK(v.reference_steps == 4);
    // Cells are coloured against the error budget: fast kernels differ from the reference in
    // many ulps (red on the ULP scale) while each tensor stays within its budget (not red).
    int differing = 0, red_by_ulp = 0;
    for (const std::vector<CheckCell>& line : g.cells)
        for (const CheckCell& k : line) {
            REQUIRE(k.done);
            if (k.rank < 0) continue;
            differing++;
            red_by_ulp += is_red(ulp_colour(k));
            INFO(k.ratio);
            CHECK(k.ratio >= 0);
            CHECK(k.ratio <= 1);
            CHECK(!is_red(cell_colour(k, v.mode)));
        }
    CHECK(differing > 0);
    CHECK(red_by_ulp > 0);
    CheckCell over;
    over.done = true;
    over.rank = 0;
    over.max_ulp = 3;
    over.ratio = 4;  // four times its budget
    CHECK(is_red(cell_colour(over, "fast")));
    over.ratio = 0.9;
    CHECK(!is_red(cell_colour(over, "fast")));
    CHECK(is_red(cell_colour(over, "bitwise")) == is_red(ulp_colour(over)));
}

TEST_CASE("Layout check: the reference and every layout step together, step s of all first",
          "[gui]") {
    const Config c = check_job();
    std::mutex mu;
    std::vector<std::pair<std::string, i64>> order;  // (run, step) as the watch is told
    ValidateWatch watch;
    watch.reference_step = [&](i64 step) {
        std::lock_guard lk(mu);
        order.emplace_back("reference", step);
    };
    watch.layout_step = [&](const std::string& layout, i64 step, int rank,
                            const std::vector<Comparison>&, const std::vector<double>& ratios) {
        std::lock_guard lk(mu);
        CHECK(ratios.empty());  // bitwise mode: no budget
        order.emplace_back(layout + " rank " + std::to_string(rank), step);
    };
    const ValidationReport rep =
        validate_layouts(c, parse_layouts("dp2,tp2,pp2"), 3, nullptr, {}, watch);
    REQUIRE(rep.layouts.size() == 3);
    for (const LayoutResult& r : rep.layouts) CHECK(r.verdict == "match");
    // 1 reference + 3 layouts of 2 ranks, 3 steps; the steps never go back.
    REQUIRE(order.size() == 3 * 7);
    for (size_t i = 1; i < order.size(); i++) {
        INFO(order[i - 1].first << " step " << order[i - 1].second << ", then " << order[i].first
                                << " step " << order[i].second);
        CHECK(order[i - 1].second <= order[i].second);
    }
    // In turns: the reference's step, then each layout's, in the order given.
    CHECK(order[0] == std::make_pair(std::string("reference"), i64{1}));
    CHECK(order[1].first.rfind("dp2 ", 0) == 0);
    CHECK(order[3].first.rfind("tp2 ", 0) == 0);
    CHECK(order[5].first.rfind("pp2 ", 0) == 0);
    CHECK(order[7] == std::make_pair(std::string("reference"), i64{2}));
    // The report's grid holds every step of every tensor.
    for (const LayoutResult& r : rep.layouts) {
        REQUIRE(!r.grid_tensors.empty());
        CHECK(r.grid_tensors.front().rfind("grad/", 0) == 0);  // the gradients, then the state
        CHECK(r.grid_tensors.back() == "steps/grad_norm");
        for (const std::vector<std::int64_t>& row : r.grid_ulp) {
            REQUIRE(row.size() == 3);
            for (const std::int64_t u : row) CHECK(u == 0);
        }
        CHECK(r.grid_ratio.empty());
    }
}

TEST_CASE("Layout check: a planted mutation turns its cell red at its step and names the first op",
          "[gui]") {
    const Config c = check_job();
    mutation::Mutation m;
    m.kind = mutation::Kind::swap_partials;
    m.step = 2;
    m.rank = 1;
    m.other = 2;
    m.tensor = "h.0.mlp.c_fc.weight";
    LayoutCheck check;
    check.start(c, "dp4", 3, mutation::plant(m));
    REQUIRE(check.wait(300));
    const CheckView v = check.view();
    REQUIRE(v.layouts.size() == 1);
    const LayoutGrid& g = v.layouts[0];
    INFO(g.summary);
    CHECK(g.result.verdict == "diverged");
    CHECK(g.result.first_step == 2);
    CHECK(g.result.first_op.name == "2/grad/0/param/mlp.c_fc.weight");
    CHECK(g.summary.find("first op: 2/grad/0/param/mlp.c_fc.weight") != std::string::npos);
    // The grid: every cell of step 1 bit-identical; the swapped reduction's cell red at step 2.
    const int row = row_of(g, "grad/0/param/mlp.c_fc.weight");
    REQUIRE(row >= 0);
    for (const std::vector<CheckCell>& line : g.cells) {
        REQUIRE(line.size() == 3);
        CHECK(line[0].done);
        CHECK(line[0].rank < 0);
        CHECK(!is_red(ulp_colour(line[0])));
    }
    const CheckCell& cell = g.cells[static_cast<size_t>(row)][1];
    CHECK(cell.done);
    CHECK(cell.rank >= 0);
    CHECK(cell.differing > 0);
    CHECK(cell.reference != cell.candidate);
    CHECK(is_red(ulp_colour(cell)));
}

TEST_CASE("Layout check: bad layouts are refused before anything runs", "[gui]") {
    LayoutCheck check;
    CHECK_THROWS_AS(check.start(check_job(), "dp2,qq3", 2), ConfigError);
    CHECK_THROWS_AS(check.start(check_job(), "dp3", 2),
                    ConfigError);  // 3 does not divide the batch
    CHECK(!check.busy());
}

TEST_CASE("Layout check: a new check replaces a running one without waiting for it", "[gui]") {
    LayoutCheck check;
    check.start(check_job(), "dp2", 4);
    check.start(check_job(), "dp4", 2);  // the first is told to stop; this returns at once
    REQUIRE(check.wait(300));
    const CheckView v = check.view();
    REQUIRE(v.layouts.size() == 1);
    CHECK(v.layouts[0].name == "dp4");
    CHECK(v.layouts[0].result.verdict == "match");
    CHECK(v.steps == 2);
}

TEST_CASE("Layout explorer: tp2 holds each attention matrix in two row blocks and all-reduces",
          "[gui]") {
    Config c = with_tp_shapes(small_job());
    c.layout.tp = 2;
    const ExplorerResult r = explore_layout(c);
    INFO(r.error);
    REQUIRE(r.error.empty());
    CHECK(r.layout.world_size() == 2);
    CHECK(r.coords.size() == 2);
    CHECK(r.memory.size() == 2);
    const auto t = std::find_if(r.tensors.begin(), r.tensors.end(), [](const TensorHolding& h) {
        return h.name == "h.0.attn.c_attn.weight";
    });
    REQUIRE(t != r.tensors.end());
    std::vector<int> holders;
    i64 rows = 0;
    for (const HeldPiece& p : t->weights) {
        holders.push_back(p.rank);
        rows += p.slab.rows;
        CHECK(p.slab.cols == t->cols);
    }
    std::sort(holders.begin(), holders.end());
    holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
    CHECK(holders == std::vector<int>{0, 1});
    CHECK(rows == t->rows);  // each row held once: a column-parallel split
    const bool tp_all_reduce =
        std::any_of(r.collectives.begin(), r.collectives.end(), [](const CollectiveUse& u) {
            return u.group == "tp" && u.collective == "all_reduce" && u.bytes > 0;
        });
    CHECK(tp_all_reduce);

    c.layout.tp = 3;  // does not divide the heads
    const ExplorerResult bad = explore_layout(c);
    CHECK(bad.error.find("layout.tp") != std::string::npos);
}

TEST_CASE("Layout explorer: cp2 ranks are told apart; each holds every weight", "[gui]") {
    Config c = small_job();
    c.numerics.block = 16;
    c.layout.cp = 2;
    const ExplorerResult r = explore_layout(c);
    INFO(r.error);
    REQUIRE(r.error.empty());
    CHECK(r.layout.world_size() == 2);
    REQUIRE(r.coords.size() == 2);
    CHECK(r.coords[0].cp == 0);
    CHECK(r.coords[1].cp == 1);
    const auto t = std::find_if(r.tensors.begin(), r.tensors.end(), [](const TensorHolding& h) {
        return h.name == "h.0.attn.c_attn.weight";
    });
    REQUIRE(t != r.tensors.end());
    std::vector<int> holders;
    for (const HeldPiece& p : t->weights) {
        holders.push_back(p.rank);
        CHECK(p.slab.rows == t->rows);
    }
    std::sort(holders.begin(), holders.end());
    CHECK(holders == std::vector<int>{0, 1});  // a replica each, not one rank twice
    const bool cp_traffic =
        std::any_of(r.collectives.begin(), r.collectives.end(),
                    [](const CollectiveUse& u) { return u.group == "cp" && u.bytes > 0; });
    CHECK(cp_traffic);
}

TEST_CASE("Layout explorer: ep2 shares out the experts, each rank its experts' rows", "[gui]") {
    Config c = small_job();
    c.model.moe_experts = 4;
    c.model.moe_top_k = 2;
    c.model.moe_ffn = 32;
    c.numerics.block = 16;
    c.layout.dp = 2;
    c.layout.ep = 2;
    const ExplorerResult r = explore_layout(c);
    INFO(r.error);
    REQUIRE(r.error.empty());
    CHECK(r.layout.world_size() == 2);
    CHECK(r.layout.ep == 2);
    CHECK(r.experts == std::vector<ExpertRange>{{0, 2}, {2, 4}});
    const auto t = std::find_if(r.tensors.begin(), r.tensors.end(), [](const TensorHolding& h) {
        return h.name == "h.0.moe.experts.c_fc.weight";
    });
    REQUIRE(t != r.tensors.end());
    CHECK(t->rows == 4 * 32);  // (E·moe_ffn, hidden)
    CHECK(t->cols == 32);
    std::map<int, std::pair<i64, i64>> rows;  // rank -> [first, last + 1) of the rows it holds
    for (const HeldPiece& p : t->weights) {
        CHECK(p.slab.col0 == 0);
        CHECK(p.slab.cols == t->cols);
        auto [it, fresh] = rows.emplace(p.rank, std::make_pair(p.slab.row0, p.slab.row0));
        it->second.first = std::min(it->second.first, p.slab.row0);
        it->second.second = std::max(it->second.second, p.slab.row0 + p.slab.rows);
    }
    CHECK(rows == std::map<int, std::pair<i64, i64>>{{0, {0, 64}}, {1, {64, 128}}});
    i64 held = 0;
    for (const HeldPiece& p : t->weights) held += p.slab.rows;
    CHECK(held == t->rows);  // each expert row on one rank only
    const bool ep_all_to_all =
        std::any_of(r.collectives.begin(), r.collectives.end(), [](const CollectiveUse& u) {
            return u.group == "ep" && u.collective.find("all_to_all") == 0 && u.bytes > 0;
        });
    CHECK(ep_all_to_all);  // the routed rows go to their experts' ranks and back

    c.model.moe_experts = 0;  // dense: ep has nothing to share, the runtime's sentence says so
    const ExplorerResult bad = explore_layout(c);
    CHECK(bad.error.find("layout.ep") != std::string::npos);
}

TEST_CASE("Job controller: a run steps, pauses, and its pipeline timeline is measured", "[gui]") {
    Config c = small_job();
    c.train.steps = 6;
    c.layout.pp = 2;
    c.layout.microbatches = 2;
    JobController job;
    job.start(c, false);
    job.run_to(3);
    RunSnapshot s;
    const auto t0 = std::chrono::steady_clock::now();
    while (s.steps_done < 3 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
        job.poll();
        job.update(s);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    CHECK(s.steps_done == 3);
    CHECK(s.metrics.size() == 3);
    CHECK(s.layout.pp == 2);
    job.poll();
    CHECK(job.status() == JobStatus::paused);
    REQUIRE(job.trace());
    const Timeline tl = measured_timeline(job.trace()->mesh(), job.trace()->last_steps());
    INFO(tl.problem);
    CHECK(tl.problem.empty());
    CHECK(tl.lanes.size() == 2);
    CHECK(tl.makespan > 0);
    CHECK(tl.bubble > 0);
    CHECK(tl.bubble < 1);
    // Each microbatch's forward and backward as measured on each stage: F0 F1 then B0 B1 on
    // both (1F1B with 2 microbatches on 2 stages), each forward before its backward, and stage
    // 1's forward of a microbatch after stage 0's (it waits for the activations).
    std::map<std::pair<int, std::string>, TimelineBar> span;  // (lane, "F0") -> its bar
    for (const TimelineBar& b : tl.bars)
        if (b.kind == TimelineBar::forward || b.kind == TimelineBar::backward) {
            CHECK(b.t1 > b.t0);
            CHECK(span.emplace(std::make_pair(b.lane, b.label), b).second);
        }
    CHECK(span.size() == 8);  // 2 stages × 2 microbatches × forward and backward
    for (int lane = 0; lane < 2; lane++)
        for (const char* m : {"0", "1"}) {
            REQUIRE(span.count({lane, std::string("F") + m}));
            REQUIRE(span.count({lane, std::string("B") + m}));
            CHECK(span[{lane, std::string("F") + m}].t1 <= span[{lane, std::string("B") + m}].t0);
        }
    CHECK(tl.lane_pp == std::vector<int>{0, 1});
    CHECK(span[{0, "F0"}].t1 <= span[{1, "F0"}].t0);
    CHECK(span[{1, "B0"}].t1 <= span[{0, "B0"}].t0);  // the gradient flows back
    int waits = 0;
    for (const TimelineBar& b : tl.bars) waits += b.kind == TimelineBar::recv_wait;
    CHECK(waits >= 4);  // stage 1 receives 2 activations, stage 0 2 gradients
    job.resume();
    while (job.status() != JobStatus::finished &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
        job.poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    job.update(s);
    CHECK(s.state == RunState::finished);
    CHECK(s.steps_done == 6);

    Config bad = c;
    bad.layout.tp = 3;
    CHECK_THROWS_AS(job.start(bad, true), ConfigError);
}

TEST_CASE("Job controller: a zero-bubble pipeline's timeline measures B and W apart", "[gui]") {
    Config c = small_job();
    c.train.steps = 2;
    c.layout.pp = 2;
    c.layout.microbatches = 2;
    c.layout.schedule = "zb-h1";
    JobController job;
    job.start(c, true);
    const auto t0 = std::chrono::steady_clock::now();
    while (job.status() != JobStatus::finished &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
        job.poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE(job.status() == JobStatus::finished);
    REQUIRE(job.trace());
    const Timeline tl = measured_timeline(job.trace()->mesh(), job.trace()->last_steps());
    INFO(tl.problem);
    REQUIRE(tl.problem.empty());
    std::map<std::pair<int, std::string>, TimelineBar> span;  // (lane, "W0") -> its bar
    for (const TimelineBar& b : tl.bars)
        if (b.kind == TimelineBar::forward || b.kind == TimelineBar::backward ||
            b.kind == TimelineBar::weight) {
            CHECK(b.t1 > b.t0);
            CHECK(span.emplace(std::make_pair(b.lane, b.label), b).second);
        }
    CHECK(span.size() == 12);  // 2 stages × 2 microbatches × F, B and W
    for (int lane = 0; lane < 2; lane++)
        for (const char* m : {"0", "1"}) {
            const TimelineBar& b = span[{lane, std::string("B") + m}];
            const TimelineBar& w = span[{lane, std::string("W") + m}];
            CHECK(b.kind == TimelineBar::backward);
            CHECK(w.kind == TimelineBar::weight);
            CHECK(b.t1 <= w.t0);  // W after its B
        }
    // The last stage sends B0's gradient back before its W0 runs (the point of the split).
    CHECK(span[{1, "B0"}].t1 <= span[{0, "B0"}].t0);
    CHECK(span[{1, "B1"}].t1 <= span[{1, "W0"}].t0);
}

TEST_CASE("Job controller: pp = 1 measures each rank's forward, backward and collectives",
          "[gui]") {
    Config c = small_job();
    c.train.steps = 3;
    c.layout.dp = 2;
    c.layout.microbatches = 2;
    JobController job;
    job.start(c, true);
    const auto t0 = std::chrono::steady_clock::now();
    while (job.status() != JobStatus::finished &&
           std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120)) {
        job.poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE(job.status() == JobStatus::finished);
    REQUIRE(job.trace());
    const Timeline tl = measured_timeline(job.trace()->mesh(), job.trace()->last_steps());
    INFO(tl.problem);
    REQUIRE(tl.problem.empty());
    CHECK(tl.step == 3);
    CHECK(tl.lanes == std::vector<std::string>{"rank 0: pp0 dp0 tp0", "rank 1: pp0 dp1 tp0"});
    for (int lane = 0; lane < 2; lane++) {
        std::vector<std::string> compute;
        int collectives = 0, messages = 0;
        double last_backward = 0;
        for (const TimelineBar& b : tl.bars) {
            if (b.lane != lane) continue;
            if (b.kind == TimelineBar::forward || b.kind == TimelineBar::backward) {
                CHECK(b.t1 > b.t0);
                compute.push_back(b.label);
                if (b.kind == TimelineBar::backward) last_backward = b.t1;
            }
            collectives += b.kind == TimelineBar::collective;
            messages += b.kind == TimelineBar::recv_wait || b.kind == TimelineBar::send;
        }
        // The trivial schedule: each microbatch's forward, then its backward.
        CHECK(compute == std::vector<std::string>{"F0", "B0", "F1", "B1"});
        CHECK(messages == 0);
        CHECK(collectives > 0);  // the gradients' all-reduce over dp
        bool reduced_after = false;
        for (const TimelineBar& b : tl.bars)
            reduced_after |= b.lane == lane && b.kind == TimelineBar::collective &&
                             b.label == "dp all_reduce" && b.t0 >= last_backward;
        CHECK(reduced_after);
    }
    CHECK(tl.bubble >= 0);
    CHECK(tl.bubble < 1);
    const Timeline one = measured_timeline(job.trace()->mesh(), job.trace()->last_steps(),
                                           TimelineRanks::first_replica);
    CHECK(one.lanes.size() == 1);
}

TEST_CASE("Teaching models: the schedule's bubble and the canonical sums", "[gui]") {
    ScheduleModel s;
    s.kind = "1f1b";
    s.pp = 4;
    s.microbatches = 8;
    s.make();
    CHECK(s.error.empty());
    CHECK(s.sim.ok());
    CHECK(s.sim.bubble == Approx(bubble_formula(4, 8, 1)));
    for (const char* kind : {"1f1b", "zb-h1", "zbv"}) {  // the explorer's idle per work
        INFO(kind);
        s.kind = kind;
        s.make();
        REQUIRE(s.error.empty());
        CHECK(s.sim.bubble_rate == Approx(bubble_rate_formula(kind, 4, 8, s.virtual_stages)));
    }
    CHECK(s.virtual_stages == 2);  // zbv's V
    s.virtual_stages = 1;
    s.kind = "interleaved";
    s.virtual_stages = 2;
    s.microbatches = 6;  // not a multiple of pp
    s.make();
    CHECK(!s.error.empty());

    NumericsModel n;
    n.make();
    bool some_order_differs = false;
    for (const SumRow& r : n.rows) {
        if (r.canonical) CHECK(r.ulp_vs_tree == 0);
        some_order_differs = some_order_differs || r.ulp_vs_tree != 0;
    }
    CHECK(some_order_differs);
    CHECK(n.nodes.size() == 3);
}

TEST_CASE("Finished runs open in the panels: a run file, a validate.json, a golden trace",
          "[gui]") {
    const std::string dir = "build/test_gui_models_files";
    std::filesystem::create_directories(dir);
    const Config c = check_job();
    {
        RunFile f(dir + "/run.h5", config_to_toml(c));
        for (i64 s = 1; s <= 3; s++) {
            f.append("loss", s, 4.0 - s);
            f.append("grad_norm", s, 1.0);
        }
        f.append("val_loss", 2, 2.5);
        f.event(2, "rerun", "step 2 ran again");
    }
    const RunSnapshot snap = snapshot_from_run_file(dir + "/run.h5");
    CHECK(snap.metrics.size() == 3);
    CHECK(snap.metrics.loss[2] == 1.0);
    CHECK(snap.metrics.val_loss[0] == -1);
    CHECK(snap.metrics.val_loss[1] == 2.5);
    REQUIRE(snap.events.size() == 1);
    CHECK(snap.events[0].kind == EventKind::rerun);
    CHECK(snap.config.model.hidden == c.model.hidden);

    mutation::Mutation m;
    m.kind = mutation::Kind::swap_partials;
    m.step = 2;
    m.rank = 1;
    m.other = 2;
    m.tensor = "h.0.mlp.c_fc.weight";
    const ValidationReport rep =
        validate_layouts(c, parse_layouts("dp4"), 4, nullptr, mutation::plant(m));
    {
        std::ofstream out(dir + "/validate.json");
        out << rep.to_json();
    }
    const CheckView v = check_from_report(dir + "/validate.json");
    REQUIRE(v.layouts.size() == 1);
    const LayoutGrid& g = v.layouts[0];
    CHECK(g.result.verdict == "diverged");
    CHECK(g.result.first_op.name == "2/grad/0/param/mlp.c_fc.weight");
    const int row = row_of(g, "params/h.0.mlp.c_fc.weight");
    REQUIRE(row >= 0);
    CHECK(g.cells[static_cast<size_t>(row)][0].rank < 0);
    CHECK(is_red(ulp_colour(g.cells[static_cast<size_t>(row)][1])));
    // The whole grid, every step (step 3 lies between the first differing step and the last):
    // the same rows and cells as the run's own grid, the swapped gradient red with its element.
    REQUIRE(g.tensors == rep.layouts[0].grid_tensors);
    for (size_t t = 0; t < g.tensors.size(); t++) {
        INFO(g.tensors[t]);
        REQUIRE(g.cells[t].size() == 4);
        for (size_t k = 0; k < 4; k++) {
            CHECK(g.cells[t][k].done);
            CHECK(g.cells[t][k].max_ulp == rep.layouts[0].grid_ulp[t][k]);
            CHECK((g.cells[t][k].rank >= 0) == (rep.layouts[0].grid_ulp[t][k] != 0));
        }
    }
    const int grad = row_of(g, "grad/0/param/mlp.c_fc.weight");
    REQUIRE(grad >= 0);
    const CheckCell& swapped = g.cells[static_cast<size_t>(grad)][1];
    CHECK(is_red(ulp_colour(swapped)));
    CHECK(swapped.first >= 0);
    CHECK(swapped.reference != swapped.candidate);
    CHECK(is_red(ulp_colour(g.cells[static_cast<size_t>(row)][2])));  // the weight stays off
    CHECK_THROWS_AS(check_from_report(dir + "/run.h5"), DataError);
    // A fast-mode report: its cells carry the budget ratio, and within budget none is red.
    {
        Config f = c;
        f.numerics.mode = Mode::fast;
        std::ofstream out(dir + "/validate_fast.json");
        out << validate_layouts(f, parse_layouts("dp2"), 2).to_json();
    }
    const CheckView fv = check_from_report(dir + "/validate_fast.json");
    REQUIRE(fv.layouts.size() == 1);
    CHECK(fv.layouts[0].result.verdict == "within budget");
    int judged = 0;
    for (const std::vector<CheckCell>& line : fv.layouts[0].cells)
        for (const CheckCell& k : line) {
            CHECK(k.done);
            if (k.rank < 0) continue;
            judged++;
            CHECK(k.ratio >= 0);
            CHECK(!is_red(cell_colour(k, fv.mode)));
        }
    CHECK(judged > 0);

    record_trace(c, {"**"}, 1, 2, dir + "/trace.h5");
    LayoutCheck check;
    check.start_golden(dir + "/trace.h5", "dp2");
    REQUIRE(check.wait(300));
    const CheckView gv = check.view();
    INFO(gv.error);
    REQUIRE(gv.layouts.size() == 1);
    CHECK(gv.layouts[0].result.verdict == "match");
    CHECK(gv.steps == 2);
    CHECK_THROWS(check.start_golden(dir + "/run.h5", "dp2"));
}

TEST_CASE("Traces: two recorded traces compared op by op as one grid of ops x steps", "[gui]") {
    const std::string dir = "build/test_gui_models_traces";
    std::filesystem::create_directories(dir);
    Config c = small_job();
    c.train.steps = 3;
    Config tree = c, lr = c;
    tree.numerics.block = 37;  // another canonical tree: every sum in another order
    lr.train.lr *= 1.1;        // a wrong run: the first update differs by far more than rounding
    for (const auto& [cfg, name] :
         std::vector<std::pair<Config, std::string>>{{c, "ref"}, {tree, "tree"}, {lr, "lr"}})
        record_trace(cfg, {"**"}, 1, 3, dir + "/" + name + ".h5");
    const TraceReader ref(dir + "/ref.h5");

    // Every row of the comparison sits in the cell of its op and step, with its ratio.
    auto check_cells = [](const CheckView& v, const TraceComparison& tc) {
        const LayoutGrid& g = v.layouts.at(0);
        for (const CompareRow& w : tc.rows) {
            const int row = row_of(g, w.op());
            REQUIRE(row >= 0);
            const CheckCell& k = g.cells[static_cast<size_t>(row)][static_cast<size_t>(w.step - 1)];
            CHECK(k.done);
            CHECK(k.ratio == w.ratio);
            CHECK(k.rel == w.rel);
            CHECK((k.rank >= 0) == (w.error != 0));
        }
    };

    SECTION("another summation order: within budget, nothing red, nothing marked") {
        const TraceComparison tc = compare_traces(ref, TraceReader(dir + "/tree.h5"));
        REQUIRE(tc.within());
        const CheckView v = check_from_comparison(tc);
        CHECK(v.mode == "compare");
        CHECK(v.steps == 3);
        CHECK(v.header.find("ref.h5 (parallax) against run") != std::string::npos);
        REQUIRE(v.layouts.size() == 1);
        const LayoutGrid& g = v.layouts[0];
        CHECK(g.result.verdict == "within budget");
        CHECK(g.result.ok());
        CHECK(g.summary == tc.verdict());
        CHECK(g.summary.rfind("consistent with rounding", 0) == 0);
        CHECK(g.first_row == -1);
        CHECK(g.first_col == -1);
        // Rows: the ops of one step, in the reference's order; columns: the three steps.
        CHECK(g.tensors.size() * 3 == tc.rows.size());
        CHECK(g.tensors.front() == "fwd/-/embed/out");
        check_cells(v, tc);
        int differing = 0;
        for (const std::vector<CheckCell>& line : g.cells) {
            REQUIRE(line.size() == 3);
            for (const CheckCell& k : line) {
                CHECK(k.ratio <= 1);
                CHECK(!is_red(cell_colour(k, v.mode)));
                differing += k.rank >= 0;
            }
        }
        CHECK(differing > static_cast<int>(tc.rows.size()) / 2);  // the orders really differ
    }

    SECTION("a learning rate 10% high: over budget, the first update marked") {
        const TraceComparison tc = compare_traces(ref, TraceReader(dir + "/lr.h5"));
        REQUIRE(!tc.within());
        const CheckView v = check_from_comparison(tc);
        const LayoutGrid& g = v.layouts.at(0);
        CHECK(g.result.verdict == "over budget");
        CHECK(!g.result.ok());
        CHECK(g.summary == tc.verdict());
        CHECK(g.summary.find("over budget: step 1, optim/-/param/wte") != std::string::npos);
        CHECK(g.result.first_step == 1);
        CHECK(g.result.first.name == "optim/-/param/wte");
        CHECK(g.first_row == row_of(g, "optim/-/param/wte"));
        CHECK(g.first_col == 0);
        check_cells(v, tc);
        const CheckCell& first =
            g.cells[static_cast<size_t>(g.first_row)][static_cast<size_t>(g.first_col)];
        CHECK(first.ratio > 1);
        CHECK(first.rank == 0);
        CHECK(first.candidate != first.reference);
        CHECK(first.at.size() == 2);  // wte (V, C)
        // Step 1 before the update is bit-identical (dark green); from step 2 on the forward
        // differs by far more than rounding.
        const std::vector<CheckCell>& embed =
            g.cells[static_cast<size_t>(row_of(g, "fwd/-/embed/out"))];
        CHECK(embed[0].rank < 0);
        CHECK(cell_colour(embed[0], v.mode) == ulp_colour(embed[0]));
        const std::vector<CheckCell>& loss =
            g.cells[static_cast<size_t>(row_of(g, "fwd/-/loss/out"))];
        CHECK(loss[0].rank < 0);
        CHECK(loss[1].ratio > 1);
        CHECK(loss[1].rank == 0);

        // The same comparison read back from `parallax compare --json`'s report.
        const std::string report = dir + "/compare.json";
        {
            std::ofstream out(report);
            out << tc.json();
        }
        CHECK(is_compare_report(report));
        const CheckView r = check_from_compare_report(report);
        const LayoutGrid& rg = r.layouts.at(0);
        CHECK(r.header == v.header);
        CHECK(rg.tensors == g.tensors);
        CHECK(rg.first_row == g.first_row);
        CHECK(rg.first_col == g.first_col);
        CHECK(rg.summary == g.summary);
        check_cells(r, tc);
        CHECK(!is_compare_report(dir + "/ref.h5"));
        CHECK_THROWS_AS(check_from_compare_report(dir + "/ref.h5"), DataError);

        // The panel's model runs it on its thread and shows the same grid.
        LayoutCheck check;
        check.start_compare(dir + "/ref.h5", dir + "/lr.h5");
        REQUIRE(check.wait(300));
        const CheckView a = check.view();
        INFO(a.error);
        REQUIRE(a.layouts.size() == 1);
        CHECK(a.layouts[0].tensors == g.tensors);
        CHECK(a.layouts[0].summary == g.summary);
        CHECK(!a.running);
        CHECK_THROWS_AS(check.start_compare(dir + "/ref.h5", report), DataError);
    }

    SECTION("a replica that differs is a row of its own under its op") {
        TraceComparison tc;
        tc.ref_path = "ref.h5";
        tc.run_path = "run.h5";
        tc.ref_source = "parallax";
        tc.run_source = "torch";
        auto row = [](const std::string& probe, int rank, double ratio) {
            CompareRow w;
            w.probe = probe;
            w.rank = rank;
            w.step = std::stoll(probe.substr(0, 1));
            w.error = ratio > 0 ? 1 : 0;
            w.ratio = ratio;
            return w;
        };
        tc.rows = {row("1/grad/-/param/wte", -1, 0.5), row("1/grad/-/param/wte", 1, 3e4),
                   row("1/optim/-/param/wte", -1, 0),  row("2/grad/-/param/wte", -1, 0.2),
                   row("2/grad/-/param/wte", 1, 2e4),  row("2/grad/-/param/wte", 3, 5e3)};
        tc.first_over = 1;
        tc.split = {PieceRatio{0, "dp 0", {}, 0, 0.5}, PieceRatio{1, "dp 1", {}, 1, 3e4}};
        const CheckView v = check_from_comparison(tc);
        const LayoutGrid& g = v.layouts.at(0);
        CHECK(g.tensors == std::vector<std::string>{"grad/-/param/wte", "grad/-/param/wte (rank 1)",
                                                    "grad/-/param/wte (rank 3)",
                                                    "optim/-/param/wte"});
        CHECK(g.first_row == 1);
        CHECK(g.first_col == 0);
        CHECK(g.result.first.name == "grad/-/param/wte (rank 1)");
        CHECK(g.result.first_rank == 1);
        CHECK(!g.cells[2][0].done);  // rank 3 differed at step 2 only
        CHECK(g.cells[2][1].ratio == 5e3);
        CHECK(g.cells[3][0].rank < 0);  // bit-identical
        REQUIRE(v.notes.size() == 3);   // the split's heading and its two ranks
        CHECK(v.notes[2].find("rank 1 (dp 1)") != std::string::npos);
        CHECK(v.notes[2].find("3e+04") != std::string::npos);
    }

    SECTION("one trace alone: its probes by step under its attributes") {
        const CheckView v = check_from_trace(dir + "/ref.h5");
        CHECK(v.mode == "trace");
        CHECK(v.steps == 3);
        CHECK(v.header.find("source parallax") != std::string::npos);
        CHECK(v.header.find("precision the config's (u = 2^-24)") != std::string::npos);
        CHECK(v.header.find("layout one device") != std::string::npos);
        const LayoutGrid& g = v.layouts.at(0);
        CHECK(g.tensors.size() * 3 == ref.info().order.size());
        CHECK(g.tensors.front() == "fwd/-/embed/out");
        for (const std::vector<CheckCell>& line : g.cells)
            for (const CheckCell& k : line) {
                CHECK(k.done);
                CHECK(k.ratio < 0);
                CHECK(cell_colour(k, v.mode) != cell_colour(CheckCell{}, v.mode));
            }
        CHECK_THROWS_AS(check_from_trace(dir + "/nothing.h5"), DataError);
    }
}

TEST_CASE("Spikes: a rolled-back spike opens from its run file with its first run's evidence",
          "[gui]") {
    const std::string dir = "build/test_gui_models_spikes";
    std::filesystem::remove_all(dir);
    Config c = small_job();
    c.train.steps = 30;
    c.train.threads = 1;
    c.data.corrupt_step = 25;
    c.spikes.action = "rollback";
    c.spikes.window = 20;
    c.output.run_file = true;
    c.output.dir = dir;
    c.output.progress = false;
    std::filesystem::create_directories(dir);
    {
        RunFileObserver file(dir + "/run.h5", c);
        run_layout(c, {&file});
    }
    const RunSnapshot snap = snapshot_from_run_file(dir + "/run.h5");
    const SpikeModel m = spike_model(snap);
    REQUIRE(m.spikes.size() == 1);
    CHECK(m.spikes[0].step == 25);
    CHECK(m.groups == std::vector<std::string>{"embed", "h.0", "h.1", "ln_f"});
    REQUIRE(m.steps.size() == 30);  // every step once: the re-run rows replaced the first ones
    // The series hold the re-run (batch 24 skipped), the event the first run's spike: every
    // layer's gradient norm there is well above the re-run's value at the same step and above
    // its own median before it.
    const std::vector<EvidenceRow> rows = evidence_at(m, m.spikes[0], 20);
    REQUIRE(rows.size() == 4);
    const size_t at = 24;
    for (size_t g = 0; g < rows.size(); g++) {
        INFO(rows[g].group);
        CHECK(rows[g].grad_norm > 2 * m.series.at("grad_norm")[g][at]);
        CHECK(rows[g].grad_norm_ratio > 2);
        CHECK(rows[g].update_ratio == 0);  // its update was never applied
    }
    CHECK(std::isfinite(rows[1].attn_logit_max));
    CHECK(std::isnan(rows[0].attn_logit_max));  // the embedding has no attention
}

TEST_CASE("An opened run file fills every panel it holds data for: loss, spikes, FP8, memory",
          "[gui]") {
    // The FP8 drift job (the learning-rate jump at step 30) with the spike guard on and a bad
    // batch at step 22, written to its run file as parallax train writes it.
    const std::string dir = "build/test_gui_models_fp8_spikes";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    Config c = load_config("examples/fp8_drift.toml");
    c.train.steps = 34;
    c.train.eval_every = 0;
    c.fp8_monitor.every = 2;
    c.fp8_monitor.compare = "current";
    c.data.corrupt_step = 22;
    c.spikes.action = "log";
    c.output.dir = dir;
    c.output.progress = false;
    {
        RunFileObserver file(dir + "/run.h5", c);
        run_layout(c, {&file});
    }
    const RunSnapshot snap = snapshot_from_run_file(dir + "/run.h5");
    CHECK(snap.state == RunState::finished);
    CHECK(snap.metrics.size() == 34);
    CHECK(snap.num_params > 0);
    // The FP8 panel: the monitor's tensors, steps and alerts after the jump.
    const Fp8View v = make_fp8_view(snap);
    CHECK(v.recipe == "delayed");
    CHECK(v.tensors.size() == 24);
    CHECK(v.steps.size() == 17);
    CHECK(!v.alerts.empty());
    for (const Fp8AlertRow& a : v.alerts) CHECK(!a.message.empty());  // the events are there too
    // The spike panel: the per-layer evidence of every step and the bad batch's spike.
    const SpikeModel m = spike_model(snap);
    CHECK(m.steps.size() == 34);
    CHECK(m.groups.size() == 6);  // embed, h.0 .. h.3, ln_f
    REQUIRE(!m.spikes.empty());
    CHECK(m.spikes[0].step == 22);
    // The memory panel: rank 0's bytes at the run's end, as the file keeps them.
    REQUIRE(snap.memory.size() == 1);
    CHECK(snap.memory[0].params >= 4 * snap.num_params);
    CHECK(snap.memory[0].optimizer >= 8 * snap.num_params);
    CHECK(snap.memory[0].activations > 0);
}

TEST_CASE(
    "FP8 view: the monitor's rows as tensors, grids, histories and alerts with their evidence",
    "[gui]") {
    // A live job with the drift provoked (examples/fp8_drift.toml, every 2nd step, comparing
    // current scaling), stopped after step 34 (the jump is at step 30).
    Config c = load_config("examples/fp8_drift.toml");
    c.output.run_file = false;
    c.train.eval_every = 0;
    c.fp8_monitor.every = 2;
    c.fp8_monitor.compare = "current";
    JobController job;
    job.start(c, false);
    job.run_to(34);
    RunSnapshot snap;
    for (int i = 0; i < 6000 && !(snap.steps_done == 34 && job.status() == JobStatus::paused);
         i++) {
        job.poll();
        job.update(snap);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    REQUIRE(snap.steps_done == 34);
    const Fp8View v = make_fp8_view(snap);
    CHECK(v.recipe == "delayed");
    CHECK(v.compare == std::vector<std::string>{"current"});
    REQUIRE(v.tensors.size() == 24);  // blocks 1 and 2: 4 linears x (x, w, dy)
    CHECK(v.tensors[0] == "h.1.attn.c_attn/x");
    CHECK(v.tensors[23] == "h.2.mlp.c_proj/dy");
    REQUIRE(v.steps.size() == 17);  // 2, 4, ..., 34
    CHECK(v.steps.front() == 2);
    CHECK(v.step_stride == 2);
    // The grids hold each tensor's row of each step, and nothing of the comparison's rows.
    for (const Fp8Stat& r : snap.fp8) {
        if (r.recipe != "delayed") continue;
        const int t = v.tensor_index(r.tensor);
        REQUIRE(t >= 0);
        const size_t k = static_cast<size_t>((r.step - 2) / 2);
        CHECK(v.saturated[static_cast<size_t>(t)][k] == r.saturated);
        CHECK(v.underflow[static_cast<size_t>(t)][k] == r.underflow);
    }
    // Alerts: exactly the rows with alert bits, each with its event's sentence, after the jump.
    i64 alerted = 0;
    for (const Fp8Stat& r : snap.fp8) alerted += r.alerts != 0 ? 1 : 0;
    REQUIRE(alerted > 0);
    REQUIRE(static_cast<i64>(v.alerts.size()) == alerted);
    for (const Fp8AlertRow& a : v.alerts) {
        CHECK(a.row.step > 30);
        CHECK(v.tensors[static_cast<size_t>(a.tensor)] == a.row.tensor);
        CHECK(a.message.rfind(
                  "fp8 " + a.row.tensor + " (delayed) at step " + std::to_string(a.row.step) + ": ",
                  0) == 0);
    }
    const int t = v.default_tensor();
    CHECK(v.alerts_of[static_cast<size_t>(t)] ==
          *std::max_element(v.alerts_of.begin(), v.alerts_of.end()));
    // The chosen tensor's histories: the run's scale and current scaling's, step by step.
    const std::vector<Fp8History> h = v.histories(snap.fp8, t);
    REQUIRE(h.size() == 2);
    CHECK(h[0].recipe == "delayed");
    CHECK(h[1].recipe == "current");
    REQUIRE(h[0].step.size() == 17);
    for (const Fp8Stat& r : snap.fp8)
        if (r.tensor == v.tensors[static_cast<size_t>(t)]) {
            const Fp8History& hh = r.recipe == "delayed" ? h[0] : h[1];
            const size_t k = static_cast<size_t>((r.step - 2) / 2);
            CHECK(hh.step[k] == static_cast<double>(r.step));
            CHECK(hh.scale[k] == r.scale);
            CHECK(hh.amax[k] == r.amax);
        }
    job.stop();

    // The same rows from a run file: what `parallax gui` shows when one is opened.
    const std::string dir = "build/test_gui_models_files";
    std::filesystem::create_directories(dir);
    {
        RunFile f(dir + "/fp8.h5", config_to_toml(c));
        f.append("loss", 34, 1.0);
        f.append_fp8(snap.fp8);
        for (const RunEvent& e : snap.events) f.event(e.step, event_kind_name(e.kind), e.message);
    }
    const RunSnapshot opened = snapshot_from_run_file(dir + "/fp8.h5");
    const Fp8View w = make_fp8_view(opened);
    CHECK(w.tensors == v.tensors);
    CHECK(w.steps == v.steps);
    REQUIRE(w.alerts.size() == v.alerts.size());
    for (size_t i = 0; i < w.alerts.size(); i++) CHECK(w.alerts[i].message == v.alerts[i].message);
    // Delayed scaling's initial scale (step 1) is a gap in the history, the others drawn.
    RunSnapshot first;
    for (const i64 step : {1, 2}) {
        Fp8Stat r;
        r.step = step;
        r.tensor = "h.1.mlp.c_fc/x";
        r.recipe = "delayed";
        r.scale = step == 1 ? 1.0 : 300.0;
        first.fp8.push_back(r);
    }
    const std::vector<Fp8History> fh = make_fp8_view(first).histories(first.fp8, 0);
    REQUIRE(fh.size() == 1);
    CHECK(std::isnan(fh[0].scale[0]));
    CHECK(fh[0].scale[1] == 300.0);
    // No rows: an empty view (the panel then shows its empty state).
    const Fp8View none = make_fp8_view(RunSnapshot{});
    CHECK(none.tensors.empty());
    CHECK(none.default_tensor() == -1);
}

namespace {

StepValues step_values(i64 step, std::vector<NamedValue> v) {
    return {step, std::make_shared<const std::vector<NamedValue>>(std::move(v))};
}

// Equal grids, NaN equal to NaN.
bool same(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++) {
        if (a[i].size() != b[i].size()) return false;
        for (size_t j = 0; j < a[i].size(); j++)
            if (!(a[i][j] == b[i][j] || (std::isnan(a[i][j]) && std::isnan(b[i][j])))) return false;
    }
    return true;
}

bool same(const RouterView& a, const RouterView& b) {
    if (a.layers != b.layers || a.experts != b.experts || a.steps != b.steps) return false;
    if (a.tokens.size() != b.tokens.size()) return false;
    for (size_t l = 0; l < a.tokens.size(); l++)
        if (!same(a.tokens[l], b.tokens[l])) return false;
    return same(a.drop_fraction, b.drop_fraction) && same(a.balance, b.balance) &&
           same(a.aux_loss, b.aux_loss) && same(a.z_loss, b.z_loss) && same(a.entropy, b.entropy);
}

}  // namespace

TEST_CASE(
    "Router view: names, layers and experts found, loads against the even share, empty states",
    "[gui]") {
    RouterName n;
    REQUIRE(parse_router_name("moe.h.3.tokens.5", &n));
    CHECK((n.layer == 3 && n.stat == "tokens" && n.expert == 5));
    REQUIRE(parse_router_name("moe.h.12.router_entropy", &n));
    CHECK((n.layer == 12 && n.stat == "router_entropy" && n.expert == -1));
    for (const char* bad : {"layer.h.3.grad_norm", "moe.h.x.balance", "moe.h..balance",
                            "moe.h.3.tokens", "moe.h.3.tokens.", "moe.h.3.tokens.a",
                            "moe.h.3.unknown", "moe.3.balance", "spike.loss_z"}) {
        INFO(bad);
        CHECK_FALSE(parse_router_name(bad, &n));
    }

    // Four blocks, every second one MoE (h.1 and h.3), four experts; step 2 carries spike
    // evidence only, and h.3 has no balance at step 1.
    Config c = small_job();
    c.model.layers = 4;
    c.model.moe_experts = 4;
    c.model.moe_every = 2;
    RunSnapshot s;
    s.config = c;
    s.state = RunState::running;
    s.values.push_back(step_values(1, {{"moe.h.1.drop_fraction", 0.25},
                                       {"moe.h.1.balance", 1.2},
                                       {"moe.h.1.aux_loss", 0.012},
                                       {"moe.h.1.z_loss", 0.003},
                                       {"moe.h.1.router_entropy", 1.1},
                                       {"moe.h.1.tokens.0", 30},
                                       {"moe.h.1.tokens.1", 10},
                                       {"moe.h.1.tokens.2", 10},
                                       {"moe.h.1.tokens.3", 10},
                                       {"moe.h.3.drop_fraction", 0},
                                       {"moe.h.3.tokens.0", 20},
                                       {"moe.h.3.tokens.1", 20},
                                       {"moe.h.3.tokens.2", 20},
                                       {"moe.h.3.tokens.3", 20},
                                       {"layer.h.0.grad_norm", 0.5}}));
    s.values.push_back(step_values(2, {{"layer.h.0.grad_norm", 0.4}, {"spike.loss_z", 0.1}}));
    s.values.push_back(step_values(3, {{"moe.h.3.balance", 1.0},
                                       {"moe.h.3.drop_fraction", 0},
                                       {"moe.h.3.tokens.0", 0},
                                       {"moe.h.3.tokens.1", 40},
                                       {"moe.h.3.tokens.2", 40},
                                       {"moe.h.3.tokens.3", 0},
                                       {"moe.h.1.balance", 1.1}}));
    const RouterView v = make_router_view(s);
    CHECK(v.layers == std::vector<int>{1, 3});
    CHECK(v.experts == 4);
    CHECK(v.steps == std::vector<double>{1, 3});  // step 2 has no router values
    CHECK(v.layer_index(3) == 1);
    CHECK(v.layer_index(2) == -1);
    CHECK(v.uniform_entropy() == Approx(std::log(4.0)));
    CHECK(v.drop_fraction[0][0] == 0.25);
    CHECK(v.balance[0][1] == 1.1);
    CHECK(v.aux_loss[0][0] == 0.012);
    CHECK(v.z_loss[0][0] == 0.003);
    CHECK(v.entropy[0][0] == 1.1);
    CHECK(std::isnan(v.balance[1][0]));  // h.3 at step 1: none
    CHECK(std::isnan(v.entropy[1][1]));
    CHECK(v.tokens[0][0][0] == 30);
    CHECK(v.tokens[1][1][1] == 40);
    // h.1, step 1: 60 slots kept of the 80 chosen (a quarter dropped): the even share is 20, so
    // expert 0 took 1.5 times it and the others half of it; of the kept, 50% and 1/6 each.
    CHECK(v.share(0, 0, 0) == Approx(0.5));
    CHECK(v.share(0, 1, 0) == Approx(1.0 / 6));
    CHECK(v.load(0, 0, 0) == Approx(1.5));
    CHECK(v.load(0, 3, 0) == Approx(0.5));
    // h.3: even at step 1, two experts starved at step 3.
    for (int e = 0; e < 4; e++) CHECK(v.load(1, e, 0) == Approx(1.0));
    CHECK(v.load(1, 0, 1) == 0);
    CHECK(v.load(1, 1, 1) == Approx(2.0));
    // h.1 at step 3 has no tokens; out of range is NaN too.
    CHECK(std::isnan(v.load(0, 0, 1)));
    CHECK(std::isnan(v.load(0, 4, 0)));
    CHECK(std::isnan(v.load(2, 0, 0)));
    CHECK(v.step_index(2) == 0);  // the last step at or before it
    CHECK(v.step_index(3) == 1);
    CHECK(v.step_index(0) == -1);
    // Step by step, as a live job's snapshot grows: the same view, the new steps appended.
    RouterView grown;
    RunSnapshot part = s;
    part.values.clear();
    CHECK_FALSE(update_router_view(grown, part));
    for (size_t k = 0; k < s.values.size(); k++) {
        part.values.push_back(s.values[k]);
        CHECK(update_router_view(grown, part) == (k != 1));  // step 2 holds no router value
        CHECK(grown.seen == k + 1);
    }
    CHECK_FALSE(update_router_view(grown, part));
    CHECK(same(grown, v));
    // A layer not seen before, another run's values, a re-run's fewer: made anew.
    part.values.push_back(step_values(4, {{"moe.h.5.tokens.0", 7}}));
    CHECK(update_router_view(grown, part));
    CHECK(grown.layers == std::vector<int>{1, 3, 5});
    CHECK(same(grown, make_router_view(part)));
    RunSnapshot other;
    other.values.push_back(step_values(1, {{"moe.h.0.tokens.0", 1}, {"moe.h.0.tokens.1", 3}}));
    CHECK(update_router_view(grown, other));
    CHECK(grown.layers == std::vector<int>{0});
    CHECK(grown.experts == 2);
    CHECK(grown.load(0, 1, 0) == Approx(1.5));
    RunSnapshot rerun = s;
    rerun.values.resize(1);
    update_router_view(grown, s);
    CHECK(update_router_view(grown, rerun));
    CHECK(grown.steps == std::vector<double>{1});
    // The spike panel keeps to the steps with spike evidence.
    const SpikeModel sm = spike_model(s);
    CHECK(sm.steps == std::vector<double>{1, 2});
    CHECK(sm.groups == std::vector<std::string>{"h.0"});

    // The empty states: a dense model, a MoE run before its first step, a finished one without
    // router statistics; none when there is something to draw.
    CHECK(router_empty_state(v, c, RunState::running).empty());
    const RouterView none = make_router_view(RunSnapshot{});
    CHECK(none.empty());
    CHECK(none.layers.empty());
    CHECK(none.experts == 0);
    const std::string before = router_empty_state(none, c, RunState::not_started);
    CHECK(before.find("no step yet") != std::string::npos);
    CHECK(before.find("2 MoE layers x 4 experts, top-2") != std::string::npos);
    CHECK(router_empty_state(none, c, RunState::running) == before);
    CHECK(router_empty_state(none, c, RunState::finished).find("no router statistics") !=
          std::string::npos);
    Config dense = c;
    dense.model.moe_experts = 0;
    const std::string d = router_empty_state(none, dense, RunState::finished);
    CHECK(d.find("no MoE layers: set model.moe_experts") == 0);
    // A dense run's named values (spike evidence) make no router view.
    RunSnapshot spikes_only;
    spikes_only.values.push_back(s.values[1]);
    CHECK(make_router_view(spikes_only).empty());
}

TEST_CASE("Router view: a MoE job's statistics live and from its run file, slots adding up",
          "[gui]") {
    const std::string dir = "build/test_gui_models_router";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    Config c = load_config("examples/moe-small.toml");
    c.train.steps = 3;
    c.train.eval_every = 0;
    c.output.dir = dir;
    c.output.progress = false;
    JobView live;
    {
        RunFileObserver file(dir + "/run.h5", c);
        run_layout(c, {&file, &live});
    }
    const RouterView v = make_router_view(live.snapshot());
    const RouterView f = make_router_view(snapshot_from_run_file(dir + "/run.h5"));
    CHECK(v.layers == std::vector<int>{0, 1});
    CHECK(v.experts == 4);
    CHECK(v.steps == std::vector<double>{1, 2, 3});
    // The live snapshot step by step gives the same view.
    const RunSnapshot snap = live.snapshot();
    RouterView grown;
    RunSnapshot part = snap;
    part.values.clear();
    for (const StepValues& sv : snap.values) {
        part.values.push_back(sv);
        update_router_view(grown, part);
    }
    CHECK(same(grown, v));
    CHECK(f.layers == v.layers);
    CHECK(f.experts == v.experts);
    CHECK(f.steps == v.steps);
    const double slots =
        static_cast<double>(c.train.batch_size * c.model.seq_len * c.model.moe_top_k);
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < 3; k++) {
            INFO("layer " << l << ", step " << k);
            // Every slot the router chose is kept by one expert or dropped.
            double kept = 0, loads = 0;
            for (int e = 0; e < 4; e++) {
                kept += v.tokens[l][e][k];
                loads += v.load(l, e, k);
                CHECK(f.tokens[l][e][k] == v.tokens[l][e][k]);
            }
            const double drop = v.drop_fraction[l][k];
            CHECK(kept == Approx(slots * (1 - drop)));
            CHECK(loads == Approx(4 * (1 - drop)));
            CHECK(v.entropy[l][k] > 0);
            CHECK(v.entropy[l][k] <= v.uniform_entropy() + 1e-9);
            CHECK(v.aux_loss[l][k] == Approx(c.model.moe_aux_loss * v.balance[l][k]));
            CHECK(f.balance[l][k] == v.balance[l][k]);
            CHECK(f.z_loss[l][k] == v.z_loss[l][k]);
        }
    CHECK(router_empty_state(v, c, RunState::finished).empty());
}
