// The planner (planner/plan.h) against measured runs on in-process ranks: memory per rank within
// 5% of what the ranks hold (MemoryStats), communication bytes per group and operation equal to
// the stats book's, byte for byte; and the cluster files, enumeration, ranking and calibration.
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/comm/comm.h"
#include "core/io/runfile.h"
#include "core/train/job.h"
#include "core/train/memory.h"
#include "core/io/output_paths.h"
#include "core/train/runner.h"
#include "core/train/session.h"
#include "validators/plan/calibrate.h"
#include "validators/plan/cluster.h"
#include "validators/plan/plan.h"
#include "validators/plan/traffic.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <unistd.h>

using namespace px;
using Catch::Matchers::Contains;

namespace {

struct Layout1 {
    const char* name;
    int dp, tp, pp, zero, microbatches;
    const char* schedule = "1f1b";
};

// The layouts of tests/layouts/test_parallel.cpp and test_pipeline.cpp.
const Layout1 kLayouts[] = {
    {"dp2", 2, 1, 1, 0, 1},          {"tp2", 1, 2, 1, 0, 1},
    {"pp2", 1, 1, 2, 0, 4},          {"pp2 gpipe", 1, 1, 2, 0, 4, "gpipe"},
    {"dp2 tp2", 2, 2, 1, 0, 1},      {"pp2 tp2", 1, 2, 2, 0, 2},
    {"dp2 zero1", 2, 1, 1, 1, 1},    {"dp2 zero2", 2, 1, 1, 2, 1},
    {"dp2 zero3", 2, 1, 1, 3, 1},    {"dp2 zero3 mb2", 2, 1, 1, 3, 2},
    {"dp4 zero2 mb2", 4, 1, 1, 2, 2}, {"dp2 pp2 zero2", 2, 1, 2, 2, 2},
    {"dp3", 3, 1, 1, 0, 1},          {"pp2 zb-h1", 1, 1, 2, 0, 4, "zb-h1"},
    {"pp2 zbv", 1, 1, 2, 0, 4, "zbv"},
};

Config job(const Layout1& l) {
    Config c = test::small_job();
    c.numerics.block = 8;  // tp2 gives each rank whole blocks of hidden and ffn
    c.train.steps = 3;
    c.train.eval_every = 0;
    c.train.threads = 1;
    c.output.run_file = false;
    c.train.batch_size = l.dp == 3 ? 12 : 8;
    c.layout.dp = l.dp, c.layout.tp = l.tp, c.layout.pp = l.pp, c.layout.zero = l.zero;
    c.layout.microbatches = l.microbatches;
    c.layout.schedule = l.schedule;
    if (std::string(l.schedule) == "zbv") c.model.layers = 4;  // its V: 2 × pp chunks
    return c;
}

using Key = std::pair<std::string, std::string>;  // group, op
struct Counts {
    i64 calls = 0, sent = 0, recv = 0;
};
using Book = std::map<Key, Counts>;

struct Measured {
    std::map<int, Book> step;         // world rank -> its third step's operations
    std::map<int, MemoryStats> mem;   // world rank -> what it holds after its third step
    std::map<int, Coord> at;
};

Book rows(const Job& job) {
    Book b;
    for (const comm::StatRow& r : job.groups().world->stats_book()->rows())
        b[{r.group, r.op}] = {r.calls, r.bytes_sent, r.bytes_recv};
    return b;
}

// The third step's operations (the second's book subtracted from the third's), per rank.
Measured measure(const Config& c) {
    Measured m;
    std::mutex mu;
    std::map<int, Book> second;
    RunHooks h;
    h.each_step = [&](Job& job) {
        const int r = job.groups().world->rank();
        const Book b = rows(job);
        std::lock_guard lk(mu);
        if (job.history().size() == 2) second[r] = b;
        if (job.history().size() != 3) return;
        m.mem[r] = job.memory();  // before the run's end gathers ZeRO's shards whole
        m.at[r] = job.rank().at;
        Book& out = m.step[r];
        for (const auto& [k, v] : b) {
            const Counts before = second[r].count(k) ? second[r][k] : Counts{};
            const Counts d{v.calls - before.calls, v.sent - before.sent, v.recv - before.recv};
            if (d.calls > 0 && k.first != "world") out[k] = d;
        }
    };
    run_layout(c, {}, h);
    return m;
}

Book predicted(const Config& c, const Coord& at) {
    Book b;
    for (const plan::GroupOpBytes& g : plan::by_group_op(plan::step_traffic(c, at)))
        b[{g.group, g.op}] = {static_cast<i64>(g.calls), static_cast<i64>(g.sent),
                              static_cast<i64>(g.recv)};
    return b;
}

std::string show(const Book& b) {
    std::string s;
    for (const auto& [k, v] : b)
        s += "  " + k.first + " " + k.second + ": calls " + std::to_string(v.calls) + ", sent " +
             std::to_string(v.sent) + ", recv " + std::to_string(v.recv) + "\n";
    return s;
}

bool same(const Book& a, const Book& b) {
    if (a.size() != b.size()) return false;
    for (const auto& [k, v] : a) {
        const auto it = b.find(k);
        if (it == b.end() || it->second.sent != v.sent || it->second.recv != v.recv ||
            it->second.calls != v.calls)
            return false;
    }
    return true;
}

}  // namespace

TEST_CASE("communication bytes per group and op are the stats book's, on every rank", "[planner]") {
    for (const Layout1& l : kLayouts) {
        const Config c = job(l);
        const Measured m = measure(c);
        REQUIRE(m.step.size() == static_cast<size_t>(l.dp * l.tp * l.pp));
        for (const auto& [rank, book] : m.step) {
            const Book p = predicted(c, m.at.at(rank));
            INFO(l.name << ", rank " << rank << "\nmeasured:\n" << show(book) << "predicted:\n"
                        << show(p));
            CHECK(same(book, p));
        }
    }
}

TEST_CASE("memory per rank is within 5% of what the ranks hold", "[planner]") {
    for (const Layout1& l : kLayouts) {
        const Config c = job(l);
        const Measured m = measure(c);
        double held = 0;
        std::string parts;
        for (const auto& [rank, s] : m.mem) {
            const double h = double(s.peak_params + s.peak_grads + s.optimizer + s.activations);
            if (h > held)
                parts = "weights " + std::to_string(s.peak_params) + ", gradients " +
                        std::to_string(s.peak_grads) + ", moments " + std::to_string(s.optimizer) +
                        ", activations " + std::to_string(s.activations);
            held = std::max(held, h);
        }
        // The parts MemoryStats measures (the estimate's others: batch buffers, data tables,
        // bookkeeping, which no part counts).
        double est = 0;
        for (const MemoryItem& i : estimate_memory(c, MemoryScope::one_rank).items)
            if (i.what == "weights" || i.what == "gradients" || i.what == "AdamW moments" ||
                i.what == "activations")
                est += i.bytes;
        std::string est_parts;
        for (const MemoryItem& i : estimate_memory(c, MemoryScope::one_rank).items)
            est_parts += i.what + " " + std::to_string(static_cast<i64>(i.bytes)) + ", ";
        INFO(l.name << ": estimated " << est << " bytes (" << est_parts
                    << "), the largest rank holds " << held << " (" << parts << ")");
        CHECK(est >= 0.95 * held);
        // zbv: a chunk makes one more activation set when its free ones' messages are still in
        // flight, which depends on the threads' timing (runs of one layout differ by about 10%);
        // the estimate counts that set on every chunk, an upper bound.
        if (std::string(l.schedule) != "zbv") CHECK(est <= 1.05 * held);
        else CHECK(est <= 1.35 * held);
    }
}

namespace {

const char* kCluster = R"(
[cluster]
gpus_per_node = 8
[compute]
fp32 = 67
bf16 = 989
achievable = 0.5
[memory]
hbm_gib = 80
[nvlink]
gb_per_s = 450
latency_us = 3
[ib]
gb_per_s = 50
latency_us = 6
)";

std::string error_of(const std::string& text) {
    try {
        plan::parse_cluster(text, "c.toml");
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

std::string replaced(std::string s, const std::string& from, const std::string& to) {
    const size_t at = s.find(from);
    REQUIRE(at != std::string::npos);
    return s.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("cluster files: every shipped one parses; bad keys name the file, key and value",
          "[planner]") {
    for (const auto& f : std::filesystem::directory_iterator("examples/clusters")) {
        INFO(f.path());
        const plan::ClusterSpec c = plan::load_cluster(f.path().string());
        CHECK(c.gpus_per_node >= 1);
        CHECK(c.fp32_tflops > 0);
        CHECK(c.usable_bytes() > 0);
    }
    const plan::ClusterSpec h100 = plan::load_cluster("examples/clusters/h100-nvlink-ib400.toml");
    CHECK(h100.bf16_tflops == 989);
    CHECK(h100.fp8_tflops == 1979);
    CHECK(h100.nvlink.gb_per_s == 450);
    CHECK(h100.ib.gb_per_s == 50);
    CHECK(plan::load_cluster("examples/clusters/a100-ib200.toml").bf16_tflops == 312);

    CHECK(error_of(kCluster).empty());
    CHECK_THAT(error_of(replaced(kCluster, "achievable = 0.5", "achievable = 1.5")),
               Contains("c.toml") && Contains("[compute] achievable = 1.5") &&
                   Contains("out of range"));
    CHECK_THAT(error_of(replaced(kCluster, "gpus_per_node = 8", "gpus_per_node = \"eight\"")),
               Contains("[cluster] gpus_per_node = \"eight\" must be an integer"));
    CHECK_THAT(error_of(replaced(kCluster, "latency_us = 6", "latency_us = 6\nbandwidth = 3")),
               Contains("unknown key 'bandwidth' in [ib]") && Contains("gb_per_s"));
    CHECK_THAT(error_of(replaced(kCluster, "[memory]\nhbm_gib = 80", "")),
               Contains("[memory] hbm_gib is missing"));
    CHECK_THAT(error_of("[gpu]\nx = 1"), Contains("unknown section [gpu]"));
    CHECK_THROWS_WITH(plan::load_cluster("no/such.toml"),
                      Contains("no/such.toml") && Contains("no such file"));
    CHECK_THROWS_WITH(plan::peak_tflops(plan::parse_cluster(kCluster, "c.toml"), "fp8"),
                      Contains("[compute] fp8 is not given"));
}

TEST_CASE("the plan: valid layouts only, every schedule kind, ranked by step time", "[planner]") {
    Config c = job(kLayouts[0]);
    c.train.batch_size = 16;
    c.model.layers = 4;
    const plan::ClusterSpec cl = plan::parse_cluster(kCluster, "c.toml");
    plan::PlanOptions opt;
    opt.gpus = 8;
    const plan::Plan p = plan::plan_layouts(c, cl, opt);
    REQUIRE(p.fitting > 1);
    std::set<std::string> schedules;
    for (size_t i = 0; i < p.candidates.size(); i++) {
        const plan::Candidate& k = p.candidates[i];
        INFO(k.label());
        CHECK(k.dp * k.tp * k.pp * k.cp == 8);
        CHECK(k.tp <= cl.gpus_per_node);
        Config v = c;
        v.layout.dp = k.dp, v.layout.tp = k.tp, v.layout.pp = k.pp, v.layout.zero = k.zero;
        v.layout.microbatches = k.microbatches, v.layout.schedule = k.schedule;
        v.layout.virtual_stages = k.virtual_stages, v.layout.recompute = k.recompute;
        CHECK_NOTHROW(make_layout(v));  // the runtime accepts it
        // its memory is the runtime's estimate, and its terms add up
        CHECK(k.memory_bytes == estimate_memory(v, MemoryScope::one_rank).total);
        CHECK(k.time.step > 0);
        CHECK(k.time.compute > 0);
        CHECK(k.mfu > 0);
        CHECK(k.time.step >= k.time.compute + k.time.tp_comm - 1e-12);
        if (k.pp > 1) schedules.insert(k.schedule);
        if (i > 0 && k.fits && p.candidates[i - 1].fits)
            CHECK(p.candidates[i - 1].time.step <= k.time.step * (1 + 1e-6));
    }
    for (int kind = 0; std::string(schedule_name(ScheduleKind(kind))) != "?"; kind++)
        CHECK(schedules.count(schedule_name(ScheduleKind(kind))) == 1);
    // recompute adds a forward: more compute, less activation memory
    const auto find = [&](const std::string& rc) {
        for (const plan::Candidate& k : p.candidates)
            if (k.dp == 8 && k.zero == 0 && k.microbatches == 1 && k.recompute == rc) return k;
        FAIL("no dp8 m1 " << rc);
        return plan::Candidate{};
    };
    CHECK(find("full").time.compute > find("none").time.compute);
    CHECK(plan::plan_json(p).find("\"schema\": \"parallax-plan\"") != std::string::npos);

    SECTION("nothing fits: every candidate says so, the smallest first") {
        plan::ClusterSpec tiny = cl;
        tiny.hbm_gib = 1e-6;
        const plan::Plan q = plan::plan_layouts(c, tiny, opt);
        CHECK(q.fitting == 0);
        for (size_t i = 1; i < q.candidates.size(); i++)
            CHECK(q.candidates[i - 1].memory_bytes <= q.candidates[i].memory_bytes);
    }
    SECTION("bad device counts") {
        opt.gpus = 0;
        CHECK_THROWS_AS(plan::plan_layouts(c, cl, opt), ConfigError);
    }
}

TEST_CASE("model FLOPs: 6·N per token plus attention; MoE counts the routed experts a token uses",
          "[planner]") {
    Config c = test::small_job();
    const plan::ModelFlops f = plan::model_flops(c.model);
    const ModelConfig& m = c.model;
    const double C = double(m.hidden), F = double(m.ffn), L = double(m.layers);
    const double layer = 3 * C * C + C * C + 2 * C * F;  // qkv, proj, fc, fcproj
    CHECK(f.matmul_params == Approx(L * layer + double(m.vocab) * C));
    CHECK(f.per_token_forward == Approx(2 * f.matmul_params + L * 4 * double(m.seq_len) * C));
    Config moe = test::small_moe_job(64);
    moe.model.moe_every = 1;
    const plan::ModelFlops g = plan::model_flops(moe.model);
    Config all = moe;
    all.model.moe_top_k = all.model.moe_experts;  // every expert: the whole table
    CHECK(g.matmul_params < plan::model_flops(all.model).matmul_params);
}

TEST_CASE("calibrate fits finite, positive values to measured runs", "[planner]") {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("px_plan_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::vector<std::string> runs;
    for (const Layout1& l : {kLayouts[0], kLayouts[2]}) {
        Config c = job(l);
        c.train.steps = 4;
        c.output.run_file = true;
        c.output.dir = (dir / l.name).string();
        RunSession(c, {}).run();
        runs.push_back(run_file_path(c));
    }
    const plan::ClusterSpec cl = plan::load_cluster("examples/clusters/cpu-inprocess.toml");
    const plan::Calibration one = plan::calibrate(cl, {runs[0]});
    CHECK(std::isfinite(one.achievable));
    CHECK(one.achievable > 0);
    CHECK_FALSE(one.bandwidth);
    REQUIRE(one.runs.size() == 1);
    CHECK(one.runs[0].measured_s > 0);
    CHECK(one.runs[0].after_s > 0);
    // rank 0's bytes per step, as the run file recorded them, are step_traffic's
    CHECK(one.runs[0].comm_bytes == one.runs[0].predicted_comm_bytes);
    const plan::Calibration two = plan::calibrate(cl, runs);
    CHECK(two.bandwidth);
    CHECK(std::isfinite(two.link_scale));
    CHECK(two.link_scale > 0);
    CHECK(two.runs[1].comm_bytes == two.runs[1].predicted_comm_bytes);
    CHECK_THAT(plan::text(cl, two), Contains("achievable") && Contains("pp2"));
    CHECK_THROWS_WITH(plan::calibrate(cl, {(dir / "none.h5").string()}), Contains("none.h5"));
    std::filesystem::remove_all(dir);
}
