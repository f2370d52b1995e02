// The backend table behind kernels/ops.h. Not for use outside kernels/.
//
// Index
//   Backend           the kernels of one backend: one entry per op direction, null where none
//   Role, Operands    the part an operand plays in an op, and the dtype a backend wants for each
//   find_backend      the backend registered for a device, dtype and numerics mode (null: none)
//   last_dim, rows    sizes read from an operand
//   cpu::f32_backend  the CPU fp32 backend (kernels/cpu/backend.cpp)
//   cpu::bf16_backend bf16 activations computed by the fp32 kernels (kernels/cpu/bf16_backend.cpp)
//   cpu::f16_backend  fp16 activations, the same template (kernels/cpu/bf16_backend.cpp)
//   cpu::bf16_fast_backend  bf16 in fast mode: oneDNN's bf16 matmuls or sgemm (matmul_bf16.h)
//
// ops.cpp checks every operand (shapes, device, dtype, layout) before it calls an entry, so an
// entry only reads its sizes from the tensors and runs. A backend is keyed by the dtype of its
// activations; its other operands may differ (bf16 activations with fp32 LayerNorm statistics and
// weight gradients), as its Operands say. A backend serves any set of (device,
// dtype, mode) keys: the CPU fp32 kernels handle both modes themselves; a cuBLAS backend would
// register for fast mode only. Adding a backend or a dtype is a Backend value and its lines in
// kRegistry (backend.cpp).
#pragma once
#include "kernels/ops.h"

#include <string>

namespace px::ops {

// The dtype a backend wants for each role an operand plays (ops.cpp tags every operand):
//   act     activations and their gradients (the dtype of the key: precision.activations)
//   weight  parameters read by the forward and backward (master weights, or a cast copy)
//   grad    weight gradients, accumulated over microbatches (fp32 under the numerics contract)
//   acc     sums kept in fp32 whatever the activations: LayerNorm statistics, losses, a
//           softmax's row statistics, gemm partials of a canonical tree
//   master  optimizer state and the master weights it updates
enum class Role : std::uint8_t { act, weight, grad, acc, master };
const char* role_name(Role r);
struct Operands {
    DType act = DType::f32, weight = DType::f32, grad = DType::f32, acc = DType::f32,
          master = DType::f32;
    DType of(Role r) const;
};

struct Backend {
    const char* name;  // "cpu f32"
    Operands operands;  // the dtype of each role; a backend's key dtype is operands.act
    void (*matmul_forward)(const Numerics&, const Tensor& out, const Tensor& inp,
                           const Tensor& weight, const Tensor* bias);
    void (*matmul_backward)(const Numerics&, const Tensor* dinp, const Tensor* dweight,
                            const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                            const Tensor& weight);
    void (*gemm)(const Numerics&, const Tensor& c, const Tensor& a, const Tensor& b,
                 bool accumulate);
    void (*layernorm_forward)(const Numerics&, const Tensor& out, const Tensor& mean,
                              const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                              const Tensor& bias);
    void (*layernorm_backward)(const Numerics&, const Tensor* dinp, const Tensor* dweight,
                               const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight, const Tensor& mean, const Tensor& rstd);
    void (*gelu_forward)(const Numerics&, const Tensor& out, const Tensor& inp);
    void (*gelu_backward)(const Numerics&, const Tensor& dinp, const Tensor& inp,
                          const Tensor& dout);
    void (*attention_forward)(const Numerics&, const Tensor& out, const Tensor& preatt,
                              const Tensor& att, const Tensor& qkv, i64 NH);
    void (*attention_backward)(const Numerics&, const Tensor& dqkv, const Tensor& dpreatt,
                               const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                               const Tensor& att, i64 NH);
    void (*attention_queries_scores)(const Numerics&, const Tensor& preatt, const Tensor& q,
                                     const Tensor& kv, const i64* pos, i64 key_lo, i64 key_hi,
                                     i64 NH);
    void (*attention_queries_softmax)(const Numerics&, const Tensor& out, const Tensor& preatt,
                                      const Tensor& att, const Tensor& kv, const i64* pos, i64 NH);
    void (*attention_queries_backward)(const Numerics&, const Tensor& dq, const Tensor& parts,
                                       const Tensor& dpreatt, const Tensor& datt,
                                       const Tensor& dout, const Tensor& q, const Tensor& kv,
                                       const Tensor& att, const i64* pos, const i64* node_lo,
                                       const i64* node_hi, i64 K, i64 NH);
    void (*residual_forward)(const Numerics&, const Tensor& out, const Tensor& a, const Tensor& b);
    void (*residual_backward)(const Numerics&, const Tensor& da, const Tensor& db,
                              const Tensor& dout);
    void (*embedding_forward)(const Numerics&, const Tensor& out, const int* tokens,
                              const Tensor& wte, const Tensor& wpe);
    void (*embedding_backward)(const Numerics&, const Tensor* dwte, const Tensor* dwpe,
                               const Tensor& dout, const int* tokens, i64 row_lo, i64 row_hi);
    void (*crossentropy_forward)(const Numerics&, const Tensor& losses, const Tensor& probs,
                                 const Tensor& logits, const int* targets);
    void (*crossentropy_backward)(const Numerics&, const Tensor& dlogits, const Tensor& probs,
                                  const int* targets, float dloss);
    void (*row_max)(const Numerics&, const Tensor& out, const Tensor& x);
    void (*exp_sub)(const Numerics&, const Tensor& out, const Tensor& x, const Tensor& shift);
    void (*row_sum)(const Numerics&, const Tensor& out, const Tensor& x);
    void (*adamw_update)(const Numerics&, const Tensor& param, const Tensor& m, const Tensor& v,
                         const Tensor& grad, const AdamWStep& s);
    float (*sum_squares)(const Numerics&, const Tensor& x);
    void (*sum_squares_blocks)(const Numerics&, const Tensor& part, const Tensor& x);
    // Which kernel runs the matmuls in nx's mode, on which hardware path (ops::matmul_path).
    std::string (*matmul_path)(const Numerics&) = nullptr;

    bool has(Op op) const;  // every direction of op is there
};

const Backend* find_backend(Device device, DType dtype, Mode mode);

inline i64 last_dim(const Tensor& t) {
    return t.shape[t.ndim - 1];
}
// The product of the leading dimensions (BT), also when the last one is empty.
inline i64 rows(const Tensor& t) {
    i64 n = 1;
    for (int d = 0; d + 1 < t.ndim; d++) n *= t.shape[d];
    return n;
}

}  // namespace px::ops

namespace px::cpu {
extern const ops::Backend f32_backend;
extern const ops::Backend bf16_backend;  // bf16 activations on the fp32 kernels
extern const ops::Backend f16_backend;   // fp16 activations on the fp32 kernels
extern const ops::Backend bf16_fast_backend;  // bf16, fast mode: oneDNN bf16 or sgemm matmuls
}  // namespace px::cpu
