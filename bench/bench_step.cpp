// bench_step: one training step of GPT-2 124M (B=4, T=64) in each precision and numerics mode,
// side by side in one run, beside the machine's fp32 FMA peak measured in the same run.
//
//   build/bench/bench_step [--steps N] [--layers L] [--threads N] [--only NAME]
//
// Variants: fp32 fast, bf16 fast (which bf16 matmul path this CPU takes: kernels/cpu/
// matmul_bf16.h), fp8-delayed fast, fp32 bitwise, bf16 bitwise, fp8-delayed bitwise and fp8-block
// bitwise. One model per precision (the mode is a property of its numerics, switched between
// steps), and the variants take turns within each repetition so that a noisy host hits them
// alike; best and median of N steps each. Prints ms/step, the step's FLOP rate as a share of
// the measured peak, the bf16/fp32 speed-ups of fast mode and the bitwise/fast ratios.
//
// Beside the quiet steps, in the same run: the first step of a fresh fp32 model in each mode (the
// first thing the process does: arenas' first touch, kernels' one-time setup), against the
// steady step; and fp32 steps with a competing busy process pinned to one core (a shared host),
// against the quiet ones.
//
// Checks its results, from each model's initial weights (forward only, before any update):
//   * a bitwise forward repeated gives the same bits (fp32 and bf16);
//   * fp32 fast agrees with fp32 bitwise within fp32 rounding (|Δloss| <= 1e-5·loss);
//   * bf16 fast, and fp8-delayed fast, agree with bitwise of the same precision within the error
//     budget of that precision (validators/budget.h) on the B·T per-token losses as one tensor:
//     ‖fast − bitwise‖ <= max(q·√(k²+1)·σ̂, q·(k−1)·σ̂_p), σ̂ from another valid ordering (bitwise
//     with numerics.block = 128; ‖a − r‖/√2, floored at 2^-24·‖r‖) and σ̂_p = ‖r − fp32 bitwise‖.
#include "bench/peak.h"
#include "core/base/rng.h"
#include "core/base/wait_policy.h"
#include "core/model/fp8.h"
#include "core/model/model.h"
#include "core/model/optimizer.h"
#include "kernels/ops.h"
#include "validators/budget.h"

#include <omp.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

using namespace px;

namespace {

// One model in one precision: its weights, gradients, optimizer and fp8 scaling (if any).
struct StepRunner {
    GPT model;
    AdamW opt;
    Arena grads;
    std::shared_ptr<Fp8Scaling> fp8;
    std::vector<int> tokens, targets;
    i64 B, T;

    StepRunner(const ModelConfig& mc, const Numerics& nx, DType act, const std::string& recipe,
               i64 B_, i64 T_)
        : model(mc, nx, ModelPart::whole(mc), nullptr, act),
          opt(model),
          grads(bytes_of(DType::f32, model.grad_layout().total), Arena::Pages::now),
          B(B_),
          T(T_) {
        model.init_random(1337, 0.02);
        model.prepare(B, T);  // the activations made and mapped now, as the trainer does
        if (recipe != "off") {
            PrecisionConfig pc;
            pc.activations = "bf16";
            pc.fp8 = recipe;
            pc.fp8_keep_ends_bf16 = true;  // the usual recipe: first and last blocks in bf16
            fp8 = std::make_shared<Fp8Scaling>(mc, pc, 1, nx);
            model.set_fp8(fp8);
        }
        for (i64 i = 0; i < B * (T + 1); i++) {
            const int tok = static_cast<int>(uniform_at(42, 7, static_cast<u64>(i)) *
                                             static_cast<double>(mc.vocab));
            if (i % (T + 1) != T) tokens.push_back(tok);
            if (i % (T + 1) != 0) targets.push_back(tok);
        }
    }

    // The mean loss of a forward in mode m with canonical blocks of `block` (no update); the
    // per-token losses in *each when given.
    double loss(Mode m, std::vector<double>* each = nullptr, int block = 64) {
        model.numerics().mode = m;
        model.numerics().block = block;
        if (fp8) fp8->begin_step();
        model.forward(tokens.data(), targets.data(), B, T);
        const i64 n = B * T;
        model.numerics().block = 64;
        if (each) each->assign(model.losses(), model.losses() + n);
        return canonical_sum(model.losses(), n, 64) / static_cast<double>(n);
    }

    // Milliseconds per phase in the fastest step so far, per mode.
    struct Phases {
        double forward = 0, backward = 0, optimizer = 0, best = 1e300;
    } phases[2];

    // One optimizer step in mode m; returns its milliseconds.
    double step(Mode m, int t) {
        using clock = std::chrono::steady_clock;
        const auto ms = [](clock::time_point a, clock::time_point b) {
            return std::chrono::duration<double, std::milli>(b - a).count();
        };
        model.numerics().mode = m;
        const auto t0 = clock::now();
        if (fp8) fp8->begin_step();
        model.forward(tokens.data(), targets.data(), B, T);
        const auto t1 = clock::now();
        grads.zero();
        model.backward(grads.f32(), tokens.data(), targets.data(),
                       1.0f / static_cast<float>(B * T));
        model.combine_tied_grads(grads.f32());
        if (fp8) fp8->update();  // one device: its amaxes are the step's
        const auto t2 = clock::now();
        const float norm = global_grad_norm(model.numerics(), model, grads.f32());
        TrainConfig tc;
        opt.step(model, grads.f32(), norm, 6e-4f, t, tc);
        const auto t3 = clock::now();
        Phases& p = phases[m == Mode::fast ? 1 : 0];
        if (ms(t0, t3) < p.best) p = {ms(t0, t1), ms(t1, t2), ms(t2, t3), ms(t0, t3)};
        return ms(t0, t3);
    }
};

// A child process that spins on CPU 0 until killed: the competing load of a shared host. It is
// this program again (`--busy-cpu0`), started by posix_spawn, which shares the parent's memory
// until the exec instead of copying it: after a fork the parent's next writes would each copy
// a page of its several GB of arenas (the first contended step took ~8 s of it).
[[noreturn]] void spin_on_cpu0() {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    sched_setaffinity(0, sizeof one, &one);
    volatile unsigned long x = 0;
    for (;;) x = x + 1;
}

struct BusyNeighbour {
    pid_t pid = -1;
    BusyNeighbour() {
        char arg0[] = "bench_step", arg1[] = "--busy-cpu0";
        char* args[] = {arg0, arg1, nullptr};
        if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, args, environ) != 0) {
            std::fprintf(stderr, "bench_step: could not start the busy process; contended steps "
                                 "run quiet\n");
            pid = -1;
        }
    }
    ~BusyNeighbour() {
        if (pid <= 0) return;
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
    }
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

struct Variant {
    const char* name;
    StepRunner* runner;
    Mode mode;
    std::vector<double> ms;
};

}  // namespace

int main(int argc, char** argv) {
    if (argc == 2 && std::strcmp(argv[1], "--busy-cpu0") == 0) spin_on_cpu0();  // BusyNeighbour
    px::openmp_passive_by_default(argv);  // idle OpenMP threads sleep (core/base/wait_policy.h)
    int steps = 5;
    ModelConfig mc;
    mc.vocab = 50257;
    mc.seq_len = 64;
    mc.layers = 12;
    mc.heads = 12;
    mc.hidden = 768;
    mc.ffn = 3072;
    const i64 B = 4, T = 64;
    std::string only;  // time only the variants whose name contains it (e.g. "bf16 fast")
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--steps" && i + 1 < argc)
            steps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--layers" && i + 1 < argc) mc.layers = std::atoi(argv[++i]);
        else if (a == "--threads" && i + 1 < argc) omp_set_num_threads(std::atoi(argv[++i]));
        else if (a == "--only" && i + 1 < argc)
            only = argv[++i];
        else {
            std::fprintf(
                stderr, "usage: bench_step [--steps N] [--layers L] [--threads N] [--only NAME]\n");
            return 2;
        }
    }
    const int threads = omp_get_max_threads();
    const Numerics nx{Mode::bitwise, 64, detect_isa()};
    Numerics fast = nx;
    fast.mode = Mode::fast;

    // The first step of a fresh fp32 model, before anything else has run in this process.
    double first[2] = {0, 0};  // bitwise, fast
    for (const Mode m : {Mode::fast, Mode::bitwise}) {
        const auto t0 = std::chrono::steady_clock::now();
        StepRunner fresh(mc, nx, DType::f32, "off", B, T);
        const auto t1 = std::chrono::steady_clock::now();
        first[m == Mode::fast ? 1 : 0] = fresh.step(m, 1);
        const StepRunner::Phases& p = fresh.phases[m == Mode::fast ? 1 : 0];
        std::printf("first step, fp32 %s: %.1f ms = forward %.1f / backward %.1f / clip+AdamW %.1f "
                    "(the model's construction before it: %.1f ms)\n",
                    mode_name(m), first[m == Mode::fast ? 1 : 0], p.forward, p.backward,
                    p.optimizer, std::chrono::duration<double, std::milli>(t1 - t0).count());
    }

    StepRunner f32(mc, nx, DType::f32, "off", B, T), bf16(mc, nx, DType::bf16, "off", B, T),
        fp8d(mc, nx, DType::bf16, "delayed", B, T), fp8b(mc, nx, DType::bf16, "block", B, T);
    const double params = static_cast<double>(f32.model.num_params());
    const double flops = 6.0 * params * static_cast<double>(B * T) +
                         12.0 * static_cast<double>(mc.layers * B * T * T * mc.hidden);
    std::printf(
        "bench_step: GPT-2 shape L=%lld C=%lld V=%lld, %.1fM params, B=%lld T=%lld, "
        "%d threads, isa %s\n",
        static_cast<long long>(mc.layers), static_cast<long long>(mc.hidden),
        static_cast<long long>(mc.vocab), params / 1e6, static_cast<long long>(B),
        static_cast<long long>(T), threads, isa_name(nx.isa));
    std::printf("step FLOPs: %.1f GFLOP (6*params*tokens + attention)\n", flops / 1e9);
    std::printf("bf16 matmul (fast): %s\n",
                ops::matmul_path(fast, Device::cpu, DType::bf16).c_str());
    std::printf(
        "fp32 matmul (fast): %s; fp8 linears: vectorised casts, then the fp32 matmul of "
        "the mode (first and last blocks in bf16)\n",
        ops::matmul_path(fast, Device::cpu, DType::f32).c_str());

    // Results first, from the initial weights: determinism, and fast against bitwise.
    int failures = 0;
    const double l32 = f32.loss(Mode::bitwise), l32r = f32.loss(Mode::bitwise),
                 l32f = f32.loss(Mode::fast);
    std::vector<double> t32, t16, t16f, t16a, t8, t8f, t8a;
    f32.loss(Mode::bitwise, &t32);
    const double l16 = bf16.loss(Mode::bitwise, &t16), l16r = bf16.loss(Mode::bitwise),
                 l16f = bf16.loss(Mode::fast, &t16f);
    bf16.loss(Mode::bitwise, &t16a, 128);
    const double l8 = fp8d.loss(Mode::bitwise, &t8), l8f = fp8d.loss(Mode::fast, &t8f);
    fp8d.loss(Mode::bitwise, &t8a, 128);
    const double l8b = fp8b.loss(Mode::bitwise);
    if (l32 != l32r || l16 != l16r) {
        std::printf("FAIL: a bitwise forward repeated gives another loss\n");
        failures++;
    }
    if (std::abs(l32 - l32f) > 1e-5 * l32) {
        std::printf("FAIL: fp32 fast loss %.7f vs bitwise %.7f beyond fp32 rounding\n", l32f, l32);
        failures++;
    }
    auto dist = [](const std::vector<double>& a, const std::vector<double>& b) {
        double s = 0;
        for (size_t i = 0; i < a.size(); i++) s += (a[i] - b[i]) * (a[i] - b[i]);
        return std::sqrt(s);
    };
    auto within_precision = [&](const char* name, double bit, double fst,
                                const std::vector<double>& r, const std::vector<double>& c,
                                const std::vector<double>& alt) {
        const std::vector<double> zero(r.size(), 0.0);
        const double sigma = std::max(dist(alt, r) / std::sqrt(2.0), kFp32Unit * dist(r, zero));
        const double sigma_p = dist(r, t32);
        const double budget =
            std::max(budget_multiplier() * sigma, precision_multiplier() * sigma_p);
        const double err = dist(c, r);
        const bool ok = err <= budget;
        std::printf("check: %s loss bitwise %.6f fast %.6f; per-token losses |fast - bitwise| "
                    "%.2e, sigma %.2e, sigma_p %.2e, budget %.2e (ratio %.3f): %s\n",
                    name, bit, fst, err, sigma, sigma_p, budget, err / budget,
                    ok ? "within" : "FAIL, over budget");
        failures += ok ? 0 : 1;
    };
    std::printf(
        "check: bitwise repeats identical (fp32, bf16); fp32 loss bitwise %.6f fast %.6f "
        "(|diff| %.2e)\n",
        l32, l32f, std::abs(l32 - l32f));
    within_precision("bf16", l16, l16f, t16, t16f, t16a);
    within_precision("fp8-delayed", l8, l8f, t8, t8f, t8a);
    std::printf("check: fp8-block bitwise loss %.6f (fp32 %.6f)\n", l8b, l32);

    std::vector<Variant> vs = {{"fp32 fast", &f32, Mode::fast, {}},
                               {"bf16 fast", &bf16, Mode::fast, {}},
                               {"fp8-delayed fast", &fp8d, Mode::fast, {}},
                               {"fp32 bitwise", &f32, Mode::bitwise, {}},
                               {"bf16 bitwise", &bf16, Mode::bitwise, {}},
                               {"fp8-delayed bitwise", &fp8d, Mode::bitwise, {}},
                               {"fp8-block bitwise", &fp8b, Mode::bitwise, {}}};
    if (!only.empty()) {
        std::erase_if(vs, [&](const Variant& v) {
            return std::string(v.name).find(only) == std::string::npos;
        });
        if (vs.empty()) {
            std::fprintf(stderr, "bench_step: no variant matches --only %s\n", only.c_str());
            return 2;
        }
    }
    for (Variant& v : vs) v.runner->step(v.mode, 1);  // warm: buffers, primitives, page faults
    for (StepRunner* r : {&f32, &bf16, &fp8d, &fp8b})
        for (auto& p : r->phases) p.best = 1e300;
    std::vector<double> peaks;
    for (int s = 0; s < steps; s++) {
        peaks.push_back(bench::fp32_fma_peak_gflops(threads, nx.isa));
        for (Variant& v : vs) v.ms.push_back(v.runner->step(v.mode, s + 2));
    }
    // fp32 steps with a busy process pinned to core 0, taking turns like the quiet ones.
    std::vector<Variant> contended;
    for (const Variant& v : vs)
        if (v.runner == &f32) contended.push_back({v.name, v.runner, v.mode, {}});
    {
        const BusyNeighbour busy;
        for (int s = 0; s < steps; s++)
            for (Variant& v : contended) v.ms.push_back(v.runner->step(v.mode, steps + s + 2));
    }
    const double peak = *std::max_element(peaks.begin(), peaks.end());
    std::printf("fp32 FMA peak (measured, %d threads): %.1f GFLOP/s (median %.1f)\n", threads, peak,
                median(peaks));
    std::printf("%-20s %10s %10s %10s %8s   %s\n", "variant", "best ms", "median ms", "GFLOP/s",
                "%peak", "best step: forward / backward / clip+AdamW ms");
    for (const Variant& v : vs) {
        const double best = *std::min_element(v.ms.begin(), v.ms.end());
        const StepRunner::Phases& p = v.runner->phases[v.mode == Mode::fast ? 1 : 0];
        std::printf("%-20s %10.1f %10.1f %10.1f %7.1f%%   %.1f / %.1f / %.1f\n", v.name, best,
                    median(v.ms), flops / best / 1e6, 100.0 * flops / best / 1e6 / peak, p.forward,
                    p.backward, p.optimizer);
    }
    for (const Variant& c : contended) {
        const auto q = std::find_if(vs.begin(), vs.end(),
                                    [&](const Variant& v) { return v.name == c.name; });
        const double quiet = *std::min_element(q->ms.begin(), q->ms.end());
        const double first_ms = first[c.mode == Mode::fast ? 1 : 0];
        std::printf(
            "%-20s first step %.1f ms = %.2fx the steady best; with a busy process on core 0: "
            "best %.1f ms, median %.1f, worst %.1f (median %.2fx the quiet median)\n",
            c.name, first_ms, first_ms / quiet, *std::min_element(c.ms.begin(), c.ms.end()),
            median(c.ms), *std::max_element(c.ms.begin(), c.ms.end()),
            median(c.ms) / median(q->ms));
    }
    if (vs.size() < 7) return failures == 0 ? 0 : 1;  // --only: no ratios
    auto med = [&](int i) { return median(vs[static_cast<size_t>(i)].ms); };
    auto best = [&](int i) {
        return *std::min_element(vs[static_cast<size_t>(i)].ms.begin(),
                                 vs[static_cast<size_t>(i)].ms.end());
    };
    std::printf("bf16 fast vs fp32 fast: %.2fx faster (best), %.2fx (median)\n", best(0) / best(1),
                med(0) / med(1));
    std::printf("fp8-delayed fast vs fp32 fast: %.2fx (best), %.2fx (median)\n", best(0) / best(2),
                med(0) / med(2));
    std::printf("bitwise / fast throughput: fp32 %.2f, bf16 %.2f, fp8-delayed %.2f (median)\n",
                med(0) / med(3), med(1) / med(4), med(2) / med(5));
    std::printf(
        "bitwise step vs fp32 bitwise (median): bf16 %.2fx, fp8-delayed %.2fx, fp8-block "
        "%.2fx the time\n",
        med(4) / med(3), med(5) / med(3), med(6) / med(3));
    return failures == 0 ? 0 : 1;
}
