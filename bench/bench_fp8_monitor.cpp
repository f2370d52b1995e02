// bench_fp8_monitor: what the FP8 drift monitor (core/train/fp8_monitor.h) costs. One optimizer
// step of a GPT-2-small-shaped stack (C = 768, 12 heads, F = 3072, T = 64, B = 4, bf16
// activations, fp8 delayed scaling on every block's linears, bitwise) with the monitor off, on
// every step, on every step with both comparisons (current and block scaling), and every 10th
// step.
//
//   build/bench/bench_fp8_monitor [--steps N] [--layers L] [--vocab V] [--threads N]
//
// Prints ms/step (best, median and mean of N, the modes alternating step by step so that a noisy
// host hits all alike), the median's ratio to the monitor off, and the monitor's own time per
// step (its accumulated seconds over the N steps, divided by N: the casts' statistics, the
// reduction, the rows; every 10th step needs N >= 9 to include one, the bench's step 10). Checks
// its results: the jobs' losses and fp8 scales are the same bits at every step (the monitor never
// changes the computation), and the monitored jobs' rows of the run's recipe agree bit for bit.
#include "core/base/config.h"
#include "core/train/job.h"
#include "core/train/fp8_monitor.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace px;

int main(int argc, char** argv) {
    int steps = 10, layers = 2, threads = 0;
    i64 vocab = 8192;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--steps")
            steps = std::atoi(argv[i + 1]);
        else if (a == "--layers")
            layers = std::atoi(argv[i + 1]);
        else if (a == "--vocab")
            vocab = std::atoll(argv[i + 1]);
        else if (a == "--threads")
            threads = std::atoi(argv[i + 1]);
        else {
            std::fprintf(stderr, "unknown option %s; use --steps, --layers, --vocab, --threads\n",
                         a.c_str());
            return 2;
        }
    }
    Config c = parse_config(default_config_toml(), "bench_fp8_monitor");
    c.model.vocab = vocab;
    c.model.seq_len = 64;
    c.model.layers = layers;
    c.model.heads = 12;
    c.model.hidden = 768;
    c.model.ffn = 3072;
    c.train.batch_size = 4;
    c.train.microbatches = 1;
    c.train.steps = steps + 1;
    c.train.eval_every = 0;
    c.train.threads = threads;
    c.output.run_file = false;
    c.data.markov_vocab = std::min<i64>(vocab, 256);
    c.precision.activations = "bf16";
    c.precision.fp8 = "delayed";
    c.precision.fp8_layers = "all";

    struct Mode {
        const char* name;
        i64 every;
        const char* compare;
    };
    const Mode modes[] = {{"off", 0, ""},
                          {"every step", 1, ""},
                          {"every step, compare current,block", 1, "current,block"},
                          {"every 10th step", 10, ""}};
    constexpr int kModes = 4;
    std::vector<std::unique_ptr<Job>> jobs;
    std::vector<std::shared_ptr<Fp8Monitor>> monitors;
    for (const Mode& m : modes) {
        jobs.push_back(std::make_unique<Job>(c));
        Fp8MonitorConfig mc;
        mc.every = m.every;
        mc.compare = m.compare;
        monitors.push_back(m.every > 0 ? Fp8Monitor::attach(*jobs.back(), mc) : nullptr);
    }
    const int gemms = jobs[0]->fp8()->gemms();
    std::printf(
        "bench_fp8_monitor: %d layers (%d fp8 matmuls, %d scaled tensors), C=768, T=64, "
        "B=4, V=%lld, %d threads, %d steps\n",
        layers, gemms, gemms * 3, static_cast<long long>(vocab), omp_get_max_threads(), steps);

    std::vector<double> ms[kModes];
    double before[kModes] = {};
    bool ok = true;
    for (int s = 0; s <= steps; s++) {  // step 0 warms up
        double loss[kModes];
        std::vector<float> scales[kModes];
        for (int m = 0; m < kModes; m++) {
            if (s == 1 && monitors[static_cast<size_t>(m)])
                before[m] = monitors[static_cast<size_t>(m)]->seconds();
            const auto t0 = std::chrono::steady_clock::now();
            loss[m] = jobs[static_cast<size_t>(m)]->step().loss;
            const double t =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
            if (s > 0) ms[m].push_back(t);
            scales[m] = jobs[static_cast<size_t>(m)]->fp8()->state();
        }
        for (int m = 1; m < kModes; m++)
            ok = ok && std::memcmp(&loss[0], &loss[m], sizeof(double)) == 0 &&
                 scales[0] == scales[m];
        // The run's recipe rows of both every-step monitors: the same statistics.
        const std::vector<Fp8Stat>& a = monitors[1]->last_rows();
        const std::vector<Fp8Stat>& b = monitors[2]->last_rows();
        ok = ok && a.size() == static_cast<size_t>(gemms) * 3 &&
             b.size() == static_cast<size_t>(gemms) * 3 * 3;
        for (size_t i = 0; ok && i < a.size(); i++)
            ok = a[i].tensor == b[3 * i].tensor && a[i].count == b[3 * i].count &&
                 std::bit_cast<std::uint64_t>(a[i].sqnr_db) ==
                     std::bit_cast<std::uint64_t>(b[3 * i].sqnr_db);
    }
    double base = 0;
    for (int m = 0; m < kModes; m++) {
        std::vector<double> v = ms[m];
        std::sort(v.begin(), v.end());
        const double best = v.front(), median = v[v.size() / 2];
        double mean = 0;
        for (double t : v) mean += t / static_cast<double>(v.size());
        if (m == 0) base = median;
        const double own = monitors[static_cast<size_t>(m)]
                               ? (monitors[static_cast<size_t>(m)]->seconds() - before[m]) * 1e3 /
                                     static_cast<double>(steps)
                               : 0.0;
        std::printf(
            "  monitor %-34s best %8.1f ms  median %8.1f ms  mean %8.1f ms  ratio %.3f  "
            "monitor's own %6.1f ms/step\n",
            modes[m].name, best, median, mean, median / base, own);
    }
    std::printf("check: losses and fp8 scales equal with the monitor off/on, rows agree: %s\n",
                ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
