// The GPT-2 model: token and learned position embeddings, L pre-LayerNorm blocks (causal
// multi-head attention, GELU-tanh MLP), a final LayerNorm and an LM head tied to wte.
// Forward and backward are written out per layer, as llm.c does. This file knows nothing of
// parallelism; layouts wrap it from core/parallel.
//
// Index
//   GradLayout    where each parameter's gradient lives in a gradient buffer
//   GPT           parameters, activations of one microbatch, forward, backward
#pragma once
#include "core/arena.h"
#include "core/config.h"
#include "core/numerics.h"
#include "core/tensor.h"

#include <cstdint>

namespace px {

// A gradient buffer holds one gradient per parameter, laid out as the ParamTable, then the LM
// head's contribution to wte kept apart (V,C): wte is used twice, and the two token reductions
// combine only once the whole batch is in, so the sum is the same however the batch is split.
struct GradLayout {
    i64 head_offset = 0;  // floats from the start of the buffer
    i64 total = 0;        // floats in one gradient buffer
};

class GPT {
public:
    GPT(const ModelConfig& mc, const Numerics& nx);

    const ModelConfig& config() const { return mc_; }
    const ParamTable& table() const { return table_; }
    const GradLayout& grad_layout() const { return glayout_; }
    i64 num_params() const { return table_.num_params; }
    Numerics& numerics() { return nx_; }
    const Numerics& numerics() const { return nx_; }

    Tensor param(int i) const;                         // view into the parameter arena
    Tensor grad(float* grads, int i) const;            // the same tensor in a gradient buffer
    Tensor grad_head(float* grads) const;              // (V,C) LM-head part of dwte
    float* params() const { return params_.data(); }
    float* param_ptr(const std::string& name) const;  // null if no such parameter

    // GPT-2 initialisation from Philox keyed by (seed, tensor id, element index).
    void init_random(std::uint64_t seed, double init_std);

    // tokens, targets (B,T). Fills the per-token losses (B,T) (the mean is the caller's, since
    // it is a reduction over the whole batch). Activations are kept for backward.
    void forward(const int* tokens, const int* targets, i64 B, i64 T);
    const float* losses() const { return act(LOSSES).f32(); }

    // Adds this microbatch's gradients into `grads` (a GradLayout buffer, zeroed by the caller
    // before its first microbatch). dloss is d(mean loss)/d(token loss) = 1/(tokens in the batch).
    void backward(float* grads, const int* tokens, const int* targets, float dloss);

    // Once every microbatch is in: dwte = dwte(embedding) + dwte(LM head), in that order.
    void combine_tied_grads(float* grads) const;

    i64 activation_bytes() const { return acts_.size() * static_cast<i64>(sizeof(float)); }

private:
    Tensor act(int a) const;            // whole activation tensor of the microbatch
    Tensor act_layer(int a, int l) const;  // layer l of a per-layer activation
    Tensor P(int l, LayerParam p) const { return param(table_.layer_index(l, p)); }
    void ensure_acts(i64 B, i64 T);

    ModelConfig mc_;
    Numerics nx_;
    ParamTable table_;
    GradLayout glayout_;
    Arena params_;
    Arena acts_;
    ActTable atable_{};
    i64 B_ = 0, T_ = 0;
};

}  // namespace px
