// The routed experts of a MoE layer (core/model/moe.h MoeLayer): router, top-k, capacity,
// experts on their gathered rows, the gated combine, and their backward with the auxiliary
// losses. Every kernel runs through kernels/ops.h; the loops here move rows and combine a few
// numbers per token, each in one fixed order.
#include "core/model/moe.h"

#include "core/base/error.h"
#include "core/base/mathfun.h"
#include "core/model/layer_ops.h"
#include "core/model/model_rows.h"
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>

namespace px {

void RouterStats::reset(i64 experts) {
    tokens.assign(static_cast<size_t>(experts), 0);
    slots = dropped = sequences = token_count = balance = z = entropy = 0;
}

i64 router_fixed(double v) {
    return std::isfinite(v) ? std::llround(std::ldexp(v, kRouterStatBits)) : 0;
}

double router_unfixed(i64 v) {
    return std::ldexp(static_cast<double>(v), -kRouterStatBits);
}

namespace {

// The expert a slot's router chose (kept or dropped: route >= 0, or -1 - e).
inline i64 chosen(std::int32_t route) {
    return route >= 0 ? route : -1 - route;
}

// The kept slots of a MoE layer in expert order, then token order: row q of the gathered
// buffers is slot slot_of[q] (token slot_of[q] / K); expert e's rows are [first[e], first[e+1]).
struct Dispatch {
    std::vector<i64> first;    // (E + 1)
    std::vector<i64> slot_of;  // per row
    std::vector<i64> row_of;   // per slot (B·T·K): its row, -1 when dropped
    i64 rows() const { return first.back(); }
};

Dispatch make_dispatch(const std::int32_t* route, i64 slots, i64 E) {
    Dispatch d;
    d.first.assign(static_cast<size_t>(E) + 1, 0);
    for (i64 s = 0; s < slots; s++)
        if (route[s] >= 0) d.first[static_cast<size_t>(route[s]) + 1]++;
    for (size_t e = 0; e < static_cast<size_t>(E); e++) d.first[e + 1] += d.first[e];
    d.slot_of.resize(static_cast<size_t>(d.first.back()));
    d.row_of.assign(static_cast<size_t>(slots), -1);
    std::vector<i64> next(d.first.begin(), d.first.end() - 1);
    for (i64 s = 0; s < slots; s++) {  // slots ascending: token order within each expert
        if (route[s] < 0) continue;
        const i64 q = next[static_cast<size_t>(route[s])]++;
        d.slot_of[static_cast<size_t>(q)] = s;
        d.row_of[static_cast<size_t>(s)] = q;
    }
    return d;
}

// Rows [lo, hi) of a buffer of w-wide rows.
Tensor rows_of(const Tensor& buf, i64 w, i64 lo, i64 hi) {
    return subview(buf, lo * w, {hi - lo, w});
}

// Expert e's (R,Cols) block of a stacked (E·R, Cols) weight.
Tensor expert_part(const Tensor& stacked, i64 e, i64 R) {
    const i64 cols = stacked.shape[1];
    Tensor t = subview(stacked, e * R * cols, {R, cols});
    t.id = stacked.id;
    return t;
}
// Row e of an (E, Cols) bias, as a vector.
Tensor expert_bias(const Tensor& biases, i64 e) {
    const i64 cols = biases.shape[1];
    return subview(biases, e * cols, {cols});
}

// dst[q·ld ..] = src[token of row q] for every gathered row (C values each; rows ld apart).
void gather_rows(float* dst, i64 ld, const Tensor& src, const Dispatch& d, i64 K, i64 C) {
    const float* s = src.f32();
    const i64 rows = d.rows();
#pragma omp parallel for schedule(static)
    for (i64 q = 0; q < rows; q++) {
        const float* row = s + (d.slot_of[static_cast<size_t>(q)] / K) * C;
        std::copy(row, row + C, dst + q * ld);
    }
}

// Expert parallelism: how one MoE layer's routed rows cross the ep group (model.h ExpertLayers).
// A rank's kept slots in Dispatch order are its rows for owner 0's experts, then owner 1's, ...
// (expert order, then token order); an owner takes its experts' rows expert by expert, each
// expert's rows source by source. Sources own consecutive token ranges of the batch, so an
// expert's rows are in batch token order, as on one device.
struct ExpertRoute {
    i64 P = 1, EL = 0;
    std::vector<i64> sent;   // (P·EL): rows this rank sends to owner o's local expert e [o·EL + e]
    std::vector<i64> got;    // (P·EL): rows source s sends to this rank's local expert e [s·EL + e]
    std::vector<i64> at;     // (P·EL): where source s's rows of expert e start among this rank's
    std::vector<i64> first;  // (EL + 1): this rank's rows of local expert e, [first[e], first[e+1])
    i64 rows() const { return first.back(); }
    i64 sent_to(i64 o) const { return sum(sent, o); }
    i64 got_from(i64 s) const { return sum(got, s); }

private:
    i64 sum(const std::vector<i64>& v, i64 k) const {
        i64 n = 0;
        for (i64 e = 0; e < EL; e++) n += v[static_cast<size_t>(k * EL + e)];
        return n;
    }
};

ExpertRoute make_route(const ExpertLayers& x, const Dispatch& d, i64 E) {
    ExpertRoute r;
    r.P = x.size();
    r.EL = E / r.P;
    const size_t n = static_cast<size_t>(E);
    r.sent.resize(n);
    for (size_t e = 0; e < n; e++) r.sent[e] = d.first[e + 1] - d.first[e];
    r.got.resize(n);
    x.exchange_counts(r.got.data(), r.sent.data(), r.EL);
    r.at.resize(n);
    r.first.assign(static_cast<size_t>(r.EL) + 1, 0);
    i64 row = 0;
    for (i64 e = 0; e < r.EL; e++) {
        r.first[static_cast<size_t>(e)] = row;
        for (i64 s = 0; s < r.P; s++) {
            r.at[static_cast<size_t>(s * r.EL + e)] = row;
            row += r.got[static_cast<size_t>(s * r.EL + e)];
        }
    }
    r.first.back() = row;
    return r;
}

// src: this rank's routed rows in Dispatch order, w values each -> dst: the rows of this rank's
// experts from every source, in expert-then-source order.
template <class T>
void to_owners(const ExpertLayers& x, const ExpertRoute& r, const T* src, i64 w, T* dst) {
    std::vector<i64> in(static_cast<size_t>(r.P)), out(static_cast<size_t>(r.P));
    for (i64 k = 0; k < r.P; k++) {
        in[static_cast<size_t>(k)] = r.sent_to(k) * w;
        out[static_cast<size_t>(k)] = r.got_from(k) * w;
    }
    std::vector<T> staged(static_cast<size_t>(r.rows() * w));  // source by source
    x.exchange(staged.data(), out, src, in);
    const T* at = staged.data();
    for (i64 s = 0; s < r.P; s++)
        for (i64 e = 0; e < r.EL; e++) {
            const i64 n = r.got[static_cast<size_t>(s * r.EL + e)] * w;
            std::copy(at, at + n, dst + r.at[static_cast<size_t>(s * r.EL + e)] * w);
            at += n;
        }
}

// The way back: src (this rank's experts' rows, expert-then-source order) -> dst (the rows this
// rank routed, Dispatch order).
void to_sources(const ExpertLayers& x, const ExpertRoute& r, const float* src, i64 w, float* dst) {
    std::vector<i64> in(static_cast<size_t>(r.P)), out(static_cast<size_t>(r.P));
    std::vector<float> staged(static_cast<size_t>(r.rows() * w));
    float* at = staged.data();
    for (i64 s = 0; s < r.P; s++) {
        in[static_cast<size_t>(s)] = r.got_from(s) * w;
        out[static_cast<size_t>(s)] = r.sent_to(s) * w;
        for (i64 e = 0; e < r.EL; e++) {
            const i64 n = r.got[static_cast<size_t>(s * r.EL + e)] * w;
            const float* from = src + r.at[static_cast<size_t>(s * r.EL + e)] * w;
            at = std::copy(from, from + n, at);
        }
    }
    x.exchange(dst, out, staged.data(), in);
}

// dweight (OC,C) and dbias (OC; null: none) += the weight gradient of one expert over one token
// node: its rows [lo, hi) (dout (rows,OC), inp (rows,C), tokens token_of[q] ascending, all inside
// the node's tokens [t0, t1)), in the canonical order of moe.h: per block of the node's tokens,
// the sum over the block's rows in token order, then the canonical tree over the blocks, absent
// blocks skipped. Fast mode: one matmul_backward over the rows.
void expert_grads(const Numerics& nx, const Tensor& dweight, const Tensor* dbias,
                  const Tensor& dout, const Tensor& inp, const Tensor& weight,
                  const std::vector<i64>& token_of, i64 lo, i64 hi, i64 t0, i64 t1) {
    const i64 OC = dweight.shape[0], C = dweight.shape[1];
    if (hi <= lo) return;
    const Tensor d = rows_of(dout, OC, lo, hi), x = rows_of(inp, C, lo, hi);
    if (nx.mode == Mode::fast) {
        ops::matmul_backward(nx, nullptr, &dweight, dbias, d, x, weight);
        return;
    }
    const i64 nb = num_blocks(t1 - t0, nx.block), w = OC * C + (dbias ? OC : 0);
    const MergeSchedule ms = make_merge_schedule(nb);
    std::vector<float> stack(static_cast<size_t>((ms.depth + 1) * w));
    std::vector<unsigned char> present(static_cast<size_t>(ms.depth) + 1, 0);
    const float* dp = dout.f32();
    int sp = 0;
    i64 q = lo;
    for (i64 blk = 0; blk < nb; blk++) {
        const i64 end = t0 + (blk + 1) * nx.block;
        i64 q1 = q;
        while (q1 < hi && token_of[static_cast<size_t>(q1)] < end) q1++;
        float* top = stack.data() + sp * w;
        present[static_cast<size_t>(sp)] = q1 > q;
        if (q1 > q) {
            Tensor at = view_f32(const_cast<float*>(dp) + q * OC, {OC, q1 - q});  // doutᵀ
            at.strides = {1, OC};
            ops::gemm(nx, view_f32(top, {OC, C}), at, rows_of(inp, C, q, q1), false);
            for (i64 o = 0; dbias && o < OC; o++) {
                float acc = 0.0f;
                for (i64 r = q; r < q1; r++) acc = acc + dp[r * OC + o];
                top[OC * C + o] = acc;
            }
        }
        sp++;
        for (int m = ms.merges_after[static_cast<size_t>(blk)]; m > 0; m--) {
            sp--;  // node = left (below) + right (top)
            float* left = stack.data() + (sp - 1) * w;
            const float* right = stack.data() + sp * w;
            const size_t li = static_cast<size_t>(sp) - 1, ri = static_cast<size_t>(sp);
            if (present[li] && present[ri])
                for (i64 k = 0; k < w; k++) left[k] = left[k] + right[k];
            else if (present[ri])
                std::copy(right, right + w, left);
            present[li] = present[li] || present[ri];
        }
        q = q1;
    }
    PX_ASSERT(sp == 1 && q == hi, "an expert's rows must lie inside its token node");
    if (!present[0]) return;
    float* dw = dweight.f32();
    for (i64 k = 0; k < OC * C; k++) dw[k] = dw[k] + stack[static_cast<size_t>(k)];
    if (!dbias) return;
    float* db = dbias->f32();
    for (i64 o = 0; o < OC; o++) db[o] = db[o] + stack[static_cast<size_t>(OC * C + o)];
}

// The experts a rank holds, on their gathered rows: local expert e takes rows [first[e],
// first[e + 1]) of every buffer below, in token order.
struct ExpertRows {
    const LayerOps& ops;
    int l;  // the model layer
    const std::vector<i64>& first;
    // Backward only: each row's token, and the token nodes the weight gradients go to.
    const std::vector<i64>* token_of = nullptr;
    std::span<const TokenNode> nodes = {};
    i64 experts() const { return static_cast<i64>(first.size()) - 1; }
    i64 rows() const { return first.back(); }
    i64 lo(i64 e) const { return first[static_cast<size_t>(e)]; }
    i64 hi(i64 e) const { return first[static_cast<size_t>(e) + 1]; }
};
constexpr int kNoBias = -1;

// out (rows,R) = inp (rows,I) · w_eᵀ (+ b_e) on each expert's rows: w the stacked (EL·R, I)
// weight, bias its (EL, R) biases or kNoBias.
void experts_linear_forward(const ExpertRows& x, const Tensor& out, const Tensor& inp, LayerParam w,
                            int bias) {
    const Tensor stacked = x.ops.param(x.l, w);
    const i64 R = stacked.shape[0] / std::max<i64>(x.experts(), 1), I = stacked.shape[1];
    for (i64 e = 0; e < x.experts(); e++) {
        if (x.hi(e) == x.lo(e)) continue;
        Tensor b;
        if (bias != kNoBias) b = expert_bias(x.ops.param(x.l, static_cast<LayerParam>(bias)), e);
        ops::matmul_forward(x.ops.numerics(), rows_of(out, R, x.lo(e), x.hi(e)),
                            rows_of(inp, I, x.lo(e), x.hi(e)), expert_part(stacked, e, R),
                            bias != kNoBias ? &b : nullptr);
    }
}

// dinp (rows,I) += dout (rows,R) · w_e on each expert's rows, and w_e's (and b_e's) gradient
// per token node from dout and inp, in the canonical order (expert_grads).
void experts_linear_backward(const ExpertRows& x, const Tensor& dinp, const Tensor& dout,
                             const Tensor& inp, LayerParam w, int bias) {
    const Numerics& nx = x.ops.numerics();
    const Tensor stacked = x.ops.param(x.l, w);
    const i64 R = stacked.shape[0] / std::max<i64>(x.experts(), 1), I = stacked.shape[1];
    const std::vector<i64>& token_of = *x.token_of;
    auto G = [&](int pm, size_t n) {
        return in_node(x.ops.grad(x.nodes[0].grads, x.l, static_cast<LayerParam>(pm)), x.nodes, n);
    };
    for (i64 e = 0; e < x.experts(); e++) {
        const i64 lo = x.lo(e), hi = x.hi(e);
        if (hi == lo) continue;
        const Tensor we = expert_part(stacked, e, R), di = rows_of(dinp, I, lo, hi);
        ops::matmul_backward(nx, &di, nullptr, nullptr, rows_of(dout, R, lo, hi),
                             rows_of(inp, I, lo, hi), we);
        auto at = [&](i64 t) {
            return std::lower_bound(token_of.begin() + lo, token_of.begin() + hi, t) -
                   token_of.begin();
        };
        for (size_t n = 0; n < x.nodes.size(); n++) {
            Tensor db;
            if (bias != kNoBias) db = expert_bias(G(bias, n), e);
            const TokenNode& node = x.nodes[n];
            expert_grads(nx, expert_part(G(w, n), e, R), bias != kNoBias ? &db : nullptr, dout, inp,
                         we, token_of, at(node.lo), at(node.hi), node.lo, node.hi);
        }
    }
}

// One MoE layer's expert buffers over the rows of the experts held. Forward: the gathered inputs
// in, the first projection h (GPT-2's c_fc, Llama's gate), Llama's up projection, the
// activation act (gelu(h), or silu(h)·up) and the outputs. Backward adds d(out), which becomes
// d(in), and FE-wide scratch for d(act), d(h) and d(up).
struct ExpertBufs {
    Tensor in, h, up, act, out;
    Tensor dy, dact, dh, dup;
};

// The experts' MLP of an architecture, forward and backward on ExpertBufs.
struct ExpertMlp {
    void (*forward)(const ExpertRows&, const ExpertBufs&);
    void (*backward)(const ExpertRows&, const ExpertBufs&);
};

// FE-wide rows [0, rows) of a buffer.
Tensor ffn_rows(const ExpertRows& x, const Tensor& t, i64 FE) {
    return rows_of(t, FE, 0, x.rows());
}

// GPT-2: out = c_proj(gelu(c_fc(in) + b_fc)) + b_proj.
void gelu_experts_forward(const ExpertRows& x, const ExpertBufs& t) {
    const i64 FE = x.ops.config().expert_ffn();
    experts_linear_forward(x, t.h, t.in, EFCW, EFCB);
    if (x.rows() > 0)
        ops::gelu_forward(x.ops.numerics(), ffn_rows(x, t.act, FE), ffn_rows(x, t.h, FE));
    experts_linear_forward(x, t.out, t.act, EPROJW, EPROJB);
}

void gelu_experts_backward(const ExpertRows& x, const ExpertBufs& t) {
    const i64 FE = x.ops.config().expert_ffn(), C = x.ops.config().hidden;
    if (x.rows() > 0) zero(ffn_rows(x, t.dact, FE));
    experts_linear_backward(x, t.dact, t.dy, t.act, EPROJW, EPROJB);
    if (x.rows() > 0) {
        zero(ffn_rows(x, t.dh, FE));
        ops::gelu_backward(x.ops.numerics(), ffn_rows(x, t.dh, FE), ffn_rows(x, t.h, FE),
                           ffn_rows(x, t.dact, FE));
        zero(rows_of(t.dy, C, 0, x.rows()));  // d(expert input) from here on
    }
    experts_linear_backward(x, t.dy, t.dh, t.in, EFCW, EFCB);
}

// Llama: out = down(silu(gate(in)) · up(in)), no biases.
void swiglu_experts_forward(const ExpertRows& x, const ExpertBufs& t) {
    const i64 FE = x.ops.config().expert_ffn();
    experts_linear_forward(x, t.h, t.in, EFCW, kNoBias);
    experts_linear_forward(x, t.up, t.in, EUPW, kNoBias);
    if (x.rows() > 0)
        ops::swiglu_forward(x.ops.numerics(), ffn_rows(x, t.act, FE), ffn_rows(x, t.h, FE),
                            ffn_rows(x, t.up, FE));
    experts_linear_forward(x, t.out, t.act, EPROJW, kNoBias);
}

// d(in) sums gate's part, then up's, on each row (the order of the dense SwiGLU MLP).
void swiglu_experts_backward(const ExpertRows& x, const ExpertBufs& t) {
    const i64 FE = x.ops.config().expert_ffn(), C = x.ops.config().hidden;
    if (x.rows() > 0) zero(ffn_rows(x, t.dact, FE));
    experts_linear_backward(x, t.dact, t.dy, t.act, EPROJW, kNoBias);
    if (x.rows() > 0) {
        zero(ffn_rows(x, t.dh, FE));
        zero(ffn_rows(x, t.dup, FE));
        ops::swiglu_backward(x.ops.numerics(), ffn_rows(x, t.dh, FE), ffn_rows(x, t.dup, FE),
                             ffn_rows(x, t.h, FE), ffn_rows(x, t.up, FE), ffn_rows(x, t.dact, FE));
        zero(rows_of(t.dy, C, 0, x.rows()));  // d(expert input) from here on
    }
    experts_linear_backward(x, t.dy, t.dh, t.in, EFCW, kNoBias);
    experts_linear_backward(x, t.dy, t.dup, t.in, EUPW, kNoBias);
}

// The experts' MLP of mc's architecture: the one place this file tells them apart.
ExpertMlp expert_mlp(const ModelConfig& mc) {
    if (mc.llama()) return {swiglu_experts_forward, swiglu_experts_backward};
    return {gelu_experts_forward, gelu_experts_backward};
}

// A layer's expert buffers (backward's scratch included).
ExpertBufs expert_bufs(const Activations& a, int i) {
    ExpertBufs t;
    t.in = a.tensor(EBUF_C);
    t.h = a.layer(EFCH, i);
    t.up = a.layer(EFCH_UP, i);
    t.act = a.layer(EFCH_GELU, i);
    t.dy = a.tensor(EBUF_C2);
    t.dact = a.tensor(EBUF_F);
    t.dh = a.tensor(EBUF_F2);
    t.dup = a.tensor(EBUF_F3);
    return t;
}

}  // namespace

MoeLayer::MoeLayer(const LayerOps& ops, const ExpertLayers* experts, RouterStats* router_stats)
    : ops_(ops),
      mc_(ops.config()),
      nx_(ops.numerics()),
      experts_(experts),
      router_stats_(router_stats) {}

void MoeLayer::forward(Activations& a, int l, int i, const Tensor& out, bool probed) const {
    PX_ASSERT(!ops_.sequence_parallel(),
              "MoE layers run on whole tensors (no sequence parallelism)");
    PX_ASSERT(mc_.moe_experts % (experts_ ? experts_->size() : 1) == 0,
              "expert parallelism needs whole experts per rank");
    const i64 B = a.shape().B, T = a.shape().T, BT = B * T, C = mc_.hidden;
    const i64 E = mc_.moe_experts, K = mc_.moe_top_k;
    const Tensor ln2 = a.layer(LN2, i), probs = a.layer(ROUTER_PROBS, i);
    float* p = probs.f32();
    float* lse = a.layer(ROUTER_LSE, i).f32();
    float* gate = a.layer(MOE_GATES, i).f32();
    std::int32_t* route = a.routes(i);

    // The router: logits, then their softmax in place and the logsumexp.
    ops::matmul_forward(nx_, probs, ln2, ops_.param(l, ROUTERW), nullptr);
    if (probed) ops_.probe("fwd", l, "moe.router", "out", probs);
    const Tensor pt = view_f32(p, {BT, E}), lt = view_f32(lse, {BT});
    std::vector<float> sums(static_cast<size_t>(BT));
    ops::row_max(nx_, lt, pt);
    ops::exp_sub(nx_, pt, pt, lt);
    ops::row_sum(nx_, view_f32(sums.data(), {BT}), pt);
#pragma omp parallel for schedule(static)
    for (i64 r = 0; r < BT; r++) {
        const float s = sums[static_cast<size_t>(r)];
        for (i64 e = 0; e < E; e++) p[r * E + e] = p[r * E + e] / s;
        lse[r] = lse[r] + mathfun::log(s);
    }
    if (probed) ops_.probe("fwd", l, "moe.softmax", "out", probs);

    // Top-k (ties: the lower expert) and the gates.
#pragma omp parallel for schedule(static)
    for (i64 r = 0; r < BT; r++) {
        const float* pr = p + r * E;
        std::int32_t* rr = route + r * K;
        float S = 0.0f;
        for (i64 j = 0; j < K; j++) {
            i64 best = -1;
            for (i64 e = 0; e < E; e++) {
                if (std::find(rr, rr + j, static_cast<std::int32_t>(e)) != rr + j) continue;
                if (best < 0 || pr[e] > pr[best]) best = e;
            }
            rr[j] = static_cast<std::int32_t>(best);
            S = S + pr[best];
        }
        for (i64 j = 0; j < K; j++)
            gate[r * K + j] = mc_.moe_norm_topk ? pr[rr[j]] / S : pr[rr[j]];
    }
    // Capacity, per sequence: first choices first, each in token order.
    if (mc_.moe_capacity_factor > 0) {
        const i64 cap = static_cast<i64>(
            std::ceil(mc_.moe_capacity_factor * double(T) * double(K) / double(E)));
        std::vector<i64> taken(static_cast<size_t>(E));
        for (i64 b = 0; b < B; b++) {
            std::fill(taken.begin(), taken.end(), 0);
            for (i64 j = 0; j < K; j++)
                for (i64 t = 0; t < T; t++) {
                    std::int32_t& s = route[(b * T + t) * K + j];
                    if (taken[static_cast<size_t>(s)] < cap)
                        taken[static_cast<size_t>(s)]++;
                    else
                        s = -1 - s;
                }
        }
    }

    // The experts on their gathered rows: every expert here, or under expert parallelism this
    // rank's experts on the rows every rank of the ep group routed to them (their outputs go
    // back to the rank that routed each row).
    const Dispatch d = make_dispatch(route, BT * K, E);
    const ExpertLayers* x = experts_;
    ExpertBufs bufs = expert_bufs(a, i);
    const Tensor eout = a.layer(EOUT, i);
    ExpertRoute r;
    if (x) {
        r = make_route(*x, d, E);
        std::vector<float> mine(static_cast<size_t>(d.rows() * C));
        gather_rows(mine.data(), C, ln2, d, K, C);
        to_owners(*x, r, mine.data(), C, bufs.in.f32());
    } else {
        gather_rows(bufs.in.f32(), C, ln2, d, K, C);
    }
    bufs.out = x ? a.tensor(EBUF_C2) : eout;  // the experts' outputs, their rows
    expert_mlp(mc_).forward(ExpertRows{ops_, l, x ? r.first : d.first}, bufs);
    if (x) to_sources(*x, r, bufs.out.f32(), C, eout.f32());

    // The combine: out = fma(gate_j, expert_j, out) in k order, kept slots only.
    float* o = out.f32();
    const float* y = eout.f32();
#pragma omp parallel for schedule(static)
    for (i64 r = 0; r < BT; r++)
        for (i64 j = 0; j < K; j++) {
            const i64 q = d.row_of[static_cast<size_t>(r * K + j)];
            if (q < 0) continue;
            const float g = gate[r * K + j];
            for (i64 c = 0; c < C; c++) o[r * C + c] = std::fma(g, y[q * C + c], o[r * C + c]);
        }
    if (probed) ops_.probe("fwd", l, "moe.combine", "out", out);
    if (!probed || !router_stats_) return;

    // Statistics of the step's routing (moe.h RouterStats), per sequence.
    RouterStats& st = router_stats_[l];
    PX_ASSERT(static_cast<i64>(st.tokens.size()) == E, "router statistics sized for another E");
    std::vector<double> f(static_cast<size_t>(E)), mean_p(static_cast<size_t>(E));
    for (i64 b = 0; b < B; b++) {
        std::fill(f.begin(), f.end(), 0.0);
        std::fill(mean_p.begin(), mean_p.end(), 0.0);
        for (i64 t = 0; t < T; t++) {
            const i64 r = b * T + t;
            double H = 0;
            for (i64 e = 0; e < E; e++) {
                const double pe = p[r * E + e];
                mean_p[static_cast<size_t>(e)] += pe / double(T);
                if (pe > 0) H -= pe * std::log(pe);
            }
            st.entropy += router_fixed(H);
            st.z += router_fixed(double(lse[r]) * double(lse[r]));
            for (i64 j = 0; j < K; j++) {
                const std::int32_t s = route[r * K + j];
                f[static_cast<size_t>(chosen(s))] += 1.0 / double(T * K);
                if (s >= 0)
                    st.tokens[static_cast<size_t>(s)]++;
                else
                    st.dropped++;
            }
        }
        double balance = 0;
        for (i64 e = 0; e < E; e++)
            balance += f[static_cast<size_t>(e)] * mean_p[static_cast<size_t>(e)];
        st.balance += router_fixed(double(E) * balance);
    }
    st.slots += BT * K;
    st.sequences += B;
    st.token_count += BT;
}

void MoeLayer::backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                        const Tensor& dout, const Tensor& dln2, float dloss) const {
    const i64 B = a.shape().B, T = a.shape().T, BT = B * T, C = mc_.hidden;
    const i64 E = mc_.moe_experts, K = mc_.moe_top_k;
    const Tensor ln2 = a.layer(LN2, i), probs = a.layer(ROUTER_PROBS, i);
    const float* p = probs.f32();
    const float* lse = a.layer(ROUTER_LSE, i).f32();
    const float* gate = a.layer(MOE_GATES, i).f32();
    const std::int32_t* route = a.routes(i);
    const Dispatch d = make_dispatch(route, BT * K, E);
    const i64 rows = d.rows();  // the slots this rank routed (kept ones)
    const ExpertLayers* x = experts_;

    const ExpertBufs bufs = expert_bufs(a, i);
    const Tensor in = bufs.in, dy = bufs.dy, eout = a.layer(EOUT, i);
    // This rank's routed rows: their inputs and d(expert output), in the experts' buffers or,
    // under expert parallelism, as [ln2 | d(expert output)] rows to send to the experts' owners.
    std::vector<float> mine;
    if (x) mine.resize(static_cast<size_t>(rows * 2 * C));
    float* const xin = x ? mine.data() : in.f32();
    float* const dyp = x ? mine.data() + C : dy.f32();
    const i64 ld = x ? 2 * C : C;
    gather_rows(xin, ld, ln2, d, K, C);

    // The combine: d(expert output) = gate · dout, d(gate) = dout · expert output.
    const float* g_out = dout.f32();
    const float* y = eout.f32();
    std::vector<float> dgate(static_cast<size_t>(BT * K), 0.0f);
#pragma omp parallel for schedule(static)
    for (i64 q = 0; q < rows; q++) {
        const i64 s = d.slot_of[static_cast<size_t>(q)], r = s / K;
        for (i64 c = 0; c < C; c++) dyp[q * ld + c] = gate[s] * g_out[r * C + c];
        dgate[static_cast<size_t>(s)] = canonical_dot(g_out + r * C, y + q * C, C, nx_.block);
    }

    // The rows this rank's experts take, each with its token (batch tokens under expert
    // parallelism, whose token nodes are every source's), and the nodes their gradients go to.
    ExpertRoute route_x;
    std::vector<i64> token_of;
    std::vector<TokenNode> all_nodes;
    if (x) {
        route_x = make_route(*x, d, E);
        const i64 own = route_x.rows();
        std::vector<float> got(static_cast<size_t>(own * 2 * C));
        to_owners(*x, route_x, mine.data(), 2 * C, got.data());
        float* pi = in.f32();
        float* pd = dy.f32();
#pragma omp parallel for schedule(static)
        for (i64 q = 0; q < own; q++) {
            const float* g = got.data() + q * 2 * C;
            std::copy(g, g + C, pi + q * C);
            std::copy(g + C, g + 2 * C, pd + q * C);
        }
        std::vector<i64> ids(static_cast<size_t>(rows));
        for (i64 q = 0; q < rows; q++)
            ids[static_cast<size_t>(q)] = x->token_base() + d.slot_of[static_cast<size_t>(q)] / K;
        token_of.resize(static_cast<size_t>(own));
        to_owners(*x, route_x, ids.data(), 1, token_of.data());
        for (int s = 0; s < x->size(); s++) {
            const std::span<const TokenNode> sn = x->source_nodes(s);
            all_nodes.insert(all_nodes.end(), sn.begin(), sn.end());
        }
    } else {
        token_of.resize(static_cast<size_t>(rows));
        for (i64 q = 0; q < rows; q++)
            token_of[static_cast<size_t>(q)] = d.slot_of[static_cast<size_t>(q)] / K;
        all_nodes.assign(nodes.begin(), nodes.end());
    }
    // The experts, each on its rows; weight gradients per token node. dy holds d(input) after.
    ExpertRows rows_x{ops_, l, x ? route_x.first : d.first};
    rows_x.token_of = &token_of;
    rows_x.nodes = all_nodes;
    expert_mlp(mc_).backward(rows_x, bufs);
    // d(ln2) += each kept slot's input gradient, in k order (back from the experts' owners).
    std::vector<float> back;
    if (x) {
        back.resize(static_cast<size_t>(rows * C));
        to_sources(*x, route_x, dy.f32(), C, back.data());
    }
    const float* dxp = x ? back.data() : dy.f32();
    float* dx = dln2.f32();
#pragma omp parallel for schedule(static)
    for (i64 r = 0; r < BT; r++)
        for (i64 j = 0; j < K; j++) {
            const i64 q = d.row_of[static_cast<size_t>(r * K + j)];
            if (q < 0) continue;
            for (i64 c = 0; c < C; c++) dx[r * C + c] = dx[r * C + c] + dxp[q * C + c];
        }

    // The router: d(probabilities) from the gates and the load-balancing loss, then through
    // the softmax, plus the z-loss's d(logits).
    const Tensor dlogits = a.tensor(ROUTER_D);
    float* dl = dlogits.f32();
    const float aux = static_cast<float>(mc_.moe_aux_loss * double(E));
    const float z2 = static_cast<float>(2.0 * mc_.moe_z_loss);
#pragma omp parallel for schedule(static)
    for (i64 b = 0; b < B; b++) {
        std::vector<float> share(static_cast<size_t>(E), 0.0f);  // aux · E · f_i · dloss
        {
            std::vector<i64> count(static_cast<size_t>(E), 0);
            for (i64 s = b * T * K; s < (b + 1) * T * K; s++)
                count[static_cast<size_t>(chosen(route[s]))]++;
            for (i64 e = 0; e < E; e++)
                share[static_cast<size_t>(e)] =
                    aux * (static_cast<float>(count[static_cast<size_t>(e)]) /
                           static_cast<float>(T * K)) * dloss;
        }
        for (i64 r = b * T; r < (b + 1) * T; r++) {
            const float* pr = p + r * E;
            float* dp = dl + r * E;
            std::copy(share.begin(), share.end(), dp);
            float S = 0.0f, sdot = 0.0f;
            for (i64 j = 0; j < K; j++) {
                S = S + pr[chosen(route[r * K + j])];
                sdot = std::fma(dgate[static_cast<size_t>(r * K + j)], gate[r * K + j], sdot);
            }
            for (i64 j = 0; j < K; j++) {
                const float dg = dgate[static_cast<size_t>(r * K + j)];
                float& t = dp[chosen(route[r * K + j])];
                t = t + (mc_.moe_norm_topk ? (dg - sdot) / S : dg);
            }
            const float dot = canonical_dot(pr, dp, E, nx_.block);
            const float zl = z2 * lse[r] * dloss;
            for (i64 e = 0; e < E; e++) dp[e] = std::fma(zl, pr[e], pr[e] * (dp[e] - dot));
        }
    }
    ops_.probe("bwd", l, "moe.router", "dinp", dlogits);
    // On whole tensors, as every tp rank runs a MoE layer: the plain kernels (no layers).
    linear_backward_rows(nullptr, nx_, nodes, Linear::fc, &dln2,
                         ops_.grad(nodes[0].grads, l, ROUTERW), nullptr, dlogits, ln2,
                         ops_.param(l, ROUTERW));
}

}  // namespace px
