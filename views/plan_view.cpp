// The plan panel's model (plan_view.h): the planner on a thread, and a run's measurements beside
// its layout's prediction.
#include "views/plan_view.h"

#include "core/base/error.h"
#include "core/parallel/mesh.h"
#include "core/train/memory.h"
#include "validators/plan/traffic.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

namespace px::views {

namespace {

namespace fs = std::filesystem;


double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::vector<TermShare> top_terms(const plan::TimeTerms& t, int n) {
    std::vector<TermShare> all;
    for (const plan::TimeTermName& k : plan::kTimeTerms)
        if (t.*(k.field) > 0) all.push_back({k.name, t.*(k.field)});
    std::stable_sort(all.begin(), all.end(),
                     [](const TermShare& a, const TermShare& b) { return a.seconds > b.seconds; });
    if (static_cast<int>(all.size()) > n) all.resize(static_cast<size_t>(std::max(n, 0)));
    return all;
}

PlanOutcome make_plan(const PlanRequest& req) {
    const auto t0 = std::chrono::steady_clock::now();
    PlanOutcome o;
    o.request = req;
    try {
        if (req.cluster.empty())
            throw ConfigError("no cluster file: choose one of examples/clusters/ or give its path");
        o.cluster = plan::load_cluster(req.cluster);
        o.fitted = o.cluster;
        if (!req.calibrate.empty()) {
            o.calibration = plan::calibrate(o.cluster, req.calibrate);
            o.calibration_text = plan::text(o.cluster, *o.calibration);
            o.fitted = plan::apply(o.cluster, *o.calibration);
        }
        plan::PlanOptions po;
        po.gpus = req.gpus;
        o.plan = plan::plan_layouts(req.config, o.fitted, po);
    } catch (const std::exception& e) {
        o.error = e.what();
    }
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    o.ready = true;
    return o;
}

Planner::~Planner() {
    if (thread_.joinable()) thread_.join();
}

void Planner::start(const PlanRequest& req) {
    std::lock_guard lk(mu_);
    pending_ = req;
    if (busy_) return;                       // the running thread takes it next
    if (thread_.joinable()) thread_.join();  // finished: busy_ is false only once it has stored
    busy_ = true;
    thread_ = std::thread([this] {
        while (true) {
            PlanRequest r;
            {
                std::lock_guard lk(mu_);
                if (!pending_) {
                    busy_ = false;
                    return;
                }
                r = std::move(*pending_);
                pending_.reset();
            }
            PlanOutcome o = make_plan(r);
            std::lock_guard lk(mu_);
            out_ = std::move(o);
            version_++;
        }
    });
}

PlanOutcome Planner::outcome() const {
    std::lock_guard lk(mu_);
    return out_;
}

std::vector<std::string> cluster_files(const std::vector<std::string>& folders) {
    std::vector<std::string> out;
    std::vector<fs::path> seen;
    std::error_code ec;
    for (const std::string& f : folders) {
        fs::path p = fs::absolute(f, ec);
        for (int up = 0; up <= 4 && !p.empty(); up++, p = p.parent_path()) {
            const fs::path dir = p / "examples" / "clusters";
            if (!fs::is_directory(dir, ec)) {
                if (p == p.parent_path()) break;
                continue;
            }
            const fs::path canon = fs::canonical(dir, ec);
            if (std::find(seen.begin(), seen.end(), canon) != seen.end()) break;
            seen.push_back(canon);
            std::vector<std::string> here;
            for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
                if (e.path().extension() == ".toml")
                    here.push_back(e.path().lexically_normal().string());
            std::sort(here.begin(), here.end());
            out.insert(out.end(), here.begin(), here.end());
            break;
        }
    }
    return out;
}

std::string default_cluster(const std::vector<std::string>& files) {
    for (const std::string& f : files)
        if (fs::path(f).filename() == "cpu-inprocess.toml") return f;
    return files.empty() ? "" : files.front();
}

MeasuredRun measured_run(const RunSnapshot& snap, const CommTrace* trace) {
    MeasuredRun m;
    const MetricColumns& mc = snap.metrics;
    std::vector<double> ms, sent;
    for (size_t i = 0; i < mc.size(); i++) {
        if (i > 0 || mc.size() == 1) ms.push_back(mc.step_ms[i]);
        sent.push_back(mc.comm_bytes[i]);
    }
    m.steps = static_cast<i64>(mc.size());
    m.step_s = median(ms) / 1e3;
    if (!sent.empty()) m.rank0_sent = median(sent);
    const std::vector<MemoryStats> mem = trace ? trace->memory() : snap.memory;
    for (const MemoryStats& s : mem) m.memory.push_back(static_cast<double>(s.total()));
    if (trace)
        for (const RankStep& r : trace->last_steps())
            for (const CommEvent& e : r.events)
                m.group_bytes[e.group] += static_cast<double>(e.bytes);
    return m;
}

PlanComparison compare_with_run(const Config& cfg, const plan::ClusterSpec& cluster,
                                const plan::ClusterSpec* fitted, const MeasuredRun& m) {
    PlanComparison c;
    try {
        const plan::Candidate p = plan::predict(cfg, cluster);
        c.layout = p.label();
        double mem = -1;
        for (double b : m.memory) mem = std::max(mem, b);
        c.rows.push_back({m.memory.size() > 1 ? "memory per rank (largest)" : "memory, rank 0",
                          "bytes", p.memory_bytes, mem});
        c.rows.push_back({"step time (" + cluster.name + ")", "seconds", p.time.step,
                          m.steps > 0 ? m.step_s : -1});
        if (fitted)
            c.rows.push_back({"step time (calibrated)", "seconds",
                              plan::predict(cfg, *fitted).time.step, m.steps > 0 ? m.step_s : -1});
        // Communication: rank 0's bytes sent, and every rank's sent + received by group.
        const Mesh mesh(make_layout(cfg), Mesh::Validated{});
        double rank0 = 0;
        std::map<std::string, double> groups;
        for (int r = 0; r < mesh.world_size(); r++)
            for (const plan::PlannedOp& op : plan::step_traffic(cfg, mesh.coord_of(r))) {
                const comm::Traffic t = op.bytes();
                if (r == 0) rank0 += op.calls * static_cast<double>(t.sent);
                groups[op.group] += op.calls * static_cast<double>(t.sent + t.recv);
            }
        c.rows.push_back({"comm sent per step, rank 0", "bytes", rank0, m.rank0_sent});
        for (const auto& [g, b] : m.group_bytes) groups.try_emplace(g, 0.0);
        for (const auto& [g, b] : groups) {
            const auto it = m.group_bytes.find(g);
            c.rows.push_back({"comm " + g + " per step (all ranks, sent + received)", "bytes", b,
                              it == m.group_bytes.end() ? -1 : it->second});
        }
    } catch (const std::exception& e) {
        c.error = e.what();
    }
    return c;
}

}  // namespace px::views
