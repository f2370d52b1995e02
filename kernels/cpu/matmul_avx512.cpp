// AVX-512 path of the canonical GEMM (matmul.cpp has the driver and the contract).
//
// Each zmm lane is one output column j running the same scalar sequence as the scalar path:
// acc = fma(a[i][k], b[k][j], acc) over a block, blocks merged left + right in the canonical tree.
// So this path is bit-identical to the scalar and AVX2 paths; only the register blocking differs.
//
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma. Everything lives in
// px::cpu::avx512 and uses no std templates, so no inline function compiled here can be merged
// into code that runs on a CPU without AVX-512 (see matmul_kernels.h).
#include "kernels/cpu/matmul_kernels.h"

#include <immintrin.h>

namespace px::cpu::avx512 {

namespace {

// 14×32 tile: 28 zmm accumulators, 2 for the B row, 1 broadcast = 31 of 32 registers. Per k it
// loads 2 B vectors and 14 A scalars for 28 FMAs (fewer bytes per FMA than 8×48, which matters
// because the B panel streams from L2).
constexpr int MR = 14;
constexpr int NV = 2;
constexpr int NR = NV * 16;

// ap (klen,MR), bp (klen,NR); see TileFn.
void tile(const float* ap, const float* bp, i64 klen, i64 kb, i64 /*seg*/,
          const unsigned char* merges, float* stack, float* ostack, int osp, int omerges) {
    constexpr int T = MR * NR;
    int sp = 0;
    for (i64 k0 = 0; k0 < klen; k0 += kb) {
        const i64 n = klen - k0 < kb ? klen - k0 : kb;
        __m512 acc[MR][NV];
#pragma GCC unroll 32
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
        for (i64 k = 0; k < n; k++) {
            __m512 b[NV];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) b[v] = _mm512_loadu_ps(bp + v * 16);
#pragma GCC unroll 32
            for (int r = 0; r < MR; r++) {
                const __m512 a = _mm512_set1_ps(ap[r]);
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(a, b[v], acc[r][v]);
            }
            ap += MR;
            bp += NR;
        }
        // Merge with finished left siblings: node = left + right, the left one lower on the stack.
        auto merge_from = [&](const float* s) {
#pragma GCC unroll 32
            for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++)
                    acc[r][v] = _mm512_add_ps(_mm512_loadu_ps(s + r * NR + v * 16), acc[r][v]);
        };
        for (int m = *merges++; m > 0; m--) merge_from(stack + (--sp) * T);
        float* dst;
        if (k0 + kb >= klen) {
            // The chunk's last block: its stack is empty, the value is the chunk's node, which
            // continues on the outer stack.
            for (int m = omerges; m > 0; m--) merge_from(ostack + (--osp) * T);
            dst = ostack + osp * T;
        } else {
            dst = stack + (sp++) * T;
        }
#pragma GCC unroll 32
        for (int r = 0; r < MR; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) _mm512_storeu_ps(dst + r * NR + v * 16, acc[r][v]);
    }
}

// The narrow-accumulator tile (matmul_kernels.h, TileFn's seg): 6×32, 12 zmm narrow sums, 12 fp32
// block sums, 2 for the B row, 1 broadcast, 1 mask = 28 of 32 registers. Each lane runs the scalar
// path's sequence: fma, then the low mantissa bits cleared.
constexpr int NMR = 6;

void tile_narrow(const float* ap, const float* bp, i64 klen, i64 kb, i64 seg,
                 const unsigned char* merges, float* stack, float* ostack, int osp, int omerges) {
    constexpr int T = NMR * NR;
    const __m512 keep = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(kNarrowKeep)));
    int sp = 0;
    for (i64 k0 = 0; k0 < klen; k0 += kb) {
        const i64 n = klen - k0 < kb ? klen - k0 : kb;
        __m512 acc[NMR][NV];
#pragma GCC unroll 32
        for (int r = 0; r < NMR; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
        for (i64 s0 = 0; s0 < n; s0 += seg) {
            const i64 e = n - s0 < seg ? n - s0 : seg;
            __m512 nacc[NMR][NV];
#pragma GCC unroll 32
            for (int r = 0; r < NMR; r++)
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++) nacc[r][v] = _mm512_setzero_ps();
            for (i64 k = 0; k < e; k++) {
                __m512 b[NV];
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++) b[v] = _mm512_loadu_ps(bp + v * 16);
#pragma GCC unroll 32
                for (int r = 0; r < NMR; r++) {
                    const __m512 a = _mm512_set1_ps(ap[r]);
#pragma GCC unroll 4
                    for (int v = 0; v < NV; v++)
                        nacc[r][v] = _mm512_and_ps(_mm512_fmadd_ps(a, b[v], nacc[r][v]), keep);
                }
                ap += NMR;
                bp += NR;
            }
#pragma GCC unroll 32
            for (int r = 0; r < NMR; r++)
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++) acc[r][v] = _mm512_add_ps(acc[r][v], nacc[r][v]);
        }
        auto merge_from = [&](const float* s) {
#pragma GCC unroll 32
            for (int r = 0; r < NMR; r++)
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++)
                    acc[r][v] = _mm512_add_ps(_mm512_loadu_ps(s + r * NR + v * 16), acc[r][v]);
        };
        for (int m = *merges++; m > 0; m--) merge_from(stack + (--sp) * T);
        float* dst;
        if (k0 + kb >= klen) {
            for (int m = omerges; m > 0; m--) merge_from(ostack + (--osp) * T);
            dst = ostack + osp * T;
        } else {
            dst = stack + (sp++) * T;
        }
#pragma GCC unroll 32
        for (int r = 0; r < NMR; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) _mm512_storeu_ps(dst + r * NR + v * 16, acc[r][v]);
    }
}

// 8×8 transpose: d[i·dstride + r] = p[r·ls + i] for i, r < 8, storing the first `width` lanes of
// each output row; rows r >= valid read as zeros. Inserting the upper 128-bit halves from memory
// keeps the shuffle port to 16 ops per 64 floats. The rows are addressed as p + r·ls (no table of
// row pointers per call; the input gradients' packing measured 1–2 points of peak faster).
inline void transpose8(const float* p, i64 ls, int valid, float* d, i64 dstride, int width) {
    __m256 r[8], out[8];
    if (valid == 8) {
        for (int i = 0; i < 4; i++) {
            const float* a = p + i * ls;
            const float* b = p + (i + 4) * ls;
            r[i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(a)), _mm_loadu_ps(b),
                                        1);
            r[i + 4] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(a + 4)),
                                            _mm_loadu_ps(b + 4), 1);
        }
    } else {
        for (int i = 0; i < 4; i++) {
            const __m256 a = i < valid ? _mm256_loadu_ps(p + i * ls) : _mm256_setzero_ps();
            const __m256 b =
                i + 4 < valid ? _mm256_loadu_ps(p + (i + 4) * ls) : _mm256_setzero_ps();
            r[i] = _mm256_permute2f128_ps(a, b, 0x20);      // a.lo | b.lo
            r[i + 4] = _mm256_permute2f128_ps(a, b, 0x31);  // a.hi | b.hi
        }
    }
    for (int h = 0; h < 2; h++) {
        const __m256 t0 = _mm256_unpacklo_ps(r[4 * h + 0], r[4 * h + 1]);
        const __m256 t1 = _mm256_unpackhi_ps(r[4 * h + 0], r[4 * h + 1]);
        const __m256 t2 = _mm256_unpacklo_ps(r[4 * h + 2], r[4 * h + 3]);
        const __m256 t3 = _mm256_unpackhi_ps(r[4 * h + 2], r[4 * h + 3]);
        out[4 * h + 0] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
        out[4 * h + 1] = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
        out[4 * h + 2] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
        out[4 * h + 3] = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    }
    if (width == 8) {
        for (int i = 0; i < 8; i++) _mm256_storeu_ps(d + i * dstride, out[i]);
    } else {
        for (int i = 0; i < 8; i++)
            _mm256_mask_storeu_ps(d + i * dstride, static_cast<__mmask8>((1u << width) - 1),
                                  out[i]);
    }
}

// dst (klen,W) from src; see PackFn.
void pack(float* dst, const float* src, i64 ls, i64 ks, int lanes, int W, i64 klen) {
    if (ls == 1) {
        // Lanes contiguous (the B operand of dinp, the A operand of dweight): row copies.
        if (lanes == W && W % 16 == 0) {
            for (i64 k = 0; k < klen; k++)
                for (int l = 0; l < W; l += 16)
                    _mm512_storeu_ps(dst + k * W + l, _mm512_loadu_ps(src + k * ks + l));
        } else {  // an edge panel or a narrow one (MR = 14): masked, zero fill past lanes
            for (i64 k = 0; k < klen; k++)
                for (int l = 0; l < W; l += 16) {
                    const int nl = lanes - l < 0 ? 0 : (lanes - l > 16 ? 16 : lanes - l);
                    const int nw = W - l > 16 ? 16 : W - l;
                    const __m512 v = _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << nl) - 1),
                                                           src + k * ks + l);
                    _mm512_mask_storeu_ps(dst + k * W + l, static_cast<__mmask16>((1u << nw) - 1),
                                          v);
                }
        }
        return;
    }
    if (ks == 1) {
        // Lanes are rows contiguous along K (inp and weight in the forward): 8×8 transposes, with
        // k outermost so that each destination row is completed while it is in L1. A group with
        // fewer than 8 rows (MR = 14, an edge panel) reads zeros for the missing ones.
        const int groups = (W + 7) / 8;
        i64 k = 0;
        for (; k + 8 <= klen; k += 8)
            for (int g = 0; g < groups; g++) {
                const int valid = lanes - g * 8 < 0 ? 0 : (lanes - g * 8 > 8 ? 8 : lanes - g * 8);
                transpose8(src + g * 8 * ls + k, ls, valid, dst + k * W + g * 8, W,
                           W - g * 8 < 8 ? W - g * 8 : 8);
            }
        for (; k < klen; k++)
            for (int l = 0; l < W; l++) dst[k * W + l] = l < lanes ? src[l * ls + k] : 0.0f;
        return;
    }
    for (i64 k = 0; k < klen; k++)
        for (int l = 0; l < W; l++) dst[k * W + l] = l < lanes ? src[l * ls + k * ks] : 0.0f;
}

// See StoreFn: 16 columns per vector, masked at the tile's right edge.
void store(float* c, i64 ldc, const float* s, int nr, int rows, int cols, bool accumulate,
           const float* bias) {
    for (int r = 0; r < rows; r++) {
        float* cr = c + r * ldc;
        const float* sr = s + r * nr;
        for (int j = 0; j < cols; j += 16) {
            const __mmask16 m =
                static_cast<__mmask16>(cols - j >= 16 ? 0xFFFFu : (1u << (cols - j)) - 1);
            __m512 v = _mm512_maskz_loadu_ps(m, sr + j);
            if (bias != nullptr)
                v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, bias + j));
            else if (accumulate)
                v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, cr + j), v);
            _mm512_mask_storeu_ps(cr + j, m, v);
        }
    }
}

}  // namespace

GemmKernel gemm_kernel() {
    return {MR, NR, tile, pack, store};
}

GemmKernel narrow_gemm_kernel() {
    return {NMR, NR, tile_narrow, pack, store};
}

}  // namespace px::cpu::avx512
