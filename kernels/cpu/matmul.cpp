// Matmul, forward and backward, on top of one GEMM with two modes (DESIGN.md §2).
//
// Mode::bitwise — the canonical GEMM. Every c[i][j] is the canonical tree over K: K is cut into
// blocks of nx.block; inside a block acc = +0, acc = fma(a[i][k], b[k][j], acc) in k order; the
// block partials combine in the tree of core/numerics.h (node = left + right). How:
//   * A is packed into panels of MR rows and B into panels of NR columns, k-major and zero-padded,
//     so a microkernel (matmul_avx512.cpp, matmul_avx2.cpp, scalar below) computes a full MR×NR
//     tile with one SIMD lane per output column. Every lane runs exactly the scalar sequence, so
//     the ISA path, the tile size and the tile's position (edge or not) cannot change a bit.
//   * The microkernel produces block partials left to right and combines them on a small per-tile
//     stack following make_merge_schedule (a post-order program of the tree).
//   * K may be processed in chunks of whole blocks (to keep the packed operands cache-sized when
//     K is long); a tile's stack then lives on between chunks, and the stack height at each chunk
//     start is read from the schedule, so chunking cannot change the order either.
//   * OpenMP threads split output tiles, never K: thread-count invariant by construction.
// Mode::fast — oneDNN sgemm (matmul_fast.cpp); bias and dbias use the canonical code (cheap).
#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/matmul_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <new>
#include <vector>

namespace px::cpu {

// ---------------------------------------------------------------------------------------------
// Scalar path: the reference microkernel, std::fma per element. Used where no vector unit is
// available and by the tests; bit-identical to the vector paths.

namespace scalar {
namespace {

constexpr int MR = 4;
constexpr int NR = 8;

// ap (klen,MR), bp (klen,NR); see TileFn.
void tile(const float* ap, const float* bp, i64 klen, i64 kb, const unsigned char* merges,
          float* stack, int sp) {
    constexpr int T = MR * NR;
    for (i64 k0 = 0; k0 < klen; k0 += kb) {
        const i64 n = std::min(kb, klen - k0);
        float acc[T] = {};
        for (i64 k = 0; k < n; k++) {
            for (int r = 0; r < MR; r++)
                for (int j = 0; j < NR; j++) acc[r * NR + j] = std::fma(ap[r], bp[j], acc[r * NR + j]);
            ap += MR;
            bp += NR;
        }
        for (int m = *merges++; m > 0; m--) {
            sp--;
            const float* s = stack + sp * T;
            for (int t = 0; t < T; t++) acc[t] = s[t] + acc[t];
        }
        std::copy(acc, acc + T, stack + sp * T);
        sp++;
    }
}

// dst (klen,W) from src; see PackFn.
void pack(float* dst, const float* src, i64 ls, i64 ks, int lanes, int W, i64 klen) {
    for (i64 k = 0; k < klen; k++)
        for (int l = 0; l < W; l++) dst[k * W + l] = l < lanes ? src[l * ls + k * ks] : 0.0f;
}

}  // namespace

GemmKernel gemm_kernel() { return {MR, NR, tile, pack, "scalar 4x8"}; }

}  // namespace scalar

namespace {

// ---------------------------------------------------------------------------------------------
// Scratch memory

// Growable 64-byte-aligned buffer, one per thread, kept between calls: the packed operands of an
// LM-head matmul are tens of MB, and fresh pages on every call would cost more than the packing.
struct Scratch {
    float* p = nullptr;
    size_t cap = 0;  // floats
    Scratch() = default;
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    ~Scratch() { std::free(p); }
    float* get(size_t n) {
        if (n > cap) {
            std::free(p);
            p = nullptr;
            cap = 0;
            const size_t bytes = (n * sizeof(float) + 4095) / 4096 * 4096;
            p = static_cast<float*>(std::aligned_alloc(64, bytes));
            if (p == nullptr) throw std::bad_alloc();
            cap = bytes / sizeof(float);
        }
        return p;
    }
};

thread_local Scratch tl_shared;  // the operand packed once per call (calling thread's)
thread_local Scratch tl_local;   // per OpenMP thread: chunk-packed operand and tile stacks

// ---------------------------------------------------------------------------------------------
// Blocking parameters (measured on a 2-core AVX-512 host, bench/bench_matmul.cpp).

static i64 kKC = getenv("PX_KC") ? atol(getenv("PX_KC")) : 768;  // K elements per chunk (rounded to whole blocks); longer K is chunked
static i64 kMC = getenv("PX_MC") ? atol(getenv("PX_MC")) : 512;  // rows per item when A is the shared operand
static i64 kGL = getenv("PX_GL") ? atol(getenv("PX_GL")) : 4;
static i64 kGL2 = getenv("PX_GL2") ? atol(getenv("PX_GL2")) : 2;
static i64 kNC = getenv("PX_NC") ? atol(getenv("PX_NC")) : 1024; // columns per item when B is the shared operand

const GemmKernel& kernel_for(Isa isa) {
    static const Isa best = detect_isa();
    static const GemmKernel k_scalar = scalar::gemm_kernel();
    static const GemmKernel k_avx2 = avx2::gemm_kernel();
    static const GemmKernel k_avx512 = avx512::gemm_kernel();
    // Every path gives the same bits, so a path the CPU lacks can fall back to the best it has.
    if (isa == Isa::avx512 && best == Isa::avx512) return k_avx512;
    if ((isa == Isa::avx512 || isa == Isa::avx2) && best != Isa::scalar) return k_avx2;
    return k_scalar;
}

// c (rows,cols) with leading dimension ldc from the tile result s (MR,NR):
// c = s (+ bias[j]) or c += s.
void write_tile(float* c, i64 ldc, const float* s, int NR, int rows, int cols, bool accumulate,
                const float* bias) {
    for (int r = 0; r < rows; r++) {
        float* cr = c + r * ldc;
        const float* sr = s + r * NR;
        if (accumulate) {
            for (int j = 0; j < cols; j++) cr[j] = cr[j] + sr[j];
        } else if (bias != nullptr) {
            for (int j = 0; j < cols; j++) cr[j] = sr[j] + bias[j];
        } else {
            for (int j = 0; j < cols; j++) cr[j] = sr[j];
        }
    }
}

// c (M,N) = a (M,K) · b (K,N) in the canonical order, or += when accumulate, or = … + bias[j]
// when bias (N) is given (then accumulate must be false). Strides as in gemm().
void gemm_canonical(const GemmKernel& kr, i64 block, float* c, i64 ldc, const float* a, i64 rsa,
                    i64 csa, const float* b, i64 rsb, i64 csb, i64 M, i64 N, i64 K, bool accumulate,
                    const float* bias) {
    const int MR = kr.mr, NR = kr.nr, T = MR * NR;
    const i64 nb = num_blocks(K, static_cast<int>(block));
    const MergeSchedule ms = make_merge_schedule(nb);
    const int depth = ms.depth;

    // K chunks of whole blocks; the stack height at a chunk's start follows from the schedule.
    const i64 bpc = std::max<i64>(1, kKC / block);
    const i64 kc = bpc * block;
    const i64 nchunks = (nb + bpc - 1) / bpc;
    std::vector<int> sp0(nchunks);
    {
        int h = 0;
        for (i64 j = 0; j < nb; j++) {
            if (j % bpc == 0) sp0[j / bpc] = h;
            h += 1 - ms.merges_after[j];
        }
    }

    // The operand with the smaller footprint is packed once, whole, by all threads; the other is
    // packed per work item and chunk. An item is gm row panels × gn column panels of the output.
    const i64 mp = (M + MR - 1) / MR, np = (N + NR - 1) / NR;
    const bool a_shared = M <= N;
    const int nthreads_max = omp_get_max_threads();
    i64 gm, gn;
    if (a_shared) {
        gm = std::min<i64>(mp, std::max<i64>(1, kMC / MR));
        gn = std::clamp<i64>(np / (8 * nthreads_max), 1, nchunks > 1 ? kGL2 : kGL);
    } else {
        gn = std::min<i64>(np, std::max<i64>(1, kNC / NR));
        gm = std::clamp<i64>(mp / (8 * nthreads_max), 1, nchunks > 1 ? kGL2 : kGL);
    }
    const i64 items_m = (mp + gm - 1) / gm, items_n = (np + gn - 1) / gn;
    const i64 items = items_m * items_n;

    const i64 shared_panels = a_shared ? mp : np;
    const i64 shared_w = a_shared ? MR : NR;
    float* shared = tl_shared.get(static_cast<size_t>(shared_panels * shared_w * K));
    const i64 local_floats = (a_shared ? gn * NR : gm * MR) * std::min(kc, K);
    const i64 stack_floats = (nchunks > 1 ? gm * gn : 1) * depth * T;

    // Small products are not worth waking threads for; the bits are the same either way.
    const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    const int nthreads = work < 1 << 18 ? 1 : static_cast<int>(std::min<i64>(nthreads_max, items));

#pragma omp parallel num_threads(nthreads)
    {
#pragma omp for schedule(static)
        for (i64 p = 0; p < shared_panels; p++) {
            if (a_shared)
                kr.pack(shared + p * MR * K, a + p * MR * rsa, rsa, csa,
                        static_cast<int>(std::min<i64>(MR, M - p * MR)), MR, K);
            else
                kr.pack(shared + p * NR * K, b + p * NR * csb, csb, rsb,
                        static_cast<int>(std::min<i64>(NR, N - p * NR)), NR, K);
        }

        float* local = tl_local.get(static_cast<size_t>(local_floats + stack_floats));
        float* stacks = local + local_floats;

#pragma omp for schedule(static)
        for (i64 it = 0; it < items; it++) {
            // Consecutive items share the shared operand's panels: column-major over items when A
            // is shared, row-major when B is.
            const i64 im = a_shared ? it % items_m : it / items_n;
            const i64 in = a_shared ? it / items_m : it % items_n;
            const i64 p0 = im * gm, p1 = std::min(mp, p0 + gm);  // row panels of this item
            const i64 q0 = in * gn, q1 = std::min(np, q0 + gn);  // column panels
            for (i64 ch = 0; ch < nchunks; ch++) {
                const i64 k0 = ch * kc, klen = std::min(kc, K - k0);
                const unsigned char* merges = ms.merges_after.data() + ch * bpc;
                const bool last = ch == nchunks - 1;
                // Pack this item's share of the other operand for the chunk.
                if (a_shared) {
                    for (i64 q = q0; q < q1; q++)
                        kr.pack(local + (q - q0) * NR * klen, b + q * NR * csb + k0 * rsb, csb, rsb,
                                static_cast<int>(std::min<i64>(NR, N - q * NR)), NR, klen);
                } else {
                    for (i64 p = p0; p < p1; p++)
                        kr.pack(local + (p - p0) * MR * klen, a + p * MR * rsa + k0 * csa, rsa, csa,
                                static_cast<int>(std::min<i64>(MR, M - p * MR)), MR, klen);
                }
                // One tile: microkernel over the chunk, then write out after the last chunk.
                auto run_tile = [&](i64 p, i64 q) {
                    const float* ap = a_shared ? shared + p * MR * K + k0 * MR
                                               : local + (p - p0) * MR * klen;
                    const float* bp = a_shared ? local + (q - q0) * NR * klen
                                               : shared + q * NR * K + k0 * NR;
                    float* st = stacks + (nchunks > 1 ? ((p - p0) * gn + (q - q0)) * depth * T : 0);
                    kr.tile(ap, bp, klen, block, merges, st, sp0[ch]);
                    if (last) {
                        const i64 i0 = p * MR, j0 = q * NR;
                        write_tile(c + i0 * ldc + j0, ldc, st, NR,
                                   static_cast<int>(std::min<i64>(MR, M - i0)),
                                   static_cast<int>(std::min<i64>(NR, N - j0)), accumulate,
                                   bias != nullptr ? bias + j0 : nullptr);
                    }
                };
                // A panel of the shared operand stays in L1 while it meets the item's few local
                // panels (in L2), so the shared operand streams from L2/L3 once per item.
                if (a_shared) {
                    for (i64 p = p0; p < p1; p++)
                        for (i64 q = q0; q < q1; q++) run_tile(p, q);
                } else {
                    for (i64 q = q0; q < q1; q++)
                        for (i64 p = p0; p < p1; p++) run_tile(p, q);
                }
            }
        }
    }
}

// Canonical column sums: dbias (OC) += Σ over BT rows of dout (BT,OC). Sequential adds inside a
// block of rows, blocks combined in the canonical tree; vectorised across columns, threads split
// columns.
void column_sums_accumulate(i64 block, float* dbias, const float* dout, i64 BT, i64 OC) {
    constexpr i64 W = 256;  // columns per work item: one stack row per tree level stays in L1
    const i64 nb = num_blocks(BT, static_cast<int>(block));
    const MergeSchedule ms = make_merge_schedule(nb);
    const i64 items = (OC + W - 1) / W;
    const int nthreads = BT * OC < 1 << 18 ? 1 : static_cast<int>(std::min<i64>(omp_get_max_threads(), items));
#pragma omp parallel num_threads(nthreads)
    {
        std::vector<float> stack(static_cast<size_t>(ms.depth * W));
#pragma omp for schedule(static)
        for (i64 it = 0; it < items; it++) {
            const i64 o0 = it * W, w = std::min(W, OC - o0);
            int sp = 0;
            for (i64 blk = 0; blk < nb; blk++) {
                float acc[W] = {};
                const i64 t1 = std::min(BT, (blk + 1) * block);
                for (i64 t = blk * block; t < t1; t++) {
                    const float* row = dout + t * OC + o0;
                    for (i64 j = 0; j < w; j++) acc[j] = acc[j] + row[j];
                }
                for (int m = ms.merges_after[blk]; m > 0; m--) {
                    sp--;
                    const float* s = stack.data() + sp * W;
                    for (i64 j = 0; j < w; j++) acc[j] = s[j] + acc[j];
                }
                std::copy(acc, acc + w, stack.data() + sp * W);
                sp++;
            }
            for (i64 j = 0; j < w; j++) dbias[o0 + j] = dbias[o0 + j] + stack[j];
        }
    }
}

}  // namespace

// c (M,N) = a (M,K) · b (K,N), or += when accumulate; strides as in cpu_kernels.h.
void gemm(const Numerics& nx, float* c, i64 ldc, const float* a, i64 rsa, i64 csa, const float* b,
          i64 rsb, i64 csb, i64 M, i64 N, i64 K, bool accumulate) {
    PX_ASSERT(nx.block >= 1, "numerics.block must be at least 1");
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {  // an empty sum is +0
        if (!accumulate)
            for (i64 i = 0; i < M; i++) std::fill(c + i * ldc, c + i * ldc + N, 0.0f);
        return;
    }
    if (nx.mode == Mode::fast && gemm_fast(c, ldc, a, rsa, csa, b, rsb, csb, M, N, K, accumulate))
        return;
    gemm_canonical(kernel_for(nx.isa), nx.block, c, ldc, a, rsa, csa, b, rsb, csb, M, N, K,
                   accumulate, nullptr);
}

// out (BT,OC), inp (BT,C), weight (OC,C), bias (OC) or null
void matmul_forward(const Numerics& nx, float* out, const float* inp, const float* weight,
                    const float* bias, i64 BT, i64 C, i64 OC) {
    PX_ASSERT(nx.block >= 1, "numerics.block must be at least 1");
    if (BT <= 0 || OC <= 0) return;
    // out = inp · weightᵀ: b[k][j] = weight[j][k], so B's row stride is 1 and its column stride C.
    if (nx.mode == Mode::fast && C > 0) {
        // Start from the bias and let sgemm accumulate (any order is allowed in fast mode).
        if (bias != nullptr) {
#pragma omp parallel for schedule(static) if (BT * OC >= 1 << 18)
            for (i64 m = 0; m < BT; m++) std::copy(bias, bias + OC, out + m * OC);
        }
        if (gemm_fast(out, OC, inp, C, 1, weight, 1, C, BT, OC, C, bias != nullptr)) return;
        // Not expressible for oneDNN: canonical path on top of the bias already in place.
        gemm_canonical(kernel_for(nx.isa), nx.block, out, OC, inp, C, 1, weight, 1, C, BT, OC, C,
                       bias != nullptr, nullptr);
        return;
    }
    if (C <= 0) {
        for (i64 m = 0; m < BT; m++)
            for (i64 o = 0; o < OC; o++) out[m * OC + o] = bias != nullptr ? 0.0f + bias[o] : 0.0f;
        return;
    }
    // Bitwise: out = tree + bias, the bias added once after the tree, fused into the tile write.
    gemm_canonical(kernel_for(nx.isa), nx.block, out, OC, inp, C, 1, weight, 1, C, BT, OC, C, false,
                   bias);
}

// dinp (BT,C), dweight (OC,C), dbias (OC) accumulate; dout (BT,OC), inp (BT,C), weight (OC,C)
void matmul_backward(const Numerics& nx, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, i64 BT, i64 C,
                     i64 OC) {
    PX_ASSERT(nx.block >= 1, "numerics.block must be at least 1");
    // dinp = dout · weight: reduction over OC.
    if (dinp != nullptr) gemm(nx, dinp, C, dout, OC, 1, weight, C, 1, BT, C, OC, true);
    // dweight = doutᵀ · inp: reduction over the BT tokens; a[o][t] = dout[t][o].
    if (dweight != nullptr) gemm(nx, dweight, C, dout, 1, OC, inp, C, 1, OC, C, BT, true);
    // dbias = Σ_t dout[t]: the canonical code in both modes (it is cheap).
    if (dbias != nullptr && BT > 0 && OC > 0) column_sums_accumulate(nx.block, dbias, dout, BT, OC);
}

}  // namespace px::cpu
