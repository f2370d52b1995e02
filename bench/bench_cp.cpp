// bench_cp: context parallelism on in-process ranks for one long sequence length: per rank, the
// activation memory and the attention's share of it at cp = 1, 2 and 4, the bytes sent in the cp
// group per step against cp_costs' formulas, and the step time of ring and Ulysses attention
// against the single device.
//
//   build/bench/bench_cp [--seq T] [--layers L] [--steps S] [--batch B]
//
// Checks its results: every layout ends with the single device's weights and Adam moments, bit
// for bit, and every rank's measured cp traffic and attention memory equal the formulas. Exits 1
// when one does not. Times are printed, never judged.
#include "core/base/config.h"
#include "core/io/state.h"
#include "core/train/job.h"
#include "core/train/runner.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace px;

namespace {

struct Result {
    LogicalState state;
    double act_bytes = 0;  // rank 0's activation sets
    CpStats cp;            // rank 0's
    bool formulas = true;  // every rank's measured cp costs equal the formulas
    double step_ms = 0;    // rank 0, best step
};

Result run(Config c) {
    Result r;
    RunHooks hooks;
    hooks.inspect = [&](Job& job) {
        absorb(r.state, job);
        const CpStats s = job.cp_stats();
        if (s.cp > 1)
            r.formulas = r.formulas && s.comm_bytes_per_step == s.comm_bytes_formula &&
                         s.attention_bytes == s.attention_bytes_formula;
        if (job.cp_rank() != 0) return;
        r.act_bytes = static_cast<double>(job.pipeline().activation_bytes());
        r.cp = s;
        r.step_ms = 1e300;
        for (const StepMetrics& m : job.history()) r.step_ms = std::min(r.step_ms, m.step_ms);
    };
    run_layout(c, {}, hooks);
    return r;
}

double mib(double bytes) {
    return bytes / (1024.0 * 1024.0);
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
    i64 T = 1024, L = 2, steps = 3, B = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        const i64 v = std::atoll(argv[i + 1]);
        if (a == "--seq")
            T = v;
        else if (a == "--layers")
            L = v;
        else if (a == "--steps")
            steps = v;
        else if (a == "--batch")
            B = v;
        else {
            std::fprintf(stderr,
                         "usage: bench_cp [--seq T] [--layers L] [--steps S] [--batch B]\n");
            return 2;
        }
    }
    Config c = parse_config(default_config_toml(), "bench_cp");
    c.model.vocab = 64;
    c.model.seq_len = T;
    c.model.layers = L;
    c.model.heads = 4;
    c.model.hidden = 128;
    c.model.ffn = 512;
    c.data.source = "copy";
    c.data.copy_distance = T * 3 / 4;
    c.train.batch_size = B;
    c.train.steps = steps;
    c.train.warmup_steps = 1;
    c.train.eval_every = 0;
    c.output.run_file = false;
    c.numerics.block = 32;
    c.layout.timeout_s = 600;

    std::printf(
        "bench_cp: T=%lld, L=%lld, C=128, NH=4, batch %lld, %lld steps (best step "
        "shown), in-process ranks\n\n",
        static_cast<long long>(T), static_cast<long long>(L), static_cast<long long>(B),
        static_cast<long long>(steps));
    std::printf("%-14s %12s %14s %14s %16s %16s %10s %8s\n", "layout", "act MiB/rank",
                "attention MiB", "(formula)", "cp bytes/step", "(formula)", "step ms", "vs 1");
    const Result ref = run(c);
    std::printf("%-14s %12.2f %14s %14s %16s %16s %10.1f %8.2f\n", "single device",
                mib(ref.act_bytes), "-", "-", "-", "-", ref.step_ms, 1.0);
    bool ok = true;
    for (const char* method : {"ring", "ulysses"})
        for (int cp : {2, 4}) {
            Config k = c;
            k.layout.cp = cp;
            k.layout.cp_method = method;
            const Result r = run(k);
            const bool exact = same(ref.state.params, r.state.params) &&
                               same(ref.state.m, r.state.m) && same(ref.state.v, r.state.v);
            const std::string name = "cp" + std::to_string(cp) + " " + method;
            std::printf("%-14s %12.2f %14.2f %14.2f %16.0f %16.0f %10.1f %8.2f  %s%s\n",
                        name.c_str(), mib(r.act_bytes), mib(r.cp.attention_bytes),
                        mib(r.cp.attention_bytes_formula), r.cp.comm_bytes_per_step,
                        r.cp.comm_bytes_formula, r.step_ms, r.step_ms / ref.step_ms,
                        exact ? "bit-identical" : "DIFFERS from the single device",
                        r.formulas ? "" : ", costs differ from the formulas");
            ok = ok && exact && r.formulas;
        }
    std::printf("\n%s\n", ok ? "every layout bit-identical to the single device; costs as the "
                               "formulas say"
                             : "FAILED: see the rows above");
    return ok ? 0 : 1;
}
