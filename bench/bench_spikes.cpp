// bench_spikes: what the spike guard costs (core/train/spikes.h). One optimizer step of a
// GPT-2-small-shaped stack (C = 768, 12 heads, F = 3072, T = 64, B = 4, fp32, bitwise) with
// spikes.action = "off" and = "log" (the per-layer evidence every step: gradient norms, update
// ratios, attention logit maxima, Adam eps ratios; replay off, so nothing is re-run), each a
// one-rank SteppedRun advanced one step at a time, the two alternating so that a noisy host
// hits both alike.
//
//   build/bench/bench_spikes [--steps N] [--layers L] [--vocab V] [--threads N] [--trials N]
//
// Prints ms/step (best and median of N) of each and the guard's cost per step. Checks its
// results: both runs' losses and weights are the same bits (the guard never changes a step).
//
// Then the detector's false-alarm rate against the history it judges by (spikes.h, "How much
// history a verdict needs"): for windows of n = 3 .. 50 steps of steady standard-normal noise
// (the project's counter-based normals), the share of next values whose robust z exceeds 6 (the
// default spikes.z_threshold), over --trials windows each (default 1e6). Checks that it falls
// with n and is below 1e-3 at kSpikeMinHistory.
#include "core/base/config.h"
#include "core/base/rng.h"
#include "core/train/spikes.h"
#include "core/train/stepped_run.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

using namespace px;

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// The share of `trials` windows of n standard normals whose next normal has a robust z above
// `threshold`, as SpikeGuard judges a step.
double false_alarm_rate(i64 n, i64 trials, double threshold) {
    i64 alarms = 0;
#pragma omp parallel for reduction(+ : alarms) schedule(static)
    for (i64 t = 0; t < trials; t++) {
        std::vector<double> w(static_cast<size_t>(n));
        const u64 base = static_cast<u64>(t) * static_cast<u64>(n + 1);
        for (i64 i = 0; i < n; i++)
            w[static_cast<size_t>(i)] = normal_at(7, static_cast<u32>(n), base + static_cast<u64>(i));
        const double x = normal_at(7, static_cast<u32>(n), base + static_cast<u64>(n));
        if (robust_stats(std::move(w)).z(x) > threshold) alarms++;
    }
    return static_cast<double>(alarms) / static_cast<double>(trials);
}

// The table of false_alarm_rate by window length; false when it does not fall with n or is not
// below 1e-3 at kSpikeMinHistory.
bool false_alarm_table(i64 trials) {
    const double threshold = SpikesConfig{}.z_threshold;
    std::printf("false alarms of robust z > %.0f on steady Gaussian noise (%lld windows each)\n",
                threshold, static_cast<long long>(trials));
    bool ok = true;
    double last = 1.0;
    for (i64 n : {3, 4, 6, 8, 10, 12, 16, 20, 30, 50}) {
        const double rate = false_alarm_rate(n, trials, threshold);
        std::printf("  history %3lld steps  %8.4f%% of steps%s\n", static_cast<long long>(n),
                    100.0 * rate, n == kSpikeMinHistory ? "   <- the fewest judged against" : "");
        ok = ok && rate <= last;
        if (n == kSpikeMinHistory) ok = ok && rate < 1e-3;
        last = rate;
    }
    std::printf("  falls with the history and is below 0.1%% at %lld steps: %s\n",
                static_cast<long long>(kSpikeMinHistory), ok ? "yes" : "NO");
    return ok;
}

}  // namespace

int run(int argc, char** argv);

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_spikes: %s\n", e.what());
        return 2;
    }
}

int run(int argc, char** argv) {
    int steps = 6, layers = 3, threads = 0;
    i64 vocab = 50257, trials = 1000000;
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
        else if (a == "--trials")
            trials = std::atoll(argv[i + 1]);
        else {
            std::fprintf(stderr,
                         "unknown option %s; use --steps, --layers, --vocab, --threads, --trials\n",
                         a.c_str());
            return 2;
        }
    }
    Config c = parse_config(default_config_toml(), "bench_spikes");
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
    c.data.markov_vocab = 64;  // a small chain: the model's vocabulary stays GPT-2's
    c.output.run_file = false;
    c.output.progress = false;
    Config on = c;
    on.spikes.action = "log";
    on.spikes.replay = false;
    SteppedRun a(c), b(on);
    std::vector<double> ta, tb;
    for (int s = 1; s <= steps + 1; s++)  // step 1 is warm-up, not timed
        for (SteppedRun* r : {&a, &b}) {
            const auto t0 = std::chrono::steady_clock::now();
            r->advance_to(s);
            if (!r->wait(3600)) {
                std::fprintf(stderr, "bench_spikes: a run did not finish its step in an hour\n");
                return 1;
            }
            r->rethrow();
            const double ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            if (s > 1) (r == &a ? ta : tb).push_back(ms);
        }
    const Job& ja = a.job(0);
    const Job& jb = b.job(0);
    bool same = ja.history().size() == jb.history().size();
    for (size_t i = 0; same && i < ja.history().size(); i++)
        same = std::memcmp(&ja.history()[i].loss, &jb.history()[i].loss, sizeof(double)) == 0 &&
               std::memcmp(&ja.history()[i].grad_norm, &jb.history()[i].grad_norm, sizeof(double)) == 0;
    const i64 n = ja.model().table().total;
    same = same && std::memcmp(ja.model().params(), jb.model().params(), static_cast<size_t>(n) * 4) == 0;
    std::printf("bench_spikes: C=768 L=%d V=%lld B=4 T=64, %d timed steps\n", layers,
                static_cast<long long>(vocab), steps);
    std::printf("  spikes off          best %8.1f ms  median %8.1f ms\n",
                *std::min_element(ta.begin(), ta.end()), median(ta));
    std::printf("  spikes log (guard)  best %8.1f ms  median %8.1f ms\n",
                *std::min_element(tb.begin(), tb.end()), median(tb));
    std::printf("  guard cost per step %+.1f ms (%+.1f%% of the median step)\n",
                median(tb) - median(ta), 100.0 * (median(tb) - median(ta)) / median(ta));
    std::printf("  same losses and weights, bit for bit: %s\n", same ? "yes" : "NO");
    const bool table = false_alarm_table(trials);
    return same && table ? 0 : 1;
}
