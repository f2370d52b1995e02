// bench_ep: expert parallelism on in-process ranks for examples/moe-small.toml: per rank, the
// expert weights held and the ep group's all-to-all bytes per step against the formula
// (ep_comm_bytes: evenly spread routing, every slot kept), and the step time, at dp4 with
// ep = 1, 2 and 4; then the same with every token routed to every expert (top-k = E, dropless),
// where the routing is even by construction.
//
//   build/bench/bench_ep [--steps S] [--config FILE]
//
// Checks its results: every moe-small layout ends with the single device's weights and Adam
// moments bit for bit, and under even routing every rank's measured bytes equal the formula.
// Exits 1 when one does not. Times and the uneven rows' ratios are printed, never judged.
#include "core/base/config.h"
#include "core/io/state.h"
#include "core/model/model.h"
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
    double expert_bytes = 0;  // rank 0's stacked expert tensors
    double sent = 0, formula = 0;  // mean over ranks of the all-to-all bytes per step
    bool exact_bytes = true;       // every rank's bytes equal the formula
    double step_ms = 0;            // rank 0, best step
};

Result run(Config c) {
    Result r;
    int ranks = 0;
    RunHooks hooks;
    hooks.inspect = [&](Job& job) {
        absorb(r.state, job);
        const EpStats s = job.ep_stats();
        r.sent += s.comm_bytes_per_step;
        r.formula += s.comm_bytes_formula;
        r.exact_bytes = r.exact_bytes && s.comm_bytes_per_step == s.comm_bytes_formula;
        ranks++;
        if (job.dp_rank() != 0) return;
        for (const TableEntry& e : job.model().table().entries)
            if (GPT::expert_tensor(e)) r.expert_bytes += double(e.numel()) * sizeof(float);
        r.step_ms = 1e300;
        for (const StepMetrics& m : job.history()) r.step_ms = std::min(r.step_ms, m.step_ms);
    };
    run_layout(c, {}, hooks);
    r.sent /= ranks;
    r.formula /= ranks;
    return r;
}

bool same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
    i64 steps = 5;
    std::string file = "examples/moe-small.toml";
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i];
        if (a == "--steps") {
            steps = std::atoll(argv[i + 1]);
        } else if (a == "--config") {
            file = argv[i + 1];
        } else {
            std::fprintf(stderr, "usage: bench_ep [--steps S] [--config FILE]\n");
            return 2;
        }
    }
    Config c;
    try {
        c = load_config(file);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_ep: %s (run it from the repository root, or give --config)\n",
                     e.what());
        return 2;
    }
    c.train.steps = steps;
    c.train.eval_every = 0;
    c.train.threads = 1;
    c.output.run_file = false;
    c.layout.timeout_s = 600;

    std::printf("bench_ep: %s (E=%lld, top-%lld, C=%lld, moe_ffn %lld, batch %lld, T=%lld), %lld "
                "steps (best step shown), in-process ranks, 1 thread each\n\n",
                file.c_str(), static_cast<long long>(c.model.moe_experts),
                static_cast<long long>(c.model.moe_top_k),
                static_cast<long long>(c.model.hidden), static_cast<long long>(c.model.moe_ffn),
                static_cast<long long>(c.train.batch_size),
                static_cast<long long>(c.model.seq_len), static_cast<long long>(steps));
    std::printf("%-22s %14s %16s %16s %8s %10s %8s\n", "layout", "experts KiB", "a2a bytes/step",
                "(formula)", "ratio", "step ms", "vs ep1");
    bool ok = true;
    for (const bool even : {false, true}) {
        Config base = c;
        if (even) {  // every token to every expert: the formula's even spread, exactly
            base.model.moe_top_k = base.model.moe_experts;
            base.model.moe_capacity_factor = 0;
        }
        Config one = base;
        const LogicalState ref = run(one).state;
        double ep1_ms = 0;
        for (const int ep : {1, 2, 4}) {
            Config k = base;
            k.layout.dp = 4;
            k.layout.ep = ep;
            const Result r = run(k);
            if (ep == 1) ep1_ms = r.step_ms;
            const bool exact = same(ref.params, r.state.params) && same(ref.m, r.state.m) &&
                               same(ref.v, r.state.v);
            const std::string name =
                "dp4 ep" + std::to_string(ep) + (even ? " top-k=E" : "");
            std::printf("%-22s %14.1f %16.0f %16.0f %8.3f %10.1f %8.2f  %s%s\n", name.c_str(),
                        r.expert_bytes / 1024.0, r.sent, r.formula,
                        r.formula > 0 ? r.sent / r.formula : 0.0, r.step_ms, r.step_ms / ep1_ms,
                        exact ? "bit-identical" : "DIFFERS from the single device",
                        even && ep > 1 && !r.exact_bytes ? ", bytes differ from the formula" : "");
            ok = ok && exact && (!even || ep == 1 || r.exact_bytes);
        }
    }
    std::printf("\n%s\n", ok ? "every layout bit-identical to the single device; even routing "
                               "sends the formula's bytes exactly"
                             : "FAILED: see the rows above");
    return ok ? 0 : 1;
}
