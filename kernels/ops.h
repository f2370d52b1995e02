// Ops on tensors: the only way to a kernel from outside kernels/. Each op checks shapes, then
// runs the kernel of the backend registered for its operands' device and dtype and the numerics
// mode (kernels/backend.h). A new backend (CUDA) or dtype (bf16) registers its kernels there;
// callers do not change.
//
// Index
//   Op, op_name, supports   the ops a backend may provide (kernels/op_list.h); whether one does
//                           for a device, dtype and mode
//   matmul_*                out = inp · weightᵀ + bias
//   gemm                    c = a · b on strided views (partial products over a slice of K)
//   layernorm_*, gelu_*, attention_*, residual_*, embedding_*, crossentropy_*
//   rmsnorm_*, swiglu_*     Llama's RMSNorm and gated MLP activation
//   RopeScaling, rope_inv_freq, rope_table, rope_*   rotary position embeddings: the
//                           frequencies, their cos/sin table (once), the rotation of q or k
//   attention_queries_*     a rank's query rows of attention (context parallelism)
//   row_max, exp_sub, row_sum   the pieces of a softmax whose rows are split between ranks
//   adamw_update, sum_squares, sum_squares_blocks
//   matmul_path             which kernel and hardware path a dtype's matmuls take (reports)
//   warm_up_matmul          the fast matmul's one-time setup, before the first step
//   fake_quant, fake_quant_tiles   fp8 casts read back to fp32 (vectorised, bit-exact)
//
// Shapes use the letters of core/base/shapes.h; leading dimensions are flattened into BT. Operands
// are contiguous unless an op says otherwise and share a device. Each plays a role (activation,
// weight, weight gradient, fp32 sum, optimizer state: kernels/backend.h): the activations' dtype
// picks the backend, and the backend says the dtype of every other role. So bf16 activations
// keep fp32 LayerNorm statistics, losses and weight gradients without a caller changing.
// Semantics (activations assign, gradients accumulate) are those of kernels/cpu/cpu_kernels.h;
// a backward's optional outputs are pointers, and a null one is not computed.
//
// Adding an op:
//   1. its kernel: kernels/cpu/<op>.cpp, declared in kernels/cpu/cpu_kernels.h;
//   2. its lines in kernels/op_list.h: the op and the activation dtypes it serves, and one entry
//      per direction with its signature;
//   3. its public function here (the entry's signature, checked) and its shape checks in ops.cpp;
//   4. each serving backend's function of that name (kernels/cpu/backend.cpp adapts the fp32
//      kernel, kernels/cpu/bf16_backend.cpp the 16-bit ones: the build stops until each has it);
//   5. its fp64 reference, struct and one line in op_table() of the gradient check
//      (validators/gradcheck_math.h, validators/gradcheck_ops.cpp).
#pragma once
#include "core/base/numerics.h"
#include "core/base/tensor.h"

#include <string>
#include <vector>

namespace px::ops {

// The ops, in the order of kernels/op_list.h.
enum class Op : std::uint8_t {
#define PX_OP(op, acts) op,
#include "kernels/op_list.h"
    kCount
};
const char* op_name(Op op);
// Whether a backend has op for activations of this dtype on this device in this numerics mode.
bool supports(Op op, Device device, DType dtype, Mode mode = Mode::bitwise);

// out (BT,OC), inp (BT,C), weight (OC,C), bias (OC) or null
void matmul_forward(const Numerics& nx, const Tensor& out, const Tensor& inp, const Tensor& weight,
                    const Tensor* bias);
void matmul_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                     const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight);

// c (M,N) fp32 sums = a (M,K) activations · b (K,N) weights, or c += when accumulate. a and b may
// have any strides (a column slice, a transpose); c's rows are contiguous. In bitwise mode each
// c[i][j] is the canonical tree over the K given, so a slice of K that is one node of a longer
// tree computes that node.
void gemm(const Numerics& nx, const Tensor& c, const Tensor& a, const Tensor& b, bool accumulate);

// LayerNorm's epsilon (GPT-2's layer_norm_epsilon; a Hugging Face config.json must agree).
inline constexpr float kLayerNormEps = 1e-5f;
// out (BT,C), mean (BT), rstd (BT), inp (BT,C), weight (C), bias (C)
void layernorm_forward(const Numerics& nx, const Tensor& out, const Tensor& mean,
                       const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias);
void layernorm_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                        const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd);
inline void layernorm_backward(const Numerics& nx, const Tensor& dinp, const Tensor& dweight,
                               const Tensor& dbias, const Tensor& dout, const Tensor& inp,
                               const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
    layernorm_backward(nx, &dinp, &dweight, &dbias, dout, inp, weight, mean, rstd);
}

// out (BT,C), rstd (BT), inp (BT,C), weight (C): out = x·rstd·weight, rstd = 1/sqrt(mean(x²) + eps)
// (no mean subtraction, no bias; eps is the model's norm_eps). rstd is an fp32 sum (role acc) for
// every activation dtype. In bitwise mode Σx² is the canonical tree over C, and the backward's
// dweight the canonical tree over the call's BT tokens (a caller that splits a batch calls it on
// each token node's rows, as for layernorm_backward); dinp per row. A 4-D inp (B,T,G,C) is G rows
// per token (Qwen3's qk_norm: a token's heads, normalised each, one weight (C) for all; rstd
// (B,T,G)): the weight gradient adds a token's G rows in order, then the token tree over B·T.
void rmsnorm_forward(const Numerics& nx, const Tensor& out, const Tensor& rstd, const Tensor& inp,
                     const Tensor& weight, float eps);
void rmsnorm_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                      const Tensor& dout, const Tensor& inp, const Tensor& weight,
                      const Tensor& rstd);
inline void rmsnorm_backward(const Numerics& nx, const Tensor& dinp, const Tensor& dweight,
                             const Tensor& dout, const Tensor& inp, const Tensor& weight,
                             const Tensor& rstd) {
    rmsnorm_backward(nx, &dinp, &dweight, dout, inp, weight, rstd);
}

// out (N), inp (N)
void gelu_forward(const Numerics& nx, const Tensor& out, const Tensor& inp);
void gelu_backward(const Numerics& nx, const Tensor& dinp, const Tensor& inp, const Tensor& dout);

// SwiGLU: out (BT,F) = silu(gate)·up, silu(g) = g·sigmoid(g) (mathfun's exp). gate and up are
// (BT,F) each: two tensors, or column slices of one matmul's (BT,2F) output [gate | up] (gate its
// columns [0, F), up [F, 2F)). Every operand's rows are contiguous and may be apart (a column
// slice); gate and up have one row stride, dgate and dup one. out may alias gate or up.
// Backward: dgate += dout·up·silu'(gate), dup += dout·silu(gate) (gradients accumulate).
void swiglu_forward(const Numerics& nx, const Tensor& out, const Tensor& gate, const Tensor& up);
void swiglu_backward(const Numerics& nx, const Tensor& dgate, const Tensor& dup, const Tensor& gate,
                     const Tensor& up, const Tensor& dout);

// Rotary position embeddings, Hugging Face's LlamaForCausalLM convention ("rotate_half"): the HS
// channels of a head are HS/2 pairs (i, i + HS/2) (not Meta's interleaved (2i, 2i + 1)), and pair
// i of the token at position p turns by p·inv_freq[i], inv_freq[i] = theta^(-2i/HS), optionally
// scaled as Llama 3.1 does:
//   out[i] = x[i]·cos - x[i + HS/2]·sin,  out[i + HS/2] = x[i + HS/2]·cos + x[i]·sin.
// Llama 3.1's frequency scaling (Hugging Face's rope_type "llama3"): wavelengths 2π/inv_freq above
// original_max_position_embeddings / low_freq_factor are slowed by factor, those below
// original_max_position_embeddings / high_freq_factor kept, those between interpolated. factor 0:
// no scaling (plain RoPE).
struct RopeScaling {
    double factor = 0, low_freq_factor = 1, high_freq_factor = 4;
    double original_max_position_embeddings = 8192;
};
// inv_freq (HS/2), computed in fp64 from IEEE operations only (the same bits on every machine) and
// rounded once; Hugging Face's fp32 pow may differ by an ulp. Throws px::Error for an odd HS, a
// theta that is not positive and finite, or scaling that is not factor > 0, 0 < low < high,
// original > 0.
std::vector<float> rope_inv_freq(i64 HS, double theta, const RopeScaling& scaling = {});
// The table, once per model: cos, sin (maxT, HS/2), fp32 (role acc, whatever the activations):
// cos and sin (core/base/mathfun.h) of the fp32 angle float(p)·inv_freq[i] for p in [0, maxT).
// Throws px::Error when an angle leaves sin/cos's domain, |x| <= 2^20 (about a million positions).
void rope_table(const Numerics& nx, const Tensor& cos, const Tensor& sin, double theta,
                const RopeScaling& scaling = {});
// out (B,T,NH,HS) = inp (B,T,NH,HS) rotated; cos, sin the table (maxT, HS/2); pos (T): the logical
// position of each of the T rows, the same for every sequence of the batch (a context-parallel
// rank's zig-zag chunks: pos ascending, not 0..T-1; null: 0..T-1), each below maxT (px::Error
// otherwise). A token's NH·HS channels are contiguous, tokens may be apart (a column slice of a
// fused qkv: strides (T·ld, ld, HS, 1)); out may alias inp (in place).
void rope_forward(const Numerics& nx, const Tensor& out, const Tensor& inp, const Tensor& cos,
                  const Tensor& sin, const i64* pos);
// dinp (B,T,NH,HS) += the inverse rotation of dout (B,T,NH,HS) (gradients accumulate).
void rope_backward(const Numerics& nx, const Tensor& dinp, const Tensor& dout, const Tensor& cos,
                   const Tensor& sin, const i64* pos);

// out (B,T,C), att (B,NH,T,T), qkv (B,T,3C); preatt is scratch the size of att
void attention_forward(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                       const Tensor& att, const Tensor& qkv, i64 NH);
void attention_backward(const Numerics& nx, const Tensor& dqkv, const Tensor& dpreatt,
                        const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                        const Tensor& att, i64 NH);

// Context parallelism (core/parallel/context/context_parallel.h): the query rows a rank holds, at
// logical positions pos (Tq, ascending), against the whole sequence's keys and values, in two
// phases. Each row gets the bits attention_forward gives the row at its position.
// Scores of keys [key_lo, key_hi) (they may arrive a range at a time): preatt (B,NH,Tq,T) columns
// of those keys below each row's position; q (B,Tq,3C) (q third read), kv (B,T,3C) (those k read)
void attention_queries_scores(const Numerics& nx, const Tensor& preatt, const Tensor& q,
                              const Tensor& kv, const i64* pos, i64 key_lo, i64 key_hi, i64 NH);
// Once every score is in: out (B,Tq,C), att (B,NH,Tq,T), preatt's masked part zeroed; kv's v read
void attention_queries_softmax(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                               const Tensor& att, const Tensor& kv, const i64* pos, i64 NH);
// dq (B,Tq,3C) += (q third only); dpreatt, datt (B,NH,Tq,T) scratch; parts (B,NH,T,K,2,HS)
// assigned: per key j and per node k (query blocks [node_lo[k], node_hi[k]) of the tree over
// T's blocks, held by this rank) the node's value of Σ_t dpreatt[t][j]·q_t and Σ_t att[t][j]·dout_t
// over its queries t >= j (-0 when it has none). Combined over every rank's nodes in the tree,
// the first is dk_j / scale and the second dv_j, bit for bit attention_backward's.
void attention_queries_backward(const Numerics& nx, const Tensor& dq, const Tensor& parts,
                                const Tensor& dpreatt, const Tensor& datt, const Tensor& dout,
                                const Tensor& q, const Tensor& kv, const Tensor& att,
                                const i64* pos, const i64* node_lo, const i64* node_hi, i64 K,
                                i64 NH);

// out, a, b (N)
void residual_forward(const Numerics& nx, const Tensor& out, const Tensor& a, const Tensor& b);
void residual_backward(const Numerics& nx, const Tensor& da, const Tensor& db, const Tensor& dout);

// out (B,T,C), tokens (B,T) int32 as a raw pointer, wte (V,C), wpe (>=T,C); a wpe without data
// (Tensor{}): no position embedding, out is the wte rows (Llama)
void embedding_forward(const Numerics& nx, const Tensor& out, const int* tokens, const Tensor& wte,
                       const Tensor& wpe);
// Backward over the flat tokens [row_lo, row_hi) of dout only (row_hi < 0: to the end), their
// blocks counted from row_lo: one node of a longer batch's tree; positions stay (b·T + t) mod T.
void embedding_backward(const Numerics& nx, const Tensor* dwte, const Tensor* dwpe,
                        const Tensor& dout, const int* tokens, i64 row_lo = 0, i64 row_hi = -1);
inline void embedding_backward(const Numerics& nx, const Tensor& dwte, const Tensor& dwpe,
                               const Tensor& dout, const int* tokens) {
    embedding_backward(nx, &dwte, &dwpe, dout, tokens);
}

// losses (BT), probs (BT,V), logits (BT,V); probs may alias logits
void crossentropy_forward(const Numerics& nx, const Tensor& losses, const Tensor& probs,
                          const Tensor& logits, const int* targets);
void crossentropy_backward(const Numerics& nx, const Tensor& dlogits, const Tensor& probs,
                           const int* targets, float dloss);

// out (BT), x (BT,N): the largest element of each row (exact in any order), NaN when the row
// holds one, -inf when N = 0.
void row_max(const Numerics& nx, const Tensor& out, const Tensor& x);
// out (BT,N) = exp(x (BT,N) - shift (BT)) row by row: a softmax's numerators; out may alias x.
void exp_sub(const Numerics& nx, const Tensor& out, const Tensor& x, const Tensor& shift);
// out (BT), x (BT,N) whose rows may be strided (a column slice): the sum of each row, in
// bitwise mode the canonical tree over blocks of nx.block from the row's first element.
void row_sum(const Numerics& nx, const Tensor& out, const Tensor& x);

struct AdamWStep {
    float lr, beta1, beta2, eps, weight_decay, grad_scale;
    int t;  // 1-based step, for bias correction
};
// param, m, v, grad (N)
void adamw_update(const Numerics& nx, const Tensor& param, const Tensor& m, const Tensor& v,
                  const Tensor& grad, const AdamWStep& s);
// Σ x² over x (N), the canonical tree in bitwise mode.
float sum_squares(const Numerics& nx, const Tensor& x);
// part (num_blocks(N, nx.block)), x (N): the in-block half of sum_squares, one sum per block. A
// sharded tensor's owners exchange these and form the same tree (tree_sum).
void sum_squares_blocks(const Numerics& nx, const Tensor& part, const Tensor& x);

// Which kernel runs the matmuls of activations of this dtype in nx's mode, and on which hardware
// path, for start-up output and benchmarks: "oneDNN sgemm", "canonical GEMM, avx512 microkernel",
// "oneDNN avx512_core_amx (brg:avx512_core_amx_bf16; cpuid: amx_bf16 avx512_bf16)", "fp32 sgemm
// on bf16 values (...)". Empty when no backend is registered for them.
std::string matmul_path(const Numerics& nx, Device device, DType dtype);
// Once per process: an fp32 matmul forward and backward in fast mode on small operands, so that
// the fast path's one-time setup (oneDNN generating its sgemm code) is paid when a model is made,
// not inside its first step. Nothing in bitwise mode, whose kernels have no such setup.
void warm_up_matmul(const Numerics& nx);

// FP8 casts read back to fp32 (core/model/fp8.h), on the CPU (nx.isa picks the vector path; every
// path gives the bits of core/base/dtype.h's scalar casts).
// dst (src.numel() floats) = decode(t(x·scale))·inv for each value x of src (contiguous, fp32 or
// bf16), t = e4m3 or e5m2, saturating. Returns max |x| over the values that are not NaN; *nan:
// whether src holds a NaN.
float fake_quant(const Numerics& nx, float* dst, const Tensor& src, DType t, float scale, float inv,
                 bool* nan);
// Block-wise current scaling: src viewed as (R,K) (K its last dimension) is cut into tiles of
// `band` rows by b columns, and each tile is cast to e4m3 with its own scale 448 / amax(tile) (1
// for a tile whose amax is 0 or that holds an inf or a NaN) and read back into dst.
void fake_quant_tiles(const Numerics& nx, float* dst, const Tensor& src, i64 band, i64 b);

}  // namespace px::ops
