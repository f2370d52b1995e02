// The CPU 16-bit backends, bf16 and fp16 activations computed by the fp32 kernels (one template,
// two instances). Each entry widens its 16-bit operands to fp32 (exact), rounds the weights a
// matmul reads to the activations' dtype (the cast point of a 16-bit matmul: both inputs in that
// dtype, products accumulated in fp32 in the canonical order), runs the fp32 kernel, and rounds
// each activation it writes once (nearest even; fp16 overflows to infinity, which the loss
// scaler of an fp16 run finds in the gradients and skips, core/train/loss_scaler.h). LayerNorm
// statistics, losses, softmax row statistics, weight gradients and the optimizer stay fp32
// (Operands below). Both numerics modes: the fp32 kernels choose their order from nx.mode.
//
// This is the reference 16-bit path, exact by construction and the same on every CPU. In fast
// mode bf16 runs bf16_fast_backend instead: the same entries but for the matmuls, which take
// oneDNN's bf16 primitive or sgemm (kernels/cpu/matmul_bf16.h).
#include "core/base/dtype.h"
#include "core/base/widened.h"
#include "kernels/backend.h"
#include "kernels/cpu/matmul_bf16.h"

#include <string>

namespace px::cpu {

namespace {

using ops::Backend;

// Wide<D>(t): t's values in fp32; Wide<D>(t, true): a matmul's fp32 weights rounded to D.
template <DType D>
struct Wide : Widened {
    explicit Wide(const Tensor* t, bool matmul_weight = false)
        : Widened(t, matmul_weight ? D : DType::f32) {}
};

const Backend& f32() {
    return f32_backend;
}

template <DType D>
void matmul_fwd(const Numerics& nx, const Tensor& out, const Tensor& inp, const Tensor& w,
                const Tensor* bias) {
    Wide<D> o(&out), i(&inp), ww(&w, true);
    f32().matmul_forward(nx, *o, *i, *ww, bias);
    o.store();
}

template <DType D>
void matmul_bwd(const Numerics& nx, const Tensor* dinp, const Tensor* dweight, const Tensor* dbias,
                const Tensor& dout, const Tensor& inp, const Tensor& w) {
    Wide<D> di(dinp), d(&dout), i(&inp), ww(&w, true);
    f32().matmul_backward(nx, di.get(), dweight, dbias, *d, *i, *ww);
    di.store();
}

template <DType D>
void gemm_of(const Numerics& nx, const Tensor& c, const Tensor& a, const Tensor& b,
             bool accumulate) {
    Wide<D> aw(&a), bw(&b, true);
    f32().gemm(nx, c, *aw, *bw, accumulate);
}

template <DType D>
void layernorm_fwd(const Numerics& nx, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                   const Tensor& inp, const Tensor& w, const Tensor& b) {
    Wide<D> o(&out), i(&inp);
    f32().layernorm_forward(nx, *o, mean, rstd, *i, w, b);
    o.store();
}

template <DType D>
void layernorm_bwd(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                   const Tensor* dbias, const Tensor& dout, const Tensor& inp, const Tensor& w,
                   const Tensor& mean, const Tensor& rstd) {
    Wide<D> di(dinp), d(&dout), i(&inp);
    f32().layernorm_backward(nx, di.get(), dweight, dbias, *d, *i, w, mean, rstd);
    di.store();
}

template <DType D>
void gelu_fwd(const Numerics& nx, const Tensor& out, const Tensor& inp) {
    Wide<D> o(&out), i(&inp);
    f32().gelu_forward(nx, *o, *i);
    o.store();
}

template <DType D>
void gelu_bwd(const Numerics& nx, const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
    Wide<D> di(&dinp), i(&inp), d(&dout);
    f32().gelu_backward(nx, *di, *i, *d);
    di.store();
}

// The attention's products (q·k and att·v) are matmuls of activations: both inputs are bf16
// already, so they need no extra cast.
template <DType D>
void attention_fwd(const Numerics& nx, const Tensor& out, const Tensor& preatt, const Tensor& att,
                   const Tensor& qkv, i64 NH) {
    Wide<D> o(&out), p(&preatt), a(&att), q(&qkv);
    f32().attention_forward(nx, *o, *p, *a, *q, NH);
    o.store();
    p.store();
    a.store();
}

template <DType D>
void attention_bwd(const Numerics& nx, const Tensor& dqkv, const Tensor& dpreatt,
                   const Tensor& datt, const Tensor& dout, const Tensor& qkv, const Tensor& att,
                   i64 NH) {
    Wide<D> dq(&dqkv), dp(&dpreatt), da(&datt), d(&dout), q(&qkv), a(&att);
    f32().attention_backward(nx, *dq, *dp, *da, *d, *q, *a, NH);
    dq.store();
    dp.store();
    da.store();
}

template <DType D>
void residual_fwd(const Numerics& nx, const Tensor& out, const Tensor& a, const Tensor& b) {
    Wide<D> o(&out), aw(&a), bw(&b);
    f32().residual_forward(nx, *o, *aw, *bw);
    o.store();
}

template <DType D>
void residual_bwd(const Numerics& nx, const Tensor& da, const Tensor& db, const Tensor& dout) {
    Wide<D> a(&da), b(&db), d(&dout);
    f32().residual_backward(nx, *a, *b, *d);
    a.store();
    b.store();
}

template <DType D>
void embedding_fwd(const Numerics& nx, const Tensor& out, const int* tokens, const Tensor& wte,
                   const Tensor& wpe) {
    Wide<D> o(&out);
    f32().embedding_forward(nx, *o, tokens, wte, wpe);
    o.store();
}

template <DType D>
void embedding_bwd(const Numerics& nx, const Tensor* dwte, const Tensor* dwpe, const Tensor& dout,
                   const int* tokens, i64 row_lo, i64 row_hi) {
    Wide<D> d(&dout);
    f32().embedding_backward(nx, dwte, dwpe, *d, tokens, row_lo, row_hi);
}

template <DType D>
void crossentropy_fwd(const Numerics& nx, const Tensor& losses, const Tensor& probs,
                      const Tensor& logits, const int* targets) {
    Wide<D> p(&probs), l(&logits);
    const bool alias = probs.data == logits.data;
    f32().crossentropy_forward(nx, losses, alias ? *l : *p, *l, targets);
    (alias ? l : p).store();
}

template <DType D>
void crossentropy_bwd(const Numerics& nx, const Tensor& dlogits, const Tensor& probs,
                      const int* targets, float dloss) {
    Wide<D> p(&probs);
    const bool alias = probs.data == dlogits.data;
    Wide<D> d(alias ? nullptr : &dlogits);
    f32().crossentropy_backward(nx, alias ? *p : *d, *p, targets, dloss);
    (alias ? p : d).store();
}

template <DType D>
void row_max_of(const Numerics& nx, const Tensor& out, const Tensor& x) {
    Wide<D> w(&x);
    f32().row_max(nx, out, *w);
}

template <DType D>
void exp_sub_of(const Numerics& nx, const Tensor& out, const Tensor& x, const Tensor& shift) {
    Wide<D> o(&out), w(&x);
    f32().exp_sub(nx, *o, *w, shift);
    o.store();
}

template <DType D>
void row_sum_of(const Numerics& nx, const Tensor& out, const Tensor& x) {
    Wide<D> w(&x);
    f32().row_sum(nx, out, *w);
}

// Fast bf16 matmuls (kernels/cpu/matmul_bf16.h) on the path this CPU takes.
const std::uint16_t* bf16_of(const Tensor& t) {
    return static_cast<const std::uint16_t*>(t.data);
}
std::uint16_t* bf16_out(const Tensor* t) {
    return t != nullptr ? static_cast<std::uint16_t*>(t->data) : nullptr;
}

void matmul_fwd_fast(const Numerics& nx, const Tensor& out, const Tensor& inp, const Tensor& w,
                     const Tensor* bias) {
    matmul_forward_bf16(nx, bf16_matmul_info().path, bf16_out(&out), bf16_of(inp), w.f32(),
                        bias != nullptr ? bias->f32() : nullptr, ops::rows(inp), ops::last_dim(inp),
                        w.shape[0]);
}

void matmul_bwd_fast(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                     const Tensor* dbias, const Tensor& dout, const Tensor& inp, const Tensor& w) {
    matmul_backward_bf16(nx, bf16_matmul_info().path, bf16_out(dinp),
                         dweight != nullptr ? dweight->f32() : nullptr,
                         dbias != nullptr ? dbias->f32() : nullptr, bf16_of(dout), bf16_of(inp),
                         w.f32(), ops::rows(inp), ops::last_dim(inp), w.shape[0]);
}

std::string reference_path(const Numerics& nx) {
    return nx.mode == Mode::fast ? "fp32 sgemm on 16-bit values"
                                 : std::string("canonical GEMM on 16-bit values, ") +
                                       isa_name(nx.isa);
}

std::string fast_bf16_path(const Numerics&) {
    return bf16_matmul_info().text;
}

template <DType D>
constexpr Backend narrow_backend(const char* name) {
    return Backend{
        .name = name,
        .operands = {.act = D},  // weights, gradients, sums and optimizer state: fp32
        .matmul_forward = matmul_fwd<D>,
        .matmul_backward = matmul_bwd<D>,
        .gemm = gemm_of<D>,
        .layernorm_forward = layernorm_fwd<D>,
        .layernorm_backward = layernorm_bwd<D>,
        .gelu_forward = gelu_fwd<D>,
        .gelu_backward = gelu_bwd<D>,
        .attention_forward = attention_fwd<D>,
        .attention_backward = attention_bwd<D>,
        .residual_forward = residual_fwd<D>,
        .residual_backward = residual_bwd<D>,
        .embedding_forward = embedding_fwd<D>,
        .embedding_backward = embedding_bwd<D>,
        .crossentropy_forward = crossentropy_fwd<D>,
        .crossentropy_backward = crossentropy_bwd<D>,
        .row_max = row_max_of<D>,
        .exp_sub = exp_sub_of<D>,
        .row_sum = row_sum_of<D>,
        .adamw_update = nullptr,  // the optimizer runs on fp32 master weights (the fp32 backend)
        .sum_squares = nullptr,
        .sum_squares_blocks = nullptr,
        .matmul_path = reference_path,
    };
}

constexpr Backend fast_bf16_backend() {
    Backend b = narrow_backend<DType::bf16>("cpu bf16 fast (oneDNN bf16 or sgemm)");
    b.matmul_forward = matmul_fwd_fast;
    b.matmul_backward = matmul_bwd_fast;
    b.matmul_path = fast_bf16_path;
    return b;
}

}  // namespace

constinit const ops::Backend bf16_backend = narrow_backend<DType::bf16>("cpu bf16 (fp32 compute)");
constinit const ops::Backend f16_backend = narrow_backend<DType::f16>("cpu fp16 (fp32 compute)");
constinit const ops::Backend bf16_fast_backend = fast_bf16_backend();

}  // namespace px::cpu
