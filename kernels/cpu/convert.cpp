// The scalar Convert table (core/base/dtype.h's conversions, one element at a time: the reference
// the AVX-512 table is tested against), the dispatcher, and the threaded routines of casts.h.
#include "core/base/error.h"
#include "kernels/cpu/casts.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace px::cpu {

namespace scalar {
namespace {

void widen(float* dst, const std::uint16_t* src, i64 n) {
    for (i64 i = 0; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

void narrow(std::uint16_t* dst, const float* src, i64 n) {
    for (i64 i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}

void round(float* dst, const float* src, i64 n) {
    for (i64 i = 0; i < n; i++) dst[i] = bf16_to_f32(f32_to_bf16(src[i]));
}

// std::max(m, a) keeps m when a is NaN (a comparison with NaN is false).
float absmax(const float* x, i64 n, int* nan) {
    float m = 0.0f;
    for (i64 i = 0; i < n; i++) {
        const float a = std::fabs(x[i]);
        if (std::isnan(a)) *nan = 1;
        m = std::max(m, a);
    }
    return m;
}

float quant_e4m3(float* x, i64 n, float scale, float inv, int* nan) {
    const float m = absmax(x, n, nan);
    for (i64 i = 0; i < n; i++) x[i] = e4m3_to_f32(f32_to_e4m3(x[i] * scale)) * inv;
    return m;
}

float quant_e5m2(float* x, i64 n, float scale, float inv, int* nan) {
    const float m = absmax(x, n, nan);
    for (i64 i = 0; i < n; i++) x[i] = e5m2_to_f32(f32_to_e5m2(x[i] * scale)) * inv;
    return m;
}

}  // namespace

const Convert convert{widen, narrow, round, absmax, quant_e4m3, quant_e5m2};

}  // namespace scalar

const Convert& convert_for(Isa isa) {
    static const Isa best = detect_isa();
    if (static_cast<int>(isa) > static_cast<int>(best))
        throw Error(std::string("numerics.isa = ") + isa_name(isa) +
                    " is not supported by this CPU (best: " + isa_name(best) + ")");
    return isa == Isa::avx512 ? avx512::convert : scalar::convert;
}

namespace {

// f(lo, hi) over [0, n) in chunks of whole vectors, on the threads when n is large.
template <class F>
void chunked(i64 n, F f) {
    constexpr i64 kChunk = 1 << 14;
    const i64 nc = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n >= (i64{1} << 16))
    for (i64 c = 0; c < nc; c++) f(c * kChunk, std::min(n, (c + 1) * kChunk));
}

}  // namespace

void widen_bf16(Isa isa, float* dst, const std::uint16_t* src, i64 n) {
    const Convert& cv = convert_for(isa);
    chunked(n, [&](i64 lo, i64 hi) { cv.widen_bf16(dst + lo, src + lo, hi - lo); });
}

void narrow_bf16(Isa isa, std::uint16_t* dst, const float* src, i64 n) {
    const Convert& cv = convert_for(isa);
    chunked(n, [&](i64 lo, i64 hi) { cv.narrow_bf16(dst + lo, src + lo, hi - lo); });
}

void round_bf16(Isa isa, float* dst, const float* src, i64 n) {
    const Convert& cv = convert_for(isa);
    chunked(n, [&](i64 lo, i64 hi) { cv.round_bf16(dst + lo, src + lo, hi - lo); });
}

float fake_quant(Isa isa, float* x, i64 n, DType t, float scale, float inv, bool* nan) {
    PX_ASSERT(t == DType::e4m3 || t == DType::e5m2, "fake_quant to a type that is not fp8");
    const Convert& cv = convert_for(isa);
    const auto quant = t == DType::e4m3 ? cv.quant_e4m3 : cv.quant_e5m2;
    float amax = 0.0f;
    int any_nan = 0;
    constexpr i64 kChunk = 1 << 14;
    const i64 nc = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) reduction(max     \
                                                    : amax) \
    reduction(|                                             \
              : any_nan) if (n >= (i64{1} << 16))
    for (i64 c = 0; c < nc; c++) {
        const i64 lo = c * kChunk, hi = std::min(n, lo + kChunk);
        amax = std::max(amax, quant(x + lo, hi - lo, scale, inv, &any_nan));
    }
    *nan = any_nan != 0;
    return amax;
}

void fake_quant_tiles(Isa isa, float* x, i64 R, i64 K, i64 band, i64 b) {
    PX_ASSERT(band >= 1 && b >= 1, "fake_quant_tiles with an empty tile");
    const Convert& cv = convert_for(isa);
    const i64 bands = (R + band - 1) / band, tiles = K > 0 ? (K + b - 1) / b : 0;
#pragma omp parallel for schedule(static)
    for (i64 t = 0; t < bands * tiles; t++) {
        const i64 r0 = (t / tiles) * band, r1 = std::min(R, r0 + band);
        const i64 c0 = (t % tiles) * b, w = std::min(K, c0 + b) - c0;
        float amax = 0.0f;
        int nan = 0;
        for (i64 i = r0; i < r1; i++) amax = std::max(amax, cv.absmax(x + i * K + c0, w, &nan));
        float s = kE4M3Max / amax;
        if (!(amax > 0.0f) || nan != 0 || std::isinf(amax) || !std::isfinite(s)) s = 1.0f;
        const float inv = 1.0f / s;
        for (i64 i = r0; i < r1; i++) cv.quant_e4m3(x + i * K + c0, w, s, inv, &nan);
    }
}

}  // namespace px::cpu
