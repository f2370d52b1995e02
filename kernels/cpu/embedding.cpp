// Token + learned position embeddings: out[b,t] = wte[tokens[b,t]] + wpe[t].
//
// Backward: dwte[v] += Σ dout[n] over the tokens n = b·T + t with tokens[n] = v, and
// dwpe[t] += Σ_b dout[b·T + t]. Both are reductions over the flat token index n: the tokens of one
// output row are grouped by their block n / nx.block, summed sequentially inside a block (from
// +0, in index order) and the blocks combine in the canonical tree over all num_blocks(B·T) blocks,
// with the blocks that hold none of the row's tokens skipped. Threads take whole output rows.
// A row range [row_lo, row_hi) of the flat tokens reduces only those, its blocks counted from
// row_lo: the value of one node of a longer batch's tree (core/model: a microbatch that is several
// nodes), whose positions are still n mod T.
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <string>
#include <vector>

namespace px::cpu {

namespace {

// The canonical tree over blocks [lo, hi), of which only those listed in ids[a, c) (ascending)
// are present; their partial rows are p[a..c) (width w). The node's value is left in row a.
void sparse_tree(float* p, const i64* ids, i64 a, i64 c, i64 lo, i64 hi, i64 w) {
    if (c - a <= 1 || hi - lo == 1) return;
    const i64 mid = tree_mid(lo, hi);
    const i64 m = std::lower_bound(ids + a, ids + c, mid) - ids;
    sparse_tree(p, ids, a, m, lo, mid, w);
    sparse_tree(p, ids, m, c, mid, hi, w);
    if (m > a && c > m) {
        float* dst = p + a * w;
        const float* src = p + m * w;
        for (i64 i = 0; i < w; i++) dst[i] = dst[i] + src[i];
    } else if (c > m) {  // left subtree absent
        std::copy(p + m * w, p + (m + 1) * w, p + a * w);
    }
}

// dst (C) += the canonical sum of the rows dout[idx[0..k)] (idx ascending flat token indices).
// p and ids are scratch.
void reduce_tokens(float* dst, const float* dout, const i64* idx, i64 k, i64 C, int blk, i64 nb,
                   std::vector<float>& p, std::vector<i64>& ids) {
    ids.clear();
    p.clear();
    for (i64 r = 0; r < k; r++) {
        const i64 bl = idx[r] / blk;
        if (ids.empty() || ids.back() != bl) {
            ids.push_back(bl);
            p.resize(p.size() + C, 0.0f);
        }
        float* acc = p.data() + (ids.size() - 1) * C;
        const float* d = dout + idx[r] * C;
        for (i64 i = 0; i < C; i++) acc[i] = acc[i] + d[i];
    }
    if (ids.empty()) return;
    sparse_tree(p.data(), ids.data(), 0, i64(ids.size()), 0, nb, C);
    for (i64 i = 0; i < C; i++) dst[i] += p[i];
}

}  // namespace

// out (B,T,C); tokens (B,T); wte (V,C); wpe (>=T,C) or null (none)
void embedding_forward(const Numerics&, float* out, const int* tokens, const float* wte,
                       const float* wpe, i64 B, i64 T, i64 C) {
#pragma omp parallel for schedule(static)
    for (i64 n = 0; n < B * T; n++) {
        const float* e = wte + i64(tokens[n]) * C;
        float* o = out + n * C;
        if (wpe == nullptr) {  // no position embedding (Llama: rotary positions in attention)
            std::copy(e, e + C, o);
            continue;
        }
        const float* p = wpe + (n % T) * C;
        for (i64 i = 0; i < C; i++) o[i] = e[i] + p[i];
    }
}

// dwte (V,C) +=, dwpe (T,C) += (null skipped); dout (B,T,C); tokens (B,T); the flat tokens
// [row_lo, row_hi) (row_hi < 0: to the end)
void embedding_backward(const Numerics& nx, float* dwte, float* dwpe, const float* dout,
                        const int* tokens, i64 B, i64 T, i64 C, i64 V, i64 row_lo, i64 row_hi) {
    if (row_hi < 0) row_hi = B * T;
    PX_ASSERT(0 <= row_lo && row_lo <= row_hi && row_hi <= B * T, "embedding_backward: row range");
    // From here on, flat indices n count from row_lo; a token's position is (row_lo + n) mod T.
    const i64 BT = row_hi - row_lo, first = row_lo;
    if (BT <= 0) return;
    dout += first * C;
    tokens += first;
    const int blk = nx.block;
    const i64 nb = num_blocks(BT, blk);
    if (dwte) {
        // Counting sort by token id, stable, so each id's list is in flat-index order.
        std::vector<i64> start(V + 1, 0), order(BT);
        for (i64 n = 0; n < BT; n++) {
            if (tokens[n] < 0 || tokens[n] >= V)
                throw Error("embedding_backward: token " + std::to_string(tokens[n]) +
                            " at position " + std::to_string(n) +
                            " is outside the vocabulary [0, " + std::to_string(V) + ")");
            start[tokens[n] + 1]++;
        }
        for (i64 v = 0; v < V; v++) start[v + 1] += start[v];
        std::vector<i64> fill(start.begin(), start.end() - 1), ids;
        for (i64 n = 0; n < BT; n++) order[fill[tokens[n]]++] = n;
        for (i64 v = 0; v < V; v++)
            if (start[v + 1] > start[v]) ids.push_back(v);
#pragma omp parallel
        {
            std::vector<float> p;
            std::vector<i64> bids;
#pragma omp for schedule(dynamic, 16)
            for (i64 r = 0; r < i64(ids.size()); r++) {
                const i64 v = ids[r];
                reduce_tokens(dwte + v * C, dout, order.data() + start[v], start[v + 1] - start[v],
                              C, blk, nb, p, bids);
            }
        }
    }
    if (dwpe) {
#pragma omp parallel
        {
            std::vector<float> p;
            std::vector<i64> bids, idx;
#pragma omp for schedule(static)
            for (i64 t = 0; t < T; t++) {
                idx.clear();  // the tokens at position t, ascending
                for (i64 n = ((t - first) % T + T) % T; n < BT; n += T) idx.push_back(n);
                reduce_tokens(dwpe + t * C, dout, idx.data(), i64(idx.size()), C, blk, nb, p,
                              bids);
            }
        }
    }
}

}  // namespace px::cpu
