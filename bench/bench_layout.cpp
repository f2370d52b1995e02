// bench_layout: data parallelism on in-process ranks with GPT-2 124M-shaped layers (C=768,
// NH=12, F=3072, V=50257, T=64): per step and rank, the bytes sent in collectives against the
// analytic formulas, the per-rank memory under ZeRO 0-3 against the ZeRO paper's, and the step
// time of canonical (bitwise) versus ring (fast) collectives.
//
//   build/bench/bench_layout [--layers L] [--dp N] [--steps S]
//
// Checks its results: every ZeRO stage ends with the same weights as ZeRO-0 (bit for bit), and
// the measured bytes sent equal the analytic count to within the small metadata collectives.
#include "core/base/config.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "core/parallel/data/zero.h"
#include "core/io/state.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace px;

namespace {

struct Result {
    LogicalState state;
    MemoryStats mem;       // rank 0's
    double comm_bytes = 0;  // rank 0, last step
    double step_ms = 0;     // rank 0, best step
};

// Rank 0's memory as the last step left it (after the run, ZeRO-3 gathers the whole model).
struct LastMemory : Observer {
    MemoryStats mem;
    void on_step(const RunView& run, const StepMetrics&) override { mem = run.memory(); }
};

Result run(Config c) {
    Result r;
    LastMemory last;
    RunHooks hooks;
    hooks.inspect = [&](Job& job) {
        absorb(r.state, job);
        if (job.dp_rank() != 0) return;
        r.mem = last.mem;
        r.comm_bytes = job.history().back().comm_bytes;
        r.step_ms = 1e300;
        for (const StepMetrics& m : job.history()) r.step_ms = std::min(r.step_ms, m.step_ms);
    };
    run_layout(c, {&last}, hooks);
    return r;
}

double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
    int layers = 2, dp = 4, steps = 3;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--layers" && i + 1 < argc) layers = std::atoi(argv[++i]);
        else if (a == "--dp" && i + 1 < argc) dp = std::atoi(argv[++i]);
        else if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
        else {
            std::fprintf(stderr, "usage: bench_layout [--layers L] [--dp N] [--steps S]\n");
            return 2;
        }
    }
    Config c = parse_config(default_config_toml(), "bench_layout");
    c.model.vocab = 50257;
    c.model.seq_len = 64;
    c.model.layers = layers;
    c.model.heads = 12;
    c.model.hidden = 768;
    c.model.ffn = 3072;
    c.train.batch_size = 2 * dp;
    c.train.steps = steps;
    c.train.eval_every = 0;
    c.train.warmup_steps = 1;
    c.data.markov_vocab = 64;
    c.output.run_file = false;
    c.layout.dp = dp;
    c.layout.timeout_s = 600;

    // Analytic sizes: P weights (flat arena), G gradient buffer (P + the LM head's wte part).
    const GPT probe(c.model, Numerics{});
    const double P = static_cast<double>(probe.table().total) * 4.0;
    const double G = static_cast<double>(probe.grad_layout().total) * 4.0;
    const double f = static_cast<double>(dp - 1) / dp;
    // ZeRO-2/3 reduce-scatter each unit's gradient as soon as its backward is done, rank 0
    // sending the other ranks' pieces: the whole buffer less its own (the shard and the head
    // entries that shadow its part of wte). ZeRO-2 all-gathers the weights after the update;
    // ZeRO-3 gathers each unit before it runs, forward and backward (the embedding's backward
    // reads no weights), as FSDP does. Rank 0 sends its part of each to n-1 ranks.
    const ZeroShards shards(probe, dp, 0);
    const TableEntry& wte = probe.table().entries[probe.table().wte];
    auto own = [&](i64 a, i64 b) {
        return static_cast<double>(std::max<i64>(0, std::min(b, shards.hi()) - std::max(a, shards.lo())));
    };
    const double GS0 = (own(0, probe.table().total) + own(wte.offset, wte.offset + wte.numel())) * 4.0;
    const double S0 = own(0, probe.table().total) * 4.0;
    double unit_gathers = 0;  // floats rank 0 contributes to one step's unit gathers
    auto gathers = [&](Unit u) {
        for (const GradSpan& g : probe.unit_params(u)) unit_gathers += own(g.lo, g.hi);
    };
    gathers({Unit::embedding});
    gathers({Unit::head});
    gathers({Unit::head});
    for (int l = 0; l < layers; l++) {
        gathers({Unit::block, l});
        gathers({Unit::block, l});
    }
    const double rs = G - GS0;
    const double own_ag = (dp - 1) * S0;
    const double unit_ag = (dp - 1) * unit_gathers * 4.0;
    std::printf("bench_layout: GPT-2 124M-shaped layers, L=%d, %.1fM params, dp=%d, B=%lld, T=64\n",
                layers, static_cast<double>(probe.num_params()) / 1e6, dp,
                static_cast<long long>(c.train.batch_size));
    std::printf("P = %.1f MiB of weights, G = %.1f MiB of gradient buffer (P + LM head's wte part)\n\n",
                mib(P), mib(G));

    int failures = 0;
    std::printf("ZeRO | sent/step/rank  analytic (formula)                 | memory/rank between steps: "
                "params grads optim | peak in step: params grads | ZeRO paper (fp32): params grads optim\n");
    LogicalState zero0;
    for (int zero = 0; zero <= 3; zero++) {
        c.layout.zero = zero;
        const Result r = run(c);
        double analytic = 0;
        const char* formula = "";
        switch (zero) {
        case 0: analytic = 2 * f * G; formula = "all-reduce 2(n-1)/n G"; break;
        case 1: analytic = 2 * f * G + own_ag; formula = "2(n-1)/n G + (n-1) S0"; break;
        case 2: analytic = rs + own_ag; formula = "(G - GS0) + (n-1) S0"; break;
        case 3: analytic = rs + unit_ag; formula = "(G - GS0) + (n-1) units' S0"; break;
        }
        const double paper_p = zero >= 3 ? P / dp : P, paper_g = zero >= 2 ? P / dp : P,
                     paper_o = zero >= 1 ? 2 * P / dp : 2 * P;
        std::printf("  %d  | %8.1f MiB  %8.1f MiB (%-26s) | %8.1f %8.1f %8.1f MiB | %8.1f %8.1f MiB "
                    "| %8.1f %8.1f %8.1f MiB\n",
                    zero, mib(r.comm_bytes), mib(analytic), formula, mib(r.mem.params),
                    mib(r.mem.grads), mib(r.mem.optimizer), mib(r.mem.peak_params),
                    mib(r.mem.peak_grads), mib(paper_p), mib(paper_g), mib(paper_o));
        // Metadata (losses, norm partials) and shard padding add a little; more is a bug.
        if (std::abs(r.comm_bytes - analytic) > 0.01 * analytic) {
            std::printf("FAIL: ZeRO-%d sent %.0f bytes, analytic %.0f\n", zero, r.comm_bytes, analytic);
            failures++;
        }
        if (zero == 0) zero0 = r.state;
        else if (zero0.params != r.state.params) {
            std::printf("FAIL: ZeRO-%d weights differ from ZeRO-0\n", zero);
            failures++;
        }
    }
    std::printf("\nZeRO-2/3 memory is measured (pages mapped, mincore): the shard between steps; during a\n"
                "step the shard plus the units in flight (a unit's full gradient until it is\n"
                "reduce-scattered, and under ZeRO-3 its gathered weights). Rank 0's gradient shard also\n"
                "holds the LM head's part of wte for its part of wte (the tied embedding's two halves).\n\n");

    // Tensor parallelism: per step, 4 all-reduces of a (B,T,C) activation per block (forward: the
    // attention and MLP row-parallel outputs; backward: the qkv and fc column-parallel input
    // gradients), plus the embedding's forward and the LM head's input gradient, each costing
    // 2(n-1)/n of its bytes per rank; the vocab-parallel softmax and the grad-norm partials are
    // small next to them.
    {
        Config t = c;
        t.layout.dp = 1;
        t.layout.zero = 0;
        t.train.batch_size = 2 * dp;
        std::printf("\ntensor parallelism, B=%lld T=64: all-reduces of (B,T,C) per step = 4L + 2 = %d\n",
                    static_cast<long long>(t.train.batch_size), 4 * layers + 2);
        for (int tp : {2, 4}) {
            t.layout.tp = tp;
            const Result r = run(t);
            const double act = static_cast<double>(t.train.batch_size) * 64 * 768 * 4.0;
            const double analytic = (4.0 * layers + 2) * 2.0 * (tp - 1) / tp * act;
            std::printf("  tp%d: sent/step/rank %8.1f MiB, Megatron's (4L+2)·2(n-1)/n·BTC %8.1f MiB "
                        "(measured/analytic %.2f) | memory/rank params %.1f MiB\n",
                        tp, mib(r.comm_bytes), mib(analytic), r.comm_bytes / analytic,
                        mib(r.mem.params));
            if (r.comm_bytes < analytic) {
                std::printf("FAIL: tp%d sent %.0f bytes, analytic %.0f\n", tp, r.comm_bytes, analytic);
                failures++;
            }
            if (zero0.params != r.state.params) {
                std::printf("FAIL: tp%d weights differ from dp's\n", tp);
                failures++;
            }
        }
        std::printf("  The excess is the price of exactness, mostly in the qkv input gradient: a rank's\n"
                    "  q, k and v rows are three ranges of the 3C reduction tree that are not nodes\n"
                    "  of it, so they travel as several node partials instead of one all-reduce\n"
                    "  (L=1 vs L=2 at tp2: +10.9 MiB per block, 7.3 x BTC instead of 4); the rest is\n"
                    "  the grad norm's block partials (1/64 of the sharded weights).\n\n");
    }

    // Collective cost: the same fast-mode step with canonical and with ring reductions.
    c.layout.zero = 0;
    c.numerics.mode = Mode::fast;
    double ms[2];
    for (int k = 0; k < 2; k++) {
        c.layout.comm = k == 0 ? "canonical" : "ring";
        ms[k] = run(c).step_ms;
    }
    std::printf("step time, fast kernels, dp=%d ZeRO-0: canonical collectives %.1f ms, ring %.1f ms "
                "(canonical/ring %.2f)\n", dp, ms[0], ms[1], ms[0] / ms[1]);

    // The replica check (validate.replica_check_every = 1, core/train/faults.h): every rank
    // hashes its weights after every step, the world all-gathers the hashes, and each agreeing
    // check copies the rank's weights and moments into its snapshot to re-run from. Measured as
    // whole-run wall time, since it runs after the step's own timing.
    c.numerics.mode = Mode::bitwise;
    c.layout.comm = "auto";
    double wall[2];
    LogicalState states[2];
    for (int k = 0; k < 2; k++) {
        c.validate.replica_check_every = k;
        const auto t0 = std::chrono::steady_clock::now();
        states[k] = run(c).state;
        wall[k] = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    std::printf("replica check every step, dp=%d ZeRO-0 (hash of %.1f MiB of weights, all-gather, "
                "snapshot of %.1f MiB): %.1f ms per check over a run of %.1f ms per step (%.1f%%)\n",
                dp, mib(P), mib(3 * P), (wall[1] - wall[0]) / steps, wall[0] / steps,
                100.0 * (wall[1] - wall[0]) / wall[0]);
    if (states[0].params.size() != states[1].params.size() ||
        std::memcmp(states[0].params.data(), states[1].params.data(),
                    states[0].params.size() * sizeof(float)) != 0) {
        std::printf("FAIL: the replica check changed the weights\n");
        failures++;
    }
    return failures == 0 ? 0 : 1;
}
