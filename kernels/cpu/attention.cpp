// Causal multi-head self-attention (llm.c layout): qkv (B,T,3C) holds q, k, v side by side; head
// h uses channels [h·HS, (h+1)·HS) of each. Query t sees keys 0..t.
//
// Forward, per (b, h, t):
//   preatt[j] = (q_t·k_j)·scale, scale = 1/sqrt(HS)      dot: canonical tree over HS
//   att[j]    = exp(preatt[j] - max) / Σ                   Σ: canonical tree over the key blocks
//   out_t     = Σ_j att[j]·v_j                             tree over the key blocks, fma inside
// Backward, per (b, h):
//   datt[t][j]    = dout_t·v_j                             canonical over HS
//   dpreatt[t][j] = att[t][j]·(datt[t][j] - Σ_j' att[t][j']·datt[t][j'])   Σ over the key blocks
//   dq_t += scale·Σ_j dpreatt[t][j]·k_j                    over the key blocks of query t
//   dk_j += scale·Σ_t dpreatt[t][j]·q_t, dv_j += Σ_t att[t][j]·dout_t   over the query blocks
//
// Order (Mode::bitwise): the key (and query) dimension is cut into blocks of nx.block over the
// full T, whatever the row's causal extent, and combined in the canonical tree; blocks with no
// unmasked element are absent (skipped), so query t's sums are the prefix subtree of the same
// tree every query uses. Masked entries are written as exact zeros in preatt, att, datt, dpreatt.
// Threads take whole (b, h) pairs; nothing of one sum is split. Query rows (and, for dk and dv,
// keys) go four at a time through VecMath::fma_rows_group, which keeps every output's chain as
// it is: one row's chain is latency-bound when the row is short, four rows' are not.
//
// Context parallelism (attention_scores_queries, attention_softmax_queries,
// attention_backward_queries): a rank holds some query rows of each sequence (at logical positions
// pos) and, one key range after another, every key and value. Each query row runs the body above
// on its logical position, its scores taken a key range at a time (each score is its own dot), so
// its bits are the single device's. In backward
// dq is local; dk_j and dv_j reduce over the queries of every rank, so a rank gives, for every key
// j, the value of each of its nodes of the query-block tree (blocks absent below j, as above), and
// whoever owns key j combines the nodes of all ranks in the tree
// (core/parallel/context/context_parallel.h). The whole-sequence kernels are the same code with
// pos = 0..T-1.
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vecmath.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace px::cpu {

namespace {

// Σ over j < n of x[j] (or x[j]·y[j]) with blocks over the full key range of nkb blocks; blocks
// at or past num_blocks(n) are absent. present and ep hold nkb entries.
float causal_reduce(const Numerics& nx, const VecMath& vm, const float* x, const float* y, i64 n,
                    i64 nkb, float* ep, unsigned char* present) {
    if (nx.mode == Mode::fast) return y ? vm.fast_dot(x, y, n) : vm.fast_sum(x, n);
    const i64 np = num_blocks(n, nx.block);
    if (y)
        vm.block_dots(ep, x, y, n, nx.block);
    else
        vm.block_sums(ep, x, n, nx.block);
    for (i64 k = 0; k < nkb; k++) present[k] = k < np;
    tree_combine_rows(ep, nkb, 1, present);
    return ep[0];
}

// For m <= kFmaRowsGroup rows q at once (x + q·xs, HS channels), n_max outputs each at sp +
// q·nhb·n_max: output j = x · M[:, j], M stored transposed as (HS, T). The HS dimension is cut
// into blocks, each a sequential fma chain, then the tree; a shorter row reads only its first n
// outputs. sp holds m·nhb·n_max floats (nhb = num_blocks(HS, block)).
void dots_across_group(const VecMath& vm, float* sp, int m, const float* x, i64 xs,
                       const float* mt, i64 HS, i64 T, i64 n_max, int blk) {
    const i64 nhb = num_blocks(HS, blk), stride = nhb * n_max;
    for (i64 hb = 0; hb < nhb; hb++) {
        for (int q = 0; q < m; q++) std::fill_n(sp + q * stride + hb * n_max, n_max, 0.0f);
        const i64 i0 = hb * blk;
        vm.fma_rows_group(sp + hb * n_max, stride, m, x + i0, xs, 1, mt + i0 * T, T,
                          std::min<i64>(blk, HS - i0), n_max);
    }
    if (nhb > 1)
        for (int q = 0; q < m; q++) tree_combine_rows(sp + q * stride, nhb, n_max);
}

// The keys r1[g] = pos[g] + 1 that query rows g < m see; returns the most.
i64 query_extents(i64* r1, const i64* pos, int m) {
    i64 n_max = 0;
    for (int g = 0; g < m; g++) {
        r1[g] = pos[g] + 1;
        n_max = std::max(n_max, r1[g]);
    }
    return n_max;
}

// For m <= kFmaRowsGroup outputs q at once: output q (HS, at op + q·nkb·HS) = Σ_r
// coef[q·cq + r·cs]·x_r over its rows [r0[q], r1[q]) of a (T, ldx) matrix, blocks of the full T
// (row r in block r / blk), rows outside the range absent. In each block a row's chain runs in
// index order: the rows no other output of the group has alone, the rows all of them have
// together, then the rest alone. present holds m·nkb flags (output q's at q·nkb).
void rows_reduce_group(const VecMath& vm, float* op, unsigned char* present, int m,
                       const float* coef, i64 cq, i64 cs, const float* x, i64 ldx, const i64* r0,
                       const i64* r1, i64 HS, i64 nkb, int blk) {
    const auto alone = [&](int q, i64 a, i64 b, i64 kb) {
        if (a < b)
            vm.fma_rows(op + (q * nkb + kb) * HS, coef + q * cq + a * cs, cs, x + a * ldx, ldx,
                        b - a, HS);
    };
    for (i64 kb = 0; kb < nkb; kb++) {
        i64 a[kFmaRowsGroup], b[kFmaRowsGroup];
        for (int q = 0; q < m; q++) {
            a[q] = std::max(r0[q], kb * blk);
            b[q] = std::min(r1[q], (kb + 1) * blk);
            present[q * nkb + kb] = a[q] < b[q];
            if (a[q] < b[q]) std::fill_n(op + (q * nkb + kb) * HS, HS, 0.0f);
        }
        // Runs of consecutive outputs present in this block.
        for (int lo = 0; lo < m;) {
            if (a[lo] >= b[lo]) {
                lo++;
                continue;
            }
            int hi = lo + 1;
            while (hi < m && a[hi] < b[hi]) hi++;
            i64 ja = a[lo], jb = b[lo];  // the rows every output of the run has
            for (int q = lo; q < hi; q++) {
                ja = std::max(ja, a[q]);
                jb = std::min(jb, b[q]);
            }
            if (ja >= jb) {
                for (int q = lo; q < hi; q++) alone(q, a[q], b[q], kb);
            } else {
                for (int q = lo; q < hi; q++) alone(q, a[q], ja, kb);
                vm.fma_rows_group(op + (lo * nkb + kb) * HS, nkb * HS, hi - lo,
                                  coef + lo * cq + ja * cs, cq, cs, x + ja * ldx, ldx, jb - ja,
                                  HS);
                for (int q = lo; q < hi; q++) alone(q, jb, b[q], kb);
            }
            lo = hi;
        }
    }
    for (int q = 0; q < m; q++) tree_combine_rows(op + q * nkb * HS, nkb, HS, present + q * nkb);
}

// One row of dots_across_group: sp holds num_blocks(HS, block) rows of n.
void dots_across(const VecMath& vm, float* sp, const float* x, const float* mt, i64 HS, i64 T,
                 i64 n, int blk) {
    dots_across_group(vm, sp, 1, x, 0, mt, HS, T, n, blk);
}

// One output of rows_reduce_group: op holds nkb rows of HS.
void rows_reduce(const VecMath& vm, float* op, unsigned char* present, const float* coef, i64 cs,
                 const float* x, i64 ldx, i64 r0, i64 r1, i64 HS, i64 nkb, int blk) {
    rows_reduce_group(vm, op, present, 1, coef, 0, cs, x, ldx, &r0, &r1, HS, nkb, blk);
}

}  // namespace

namespace {

// pre[j] = (q·k_j)·scale for the keys j in [lo, lo + W) with j < n; kt holds those keys' kᵀ,
// (HS, W). Each score is its own canonical dot over HS, whatever W: a row's scores may be taken
// a key range at a time (the ring's blocks as they arrive) with the same bits.
inline void score_row(const VecMath& vm, float* sp, float* pre, const float* qt, const float* kt,
                      i64 HS, i64 W, i64 lo, i64 n, int blk, float scale) {
    const i64 m = std::min(n, lo + W) - lo;
    if (m <= 0) return;
    dots_across(vm, sp, qt, kt, HS, W, m, blk);
    for (i64 j = 0; j < m; j++) pre[lo + j] = sp[j] * scale;
}

// The rest of a query row of n keys once its scores pre[0..n) are in: masked scores zero, the
// softmax into a (max, exp, the sum over key blocks, divide), and out (HS) = P·V over the key
// blocks. vb: the row's sequence's v of this head, rows ldv apart.
inline void softmax_probs(const Numerics& nx, const VecMath& vm, float* pre, float* a, i64 n,
                          i64 T, i64 nkb, float* ep, unsigned char* present) {
    std::fill(pre + n, pre + T, 0.0f);
    const float mx = vm.max(pre, n);
    vm.exp_sub(a, pre, mx, n);
    const float sum = causal_reduce(nx, vm, a, nullptr, n, nkb, ep, present);
    for (i64 j = 0; j < n; j++) a[j] = a[j] / sum;
    std::fill(a + n, a + T, 0.0f);
}

inline void softmax_row(const Numerics& nx, const VecMath& vm, float* out, float* pre, float* a,
                        const float* vb, i64 ldv, i64 n, i64 T, i64 HS, i64 nkb, int blk, float* ep,
                        float* op, unsigned char* present) {
    softmax_probs(nx, vm, pre, a, n, T, nkb, ep, present);
    rows_reduce(vm, op, present, a, 1, vb, ldv, 0, n, HS, nkb, blk);
    std::copy(op, op + HS, out);
}

// kᵀ (HS, W) of keys [lo, lo + W) of head h from kv (T, 3C) rows: a query's scores then
// vectorise across keys.
inline void keys_transposed(float* kt, const float* base, i64 lo, i64 W, i64 C, i64 HS, i64 h) {
    for (i64 j = 0; j < W; j++)
        for (i64 i = 0; i < HS; i++) kt[i * W + j] = base[(lo + j) * 3 * C + C + h * HS + i];
}

// The forward of the query rows at pos (Tq, ascending) of each sequence: q rows from q (B,Tq,3C),
// keys and values from kv (B,T,3C). out (B,Tq,C); preatt, att (B,NH,Tq,T).
void forward_rows(const Numerics& nx, float* out, float* preatt, float* att, const float* q,
                  const float* kv, const i64* pos, i64 B, i64 Tq, i64 T, i64 C, i64 NH) {
    PX_ASSERT(NH > 0 && C % NH == 0, "attention: C must be a multiple of NH");
    if (B <= 0 || T <= 0 || Tq <= 0) return;
    const VecMath& vm = vecmath(nx.isa);
    const i64 HS = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(HS));
    const int blk = nx.block;
    const i64 nkb = num_blocks(T, blk);
#pragma omp parallel
    {
        constexpr int G = kFmaRowsGroup;  // query rows at a time
        const i64 nhb = num_blocks(HS, blk);
        std::vector<float> kt(HS * T), sp(G * nhb * T), ep(nkb), op(G * nkb * HS);
        std::vector<unsigned char> present(G * nkb);
        i64 r0[G] = {}, r1[G];
#pragma omp for collapse(2) schedule(dynamic)
        for (i64 b = 0; b < B; b++) {
            for (i64 h = 0; h < NH; h++) {
                const float* base = kv + b * T * C3;
                const float* qb = q + b * Tq * C3;
                float* pre0 = preatt + (b * NH + h) * Tq * T;
                float* att0 = att + (b * NH + h) * Tq * T;
                keys_transposed(kt.data(), base, 0, T, C, HS, h);
                for (i64 r = 0; r < Tq; r += G) {
                    const int m = static_cast<int>(std::min<i64>(G, Tq - r));
                    const i64 n_max = query_extents(r1, pos + r, m);
                    dots_across_group(vm, sp.data(), m, qb + r * C3 + h * HS, C3, kt.data(), HS,
                                      T, n_max, blk);
                    for (int g = 0; g < m; g++) {
                        const float* dots = sp.data() + g * nhb * n_max;
                        float* pre = pre0 + (r + g) * T;
                        for (i64 j = 0; j < r1[g]; j++) pre[j] = dots[j] * scale;
                        softmax_probs(nx, vm, pre, att0 + (r + g) * T, r1[g], T, nkb, ep.data(),
                                      present.data());
                    }
                    rows_reduce_group(vm, op.data(), present.data(), m, att0 + r * T, T, 1,
                                      base + 2 * C + h * HS, C3, r0, r1, HS, nkb, blk);
                    for (int g = 0; g < m; g++)
                        std::copy_n(op.data() + g * nkb * HS, HS,
                                    out + (b * Tq + r + g) * C + h * HS);
                }
            }
        }
    }
}

// The query half of the backward for the rows at pos: datt, dpreatt (B,NH,Tq,T) and dq += into
// dq (B,Tq,3C) (its q third). dout (B,Tq,C); kv (B,T,3C); att (B,NH,Tq,T).
void backward_query_rows(const Numerics& nx, float* dq, float* dpreatt, float* datt,
                         const float* dout, const float* kv, const float* att,
                         const i64* pos, i64 B, i64 Tq, i64 T, i64 C, i64 NH) {
    const VecMath& vm = vecmath(nx.isa);
    const i64 HS = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(HS));
    const int blk = nx.block;
    const i64 nkb = num_blocks(T, blk);
#pragma omp parallel
    {
        constexpr int G = kFmaRowsGroup;  // query rows at a time
        const i64 nhb = num_blocks(HS, blk);
        std::vector<float> vt(HS * T), sp(G * nhb * T), ep(nkb), op(G * nkb * HS);
        std::vector<unsigned char> present(G * nkb);
        i64 r0[G] = {}, r1[G];
#pragma omp for collapse(2) schedule(dynamic)
        for (i64 b = 0; b < B; b++) {
            for (i64 h = 0; h < NH; h++) {
                const float* base = kv + b * T * C3;
                float* dqb = dq + b * Tq * C3;
                const float* dob = dout + b * Tq * C + h * HS;
                const float* ab = att + (b * NH + h) * Tq * T;
                float* dab = datt + (b * NH + h) * Tq * T;
                float* dpb = dpreatt + (b * NH + h) * Tq * T;
                for (i64 j = 0; j < T; j++)
                    for (i64 i = 0; i < HS; i++) vt[i * T + j] = base[j * C3 + 2 * C + h * HS + i];
                for (i64 r = 0; r < Tq; r += G) {
                    const int m = static_cast<int>(std::min<i64>(G, Tq - r));
                    const i64 n_max = query_extents(r1, pos + r, m);
                    dots_across_group(vm, sp.data(), m, dob + r * C, C, vt.data(), HS, T, n_max,
                                      blk);
                    for (int g = 0; g < m; g++) {
                        const i64 n = r1[g];
                        const float* a = ab + (r + g) * T;
                        float* da = dab + (r + g) * T;
                        float* dp = dpb + (r + g) * T;
                        std::copy_n(sp.data() + g * nhb * n_max, n, da);
                        std::fill(da + n, da + T, 0.0f);
                        const float s =
                            causal_reduce(nx, vm, a, da, n, nkb, ep.data(), present.data());
                        for (i64 j = 0; j < n; j++) dp[j] = a[j] * (da[j] - s);
                        std::fill(dp + n, dp + T, 0.0f);
                    }
                    rows_reduce_group(vm, op.data(), present.data(), m, dpb + r * T, T, 1,
                                      base + C + h * HS, C3, r0, r1, HS, nkb, blk);
                    for (int g = 0; g < m; g++) {
                        float* dqt = dqb + (r + g) * C3 + h * HS;
                        const float* o = op.data() + g * nkb * HS;
                        for (i64 i = 0; i < HS; i++) dqt[i] += o[i] * scale;
                    }
                }
            }
        }
    }
}

}  // namespace

// out (B,T,C); preatt, att (B,NH,T,T); qkv (B,T,3C)
void attention_forward(const Numerics& nx, float* out, float* preatt, float* att, const float* qkv,
                       i64 B, i64 T, i64 C, i64 NH) {
    std::vector<i64> pos(static_cast<size_t>(std::max<i64>(T, 0)));
    for (i64 t = 0; t < T; t++) pos[static_cast<size_t>(t)] = t;
    forward_rows(nx, out, preatt, att, qkv, qkv, pos.data(), B, T, T, C, NH);
}

// dqkv (B,T,3C) +=; dpreatt, datt (B,NH,T,T) scratch, assigned; dout (B,T,C); qkv (B,T,3C);
// att (B,NH,T,T)
void attention_backward(const Numerics& nx, float* dqkv, float* dpreatt, float* datt,
                        const float* dout, const float* qkv, const float* att, i64 B, i64 T, i64 C,
                        i64 NH) {
    PX_ASSERT(NH > 0 && C % NH == 0, "attention: C must be a multiple of NH");
    if (B <= 0 || T <= 0) return;
    std::vector<i64> pos(static_cast<size_t>(T));
    for (i64 t = 0; t < T; t++) pos[static_cast<size_t>(t)] = t;
    backward_query_rows(nx, dqkv, dpreatt, datt, dout, qkv, att, pos.data(), B, T, T, C, NH);
    const VecMath& vm = vecmath(nx.isa);
    const i64 HS = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(HS));
    const int blk = nx.block;
    const i64 nkb = num_blocks(T, blk);
#pragma omp parallel
    {
        constexpr int G = kFmaRowsGroup;  // keys at a time
        std::vector<float> op(G * nkb * HS);
        std::vector<unsigned char> present(G * nkb);
        i64 r0[G], r1[G];
#pragma omp for collapse(2) schedule(dynamic)
        for (i64 b = 0; b < B; b++) {
            for (i64 h = 0; h < NH; h++) {
                const float* base = qkv + b * T * C3;
                float* dbase = dqkv + b * T * C3;
                const float* dob = dout + b * T * C + h * HS;
                const float* ab = att + (b * NH + h) * T * T;
                const float* dpb = dpreatt + (b * NH + h) * T * T;
                // Keys: dk_j and dv_j reduce over the queries t >= j.
                for (i64 j = 0; j < T; j += G) {
                    const int m = static_cast<int>(std::min<i64>(G, T - j));
                    for (int g = 0; g < m; g++) {
                        r0[g] = j + g;
                        r1[g] = T;
                    }
                    rows_reduce_group(vm, op.data(), present.data(), m, dpb + j, 1, T,
                                      base + h * HS, C3, r0, r1, HS, nkb, blk);
                    for (int g = 0; g < m; g++) {
                        float* dk = dbase + (j + g) * C3 + C + h * HS;
                        const float* o = op.data() + g * nkb * HS;
                        for (i64 i = 0; i < HS; i++) dk[i] += o[i] * scale;
                    }
                    rows_reduce_group(vm, op.data(), present.data(), m, ab + j, 1, T, dob, C, r0,
                                      r1, HS, nkb, blk);
                    for (int g = 0; g < m; g++) {
                        float* dv = dbase + (j + g) * C3 + 2 * C + h * HS;
                        const float* o = op.data() + g * nkb * HS;
                        for (i64 i = 0; i < HS; i++) dv[i] += o[i];
                    }
                }
            }
        }
    }
}

// preatt (B,NH,Tq,T): columns [key_lo, key_hi) of the rows at pos (keys past a row's position
// untouched); q (B,Tq,3C); kv (B,T,3C), of which only those keys are read; pos (Tq)
void attention_scores_queries(const Numerics& nx, float* preatt, const float* q, const float* kv,
                              const i64* pos, i64 key_lo, i64 key_hi, i64 B, i64 Tq, i64 T, i64 C,
                              i64 NH) {
    PX_ASSERT(NH > 0 && C % NH == 0, "attention: C must be a multiple of NH");
    PX_ASSERT(0 <= key_lo && key_lo <= key_hi && key_hi <= T, "attention: keys outside T");
    const i64 W = key_hi - key_lo;
    if (B <= 0 || Tq <= 0 || W <= 0) return;
    const VecMath& vm = vecmath(nx.isa);
    const i64 HS = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(HS));
    const int blk = nx.block;
#pragma omp parallel
    {
        std::vector<float> kt(HS * W), sp(num_blocks(HS, blk) * W);
#pragma omp for collapse(2) schedule(dynamic)
        for (i64 b = 0; b < B; b++) {
            for (i64 h = 0; h < NH; h++) {
                keys_transposed(kt.data(), kv + b * T * C3, key_lo, W, C, HS, h);
                for (i64 r = 0; r < Tq; r++)
                    score_row(vm, sp.data(), preatt + ((b * NH + h) * Tq + r) * T,
                              q + (b * Tq + r) * C3 + h * HS, kt.data(), HS, W, key_lo, pos[r] + 1,
                              blk, scale);
            }
        }
    }
}

// out (B,Tq,C); preatt (B,NH,Tq,T) with every row's scores in (its masked part is zeroed); att
// (B,NH,Tq,T); kv (B,T,3C), its v read; pos (Tq)
void attention_softmax_queries(const Numerics& nx, float* out, float* preatt, float* att,
                               const float* kv, const i64* pos, i64 B, i64 Tq, i64 T, i64 C,
                               i64 NH) {
    PX_ASSERT(NH > 0 && C % NH == 0, "attention: C must be a multiple of NH");
    if (B <= 0 || T <= 0 || Tq <= 0) return;
    const VecMath& vm = vecmath(nx.isa);
    const i64 HS = C / NH, C3 = 3 * C;
    const int blk = nx.block;
    const i64 nkb = num_blocks(T, blk);
#pragma omp parallel
    {
        std::vector<float> ep(nkb), op(nkb * HS);
        std::vector<unsigned char> present(nkb);
#pragma omp for collapse(2) schedule(dynamic)
        for (i64 b = 0; b < B; b++) {
            for (i64 h = 0; h < NH; h++)
                for (i64 r = 0; r < Tq; r++) {
                    const i64 row = (b * NH + h) * Tq + r;
                    softmax_row(nx, vm, out + (b * Tq + r) * C + h * HS, preatt + row * T,
                                att + row * T, kv + b * T * C3 + 2 * C + h * HS, C3, pos[r] + 1, T,
                                HS, nkb, blk, ep.data(), op.data(), present.data());
                }
        }
    }
}

// dq (B,Tq,3C) += (q third); parts (B,NH,T,K,2,HS) assigned; dpreatt, datt (B,NH,Tq,T) scratch;
// dout (B,Tq,C); q (B,Tq,3C); kv (B,T,3C); att (B,NH,Tq,T); pos (Tq); nodes (K) of query blocks.
void attention_backward_queries(const Numerics& nx, float* dq, float* parts, float* dpreatt,
                                float* datt, const float* dout, const float* q, const float* kv,
                                const float* att, const i64* pos, const i64* node_lo,
                                const i64* node_hi, i64 K, i64 B, i64 Tq, i64 T, i64 C, i64 NH) {
    PX_ASSERT(NH > 0 && C % NH == 0, "attention: C must be a multiple of NH");
    if (B <= 0 || T <= 0 || Tq <= 0) return;
    backward_query_rows(nx, dq, dpreatt, datt, dout, kv, att, pos, B, Tq, T, C, NH);
    const VecMath& vm = vecmath(nx.isa);
    const i64 HS = C / NH, C3 = 3 * C;
    const int blk = nx.block;
    // Local row of each node's first query (its rows are consecutive: a node lies in one run of
    // consecutive positions).
    std::vector<i64> first(static_cast<size_t>(K));
    for (i64 k = 0; k < K; k++) {
        const i64 p0 = node_lo[k] * blk;
        const i64* at = std::lower_bound(pos, pos + Tq, p0);
        PX_ASSERT(at != pos + Tq && *at == p0, "attention: a query node the rank does not hold");
        first[static_cast<size_t>(k)] = at - pos;
    }
    i64 most = 1;
    for (i64 k = 0; k < K; k++) most = std::max(most, node_hi[k] - node_lo[k]);
#pragma omp parallel
    {
        std::vector<float> op(most * HS);
        std::vector<unsigned char> present(most);
#pragma omp for collapse(2) schedule(dynamic)
        for (i64 b = 0; b < B; b++) {
            for (i64 h = 0; h < NH; h++) {
                const float* qb = q + b * Tq * C3 + h * HS;
                const float* dob = dout + b * Tq * C + h * HS;
                const float* ab = att + (b * NH + h) * Tq * T;
                const float* dpb = dpreatt + (b * NH + h) * Tq * T;
                for (i64 j = 0; j < T; j++) {
                    for (i64 k = 0; k < K; k++) {
                        float* dst = parts + ((((b * NH + h) * T + j) * K + k) * 2) * HS;
                        const i64 nb = node_hi[k] - node_lo[k];
                        const i64 p_lo = node_lo[k] * blk, p_hi = std::min(T, node_hi[k] * blk);
                        // Position p of this node is local row first + (p - p_lo).
                        const i64 shift = first[static_cast<size_t>(k)] - p_lo;
                        for (int which = 0; which < 2; which++) {
                            const float* coef = which == 0 ? dpb : ab;
                            const float* x = which == 0 ? qb : dob;
                            const i64 ldx = which == 0 ? C3 : C;
                            for (i64 kb = 0; kb < nb; kb++) {
                                const i64 lo = std::max(j, p_lo + kb * blk);
                                const i64 hi = std::min(p_hi, p_lo + (kb + 1) * blk);
                                present[kb] = lo < hi;
                                if (lo >= hi) continue;
                                float* acc = op.data() + kb * HS;
                                std::fill(acc, acc + HS, 0.0f);
                                vm.fma_rows(acc, coef + (lo + shift) * T + j, T,
                                            x + (lo + shift) * ldx, ldx, hi - lo, HS);
                            }
                            float* d = dst + which * HS;
                            if (tree_combine_rows(op.data(), nb, HS, present.data()))
                                std::copy(op.begin(), op.begin() + HS, d);
                            else
                                std::fill(d, d + HS, -0.0f);
                        }
                    }
                }
            }
        }
    }
}

}  // namespace px::cpu
