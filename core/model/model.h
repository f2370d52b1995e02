// The model: token embeddings (GPT-2: and learned positions), L pre-norm blocks of the config's
// architecture (model.arch: GPT-2's, gpt2_block.h, or Llama's, llama_block.h, behind block.h),
// a final norm and an LM head (tied to wte, or Llama's own lm_head). Forward and backward are
// written out per layer, as llm.c does: the embedding and the head here (model.cpp), a block in
// its file, a MoE layer's routed experts in moe.h, all on the ops of layer_ops.h. This file knows nothing of parallelism; layouts wrap it from
// core/parallel, through the layers they provide it (layout_layers.h). A GPT may hold only part
// of the model (ModelPart: some runs of layers, with or without the embedding and the head),
// which is what a pipeline stage is; the whole model is the part with everything, and runs
// exactly as before.
//
// Index
//   GradLayout    where each parameter's gradient lives in a gradient buffer
//   GradSpan      the floats of a gradient buffer that one chunk's backward writes
//   Activations   the activations of one microbatch on one chunk of layers (activations.h)
//   ParallelLayers, ContextLayers, ExpertLayers, UnitHooks, TokenNode ...   the layers a layout
//                 provides the model (layout_layers.h)
//   GPT           parameters; forward and backward of a chunk on a microbatch; the single-device
//                 forward/backward over the whole model with activations it keeps itself
#pragma once
#include "core/base/arena.h"
#include "core/base/config.h"
#include "core/base/numerics.h"
#include "core/model/activations.h"
#include "core/model/fp8.h"
#include "core/model/layout_layers.h"
#include "core/model/moe.h"
#include "core/model/probe.h"
#include "core/base/tensor.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

namespace px {

class LayerOps;         // core/model/layer_ops.h
class WeightGradQueue;  // core/model/weight_grads.h

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
    Tensor head_weight() const;  // the LM head's (V,C): wte when tied, else lm_head (local V)
    // Llama's RoPE table (model.seq_len, head_size/2), fp32, made once (ops::rope_table).
    Tensor rope_cos() const;
    Tensor rope_sin() const;
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
    // Probes (core/model/probe.h): after every op of forward and backward the model offers its
    // output (fwd) or its input gradient (bwd) to `sink`, keyed by ctx's step and placed at ctx's
    // batch rows (null ctx: step 0, the microbatch is the whole batch). Null sink: none (one
    // pointer test per op). Never changes a bit of the computation. Not owned; must outlive their
    // use. Under ParallelLayers each rank offers its piece (ProbeSplit), placed in the logical
    // tensor.
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
    // runs such layouts dp-major). With `defer`, the B of a zero-bubble schedule: the input
    // gradients and the weight gradients that cannot wait (embedding, LM head, MoE experts, fp8
    // linears); the linears' and norms' weight gradients wait in the queue until defer->run()
    // (core/model/weight_grads.h), which fills the same buffers with the same bits.
    void backward(Activations& a, int chunk, std::span<const TokenNode> nodes, const int* tokens,
                  const int* targets, float dloss, WeightGradQueue* defer = nullptr) const;

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
    LayerOps layer_ops(WeightGradQueue* defer = nullptr) const;
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
    std::vector<float> rope_;  // Llama: RoPE's cos then sin table
    Activations acts_;
    std::shared_ptr<Fp8Scaling> fp8_;  // null: no fp8 matmuls
    float* logit_max_ = nullptr;       // set_logit_max
    RouterStats* router_stats_ = nullptr;  // set_router_stats
    UnitHooks* hooks_ = nullptr;  // the single-device forward/backward's
    ProbeSink* probes_ = nullptr;               // null: nothing is probed
    const ProbeContext* probe_ctx_ = nullptr;   // step and batch rows of the probes; may be null
};

}  // namespace px
