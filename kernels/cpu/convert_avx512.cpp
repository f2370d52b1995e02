// The AVX-512 Convert table (convert.h): dtype.cpp's casts, 16 lanes at a time, by integer bit
// manipulation, so every lane gives the scalar cast's bits. The tail runs the same code on a
// masked vector. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq; no std templates
// (matmul_kernels.h says why).
//
// Rounding to nearest even on the bits b of a finite |x|, dropping d mantissa bits:
//     (b + (2^(d-1) - 1) + ((b >> d) & 1)) with the low d bits cleared
// (a carry out of the mantissa moves into the exponent, as dtype.cpp's round_magnitude does).
// fp8's subnormal range (|y| below its smallest normal 2^emin) has a fixed quantum q = 2^(emin-m):
// there (|y| + 2^23·q) − 2^23·q rounds |y| to a multiple of q, nearest even, in two exact fp32
// operations (|y| < 2^23·q, so the sum's ulp is q). Saturation: anything that rounds above the
// largest finite value (infinity included) becomes it, since min(r, max) keeps the smaller.
#include "kernels/cpu/convert.h"

#include <immintrin.h>

// GCC 12's AVX-512 intrinsics initialise their "undefined" vectors from themselves, which
// -Wmaybe-uninitialized reports at every inlined use (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace px::cpu::avx512 {

namespace {

constexpr int W = 16;

inline __mmask16 first(i64 k) {
    return static_cast<__mmask16>(k >= W ? 0xFFFFu : (1u << k) - 1u);
}

inline __m512i ibits(__m512 v) {
    return _mm512_castps_si512(v);
}
inline __m512 fbits(__m512i v) {
    return _mm512_castsi512_ps(v);
}
inline __m512i iset(unsigned v) {
    return _mm512_set1_epi32(static_cast<int>(v));
}

constexpr float pow2(int e) {
    float p = 1.0f;
    for (; e > 0; e--) p *= 2.0f;
    for (; e < 0; e++) p *= 0.5f;
    return p;
}

// The bf16 code of each lane in its low 16 bits (f32_to_bf16).
inline __m512i bf16_code(__m512 x) {
    const __m512i b = ibits(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), iset(1));
    const __m512i r =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(b, iset(0x7FFF)), lsb), 16);
    // NaN: the top half with the quiet bit set (sign and payload kept).
    const __m512i q = _mm512_or_si512(_mm512_srli_epi32(b, 16), iset(0x40));
    return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), r, q);
}

// bf16 codes (low 16 bits of each lane) as fp32, a NaN made quiet (bf16_to_f32).
inline __m512 bf16_value(__m512i code) {
    const __m512 v = fbits(_mm512_slli_epi32(code, 16));
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v,
                                fbits(_mm512_or_si512(ibits(v), iset(0x00400000))));
}

void widen(float* dst, const std::uint16_t* src, i64 n) {
    for (i64 i = 0; i < n; i += W) {
        const __mmask16 m = first(n - i);
        const __m256i h = _mm256_maskz_loadu_epi16(m, src + i);
        _mm512_mask_storeu_ps(dst + i, m, bf16_value(_mm512_cvtepu16_epi32(h)));
    }
}

void narrow(std::uint16_t* dst, const float* src, i64 n) {
    for (i64 i = 0; i < n; i += W) {
        const __mmask16 m = first(n - i);
        _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, bf16_code(_mm512_maskz_loadu_ps(m, src + i)));
    }
}

void round(float* dst, const float* src, i64 n) {
    for (i64 i = 0; i < n; i += W) {
        const __mmask16 m = first(n - i);
        _mm512_mask_storeu_ps(dst + i, m, bf16_value(bf16_code(_mm512_maskz_loadu_ps(m, src + i))));
    }
}

// The running max of |x| over lanes that are not NaN (vmaxps returns its second operand when the
// first is NaN), and whether a lane is NaN.
inline __m512 absmax_step(__m512 acc, __m512 x, __mmask16 m, int* nan) {
    const __m512 a = fbits(_mm512_and_si512(ibits(x), iset(0x7FFFFFFF)));
    if (_mm512_mask_cmp_ps_mask(m, a, a, _CMP_UNORD_Q) != 0) *nan = 1;
    return _mm512_mask_max_ps(acc, m, a, acc);
}

// The largest lane (none is NaN). Stored and scanned: GCC 12's _mm512_reduce_max_ps trips the
// same bug as above under -Wuninitialized.
inline float hmax(__m512 v) {
    alignas(64) float l[W];
    _mm512_store_ps(l, v);
    float m = l[0];
    for (int i = 1; i < W; i++) m = l[i] > m ? l[i] : m;
    return m;
}

float absmax(const float* x, i64 n, int* nan) {
    __m512 acc = _mm512_setzero_ps();
    for (i64 i = 0; i < n; i += W) {
        const __mmask16 m = first(n - i);
        acc = absmax_step(acc, _mm512_maskz_loadu_ps(m, x + i), m, nan);
    }
    return hmax(acc);
}

// One fp8 format: M mantissa bits, smallest normal 2^EMIN, largest finite MAX.
template <int M, int EMIN>
inline __m512 fp8_value(__m512 y, float max) {
    constexpr int d = 23 - M;
    const __m512i b = ibits(y);
    const __m512i sign = _mm512_and_si512(b, iset(0x80000000u));
    const __m512i ab = _mm512_and_si512(b, iset(0x7FFFFFFFu));
    const __m512 ay = fbits(ab);
    // Normal range: round the mantissa to M bits.
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(ab, d), iset(1));
    const __m512i rn =
        _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(ab, iset((1u << (d - 1)) - 1u)), lsb),
                         iset(~((1u << d) - 1u)));
    // Subnormal range: multiples of 2^(EMIN - M).
    const __m512 big = _mm512_set1_ps(pow2(23 + EMIN - M));
    const __m512 rs = _mm512_sub_ps(_mm512_add_ps(ay, big), big);
    const __mmask16 sub = _mm512_cmp_ps_mask(ay, _mm512_set1_ps(pow2(EMIN)), _CMP_LT_OQ);
    __m512 r = _mm512_mask_blend_ps(sub, fbits(rn), rs);
    r = _mm512_min_ps(r, _mm512_set1_ps(max));  // saturate (r is not NaN here)
    const __m512i v = _mm512_or_si512(ibits(r), sign);
    // NaN: the format's NaN read back, a quiet NaN with the sign.
    const __m512i qnan = _mm512_or_si512(sign, iset(0x7FC00000u));
    return fbits(_mm512_mask_blend_epi32(_mm512_cmp_ps_mask(ay, ay, _CMP_UNORD_Q), v, qnan));
}

template <int M, int EMIN>
float quant(float* x, i64 n, float scale, float inv, float max, int* nan) {
    const __m512 s = _mm512_set1_ps(scale), iv = _mm512_set1_ps(inv);
    __m512 acc = _mm512_setzero_ps();
    for (i64 i = 0; i < n; i += W) {
        const __mmask16 m = first(n - i);
        const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
        acc = absmax_step(acc, v, m, nan);
        _mm512_mask_storeu_ps(x + i, m,
                              _mm512_mul_ps(fp8_value<M, EMIN>(_mm512_mul_ps(v, s), max), iv));
    }
    return hmax(acc);
}

// e4m3: 3 mantissa bits, smallest normal 2^-6, max 448. e5m2: 2 bits, 2^-14, max 57344.
float quant_e4m3(float* x, i64 n, float scale, float inv, int* nan) {
    return quant<3, -6>(x, n, scale, inv, 448.0f, nan);
}

float quant_e5m2(float* x, i64 n, float scale, float inv, int* nan) {
    return quant<2, -14>(x, n, scale, inv, 57344.0f, nan);
}

}  // namespace

const Convert convert{widen, narrow, round, absmax, quant_e4m3, quant_e5m2};

}  // namespace px::cpu::avx512
