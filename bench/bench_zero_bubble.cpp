// bench_zero_bubble: 1F1B, ZB-H1 and ZBV on the same job (GPT-2-shaped layers on in-process
// pipeline ranks): per schedule, the step time (the median of the measured steps) and the
// measured bubble (1 - the ranks' compute time / (pp · the step's compute makespan), from the
// compute hooks on one clock), with the time of F, B and W as measured, next to the unit-cost
// bubble the schedule's simulation gives.
//
//   build/bench/bench_zero_bubble [--pp P] [--microbatches M] [--layers L] [--steps S]
//
// Checks its results: every schedule ends with the same weights as 1F1B, bit for bit.
#include "core/base/config.h"
#include "core/io/state.h"
#include "core/train/job.h"
#include "core/train/runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

using namespace px;

namespace {

using Clock = std::chrono::steady_clock;

struct Span {
    int rank;
    Action::Kind kind;
    double t0, t1;  // seconds since the step began (one clock for all ranks)
};

struct Result {
    LogicalState state;
    double step_ms = 0;              // median over the measured steps
    double bubble = 0;               // mean over the measured steps
    double f_ms = 0, b_ms = 0, w_ms = 0;  // mean time of one F, B (or whole backward), W
};

Result run(Config c, int pp) {
    Result r;
    std::mutex mu;
    std::vector<std::vector<Span>> steps(static_cast<size_t>(c.train.steps) + 1);
    std::vector<Clock::time_point> begun(steps.size());
    std::vector<std::vector<double>> step_ms(1);
    RunHooks hooks;
    hooks.setup = [&](Job& job) {
        const int rank = job.pp_rank();
        StepHooks h;
        h.before = [&, rank](i64 step) {
            std::lock_guard<std::mutex> lock(mu);
            if (rank == 0) begun[static_cast<size_t>(step)] = Clock::now();
        };
        h.compute = [&, rank](i64 step, const Action& a, bool done) {
            const double t = std::chrono::duration<double>(Clock::now() -
                                                           begun[static_cast<size_t>(step)])
                                 .count();
            std::lock_guard<std::mutex> lock(mu);
            auto& v = steps[static_cast<size_t>(step)];
            if (!done)
                v.push_back({rank, a.kind, t, t});
            else
                for (auto it = v.rbegin(); it != v.rend(); ++it)
                    if (it->rank == rank) {
                        it->t1 = t;
                        break;
                    }
        };
        job.add_step_hooks(h);
    };
    hooks.inspect = [&](Job& job) {
        absorb(r.state, job);
        if (job.pp_rank() != 0) return;
        std::vector<double> ms;
        for (size_t i = 1; i < job.history().size(); i++)  // the first step warms up
            ms.push_back(job.history()[i].step_ms);
        std::sort(ms.begin(), ms.end());
        r.step_ms = ms.empty() ? 0 : ms[ms.size() / 2];
    };
    run_layout(c, {}, hooks);
    double bubbles = 0, n = 0, sum[3] = {0, 0, 0}, count[3] = {0, 0, 0};
    for (size_t s = 2; s < steps.size(); s++) {  // a step's spans: every rank's, one clock
        const auto& v = steps[s];
        if (v.empty()) continue;
        double lo = 1e300, hi = 0, busy = 0;
        for (const Span& sp : v) {
            lo = std::min(lo, sp.t0);
            hi = std::max(hi, sp.t1);
            busy += sp.t1 - sp.t0;
            const int k = sp.kind == Action::forward ? 0 : sp.kind == Action::backward_weight ? 2 : 1;
            sum[k] += sp.t1 - sp.t0;
            count[k]++;
        }
        bubbles += 1 - busy / (pp * (hi - lo));
        n++;
    }
    r.bubble = n > 0 ? bubbles / n : 0;
    r.f_ms = count[0] > 0 ? 1e3 * sum[0] / count[0] : 0;
    r.b_ms = count[1] > 0 ? 1e3 * sum[1] / count[1] : 0;
    r.w_ms = count[2] > 0 ? 1e3 * sum[2] / count[2] : 0;
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    int pp = 2, microbatches = 8, layers = 8, steps = 6;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--pp" && i + 1 < argc) pp = std::atoi(argv[++i]);
        else if (a == "--microbatches" && i + 1 < argc) microbatches = std::atoi(argv[++i]);
        else if (a == "--layers" && i + 1 < argc) layers = std::atoi(argv[++i]);
        else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
        else {
            std::fprintf(stderr,
                         "usage: bench_zero_bubble [--pp P] [--microbatches M] [--layers L] "
                         "[--steps S]\n");
            return 2;
        }
    }
    Config c = parse_config(default_config_toml(), "bench_zero_bubble");
    c.model.vocab = 4096;
    c.model.seq_len = 128;
    c.model.layers = layers;
    c.model.heads = 6;
    c.model.hidden = 384;
    c.model.ffn = 1536;
    c.train.batch_size = 2 * microbatches;
    c.train.steps = steps;
    c.train.eval_every = 0;
    c.train.warmup_steps = 1;
    c.train.threads = 1;
    c.data.markov_vocab = 64;
    c.output.run_file = false;
    c.layout.pp = pp;
    c.layout.microbatches = microbatches;
    c.layout.timeout_s = 600;
    std::printf("bench_zero_bubble: L=%d, C=384, T=128, pp=%d, %d microbatches of 2 sequences, "
                "%d steps (the first not timed)\n",
                layers, pp, microbatches, steps);
    std::printf("%-8s %10s %10s %12s %8s %8s %8s %14s\n", "schedule", "step ms", "vs 1f1b",
                "bubble", "F ms", "B ms", "W ms", "unit-cost rate");
    Result base;
    int failures = 0;
    for (const char* kind : {"1f1b", "zb-h1", "zbv"}) {
        c.layout.schedule = kind;
        const Result r = run(c, pp);
        if (std::string(kind) == "1f1b") base = r;
        const ScheduleKind k = parse_schedule(kind);
        const SimResult unit = check_schedule(
            make_schedule(k, pp, microbatches, k == ScheduleKind::zbv ? 2 : 1), kUnitFBW);
        std::printf("%-8s %10.1f %9.2fx %11.1f%% %8.2f %8.2f %8.2f %13.1f%%\n", kind, r.step_ms,
                    r.step_ms / base.step_ms, 100 * r.bubble, r.f_ms, r.b_ms, r.w_ms,
                    100 * unit.bubble_rate);
        const auto bits = [](const std::vector<float>& a, const std::vector<float>& b) {
            return a.size() == b.size() &&
                   std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
        };
        if (!bits(r.state.params, base.state.params) || !bits(r.state.m, base.state.m) ||
            !bits(r.state.v, base.state.v)) {
            std::printf("  FAILED: %s's weights differ from 1F1B's\n", kind);
            failures++;
        }
    }
    std::printf("(B under 1f1b is the whole backward; a ZBV chunk is half a stage's layers)\n");
    return failures ? 1 : 0;
}
