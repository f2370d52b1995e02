// bench_attention: causal self-attention forward and backward (kernels/cpu/attention.cpp) on
// GPT-2's head shape, in each numerics mode, beside the machine's fp32 FMA peak measured in the
// same run.
//
//   build/bench/bench_attention [--reps N] [--threads N]
//
// Shapes: B=4, T=64 (bench_step's step: 12 such layers) and B=1, T=1024 (a long sequence, 16 key
// blocks of 64), C=768, NH=12. Prints the best of N repetitions per pass in ms, per GPT-2 step
// (×12 layers), and the causal FLOPs (the T·(T+1)/2 scores of each head, four matrix products in
// backward, two in forward) as GFLOP/s and a share of the peak.
//
// Checks its results: bitwise mode gives the same bits on every ISA path this CPU has and on 1
// and 2 threads; fast mode's output agrees with bitwise's within the any-order bound of its sums
// (a softmax over T keys, then Σ att·v with Σ att = 1): |Δ| <= 2·(T + HS)·2^-24·max|v|.
#include "bench/peak.h"
#include "core/base/wait_policy.h"
#include "kernels/cpu/cpu_kernels.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace px;

namespace {

struct Shape {
    i64 B, T, C, NH;
};

struct Buffers {
    std::vector<float> qkv, dout, out, pre, att, dqkv, dpre, datt;
    explicit Buffers(const Shape& s) {
        const i64 BT = s.B * s.T, TT = s.B * s.NH * s.T * s.T;
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        qkv.resize(BT * 3 * s.C);
        dout.resize(BT * s.C);
        for (float& x : qkv) x = u(rng);
        for (float& x : dout) x = u(rng);
        out.resize(BT * s.C);
        pre.resize(TT);
        att.resize(TT);
        dpre.resize(TT);
        datt.resize(TT);
        dqkv.resize(BT * 3 * s.C);
    }
    void forward(const Numerics& nx, const Shape& s) {
        cpu::attention_forward(nx, out.data(), pre.data(), att.data(), qkv.data(), s.B, s.T, s.C,
                               s.NH);
    }
    void backward(const Numerics& nx, const Shape& s) {
        std::fill(dqkv.begin(), dqkv.end(), 0.0f);
        cpu::attention_backward(nx, dqkv.data(), dpre.data(), datt.data(), dout.data(),
                                qkv.data(), att.data(), s.B, s.T, s.C, s.NH);
    }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double best_ms(int reps, const std::function<void()>& fn) {
    double best = 1e300;
    for (int r = 0; r < reps; r++) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        best = std::min(best, std::chrono::duration<double, std::milli>(
                                  std::chrono::steady_clock::now() - t0)
                                  .count());
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    px::openmp_passive_by_default(argv);  // as the trainer runs (core/base/wait_policy.h)
    int reps = 30, threads = 2;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--reps" && i + 1 < argc)
            reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--threads" && i + 1 < argc)
            threads = std::max(1, std::atoi(argv[++i]));
        else {
            std::fprintf(stderr, "usage: bench_attention [--reps N] [--threads N]\n");
            return 2;
        }
    }
    omp_set_num_threads(threads);
    const Isa best = detect_isa();
    const double peak = bench::fp32_fma_peak_gflops(threads, best);
    std::printf("bench_attention: %d threads, isa %s, fp32 FMA peak (measured) %.1f GFLOP/s\n",
                threads, isa_name(best), peak);
    std::printf("%-14s %-8s %9s %9s %14s %9s %7s\n", "shape", "mode", "fwd ms", "bwd ms",
                "x12 layers ms", "GFLOP/s", "%peak");
    int failures = 0;
    for (const Shape s : {Shape{4, 64, 768, 12}, Shape{1, 1024, 768, 12}}) {
        const i64 HS = s.C / s.NH, scores = s.B * s.NH * s.T * (s.T + 1) / 2;
        const double flops = 6.0 * 2.0 * double(scores) * double(HS);  // 2 fwd + 4 bwd products
        Buffers ref(s);
        Numerics bitwise;
        bitwise.mode = Mode::bitwise;
        bitwise.isa = best;
        ref.forward(bitwise, s);
        ref.backward(bitwise, s);
        for (Mode mode : {Mode::bitwise, Mode::fast}) {
            Numerics nx = bitwise;
            nx.mode = mode;
            Buffers b(s);
            const double f = best_ms(reps, [&] { b.forward(nx, s); });
            const double g = best_ms(reps, [&] { b.backward(nx, s); });
            std::printf("B=%-3lld T=%-6lld %-8s %9.3f %9.3f %14.1f %9.1f %6.1f%%\n",
                        static_cast<long long>(s.B), static_cast<long long>(s.T),
                        mode_name(mode), f, g, 12.0 * (f + g), flops / ((f + g) * 1e6),
                        100.0 * flops / ((f + g) * 1e6) / peak);
            if (mode == Mode::fast) {
                float vmax = 0.0f, diff = 0.0f;
                for (float x : b.qkv) vmax = std::max(vmax, std::fabs(x));  // v's third among them
                for (size_t i = 0; i < ref.out.size(); i++)
                    diff = std::max(diff, std::fabs(ref.out[i] - b.out[i]));
                const float bound = 2.0f * float(s.T + HS) * std::ldexp(1.0f, -24) * vmax;
                if (!(diff <= bound)) {
                    std::printf("FAIL: fast output differs from bitwise by %g (bound %g)\n",
                                double(diff), double(bound));
                    failures++;
                }
            }
        }
        // Bitwise: every ISA path and 1 thread give the reference's bits.
        std::vector<Isa> isas{Isa::scalar};
        if (best != Isa::scalar) isas.push_back(Isa::avx2);
        if (best == Isa::avx512) isas.push_back(Isa::avx512);
        for (Isa isa : isas)
            for (int t : {1, threads}) {
                omp_set_num_threads(t);
                Numerics nx = bitwise;
                nx.isa = isa;
                Buffers b(s);
                b.forward(nx, s);
                b.backward(nx, s);
                if (!same_bits(b.out, ref.out) || !same_bits(b.att, ref.att) ||
                    !same_bits(b.dqkv, ref.dqkv)) {
                    std::printf("FAIL: bitwise %s on %d thread(s) differs from %s on %d\n",
                                isa_name(isa), t, isa_name(best), threads);
                    failures++;
                }
            }
        omp_set_num_threads(threads);
    }
    std::printf(failures == 0 ? "checks passed: bitwise bit-identical across ISA paths and "
                                "thread counts, fast within the any-order bound of bitwise\n"
                              : "checks FAILED\n");
    return failures == 0 ? 0 : 1;
}
