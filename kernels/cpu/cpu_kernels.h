// CPU kernels, fp32. One op per file, forward and backward (llm.c layout).
//
// Index
//   matmul       out = inp · weightᵀ + bias            (matmul.cpp, matmul_avx*.cpp, matmul_fast.cpp)
//   gemm         the canonical GEMM under matmul        (matmul.cpp)
//   layernorm    pre-norm LayerNorm, eps 1e-5           (layernorm.cpp)
//   rmsnorm      RMSNorm, eps given (Llama)             (rmsnorm.cpp)
//   gelu         GELU, tanh approximation               (gelu.cpp)
//   swiglu       silu(gate)·up (Llama's MLP)            (swiglu.cpp)
//   rope         rotary position embeddings, their table (rope.cpp)
//   attention    causal multi-head attention, and its query rows (attention.cpp)
//   residual     out = a + b                            (residual.cpp)
//   embedding    token + learned position embeddings    (embedding.cpp)
//   crossentropy softmax cross-entropy per token        (crossentropy.cpp)
//   rows         a split softmax's row max, exp, sums   (rows.cpp)
//   adamw        AdamW step, sum of squares             (adamw.cpp)
//
// kernels/ops.h reaches these through the CPU fp32 backend (backend.cpp).
//
// Rules for every kernel here:
//   * Argument order: numerics, outputs, saved statistics, inputs, weights, sizes.
//   * Activations assign. Gradients accumulate: every d-output is added into (+=) what the caller
//     left there, and a reduced value is formed completely (canonical tree) before it is added.
//     The one exception is crossentropy_backward, which starts the chain and assigns dlogits.
//   * In Mode::bitwise every reduction follows the canonical order of core/base/numerics.h, so the
//     result does not depend on the thread count, the ISA path, or where a vector ends: threads
//     split outputs, never a reduction.
//   * Parallel loops hand their tasks to whichever thread is free (schedule(dynamic)): on a
//     shared host the thread whose core is also running another process takes fewer, instead of
//     every other thread waiting for it. Which thread runs a task changes no bit.
//   * Token reductions (weight gradients) run over the kernel's own BT rows as the tree over
//     [0, BT). A caller that splits a batch (microbatches, data parallelism) hands each kernel a
//     row range that is one node of the global tree, so the local tree is that node's subtree.
//   * exp, log, tanh, sin and cos come from core/base/mathfun.h, never from libm, on every path.
#pragma once
#include "core/base/numerics.h"

namespace px::cpu {

// out (BT,OC), inp (BT,C), weight (OC,C), bias (OC) or null.
// out[m][o] = tree_k(inp[m][k]·weight[o][k]) + bias[o]
void matmul_forward(const Numerics& nx, float* out, const float* inp, const float* weight,
                    const float* bias, i64 BT, i64 C, i64 OC);
// dinp (BT,C) += dout·weight (reduction over OC); dweight (OC,C) += doutᵀ·inp and
// dbias (OC) += Σ dout (reductions over the BT tokens). Null outputs are skipped.
void matmul_backward(const Numerics& nx, float* dinp, float* dweight, float* dbias,
                     const float* dout, const float* inp, const float* weight, i64 BT, i64 C, i64 OC);

// Row-major GEMM: c (M,N) = a (M,K) · b (K,N), or c += when accumulate. Element (i,j) of a is
// a[i*rsa + j*csa] (so transposes are strides), likewise b; c has leading dimension ldc.
// In bitwise mode each c[i][j] is the canonical tree over K of fma block sums.
void gemm(const Numerics& nx, float* c, i64 ldc, const float* a, i64 rsa, i64 csa, const float* b,
          i64 rsb, i64 csb, i64 M, i64 N, i64 K, bool accumulate);

// out (BT,C), mean (BT), rstd (BT); inp (BT,C), weight (C), bias (C)
void layernorm_forward(const Numerics& nx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, i64 BT, i64 C);
void layernorm_backward(const Numerics& nx, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, i64 BT, i64 C);

// out (BT,C), rstd (BT); inp (BT,C), weight (C). out = (x·rstd)·weight, rstd = 1/sqrt(Σx²/C + eps)
// with Σx² the canonical tree over C (any order in Mode::fast).
void rmsnorm_forward(const Numerics& nx, float* out, float* rstd, const float* inp,
                     const float* weight, i64 BT, i64 C, float eps);
// dinp (BT·G,C) += (reduction over C per row); dweight (C) += Σ_t norm·dout (reduction over the BT
// tokens in the canonical tree, a token's G rows in order first). Null outputs are skipped.
void rmsnorm_backward(const Numerics& nx, float* dinp, float* dweight, const float* dout,
                      const float* inp, const float* weight, const float* rstd, i64 BT, i64 C,
                      i64 G = 1);

// out (N), inp (N): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
void gelu_forward(const Numerics& nx, float* out, const float* inp, i64 N);
void gelu_backward(const Numerics& nx, float* dinp, const float* inp, const float* dout, i64 N);

// out (BT,F) = silu(gate)·up, rows ldo apart; gate, up (BT,F) rows ldi apart (two tensors, or the
// halves of one (BT,2F)). out may alias gate or up.
void swiglu_forward(const Numerics& nx, float* out, i64 ldo, const float* gate, const float* up,
                    i64 ldi, i64 BT, i64 F);
// dgate, dup (BT,F) += (rows ldd apart); gate, up rows ldi apart; dout (BT,F) rows ldo apart.
void swiglu_backward(const Numerics& nx, float* dgate, float* dup, i64 ldd, const float* gate,
                     const float* up, i64 ldi, const float* dout, i64 ldo, i64 BT, i64 F);

// inv_freq (HS/2) = theta^(-2j/HS), then Llama 3.1's scaling when factor > 0 (Hugging Face's
// rope_type "llama3"): in fp64 from IEEE operations only, rounded once.
void rope_inv_freq(float* inv_freq, i64 HS, double theta, double factor, double low_freq_factor,
                   double high_freq_factor, double original_max_position_embeddings);
// cos, sin (maxT, HS/2): of the fp32 angle float(p)·inv_freq[j], p in [0, maxT) (mathfun).
void rope_table(const Numerics& nx, float* cos, float* sin, const float* inv_freq, i64 maxT,
                i64 HS);
// out (B,T,NH,HS) = x rotated in pairs (i, i + HS/2) by the table's row pos[t] (t when pos is
// null); the rows of out and inp (NH·HS each) are ldo and ldi apart; out may alias inp. Throws
// px::Error for a position outside [0, maxT).
void rope_forward(const Numerics& nx, float* out, i64 ldo, const float* inp, i64 ldi,
                  const float* cos, const float* sin, const i64* pos, i64 B, i64 T, i64 NH, i64 HS,
                  i64 maxT);
// dinp (B,T,NH,HS) += the inverse rotation of dout; rows ldd and ldo apart.
void rope_backward(const Numerics& nx, float* dinp, i64 ldd, const float* dout, i64 ldo,
                   const float* cos, const float* sin, const i64* pos, i64 B, i64 T, i64 NH, i64 HS,
                   i64 maxT);

// out (B,T,C); preatt, att (B,NH,T,T) saved; qkv (B,T,3C) holding q, k, v side by side.
// Causal: query t sees keys 0..t. Softmax: max (exact), Σ exp over key blocks of T in the
// canonical tree (masked keys skipped), att = e / Σ. out = tree over keys of att·v.
void attention_forward(const Numerics& nx, float* out, float* preatt, float* att, const float* qkv,
                       i64 B, i64 T, i64 C, i64 NH);
// dqkv (B,T,3C) +=; dpreatt, datt (B,NH,T,T) are scratch (assigned).
void attention_backward(const Numerics& nx, float* dqkv, float* dpreatt, float* datt,
                        const float* dout, const float* qkv, const float* att, i64 B, i64 T, i64 C,
                        i64 NH);

// Context parallelism: the Tq query rows at logical positions pos (ascending) of each sequence,
// against every key and value of it, in two phases. Scores: preatt (B,NH,Tq,T) columns
// [key_lo, key_hi) of each row (those below the row's position), from q (B,Tq,3C) (its q third)
// and those keys of kv (B,T,3C): the keys may arrive range by range. Softmax, once every score is
// in: att (B,NH,Tq,T) saved and out (B,Tq,C) = P·V with kv's v. Each row's bits are those the
// whole-sequence kernel gives the row at its position.
void attention_scores_queries(const Numerics& nx, float* preatt, const float* q, const float* kv,
                              const i64* pos, i64 key_lo, i64 key_hi, i64 B, i64 Tq, i64 T, i64 C,
                              i64 NH);
void attention_softmax_queries(const Numerics& nx, float* out, float* preatt, float* att,
                               const float* kv, const i64* pos, i64 B, i64 Tq, i64 T, i64 C,
                               i64 NH);
// dq (B,Tq,3C) += its q third; dpreatt, datt (B,NH,Tq,T) scratch. parts (B,NH,T,K,2,HS) assigned:
// for every key j and each of the K nodes [node_lo[k], node_hi[k]) of the tree over the query
// blocks of T (nodes whose positions the rank holds), the node's value of Σ_t dpreatt[t][j]·q_t
// (before the scale) and of Σ_t att[t][j]·dout_t, over the node's queries t >= j; -0 when the node
// has none.
void attention_backward_queries(const Numerics& nx, float* dq, float* parts, float* dpreatt,
                                float* datt, const float* dout, const float* q, const float* kv,
                                const float* att, const i64* pos, const i64* node_lo,
                                const i64* node_hi, i64 K, i64 B, i64 Tq, i64 T, i64 C, i64 NH);

// out (N) = inp1 + inp2;  backward: dinp1 += dout, dinp2 += dout
void residual_forward(const Numerics& nx, float* out, const float* inp1, const float* inp2, i64 N);
void residual_backward(const Numerics& nx, float* dinp1, float* dinp2, const float* dout, i64 N);

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]; tokens (B,T), wte (V,C), wpe (>=T,C)
void embedding_forward(const Numerics& nx, float* out, const int* tokens, const float* wte,
                       const float* wpe, i64 B, i64 T, i64 C);
// dwte (V,C) += Σ over tokens with that id; dwpe (T,C) += Σ over the B tokens at that position.
// Both are reductions over the flat token index b*T+t in the canonical tree (empty nodes skipped);
// with a row range, over the flat tokens [row_lo, row_hi) only (row_hi < 0: to the end), its
// blocks counted from row_lo (one node of a longer tree).
void embedding_backward(const Numerics& nx, float* dwte, float* dwpe, const float* dout,
                        const int* tokens, i64 B, i64 T, i64 C, i64 V, i64 row_lo = 0,
                        i64 row_hi = -1);

// losses (BT), probs (BT,V) saved; logits (BT,V), targets (BT).
// loss = log Σ exp(l - max) - (l[target] - max), the sum in the canonical tree over V.
void crossentropy_forward(const Numerics& nx, float* losses, float* probs, const float* logits,
                          const int* targets, i64 BT, i64 V);
// dlogits (BT,V) = (probs - onehot(target))·dloss — assigned, may alias probs.
void crossentropy_backward(const Numerics& nx, float* dlogits, const float* probs,
                           const int* targets, float dloss, i64 BT, i64 V);

// out (BT) = max of each row of x (BT,N): exact in any order; NaN when the row holds one; -inf
// when N = 0.
void row_max(const Numerics& nx, float* out, const float* x, i64 BT, i64 N);
// out (BT,N) = exp(x (BT,N) - shift[row]), shift (BT); out may alias x.
void exp_sub(const Numerics& nx, float* out, const float* x, const float* shift, i64 BT, i64 N);
// out (BT) = Σ of each row of x (BT,N), row r at x + r·ldx: the canonical tree over blocks of
// nx.block in Mode::bitwise (reduce_sum of vecmath.h), any order in Mode::fast; +0 when N = 0.
void row_sum(const Numerics& nx, float* out, const float* x, i64 ldx, i64 BT, i64 N);

// param, m, v (N) updated in place from grad (N).
// g = grad·grad_scale; m = β1·m + (1-β1)·g; v = β2·v + (1-β2)·g²;
// param -= lr·( (m/bc1) / (sqrt(v/bc2) + eps) + wd·param ),  bc_i = 1 - β_iᵗ
void adamw_update(const Numerics& nx, float* param, float* m, float* v, const float* grad, i64 N,
                  float lr, float beta1, float beta2, float eps, float weight_decay, float grad_scale,
                  int t);

// Σ x² over x (N): canonical tree in bitwise mode (used by global-norm clipping).
float sum_squares(const Numerics& nx, const float* x, i64 N);
// part (num_blocks(N, nx.block)): the in-block half of sum_squares, part[j] = Σ fma(x, x, ·) over
// block j from +0. A sharded tensor's owners exchange these and form the same tree.
void sum_squares_blocks(const Numerics& nx, float* part, const float* x, i64 N);

}  // namespace px::cpu
