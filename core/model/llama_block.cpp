#include "core/model/llama_block.h"

#include "core/base/dtype.h"
#include "core/model/model_rows.h"
#include "kernels/ops.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace px {

namespace {

// Heads [.., H) of HS channels of a (B,T,W) activation from column col0, as (B,T,H,HS) with its
// rows W apart.
Tensor heads_view(const Tensor& t, i64 col0, i64 H, i64 HS) {
    const i64 B = t.shape[0], T = t.shape[1], W = t.shape[2];
    Tensor v = t;
    v.data = static_cast<std::byte*>(t.data) + bytes_of(t.dtype, col0);
    v.ndim = 4;
    v.shape = {};
    v.strides = {};
    v.shape[0] = B, v.shape[1] = T, v.shape[2] = H, v.shape[3] = HS;
    v.strides[0] = T * W, v.strides[1] = W, v.strides[2] = HS, v.strides[3] = 1;
    return v;
}

// (B,T,W) as (B,T,W/HS,HS), contiguous.
Tensor as_heads(const Tensor& t, i64 HS) {
    return subview(t, 0, {t.shape[0], t.shape[1], t.shape[2] / HS, HS});
}

// dst (B,T,H,HS) contiguous = src (B,T,H,HS), a token's H·HS channels contiguous, tokens apart.
void copy_heads(const Tensor& dst, const Tensor& src) {
    const size_t es = dtype_size(src.dtype), row = static_cast<size_t>(src.shape[2] * src.shape[3]);
    const i64 rows = src.shape[0] * src.shape[1], ld = src.strides[1];
    for (i64 r = 0; r < rows; r++)
        std::memcpy(static_cast<std::byte*>(dst.data) + static_cast<size_t>(r) * row * es,
                    static_cast<const std::byte*>(src.data) + static_cast<size_t>(r * ld) * es,
                    row * es);
}

}  // namespace

void repeat_kv(const KvGroups& g, const Tensor& qkv, i64 col0, const Tensor& src) {
    const size_t es = dtype_size(src.dtype), hs = static_cast<size_t>(g.HS) * es;
    const i64 W = qkv.shape[2];
    auto* dst = static_cast<std::byte*>(qkv.data);
    const auto* s = static_cast<const std::byte*>(src.data);
#pragma omp parallel for schedule(static)
    for (i64 r = 0; r < g.rows(); r++)
        for (i64 j = 0; j < g.NH; j++)
            std::memcpy(dst + static_cast<size_t>(r * W + col0 + j * g.HS) * es,
                        s + static_cast<size_t>(r * g.KV * g.HS + g.kv_of(j) * g.HS) * es, hs);
}

// dst (B,T,KV·HS) = for each KV head, the sum of its query heads' gradients in dqkv's part from
// col0 (rows of dqkv's width apart), in head order, in fp32 and rounded once to dst's dtype. The
// KV heads' query heads are all here (q0 = kv0·group).
void sum_kv(const KvGroups& g, const Tensor& dst, const Tensor& dqkv, i64 col0) {
    PX_ASSERT(g.q0 == g.kv0 * g.group && g.NH == g.KV * g.group,
              "sum_kv needs every query head of its KV heads");
    const DType t = dst.dtype, ts = dqkv.dtype;
    const size_t es = dtype_size(t), ess = dtype_size(ts);
    const i64 W = dqkv.shape[2];
    const auto* s = static_cast<const std::byte*>(dqkv.data);
    auto* d = static_cast<std::byte*>(dst.data);
#pragma omp parallel
    {
        std::vector<float> acc(static_cast<size_t>(g.HS)), x(static_cast<size_t>(g.HS));
#pragma omp for schedule(static)
        for (i64 r = 0; r < g.rows(); r++)
            for (i64 k = 0; k < g.KV; k++) {
                for (i64 q = 0; q < g.group; q++) {
                    const i64 j = k * g.group + q;
                    convert(q == 0 ? acc.data() : x.data(), DType::f32,
                            s + static_cast<size_t>(r * W + col0 + j * g.HS) * ess, ts,
                            static_cast<size_t>(g.HS));
                    if (q > 0)
                        for (i64 c = 0; c < g.HS; c++) acc[c] = acc[c] + x[c];
                }
                convert(d + static_cast<size_t>((r * g.KV + k) * g.HS) * es, t, acc.data(),
                        DType::f32, static_cast<size_t>(g.HS));
            }
    }
}

namespace {

KvGroups groups_of(const LayerOps& o, const Tensor& x) {
    const ModelConfig& mc = o.config();
    KvGroups g{};
    g.B = x.shape[0], g.T = x.shape[1];
    g.NH = resolve_dim(Dim::NH, mc, o.dims());
    g.KV = resolve_dim(Dim::KVH, mc, o.dims());
    g.HS = mc.head_size();
    g.group = mc.heads / mc.kv_head_count();
    g.q0 = o.tp_rank() * g.NH;
    g.kv0 = kv_split(mc, o.tp_size()) ? o.tp_rank() * g.KV : 0;
    return g;
}

// The whole model's heads (after gather_heads): every query head, every KV head.
KvGroups all_heads(const LayerOps& o, const KvGroups& g) {
    KvGroups a = g;
    a.NH = o.config().heads;
    a.KV = o.config().kv_head_count();
    a.q0 = a.kv0 = 0;
    return a;
}

// The weight gradient of a per-head RMSNorm (qk_norm) whose heads are split over tp ranks: every
// rank gathers the heads' inputs and output gradients and computes the whole sum, as one device
// does (a token's heads in order, then the token tree); rstd is recomputed from the gathered
// inputs, the same bits the heads' ranks keep. One rank (or heads held whole): the local rows.
void head_norm_weight_grad(const LayerOps& o, std::span<const TokenNode> nodes,
                           const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                           const Tensor& weight, const Tensor& rstd, bool heads_whole) {
    if (o.tp_size() == 1 || heads_whole) {
        o.rmsnorm_weight_grad(nodes, dweight, dout, inp, weight, rstd);
        return;
    }
    const i64 B = inp.shape[0], T = inp.shape[1], H = inp.shape[2] * o.tp_size(),
              HS = inp.shape[3];
    std::vector<float> x(static_cast<size_t>(B * T * H * HS)), d(x.size()), n(x.size());
    std::vector<float> r(static_cast<size_t>(B * T * H));
    const Tensor fx = view_f32(x.data(), {B, T, H, HS}), fd = view_f32(d.data(), {B, T, H, HS});
    const Tensor fn = view_f32(n.data(), {B, T, H, HS}), fr = view_f32(r.data(), {B, T, H});
    o.gather_heads(fx, inp);
    o.gather_heads(fd, dout);
    ops::rmsnorm_forward(o.numerics(), fn, fr, fx, weight,
                         static_cast<float>(o.config().norm_eps));
    o.rmsnorm_weight_grad(nodes, dweight, fd, fx, weight, fr);
}

// dst (B,T,KV·HS) = sum_kv of qkv's part from col0 when every rank holds every KV head but only
// its query heads (tp not dividing the KV heads): the part's heads gathered from every rank
// first (scratch: a (B,T,NH·HS) buffer of this rank's heads), then the whole sum on each.
void sum_kv_whole(const LayerOps& o, const KvGroups& g, const Tensor& dst, const Tensor& dqkv,
                  i64 col0, const Tensor& scratch) {
    const KvGroups a = all_heads(o, g);
    const Tensor mine = as_heads(scratch, g.HS);
    copy_heads(mine, heads_view(dqkv, col0, g.NH, g.HS));
    std::vector<float> all(static_cast<size_t>(g.rows() * a.NH * g.HS));
    const Tensor full = view_f32(all.data(), {g.B, g.T, a.NH, g.HS});
    o.gather_heads(full, mine);
    sum_kv(a, dst, view_f32(all.data(), {g.B, g.T, a.NH * g.HS}), 0);
}

}  // namespace

// Block l: h = x + attn(rms_1(x)), out = h + mlp(rms_2(h)).
void LlamaBlock::forward(Activations& a, int l, int i, bool probed) const {
    const LayerOps& o = ops_;
    auto out = [&](const char* op, const Tensor& t, ProbeSplit split) {
        if (probed) o.probe("fwd", l, op, "out", t, split);
    };
    auto P = [&](LayerParam p) { return o.param(l, p); };
    const Tensor residual = i == 0 ? a.tensor(ENCODED) : a.layer(RESIDUAL3, i - 1);
    const Tensor ln1 = a.layer(LN1, i), residual2 = a.layer(RESIDUAL2, i);
    const Tensor ln2 = a.layer(LN2, i), residual3 = a.layer(RESIDUAL3, i);
    const Tensor proj = a.tensor(DBUF_C);  // staging for the projections (free in forward)

    // Sequence parallelism: the RMSNorms and residual adds on this rank's tokens; all-gather
    // before the column-parallel linears, reduce-scatter in the row-parallel ones.
    o.rmsnorm_forward(ln1, a.layer(LN1_RSTD, i), residual, P(LN1W));
    o.sp_gather(ln1);
    out("ln_1", ln1, ProbeSplit::whole);
    attention_forward(a, l, i, proj, probed);
    o.residual_forward(residual2, residual, proj);
    out("residual_1", residual2, ProbeSplit::tokens);
    o.rmsnorm_forward(ln2, a.layer(LN2_RSTD, i), residual2, P(LN2W));
    o.sp_gather(ln2);
    out("ln_2", ln2, ProbeSplit::whole);
    if (!o.config().moe_layer(l)) {
        mlp_forward(a, l, i, proj, probed);
    } else {  // shared experts (if any), then the routed ones added to their output
        if (o.has(l, FCW))
            mlp_forward(a, l, i, proj, probed);
        else
            zero(proj);
        moe_.forward(a, l, i, proj, probed);
    }
    o.residual_forward(residual3, residual2, proj);
    out("residual_2", residual3, ProbeSplit::tokens);
}

void LlamaBlock::attention_forward(Activations& a, int l, int i, const Tensor& proj,
                                   bool probed) const {
    const LayerOps& o = ops_;
    const Numerics& nx = o.numerics();
    auto P = [&](LayerParam p) { return o.param(l, p); };
    const Tensor ln1 = a.layer(LN1, i), qkv = a.layer(QKV, i), atty = a.layer(ATTY, i);
    const Tensor qr = a.layer(Q_RAW, i), kr = a.layer(K_RAW, i);
    const Tensor v = a.tensor(DBUF_KV), kn = a.tensor(DBUF_KV2);
    const KvGroups g = groups_of(o, ln1);
    const bool qk_norm = o.config().qk_norm;
    const float eps = static_cast<float>(o.config().norm_eps);
    const std::vector<i64> pos = o.positions(g.T);
    const i64* at = pos.empty() ? nullptr : pos.data();

    o.linear_forward(Linear::q, qr, ln1, P(QW), nullptr, probed);
    o.linear_forward(Linear::kv, kr, ln1, P(KW), nullptr, probed);
    o.linear_forward(Linear::kv, v, ln1, P(VW), nullptr, probed);
    // q: its norm (qk_norm) into scratch, then RoPE into qkv's first third
    const Tensor q_rot = heads_view(qkv, 0, g.NH, g.HS);
    Tensor q_in = as_heads(qr, g.HS);
    if (qk_norm) {
        const Tensor qn = as_heads(a.tensor(DBUF_Q), g.HS);
        ops::rmsnorm_forward(nx, qn, a.layer(Q_RSTD, i), q_in, P(QNORMW), eps);
        q_in = qn;
    }
    ops::rope_forward(nx, q_rot, q_in, o.rope_cos(), o.rope_sin(), at);
    // k: its norm, RoPE in place, and each KV head repeated for its query heads; v repeated
    const Tensor k_rot = as_heads(kn, g.HS);
    if (qk_norm) {
        ops::rmsnorm_forward(nx, k_rot, a.layer(K_RSTD, i), as_heads(kr, g.HS), P(KNORMW), eps);
        ops::rope_forward(nx, k_rot, k_rot, o.rope_cos(), o.rope_sin(), at);
    } else {
        ops::rope_forward(nx, k_rot, as_heads(kr, g.HS), o.rope_cos(), o.rope_sin(), at);
    }
    repeat_kv(g, qkv, g.NH * g.HS, kn);
    repeat_kv(g, qkv, 2 * g.NH * g.HS, v);
    if (probed) o.probe("fwd", l, "attn.qkv", "out", qkv, ProbeSplit::qkv);
    o.attention_forward(atty, a.tensor(DPREATT), a.layer(ATT, i), qkv, g.NH);
    if (logit_max_)
        logit_max_[l] = std::max(logit_max_[l], o.attention_logit_max(a.tensor(DPREATT), g.NH));
    if (probed) o.probe("fwd", l, "attn.core", "out", atty, ProbeSplit::channels);
    o.linear_forward(Linear::attn_proj, proj, atty, P(ATTPROJW), nullptr, probed);
    if (probed) o.probe("fwd", l, "attn.proj", "out", proj, ProbeSplit::tokens);
}

// out (B,T,C) = down(silu(gate(n2)) · up(n2)) of layer l (F channels: a MoE layer's shared
// experts').
void LlamaBlock::mlp_forward(Activations& a, int l, int i, const Tensor& out, bool probed) const {
    const LayerOps& o = ops_;
    auto P = [&](LayerParam p) { return o.param(l, p); };
    const i64 F = P(FCW).shape[0];
    const Tensor gate = mlp_act(a.layer(FCH, i), F), up = mlp_act(a.layer(FCH_UP, i), F);
    const Tensor act = mlp_act(a.layer(FCH_GELU, i), F), ln2 = a.layer(LN2, i);
    const bool whole = o.config().moe_layer(l);  // shared experts run whole on every tp rank
    const ProbeSplit ffn = whole ? ProbeSplit::whole : ProbeSplit::ffn;
    o.linear_forward(Linear::fc, gate, ln2, P(FCW), nullptr, probed, whole);
    if (probed) o.probe("fwd", l, "mlp.gate", "out", gate, ffn);
    o.linear_forward(Linear::fc, up, ln2, P(UPW), nullptr, probed, whole);
    if (probed) o.probe("fwd", l, "mlp.up", "out", up, ffn);
    ops::swiglu_forward(o.numerics(), act, gate, up);
    if (probed) o.probe("fwd", l, "mlp.swiglu", "out", act, ffn);
    o.linear_forward(Linear::fc_proj, out, act, P(FCPROJW), nullptr, probed, whole);
    if (probed) o.probe("fwd", l, "mlp.proj", "out", out, ProbeSplit::tokens);
}

void LlamaBlock::mlp_backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                              const Tensor& dout, const Tensor& dln2) const {
    const LayerOps& o = ops_;
    auto P = [&](LayerParam p) { return o.param(l, p); };
    auto G = [&](LayerParam p) { return o.grad(nodes[0].grads, l, p); };
    const i64 F = P(FCW).shape[0];
    const Tensor gate = mlp_act(a.layer(FCH, i), F), up = mlp_act(a.layer(FCH_UP, i), F);
    const Tensor act = mlp_act(a.layer(FCH_GELU, i), F), ln2 = a.layer(LN2, i);
    const Tensor dact = mlp_act(a.tensor(DBUF_F), F), dgate = mlp_act(a.tensor(DBUF_F2), F);
    const Tensor dup = mlp_act(a.tensor(DBUF_F3), F);
    const bool whole = o.config().moe_layer(l);
    const ProbeSplit ffn = whole ? ProbeSplit::whole : ProbeSplit::ffn;
    zero(dact);
    o.linear_backward(nodes, Linear::fc_proj, dact, G(FCPROJW), nullptr, dout, act, P(FCPROJW),
                      whole);
    o.probe("bwd", l, "mlp.proj", "dinp", dact, ffn);
    zero(dgate);
    zero(dup);
    ops::swiglu_backward(o.numerics(), dgate, dup, gate, up, dact);
    o.probe("bwd", l, "mlp.swiglu", "dinp", dgate, ffn);
    o.linear_backward(nodes, Linear::fc, dln2, G(FCW), nullptr, dgate, ln2, P(FCW), whole);
    o.linear_backward(nodes, Linear::fc, dln2, G(UPW), nullptr, dup, ln2, P(UPW), whole);
}

void LlamaBlock::attention_backward(Activations& a, std::span<const TokenNode> nodes, int l,
                                    int i, const Tensor& dout, const Tensor& dln1) const {
    const LayerOps& o = ops_;
    const Numerics& nx = o.numerics();
    auto P = [&](LayerParam p) { return o.param(l, p); };
    auto G = [&](LayerParam p) { return o.grad(nodes[0].grads, l, p); };
    const Tensor ln1 = a.layer(LN1, i), qkv = a.layer(QKV, i), atty = a.layer(ATTY, i);
    const Tensor qr = a.layer(Q_RAW, i), kr = a.layer(K_RAW, i);
    const Tensor dqkv = a.tensor(DBUF_C3);
    const Tensor dq1 = a.tensor(DBUF_Q), dq2 = a.tensor(DBUF_Q2);
    const Tensor dk1 = a.tensor(DBUF_KV), dk2 = a.tensor(DBUF_KV2);
    const KvGroups g = groups_of(o, ln1);
    const bool qk_norm = o.config().qk_norm;
    const bool kv_whole = o.tp_size() > 1 && !kv_split(o.config(), o.tp_size());
    const std::vector<i64> pos = o.positions(g.T);
    const i64* at = pos.empty() ? nullptr : pos.data();

    zero(dq1);  // d(atty)
    o.linear_backward(nodes, Linear::attn_proj, dq1, G(ATTPROJW), nullptr, dout, atty,
                      P(ATTPROJW));
    o.probe("bwd", l, "attn.proj", "dinp", dq1, ProbeSplit::channels);
    zero(dqkv);
    o.attention_backward(dqkv, a.tensor(DPREATT), a.tensor(DATT), dq1, qkv, a.layer(ATT, i), g.NH);
    o.probe("bwd", l, "attn.core", "dinp", dqkv, ProbeSplit::qkv);
    // q: RoPE's inverse, then its norm's backward
    zero(dq2);
    ops::rope_backward(nx, as_heads(dq2, g.HS), heads_view(dqkv, 0, g.NH, g.HS), o.rope_cos(),
                       o.rope_sin(), at);
    Tensor dq = dq2;
    if (qk_norm) {
        zero(dq1);
        const Tensor dqn = as_heads(dq1, g.HS);
        ops::rmsnorm_backward(nx, &dqn, nullptr, as_heads(dq2, g.HS), as_heads(qr, g.HS),
                              P(QNORMW), a.layer(Q_RSTD, i));
        head_norm_weight_grad(o, nodes, G(QNORMW), as_heads(dq2, g.HS), as_heads(qr, g.HS),
                              P(QNORMW), a.layer(Q_RSTD, i), false);
        dq = dq1;
    }
    o.linear_backward(nodes, Linear::q, dln1, G(QW), nullptr, dq, ln1, P(QW));
    // k: the repeated heads summed per KV head, RoPE's inverse, its norm's backward
    if (kv_whole)
        sum_kv_whole(o, g, dk1, dqkv, g.NH * g.HS, dq2);
    else
        sum_kv(g, dk1, dqkv, g.NH * g.HS);
    zero(dk2);
    ops::rope_backward(nx, as_heads(dk2, g.HS), as_heads(dk1, g.HS), o.rope_cos(), o.rope_sin(),
                       at);
    Tensor dk = dk2;
    if (qk_norm) {
        zero(dk1);
        const Tensor dkn = as_heads(dk1, g.HS);
        ops::rmsnorm_backward(nx, &dkn, nullptr, as_heads(dk2, g.HS), as_heads(kr, g.HS),
                              P(KNORMW), a.layer(K_RSTD, i));
        head_norm_weight_grad(o, nodes, G(KNORMW), as_heads(dk2, g.HS), as_heads(kr, g.HS),
                              P(KNORMW), a.layer(K_RSTD, i), kv_whole);
        dk = dk1;
    }
    o.linear_backward(nodes, Linear::kv, dln1, G(KW), nullptr, dk, ln1, P(KW));
    // v: the repeated heads summed
    if (kv_whole)
        sum_kv_whole(o, g, dk1, dqkv, 2 * g.NH * g.HS, dq2);
    else
        sum_kv(g, dk1, dqkv, 2 * g.NH * g.HS);
    o.linear_backward(nodes, Linear::kv, dln1, G(VW), nullptr, dk1, ln1, P(VW));
}

// dresidual holds d(residual3) on entry and d(x) on return.
void LlamaBlock::backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                          float dloss) const {
    const LayerOps& o = ops_;
    auto P = [&](LayerParam p) { return o.param(l, p); };
    auto G = [&](LayerParam p) { return o.grad(nodes[0].grads, l, p); };
    const Tensor residual = i == 0 ? a.tensor(ENCODED) : a.layer(RESIDUAL3, i - 1);
    const Tensor dresidual = a.tensor(DRESIDUAL), dbuf_c = a.tensor(DBUF_C);

    // (Sequence parallelism: this rank's rows of d(residual3), all-gathered for down_proj.)
    o.sp_gather(dresidual);
    zero(dbuf_c);
    if (o.has(l, FCW)) mlp_backward(a, nodes, l, i, dresidual, dbuf_c);
    if (o.config().moe_layer(l)) moe_.backward(a, nodes, l, i, dresidual, dbuf_c, dloss);
    o.probe("bwd", l, "mlp.fc", "dinp", dbuf_c, ProbeSplit::tokens);
    o.rmsnorm_backward(nodes, dresidual, G(LN2W), dbuf_c, a.layer(RESIDUAL2, i), P(LN2W),
                       a.layer(LN2_RSTD, i));
    o.sp_gather(dresidual);
    o.probe("bwd", l, "ln_2", "dinp", dresidual, ProbeSplit::whole);
    zero(dbuf_c);
    attention_backward(a, nodes, l, i, dresidual, dbuf_c);
    o.probe("bwd", l, "attn.qkv", "dinp", dbuf_c, ProbeSplit::tokens);
    o.rmsnorm_backward(nodes, dresidual, G(LN1W), dbuf_c, residual, P(LN1W),
                       a.layer(LN1_RSTD, i));
    o.probe("bwd", l, "ln_1", "dinp", dresidual, ProbeSplit::tokens);
}


}  // namespace px
