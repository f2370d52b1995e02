// The CPU fp32 backend: kernels/ops.h's entries on the kernels of this folder. Each entry reads
// the sizes of its (already checked) operands and calls the kernel; the kernels choose their
// order from nx.mode, so one backend serves bitwise and fast mode. It has every entry of
// kernels/op_list.h: they are declared from the list, so a new op's is missing until defined here.
#include "kernels/backend.h"
#include "kernels/cpu/cpu_kernels.h"

#include <string>
#include <vector>

namespace px::cpu {

namespace {

using ops::last_dim;
using ops::row_stride;
using ops::rows;

float* f32_or_null(const Tensor* t) {
    return t != nullptr ? t->f32() : nullptr;
}

// The entries, named after op_list.h's; a kernel they call is cpu::<name>, since the entry of the
// same name hides it.
struct F32 {
    static constexpr ops::Operands operands{};  // fp32 in every role
#define PX_ENTRY(op, entry, ret, params) static ret entry params;
#include "kernels/op_list.h"
    static std::string matmul_path(const Numerics& nx);
};

void F32::matmul_forward(const Numerics& nx, const Tensor& out, const Tensor& inp,
                         const Tensor& weight, const Tensor* bias) {
    cpu::matmul_forward(nx, out.f32(), inp.f32(), weight.f32(), f32_or_null(bias), rows(inp),
                        last_dim(inp), weight.shape[0]);
}

void F32::matmul_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                          const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                          const Tensor& weight) {
    cpu::matmul_backward(nx, f32_or_null(dinp), f32_or_null(dweight), f32_or_null(dbias),
                         dout.f32(), inp.f32(), weight.f32(), rows(inp), last_dim(inp),
                         weight.shape[0]);
}

void F32::gemm(const Numerics& nx, const Tensor& c, const Tensor& a, const Tensor& b,
               bool accumulate) {
    cpu::gemm(nx, c.f32(), c.strides[0], a.f32(), a.strides[0], a.strides[1], b.f32(), b.strides[0],
              b.strides[1], c.shape[0], c.shape[1], a.shape[1], accumulate);
}

void F32::layernorm_forward(const Numerics& nx, const Tensor& out, const Tensor& mean,
                            const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                            const Tensor& bias) {
    cpu::layernorm_forward(nx, out.f32(), mean.f32(), rstd.f32(), inp.f32(), weight.f32(),
                           bias.f32(), rows(inp), last_dim(inp));
}

void F32::layernorm_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                             const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                             const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
    cpu::layernorm_backward(nx, f32_or_null(dinp), f32_or_null(dweight), f32_or_null(dbias),
                            dout.f32(), inp.f32(), weight.f32(), mean.f32(), rstd.f32(), rows(inp),
                            last_dim(inp));
}

void F32::rmsnorm_forward(const Numerics& nx, const Tensor& out, const Tensor& rstd,
                          const Tensor& inp, const Tensor& weight, float eps) {
    cpu::rmsnorm_forward(nx, out.f32(), rstd.f32(), inp.f32(), weight.f32(), rows(inp),
                         last_dim(inp), eps);
}

void F32::rmsnorm_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                           const Tensor& dout, const Tensor& inp, const Tensor& weight,
                           const Tensor& rstd) {
    const i64 G = inp.ndim == 4 ? inp.shape[2] : 1;  // (B,T,G,C): a token's G rows (ops.h)
    cpu::rmsnorm_backward(nx, f32_or_null(dinp), f32_or_null(dweight), dout.f32(), inp.f32(),
                          weight.f32(), rstd.f32(), rows(inp) / G, last_dim(inp), G);
}

void F32::gelu_forward(const Numerics& nx, const Tensor& out, const Tensor& inp) {
    cpu::gelu_forward(nx, out.f32(), inp.f32(), inp.numel());
}

void F32::gelu_backward(const Numerics& nx, const Tensor& dinp, const Tensor& inp,
                        const Tensor& dout) {
    cpu::gelu_backward(nx, dinp.f32(), inp.f32(), dout.f32(), inp.numel());
}

// Operands may be column slices: rows one stride apart (ops.cpp checked).
void F32::swiglu_forward(const Numerics& nx, const Tensor& out, const Tensor& gate,
                         const Tensor& up) {
    cpu::swiglu_forward(nx, out.f32(), row_stride(out, out.ndim - 1), gate.f32(), up.f32(),
                        row_stride(gate, gate.ndim - 1), rows(gate), last_dim(gate));
}

void F32::swiglu_backward(const Numerics& nx, const Tensor& dgate, const Tensor& dup,
                          const Tensor& gate, const Tensor& up, const Tensor& dout) {
    cpu::swiglu_backward(nx, dgate.f32(), dup.f32(), row_stride(dgate, dgate.ndim - 1), gate.f32(),
                         up.f32(), row_stride(gate, gate.ndim - 1), dout.f32(),
                         row_stride(dout, dout.ndim - 1), rows(gate), last_dim(gate));
}

void F32::rope_table(const Numerics& nx, const Tensor& cos, const Tensor& sin, double theta,
                     const ops::RopeScaling& scaling) {
    const std::vector<float> inv = ops::rope_inv_freq(2 * cos.shape[1], theta, scaling);
    cpu::rope_table(nx, cos.f32(), sin.f32(), inv.data(), cos.shape[0], 2 * cos.shape[1]);
}

// x (B,T,NH,HS): its token rows one stride apart (ops.cpp checked).
void F32::rope_forward(const Numerics& nx, const Tensor& out, const Tensor& inp, const Tensor& cos,
                       const Tensor& sin, const i64* pos) {
    cpu::rope_forward(nx, out.f32(), row_stride(out, 2), inp.f32(), row_stride(inp, 2), cos.f32(),
                      sin.f32(), pos, inp.shape[0], inp.shape[1], inp.shape[2], inp.shape[3],
                      cos.shape[0]);
}

void F32::rope_backward(const Numerics& nx, const Tensor& dinp, const Tensor& dout,
                        const Tensor& cos, const Tensor& sin, const i64* pos) {
    cpu::rope_backward(nx, dinp.f32(), row_stride(dinp, 2), dout.f32(), row_stride(dout, 2),
                       cos.f32(), sin.f32(), pos, dout.shape[0], dout.shape[1], dout.shape[2],
                       dout.shape[3], cos.shape[0]);
}

void F32::attention_forward(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                            const Tensor& att, const Tensor& qkv, i64 NH) {
    cpu::attention_forward(nx, out.f32(), preatt.f32(), att.f32(), qkv.f32(), qkv.shape[0],
                           qkv.shape[1], qkv.shape[2] / 3, NH);
}

void F32::attention_backward(const Numerics& nx, const Tensor& dqkv, const Tensor& dpreatt,
                             const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                             const Tensor& att, i64 NH) {
    cpu::attention_backward(nx, dqkv.f32(), dpreatt.f32(), datt.f32(), dout.f32(), qkv.f32(),
                            att.f32(), qkv.shape[0], qkv.shape[1], qkv.shape[2] / 3, NH);
}

void F32::attention_queries_scores(const Numerics& nx, const Tensor& preatt, const Tensor& q,
                                   const Tensor& kv, const i64* pos, i64 key_lo, i64 key_hi,
                                   i64 NH) {
    attention_scores_queries(nx, preatt.f32(), q.f32(), kv.f32(), pos, key_lo, key_hi, q.shape[0],
                             q.shape[1], kv.shape[1], q.shape[2] / 3, NH);
}

void F32::attention_queries_softmax(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                                    const Tensor& att, const Tensor& kv, const i64* pos, i64 NH) {
    const i64 B = kv.shape[0], T = kv.shape[1], C = kv.shape[2] / 3;
    attention_softmax_queries(nx, out.f32(), preatt.f32(), att.f32(), kv.f32(), pos, B,
                              out.numel() / (B * C), T, C, NH);
}

void F32::attention_queries_backward(const Numerics& nx, const Tensor& dq, const Tensor& parts,
                                     const Tensor& dpreatt, const Tensor& datt, const Tensor& dout,
                                     const Tensor& q, const Tensor& kv, const Tensor& att,
                                     const i64* pos, const i64* node_lo, const i64* node_hi, i64 K,
                                     i64 NH) {
    attention_backward_queries(nx, dq.f32(), parts.f32(), dpreatt.f32(), datt.f32(), dout.f32(),
                               q.f32(), kv.f32(), att.f32(), pos, node_lo, node_hi, K, q.shape[0],
                               q.shape[1], kv.shape[1], q.shape[2] / 3, NH);
}

void F32::residual_forward(const Numerics& nx, const Tensor& out, const Tensor& a,
                           const Tensor& b) {
    cpu::residual_forward(nx, out.f32(), a.f32(), b.f32(), a.numel());
}

void F32::residual_backward(const Numerics& nx, const Tensor& da, const Tensor& db,
                            const Tensor& dout) {
    cpu::residual_backward(nx, da.f32(), db.f32(), dout.f32(), dout.numel());
}

void F32::embedding_forward(const Numerics& nx, const Tensor& out, const int* tokens,
                            const Tensor& wte, const Tensor& wpe) {
    // wpe without data: no position embedding (ops.h)
    cpu::embedding_forward(nx, out.f32(), tokens, wte.f32(), wpe.data ? wpe.f32() : nullptr,
                           out.shape[0], out.shape[1], out.shape[2]);
}

// V only bounds the token ids of dwte's rows, so it is unused without dwte.
void F32::embedding_backward(const Numerics& nx, const Tensor* dwte, const Tensor* dwpe,
                             const Tensor& dout, const int* tokens, i64 row_lo, i64 row_hi) {
    cpu::embedding_backward(nx, f32_or_null(dwte), f32_or_null(dwpe), dout.f32(), tokens,
                            dout.shape[0], dout.shape[1], dout.shape[2],
                            dwte != nullptr ? dwte->shape[0] : 0, row_lo, row_hi);
}

void F32::crossentropy_forward(const Numerics& nx, const Tensor& losses, const Tensor& probs,
                               const Tensor& logits, const int* targets) {
    cpu::crossentropy_forward(nx, losses.f32(), probs.f32(), logits.f32(), targets, rows(logits),
                              last_dim(logits));
}

void F32::crossentropy_backward(const Numerics& nx, const Tensor& dlogits, const Tensor& probs,
                                const int* targets, float dloss) {
    cpu::crossentropy_backward(nx, dlogits.f32(), probs.f32(), targets, dloss, rows(probs),
                               last_dim(probs));
}

void F32::row_max(const Numerics& nx, const Tensor& out, const Tensor& x) {
    cpu::row_max(nx, out.f32(), x.f32(), x.shape[0], x.shape[1]);
}

void F32::exp_sub(const Numerics& nx, const Tensor& out, const Tensor& x, const Tensor& shift) {
    cpu::exp_sub(nx, out.f32(), x.f32(), shift.f32(), x.shape[0], x.shape[1]);
}

void F32::row_sum(const Numerics& nx, const Tensor& out, const Tensor& x) {
    cpu::row_sum(nx, out.f32(), x.f32(), x.strides[0], x.shape[0], x.shape[1]);
}

void F32::adamw_update(const Numerics& nx, const Tensor& param, const Tensor& m, const Tensor& v,
                       const Tensor& grad, const ops::AdamWStep& s) {
    cpu::adamw_update(nx, param.f32(), m.f32(), v.f32(), grad.f32(), param.numel(), s.lr, s.beta1,
                      s.beta2, s.eps, s.weight_decay, s.grad_scale, s.t);
}

float F32::sum_squares(const Numerics& nx, const Tensor& x) {
    return cpu::sum_squares(nx, x.f32(), x.numel());
}

void F32::sum_squares_blocks(const Numerics& nx, const Tensor& part, const Tensor& x) {
    cpu::sum_squares_blocks(nx, part.f32(), x.f32(), x.numel());
}

std::string F32::matmul_path(const Numerics& nx) {
    if (nx.mode == Mode::fast) return "oneDNN sgemm";
    return std::string("canonical GEMM, ") + isa_name(nx.isa) + " microkernel";
}

}  // namespace

constinit const ops::Backend f32_backend = ops::backend_from<F32>("cpu f32");

}  // namespace px::cpu
