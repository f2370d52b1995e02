// The ops a layer of the model runs on, as the model's layout runs them. A layer's own math lives
// in its file (a GPT-2 block: gpt2_block.h; the routed experts of a MoE layer: moe.h); what
// changes with the layout lives here, so that no layer knows which layout runs it:
//   - a layer's parameters, and its gradients in a gradient buffer;
//   - the linears: through ParallelLayers (tensor parallelism), on fp8 casts (Fp8Linears), or
//     the plain kernels; their backward over a microbatch's token nodes;
//   - the LayerNorms and residual adds on this rank's token rows (sequence parallelism);
//   - the attention over the whole sequence (context parallelism);
//   - the probes, placed in their logical tensors.
// GPT makes one from its current settings for each pass over a chunk; it owns nothing.
//
// Index
//   LayerOps              the above, over a model and the layout settings it hands over
//   linear_backward_rows  a linear's backward over token nodes, through ParallelLayers or the
//                         plain kernels
#pragma once
#include "core/model/model.h"
#include "core/model/weight_grads.h"

#include <span>
#include <vector>

namespace px {

class LayerOps {
public:
    // What the model hands over besides itself: not owned; they outlive the LayerOps.
    struct Layout {
        TpDims dims;                              // local sizes
        const ParallelLayers* layers = nullptr;   // null: the plain kernels
        bool sp = false;                          // layers->sequence_parallel()
        const ContextLayers* context = nullptr;   // null: every token of each sequence
        Fp8Scaling* fp8 = nullptr;                // null: no fp8 matmuls
        ProbeSink* probes = nullptr;              // null: nothing is probed
        const ProbeContext* probe_ctx = nullptr;  // step and batch rows of the probes; may be null
        // Non-null: the backward computes input gradients only, and the linears' and norms'
        // weight gradients wait in the queue (a zero-bubble schedule's W). fp8 linears compute
        // theirs at once (their casts' scales move with every call).
        WeightGradQueue* defer = nullptr;
    };
    LayerOps(const GPT& model, const Layout& layout)
        : model_(model), nx_(model.numerics()), layout_(layout) {}

    const ModelConfig& config() const { return model_.config(); }
    const Numerics& numerics() const { return nx_; }
    const TpDims& dims() const { return layout_.dims; }
    bool sequence_parallel() const { return layout_.sp; }

    // Layer l's tensor p (absent: has(l, p) is false), and its gradient in buffer `grads`.
    bool has(int l, LayerParam p) const { return model_.table().layer_index(l, p) >= 0; }
    Tensor param(int l, LayerParam p) const {
        return model_.param(model_.table().layer_index(l, p));
    }
    Tensor grad(float* grads, int l, LayerParam p) const {
        return model_.grad(grads, model_.table().layer_index(l, p));
    }

    // ParallelLayers' linear, or ops::matmul_* when there is none. An fp8 linear (Fp8Linears)
    // when the weight's matmul runs in fp8. record: an fp8 linear records its casts' amaxes
    // (false when backward recomputes a block: the same values again). whole: the kernels on
    // whole tensors even under ParallelLayers (a MoE layer, which every tp rank runs whole: its
    // router, experts and shared experts are not tensor-parallel).
    void linear_forward(Linear l, const Tensor& out, const Tensor& inp, const Tensor& weight,
                        const Tensor* bias, bool record = true, bool whole = false) const;
    void linear_backward(std::span<const TokenNode> nodes, Linear l, const Tensor& dinp,
                         const Tensor& dweight, const Tensor* dbias, const Tensor& dout,
                         const Tensor& inp, const Tensor& weight, bool whole = false) const;
    // The fp8 linears, and the LM head's when precision.fp8_lm_head (only with an Fp8Scaling).
    Fp8Linears fp8_linears() const { return {*layout_.fp8, nx_, layout_.layers}; }

    // Sequence parallelism (see ParallelLayers): the LayerNorm forward/backward and a residual
    // add on this rank's token rows; plain ops on whole tensors otherwise.
    void layernorm_forward(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                           const Tensor& inp, const Tensor& weight, const Tensor& bias) const;
    void layernorm_backward(std::span<const TokenNode> nodes, const Tensor& dinp,
                            const Tensor& dweight, const Tensor& dbias, const Tensor& dout,
                            const Tensor& inp, const Tensor& weight, const Tensor& mean,
                            const Tensor& rstd) const;
    void residual_forward(const Tensor& out, const Tensor& a, const Tensor& b) const;
    // Llama's RMSNorm (model.norm_eps) on whole tensors; the weight gradient per token node over
    // the node's rows (a 4-D (B,T,G,C) tensor: G rows per token, kernels/ops.h).
    void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& inp,
                         const Tensor& weight) const;
    void rmsnorm_backward(std::span<const TokenNode> nodes, const Tensor& dinp,
                          const Tensor& dweight, const Tensor& dout, const Tensor& inp,
                          const Tensor& weight, const Tensor& rstd) const;
    // Its weight gradient alone, per token node (dinp not computed).
    void rmsnorm_weight_grad(std::span<const TokenNode> nodes, const Tensor& dweight,
                             const Tensor& dout, const Tensor& inp, const Tensor& weight,
                             const Tensor& rstd) const;
    // Tensor parallelism: the ranks sharing the layers, this one's index, and the all-gather of a
    // head-split activation (ParallelLayers::gather_heads).
    int tp_size() const { return layout_.dims.tp; }
    int tp_rank() const { return layout_.layers ? layout_.layers->rank() : 0; }
    void gather_heads(const Tensor& full, const Tensor& local) const {
        layout_.layers->gather_heads(full, local);
    }
    // RoPE's table (the model's, for model.seq_len positions) and the logical position of each of
    // a microbatch's T rows (context parallelism: the runs of the rank's chunks; else empty:
    // 0..T-1).
    Tensor rope_cos() const { return model_.rope_cos(); }
    Tensor rope_sin() const { return model_.rope_sin(); }
    std::vector<i64> positions(i64 T) const;
    void sp_gather(const Tensor& t) const {
        if (layout_.sp) layout_.layers->sp_gather(t);
    }

    // Context parallelism (see ContextLayers), or ops::attention_* on the rank's whole
    // sequences: out (B,T,C), qkv (B,T,3C), preatt and att (B,NH,T,keys).
    void attention_forward(const Tensor& out, const Tensor& preatt, const Tensor& att,
                           const Tensor& qkv, i64 NH) const;
    void attention_backward(const Tensor& dqkv, const Tensor& dpreatt, const Tensor& datt,
                            const Tensor& dout, const Tensor& qkv, const Tensor& att, i64 NH) const;
    // The largest causal logit in preatt as attention_forward left it (this rank's part).
    float attention_logit_max(const Tensor& preatt, i64 NH) const;

    // Offers t (a microbatch's (B,T,...) activation or gradient, spread over the ranks as
    // `split` says) to the probe sink, if any.
    void probe(const char* phase, int layer, const char* op, const char* tensor, const Tensor& t,
               ProbeSplit split = ProbeSplit::whole) const {
        if (layout_.probes) offer_probe(phase, layer, op, tensor, t, split);
    }

private:
    // A norm's weight gradients after its dinp: now, or kept in layout_.defer.
    void norm_weights(std::span<const TokenNode> nodes, const Tensor& dweight, const Tensor* dbias,
                      const Tensor& dout, const Tensor& inp, const Tensor& weight,
                      const Tensor& mean, const Tensor& rstd) const;
    void offer_probe(const char* phase, int layer, const char* op, const char* tensor,
                     const Tensor& t, ProbeSplit split) const;
    ShardSpec context_pieces(const ShardSpec& local) const;  // local rows -> logical positions

    const GPT& model_;
    const Numerics& nx_;
    Layout layout_;
};

// After any casts: dinp (null: none) over all rows, the weight gradients (dweight without
// data: none) once per node over the node's rows, in nx (the model's numerics, or the fp8 linears'), through `layers` (null: the
// plain kernels).
void linear_backward_rows(const ParallelLayers* layers, const Numerics& nx,
                          std::span<const TokenNode> nodes, Linear l, const Tensor* dinp,
                          const Tensor& dweight, const Tensor* dbias, const Tensor& dout,
                          const Tensor& inp, const Tensor& weight);

}  // namespace px
