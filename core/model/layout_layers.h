// The layers a layout provides the model: the interfaces through which a parallel layout runs
// parts of the model's math over its ranks, and which the model (core/model/model.h GPT) calls
// without knowing the layout. Without them the model runs the plain kernels on one device. The
// layouts implement them in core/parallel.
//
// Index
//   Linear, TokenRows, ProbeSplit, ColumnShard   what ParallelLayers' calls name
//   ParallelLayers the layers a tensor-parallel layout distributes (absent: the plain kernels)
//   PositionRun, ContextLayers  context parallelism: where a rank's tokens sit in their sequence,
//                 and the attention over the whole sequence (absent: the rank holds it all)
//   Unit, UnitHooks the units a model runs its weights in, and what a layout may do around each
//   TokenNode     a node of the token tree that a microbatch covers, with its gradient buffer
//   ExpertLayers  expert parallelism: the ep group's routed rows to their experts' owners and back
#pragma once
#include "core/base/arena.h"
#include "core/base/dtype.h"
#include "core/base/numerics.h"
#include "core/base/tensor.h"
#include "core/model/probe.h"

#include "core/base/error.h"

#include <cstdint>
#include <span>
#include <vector>

namespace px {

// The linear layers of a block, for ParallelLayers: GPT-2's fused qkv, Llama's q and k or v
// (column parallel by query heads, and by KV heads where tp divides them, else whole on every
// rank), the attention's output projection, the MLP's input (GPT-2's c_fc, Llama's gate and up)
// and output projections.
enum class Linear : std::uint8_t { qkv, attn_proj, fc, fc_proj, q, kv };

// The layers whose math a layout distributes over ranks (core/parallel/tensor/tp_model.h implements
// them over a tensor-parallel group). The model only says which layer runs on which tensors; a
// GPT without ParallelLayers calls the plain kernels (kernels/ops.h). Tensors are the model's
// local ones (shapes from dims()); gradients accumulate, activations assign, as in the kernels.
// Token rows [lo, hi) of a microbatch's flat B·T token axis.
struct TokenRows {
    i64 lo = 0, hi = 0;
};

// How a probed activation (B,T,...) is spread over the ranks of ParallelLayers (GPT::probe).
enum class ProbeSplit : std::uint8_t {
    whole,       // every rank holds all of it
    tokens,      // sequence parallelism: token_rows(BT) only (whole without it)
    qkv,         // last dimension: the rank's q, k and v columns of its heads (of 3C)
    channels,    // last dimension: its heads' channels (of C)
    ffn,         // last dimension: its ffn channels (of F)
    vocabulary,  // last dimension: its vocabulary (of V)
};

// A rank's part of a split dimension of n elements: ranges of [0, n), ascending, stored locally
// back to back.
struct ColumnShard {
    i64 n = 0;
    std::vector<TokenRows> ranges;  // [lo, hi) of the dimension (not tokens here)
};

class ParallelLayers {
public:
    virtual ~ParallelLayers() = default;
    // Sequence parallelism: between a row-parallel output and the next column-parallel input this
    // rank holds only token_rows(BT) of the residual stream, and the model runs the LayerNorms and
    // residual adds on those rows alone; it then calls sp_gather before each column-parallel
    // linear (and, in backward, before each row-parallel one), and layernorm_backward for the
    // LayerNorms. The row-parallel linears' forward and the column-parallel ones' backward (and
    // head_backward's dlnf) then write only this rank's token rows of out / dinp. Tensors are
    // still the whole microbatch's (B,T,...) buffers; rows outside token_rows are not read.
    virtual bool sequence_parallel() const { return false; }
    virtual TokenRows token_rows(i64 BT) const { return {0, BT}; }
    // t (B,T,w) or (BT,w): every rank's token_rows -> all rows, in place (all-gather).
    virtual void sp_gather(const Tensor& /*t*/) const {}
    // Llama: local (B,T,H,HS), this rank's H heads of a head-split activation -> full
    // (B,T,tp·H,HS), every rank's heads in rank order (all-gather; bits moved, not added).
    virtual void gather_heads(const Tensor& /*full*/, const Tensor& /*local*/) const {
        PX_ASSERT(false, "gather_heads on parallel layers that do not split heads");
    }
    // As ops::layernorm_backward on token_rows only (full tensors given; a null output is not
    // computed); dweight and dbias get the token reductions over the microbatch's rows
    // [row_lo, row_hi) (one node of the batch's token tree; row_hi < 0: all rows), the same bits
    // on every rank. A mean without data (Tensor{}): Llama's RMSNorm (ops::rmsnorm_backward; no
    // dbias).
    virtual void layernorm_backward(const Tensor* /*dinp*/, const Tensor* /*dweight*/,
                                    const Tensor* /*dbias*/, const Tensor& /*dout*/,
                                    const Tensor& /*inp*/, const Tensor& /*weight*/,
                                    const Tensor& /*mean*/, const Tensor& /*rstd*/,
                                    i64 /*row_lo*/, i64 /*row_hi*/) const {}
    virtual TpDims dims() const = 0;  // local sizes of parameters and activations
    // Whether these layers take activations of dtype t (the model refuses a precision its layers
    // do not carry, before it allocates).
    virtual bool carries(DType /*t*/) const { return true; }
    virtual int rank() const { return 0; }  // in the group that shares the layers
    // Probes: this rank's part of the last dimension of an activation split by s (qkv, channels,
    // ffn, vocabulary), and where a parameter's local elements sit in its logical tensor (the
    // logical shape (rows, cols), or (cols) for a vector, and the local tensor's pieces).
    virtual ColumnShard probe_columns(ProbeSplit s) const = 0;
    virtual ShardSpec param_shard(const TableEntry& e) const = 0;
    // p (e's local elements) = this model's slice of e's initialisation N(0, std) (core/base/rng.h).
    virtual void fill_normal(float* p, const TableEntry& e, float std,
                             std::uint64_t seed) const = 0;
    // out = inp·weightᵀ + bias, as ops::matmul_forward / matmul_backward in nx (the model's
    // numerics, or an fp8 linear's: Numerics::fp8_promote) (a null output is not computed: the
    // weight gradients of a microbatch's token nodes are taken one node at a time, over its
    // rows, after dinp over all of them).
    virtual void linear_forward(const Numerics& nx, Linear l, const Tensor& out, const Tensor& inp,
                                const Tensor& weight, const Tensor* bias) const = 0;
    virtual void linear_backward(const Numerics& nx, Linear l, const Tensor* dinp,
                                 const Tensor* dweight, const Tensor* dbias, const Tensor& dout,
                                 const Tensor& inp, const Tensor& weight) const = 0;
    // As ops::embedding_forward / embedding_backward (the backward over the flat tokens
    // [row_lo, row_hi) of dout only, row_hi < 0: all).
    virtual void embedding_forward(const Tensor& out, const int* tokens, const Tensor& wte,
                                   const Tensor& wpe) const = 0;
    virtual void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                    const int* tokens, i64 row_lo, i64 row_hi) const = 0;
    // The LM head tied to wte: logits = lnf·wteᵀ into probs. The loss: softmax of the logits in
    // place and the per-token losses. Backward: probs (the softmax) become dlogits, then
    // dlnf +=, dwte_head += from them.
    virtual void head_logits(const Tensor& probs, const Tensor& lnf, const Tensor& wte) const = 0;
    virtual void head_loss(const Tensor& losses, const Tensor& probs,
                           const int* targets) const = 0;
    virtual void head_dlogits(const Tensor& probs, const int* targets, float dloss) const = 0;
    virtual void head_dinp(const Tensor* dlnf, const Tensor* dwte_head, const Tensor& probs,
                           const Tensor& lnf, const Tensor& wte) const = 0;
};

// Local token rows [lo, hi) of every sequence a rank holds sit at logical positions
// [pos, pos + hi - lo) of it.
struct PositionRun {
    i64 lo = 0, hi = 0, pos = 0;
};

// Context parallelism (core/parallel/context/context_parallel.h): a rank holds only some tokens of
// each sequence (T of them, in runs of consecutive logical positions), and its attention reads the
// keys and values of the whole sequence (keys(T) tokens) through these layers. Everything else of
// the model is per token and runs on the rank's rows as on any rows; the embedding takes its
// positions from runs(), and a token node of the backward (TokenNode) lies inside one run.
class ContextLayers {
public:
    virtual ~ContextLayers() = default;
    virtual i64 keys(i64 T) const = 0;                       // the sequence's tokens
    virtual std::vector<PositionRun> runs(i64 T) const = 0;  // ascending local rows, covering T
    // As ops::attention_forward / attention_backward on the rank's rows: out (B,T,C), qkv
    // (B,T,3C), preatt and att (B,NH,T,keys) and dpreatt, datt scratch of that size; the same
    // bits as the single device's rows.
    virtual void attention_forward(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                                   const Tensor& att, const Tensor& qkv, i64 NH) const = 0;
    virtual void attention_backward(const Numerics& nx, const Tensor& dqkv,
                                    const Tensor& dpreatt, const Tensor& datt, const Tensor& dout,
                                    const Tensor& qkv, const Tensor& att, i64 NH) const = 0;
    // The largest causal logit in preatt as attention_forward left it (this rank's part).
    virtual float logit_max(const Numerics& nx, const Tensor& preatt, i64 NH) const = 0;
};

// The units a model uses its weights in, in forward order: the embedding (wte, wpe), each block,
// the head (ln_f, and wte again: the LM head is tied to it).
struct Unit {
    enum Kind : std::uint8_t { embedding, block, head } kind = block;
    int layer = -1;  // blocks only
};

// Told when a unit's weights are about to be read and when they no longer are, and when a unit's
// gradients are about to be written and when they are complete for this microbatch. The model
// calls these around every unit of a chunk's forward and backward (the embedding's backward reads
// no weights but writes gradients). A layout uses them to hold weights and gradients only while
// they are needed: ZeRO-3 gathers a unit's weights before use and frees them after, ZeRO-2
// reduce-scatters a unit's gradients as soon as they are complete (core/parallel/data/zero.h). The
// model knows nothing of what they do; without hooks nothing happens.
class UnitHooks {
public:
    virtual ~UnitHooks() = default;
    virtual void before_forward(Unit u) = 0;
    virtual void after_forward(Unit u) = 0;
    virtual void before_backward(Unit u, float* grads) = 0;
    virtual void after_backward(Unit u, float* grads) = 0;
};

// One node of the batch's token tree that a microbatch's rows cover: token rows [lo, hi) of the
// microbatch (B·T rows), whose weight gradients go to their own GradLayout buffer `grads`. A
// microbatch whose tokens are one node has one; one whose range is not a node of the tree (a dp
// rank's or microbatch's range cut at a point the tree does not split at; a node of n blocks
// splits at ceil(n/2)) has its maximal nodes, and the caller combines their gradients in the tree
// (core/parallel/data/token_tree.h TreeAccumulator, then across replicas
// core/parallel/tree_exchange.h).
struct TokenNode {
    i64 lo = 0, hi = 0;
    float* grads = nullptr;
};

// Expert parallelism (core/parallel/expert/expert_parallel.h): the model part holds experts
// [part().expert_lo, expert_hi) of every MoE layer, and the rows the ep group's ranks route to an
// expert go to the rank that holds it and come back through these layers (all-to-alls over the
// group, whose ranks own consecutive token ranges of the batch: source order is token order).
// The layout tells the layers which microbatch runs: where its tokens start in the step's batch,
// and in backward, for every rank of the group, that rank's token nodes of it (batch tokens) with
// the buffers this rank's experts' weight gradients for them go to.
class ExpertLayers {
public:
    virtual ~ExpertLayers() = default;
    virtual int size() const = 0;  // ranks of the ep group
    virtual int rank() const = 0;  // this rank's index in it
    // in: in_counts[k] values for rank k, back to back -> out: out_counts[k] from rank k.
    virtual void exchange(float* out, std::span<const i64> out_counts, const float* in,
                          std::span<const i64> in_counts) const = 0;
    virtual void exchange(i64* out, std::span<const i64> out_counts, const i64* in,
                          std::span<const i64> in_counts) const = 0;
    // in (size()·n, chunk k for rank k) -> out (size()·n, chunk k from rank k).
    virtual void exchange_counts(i64* out, const i64* in, i64 n) const = 0;
    virtual i64 token_base() const = 0;  // the running microbatch's first token in the batch
    virtual std::span<const TokenNode> source_nodes(int rank) const = 0;
};

}  // namespace px
