// The GPT-2 model: token and learned position embeddings, L pre-LayerNorm blocks (causal
// multi-head attention, GELU-tanh MLP), a final LayerNorm and an LM head tied to wte.
// Forward and backward are written out per layer, as llm.c does: the embedding and the head
// here (model.cpp), a block in gpt2_block.h, a MoE layer's routed experts in moe.h, all on the
// ops of layer_ops.h. This file knows nothing of parallelism; layouts wrap it from
// core/parallel. A GPT may hold only part of the model (ModelPart: some runs of layers, with or
// without the embedding and the head), which is what a pipeline stage is; the whole model is
// the part with everything, and runs exactly as before.
//
// Index
//   GradLayout    where each parameter's gradient lives in a gradient buffer
//   GradSpan      the floats of a gradient buffer that one chunk's backward writes
//   Activations   the activations of one microbatch on one chunk of layers
//   ParallelLayers the layers a tensor-parallel layout distributes (absent: the plain kernels)
//   PositionRun, ContextLayers  context parallelism: where a rank's tokens sit in their sequence,
//                 and the attention over the whole sequence (absent: the rank holds it all)
//   Unit, UnitHooks the units a model runs its weights in, and what a layout may do around each
//   TokenNode     a node of the token tree that a microbatch covers, with its gradient buffer
//   ExpertLayers  expert parallelism: the ep group's routed rows to their experts' owners and back
//   GPT           parameters; forward and backward of a chunk on a microbatch; the single-device
//                 forward/backward over the whole model with activations it keeps itself
#pragma once
#include "core/base/arena.h"
#include "core/base/config.h"
#include "core/base/numerics.h"
#include "core/model/fp8.h"
#include "core/model/moe.h"
#include "core/model/probe.h"
#include "core/base/tensor.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

namespace px {

class LayerOps;  // core/model/layer_ops.h

// A gradient buffer holds one gradient per parameter, laid out as the ParamTable, then the LM
// head's contribution to wte kept apart (V,C): wte is used twice, and the two token reductions
// combine only once the whole batch is in, so the sum is the same however the batch is split.
// Every part that holds wte has the head region (a part with the embedding but not the head
// gets the head's contribution there from whoever runs the head); a part without wte has none.
// Gradients are fp32, as the master weights are, whatever the activations' dtype: a gradient
// buffer is a float* throughout (model, trainer, ZeRO, optimizer).
struct GradLayout {
    i64 head_offset = 0;  // floats from the start of the buffer
    i64 total = 0;        // floats in one gradient buffer
};

// Floats [lo, hi) of a gradient buffer: the parameters of one chunk (with the embedding before
// chunk 0, ln_f and the head region after the last chunk, when the part has them). The spans of
// a part's chunks are disjoint; nothing outside its span is touched by a chunk's backward.
struct GradSpan {
    i64 lo = 0, hi = 0;
};

// The activations of one microbatch (B sequences of T tokens) on one chunk of layers: its input
// hidden state, each block's saved tensors, the head's when the chunk ends in it, and the
// backward's scratch (ActTable). Recompute: only the residual stream (each block's input and
// output) is kept; a block's internals live in one shared slot, refilled by recomputing the
// block's forward inside backward, which gives the same bits (same inputs, same kernels).
class Activations {
public:
    Activations() = default;
    Activations(const ModelConfig& mc, const ActShape& shape);

    const ActShape& shape() const { return shape_; }
    DType dtype() const { return shape_.dtype; }  // of the activations (ActType::act)
    Tensor tensor(int a) const;                   // the whole tensor, in its table's dtype
    Tensor layer(int a, int i) const;  // local layer i (0 .. layers-1) of a per-layer tensor
    Tensor input() const { return tensor(ENCODED); }        // (B,T,C) the chunk's input
    Tensor output() const;                                  // (B,T,C) its last block's output
    Tensor dresidual() const { return tensor(DRESIDUAL); }  // (B,T,C) see kGpt2Acts
    Tensor losses() const { return tensor(LOSSES); }        // (B,T) fp32, head chunks only
    i64 bytes() const {  // the table's total, and the MoE routes
        return arena_.bytes() + static_cast<i64>(routes_.size() * sizeof(std::int32_t));
    }
    // A MoE layer's routes (local layer i, its slot under recompute): per token (B·T) and slot
    // (K), the expert it goes to, or -1 - e when expert e was chosen but full (moe.h).
    std::int32_t* routes(int i) const;

private:
    ModelConfig mc_;
    ActShape shape_;
    ActTable table_{};
    Arena arena_;
    mutable std::vector<std::int32_t> routes_;  // (LS, B·T, K) of MoE models, else empty
};

// The linear layers of a block, for ParallelLayers.
enum class Linear : std::uint8_t { qkv, attn_proj, fc, fc_proj };

// The layers whose math a layout distributes over ranks (core/parallel/tp_model.h implements
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
    // As ops::layernorm_backward on token_rows only (full tensors given; a null output is not
    // computed); dweight and dbias get the token reductions over the microbatch's rows
    // [row_lo, row_hi) (one node of the batch's token tree; row_hi < 0: all rows), the same bits
    // on every rank.
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

// Context parallelism (core/parallel/context_parallel.h): a rank holds only some tokens of each
// sequence (T of them, in runs of consecutive logical positions), and its attention reads the
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
// reduce-scatters a unit's gradients as soon as they are complete (core/parallel/zero.h). The
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
// (core/parallel/pipeline.h TreeAccumulator, then across replicas core/parallel/tree_exchange.h).
struct TokenNode {
    i64 lo = 0, hi = 0;
    float* grads = nullptr;
};

// Expert parallelism (core/parallel/expert_parallel.h): the model part holds experts
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

class GPT {
public:
    GPT(const ModelConfig& mc, const Numerics& nx);                       // the whole model
    GPT(const ModelConfig& mc, const Numerics& nx, const ModelPart& part);  // a part of it
    // A part whose layers run through `layers` (a tensor-parallel shard: local shapes).
    // Activations of `activations` dtype (precision.activations; ActType::act of the table).
    GPT(const ModelConfig& mc, const Numerics& nx, const ModelPart& part,
        std::shared_ptr<const ParallelLayers> layers, DType activations = DType::f32);
    const ParallelLayers* parallel_layers() const { return layers_.get(); }  // null: plain
    // The layers become wrap(the layers): a decorator that delegates to them (a tracer, a
    // test's planted bug) and has their dims and shards. Before the first forward.
    using LayersWrap = std::function<std::shared_ptr<const ParallelLayers>(
        std::shared_ptr<const ParallelLayers>)>;
    void wrap_parallel_layers(const LayersWrap& wrap);
    // Context parallelism (null: none): the model runs on a rank's tokens of each sequence, at the
    // positions context->runs() gives, with its attention. Before the first make_activations.
    void set_context(std::shared_ptr<const ContextLayers> context) {
        context_ = std::move(context);
    }
    const ContextLayers* context() const { return context_.get(); }
    // Expert parallelism (null: this part holds every expert and routes locally). The part's
    // expert range must be the layers' rank's share. Before the first make_activations.
    void set_experts(std::shared_ptr<const ExpertLayers> experts);
    const ExpertLayers* experts() const { return experts_.get(); }
    // Whether table entry e is one of the stacked expert tensors, which an expert-parallel part
    // holds EL experts of (rows [expert_lo·R, (expert_lo + EL)·R) of the logical (E·R, cols)).
    static bool expert_tensor(const TableEntry& e);
    i64 expert_row_offset(const TableEntry& e) const;  // expert_lo·R (0 for any other tensor)
    // e is an expert tensor of which this part holds only some experts' rows.
    bool expert_share(const TableEntry& e) const {
        return expert_tensor(e) && !part_.all_experts();
    }

    const ModelConfig& config() const { return mc_; }
    const ModelPart& part() const { return part_; }
    int num_chunks() const { return static_cast<int>(part_.chunks.size()); }
    const ParamTable& table() const { return table_; }
    const GradLayout& grad_layout() const { return glayout_; }
    i64 num_params() const { return table_.num_params; }  // of this part
    Numerics& numerics() { return nx_; }
    const Numerics& numerics() const { return nx_; }

    Tensor param(int i) const;                         // view into the (fp32) parameter arena
    Tensor grad(float* grads, int i) const;            // the same tensor in a gradient buffer
    Tensor grad_head(float* grads) const;              // (V,C) LM-head part of dwte (local V)
    DType activation_dtype() const { return act_dtype_; }
    float* params() const { return params_.f32(); }    // fp32 master weights
    const Arena& param_arena() const { return params_; }
    Arena& param_arena() { return params_; }
    float* param_ptr(const std::string& name) const;  // null if no such parameter

    // GPT-2 initialisation from Philox keyed by (seed, tensor id, element index), with the ids
    // of the whole model: a part draws exactly the numbers the whole model has there.
    void init_random(std::uint64_t seed, double init_std);

    // ---- units: where their weights and gradients live ---------------------------------------
    // Floats [lo, hi) of the parameter arena that unit u reads (the head: ln_f and wte), and of a
    // gradient buffer that its backward writes (the head: ln_f and the head region; the embedding:
    // wte and wpe). Padding between tensors belongs to the tensor before it.
    std::vector<GradSpan> unit_params(Unit u) const;
    std::vector<GradSpan> unit_grads(Unit u) const;
    // FP8 matmuls (core/model/fp8.h; null: none): the linears it covers cast their inputs with
    // its scales and record its amaxes. Shared with the trainer, which reduces and updates them.
    void set_fp8(std::shared_ptr<Fp8Scaling> fp8) { fp8_ = std::move(fp8); }
    // While set (not null): every block's forward raises per_layer[l] (one float per layer of
    // the whole model) to the largest attention logit q·k/sqrt(HS) of the causal positions it
    // computed (its heads, under tensor parallelism). Spike evidence (core/train/spikes.h).
    void set_logit_max(float* per_layer) { logit_max_ = per_layer; }
    // While set (not null): every MoE layer's forward adds its routing to per_layer[l] (one per
    // layer of the whole model; dense layers' are untouched). Recomputed forwards do not count.
    void set_router_stats(RouterStats* per_layer) { router_stats_ = per_layer; }
    Fp8Scaling* fp8() const { return fp8_.get(); }
    // Hooks called around every unit (null: none). Not owned; must outlive their use.
    void set_unit_hooks(UnitHooks* hooks) { hooks_ = hooks; }
    // Probes (core/model/probe.h): after every op of forward and backward the model offers its output
    // (fwd) or its input gradient (bwd) to `sink`, keyed by ctx's step and placed at ctx's batch
    // rows (null ctx: step 0, the microbatch is the whole batch). Null sink: none (one pointer
    // test per op). Never changes a bit of the computation. Not owned; must outlive their use.
    // Under ParallelLayers each rank offers its piece (ProbeSplit), placed in the logical tensor.
    void set_probes(ProbeSink* sink, const ProbeContext* ctx) {
        probes_ = sink;
        probe_ctx_ = ctx;
    }
    // Offers every parameter's floats [lo, hi) of `data` (laid out by this model's table, element
    // `lo` at data[0]) to `sink` as probes step/phase/layer/op/<its GPT-2 name>, in their
    // logical shapes (a flat shard of a tensor as flat_shard's pieces; a tp shard as its
    // ParallelLayers' param_shard). The trainer calls it for the reduced gradient ("grad") and the
    // updated weights and moments ("optim"). node >= 0: the data is node `node` of `nodes`
    // (a microbatch's gradient, "mgrad"), a row of a logical tensor (nodes, ...).
    void probe_params(ProbeSink& sink, i64 step, const char* phase, const char* op,
                      const float* data, i64 lo, i64 hi, i64 node = -1, i64 nodes = 0) const;

    // ---- chunks: one run of layers on one microbatch, with caller-owned activations ----------
    // Activations sized for chunk c on microbatches of B sequences of T tokens.
    Activations make_activations(int chunk, i64 B, i64 T, bool recompute = false) const;
    GradSpan grad_span(int chunk) const;
    // Forward of chunk c. Input: the tokens (B,T) when the chunk starts with the embedding, else
    // the hidden state the caller put in a.input(). Output: a.output() (B,T,C), and when the chunk
    // ends in the head, the per-token losses a.losses() (B,T) against targets (B,T).
    void forward(Activations& a, int chunk, const int* tokens, const int* targets) const;
    // Backward of chunk c, after its forward on `a`: adds the microbatch's gradients into `grads`
    // (a GradLayout buffer; only grad_span(c) is touched). Output gradient: from the loss when
    // the chunk ends in the head (dloss = d(mean loss)/d(token loss) = 1/tokens in the batch),
    // else the caller put d(output) in a.dresidual(). Afterwards a.dresidual() holds d(input)
    // (when the chunk starts with the embedding, d(encoded), already in wte's and wpe's grads).
    void backward(Activations& a, int chunk, float* grads, const int* tokens, const int* targets,
                  float dloss) const;
    // The same with the microbatch's token rows cut into nodes (ascending, covering its B·T rows):
    // every weight gradient is computed once per node, over the node's rows alone, into the
    // node's buffer; input gradients once over all rows. Each node's gradients are then bit for
    // bit those of a microbatch of exactly its rows. Not under unit hooks (the layout check
    // runs such layouts dp-major).
    void backward(Activations& a, int chunk, std::span<const TokenNode> nodes, const int* tokens,
                  const int* targets, float dloss) const;

    // ---- the whole model on one device ------------------------------------------------------
    // tokens, targets (B,T). Fills the per-token losses (B,T) (the mean is the caller's, since
    // it is a reduction over the whole batch). Activations are kept for backward.
    void forward(const int* tokens, const int* targets, i64 B, i64 T);
    const float* losses() const { return acts_.losses().f32(); }
    // Makes the activations for B sequences of T tokens now (the first forward would otherwise),
    // and the fast matmul's one-time setup (ops::warm_up_matmul).
    void prepare(i64 B, i64 T);

    // Adds this microbatch's gradients into `grads` (a GradLayout buffer, zeroed by the caller
    // before its first microbatch). dloss is d(mean loss)/d(token loss) = 1/(tokens in the batch).
    void backward(float* grads, const int* tokens, const int* targets, float dloss);

    // Once every microbatch is in: dwte = dwte(embedding) + dwte(LM head), in that order.
    void combine_tied_grads(float* grads) const;

    i64 activation_bytes() const { return acts_.bytes(); }

private:
    bool has_embedding(int chunk) const { return chunk == 0 && part_.embedding; }
    bool has_head(int chunk) const { return chunk == num_chunks() - 1 && part_.head; }
    // The ops its layers run on (core/model/layer_ops.h), from the current settings.
    LayerOps layer_ops() const;
    // The embedding of the rows of `out` (B,T,C) / its backward over one token node, at their
    // logical positions (context parallelism: runs of the sequence; otherwise rows mod T).
    void embedding_forward(const Tensor& out, const int* tokens) const;
    void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                            const int* tokens, i64 row_lo, i64 row_hi) const;
    void before_forward(Unit u) const {
        if (hooks_) hooks_->before_forward(u);
    }
    void after_forward(Unit u) const {
        if (hooks_) hooks_->after_forward(u);
    }
    void before_backward(Unit u, float* grads) const {
        if (hooks_) hooks_->before_backward(u, grads);
    }
    void after_backward(Unit u, float* grads) const {
        if (hooks_) hooks_->after_backward(u, grads);
    }

    ModelConfig mc_;
    Numerics nx_;
    ModelPart part_;
    std::shared_ptr<const ParallelLayers> layers_;  // null: the plain kernels
    std::shared_ptr<const ContextLayers> context_;  // null: every token of each sequence
    std::shared_ptr<const ExpertLayers> experts_;   // null: every expert here, routed locally
    bool sp_ = false;                               // layers_->sequence_parallel()
    TpDims dims_;                                   // local sizes (the whole model without layers_)
    DType act_dtype_;                               // of the activations it makes
    ParamTable table_;
    GradLayout glayout_;
    Arena params_;
    Activations acts_;
    std::shared_ptr<Fp8Scaling> fp8_;  // null: no fp8 matmuls
    float* logit_max_ = nullptr;       // set_logit_max
    RouterStats* router_stats_ = nullptr;  // set_router_stats
    UnitHooks* hooks_ = nullptr;  // the single-device forward/backward's
    ProbeSink* probes_ = nullptr;               // null: nothing is probed
    const ProbeContext* probe_ctx_ = nullptr;   // step and batch rows of the probes; may be null
};

}  // namespace px
