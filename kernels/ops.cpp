#include "kernels/ops.h"

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"

#include <string>

namespace px::ops {

namespace {

constexpr const char* kOpNames[] = {"matmul",   "layernorm",    "gelu",  "attention",  "residual",
                                    "embedding", "crossentropy", "adamw", "sum_squares"};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == static_cast<size_t>(Op::kCount),
              "kOpNames must match Op");

// Every operand of an op must be something a backend supports; say which one is not.
void require(Op op, const Tensor& t) {
    if (!supports(op, t.device, t.dtype))
        throw Error(std::string("op ") + op_name(op) + " has no kernel for tensor '" + t.name +
                    "' with dtype " + dtype_name(t.dtype) + " on " +
                    (t.device == Device::cpu ? "cpu" : "cuda") +
                    "; use precision fp32 or a backend that supports it");
    PX_ASSERT(t.contiguous(), std::string("operand '") + t.name + "' must be contiguous");
}

i64 last_dim(const Tensor& t) { return t.shape[t.ndim - 1]; }
i64 rows(const Tensor& t) { return t.numel() / last_dim(t); }

}  // namespace

const char* op_name(Op op) { return kOpNames[static_cast<int>(op)]; }

bool supports(Op, Device device, DType dtype) {
    // The CPU backend runs fp32 today; narrow dtypes and CUDA register here as they land.
    return device == Device::cpu && dtype == DType::f32;
}

void matmul_forward(const Numerics& nx, const Tensor& out, const Tensor& inp, const Tensor& weight,
                    const Tensor* bias) {
    for (const Tensor* t : {&out, &inp, &weight}) require(Op::matmul, *t);
    if (bias) require(Op::matmul, *bias);
    const i64 C = last_dim(inp), BT = rows(inp), OC = weight.shape[0];
    PX_ASSERT(weight.shape[1] == C && rows(out) == BT && last_dim(out) == OC, "matmul shapes");
    cpu::matmul_forward(nx, out.f32(), inp.f32(), weight.f32(), bias ? bias->f32() : nullptr, BT,
                        C, OC);
}

void matmul_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                     const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight) {
    for (const Tensor* t : {&dout, &inp, &weight}) require(Op::matmul, *t);
    for (const Tensor* t : {dinp, dweight, dbias})
        if (t) require(Op::matmul, *t);
    const i64 C = last_dim(inp), BT = rows(inp), OC = weight.shape[0];
    PX_ASSERT(rows(dout) == BT && last_dim(dout) == OC, "matmul_backward shapes");
    cpu::matmul_backward(nx, dinp ? dinp->f32() : nullptr, dweight ? dweight->f32() : nullptr,
                         dbias ? dbias->f32() : nullptr, dout.f32(), inp.f32(), weight.f32(), BT,
                         C, OC);
}

void layernorm_forward(const Numerics& nx, const Tensor& out, const Tensor& mean,
                       const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias) {
    for (const Tensor* t : {&out, &mean, &rstd, &inp, &weight, &bias}) require(Op::layernorm, *t);
    const i64 C = last_dim(inp), BT = rows(inp);
    PX_ASSERT(weight.numel() == C && mean.numel() == BT, "layernorm shapes");
    cpu::layernorm_forward(nx, out.f32(), mean.f32(), rstd.f32(), inp.f32(), weight.f32(),
                           bias.f32(), BT, C);
}

void layernorm_backward(const Numerics& nx, const Tensor& dinp, const Tensor& dweight,
                        const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
    for (const Tensor* t : {&dinp, &dweight, &dbias, &dout, &inp, &weight, &mean, &rstd})
        require(Op::layernorm, *t);
    const i64 C = last_dim(inp), BT = rows(inp);
    cpu::layernorm_backward(nx, dinp.f32(), dweight.f32(), dbias.f32(), dout.f32(), inp.f32(),
                            weight.f32(), mean.f32(), rstd.f32(), BT, C);
}

void gelu_forward(const Numerics& nx, const Tensor& out, const Tensor& inp) {
    require(Op::gelu, out);
    require(Op::gelu, inp);
    PX_ASSERT(out.numel() == inp.numel(), "gelu shapes");
    cpu::gelu_forward(nx, out.f32(), inp.f32(), inp.numel());
}

void gelu_backward(const Numerics& nx, const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
    for (const Tensor* t : {&dinp, &inp, &dout}) require(Op::gelu, *t);
    cpu::gelu_backward(nx, dinp.f32(), inp.f32(), dout.f32(), inp.numel());
}

void attention_forward(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                       const Tensor& att, const Tensor& qkv, i64 NH) {
    for (const Tensor* t : {&out, &preatt, &att, &qkv}) require(Op::attention, *t);
    const i64 B = qkv.shape[0], T = qkv.shape[1], C = qkv.shape[2] / 3;
    PX_ASSERT(att.numel() == B * NH * T * T && preatt.numel() >= att.numel(), "attention shapes");
    cpu::attention_forward(nx, out.f32(), preatt.f32(), att.f32(), qkv.f32(), B, T, C, NH);
}

void attention_backward(const Numerics& nx, const Tensor& dqkv, const Tensor& dpreatt,
                        const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                        const Tensor& att, i64 NH) {
    for (const Tensor* t : {&dqkv, &dpreatt, &datt, &dout, &qkv, &att}) require(Op::attention, *t);
    const i64 B = qkv.shape[0], T = qkv.shape[1], C = qkv.shape[2] / 3;
    cpu::attention_backward(nx, dqkv.f32(), dpreatt.f32(), datt.f32(), dout.f32(), qkv.f32(),
                            att.f32(), B, T, C, NH);
}

void residual_forward(const Numerics& nx, const Tensor& out, const Tensor& a, const Tensor& b) {
    for (const Tensor* t : {&out, &a, &b}) require(Op::residual, *t);
    PX_ASSERT(a.numel() == b.numel() && out.numel() == a.numel(), "residual shapes");
    cpu::residual_forward(nx, out.f32(), a.f32(), b.f32(), a.numel());
}

void residual_backward(const Numerics& nx, const Tensor& da, const Tensor& db, const Tensor& dout) {
    for (const Tensor* t : {&da, &db, &dout}) require(Op::residual, *t);
    cpu::residual_backward(nx, da.f32(), db.f32(), dout.f32(), dout.numel());
}

void embedding_forward(const Numerics& nx, const Tensor& out, const int* tokens, const Tensor& wte,
                       const Tensor& wpe) {
    for (const Tensor* t : {&out, &wte, &wpe}) require(Op::embedding, *t);
    const i64 B = out.shape[0], T = out.shape[1], C = out.shape[2];
    PX_ASSERT(wpe.shape[0] >= T && wte.shape[1] == C, "embedding shapes");
    cpu::embedding_forward(nx, out.f32(), tokens, wte.f32(), wpe.f32(), B, T, C);
}

void embedding_backward(const Numerics& nx, const Tensor& dwte, const Tensor& dwpe,
                        const Tensor& dout, const int* tokens) {
    for (const Tensor* t : {&dwte, &dwpe, &dout}) require(Op::embedding, *t);
    const i64 B = dout.shape[0], T = dout.shape[1], C = dout.shape[2];
    cpu::embedding_backward(nx, dwte.f32(), dwpe.f32(), dout.f32(), tokens, B, T, C, dwte.shape[0]);
}

void crossentropy_forward(const Numerics& nx, const Tensor& losses, const Tensor& probs,
                          const Tensor& logits, const int* targets) {
    for (const Tensor* t : {&losses, &probs, &logits}) require(Op::crossentropy, *t);
    const i64 V = last_dim(logits), BT = rows(logits);
    PX_ASSERT(losses.numel() == BT, "crossentropy shapes");
    cpu::crossentropy_forward(nx, losses.f32(), probs.f32(), logits.f32(), targets, BT, V);
}

void crossentropy_backward(const Numerics& nx, const Tensor& dlogits, const Tensor& probs,
                           const int* targets, float dloss) {
    require(Op::crossentropy, dlogits);
    require(Op::crossentropy, probs);
    cpu::crossentropy_backward(nx, dlogits.f32(), probs.f32(), targets, dloss, rows(probs),
                               last_dim(probs));
}

void adamw_update(const Numerics& nx, const Tensor& param, const Tensor& m, const Tensor& v,
                  const Tensor& grad, const AdamWStep& s) {
    for (const Tensor* t : {&param, &m, &v, &grad}) require(Op::adamw, *t);
    cpu::adamw_update(nx, param.f32(), m.f32(), v.f32(), grad.f32(), param.numel(), s.lr, s.beta1,
                      s.beta2, s.eps, s.weight_decay, s.grad_scale, s.t);
}

float sum_squares(const Numerics& nx, const Tensor& x) {
    require(Op::sum_squares, x);
    return cpu::sum_squares(nx, x.f32(), x.numel());
}

}  // namespace px::ops
