// bench_step: one training step of GPT-2 124M (B=4, T=64, fp32) in fast and bitwise mode,
// beside the machine's fp32 FMA peak measured in the same run.
//
//   build/bench/bench_step [--steps N] [--layers L] [--threads N]
//
// Prints ms/step for each mode (best and median of N, the modes alternating so that a noisy
// host hits both alike), the step's FLOP rate as a share of the measured peak, and the
// bitwise/fast ratio. Checks its results: two bitwise steps from the same state give the same
// bits, and the fast loss agrees with the bitwise loss within fp32 rounding.
#include "bench/peak.h"
#include "core/model/model.h"
#include "core/model/optimizer.h"
#include "core/base/rng.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

using namespace px;

namespace {

struct StepRunner {
    GPT model;
    AdamW opt;
    Arena grads;
    std::vector<int> tokens, targets;
    i64 B, T;

    StepRunner(const ModelConfig& mc, const Numerics& nx, i64 B_, i64 T_)
        : model(mc, nx),
          opt(model),
          grads(bytes_of(DType::f32, model.grad_layout().total)),
          B(B_),
          T(T_) {
        model.init_random(1337, 0.02);
        for (i64 i = 0; i < B * (T + 1); i++) {
            const int tok = static_cast<int>(uniform_at(42, 7, static_cast<u64>(i)) * static_cast<double>(mc.vocab));
            if (i % (T + 1) != T) tokens.push_back(tok);
            if (i % (T + 1) != 0) targets.push_back(tok);
        }
    }

    // Milliseconds spent per phase in the fastest step so far.
    double ms_forward = 0, ms_backward = 0, ms_optimizer = 0, ms_best = 1e300;

    // One optimizer step; returns the mean loss.
    double step(int t) {
        using clock = std::chrono::steady_clock;
        const auto ms = [](clock::time_point a, clock::time_point b) {
            return std::chrono::duration<double, std::milli>(b - a).count();
        };
        const auto t0 = clock::now();
        model.forward(tokens.data(), targets.data(), B, T);
        const i64 n = B * T;
        const double loss = canonical_sum(model.losses(), n, model.numerics().block) / static_cast<double>(n);
        const auto t1 = clock::now();
        grads.zero();
        model.backward(grads.f32(), tokens.data(), targets.data(), 1.0f / static_cast<float>(n));
        model.combine_tied_grads(grads.f32());
        const auto t2 = clock::now();
        const float norm = global_grad_norm(model.numerics(), model, grads.f32());
        TrainConfig tc;
        opt.step(model, grads.f32(), norm, 6e-4f, t, tc);
        const auto t3 = clock::now();
        if (ms(t0, t3) < ms_best) {
            ms_best = ms(t0, t3);
            ms_forward = ms(t0, t1);
            ms_backward = ms(t1, t2);
            ms_optimizer = ms(t2, t3);
        }
        return loss;
    }
};

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    int steps = 5;
    ModelConfig mc;
    mc.vocab = 50257;
    mc.seq_len = 64;
    mc.layers = 12;
    mc.heads = 12;
    mc.hidden = 768;
    mc.ffn = 3072;
    const i64 B = 4, T = 64;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
        else if (a == "--layers" && i + 1 < argc) mc.layers = std::atoi(argv[++i]);
        else if (a == "--threads" && i + 1 < argc) omp_set_num_threads(std::atoi(argv[++i]));
        else {
            std::fprintf(stderr, "usage: bench_step [--steps N] [--layers L] [--threads N]\n");
            return 2;
        }
    }
    const int threads = omp_get_max_threads();
    Numerics bitwise{Mode::bitwise, 64, detect_isa()};
    Numerics fast{Mode::fast, 64, detect_isa()};

    StepRunner rb(mc, bitwise, B, T), rf(mc, fast, B, T), check(mc, bitwise, B, T);
    const double params = static_cast<double>(rb.model.num_params());
    const double flops = 6.0 * params * static_cast<double>(B * T) +
                         12.0 * static_cast<double>(mc.layers * B * T * T * mc.hidden);
    std::printf("bench_step: GPT-2 shape L=%lld C=%lld V=%lld, %.1fM params, B=%lld T=%lld, "
                "%d threads, isa %s\n",
                static_cast<long long>(mc.layers), static_cast<long long>(mc.hidden),
                static_cast<long long>(mc.vocab), params / 1e6, static_cast<long long>(B),
                static_cast<long long>(T), threads, isa_name(bitwise.isa));
    std::printf("step FLOPs: %.1f GFLOP (6*params*tokens + attention)\n", flops / 1e9);

    // Results first: determinism and agreement between the modes.
    int failures = 0;
    const double lb = rb.step(1), lc = check.step(1), lf = rf.step(1);
    if (std::memcmp(rb.model.params(), check.model.params(),
                    static_cast<size_t>(rb.model.table().total) * sizeof(float)) != 0 || lb != lc) {
        std::printf("FAIL: two bitwise steps from the same state differ\n");
        failures++;
    }
    if (std::abs(lb - lf) > 1e-5 * lb) {
        std::printf("FAIL: fast loss %.7f vs bitwise %.7f beyond fp32 rounding\n", lf, lb);
        failures++;
    }
    std::printf("check: bitwise repeat identical, loss bitwise %.6f fast %.6f (|diff| %.2e)\n", lb,
                lf, std::abs(lb - lf));

    for (StepRunner* r : {&rb, &rf}) r->ms_best = 1e300;
    std::vector<double> tb, tf, peaks;
    for (int s = 0; s < steps; s++) {
        peaks.push_back(bench::fp32_fma_peak_gflops(threads, bitwise.isa));
        for (int mode = 0; mode < 2; mode++) {
            StepRunner& r = mode == 0 ? rf : rb;
            const auto t0 = std::chrono::steady_clock::now();
            r.step(s + 2);
            const double ms =
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
            (mode == 0 ? tf : tb).push_back(ms);
        }
    }
    const double peak = *std::max_element(peaks.begin(), peaks.end());
    auto report = [&](const char* name, const std::vector<double>& t) {
        const double best = *std::min_element(t.begin(), t.end());
        std::printf("%-8s best %8.1f ms/step  median %8.1f  -> %6.1f GFLOP/s = %5.1f%% of peak\n",
                    name, best, median(t), flops / best / 1e6, 100.0 * flops / best / 1e6 / peak);
        return best;
    };
    std::printf("fp32 FMA peak (measured, %d threads): %.1f GFLOP/s (median %.1f)\n", threads, peak,
                median(peaks));
    const double bf = report("fast", tf);
    const auto phases = [&](const char* name, const StepRunner& r) {
        std::printf("%-8s best step: forward %.1f ms, backward %.1f ms, clip+AdamW %.1f ms\n", name,
                    r.ms_forward, r.ms_backward, r.ms_optimizer);
    };
    const double bb = report("bitwise", tb);
    phases("fast", rf);
    phases("bitwise", rb);
    std::printf("bitwise / fast throughput: %.2f (best), %.2f (median)\n", bf / bb,
                median(tf) / median(tb));
    return failures == 0 ? 0 : 1;
}
