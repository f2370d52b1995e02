#include "core/model/gpt2_block.h"

#include "core/model/model_rows.h"
#include "kernels/ops.h"

#include <algorithm>

namespace px {

// Block l: residual2 = x + attn(ln1(x)), residual3 = residual2 + mlp(ln2(residual2)).
void Gpt2Block::forward(Activations& a, int l, int i, bool probed) const {
    const LayerOps& o = ops_;
    auto out = [&](const char* op, const Tensor& t, ProbeSplit split) {
        if (probed) o.probe("fwd", l, op, "out", t, split);
    };
    auto P = [&](LayerParam p) { return o.param(l, p); };
    const Tensor residual = i == 0 ? a.tensor(ENCODED) : a.layer(RESIDUAL3, i - 1);
    const Tensor ln1 = a.layer(LN1, i), qkv = a.layer(QKV, i), atty = a.layer(ATTY, i);
    const Tensor att = a.layer(ATT, i), residual2 = a.layer(RESIDUAL2, i);
    const Tensor ln2 = a.layer(LN2, i), residual3 = a.layer(RESIDUAL3, i);
    // The attention output projection and the MLP output reuse the backward scratch of
    // the same shape as their staging buffer (it is free during the forward pass).
    const Tensor proj = a.tensor(DBUF_C);
    const Tensor qkvb = P(QKVB), attprojb = P(ATTPROJB);

    // Sequence parallelism: the LayerNorms and residual adds on this rank's tokens; all-gather
    // before each column-parallel linear, reduce-scatter in each row-parallel one.
    o.layernorm_forward(ln1, a.layer(LN1_MEAN, i), a.layer(LN1_RSTD, i), residual, P(LN1W),
                        P(LN1B));
    o.sp_gather(ln1);
    out("ln_1", ln1, ProbeSplit::whole);
    o.linear_forward(Linear::qkv, qkv, ln1, P(QKVW), &qkvb, probed);
    out("attn.qkv", qkv, ProbeSplit::qkv);
    const i64 NH = resolve_dim(Dim::NH, o.config(), o.dims());
    o.attention_forward(atty, a.tensor(DPREATT), att, qkv, NH);
    if (logit_max_)
        logit_max_[l] = std::max(logit_max_[l], o.attention_logit_max(a.tensor(DPREATT), NH));
    out("attn.core", atty, ProbeSplit::channels);
    o.linear_forward(Linear::attn_proj, proj, atty, P(ATTPROJW), &attprojb, probed);
    out("attn.proj", proj, ProbeSplit::tokens);
    o.residual_forward(residual2, residual, proj);
    out("residual_1", residual2, ProbeSplit::tokens);
    o.layernorm_forward(ln2, a.layer(LN2_MEAN, i), a.layer(LN2_RSTD, i), residual2, P(LN2W),
                        P(LN2B));
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

// out (B,T,C) = the plain MLP of layer l on ln2 (F channels: a MoE layer's shared experts').
void Gpt2Block::mlp_forward(Activations& a, int l, int i, const Tensor& out, bool probed) const {
    const LayerOps& o = ops_;
    auto P = [&](LayerParam p) { return o.param(l, p); };
    const i64 F = P(FCW).shape[0];
    const Tensor fch = mlp_act(a.layer(FCH, i), F), fch_gelu = mlp_act(a.layer(FCH_GELU, i), F);
    const Tensor fcb = P(FCB), fcprojb = P(FCPROJB);
    // A MoE layer's shared experts run whole on every tensor-parallel rank.
    const bool whole = o.config().moe_layer(l);
    const ProbeSplit ffn = whole ? ProbeSplit::whole : ProbeSplit::ffn;
    o.linear_forward(Linear::fc, fch, a.layer(LN2, i), P(FCW), &fcb, probed, whole);
    if (probed) o.probe("fwd", l, "mlp.fc", "out", fch, ffn);
    ops::gelu_forward(o.numerics(), fch_gelu, fch);
    if (probed) o.probe("fwd", l, "mlp.gelu", "out", fch_gelu, ffn);
    o.linear_forward(Linear::fc_proj, out, fch_gelu, P(FCPROJW), &fcprojb, probed, whole);
    if (probed) o.probe("fwd", l, "mlp.proj", "out", out, ProbeSplit::tokens);
}

// dln2 (zeroed by the caller) += d(ln2) of the plain MLP of layer l, whose output gradient is
// dout (under sequence parallelism all-gathered already).
void Gpt2Block::mlp_backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                             const Tensor& dout, const Tensor& dln2) const {
    const LayerOps& o = ops_;
    auto P = [&](LayerParam p) { return o.param(l, p); };
    auto G = [&](LayerParam p) { return o.grad(nodes[0].grads, l, p); };
    const i64 F = P(FCW).shape[0];
    const Tensor dfch_gelu = mlp_act(a.tensor(DBUF_F), F), dfch = mlp_act(a.tensor(DBUF_F2), F);
    const Tensor dfcprojb = G(FCPROJB), dfcb = G(FCB);
    const bool whole = o.config().moe_layer(l);  // as in mlp_forward
    const ProbeSplit ffn = whole ? ProbeSplit::whole : ProbeSplit::ffn;
    zero(dfch_gelu);
    o.linear_backward(nodes, Linear::fc_proj, dfch_gelu, G(FCPROJW), &dfcprojb, dout,
                      mlp_act(a.layer(FCH_GELU, i), F), P(FCPROJW), whole);
    o.probe("bwd", l, "mlp.proj", "dinp", dfch_gelu, ffn);
    zero(dfch);
    ops::gelu_backward(o.numerics(), dfch, mlp_act(a.layer(FCH, i), F), dfch_gelu);
    o.probe("bwd", l, "mlp.gelu", "dinp", dfch, ffn);
    o.linear_backward(nodes, Linear::fc, dln2, G(FCW), &dfcb, dfch, a.layer(LN2, i), P(FCW), whole);
}

// dresidual holds d(residual3) on entry and d(x) on return.
void Gpt2Block::backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                         float dloss) const {
    const LayerOps& o = ops_;
    auto P = [&](LayerParam p) { return o.param(l, p); };
    auto G = [&](LayerParam p) { return o.grad(nodes[0].grads, l, p); };
    auto dinp = [&](const char* op, const Tensor& t, ProbeSplit split) {
        o.probe("bwd", l, op, "dinp", t, split);
    };
    const Tensor residual = i == 0 ? a.tensor(ENCODED) : a.layer(RESIDUAL3, i - 1);
    const Tensor dresidual = a.tensor(DRESIDUAL), dbuf_c = a.tensor(DBUF_C);
    const Tensor dqkv = a.tensor(DBUF_C3);
    const Tensor dattprojw = G(ATTPROJW), dattprojb = G(ATTPROJB), dqkvw = G(QKVW), dqkvb = G(QKVB);

    // residual3 = residual2 + mlp(ln2(residual2)): dresidual flows to both branches.
    // (Sequence parallelism: this rank's rows of d(residual3), all-gathered for fc_proj.)
    // A MoE layer: its shared experts' MLP (if any), then the routed experts and the router.
    o.sp_gather(dresidual);
    zero(dbuf_c);
    if (o.has(l, FCW)) mlp_backward(a, nodes, l, i, dresidual, dbuf_c);
    if (o.config().moe_layer(l)) moe_.backward(a, nodes, l, i, dresidual, dbuf_c, dloss);
    dinp("mlp.fc", dbuf_c, ProbeSplit::tokens);
    o.layernorm_backward(nodes, dresidual, G(LN2W), G(LN2B), dbuf_c, a.layer(RESIDUAL2, i), P(LN2W),
                         a.layer(LN2_MEAN, i), a.layer(LN2_RSTD, i));
    o.sp_gather(dresidual);
    // The LayerNorm's input gradient plus the skip path: d(residual_1).
    dinp("ln_2", dresidual, ProbeSplit::whole);

    // residual2 = residual + attn(ln1(residual)).
    const Tensor datty = a.layer(ATTY, i);  // d(atty) staged in dbuf_c, sized like atty
    const Tensor dbuf_a = subview(dbuf_c, 0, {datty.shape[0], datty.shape[1], datty.shape[2]});
    zero(dbuf_a);
    o.linear_backward(nodes, Linear::attn_proj, dbuf_a, dattprojw, &dattprojb, dresidual,
                      a.layer(ATTY, i), P(ATTPROJW));
    dinp("attn.proj", dbuf_a, ProbeSplit::channels);
    zero(dqkv);
    const i64 NH = resolve_dim(Dim::NH, o.config(), o.dims());
    o.attention_backward(dqkv, a.tensor(DPREATT), a.tensor(DATT), dbuf_a, a.layer(QKV, i),
                         a.layer(ATT, i), NH);
    dinp("attn.core", dqkv, ProbeSplit::qkv);
    zero(dbuf_c);
    o.linear_backward(nodes, Linear::qkv, dbuf_c, dqkvw, &dqkvb, dqkv, a.layer(LN1, i), P(QKVW));
    dinp("attn.qkv", dbuf_c, ProbeSplit::tokens);
    o.layernorm_backward(nodes, dresidual, G(LN1W), G(LN1B), dbuf_c, residual, P(LN1W),
                         a.layer(LN1_MEAN, i), a.layer(LN1_RSTD, i));
    dinp("ln_1", dresidual, ProbeSplit::tokens);  // with the skip path: d(block input)
}

}  // namespace px
