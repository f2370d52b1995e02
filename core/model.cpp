#include "core/model.h"

#include "core/error.h"
#include "core/rng.h"
#include "kernels/ops.h"

#include <cmath>
#include <cstring>

namespace px {

namespace {

i64 align16(i64 n) { return (n + 15) / 16 * 16; }

Tensor make_view(float* data, const i64* dims, int ndim, const char* name) {
    Tensor t;
    t.data = data;
    t.ndim = ndim;
    i64 stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = dims[d];
        t.strides[d] = stride;
        stride *= dims[d];
    }
    t.name = name;
    return t;
}

void zero(const Tensor& t) { std::memset(t.data, 0, static_cast<size_t>(t.numel()) * sizeof(float)); }

}  // namespace

GPT::GPT(const ModelConfig& mc, const Numerics& nx)
    : mc_(mc), nx_(nx), table_(ParamTable::build(mc)) {
    glayout_.head_offset = table_.total;
    glayout_.total = table_.total + align16(mc.vocab * mc.hidden);
    params_ = Arena(table_.total);
}

Tensor GPT::param(int i) const {
    const TableEntry& e = table_.entries[i];
    Tensor t = e.rows == 1 ? view_f32(params_.data() + e.offset, {e.cols})
                           : view_f32(params_.data() + e.offset, {e.rows, e.cols});
    t.name = e.name.c_str();
    t.id = i;
    return t;
}

Tensor GPT::grad(float* grads, int i) const {
    Tensor t = param(i);
    t.data = grads + table_.entries[i].offset;
    return t;
}

Tensor GPT::grad_head(float* grads) const {
    return view_f32(grads + glayout_.head_offset, {mc_.vocab, mc_.hidden}, "lm_head(wte)");
}

float* GPT::param_ptr(const std::string& name) const {
    const int i = table_.find(name);
    return i < 0 ? nullptr : params_.data() + table_.entries[i].offset;
}

void GPT::init_random(std::uint64_t seed, double init_std) {
    // GPT-2: weights N(0, std), residual projections N(0, std/sqrt(2L)), biases 0, norms 1.
    const double residual_std = init_std / std::sqrt(2.0 * static_cast<double>(mc_.layers));
    for (size_t i = 0; i < table_.entries.size(); i++) {
        const TableEntry& e = table_.entries[i];
        float* p = params_.data() + e.offset;
        switch (kGpt2Params[e.spec].init) {
        case ParamSpec::normal:
            fill_normal(p, e.numel(), 0.0f, static_cast<float>(init_std), seed, static_cast<u32>(i), 0);
            break;
        case ParamSpec::residual_normal:
            fill_normal(p, e.numel(), 0.0f, static_cast<float>(residual_std), seed,
                        static_cast<u32>(i), 0);
            break;
        case ParamSpec::zeros: std::fill(p, p + e.numel(), 0.0f); break;
        case ParamSpec::ones: std::fill(p, p + e.numel(), 1.0f); break;
        }
    }
}

void GPT::ensure_acts(i64 B, i64 T) {
    if (B == B_ && T == T_) return;
    if (T > mc_.seq_len)
        throw ConfigError("a sequence of " + std::to_string(T) + " tokens exceeds model.seq_len = " +
                          std::to_string(mc_.seq_len));
    atable_ = ActTable::build(mc_, B, T);
    acts_ = Arena(atable_.total);
    B_ = B;
    T_ = T;
}

Tensor GPT::act(int a) const {
    const ActSpec& s = kGpt2Acts[a];
    i64 dims[5];
    int nd = 0;
    for (Dim d : {s.d0, s.d1, s.d2, s.d3})
        if (d != Dim::one) dims[nd++] = resolve_dim(d, mc_, B_, T_);
    if (a == ATT) dims[nd++] = T_;
    if (nd > kMaxDims) {  // (L,B,NH,T,T): fold L into B for the whole-tensor view
        dims[1] *= dims[0];
        for (int i = 0; i < nd - 1; i++) dims[i] = dims[i + 1];
        nd--;
    }
    return make_view(acts_.data() + atable_.offset[a], dims, nd, s.name);
}

Tensor GPT::act_layer(int a, int l) const {
    const ActSpec& s = kGpt2Acts[a];
    PX_ASSERT(s.d0 == Dim::L, "act_layer on a tensor without a layer dimension");
    i64 dims[4];
    int nd = 0;
    for (Dim d : {s.d1, s.d2, s.d3})
        if (d != Dim::one) dims[nd++] = resolve_dim(d, mc_, B_, T_);
    if (a == ATT) dims[nd++] = T_;
    i64 per_layer = 1;
    for (int i = 0; i < nd; i++) per_layer *= dims[i];
    return make_view(acts_.data() + atable_.offset[a] + l * per_layer, dims, nd, s.name);
}

void GPT::forward(const int* tokens, const int* targets, i64 B, i64 T) {
    ensure_acts(B, T);
    const Numerics& nx = nx_;
    const i64 L = mc_.layers, NH = mc_.heads;
    const Tensor wte = param(table_.wte), wpe = param(table_.wpe);

    ops::embedding_forward(nx, act(ENCODED), tokens, wte, wpe);
    for (int l = 0; l < L; l++) {
        const Tensor residual = l == 0 ? act(ENCODED) : act_layer(RESIDUAL3, l - 1);
        const Tensor ln1 = act_layer(LN1, l), qkv = act_layer(QKV, l), atty = act_layer(ATTY, l);
        const Tensor att = act_layer(ATT, l), residual2 = act_layer(RESIDUAL2, l);
        const Tensor ln2 = act_layer(LN2, l), fch = act_layer(FCH, l);
        const Tensor fch_gelu = act_layer(FCH_GELU, l), residual3 = act_layer(RESIDUAL3, l);
        // The attention output projection and the MLP output reuse the backward scratch of
        // the same shape as their staging buffer (it is free during the forward pass).
        const Tensor proj = act(DBUF_C);
        const Tensor qkvb = P(l, QKVB), attprojb = P(l, ATTPROJB), fcb = P(l, FCB),
                     fcprojb = P(l, FCPROJB);

        ops::layernorm_forward(nx, ln1, act_layer(LN1_MEAN, l), act_layer(LN1_RSTD, l), residual,
                               P(l, LN1W), P(l, LN1B));
        ops::matmul_forward(nx, qkv, ln1, P(l, QKVW), &qkvb);
        ops::attention_forward(nx, atty, act(DPREATT), att, qkv, NH);
        ops::matmul_forward(nx, proj, atty, P(l, ATTPROJW), &attprojb);
        ops::residual_forward(nx, residual2, residual, proj);
        ops::layernorm_forward(nx, ln2, act_layer(LN2_MEAN, l), act_layer(LN2_RSTD, l), residual2,
                               P(l, LN2W), P(l, LN2B));
        ops::matmul_forward(nx, fch, ln2, P(l, FCW), &fcb);
        ops::gelu_forward(nx, fch_gelu, fch);
        ops::matmul_forward(nx, proj, fch_gelu, P(l, FCPROJW), &fcprojb);
        ops::residual_forward(nx, residual3, residual2, proj);
    }
    const Tensor last = L > 0 ? act_layer(RESIDUAL3, static_cast<int>(L) - 1) : act(ENCODED);
    ops::layernorm_forward(nx, act(LNF), act(LNF_MEAN), act(LNF_RSTD), last, param(table_.lnfw),
                           param(table_.lnfb));
    // LM head tied to wte: logits (B,T,V) = lnf · wteᵀ, written into probs, then softmax in place.
    const Tensor probs = act(PROBS);
    ops::matmul_forward(nx, probs, act(LNF), wte, nullptr);
    ops::crossentropy_forward(nx, act(LOSSES), probs, probs, targets);
}

void GPT::backward(float* grads, const int* tokens, const int* targets, float dloss) {
    PX_ASSERT(B_ > 0, "backward before forward");
    const Numerics& nx = nx_;
    const i64 L = mc_.layers, NH = mc_.heads;
    const Tensor wte = param(table_.wte);
    auto G = [&](int l, LayerParam p) { return grad(grads, table_.layer_index(l, p)); };

    const Tensor probs = act(PROBS), dresidual = act(DRESIDUAL), dbuf_c = act(DBUF_C);
    ops::crossentropy_backward(nx, probs, probs, targets, dloss);  // probs now hold dlogits

    // LM head: dlnf = dlogits · wte, and its wte gradient kept apart (see GradLayout).
    const Tensor head = grad_head(grads);
    zero(dbuf_c);
    ops::matmul_backward(nx, &dbuf_c, &head, nullptr, probs, act(LNF), wte);
    zero(dresidual);
    const Tensor last = L > 0 ? act_layer(RESIDUAL3, static_cast<int>(L) - 1) : act(ENCODED);
    ops::layernorm_backward(nx, dresidual, grad(grads, table_.lnfw), grad(grads, table_.lnfb),
                            dbuf_c, last, param(table_.lnfw), act(LNF_MEAN), act(LNF_RSTD));

    for (int l = static_cast<int>(L) - 1; l >= 0; l--) {
        const Tensor residual = l == 0 ? act(ENCODED) : act_layer(RESIDUAL3, l - 1);
        const Tensor dfch_gelu = act(DBUF_F), dfch = act(DBUF_F2), dqkv = act(DBUF_C3);
        const Tensor dfcprojw = G(l, FCPROJW), dfcprojb = G(l, FCPROJB), dfcw = G(l, FCW),
                     dfcb = G(l, FCB), dattprojw = G(l, ATTPROJW), dattprojb = G(l, ATTPROJB),
                     dqkvw = G(l, QKVW), dqkvb = G(l, QKVB);

        // residual3 = residual2 + mlp(ln2(residual2)): dresidual flows to both branches.
        zero(dfch_gelu);
        ops::matmul_backward(nx, &dfch_gelu, &dfcprojw, &dfcprojb, dresidual,
                             act_layer(FCH_GELU, l), P(l, FCPROJW));
        zero(dfch);
        ops::gelu_backward(nx, dfch, act_layer(FCH, l), dfch_gelu);
        zero(dbuf_c);
        ops::matmul_backward(nx, &dbuf_c, &dfcw, &dfcb, dfch, act_layer(LN2, l), P(l, FCW));
        ops::layernorm_backward(nx, dresidual, G(l, LN2W), G(l, LN2B), dbuf_c,
                                act_layer(RESIDUAL2, l), P(l, LN2W), act_layer(LN2_MEAN, l),
                                act_layer(LN2_RSTD, l));

        // residual2 = residual + attn(ln1(residual)).
        zero(dbuf_c);
        ops::matmul_backward(nx, &dbuf_c, &dattprojw, &dattprojb, dresidual, act_layer(ATTY, l),
                             P(l, ATTPROJW));
        zero(dqkv);
        ops::attention_backward(nx, dqkv, act(DPREATT), act(DATT), dbuf_c, act_layer(QKV, l),
                                act_layer(ATT, l), NH);
        zero(dbuf_c);
        ops::matmul_backward(nx, &dbuf_c, &dqkvw, &dqkvb, dqkv, act_layer(LN1, l), P(l, QKVW));
        ops::layernorm_backward(nx, dresidual, G(l, LN1W), G(l, LN1B), dbuf_c, residual,
                                P(l, LN1W), act_layer(LN1_MEAN, l), act_layer(LN1_RSTD, l));
    }
    ops::embedding_backward(nx, grad(grads, table_.wte), grad(grads, table_.wpe), dresidual, tokens);
}

void GPT::combine_tied_grads(float* grads) const {
    const TableEntry& e = table_.entries[table_.wte];
    float* dwte = grads + e.offset;
    const float* head = grads + glayout_.head_offset;
    const i64 n = e.numel();
#pragma omp parallel for schedule(static)
    for (i64 i = 0; i < n; i++) dwte[i] = dwte[i] + head[i];
}

}  // namespace px
