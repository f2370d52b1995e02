// The AVX2 table: the vecmath templates on 8 floats (compiled with -mavx2 -mfma).
#define PX_MATHFUN_NO_SCALAR
#define PX_VECMATH_IMPL
#include "kernels/cpu/vecmath.h"

#include <immintrin.h>

namespace px::cpu::avx2 {
namespace {

// Masks are full-width float vectors (all ones per active lane), as blendv and gathers want.
struct Ops {
    using F = __m256;
    using I = __m256i;
    using M = __m256;
    static constexpr int W = 8;
    static F set(float a) { return _mm256_set1_ps(a); }
    static I iset(int32_t a) { return _mm256_set1_epi32(a); }
    static F add(F a, F b) { return _mm256_add_ps(a, b); }
    static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F div(F a, F b) { return _mm256_div_ps(a, b); }
    static F sqrt(F a) { return _mm256_sqrt_ps(a); }
    static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static F min(F a, F b) { return _mm256_min_ps(a, b); }  // a < b ? a : b
    static F max(F a, F b) { return _mm256_max_ps(a, b); }  // a > b ? a : b
    static M lt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
    static M gt(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
    static M eq(F a, F b) { return _mm256_cmp_ps(a, b, _CMP_EQ_OQ); }
    static M isnan(F a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
    static M mor(M a, M b) { return _mm256_or_ps(a, b); }
    static F select(M m, F a, F b) { return _mm256_blendv_ps(b, a, m); }
    static I ibits(F a) { return _mm256_castps_si256(a); }
    static F fbits(I a) { return _mm256_castsi256_ps(a); }
    static I iadd(I a, I b) { return _mm256_add_epi32(a, b); }
    static I isub(I a, I b) { return _mm256_sub_epi32(a, b); }
    static I iand(I a, I b) { return _mm256_and_si256(a, b); }
    static I ior(I a, I b) { return _mm256_or_si256(a, b); }
    template <int k>
    static I sra(I a) {
        return _mm256_srai_epi32(a, k);
    }
    template <int k>
    static I sll(I a) {
        return _mm256_slli_epi32(a, k);
    }
    static F cvt(I a) { return _mm256_cvtepi32_ps(a); }
    static M igt(I a, I b) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(a, b)); }
    static I iload(const int32_t* p) {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    }
    static F load(const float* p) { return _mm256_loadu_ps(p); }
    static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
    static I first(i64 k) {
        return _mm256_cmpgt_epi32(_mm256_set1_epi32(int32_t(k)),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }
    static F load_n(const float* p, i64 k) { return _mm256_maskload_ps(p, first(k)); }
    static void store_n(float* p, F v, i64 k) { _mm256_maskstore_ps(p, first(k), v); }
    static F gather(const float* base, I idx) { return _mm256_i32gather_ps(base, idx, 4); }
    static F mask_gather(const float* base, I idx, M m) {
        return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), base, idx, m, 4);
    }
    static void transpose(F* r) {  // 8×8: unpack pairs, then quads, then swap 128-bit halves
        F t[8], u[8];
        for (int i = 0; i < 8; i += 2) {
            t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
            t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
        }
        for (int i = 0; i < 8; i += 4) {
            u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
            u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
            u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
            u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
        }
        for (int i = 0; i < 4; i++) {
            r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
            r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
        }
    }
};

}  // namespace

const VecMath table = impl::make_table<Ops>(Isa::avx2);

}  // namespace px::cpu::avx2
