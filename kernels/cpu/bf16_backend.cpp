// The CPU bf16 backend: bf16 activations, computed by the fp32 kernels. Each entry widens its
// bf16 operands to fp32 (exact), rounds the weights a matmul reads to bf16 (the cast point of a
// bf16 matmul: both inputs bf16, products accumulated in fp32 in the canonical order), runs the
// fp32 kernel, and rounds each activation it writes to bf16 once (nearest even). LayerNorm
// statistics, losses, softmax row statistics, weight gradients and the optimizer stay fp32
// (Operands below). Both numerics modes: the fp32 kernels choose their order from nx.mode.
//
// This is the reference bf16 path, exact by construction and the same on every CPU; a backend
// that runs native bf16 dot products (AVX512_BF16, AMX) registers for fast mode beside it.
#include "core/base/dtype.h"
#include "core/base/widened.h"
#include "kernels/backend.h"

namespace px::cpu {

namespace {

using ops::Backend;

// Wide(t): t's values in fp32; Wide(t, true): a matmul's fp32 weights rounded to bf16.
struct Wide : Widened {
    explicit Wide(const Tensor* t, bool matmul_weight = false)
        : Widened(t, matmul_weight ? DType::bf16 : DType::f32) {}
};

const Backend& f32() {
    return f32_backend;
}

void matmul_fwd(const Numerics& nx, const Tensor& out, const Tensor& inp, const Tensor& w,
                const Tensor* bias) {
    Wide o(&out), i(&inp), ww(&w, true);
    f32().matmul_forward(nx, *o, *i, *ww, bias);
    o.store();
}

void matmul_bwd(const Numerics& nx, const Tensor* dinp, const Tensor* dweight, const Tensor* dbias,
                const Tensor& dout, const Tensor& inp, const Tensor& w) {
    Wide di(dinp), d(&dout), i(&inp), ww(&w, true);
    f32().matmul_backward(nx, di.get(), dweight, dbias, *d, *i, *ww);
    di.store();
}

void gemm_of(const Numerics& nx, const Tensor& c, const Tensor& a, const Tensor& b,
             bool accumulate) {
    Wide aw(&a), bw(&b, true);
    f32().gemm(nx, c, *aw, *bw, accumulate);
}

void layernorm_fwd(const Numerics& nx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                   const Tensor& inp, const Tensor& w, const Tensor& b) {
    Wide o(&out), i(&inp);
    f32().layernorm_forward(nx, *o, mean, rstd, *i, w, b);
    o.store();
}

void layernorm_bwd(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                   const Tensor* dbias, const Tensor& dout, const Tensor& inp, const Tensor& w,
                   const Tensor& mean, const Tensor& rstd) {
    Wide di(dinp), d(&dout), i(&inp);
    f32().layernorm_backward(nx, di.get(), dweight, dbias, *d, *i, w, mean, rstd);
    di.store();
}

void gelu_fwd(const Numerics& nx, const Tensor& out, const Tensor& inp) {
    Wide o(&out), i(&inp);
    f32().gelu_forward(nx, *o, *i);
    o.store();
}

void gelu_bwd(const Numerics& nx, const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
    Wide di(&dinp), i(&inp), d(&dout);
    f32().gelu_backward(nx, *di, *i, *d);
    di.store();
}

// The attention's products (q·k and att·v) are matmuls of activations: both inputs are bf16
// already, so they need no extra cast.
void attention_fwd(const Numerics& nx, const Tensor& out, const Tensor& preatt, const Tensor& att,
                   const Tensor& qkv, i64 NH) {
    Wide o(&out), p(&preatt), a(&att), q(&qkv);
    f32().attention_forward(nx, *o, *p, *a, *q, NH);
    o.store();
    p.store();
    a.store();
}

void attention_bwd(const Numerics& nx, const Tensor& dqkv, const Tensor& dpreatt,
                   const Tensor& datt, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                   i64 NH) {
    Wide dq(&dqkv), dp(&dpreatt), da(&datt), d(&dout), q(&qkv), a(&att);
    f32().attention_backward(nx, *dq, *dp, *da, *d, *q, *a, NH);
    dq.store();
    dp.store();
    da.store();
}

void residual_fwd(const Numerics& nx, const Tensor& out, const Tensor& a, const Tensor& b) {
    Wide o(&out), aw(&a), bw(&b);
    f32().residual_forward(nx, *o, *aw, *bw);
    o.store();
}

void residual_bwd(const Numerics& nx, const Tensor& da, const Tensor& db, const Tensor& dout) {
    Wide a(&da), b(&db), d(&dout);
    f32().residual_backward(nx, *a, *b, *d);
    a.store();
    b.store();
}

void embedding_fwd(const Numerics& nx, const Tensor& out, const int* tokens, const Tensor& wte,
                   const Tensor& wpe) {
    Wide o(&out);
    f32().embedding_forward(nx, *o, tokens, wte, wpe);
    o.store();
}

void embedding_bwd(const Numerics& nx, const Tensor* dwte, const Tensor* dwpe, const Tensor& dout,
                   const int* tokens, i64 row_lo, i64 row_hi) {
    Wide d(&dout);
    f32().embedding_backward(nx, dwte, dwpe, *d, tokens, row_lo, row_hi);
}

void crossentropy_fwd(const Numerics& nx, const Tensor& losses, const Tensor& probs,
                      const Tensor& logits, const int* targets) {
    Wide p(&probs), l(&logits);
    const bool alias = probs.data == logits.data;
    f32().crossentropy_forward(nx, losses, alias ? *l : *p, *l, targets);
    (alias ? l : p).store();
}

void crossentropy_bwd(const Numerics& nx, const Tensor& dlogits, const Tensor& probs,
                      const int* targets, float dloss) {
    Wide p(&probs);
    const bool alias = probs.data == dlogits.data;
    Wide d(alias ? nullptr : &dlogits);
    f32().crossentropy_backward(nx, alias ? *p : *d, *p, targets, dloss);
    (alias ? p : d).store();
}

void row_max_of(const Numerics& nx, const Tensor& out, const Tensor& x) {
    Wide w(&x);
    f32().row_max(nx, out, *w);
}

void exp_sub_of(const Numerics& nx, const Tensor& out, const Tensor& x, const Tensor& shift) {
    Wide o(&out), w(&x);
    f32().exp_sub(nx, *o, *w, shift);
    o.store();
}

void row_sum_of(const Numerics& nx, const Tensor& out, const Tensor& x) {
    Wide w(&x);
    f32().row_sum(nx, out, *w);
}

}  // namespace

const ops::Backend bf16_backend{
    .name = "cpu bf16 (fp32 compute)",
    .operands = {.act = DType::bf16},  // weights, gradients, sums and optimizer state: fp32
    .matmul_forward = matmul_fwd,
    .matmul_backward = matmul_bwd,
    .gemm = gemm_of,
    .layernorm_forward = layernorm_fwd,
    .layernorm_backward = layernorm_bwd,
    .gelu_forward = gelu_fwd,
    .gelu_backward = gelu_bwd,
    .attention_forward = attention_fwd,
    .attention_backward = attention_bwd,
    .residual_forward = residual_fwd,
    .residual_backward = residual_bwd,
    .embedding_forward = embedding_fwd,
    .embedding_backward = embedding_bwd,
    .crossentropy_forward = crossentropy_fwd,
    .crossentropy_backward = crossentropy_bwd,
    .row_max = row_max_of,
    .exp_sub = exp_sub_of,
    .row_sum = row_sum_of,
    .adamw_update = nullptr,  // the optimizer runs on fp32 master weights (the fp32 backend)
    .sum_squares = nullptr,
    .sum_squares_blocks = nullptr,
};

}  // namespace px::cpu
