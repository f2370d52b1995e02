#include "core/model/layer_ops.h"

#include "core/model/model_rows.h"

#include "core/base/error.h"
#include "kernels/ops.h"

#include <algorithm>
#include <limits>

namespace px {

namespace {

// The largest unmasked entry of preatt (B,NH,T,T): row t of a head holds keys 0..t (the rest
// are masked zeros), so each row's max is taken over its first t+1 entries.
float causal_logit_max(const Numerics& nx, const Tensor& preatt) {
    const i64 T = preatt.shape[preatt.ndim - 1];
    const i64 rows = preatt.numel() / T;
    float best = -std::numeric_limits<float>::infinity(), row = 0;
    const Tensor out = view_f32(&row, {1}, "logit_max");
    for (i64 r = 0; r < rows; r++) {
        const i64 t = r % T;
        ops::row_max(nx, out, subview(preatt, r * T, {1, t + 1}));
        best = std::max(best, row);
    }
    return best;
}

}  // namespace

// ---- linears ---------------------------------------------------------------------------------

void LayerOps::linear_forward(Linear l, const Tensor& out, const Tensor& inp, const Tensor& weight,
                              const Tensor* bias, bool record, bool whole) const {
    Fp8Scaling* const fp8 = layout_.fp8;
    if (const int g = fp8 ? fp8->gemm_of(weight.id) : -1; g >= 0)
        fp8_linears().forward(g, l, out, inp, weight, bias, record);
    else if (layout_.layers && !whole)
        layout_.layers->linear_forward(nx_, l, out, inp, weight, bias);
    else
        ops::matmul_forward(nx_, out, inp, weight, bias);
}

void LayerOps::linear_backward(std::span<const TokenNode> nodes, Linear l, const Tensor& dinp,
                               const Tensor& dweight, const Tensor* dbias, const Tensor& dout,
                               const Tensor& inp, const Tensor& weight, bool whole) const {
    Fp8Scaling* const fp8 = layout_.fp8;
    const ParallelLayers* layers = whole ? nullptr : layout_.layers;
    if (const int g = fp8 ? fp8->gemm_of(weight.id) : -1; g >= 0) {
        fp8_linears().backward(g, nodes, l, dinp, dweight, dbias, dout, inp, weight);
    } else if (WeightGradQueue* q = layout_.defer) {
        // B: dinp now. W: the weight gradients from a copy of dout (backward scratch).
        const Tensor none{};
        linear_backward_rows(layers, nx_, nodes, l, &dinp, none, nullptr, dout, inp, weight);
        q->defer([=, &nx = nx_, nodes = std::vector<TokenNode>(nodes.begin(), nodes.end()),
                  dout = q->keep(dout), inp = q->input(inp),
                  db = dbias ? *dbias : Tensor{}] {
            linear_backward_rows(layers, nx, nodes, l, nullptr, dweight, db.data ? &db : nullptr,
                                 dout, inp, weight);
        });
    } else {
        linear_backward_rows(layers, nx_, nodes, l, &dinp, dweight, dbias, dout, inp, weight);
    }
}

void linear_backward_rows(const ParallelLayers* layers, const Numerics& nx,
                          std::span<const TokenNode> nodes, Linear l, const Tensor* dinp,
                          const Tensor& dweight, const Tensor* dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight) {
    auto backward = [&](const Tensor* di, const Tensor* dw, const Tensor* db, const Tensor& d,
                        const Tensor& i) {
        if (layers)
            layers->linear_backward(nx, l, di, dw, db, d, i, weight);
        else
            ops::matmul_backward(nx, di, dw, db, d, i, weight);
    };
    const bool weights = dweight.data != nullptr;  // none: dinp alone (a deferring B)
    if (nodes.size() == 1) {
        backward(dinp, weights ? &dweight : nullptr, weights ? dbias : nullptr, dout, inp);
        return;
    }
    if (dinp) backward(dinp, nullptr, nullptr, dout, inp);
    if (!weights) return;
    const i64 BT = inp.numel() / inp.shape[inp.ndim - 1];
    for (size_t n = 0; n < nodes.size(); n++) {
        const Tensor dw = in_node(dweight, nodes, n);
        const Tensor db = dbias ? in_node(*dbias, nodes, n) : Tensor{};
        backward(nullptr, &dw, dbias ? &db : nullptr, node_rows(dout, nodes[n].lo, nodes[n].hi, BT),
                 node_rows(inp, nodes[n].lo, nodes[n].hi, BT));
    }
}

// ---- LayerNorms and residual adds ------------------------------------------------------------

// Under sequence parallelism these run on this rank's token rows only (BT from mean/rstd's and
// a's (B,T) token count).
void LayerOps::layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                 const Tensor& inp, const Tensor& weight,
                                 const Tensor& bias) const {
    if (!layout_.sp) {
        ops::layernorm_forward(nx_, out, mean, rstd, inp, weight, bias);
        return;
    }
    const i64 BT = mean.numel();
    const TokenRows r = layout_.layers->token_rows(BT);
    ops::layernorm_forward(nx_, token_view(out, r, BT), token_view(mean, r, BT),
                           token_view(rstd, r, BT), token_view(inp, r, BT), weight, bias);
}

// A norm's weight (and bias) gradients, node by node over the node's rows: under sequence
// parallelism through `layers` (this rank's token rows; a LayerNorm when mean has data, else an
// RMSNorm), else the kernels on the node's rows (an RMSNorm's rows may be (B,T,G,C): G per token).
// Free of LayerOps, whose pass may end before a deferred W runs.
namespace {
void norm_weight_grads(const ParallelLayers* layers, bool sp, const Numerics& nx,
                       std::span<const TokenNode> nodes, const Tensor& dweight, const Tensor* dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight,
                       const Tensor& mean, const Tensor& rstd) {
    const bool rms = mean.data == nullptr;
    const i64 BT = rstd.numel();
    if (!sp && rms && nodes.size() == 1) {  // (B,T) or (B,T,G) statistics, whole
        ops::rmsnorm_backward(nx, nullptr, &dweight, dout, inp, weight, rstd);
        return;
    }
    const i64 G = rms && inp.ndim == 4 ? inp.shape[2] : 1, C = inp.shape[inp.ndim - 1];
    for (size_t n = 0; n < nodes.size(); n++) {
        const i64 lo = nodes[n].lo, hi = nodes[n].hi;
        const Tensor dw = in_node(dweight, nodes, n);
        const Tensor db = dbias ? in_node(*dbias, nodes, n) : Tensor{};
        if (sp) {
            layers->layernorm_backward(nullptr, &dw, dbias ? &db : nullptr, dout, inp, weight,
                                       mean, rstd, lo, hi);
        } else if (rms) {
            ops::rmsnorm_backward(nx, nullptr, &dw, subview(dout, lo * G * C, {1, hi - lo, G, C}),
                                  subview(inp, lo * G * C, {1, hi - lo, G, C}), weight,
                                  subview(rstd, lo * G, {1, hi - lo, G}));
        } else {
            ops::layernorm_backward(nx, nullptr, &dw, &db, node_rows(dout, lo, hi, BT),
                                    node_rows(inp, lo, hi, BT), weight,
                                    node_rows(mean, lo, hi, BT), node_rows(rstd, lo, hi, BT));
        }
    }
}
}  // namespace

// The weight gradients of a norm after its dinp: now, or (a deferring B) kept for W with copies
// of what the backward's scratch or a recompute would overwrite.
void LayerOps::norm_weights(std::span<const TokenNode> nodes, const Tensor& dweight,
                            const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                            const Tensor& weight, const Tensor& mean, const Tensor& rstd) const {
    const ParallelLayers* layers = layout_.layers;
    const bool sp = layout_.sp;
    WeightGradQueue* q = layout_.defer;
    if (!q) {
        norm_weight_grads(layers, sp, nx_, nodes, dweight, dbias, dout, inp, weight, mean, rstd);
        return;
    }
    q->defer([=, &nx = nx_, nodes = std::vector<TokenNode>(nodes.begin(), nodes.end()),
              dout = q->keep(dout), inp = q->input(inp),
              mean = mean.data ? q->input(mean) : Tensor{}, rstd = q->input(rstd),
              db = dbias ? *dbias : Tensor{}] {
        norm_weight_grads(layers, sp, nx, nodes, dweight, db.data ? &db : nullptr, dout, inp,
                          weight, mean, rstd);
    });
}

void LayerOps::layernorm_backward(std::span<const TokenNode> nodes, const Tensor& dinp,
                                  const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                                  const Tensor& inp, const Tensor& weight, const Tensor& mean,
                                  const Tensor& rstd) const {
    const i64 BT = mean.numel();
    if (nodes.size() == 1 && !layout_.defer) {
        if (layout_.sp)
            layout_.layers->layernorm_backward(&dinp, &dweight, &dbias, dout, inp, weight, mean,
                                               rstd, 0, BT);
        else
            ops::layernorm_backward(nx_, dinp, dweight, dbias, dout, inp, weight, mean, rstd);
        return;
    }
    if (layout_.sp)  // whole tensors and a row range: the tp ranks hold different rows of them
        layout_.layers->layernorm_backward(&dinp, nullptr, nullptr, dout, inp, weight, mean, rstd,
                                           0, BT);
    else
        ops::layernorm_backward(nx_, &dinp, nullptr, nullptr, dout, inp, weight, mean, rstd);
    norm_weights(nodes, dweight, &dbias, dout, inp, weight, mean, rstd);
}

void LayerOps::residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) const {
    if (!layout_.sp) {
        ops::residual_forward(nx_, out, a, b);
        return;
    }
    const i64 BT = out.numel() / config().hidden;
    const TokenRows r = layout_.layers->token_rows(BT);
    ops::residual_forward(nx_, token_view(out, r, BT), token_view(a, r, BT), token_view(b, r, BT));
}

void LayerOps::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp,
                               const Tensor& weight) const {
    const float eps = static_cast<float>(config().norm_eps);
    if (!layout_.sp) {
        ops::rmsnorm_forward(nx_, out, rstd, inp, weight, eps);
        return;
    }
    const i64 BT = rstd.numel();
    const TokenRows r = layout_.layers->token_rows(BT);
    ops::rmsnorm_forward(nx_, token_view(out, r, BT), token_view(rstd, r, BT),
                         token_view(inp, r, BT), weight, eps);
}

void LayerOps::rmsnorm_backward(std::span<const TokenNode> nodes, const Tensor& dinp,
                                const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                                const Tensor& weight, const Tensor& rstd) const {
    const Tensor none{};  // an RMSNorm: no mean, no bias
    if (nodes.size() == 1 && !layout_.defer) {
        if (layout_.sp)
            layout_.layers->layernorm_backward(&dinp, &dweight, nullptr, dout, inp, weight, none,
                                               rstd, 0, rstd.numel());
        else
            ops::rmsnorm_backward(nx_, dinp, dweight, dout, inp, weight, rstd);
        return;
    }
    if (layout_.sp)  // as layernorm_backward: the rank's token rows, weights node by node
        layout_.layers->layernorm_backward(&dinp, nullptr, nullptr, dout, inp, weight, none, rstd,
                                           0, rstd.numel());
    else
        ops::rmsnorm_backward(nx_, &dinp, nullptr, dout, inp, weight, rstd);
    norm_weights(nodes, dweight, nullptr, dout, inp, weight, none, rstd);
}

void LayerOps::rmsnorm_weight_grad(std::span<const TokenNode> nodes, const Tensor& dweight,
                                   const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                   const Tensor& rstd) const {
    // On whole tensors (never sequence-parallel rows): a per-head norm's (B,T,G,C) rows.
    const ParallelLayers* layers = layout_.layers;
    if (!layout_.defer) {
        norm_weight_grads(layers, false, nx_, nodes, dweight, nullptr, dout, inp, weight, Tensor{},
                          rstd);
        return;
    }
    WeightGradQueue* q = layout_.defer;
    q->defer([=, &nx = nx_, nodes = std::vector<TokenNode>(nodes.begin(), nodes.end()),
              dout = q->keep(dout), inp = q->input(inp), rstd = q->input(rstd)] {
        norm_weight_grads(layers, false, nx, nodes, dweight, nullptr, dout, inp, weight, Tensor{},
                          rstd);
    });
}

std::vector<i64> LayerOps::positions(i64 T) const {
    std::vector<i64> pos;
    if (!layout_.context) return pos;
    pos.resize(static_cast<size_t>(T));
    for (const PositionRun& r : layout_.context->runs(T))
        for (i64 w = r.lo; w < r.hi; w++) pos[static_cast<size_t>(w)] = r.pos + (w - r.lo);
    return pos;
}

// ---- attention -------------------------------------------------------------------------------

void LayerOps::attention_forward(const Tensor& out, const Tensor& preatt, const Tensor& att,
                                 const Tensor& qkv, i64 NH) const {
    if (layout_.context)
        layout_.context->attention_forward(nx_, out, preatt, att, qkv, NH);
    else
        ops::attention_forward(nx_, out, preatt, att, qkv, NH);
}

void LayerOps::attention_backward(const Tensor& dqkv, const Tensor& dpreatt, const Tensor& datt,
                                  const Tensor& dout, const Tensor& qkv, const Tensor& att,
                                  i64 NH) const {
    if (layout_.context)
        layout_.context->attention_backward(nx_, dqkv, dpreatt, datt, dout, qkv, att, NH);
    else
        ops::attention_backward(nx_, dqkv, dpreatt, datt, dout, qkv, att, NH);
}

float LayerOps::attention_logit_max(const Tensor& preatt, i64 NH) const {
    return layout_.context ? layout_.context->logit_max(nx_, preatt, NH)
                           : causal_logit_max(nx_, preatt);
}

// ---- probes ----------------------------------------------------------------------------------

// Context parallelism: a spec over the rank's (B, T/cp, ...) rows becomes one over the logical
// (B, T, ...) sequences. Each piece is cut by sequence and by run of positions; in that order the
// sub-pieces hold the piece's elements in its own row-major order (runs ascend in local rows).
ShardSpec LayerOps::context_pieces(const ShardSpec& local) const {
    PX_ASSERT(local.logical_shape.size() >= 2, "a context-parallel probe needs (B, T, ...)");
    const i64 Tl = local.logical_shape[1];
    ShardSpec out;
    out.logical_shape = local.logical_shape;
    out.logical_shape[1] = layout_.context->keys(Tl);
    const std::vector<PositionRun> runs = layout_.context->runs(Tl);
    for (const Hyperslab& p : local.pieces)
        for (i64 b = p.lo[0]; b < p.hi[0]; b++)
            for (const PositionRun& r : runs) {
                const i64 lo = std::max(p.lo[1], r.lo), hi = std::min(p.hi[1], r.hi);
                if (lo >= hi) continue;
                Hyperslab s = p;
                s.lo[0] = b;
                s.hi[0] = b + 1;
                s.lo[1] = r.pos + (lo - r.lo);
                s.hi[1] = r.pos + (hi - r.lo);
                out.pieces.push_back(std::move(s));
            }
    return out;
}

// t is a microbatch's (B,T,...) tensor: logically rows [batch_lo, batch_lo + B) of the batch's;
// under ParallelLayers this rank's piece of it, as `split` says.
void LayerOps::offer_probe(const char* phase, int layer, const char* op, const char* tensor,
                           const Tensor& t, ProbeSplit split) const {
    const ProbeKey key{
        layout_.probe_ctx ? layout_.probe_ctx->step : 0, phase, layer, op, tensor, t.dtype};
    if (!layout_.probes->wants(key)) return;
    PX_ASSERT(t.contiguous() && t.ndim >= 1, "a probed tensor must be contiguous");
    std::vector<i64> shape(t.shape.begin(), t.shape.begin() + t.ndim);
    const i64 w = shape.back();
    i64 rows = 1;  // B·T (also when w is 0: a tp rank past the last vocabulary block)
    for (size_t d = 0; d + 1 < shape.size(); d++) rows *= shape[d];
    std::vector<float> widened;  // a narrower activation, read exactly as fp32 (core/base/dtype.h)
    if (t.dtype != DType::f32) {
        widened.resize(static_cast<size_t>(t.numel()));
        convert(widened.data(), DType::f32, t.data, t.dtype, widened.size());
    }
    const float* data = t.dtype == DType::f32 ? t.f32() : widened.data();
    std::vector<float> staged;  // the pieces back to back, when the local layout interleaves them
    ShardSpec spec;
    if (!layout_.layers || split == ProbeSplit::whole) {
        spec.logical_shape = shape;
        spec.pieces.push_back({std::vector<i64>(shape.size(), 0), shape});
    } else if (split == ProbeSplit::tokens) {  // this rank's token rows (all of them without SP)
        const TokenRows r = layout_.layers->token_rows(rows);
        spec = flat_shard(shape, r.lo * w, r.hi * w);
        data += r.lo * w;
    } else {  // columns: each range a slab of every row; several ranges are staged piece by piece
        const ColumnShard cols = layout_.layers->probe_columns(split);
        spec.logical_shape = shape;
        spec.logical_shape.back() = cols.n;
        i64 at = 0;
        for (const TokenRows& c : cols.ranges) {
            Hyperslab p;
            for (size_t d = 0; d + 1 < shape.size(); d++) {
                p.lo.push_back(0);
                p.hi.push_back(shape[d]);
            }
            p.lo.push_back(c.lo);
            p.hi.push_back(c.hi);
            spec.pieces.push_back(std::move(p));
            if (cols.ranges.size() > 1)
                for (i64 i = 0; i < rows; i++)
                    staged.insert(staged.end(), data + i * w + at, data + i * w + at + c.hi - c.lo);
            at += c.hi - c.lo;
        }
        PX_ASSERT(at == w, "a probe's column ranges do not cover its local tensor");
        if (!staged.empty()) data = staged.data();
    }
    if (layout_.context) spec = context_pieces(spec);
    if (layout_.probe_ctx && layout_.probe_ctx->batch_total > 0)
        offset_rows(spec, layout_.probe_ctx->batch_lo, layout_.probe_ctx->batch_total);
    layout_.probes->capture(key, data, spec);
}

}  // namespace px
