// AVX2 path of the canonical GEMM (matmul.cpp has the driver and the contract).
//
// Each zmm lane is one output column j running the same scalar sequence as the scalar path:
// acc = fma(a[i][k], b[k][j], acc) over a block, blocks merged left + right in the canonical tree.
// So this path is bit-identical to the scalar and AVX-512 paths; only the register blocking differs.
//
// Compiled with -mavx2 -mfma. Everything lives in px::cpu::avx2 and uses no std templates, so no
// inline function compiled here can be merged into code that runs on a CPU without AVX2.
#include "kernels/cpu/matmul_kernels.h"

#include <immintrin.h>

namespace px::cpu::avx2 {

namespace {

// 6×16 tile: 12 ymm accumulators, 2 for the B row, 1 broadcast = 15 of 16 registers.
constexpr int MR = 6;
constexpr int NV = 2;
constexpr int NR = NV * 8;

// ap (klen,MR), bp (klen,NR); see TileFn.
void tile(const float* ap, const float* bp, i64 klen, i64 kb, const unsigned char* merges,
          float* stack, int sp) {
    constexpr int T = MR * NR;
    for (i64 k0 = 0; k0 < klen; k0 += kb) {
        const i64 n = klen - k0 < kb ? klen - k0 : kb;
        __m256 acc[MR][NV];
#pragma GCC unroll 32
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm256_setzero_ps();
        for (i64 k = 0; k < n; k++) {
            __m256 b[NV];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) b[v] = _mm256_loadu_ps(bp + v * 8);
#pragma GCC unroll 32
            for (int r = 0; r < MR; r++) {
                const __m256 a = _mm256_set1_ps(ap[r]);
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
            }
            ap += MR;
            bp += NR;
        }
        // Merge with finished left siblings: node = left + right, left is lower on the stack.
        for (int m = *merges++; m > 0; m--) {
            sp--;
            const float* s = stack + sp * T;
#pragma GCC unroll 32
            for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++)
                    acc[r][v] = _mm256_add_ps(_mm256_loadu_ps(s + r * NR + v * 8), acc[r][v]);
        }
        float* s = stack + sp * T;
#pragma GCC unroll 32
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) _mm256_storeu_ps(s + r * NR + v * 8, acc[r][v]);
        sp++;
    }
}

// 8×8 transpose of rows s[0..8) at column k into d[0..8) (d[i] gets element k+i of every row).
// Inserting the upper 128-bit halves from memory keeps the shuffle port to 16 ops per 64 floats.
inline void transpose8(const float* const* s, i64 k, float* d, i64 dstride) {
    __m256 r[8];
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(s[i] + k)),
                                    _mm_loadu_ps(s[i + 4] + k), 1);
        r[i + 4] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(s[i] + k + 4)),
                                        _mm_loadu_ps(s[i + 4] + k + 4), 1);
    }
    for (int h = 0; h < 2; h++) {
        const __m256 t0 = _mm256_unpacklo_ps(r[4 * h + 0], r[4 * h + 1]);
        const __m256 t1 = _mm256_unpackhi_ps(r[4 * h + 0], r[4 * h + 1]);
        const __m256 t2 = _mm256_unpacklo_ps(r[4 * h + 2], r[4 * h + 3]);
        const __m256 t3 = _mm256_unpackhi_ps(r[4 * h + 2], r[4 * h + 3]);
        float* o = d + 4 * h * dstride;
        _mm256_storeu_ps(o + 0 * dstride, _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)));
        _mm256_storeu_ps(o + 1 * dstride, _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)));
        _mm256_storeu_ps(o + 2 * dstride, _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)));
        _mm256_storeu_ps(o + 3 * dstride, _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)));
    }
}

// dst (klen,W) from src; see PackFn.
void pack(float* dst, const float* src, i64 ls, i64 ks, int lanes, int W, i64 klen) {
    if (ls == 1) {
        // Lanes contiguous (e.g. the B operand of dinp): masked row copies, zero fill past lanes.
        for (i64 k = 0; k < klen; k++) {
            const float* s = src + k * ks;
            float* d = dst + k * W;
            int l = 0;
            for (; l + 8 <= lanes && l + 8 <= W; l += 8) _mm256_storeu_ps(d + l, _mm256_loadu_ps(s + l));
            for (; l < W; l++) d[l] = l < lanes ? s[l] : 0.0f;
        }
        return;
    }
    int l = 0;
    i64 k = 0;
    if (ks == 1) {
        // Lanes are rows contiguous along K (inp, weight in the forward): 8×8 transposes for every
        // full group of 8 lanes; the rest (partial group, K tail, padding) goes below.
        for (; l + 8 <= lanes && l + 8 <= W; l += 8) {
            const float* s[8];
            for (int i = 0; i < 8; i++) s[i] = src + (l + i) * ls;
            for (k = 0; k + 8 <= klen; k += 8) transpose8(s, k, dst + k * W + l, W);
            for (i64 kk = k; kk < klen; kk++)
                for (int i = 0; i < 8; i++) dst[kk * W + l + i] = s[i][kk];
        }
    }
    for (i64 kk = 0; kk < klen; kk++)
        for (int i = l; i < W; i++) dst[kk * W + i] = i < lanes ? src[i * ls + kk * ks] : 0.0f;
}

}  // namespace

GemmKernel gemm_kernel() { return {MR, NR, tile, pack, "avx2 6x16"}; }

}  // namespace px::cpu::avx2
