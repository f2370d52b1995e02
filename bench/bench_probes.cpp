// bench_probes: what probes cost. One optimizer step of a GPT-2-small-shaped stack (C = 768,
// 12 heads, F = 3072, T = 64, B = 4, fp32, bitwise) with probes off, with the loss only
// ("*/fwd/-/loss/*"), with every activation and input gradient ("*/fwd/**", "*/bwd/**") and
// with everything ("**": also every parameter's gradient, weight and Adam moments), each copied
// into a ProbeRecorder (cleared after every step, outside the timing).
//
//   build/bench/bench_probes [--steps N] [--layers L] [--vocab V] [--threads N]
//
// Prints ms/step (best and median of N, the modes alternating step by step so that a
// noisy host hits all alike), the ratio to probes off, and the floats recorded per step.
// Checks its results: the jobs' losses are the same bits at every step (probes never
// change the computation), and the recorded loss probe averages to the step's loss.
#include "core/base/config.h"
#include "core/train/job.h"
#include "core/base/numerics.h"
#include "core/train/probe_recorder.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace px;

int main(int argc, char** argv) {
    int steps = 5, layers = 3, threads = 0;
    i64 vocab = 50257;
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
    Config c = parse_config(default_config_toml(), "bench_probes");
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
    c.data.markov_vocab = std::min<i64>(vocab, 256);  // as examples/gpt2-124m.toml

    const char* names[] = {"off", "loss only", "fwd+bwd", "every op"};
    ProbeRecorder loss({"*/fwd/-/loss/*"}), acts({"*/fwd/**", "*/bwd/**"}), every({"**"});
    ProbeRecorder* sinks[] = {nullptr, &loss, &acts, &every};
    constexpr int kModes = 4;
    std::vector<std::unique_ptr<Job>> jobs;
    for (ProbeRecorder* r : sinks) {
        jobs.push_back(std::make_unique<Job>(c));
        jobs.back()->set_probes(r);
    }
    std::printf("bench_probes: %d layers, C=768, T=64, B=4, V=%lld, %d threads, %d steps\n", layers,
                static_cast<long long>(vocab), omp_get_max_threads(), steps);

    std::vector<double> ms[kModes];
    i64 floats[kModes] = {};
    bool ok = true;
    for (int s = 0; s <= steps; s++) {  // step 0 warms up
        double loss_bits[kModes];
        for (int m = 0; m < kModes; m++) {
            const auto t0 = std::chrono::steady_clock::now();
            const StepMetrics sm = jobs[static_cast<size_t>(m)]->step();
            const double t =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count();
            loss_bits[m] = sm.loss;
            if (s > 0) ms[m].push_back(t);
            if (sinks[m]) {
                if (m == 1) {  // the recorded losses average to the step's loss
                    const std::vector<float> l =
                        loss.unshard(ProbeKey{s + 1, "fwd", -1, "loss", "out"}.name());
                    const double mean = canonical_sum(l.data(), static_cast<i64>(l.size()),
                                                      jobs[1]->model().numerics().block) /
                                        static_cast<float>(l.size());
                    ok = ok && mean == sm.loss;
                }
                floats[m] = sinks[m]->bytes() / 4;
                sinks[m]->clear();
            }
        }
        for (int m = 1; m < kModes; m++)
            ok = ok && std::memcmp(&loss_bits[0], &loss_bits[m], sizeof(double)) == 0;
    }
    double base = 0;
    for (int m = 0; m < kModes; m++) {
        std::vector<double> v = ms[m];
        std::sort(v.begin(), v.end());
        const double best = v.front(), median = v[v.size() / 2];
        if (m == 0) base = median;
        std::printf(
            "  probes %-9s  best %8.1f ms  median %8.1f ms  ratio %.3f  recorded %.3f MB/step\n",
            names[m], best, median, median / base, static_cast<double>(floats[m]) * 4.0 / 1e6);
    }
    std::printf("check: losses equal with probes off/on, loss probe matches: %s\n",
                ok ? "ok" : "FAILED");
    return ok ? 0 : 1;
}
