// Matmul, forward and backward, on one GEMM with two modes (docs/numerics.md).
//
// Mode::bitwise — the canonical GEMM. Every c[i][j] is the canonical tree over K: K is cut into
// blocks of nx.block; inside a block acc = +0, acc = fma(a[i][k], b[k][j], acc) in k order; the
// block partials combine in the tree of core/base/numerics.h (node = left + right). How:
//   * A is packed into panels of MR rows and B into panels of NR columns, k-major and zero-padded,
//     so a microkernel (matmul_avx512.cpp, matmul_avx2.cpp, the scalar one below) computes a full
//     MR×NR tile with one SIMD lane per output column. Every lane runs exactly the scalar
//     sequence, so the ISA path, the tile shape and the tile's position (edge or not) cannot
//     change a bit.
//   * The microkernel produces block partials left to right and combines them on a small
//     per-tile stack in the post-order of the tree (make_merge_schedule).
//   * Long K is cut into chunks that are nodes of the tree (ChunkPlan), so a tile computes a chunk
//     from an empty stack and keeps only a short "outer" stack between chunks.
//   * OpenMP threads split output tiles, never K: thread-count invariant by construction.
// Mode::fast — oneDNN sgemm (matmul_fast.cpp). dbias uses the canonical code in both modes.
// Numerics::fp8_promote > 0 (Hopper's narrow FP8 accumulator, core/base/numerics.h) — the same
// driver on the narrow kernels (narrow_gemm_kernel), in either mode: it has no fast form.
//
// Performance notes (2-core AVX-512 host, bench/bench_matmul.cpp): the 14×32 AVX-512 microkernel
// runs at ~90% of the FMA peak on cached panels; the rest goes to packing (~0.5 cycle per packed
// element, amortised over the 256 rows of a GPT-2 batch) and to streaming panels from L2.
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/matmul_kernels.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
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
void tile(const float* ap, const float* bp, i64 klen, i64 kb, i64 /*seg*/,
          const unsigned char* merges, float* stack, float* ostack, int osp, int omerges) {
    constexpr int T = MR * NR;
    int sp = 0;
    for (i64 k0 = 0; k0 < klen; k0 += kb) {
        const i64 n = std::min(kb, klen - k0);
        float acc[T] = {};
        for (i64 k = 0; k < n; k++) {
            for (int r = 0; r < MR; r++)
                for (int j = 0; j < NR; j++)
                    acc[r * NR + j] = std::fma(ap[r], bp[j], acc[r * NR + j]);
            ap += MR;
            bp += NR;
        }
        auto merge_from = [&](const float* s) {
            for (int t = 0; t < T; t++) acc[t] = s[t] + acc[t];  // node = left + right
        };
        for (int m = *merges++; m > 0; m--) merge_from(stack + (--sp) * T);
        float* dst;
        if (k0 + kb >= klen) {  // the chunk's node continues on the outer stack
            for (int m = omerges; m > 0; m--) merge_from(ostack + (--osp) * T);
            dst = ostack + osp * T;
        } else {
            dst = stack + (sp++) * T;
        }
        std::copy(acc, acc + T, dst);
    }
}

// dst (klen,W) from src; see PackFn.
void pack(float* dst, const float* src, i64 ls, i64 ks, int lanes, int W, i64 klen) {
    for (i64 k = 0; k < klen; k++)
        for (int l = 0; l < W; l++) dst[k * W + l] = l < lanes ? src[l * ls + k * ks] : 0.0f;
}

// fma, then the narrow accumulator's truncation (kNarrowKeep).
float narrow_fma(float a, float b, float c) {
    return std::bit_cast<float>(std::bit_cast<std::uint32_t>(std::fma(a, b, c)) & kNarrowKeep);
}

// The narrow-accumulator tile; see TileFn's seg.
void tile_narrow(const float* ap, const float* bp, i64 klen, i64 kb, i64 seg,
                 const unsigned char* merges, float* stack, float* ostack, int osp, int omerges) {
    constexpr int T = MR * NR;
    int sp = 0;
    for (i64 k0 = 0; k0 < klen; k0 += kb) {
        const i64 n = std::min(kb, klen - k0);
        float acc[T] = {};
        for (i64 s0 = 0; s0 < n; s0 += seg) {
            float nacc[T] = {};
            for (i64 k = s0; k < std::min(n, s0 + seg); k++) {
                for (int r = 0; r < MR; r++)
                    for (int j = 0; j < NR; j++)
                        nacc[r * NR + j] = narrow_fma(ap[r], bp[j], nacc[r * NR + j]);
                ap += MR;
                bp += NR;
            }
            for (int t = 0; t < T; t++) acc[t] = acc[t] + nacc[t];
        }
        auto merge_from = [&](const float* s) {
            for (int t = 0; t < T; t++) acc[t] = s[t] + acc[t];
        };
        for (int m = *merges++; m > 0; m--) merge_from(stack + (--sp) * T);
        float* dst;
        if (k0 + kb >= klen) {
            for (int m = omerges; m > 0; m--) merge_from(ostack + (--osp) * T);
            dst = ostack + osp * T;
        } else {
            dst = stack + (sp++) * T;
        }
        std::copy(acc, acc + T, dst);
    }
}

}  // namespace

// See StoreFn.
void store_tile(float* c, i64 ldc, const float* s, int nr, int rows, int cols, bool accumulate,
                const float* bias) {
    for (int r = 0; r < rows; r++) {
        float* cr = c + r * ldc;
        const float* sr = s + r * nr;
        if (bias != nullptr) {
            for (int j = 0; j < cols; j++) cr[j] = sr[j] + bias[j];
        } else if (accumulate) {
            for (int j = 0; j < cols; j++) cr[j] = cr[j] + sr[j];
        } else {
            for (int j = 0; j < cols; j++) cr[j] = sr[j];
        }
    }
}

GemmKernel gemm_kernel() {
    return {MR, NR, tile, pack, store_tile};
}

GemmKernel narrow_gemm_kernel() {
    return {MR, NR, tile_narrow, pack, store_tile};
}

}  // namespace scalar

namespace {

// ---------------------------------------------------------------------------------------------
// Scratch memory and blocking parameters

// Growable 64-byte-aligned buffer kept between calls, one per calling thread (ranks may run as
// threads): the packed operands of an LM-head matmul are tens of MB, and fresh pages on every call
// would cost more than the packing. It is sized before the parallel region, so an allocation
// failure throws in the caller instead of inside OpenMP.
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

thread_local Scratch tl_scratch;

// Measured on the 2-core AVX-512 host with bench/bench_matmul.cpp; results do not depend on them.
constexpr i64 kKC = 768;        // most K elements per chunk; GPT-2's C = 768 runs in one chunk
constexpr i64 kMC = 512;        // most rows per item when A is the shared operand
constexpr i64 kNC = 1024;       // most columns per item when B is the shared operand
constexpr i64 kItemPanels = 4;  // most local panels per item (one shared panel meets them in L1)
constexpr i64 kItemBytes = 256 << 10;  // ... or more, while they fit this much (L2)

// narrow: the narrow accumulator's kernels (Numerics::fp8_promote > 0).
const GemmKernel& kernel_for(Isa isa, bool narrow = false) {
    static const Isa best = detect_isa();
    // Every path gives the same bits, so a path the CPU lacks falls back to the best it has. Each
    // ISA's gemm_kernel() is itself compiled for that ISA, so it is only called when supported.
    if (isa == Isa::avx512 && best == Isa::avx512) {
        static const GemmKernel k = avx512::gemm_kernel(), kn = avx512::narrow_gemm_kernel();
        return narrow ? kn : k;
    }
    if (isa != Isa::scalar && best != Isa::scalar) {
        static const GemmKernel k = avx2::gemm_kernel(), kn = avx2::narrow_gemm_kernel();
        return narrow ? kn : k;
    }
    static const GemmKernel k = scalar::gemm_kernel(), kn = scalar::narrow_gemm_kernel();
    return narrow ? kn : k;
}

const GemmKernel& kernel_for(const Numerics& nx) {
    return kernel_for(nx.isa, nx.fp8_promote > 0);
}

// Prefetch an output tile (rows, cols) for writing while its last chunk computes: the tile's
// store would otherwise wait on memory (dweight accumulates into a matrix of several MB).
void prefetch_tile(float* c, i64 ldc, int rows, int cols) {
    for (int r = 0; r < rows; r++) {
        const char* p = reinterpret_cast<const char*>(c + r * ldc);
        for (int off = 0; off < cols * 4; off += 64) __builtin_prefetch(p + off, 1, 3);
        __builtin_prefetch(p + cols * 4 - 1, 1, 3);
    }
}

// Pack panels [l0, l1) of one operand (panel l: lanes l·W .. of `extent`, lane stride ls, K
// stride ks, klen elements from src) into consecutive panels at dst, each (klen, W). When the
// lanes are contiguous (ls = 1: the rows of dout in dweight, of an activation in dinp) one
// panel's K elements lie a whole row apart, so packing panel by panel would touch a new cache
// line (and often a new page) for every 14 or 32 floats; short runs of K over all the panels
// read each row's span in one go instead. The packed bytes are the same either way.
void pack_panels(const GemmKernel& kr, float* dst, const float* src, i64 ls, i64 ks, int W,
                 i64 extent, i64 l0, i64 l1, i64 klen) {
    constexpr i64 kRun = 8;  // K elements per panel and pass
    const i64 run = ls == 1 && l1 - l0 > 1 ? kRun : klen;
    for (i64 k0 = 0; k0 < klen; k0 += run) {
        const i64 n = std::min(run, klen - k0);
        for (i64 l = l0; l < l1; l++)
            kr.pack(dst + (l - l0) * W * klen + k0 * W, src + l * W * ls + k0 * ks, ls, ks,
                    static_cast<int>(std::min<i64>(W, extent - l * W)), W, n);
    }
}

// The K chunks of one GEMM: the maximal nodes of the canonical tree over the K blocks that hold at
// most max_blocks blocks, left to right. A chunk is a subtree, so a tile computes it from an empty
// stack (the node's own schedule), and only the node's value joins the tile's persistent "outer"
// stack, which follows the tree above the chunks. Long K then keeps one small tile state between
// chunks instead of a whole stack.
struct ChunkPlan {
    std::vector<i64> first, count;     // blocks of each chunk
    std::vector<unsigned char> inner;  // merges after each block, within its chunk
    std::vector<unsigned char> outer;  // merges after each chunk, above the chunks
    std::vector<int> outer_sp;         // outer stack height before each chunk
    int inner_depth = 0, outer_depth = 0;
};

void plan_chunks(ChunkPlan& p, i64 lo, i64 hi, i64 max_blocks, int height_above) {
    if (hi - lo <= max_blocks) {
        p.first.push_back(lo);
        p.count.push_back(hi - lo);
        p.outer.push_back(0);
        p.outer_depth = std::max(p.outer_depth, height_above + 1);
        return;
    }
    const i64 mid = tree_mid(lo, hi);
    plan_chunks(p, lo, mid, max_blocks, height_above);
    plan_chunks(p, mid, hi, max_blocks, height_above + 1);
    p.outer.back()++;
}

ChunkPlan make_chunk_plan(i64 nb, i64 max_blocks) {
    ChunkPlan p;
    plan_chunks(p, 0, nb, max_blocks, 0);
    p.inner.resize(static_cast<size_t>(nb));
    int h = 0;
    for (size_t c = 0; c < p.first.size(); c++) {
        // A node's subtree has the shape of the tree over its own block count.
        const MergeSchedule ms = make_merge_schedule(p.count[c]);
        std::copy(ms.merges_after.begin(), ms.merges_after.end(), p.inner.begin() + p.first[c]);
        p.inner_depth = std::max(p.inner_depth, ms.depth);
        p.outer_sp.push_back(h);
        h += 1 - p.outer[c];
    }
    return p;
}

// c (M,N) = a (M,K) · b (K,N) in the canonical order, or += when accumulate, or = … + bias[j]
// when bias (N) is given (then accumulate must be false). Strides as in gemm().
// seg: the narrow accumulator's segment (0: fp32 kernels; see TileFn).
void gemm_canonical(const GemmKernel& kr, i64 block, i64 seg, float* c, i64 ldc, const float* a,
                    i64 rsa, i64 csa, const float* b, i64 rsb, i64 csb, i64 M, i64 N, i64 K,
                    bool accumulate, const float* bias) {
    const int MR = kr.mr, NR = kr.nr, T = MR * NR;
    const i64 nb = num_blocks(K, static_cast<int>(block));
    const ChunkPlan plan = make_chunk_plan(nb, std::max<i64>(1, kKC / block));
    const i64 nchunks = static_cast<i64>(plan.first.size());
    const i64 max_klen =
        std::min(K, (*std::max_element(plan.count.begin(), plan.count.end())) * block);

    // The operand with the smaller footprint ("shared") is packed once, whole, by all threads; the
    // other ("local") is packed per work item and chunk. An item is gm row panels × gn column
    // panels of the output.
    const i64 mp = (M + MR - 1) / MR, np = (N + NR - 1) / NR;
    const bool a_shared = M <= N;
    const int nthreads_max = omp_get_max_threads();
    // Groups of panels as equal as possible, so that equal item counts are equal work.
    auto balanced = [](i64 panels, i64 most) {
        const i64 groups = (panels + most - 1) / most;
        return (panels + groups - 1) / groups;
    };
    // Local panels per item: kItemPanels, or as many as fit kItemBytes when K is short (the
    // weight gradients), so that packing reads longer runs of each row.
    auto item_most = [&](int w) {
        return std::max<i64>(kItemPanels, kItemBytes / (w * max_klen * 4));
    };
    i64 gm, gn;
    if (a_shared) {
        gm = balanced(mp, std::max<i64>(1, kMC / MR));
        gn = balanced(np, std::clamp<i64>(np / (4 * nthreads_max), 1, item_most(NR)));
    } else {
        gn = balanced(np, std::max<i64>(1, kNC / NR));
        gm = balanced(mp, std::clamp<i64>(mp / (4 * nthreads_max), 1, item_most(MR)));
    }
    const i64 items_m = (mp + gm - 1) / gm, items_n = (np + gn - 1) / gn;
    const i64 items = items_m * items_n;
    // Items that share the shared operand's panels are consecutive (so they fall to one thread).
    auto item_panels = [&](i64 it, i64& p0, i64& p1, i64& q0, i64& q1) {
        const i64 im = a_shared ? it / items_n : it % items_m;
        const i64 in = a_shared ? it % items_n : it / items_m;
        p0 = im * gm, p1 = std::min(mp, p0 + gm);
        q0 = in * gn, q1 = std::min(np, q0 + gn);
    };

    // The local operand as a (lanes, klen) block: lane stride and K stride, as pack() reads it.
    const float* local_src = a_shared ? b : a;
    const i64 local_w = a_shared ? NR : MR, local_ls = a_shared ? csb : rsa;
    const i64 local_ks = a_shared ? rsb : csa, local_extent = a_shared ? N : M;
    const i64 shared_panels = a_shared ? mp : np;

    // Small products are not worth waking threads for; the bits are the same either way.
    const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    const int nthreads = work < 1 << 18 ? 1 : static_cast<int>(std::min<i64>(nthreads_max, items));

    // The shared operand is packed whole when K is one chunk. With several chunks, each chunk's
    // slice of it is packed just before its items, into one of two buffers: it is then still in
    // cache when the items read it (the LM head's input gradient would otherwise write and read
    // back a 51 MB packed copy), and a thread done with its items of one chunk packs the next
    // chunk's slice while the others finish (the items leave no barrier; the pack's barrier
    // orders a tile's chunks, and two buffers keep a slice alive until every item has used it).
    const bool sliced = nchunks > 1;
    const int shared_w = a_shared ? MR : NR;
    const i64 slice_floats = shared_panels * shared_w * max_klen;

    // Scratch: the shared operand (whole, or two slices); when K has several chunks, the outer
    // stacks of all tiles (by item); then one area per thread for its local panels of a chunk and
    // one tile's chunk stack.
    auto round16 = [](i64 n) { return (n + 15) / 16 * 16; };  // keep areas 64-byte aligned
    const i64 shared_floats =
        sliced ? 2 * round16(slice_floats) : round16(shared_panels * shared_w * K);
    const i64 item_outer = nchunks > 1 ? gm * gn * plan.outer_depth * T : 0;
    const i64 outer_floats = round16(items * item_outer);
    const i64 local_floats = round16((a_shared ? gn : gm) * local_w * max_klen);
    const i64 thread_floats = local_floats + round16(plan.inner_depth * T);
    float* const scratch = tl_scratch.get(
        static_cast<size_t>(shared_floats + outer_floats + nthreads * thread_floats));
    float* const shared = scratch;
    float* const outer = scratch + shared_floats;

#pragma omp parallel num_threads(nthreads)
    {
        // Pack the shared operand's K range [k0, k0 + klen) into dst, panel s at s·W·klen, in
        // groups of panels that go to whichever thread is free; the loop's barrier ends it.
        constexpr i64 kPackGroup = 8;
        auto pack_shared = [&](float* dst, i64 k0, i64 klen) {
#pragma omp for schedule(dynamic, 1)
            for (i64 s0 = 0; s0 < shared_panels; s0 += kPackGroup) {
                const i64 s1 = std::min(shared_panels, s0 + kPackGroup);
                if (a_shared)
                    pack_panels(kr, dst + s0 * MR * klen, a + k0 * csa, rsa, csa, MR, M, s0, s1,
                                klen);
                else
                    pack_panels(kr, dst + s0 * NR * klen, b + k0 * rsb, csb, rsb, NR, N, s0, s1,
                                klen);
            }
        };
        if (!sliced) pack_shared(shared, 0, K);

        // Chunks outermost, so a chunk of the shared operand stays in L2 across the items. Items
        // go to whichever thread is free (a thread that shares its core with another process
        // takes fewer); an item's tiles keep their state between chunks in `outer`. Which thread
        // computes a tile changes no bit.
        const int tid = omp_get_thread_num();
        float* const local = scratch + shared_floats + outer_floats + tid * thread_floats;
        float* const inner = local + local_floats;

        for (i64 ch = 0; ch < nchunks; ch++) {
            const i64 k0 = plan.first[ch] * block;
            const i64 klen = std::min(K, (plan.first[ch] + plan.count[ch]) * block) - k0;
            const unsigned char* merges = plan.inner.data() + plan.first[ch];
            const bool last = ch == nchunks - 1;
            // Panel s of the shared operand's chunk: at s·W·sk + soff.
            float* const sbuf = sliced ? shared + (ch % 2) * round16(slice_floats) : shared;
            const i64 sk = sliced ? klen : K, soff = sliced ? 0 : k0;
            if (sliced) pack_shared(sbuf, k0, klen);
#pragma omp for schedule(dynamic, 1) nowait
            for (i64 it = 0; it < items; it++) {
                i64 p0, p1, q0, q1;
                item_panels(it, p0, p1, q0, q1);
                const i64 l0 = a_shared ? q0 : p0, l1 = a_shared ? q1 : p1;  // local panels
                pack_panels(kr, local, local_src + k0 * local_ks, local_ls, local_ks,
                            static_cast<int>(local_w), local_extent, l0, l1, klen);

                auto run_tile = [&](i64 p, i64 q) {
                    const float* ap = a_shared ? sbuf + p * MR * sk + soff * MR
                                               : local + (p - p0) * MR * klen;
                    const float* bp = a_shared ? local + (q - q0) * NR * klen
                                               : sbuf + q * NR * sk + soff * NR;
                    const i64 i0 = p * MR, j0 = q * NR;
                    const int rows = static_cast<int>(std::min<i64>(MR, M - i0));
                    const int cols = static_cast<int>(std::min<i64>(NR, N - j0));
                    if (last) prefetch_tile(c + i0 * ldc + j0, ldc, rows, cols);
                    // A single chunk is the whole tree; otherwise the chunk's node joins the
                    // tile's outer stack, whose bottom level ends up holding the result.
                    float* os = nchunks == 1
                                    ? inner
                                    : outer + it * item_outer +
                                          ((p - p0) * gn + (q - q0)) * plan.outer_depth * T;
                    kr.tile(ap, bp, klen, block, seg, merges, inner, os,
                            nchunks == 1 ? 0 : plan.outer_sp[ch],
                            nchunks == 1 ? 0 : plan.outer[ch]);
                    if (last)
                        kr.store(c + i0 * ldc + j0, ldc, os, NR, rows, cols, accumulate,
                                 bias != nullptr ? bias + j0 : nullptr);
                };
                // A panel of the shared operand stays in L1 while it meets the item's few local
                // panels (L1/L2).
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
    const int nthreads =
        BT * OC < 1 << 18 ? 1 : static_cast<int>(std::min<i64>(omp_get_max_threads(), items));
    std::vector<float> stacks(static_cast<size_t>(nthreads * ms.depth * W));  // one per thread
#pragma omp parallel num_threads(nthreads)
    {
        float* const stack = stacks.data() + omp_get_thread_num() * ms.depth * W;
#pragma omp for schedule(dynamic, 1)
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
                    const float* s = stack + sp * W;
                    for (i64 j = 0; j < w; j++) acc[j] = s[j] + acc[j];
                }
                std::copy(acc, acc + w, stack + sp * W);
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
    if (nx.mode == Mode::fast && nx.fp8_promote == 0 &&
        gemm_fast(c, ldc, a, rsa, csa, b, rsb, csb, M, N, K, accumulate))
        return;
    gemm_canonical(kernel_for(nx), nx.block, nx.fp8_promote, c, ldc, a, rsa, csa, b, rsb, csb, M, N,
                   K, accumulate, nullptr);
}

// out (BT,OC), inp (BT,C), weight (OC,C), bias (OC) or null
void matmul_forward(const Numerics& nx, float* out, const float* inp, const float* weight,
                    const float* bias, i64 BT, i64 C, i64 OC) {
    PX_ASSERT(nx.block >= 1, "numerics.block must be at least 1");
    if (BT <= 0 || OC <= 0) return;
    // out = inp · weightᵀ: b[k][j] = weight[j][k], so B's row stride is 1 and its column stride C.
    if (nx.mode == Mode::fast && nx.fp8_promote == 0 && C > 0) {
        // sgemm accumulates onto the bias, each item onto its own block (any order is allowed).
        if (gemm_fast(out, OC, inp, C, 1, weight, 1, C, BT, OC, C, false, bias)) return;
        // Not expressible for oneDNN: the canonical path, the bias fused into its tile write.
        gemm_canonical(kernel_for(nx), nx.block, 0, out, OC, inp, C, 1, weight, 1, C, BT, OC, C,
                       false, bias);
        return;
    }
    if (C <= 0) {
        for (i64 m = 0; m < BT; m++)
            for (i64 o = 0; o < OC; o++) out[m * OC + o] = bias != nullptr ? 0.0f + bias[o] : 0.0f;
        return;
    }
    // Bitwise: out = tree + bias, the bias added once after the tree, fused into the tile write.
    gemm_canonical(kernel_for(nx), nx.block, nx.fp8_promote, out, OC, inp, C, 1, weight, 1, C, BT,
                   OC, C, false, bias);
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
