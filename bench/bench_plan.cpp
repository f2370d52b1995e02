// bench_plan: the planner's step time against measured runs on in-process ranks. Trains the
// layouts of the parallel tests (single device, dp2, tp2, pp2, dp2×tp2, pp2×tp2, ZeRO-1/2/3) of
// a config for a few steps with run files, calibrates the in-process cluster file on them
// (planner/calibrate.h), and prints, per layout, the measured step time (median after the first
// step), the prediction before and after calibration and their ratio; then the same with the
// calibration fitted on the single device and dp2 only (the others predicted, not fitted).
//
//   build/bench/bench_plan [--config examples/small.toml] [--steps S] [--cluster FILE.toml]
// (numerics.block is set to 32, so that tp2 gives each rank whole blocks)
//
// Checks its results: each run's rank 0 bytes per step (the run file's comm_bytes) equal the
// planner's (step_traffic), and every fitted value is finite and positive.
#include "core/base/config.h"
#include "core/io/output_paths.h"
#include "core/train/session.h"
#include "validators/plan/calibrate.h"
#include "validators/plan/cluster.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace px;

namespace {

struct Layout1 {
    const char* name;
    int dp, tp, pp, zero, microbatches;
};

constexpr Layout1 kLayouts[] = {
    {"single", 1, 1, 1, 0, 1},  {"dp2", 2, 1, 1, 0, 1},        {"tp2", 1, 2, 1, 0, 1},
    {"pp2", 1, 1, 2, 0, 4},     {"dp2 tp2", 2, 2, 1, 0, 1},    {"pp2 tp2", 1, 2, 2, 0, 2},
    {"dp2 zero1", 2, 1, 1, 1, 1}, {"dp2 zero2", 2, 1, 1, 2, 1}, {"dp2 zero3", 2, 1, 1, 3, 1},
};

bool report(const char* title, const plan::Calibration& cal) {
    std::printf("\n%s: achievable %.4g, link bandwidth x %.4g%s\n", title, cal.achievable,
                cal.link_scale, cal.bandwidth ? "" : " (not fitted)");
    std::printf("%-34s %12s %12s %12s %8s %14s\n", "layout", "measured", "before", "after",
                "ratio", "comm bytes");
    bool ok = std::isfinite(cal.achievable) && cal.achievable > 0 &&
              std::isfinite(cal.link_scale) && cal.link_scale > 0;
    for (const plan::RunFit& r : cal.runs) {
        std::printf("%-34s %10.2f ms %10.2f ms %10.2f ms %8.3f %14.0f%s\n", r.layout.c_str(),
                    r.measured_s * 1e3, r.before_s * 1e3, r.after_s * 1e3,
                    r.after_s / r.measured_s, r.comm_bytes,
                    r.comm_bytes == r.predicted_comm_bytes ? "" : "  MISMATCH");
        ok = ok && r.comm_bytes == r.predicted_comm_bytes;
    }
    return ok;
}

}  // namespace

int run(int argc, char** argv) {
    std::string config = "examples/small.toml", cluster_file = "examples/clusters/cpu-inprocess.toml";
    int steps = 6;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--config")) config = argv[i + 1];
        else if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--cluster")) cluster_file = argv[i + 1];
    }
    const plan::ClusterSpec cluster = plan::load_cluster(cluster_file);
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("px_bench_plan_" + std::to_string(::getpid()));
    std::vector<std::string> runs;
    std::printf("bench_plan: %s, %d steps per layout, cluster %s\n", config.c_str(), steps,
                cluster_file.c_str());
    for (const Layout1& l : kLayouts) {
        Config c = job_config(config);
        c.train.steps = steps;
        c.train.eval_every = 0;
        c.numerics.block = 32;  // tp2: whole blocks of hidden and ffn per rank
        // The machine's cores shared among the ranks (the cluster file's ranks_share_node).
        const int cores = static_cast<int>(std::thread::hardware_concurrency());
        c.train.threads = std::max(1, cores / (l.dp * l.tp * l.pp));
        c.layout.dp = l.dp, c.layout.tp = l.tp, c.layout.pp = l.pp, c.layout.zero = l.zero;
        c.layout.microbatches = l.microbatches;
        c.output.run_file = true;
        c.output.dir = (dir / std::to_string(runs.size())).string();
        RunSession(c, {}).run();
        runs.push_back(run_file_path(c));
        std::printf("  trained %s\n", l.name);
        std::fflush(stdout);
    }
    bool ok = report("calibrated on every run", plan::calibrate(cluster, runs));
    ok = report("calibrated on single and dp2, the others predicted",
                [&] {
                    plan::Calibration two = plan::calibrate(cluster, {runs[0], runs[1]});
                    const plan::ClusterSpec fitted = plan::apply(cluster, two);
                    const plan::Calibration all = plan::calibrate(fitted, runs);
                    plan::Calibration out = two;
                    out.runs = all.runs;  // "before" of the refit: the two-run fit's predictions
                    for (plan::RunFit& r : out.runs) r.after_s = r.before_s;
                    return out;
                }()) &&
         ok;
    std::filesystem::remove_all(dir);
    std::printf("\n%s\n", ok ? "checks passed" : "CHECKS FAILED");
    return ok ? 0 : 1;
}

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_plan: %s\n", e.what());
        return 2;
    }
}
