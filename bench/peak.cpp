#include "bench/peak.h"

#include <omp.h>

#include <chrono>
#include <immintrin.h>

namespace px::bench {

namespace {

constexpr long kIters = 20'000'000;

// 12 independent accumulators hide the FMA latency on two FMA ports.
__attribute__((target("avx512f"))) float run_avx512(long iters) {
    __m512 acc[12];
    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_ps(static_cast<float>(i));
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 12; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
    __m512 s = acc[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, acc[i]);
    alignas(64) float out[16];
    _mm512_store_ps(out, s);
    return out[0] + out[15];
}

__attribute__((target("avx2,fma"))) float run_avx2(long iters) {
    __m256 acc[12];
    for (int i = 0; i < 12; i++) acc[i] = _mm256_set1_ps(static_cast<float>(i));
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (long it = 0; it < iters; it++)
        for (int i = 0; i < 12; i++) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
    __m256 s = acc[0];
    for (int i = 1; i < 12; i++) s = _mm256_add_ps(s, acc[i]);
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[7];
}

}  // namespace

double fp32_fma_peak_gflops(int threads, Isa isa) {
    const int lanes = isa == Isa::avx512 ? 16 : isa == Isa::avx2 ? 8 : 1;
    const long iters = isa == Isa::scalar ? kIters / 8 : kIters / (lanes / 4);
    volatile float sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
        float r = 0;
        if (isa == Isa::avx512) r = run_avx512(iters);
        else if (isa == Isa::avx2) r = run_avx2(iters);
        else {
            float acc[12] = {};
            for (long it = 0; it < iters; it++)
                for (int i = 0; i < 12; i++) acc[i] = __builtin_fmaf(acc[i], 0.999999f, 1e-7f);
            for (float x : acc) r += x;
        }
        sink = sink + r;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return 2.0 * 12.0 * lanes * static_cast<double>(iters) * threads / s / 1e9;
}

}  // namespace px::bench
