#include "core/parallel/tensor/tensor_parallel.h"

#include "core/base/error.h"
#include "core/base/mathfun.h"
#include "kernels/ops.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

namespace px::tp {

namespace {

using std::to_string;

void check_group(const comm::Communicator& tp, const DimSplit& s, const char* what) {
    if (s.size() != tp.size())
        throw Error(std::string(what) + ": split '" + s.name + "' is over " + to_string(s.size()) +
                    " ranks but group '" + tp.group() + "' has " + to_string(tp.size()));
}

void check_token(int tok, i64 n, i64 V, const char* what) {
    if (tok < 0 || tok >= V)
        throw Error(std::string(what) + ": token " + to_string(tok) + " at position " +
                    to_string(n) + " is outside the vocabulary [0, " + to_string(V) + ")");
}

// The SP token split as p+1 cut points: rank r holds tokens [e[r], e[r+1]).
std::vector<i64> token_edges(const DimSplit& tokens, const char* what) {
    std::vector<i64> e(tokens.size() + 1, 0);
    for (int r = 0; r < tokens.size(); r++) {
        const auto& rr = tokens.ranges[r];
        if (rr.size() > 1 || (rr.size() == 1 && rr[0].lo != e[r]))
            throw Error(std::string(what) + ": split '" + tokens.name +
                        "' is not one contiguous token slice per rank in rank order (use "
                        "token_split)");
        e[r + 1] = e[r] + tokens.local(r);
    }
    return e;
}

std::vector<i64> scaled(const std::vector<i64>& e, i64 w) {
    std::vector<i64> out(e.size());
    for (size_t i = 0; i < e.size(); i++) out[i] = e[i] * w;
    return out;
}

void add_into(float* dst, const float* src, i64 n) {
    for (i64 i = 0; i < n; i++) dst[i] = dst[i] + src[i];
}

// The view, or null where it views nothing (an output the caller does not want).
const Tensor* optional(const Tensor& t) {
    return t.data != nullptr ? &t : nullptr;
}

// ops::matmul_backward on this rank's buffers: dinp (BT,C), dweight (OC,C), dbias (OC) (null
// ones skipped), dout (BT,OC), inp (BT,C), weight (OC,C).
void linear_backward(const Numerics& nx, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, i64 BT, i64 C,
                     i64 OC) {
    const Tensor di = view_f32(dinp, {BT, C}), dw = view_f32(dweight, {OC, C}),
                 db = view_f32(dbias, {OC});
    ops::matmul_backward(nx, optional(di), optional(dw), optional(db), view_f32(dout, {BT, OC}),
                         view_f32(inp, {BT, C}), view_f32(weight, {OC, C}));
}

// An fp32 matrix view (rows, cols) whose element (i, j) is p[i·rs + j·cs]: a column slice or a
// transpose of a stored matrix, as ops::gemm and ops::row_sum take them.
Tensor matrix(const float* p, i64 rows, i64 cols, i64 rs, i64 cs) {
    Tensor t = view_f32(p, {rows, cols});
    t.strides = {rs, cs};
    return t;
}

}  // namespace


// ---- math ------------------------------------------------------------------------------------

i64 num_partials(const Numerics& nx, const DimSplit& s, int rank) {
    if (nx.mode == Mode::fast) return 1;
    return static_cast<i64>(s.plan.nodes[rank].size());
}

// dX = dY W over OC: a node's rows of W and columns of dY are one GEMM with K = the node's rows,
// whose canonical tree is the node's subtree of the full OC tree.
void column_dinp_partials(const Numerics& nx, float* parts, const float* dout_r,
                          const float* weight_r, const DimSplit& oc, int rank, i64 BT, i64 C) {
    const i64 ocr = oc.local(rank);
    if (nx.mode == Mode::fast) {
        ops::gemm(nx, view_f32(parts, {BT, C}), view_f32(dout_r, {BT, ocr}),
                  view_f32(weight_r, {ocr, C}), false);
        return;
    }
    const auto& nodes = oc.plan.nodes[rank];
    for (size_t i = 0; i < nodes.size(); i++) {
        const Range e = oc.elements(nodes[i]);
        const i64 off = oc.local_offset(rank, e.lo);
        ops::gemm(nx, view_f32(parts + static_cast<i64>(i) * BT * C, {BT, C}),
                  matrix(dout_r + off, BT, e.size(), ocr, 1),
                  view_f32(weight_r + off * C, {e.size(), C}), false);
    }
}

// Y = X Wᵀ over K: b[k][j] = weight_r[j][k], so B's row stride is 1 and its column stride K_r.
void row_out_partials(const Numerics& nx, float* parts, const float* inp_r, const float* weight_r,
                      const DimSplit& k, int rank, i64 BT, i64 OC) {
    const i64 kr = k.local(rank);
    if (nx.mode == Mode::fast) {
        ops::gemm(nx, view_f32(parts, {BT, OC}), view_f32(inp_r, {BT, kr}),
                  matrix(weight_r, kr, OC, 1, kr), false);
        return;
    }
    const auto& nodes = k.plan.nodes[rank];
    for (size_t i = 0; i < nodes.size(); i++) {
        const Range e = k.elements(nodes[i]);
        const i64 off = k.local_offset(rank, e.lo);
        ops::gemm(nx, view_f32(parts + static_cast<i64>(i) * BT * OC, {BT, OC}),
                  matrix(inp_r + off, BT, e.size(), kr, 1),
                  matrix(weight_r + off, e.size(), OC, 1, kr), false);
    }
}

// crossentropy_forward's Σexp is a row sum: block sums (sequential from +0 per block) then the
// tree over them. On a node's elements (starting on a block boundary) the same gives the node.
void logit_sum_partials(const Numerics& nx, float* parts, const float* e_r, const DimSplit& vocab,
                        int rank, i64 BT) {
    const i64 vr = vocab.local(rank);
    if (nx.mode == Mode::fast) {
        ops::row_sum(nx, view_f32(parts, {BT}), view_f32(e_r, {BT, vr}));
        return;
    }
    Numerics split = nx;  // the tree of the split's blocks
    split.block = vocab.block;
    const auto& nodes = vocab.plan.nodes[rank];
    for (size_t i = 0; i < nodes.size(); i++) {
        const Range e = vocab.elements(nodes[i]);
        ops::row_sum(split, view_f32(parts + static_cast<i64>(i) * BT, {BT}),
                     matrix(e_r + vocab.local_offset(rank, e.lo), BT, e.size(), vr, 1));
    }
}

// layernorm_backward over a node's tokens alone computes the node's subtree; its outputs start at
// -0 so that `+=` hands the value over unchanged (+0 would turn a -0 sum into +0).
void layernorm_param_partials(const Numerics& nx, float* parts, const float* dout_r,
                              const float* inp_r, const float* weight, const float* mean_r,
                              const float* rstd_r, const DimSplit& tokens, int rank, i64 C) {
    const i64 w = mean_r != nullptr ? 2 * C : C;  // RMSNorm (no mean): its weight alone
    auto run = [&](float* row, i64 t0, i64 rows) {
        std::fill(row, row + w, -0.0f);
        const Tensor dweight = view_f32(row, {C}), dbias = view_f32(row + C, {C});
        const Tensor d = view_f32(dout_r + t0 * C, {rows, C}), x = view_f32(inp_r + t0 * C, {rows, C});
        if (mean_r == nullptr)
            ops::rmsnorm_backward(nx, nullptr, &dweight, d, x, view_f32(weight, {C}),
                                  view_f32(rstd_r + t0, {rows}));
        else
            ops::layernorm_backward(nx, nullptr, &dweight, &dbias, d, x, view_f32(weight, {C}),
                                    view_f32(mean_r + t0, {rows}), view_f32(rstd_r + t0, {rows}));
    };
    if (nx.mode == Mode::fast) {
        run(parts, 0, tokens.local(rank));
        return;
    }
    const auto& nodes = tokens.plan.nodes[rank];
    for (size_t i = 0; i < nodes.size(); i++) {
        const Range e = tokens.elements(nodes[i]);
        run(parts + static_cast<i64>(i) * w, tokens.local_offset(rank, e.lo), e.size());
    }
}

// ---- communication ---------------------------------------------------------------------------

void reduce_partials(comm::Communicator& tp, const Numerics& nx, const DimSplit& s,
                     const float* parts, i64 w, float* out) {
    check_group(tp, s, "reduce_partials");
    if (nx.mode == Mode::fast) {
        std::copy_n(parts, w, out);
        tp.all_reduce(out, w, comm::Algo::ring);
        return;
    }
    exchange_and_combine(tp, s.plan, parts, w, out);
}

void reduce_scatter_partials(comm::Communicator& tp, const Numerics& nx, const DimSplit& s,
                             const float* parts, i64 w, std::span<const i64> edges, float* out) {
    check_group(tp, s, "reduce_scatter_partials");
    if (nx.mode == Mode::fast) {
        std::vector<float> all(parts, parts + w);
        tp.all_reduce(all.data(), w, comm::Algo::ring);
        const i64 lo = edges[tp.rank()], hi = edges[tp.rank() + 1];
        std::copy(all.begin() + lo, all.begin() + hi, out);
        return;
    }
    reduce_scatter_nodes(tp, s.plan, parts, w, edges, out);
}

// ---- column-parallel linear --------------------------------------------------------------------

void column_parallel_forward(comm::Communicator& tp, const Numerics& nx, float* out_r,
                             const float* inp, const float* weight_r, const float* bias_r,
                             const DimSplit& oc, i64 BT, i64 C) {
    check_group(tp, oc, "column_parallel_forward");
    const i64 ocr = oc.local(tp.rank());
    const Tensor bias = view_f32(bias_r, {ocr});
    ops::matmul_forward(nx, view_f32(out_r, {BT, ocr}), view_f32(inp, {BT, C}),
                        view_f32(weight_r, {ocr, C}), optional(bias));
}

void column_parallel_backward(comm::Communicator& tp, const Numerics& nx, float* dinp,
                              float* dweight_r, float* dbias_r, const float* dout_r,
                              const float* inp, const float* weight_r, const DimSplit& oc, i64 BT,
                              i64 C) {
    check_group(tp, oc, "column_parallel_backward");
    const int me = tp.rank();
    if (dweight_r != nullptr || dbias_r != nullptr)
        linear_backward(nx, nullptr, dweight_r, dbias_r, dout_r, inp, weight_r, BT, C,
                        oc.local(me));
    if (dinp == nullptr) return;
    std::vector<float> parts(num_partials(nx, oc, me) * BT * C), sum(BT * C);
    column_dinp_partials(nx, parts.data(), dout_r, weight_r, oc, me, BT, C);
    reduce_partials(tp, nx, oc, parts.data(), BT * C, sum.data());
    add_into(dinp, sum.data(), BT * C);
}

// ---- row-parallel linear -----------------------------------------------------------------------

void row_parallel_forward(comm::Communicator& tp, const Numerics& nx, float* out,
                          const float* inp_r, const float* weight_r, const float* bias,
                          const DimSplit& k, i64 BT, i64 OC) {
    check_group(tp, k, "row_parallel_forward");
    const int me = tp.rank();
    std::vector<float> parts(num_partials(nx, k, me) * BT * OC);
    row_out_partials(nx, parts.data(), inp_r, weight_r, k, me, BT, OC);
    reduce_partials(tp, nx, k, parts.data(), BT * OC, out);
    if (bias != nullptr)
        for (i64 m = 0; m < BT; m++) add_into(out + m * OC, bias, OC);
}

void row_parallel_backward(comm::Communicator& tp, const Numerics& nx, float* dinp_r,
                           float* dweight_r, float* dbias, const float* dout, const float* inp_r,
                           const float* weight_r, const DimSplit& k, i64 BT, i64 OC) {
    check_group(tp, k, "row_parallel_backward");
    // Every output of matmul_backward here is either per column of K (dinp_r, dweight_r) or
    // does not involve K at all (dbias): the single-device kernel on the rank's columns.
    linear_backward(nx, dinp_r, dweight_r, dbias, dout, inp_r, weight_r, BT, k.local(tp.rank()),
                    OC);
}

// ---- vocabulary-parallel embedding -------------------------------------------------------------

void vocab_embedding_forward(comm::Communicator& tp, const Numerics& nx, float* out,
                             const int* tokens, const float* wte_r, const float* wpe,
                             const DimSplit& vocab, i64 B, i64 T, i64 C) {
    check_group(tp, vocab, "vocab_embedding_forward");
    const int me = tp.rank();
    const i64 BT = B * T;
    for (i64 n = 0; n < BT; n++) check_token(tokens[n], n, vocab.n, "vocab_embedding_forward");
#pragma omp parallel for schedule(static)
    for (i64 n = 0; n < BT; n++) {
        float* o = out + n * C;
        if (vocab.owns(me, tokens[n])) {
            const float* e = wte_r + vocab.local_offset(me, tokens[n]) * C;
            std::copy(e, e + C, o);
        } else {
            std::fill(o, o + C, -0.0f);
        }
    }
    // One owner per row and -0 elsewhere: every order of the sum gives the owner's row.
    tp.all_reduce(out, BT * C, comm::algo_for(nx.mode));
    if (wpe == nullptr) return;  // no position embedding (Llama)
#pragma omp parallel for schedule(static)
    for (i64 n = 0; n < BT; n++) add_into(out + n * C, wpe + (n % T) * C, C);
}

void vocab_embedding_backward(comm::Communicator& tp, const Numerics& nx, float* dwte_r,
                              float* dwpe, const float* dout, const int* tokens,
                              const DimSplit& vocab, i64 B, i64 T, i64 C, i64 row_lo,
                              i64 row_hi) {
    check_group(tp, vocab, "vocab_embedding_backward");
    const int me = tp.rank();
    if (row_hi < 0) row_hi = B * T;
    PX_ASSERT(0 <= row_lo && row_lo <= row_hi && row_hi <= B * T,
              "vocab_embedding_backward: row range");
    if (dwpe != nullptr) {
        const Tensor dpos = view_f32(dwpe, {T, C});
        ops::embedding_backward(nx, nullptr, &dpos, view_f32(dout, {B, T, C}), tokens, row_lo,
                                row_hi);
    }
    // dwte's rows over the flat tokens [row_lo, row_hi), counted from row_lo.
    dout += row_lo * C;
    tokens += row_lo;
    const i64 BT = row_hi - row_lo;
    if (BT <= 0) return;
    for (i64 n = 0; n < BT; n++) check_token(tokens[n], n, vocab.n, "vocab_embedding_backward");
    const i64 vr = vocab.local(me);
    if (dwte_r != nullptr && vr > 0) {
        const int blk = nx.block;
        const i64 nb = num_blocks(BT, blk);
        // This rank's tokens by local row, stable (each row's list in flat-index order).
        std::vector<i64> start(vr + 1, 0), order;
        for (i64 n = 0; n < BT; n++)
            if (vocab.owns(me, tokens[n])) start[vocab.local_offset(me, tokens[n]) + 1]++;
        for (i64 v = 0; v < vr; v++) start[v + 1] += start[v];
        order.resize(start[vr]);
        std::vector<i64> fill(start.begin(), start.end() - 1), rows;
        for (i64 n = 0; n < BT; n++)
            if (vocab.owns(me, tokens[n])) order[fill[vocab.local_offset(me, tokens[n])]++] = n;
        for (i64 v = 0; v < vr; v++)
            if (start[v + 1] > start[v]) rows.push_back(v);
#pragma omp parallel
        {
            std::vector<float> p;
            std::vector<Range> present;
#pragma omp for schedule(dynamic, 16)
            for (i64 i = 0; i < static_cast<i64>(rows.size()); i++) {
                const i64 v = rows[i];
                // As embedding_backward: sequential sums from +0 per token block, then the tree
                // over all nb blocks with the blocks holding none of this row's tokens skipped.
                p.clear();
                present.clear();
                for (i64 j = start[v]; j < start[v + 1]; j++) {
                    const i64 n = order[j], bl = n / blk;
                    if (present.empty() || present.back().lo != bl) {
                        present.push_back({bl, bl + 1});
                        p.resize(p.size() + (C), 0.0f);
                    }
                    add_into(p.data() + (present.size() - 1) * (C), dout + n * C, C);
                }
                combine_nodes(nb, present, p.data(), C);
                add_into(dwte_r + v * C, p.data(), C);
            }
        }
    }
}

// ---- vocabulary-parallel cross-entropy ---------------------------------------------------------

void vocab_crossentropy_forward(comm::Communicator& tp, const Numerics& nx, float* losses,
                                float* probs_r, const float* logits_r, const int* targets,
                                const DimSplit& vocab, i64 BT) {
    check_group(tp, vocab, "vocab_crossentropy_forward");
    const int me = tp.rank();
    const i64 vr = vocab.local(me);
    for (i64 m = 0; m < BT; m++) check_token(targets[m], m, vocab.n, "vocab_crossentropy_forward");

    // max over V: exact in any order. The target logit: one owner, -0 elsewhere, exact too.
    // Both are read before exp overwrites logits (probs may alias them).
    std::vector<float> mx(BT), lt(BT), sum(BT);
    ops::row_max(nx, view_f32(mx.data(), {BT}), view_f32(logits_r, {BT, vr}));
    for (i64 m = 0; m < BT; m++) {
        const float* l = logits_r + m * vr;
        lt[m] = vocab.owns(me, targets[m]) ? l[vocab.local_offset(me, targets[m])] : -0.0f;
    }
    tp.all_reduce_max(mx.data(), BT);
    tp.all_reduce(lt.data(), BT, comm::algo_for(nx.mode));

    ops::exp_sub(nx, view_f32(probs_r, {BT, vr}), view_f32(logits_r, {BT, vr}),
                 view_f32(mx.data(), {BT}));
    std::vector<float> parts(num_partials(nx, vocab, me) * BT);
    logit_sum_partials(nx, parts.data(), probs_r, vocab, me, BT);
    reduce_partials(tp, nx, vocab, parts.data(), BT, sum.data());

#pragma omp parallel for schedule(static)
    for (i64 m = 0; m < BT; m++) {
        float* p = probs_r + m * vr;
        const float s = sum[m];
        for (i64 i = 0; i < vr; i++) p[i] = p[i] / s;
        losses[m] = mathfun::log(s) - (lt[m] - mx[m]);
    }
}

void vocab_crossentropy_backward(comm::Communicator& tp, const Numerics&, float* dlogits_r,
                                 const float* probs_r, const int* targets, float dloss,
                                 const DimSplit& vocab, i64 BT) {
    check_group(tp, vocab, "vocab_crossentropy_backward");
    const int me = tp.rank();
    const i64 vr = vocab.local(me);
    for (i64 m = 0; m < BT; m++) check_token(targets[m], m, vocab.n, "vocab_crossentropy_backward");
#pragma omp parallel for schedule(static)
    for (i64 m = 0; m < BT; m++) {
        const float* p = probs_r + m * vr;
        float* d = dlogits_r + m * vr;
        const i64 tg = vocab.owns(me, targets[m]) ? vocab.local_offset(me, targets[m]) : -1;
        for (i64 i = 0; i < vr; i++) d[i] = (p[i] - (i == tg ? 1.0f : 0.0f)) * dloss;
    }
}

// ---- sequence parallelism ----------------------------------------------------------------------

void sp_all_gather(comm::Communicator& tp, float* out, const float* in_r, const DimSplit& tokens,
                   i64 w) {
    check_group(tp, tokens, "sp_all_gather");
    const std::vector<i64> e = token_edges(tokens, "sp_all_gather");
    std::vector<i64> counts(tp.size());
    for (int r = 0; r < tp.size(); r++) counts[r] = (e[r + 1] - e[r]) * w;
    tp.all_gather_v(out, in_r, counts);
}

void row_parallel_forward_sp(comm::Communicator& tp, const Numerics& nx, float* out_r,
                             const float* inp_r, const float* weight_r, const float* bias,
                             const DimSplit& k, const DimSplit& tokens, i64 BT, i64 OC) {
    check_group(tp, k, "row_parallel_forward_sp");
    const int me = tp.rank();
    const std::vector<i64> e = token_edges(tokens, "row_parallel_forward_sp");
    std::vector<float> parts(num_partials(nx, k, me) * BT * OC);
    row_out_partials(nx, parts.data(), inp_r, weight_r, k, me, BT, OC);
    reduce_scatter_partials(tp, nx, k, parts.data(), BT * OC, scaled(e, OC), out_r);
    if (bias != nullptr)
        for (i64 m = 0; m < tokens.local(me); m++) add_into(out_r + m * OC, bias, OC);
}

void column_parallel_backward_sp(comm::Communicator& tp, const Numerics& nx, float* dinp_r,
                                 float* dweight_r, float* dbias_r, const float* dout_r,
                                 const float* inp, const float* weight_r, const DimSplit& oc,
                                 const DimSplit& tokens, i64 BT, i64 C) {
    check_group(tp, oc, "column_parallel_backward_sp");
    const int me = tp.rank();
    const std::vector<i64> e = token_edges(tokens, "column_parallel_backward_sp");
    if (dweight_r != nullptr || dbias_r != nullptr)
        linear_backward(nx, nullptr, dweight_r, dbias_r, dout_r, inp, weight_r, BT, C,
                        oc.local(me));
    if (dinp_r == nullptr) return;
    const i64 rows = tokens.local(me);
    std::vector<float> parts(num_partials(nx, oc, me) * BT * C), mine(rows * C);
    column_dinp_partials(nx, parts.data(), dout_r, weight_r, oc, me, BT, C);
    reduce_scatter_partials(tp, nx, oc, parts.data(), BT * C, scaled(e, C), mine.data());
    add_into(dinp_r, mine.data(), rows * C);
}

void sp_layernorm_backward(comm::Communicator& tp, const Numerics& nx, float* dinp_r,
                           float* dweight, float* dbias, const float* dout_r, const float* inp_r,
                           const float* weight, const float* mean_r, const float* rstd_r,
                           const DimSplit& tokens, i64 C) {
    check_group(tp, tokens, "sp_layernorm_backward");
    const int me = tp.rank();
    if (dinp_r != nullptr) {  // per token: the single-device kernel on the slice
        const i64 rows = tokens.local(me);
        const Tensor dinp = view_f32(dinp_r, {rows, C});
        const Tensor d = view_f32(dout_r, {rows, C}), x = view_f32(inp_r, {rows, C});
        if (mean_r == nullptr)
            ops::rmsnorm_backward(nx, &dinp, nullptr, d, x, view_f32(weight, {C}),
                                  view_f32(rstd_r, {rows}));
        else
            ops::layernorm_backward(nx, &dinp, nullptr, nullptr, d, x, view_f32(weight, {C}),
                                    view_f32(mean_r, {rows}), view_f32(rstd_r, {rows}));
    }
    if (dweight == nullptr && dbias == nullptr) return;
    const i64 w = mean_r != nullptr ? 2 * C : C;
    std::vector<float> parts(num_partials(nx, tokens, me) * w), sum(w);
    layernorm_param_partials(nx, parts.data(), dout_r, inp_r, weight, mean_r, rstd_r, tokens, me,
                             C);
    reduce_partials(tp, nx, tokens, parts.data(), w, sum.data());
    if (dweight != nullptr) add_into(dweight, sum.data(), C);
    if (dbias != nullptr) add_into(dbias, sum.data() + C, C);
}

}  // namespace px::tp
