// Tensor parallelism (docs/layouts.md): Megatron-LM's column- and row-parallel linears, the
// vocabulary-parallel embedding and cross-entropy, and sequence parallelism (SP), every one
// bit-identical to the single-device kernels in Mode::bitwise.
//
// Index
//   DimSplit, make_split          one logical dimension cut over the tp ranks, in whole blocks
//   block_edges                   contiguous cut points at block multiples (vocabulary, SP tokens)
//   TpShards, make_tp_shards      the splits of a GPT-2 model: qkv rows, head channels, ffn, vocab
//   token_split                   the SP token slices of a batch
//   -- math: what one rank computes, no communication --
//   num_partials                  how many node partials a rank produces for a split
//   column_dinp_partials          node partials of dinp = Σ_o dout[:,o]·W[o,:] over this rank's OC
//   row_out_partials              node partials of out = Σ_k inp[:,k]·W[:,k] over this rank's K
//   logit_sum_partials            node partials of Σ_v exp(l_v - max) over this rank's vocabulary
//   layernorm_param_partials      node partials of the LayerNorm weight/bias gradients (tokens)
//   -- communication: partials to sums --
//   reduce_partials               every rank gets the sum (canonical tree / fast: ring all-reduce)
//   reduce_scatter_partials       rank r gets its slice of that sum
//   -- layers --
//   column_parallel_forward/backward     Y = X Wᵀ + b, W split by output rows
//   row_parallel_forward/backward        Y = X Wᵀ + b, W split by input columns
//   vocab_embedding_forward/backward     out = wte[tok] + wpe[t], wte split by vocabulary rows
//   vocab_crossentropy_forward/backward  softmax cross-entropy, logits split by vocabulary
//   sp_all_gather, row_parallel_forward_sp, column_parallel_backward_sp, sp_layernorm_backward
//
// Why exact. A single-device reduction over a dimension (K of a matmul, the vocabulary of a
// softmax, the tokens of a weight gradient) is the canonical tree over its blocks
// (core/base/numerics.h). A split cuts that dimension in whole blocks, so every block has one owner;
// the owner computes the maximal tree nodes inside its ranges with the ordinary kernels (a node's
// subtree is the tree over its own blocks) and core/parallel/tree_exchange.h forms the upper nodes
// in the tree's order. Outputs that are not reductions (a column-parallel output column, an
// attention head, a row of dW) are computed by the same kernel on fewer rows or columns, which
// cannot change their bits (kernels split outputs, never a reduction).
//
// Shard widths must be whole blocks: a block split between ranks would cut a sequential fma chain,
// which only a serial hand-over of the running sum could keep exact. Hence tp must make C/tp and
// F/tp multiples of numerics.block (GPT-2 124M, block 64: tp = 1, 2, 3, 4, 6, 12); make_split and
// make_tp_shards throw ConfigError otherwise. The vocabulary and the SP token slices are cut at
// block multiples by construction (block_edges); only the last piece may end mid-block.
//
// Layout of a rank's pieces. A rank stores its ranges of a split back to back, in ascending
// order: column-parallel weight_r (OC_r, C) holds W's rows of the ranges, and out_r (BT, OC_r)
// those columns; row-parallel weight_r (OC, K_r) holds W's columns of the ranges, contiguous, and
// inp_r (BT, K_r) those columns of X. For qkv (3C, C) rank r holds the rows of its heads in q, k
// and v: three ranges, so its qkv_r (B,T,3·C/tp) is q|k|v of heads [r·NH/tp, (r+1)·NH/tp), exactly
// what attention_forward expects for NH/tp heads of C/tp channels.
//
// Rules. Every function here that takes the tp group is a collective of that group: every rank
// calls it with the same split, sizes and null-ness of optional outputs. Gradients accumulate and
// activations assign, as in kernels/cpu/cpu_kernels.h. Mode::fast uses one local partial per rank
// and the ring all-reduce (Megatron's order): close to, not equal to, the single device.
#pragma once
#include "core/comm/comm.h"
#include "core/base/numerics.h"
#include "core/parallel/tree_exchange.h"

#include <span>
#include <string>
#include <vector>

namespace px::tp {

// ---- splits ----------------------------------------------------------------------------------

// One logical dimension of n elements over the ranks of a tp group.
struct DimSplit {
    std::string name;                        // for messages: "qkv rows", "vocabulary", ...
    i64 n = 0;                               // logical extent
    int block = 0;                           // numerics.block: the tree is over num_blocks(n)
    std::vector<std::vector<Range>> ranges;  // by rank: element ranges, ascending, stored locally
                                             // back to back; together they cover [0, n) once
    NodePlan plan;                           // each rank's maximal nodes of the tree

    int size() const { return static_cast<int>(ranges.size()); }
    i64 local(int r) const;                     // elements rank r stores
    i64 local_offset(int r, i64 e) const;       // where logical element e (rank r's) sits locally
    bool owns(int r, i64 e) const;              // whether logical element e is rank r's
    Range elements(const Range& blocks) const;  // [lo·block, min(n, hi·block))
};

// Validates (ranges inside [0, n), ascending, whole blocks, each element owned once) and builds
// the plan. Throws ConfigError naming the split, the rank and the range that fails.
DimSplit make_split(std::string name, i64 n, int block, std::vector<std::vector<Range>> ranges);

// p+1 cut points of [0, n) at multiples of block (the last is n), pieces as equal as whole blocks
// allow. For p = 2^k (and at least p blocks) the cuts are the tree's nodes at depth k, so each
// rank owns exactly one node and the exchange is a plain canonical all-reduce. Otherwise a cut may
// move by up to nb/(32p) blocks to where fewer tree nodes straddle it, so ranks hold fewer partials
// (GPT-2's 786 vocabulary blocks at tp = 3: at most 5 nodes per rank instead of 8). Ranks past the
// last block get empty pieces.
std::vector<i64> block_edges(i64 n, int block, int p);

// The tp splits of a GPT-2 model (hidden C, NH heads, ffn F, vocabulary V).
struct TpShards {
    int tp = 1;
    i64 C = 0, NH = 0, F = 0, V = 0;
    i64 HS = 0, KV = 0;   // head size, KV heads (Llama's grouped-query attention; GPT-2: C/NH, NH)
    i64 heads = 0;        // heads per rank, NH/tp
    DimSplit qkv;         // 3·NH·HS: rows of qkv.weight (3C, C) and .bias, columns of qkv (B,T,3C)
    DimSplit channels;    // NH·HS by heads: attention output channels, columns of attn.proj (C, C);
                          // Llama: rows of q_proj
    bool kv_split = true; // Llama: tp divides the KV heads (else every rank holds k_proj, v_proj)
    DimSplit kv;          // KV·HS by KV heads: rows of k_proj and v_proj (when kv_split)
    DimSplit ffn;         // F: rows of fc (F, C) and fc.bias, columns of fcproj (C, F)
    DimSplit vocabulary;  // V: rows of wte (V, C) (embedding and tied LM head), logits columns
};
// Throws ConfigError when tp does not divide NH and F, or C/tp or F/tp is not whole blocks.
// HS: the head size (0: C/NH), KV: the KV heads (0: NH); Llama's attention channels NH·HS and
// KV·HS are then split by heads, the KV heads only where tp divides them.
TpShards make_tp_shards(const Numerics& nx, i64 C, i64 NH, i64 F, i64 V, int tp, i64 HS = 0,
                        i64 KV = 0);

// SP: rank r holds tokens [e[r], e[r+1]) of the flat B·T token axis, e = block_edges(BT, ...).
DimSplit token_split(const Numerics& nx, i64 BT, int tp);

// ---- math: one rank's partials, no communication ----------------------------------------------

// Rows of partials a rank produces for split s: its node count (bitwise), or 1 (fast).
i64 num_partials(const Numerics& nx, const DimSplit& s, int rank);

// parts (k, BT, C): for each node of rank's OC blocks, Σ_{o in node} dout_r[:, o]·weight_r[o, :]
// in the canonical order (fast: one partial over all local rows).
// dout_r (BT, OC_r), weight_r (OC_r, C)
void column_dinp_partials(const Numerics& nx, float* parts, const float* dout_r,
                          const float* weight_r, const DimSplit& oc, int rank, i64 BT, i64 C);
// parts (k, BT, OC): for each node of rank's K blocks, Σ_{k in node} inp_r[:, k]·weight_r[:, k].
// inp_r (BT, K_r), weight_r (OC, K_r)
void row_out_partials(const Numerics& nx, float* parts, const float* inp_r, const float* weight_r,
                      const DimSplit& k, int rank, i64 BT, i64 OC);
// parts (k, BT): for each node of rank's vocabulary blocks, the canonical Σ of e_r's entries in it
// (block sums from +0 in index order, then the node's subtree), as crossentropy_forward's Σexp.
// e_r (BT, V_r)
void logit_sum_partials(const Numerics& nx, float* parts, const float* e_r, const DimSplit& vocab,
                        int rank, i64 BT);
// parts (k, 2C): for each node of rank's token blocks, [Σ norm·dout | Σ dout] over its tokens in
// layernorm_backward's order. Token slices (BT_r rows, the rank's tokens): dout_r, inp_r (BT_r,C),
// mean_r, rstd_r (BT_r); weight (C).
void layernorm_param_partials(const Numerics& nx, float* parts, const float* dout_r,
                              const float* inp_r, const float* weight, const float* mean_r,
                              const float* rstd_r, const DimSplit& tokens, int rank, i64 C);

// ---- communication: partials to sums -----------------------------------------------------------

// out (w) = the sum over every rank's partials parts (num_partials, w): bitwise, the canonical
// tree of split s (exchange_and_combine); fast, the ring all-reduce of the one partial.
void reduce_partials(comm::Communicator& tp, const Numerics& nx, const DimSplit& s,
                     const float* parts, i64 w, float* out);
// out (edges[r+1] - edges[r]) = that slice of reduce_partials' out on rank r.
void reduce_scatter_partials(comm::Communicator& tp, const Numerics& nx, const DimSplit& s,
                             const float* parts, i64 w, std::span<const i64> edges, float* out);

// ---- column-parallel linear --------------------------------------------------------------------

// Y = X Wᵀ + b, W = [W_0; …; W_{p-1}] split by output rows (OC), b likewise.
// forward: Y_r = X W_rᵀ + b_r — identity on X, no communication.
// out_r (BT, OC_r); inp (BT, C); weight_r (OC_r, C); bias_r (OC_r) or null
void column_parallel_forward(comm::Communicator& tp, const Numerics& nx, float* out_r,
                             const float* inp, const float* weight_r, const float* bias_r,
                             const DimSplit& oc, i64 BT, i64 C);
// backward: dX = Σ_r dY_r W_r — a reduction over OC split across ranks: node partials, then the
// tree exchange (Megatron: all-reduce); dW_r = dY_rᵀ X and db_r = Σ_t dY_r are local.
// dinp (BT, C) +=, dweight_r (OC_r, C) +=, dbias_r (OC_r) += (null skipped); dout_r (BT, OC_r)
void column_parallel_backward(comm::Communicator& tp, const Numerics& nx, float* dinp,
                              float* dweight_r, float* dbias_r, const float* dout_r,
                              const float* inp, const float* weight_r, const DimSplit& oc, i64 BT,
                              i64 C);

// ---- row-parallel linear -----------------------------------------------------------------------

// Y = X Wᵀ + b, W = [W_0 … W_{p-1}] split by input columns (K), X = [X_0 … X_{p-1}] likewise.
// forward: Y = Σ_r X_r W_rᵀ + b — node partials of the K tree, the tree exchange (Megatron:
// all-reduce), then + b once, as matmul_forward adds it after the tree.
// out (BT, OC); inp_r (BT, K_r); weight_r (OC, K_r); bias (OC) or null (replicated)
void row_parallel_forward(comm::Communicator& tp, const Numerics& nx, float* out,
                          const float* inp_r, const float* weight_r, const float* bias,
                          const DimSplit& k, i64 BT, i64 OC);
// backward: dX_r = dY W_r and dW_r = dYᵀ X_r are local; db = Σ_t dY is the same on every rank
// (replicated; add it to the model's gradient once, not once per rank). No communication.
// dinp_r (BT, K_r) +=, dweight_r (OC, K_r) +=, dbias (OC) += (null skipped); dout (BT, OC)
void row_parallel_backward(comm::Communicator& tp, const Numerics& nx, float* dinp_r,
                           float* dweight_r, float* dbias, const float* dout, const float* inp_r,
                           const float* weight_r, const DimSplit& k, i64 BT, i64 OC);

// ---- vocabulary-parallel embedding -------------------------------------------------------------

// out[n] = wte[tok_n] + wpe[t], wte split by vocabulary rows. Rank r writes wte_r's row where it
// owns tok_n and -0 elsewhere; the all-reduce (any order) then yields wte[tok_n] exactly, because
// -0 is the additive identity (x + -0 == x, also for x = ±0; +0 would turn a -0 row into +0);
// + wpe[t] follows, as in embedding_forward. out (B,T,C); tokens (B,T); wte_r (V_r,C); wpe (>=T,C)
void vocab_embedding_forward(comm::Communicator& tp, const Numerics& nx, float* out,
                             const int* tokens, const float* wte_r, const float* wpe,
                             const DimSplit& vocab, i64 B, i64 T, i64 C);
// dwte_r[v] += Σ dout[n] over the tokens n with tok_n = v, for rank's rows only: the single
// device reduces each output row on its own (tree over the flat token index, empty blocks
// skipped), so restricting the rows is exact. dwpe (T,C) += Σ_b dout[b,t] on every rank
// (replicated), or null. No communication. dout (B,T,C); tokens (B,T). With a row range, over
// the flat tokens [row_lo, row_hi) only (row_hi < 0: all), as ops::embedding_backward's.
void vocab_embedding_backward(comm::Communicator& tp, const Numerics& nx, float* dwte_r,
                              float* dwpe, const float* dout, const int* tokens,
                              const DimSplit& vocab, i64 B, i64 T, i64 C, i64 row_lo = 0,
                              i64 row_hi = -1);

// ---- vocabulary-parallel cross-entropy ---------------------------------------------------------

// Per token row, logits l split by vocabulary: max = all_reduce_max of the local maxima (exact);
// e_r = exp(l_r - max); S = Σ_v e_v as the canonical tree over V (node partials + exchange);
// probs_r = e_r / S; loss = log S - (l[target] - max), with l[target] sent by its owner (-0
// elsewhere, summed exactly). losses are the same on every rank (replicated).
// losses (BT); probs_r (BT, V_r), may alias logits_r; logits_r (BT, V_r); targets (BT)
void vocab_crossentropy_forward(comm::Communicator& tp, const Numerics& nx, float* losses,
                                float* probs_r, const float* logits_r, const int* targets,
                                const DimSplit& vocab, i64 BT);
// dlogits_r = (probs_r - onehot(target)_r)·dloss, assigned (may alias probs_r). No communication.
// The LM head's backward follows as column_parallel_backward with oc = vocabulary, no bias:
// dX = Σ_r dlogits_r wte_r (reduction over V), dwte_head_r local.
void vocab_crossentropy_backward(comm::Communicator& tp, const Numerics& nx, float* dlogits_r,
                                 const float* probs_r, const int* targets, float dloss,
                                 const DimSplit& vocab, i64 BT);

// ---- sequence parallelism ----------------------------------------------------------------------
// Between a row-parallel output and the next column-parallel input (residual, LayerNorm, dropout)
// rank r holds only its tokens (token_split), (BT_r, C). Megatron's g / ḡ become all-gather
// (before a column-parallel matmul; its backward is a reduce-scatter) and reduce-scatter (after a
// row-parallel matmul; its backward is an all-gather). All per-token ops stay exact on a slice.

// out (BT, w) = every rank's rows in_r (BT_r, w), in token order; in_r may be out + lo_r·w.
void sp_all_gather(comm::Communicator& tp, float* out, const float* in_r, const DimSplit& tokens,
                   i64 w);
// row_parallel_forward restricted to this rank's tokens: out_r (BT_r, OC) is bit for bit rows
// [lo_r, hi_r) of row_parallel_forward's out (the tree exchange reduce-scattered by tokens).
void row_parallel_forward_sp(comm::Communicator& tp, const Numerics& nx, float* out_r,
                             const float* inp_r, const float* weight_r, const float* bias,
                             const DimSplit& k, const DimSplit& tokens, i64 BT, i64 OC);
// column_parallel_backward whose dX is reduce-scattered by tokens: dinp_r (BT_r, C) += rows
// [lo_r, hi_r) of dX. inp (BT, C) is the gathered input of the forward.
void column_parallel_backward_sp(comm::Communicator& tp, const Numerics& nx, float* dinp_r,
                                 float* dweight_r, float* dbias_r, const float* dout_r,
                                 const float* inp, const float* weight_r, const DimSplit& oc,
                                 const DimSplit& tokens, i64 BT, i64 C);
// LayerNorm backward on a token slice (mean_r null: Llama's RMSNorm, no dbias): dinp_r is per
// token (local, exact); dweight and dbias
// (C) += the token reductions over the whole batch: token-node partials + tree exchange, so every
// rank gets the single device's bits (replicated). dout_r, inp_r, dinp_r (BT_r, C); mean_r, rstd_r
// (BT_r); weight (C)
void sp_layernorm_backward(comm::Communicator& tp, const Numerics& nx, float* dinp_r,
                           float* dweight, float* dbias, const float* dout_r, const float* inp_r,
                           const float* weight, const float* mean_r, const float* rstd_r,
                           const DimSplit& tokens, i64 C);

}  // namespace px::tp
