// The AVX-512 table: the vecmath templates on 16 floats (compiled with -mavx512f and friends).
#define PX_MATHFUN_NO_SCALAR
// GCC 12's AVX-512 intrinsics initialise their "undefined" vectors from themselves, which
// -Wmaybe-uninitialized reports at every inlined use (GCC bug 105593, fixed in GCC 13).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#define PX_VECMATH_IMPL
#include "kernels/cpu/vecmath.h"

#include <immintrin.h>

namespace px::cpu::avx512 {
namespace {

// Masks are k-registers; vmin/vmax keep the SSE semantics (second operand on NaN), as ScalarOps.
struct Ops {
    using F = __m512;
    using I = __m512i;
    using M = __mmask16;
    static constexpr int W = 16;
    static F set(float a) { return _mm512_set1_ps(a); }
    static I iset(int32_t a) { return _mm512_set1_epi32(a); }
    static F add(F a, F b) { return _mm512_add_ps(a, b); }
    static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
    static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    static F div(F a, F b) { return _mm512_div_ps(a, b); }
    static F sqrt(F a) { return _mm512_sqrt_ps(a); }
    static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static F min(F a, F b) { return _mm512_min_ps(a, b); }
    static F max(F a, F b) { return _mm512_max_ps(a, b); }
    static M lt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
    static M gt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
    static M eq(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ); }
    static M isnan(F a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
    static M mor(M a, M b) { return M(a | b); }
    static F select(M m, F a, F b) { return _mm512_mask_blend_ps(m, b, a); }
    static I ibits(F a) { return _mm512_castps_si512(a); }
    static F fbits(I a) { return _mm512_castsi512_ps(a); }
    static I iadd(I a, I b) { return _mm512_add_epi32(a, b); }
    static I isub(I a, I b) { return _mm512_sub_epi32(a, b); }
    static I iand(I a, I b) { return _mm512_and_si512(a, b); }
    static I ior(I a, I b) { return _mm512_or_si512(a, b); }
    template <int k>
    static I sra(I a) {
        return _mm512_srai_epi32(a, k);
    }
    template <int k>
    static I sll(I a) {
        return _mm512_slli_epi32(a, k);
    }
    static F cvt(I a) { return _mm512_cvtepi32_ps(a); }
    static M igt(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }
    static I iload(const int32_t* p) { return _mm512_loadu_si512(p); }
    static F load(const float* p) { return _mm512_loadu_ps(p); }
    static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
    static M first(i64 k) { return M((1u << k) - 1u); }
    static F load_n(const float* p, i64 k) { return _mm512_maskz_loadu_ps(first(k), p); }
    static void store_n(float* p, F v, i64 k) { _mm512_mask_storeu_ps(p, first(k), v); }
    static F gather(const float* base, I idx) { return _mm512_i32gather_ps(idx, base, 4); }
    static F mask_gather(const float* base, I idx, M m) {
        return _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, idx, base, 4);
    }
    static void transpose(F* r) {  // 16×16: unpack pairs, then quads, then 128-bit lanes twice
        F t[16], u[16];
        for (int i = 0; i < 16; i += 2) {
            t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 16; i += 4) {
            u[i] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
            u[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
            u[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
            u[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        // Now u[4q + c] holds in its 128-bit lane k column 4k + c of rows 4q..4q+3; two rounds of
        // 128-bit lane shuffles bring the four quarters of column j together in r[j].
        for (int i = 0; i < 4; i++) {
            t[i] = _mm512_shuffle_f32x4(u[i], u[i + 4], _MM_SHUFFLE(2, 0, 2, 0));
            t[i + 4] = _mm512_shuffle_f32x4(u[i], u[i + 4], _MM_SHUFFLE(3, 1, 3, 1));
            t[i + 8] = _mm512_shuffle_f32x4(u[i + 8], u[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
            t[i + 12] = _mm512_shuffle_f32x4(u[i + 8], u[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
        }
        for (int i = 0; i < 4; i++) {
            r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], _MM_SHUFFLE(2, 0, 2, 0));
            r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], _MM_SHUFFLE(3, 1, 3, 1));
            r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(2, 0, 2, 0));
            r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], _MM_SHUFFLE(3, 1, 3, 1));
        }
    }
};

}  // namespace

const VecMath table = impl::make_table<Ops>(Isa::avx512);

}  // namespace px::cpu::avx512
