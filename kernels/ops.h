// Ops on tensors: the layer the model calls. Each op checks shapes, then dispatches on device
// and dtype to a backend kernel (kernels/cpu today; kernels/cuda and bf16/fp16/fp8 operands are
// added beside the fp32 path here, without touching callers).
//
// Index
//   supports          whether a backend has an op for a device and dtype
//   matmul_*          out = inp · weightᵀ + bias
//   layernorm_*, gelu_*, attention_*, residual_*, embedding_*, crossentropy_*
//   adamw_update, sum_squares
//
// Shapes use the letters of core/shapes.h; leading dimensions are flattened into BT.
// Semantics (activations assign, gradients accumulate) are those of kernels/cpu/cpu_kernels.h.
#pragma once
#include "core/numerics.h"
#include "core/tensor.h"

namespace px::ops {

enum class Op : std::uint8_t {
    matmul, layernorm, gelu, attention, residual, embedding, crossentropy, adamw, sum_squares,
    kCount
};
const char* op_name(Op op);
bool supports(Op op, Device device, DType dtype);

// out (BT,OC), inp (BT,C), weight (OC,C), bias (OC) or null
void matmul_forward(const Numerics& nx, const Tensor& out, const Tensor& inp, const Tensor& weight,
                    const Tensor* bias);
void matmul_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                     const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight);

// out (BT,C), mean (BT), rstd (BT), inp (BT,C), weight (C), bias (C)
void layernorm_forward(const Numerics& nx, const Tensor& out, const Tensor& mean,
                       const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias);
void layernorm_backward(const Numerics& nx, const Tensor& dinp, const Tensor& dweight,
                        const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd);

void gelu_forward(const Numerics& nx, const Tensor& out, const Tensor& inp);
void gelu_backward(const Numerics& nx, const Tensor& dinp, const Tensor& inp, const Tensor& dout);

// out (B,T,C), att (B,NH,T,T), qkv (B,T,3C); preatt is scratch the size of att
void attention_forward(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                       const Tensor& att, const Tensor& qkv, i64 NH);
void attention_backward(const Numerics& nx, const Tensor& dqkv, const Tensor& dpreatt,
                        const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                        const Tensor& att, i64 NH);

void residual_forward(const Numerics& nx, const Tensor& out, const Tensor& a, const Tensor& b);
void residual_backward(const Numerics& nx, const Tensor& da, const Tensor& db, const Tensor& dout);

// out (B,T,C), tokens (B,T) int32 as a raw pointer, wte (V,C), wpe (>=T,C)
void embedding_forward(const Numerics& nx, const Tensor& out, const int* tokens, const Tensor& wte,
                       const Tensor& wpe);
void embedding_backward(const Numerics& nx, const Tensor& dwte, const Tensor& dwpe,
                        const Tensor& dout, const int* tokens);

// losses (BT), probs (BT,V), logits (BT,V); probs may alias logits
void crossentropy_forward(const Numerics& nx, const Tensor& losses, const Tensor& probs,
                          const Tensor& logits, const int* targets);
void crossentropy_backward(const Numerics& nx, const Tensor& dlogits, const Tensor& probs,
                           const int* targets, float dloss);

struct AdamWStep {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int t;  // 1-based step, for bias correction
};
void adamw_update(const Numerics& nx, const Tensor& param, const Tensor& m, const Tensor& v,
                  const Tensor& grad, const AdamWStep& s);
float sum_squares(const Numerics& nx, const Tensor& x);

}  // namespace px::ops
