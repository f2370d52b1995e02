// The plan panel's model: the layout planner (validators/plan/, docs/planner.md) run for the
// workbench's config off the window's thread, what each ranked row shows, and the current job's
// own layout predicted beside what the job measured (memory per rank, step time, before and after
// calibration, and communication bytes per group). The workbench, the Python module
// (parallax.predicted_vs_measured) and the gui_views suite share it.
//
// Index
//   PlanRequest        the config, the devices, the cluster file, run files to calibrate from
//   TermShare, top_terms   a candidate's largest time terms, largest first
//   PlanOutcome        the plan, the cluster as planned with (fitted when calibrated), or an error
//   make_plan          plans on the calling thread (tests, Python)
//   Planner            make_plan on a thread: start, busy, version, outcome
//   cluster_files      examples/clusters/*.toml under the given folders or their parents
//   default_cluster    the one of them the workbench starts with (in-process CPU ranks)
//   MeasuredRun, measured_run   what a run measured: step time, memory per rank, bytes per group
//   PlanComparisonRow, PlanComparison, compare_with_run   the job's layout beside its run
#pragma once
#include "core/base/config.h"
#include "core/train/job_view.h"
#include "validators/plan/calibrate.h"
#include "validators/plan/cluster.h"
#include "validators/plan/plan.h"
#include "views/comm_trace.h"

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace px::views {

struct PlanRequest {
    Config config;
    int gpus = 1;
    std::string cluster;                 // a cluster file (.toml)
    std::vector<std::string> calibrate;  // run files (.h5); empty: the file's figures
};

struct TermShare {
    const char* name;  // "compute", "tp comm", "bubble", ...
    double seconds = 0;
};
// The n largest of a step's exposed terms (those that add up to TimeTerms::step), nonzero ones.
std::vector<TermShare> top_terms(const plan::TimeTerms& t, int n);

struct PlanOutcome {
    bool ready = false;
    std::string error;  // the library's message (a bad cluster file, no layout for N devices)
    PlanRequest request;
    plan::ClusterSpec cluster;  // as read from the file
    plan::ClusterSpec fitted;   // as planned with: cluster, calibrated if asked
    std::optional<plan::Calibration> calibration;
    std::string calibration_text;  // plan::text: what was fitted, per run
    plan::Plan plan;
    double seconds = 0;  // wall time of the planning
};

// Reads the cluster, calibrates it to the run files when given, plans; errors land in `error`.
PlanOutcome make_plan(const PlanRequest& req);

class Planner {
public:
    Planner() = default;
    ~Planner();  // joins (a plan for many devices may take seconds)
    Planner(const Planner&) = delete;
    Planner& operator=(const Planner&) = delete;

    // Plans req on a thread and returns at once; a request made while one runs waits for it (a
    // later one replaces a waiting one).
    void start(const PlanRequest& req);
    bool busy() const { return busy_.load(); }
    std::uint64_t version() const { return version_.load(); }
    PlanOutcome outcome() const;

private:
    mutable std::mutex mu_;
    PlanOutcome out_;
    std::optional<PlanRequest> pending_;
    std::thread thread_;
    std::atomic<bool> busy_{false};
    std::atomic<std::uint64_t> version_{0};
};

// Every examples/clusters/*.toml in one of `folders` or a parent of one (four levels up), each
// file once, sorted by name: the workbench passes its working directory and its executable's.
std::vector<std::string> cluster_files(const std::vector<std::string>& folders);
// Of `files`, cpu-inprocess.toml (the workbench's jobs run as in-process ranks), else the first;
// "" for none.
std::string default_cluster(const std::vector<std::string>& files);

struct MeasuredRun {
    i64 steps = 0;               // steps measured
    double step_s = 0;           // the median step time after the first (a warm-up)
    std::vector<double> memory;  // bytes per world rank (a run file: rank 0's)
    // Bytes sent + received per step, summed over the ranks, by group: a live job's last step
    // (CommTrace), empty for a run file.
    std::map<std::string, double> group_bytes;
    double rank0_sent = -1;  // rank 0's bytes sent per step (median; -1: not recorded)
};
// From a snapshot (the live job's or a run file's), and the live job's trace when there is one.
MeasuredRun measured_run(const RunSnapshot& snap, const CommTrace* trace);

struct PlanComparisonRow {
    std::string what;  // "memory per rank (largest)", "step time", "comm dp", ...
    std::string unit;  // "bytes" or "seconds"
    double predicted = 0;
    double measured = -1;  // -1: not measured
    double ratio() const { return measured > 0 ? predicted / measured : 0; }
};
struct PlanComparison {
    std::string layout;  // the job's, as the plan labels it
    std::string error;   // the job's config cannot be predicted (the library's message)
    std::vector<PlanComparisonRow> rows;
};
// cfg's own layout predicted on `cluster` (and, when calibrated, on `fitted`) beside what the run
// measured: memory per rank, step time, rank 0's bytes sent per step and the bytes per group.
PlanComparison compare_with_run(const Config& cfg, const plan::ClusterSpec& cluster,
                                const plan::ClusterSpec* fitted, const MeasuredRun& m);

}  // namespace px::views
