// Mixture-of-experts feed-forward (model.moe_* keys). On a MoE layer the MLP is replaced by
//
//   probs   = softmax(ln2 · routerᵀ)                       (B,T,E), fp32, canonical reductions
//   top-k   each token's K most probable experts (ties: the lower expert index)
//   gates   their probabilities, renormalised over the K when model.moe_norm_topk
//   capacity at most ceil(moe_capacity_factor · T · K / E) slots per expert and sequence: slots
//           are admitted first choices first (j = 0, then 1, ...), each in token order; the rest
//           are dropped (their gate contributes nothing). 0: dropless.
//   out     shared(ln2) (a plain MLP of moe_shared_experts · moe_ffn channels, or +0), then
//           out = fma(gate_j, expert_{e_j}(ln2), out) for j = 0 .. K-1, the kept slots only
//   expert  the block's own MLP at moe_ffn channels: GPT-2's c_proj(gelu(c_fc(x))) with biases, or
//           Llama's (model.arch = "llama", Qwen3-MoE's) down(silu(gate(x)) · up(x)) without
//           biases; the shared experts are the layer's plain MLP of the same kind
//
// Every decision is a function of one sequence's tokens, so the same slots drop, and every
// expert sees the same rows, however the batch is cut into ranks and microbatches.
//
// The canonical order of an expert's weight gradient (docs/numerics.md): the batch's token axis cut
// into blocks of numerics.block tokens as for any weight gradient; inside a block the sum runs
// over the tokens routed to the expert, in token order; blocks combine in the canonical tree,
// blocks without such a token being absent subtrees. A token node (model.h TokenNode) then
// computes exactly its subtree, so dp ranks and microbatches combine as for dense weights.
//
// Auxiliary losses, added to the objective (not to the reported loss, which stays the LM's mean
// cross-entropy so that it compares with the data's entropy floor):
//   load balancing  moe_aux_loss · E · Σ_i f_i · P_i per sequence, averaged over the batch's
//                   sequences (f_i: the share of the sequence's K·T router choices that chose i,
//                   before capacity; P_i: its mean router probability). Gradient through P only.
//   z-loss          moe_z_loss · mean over tokens of logsumexp(router logits)².
//
// Index
//   RouterStats        one MoE layer's router statistics of a step, in fixed point
//   router_fixed       a statistic's value to fixed point, and back (router_unfixed)
//   MoeLayer           the routed experts of a MoE layer (router to combine), forward and backward
#pragma once
#include "core/base/config.h"
#include "core/base/numerics.h"
#include "core/base/shapes.h"
#include "core/base/tensor.h"

#include <cstdint>
#include <span>
#include <vector>

namespace px {

// Of core/model/model.h and layer_ops.h (model.h includes this header for RouterStats).
class Activations;
class ExpertLayers;
class LayerOps;
struct TokenNode;

// One MoE layer's router statistics over the microbatches a rank ran in a step. The sums of
// real values are fixed point (units of 2^-kRouterStatBits, each token's or sequence's value
// rounded once): integer sums, so ranks and microbatches add them in any order to the same
// total. Core/train reduces them over the ranks and reports per layer and step.
inline constexpr int kRouterStatBits = 24;
struct RouterStats {
    std::vector<i64> tokens;  // per expert: slots kept (routed to it after capacity)
    i64 slots = 0;            // slots chosen by the router (tokens · K)
    i64 dropped = 0;          // of them, dropped by capacity
    i64 sequences = 0, token_count = 0;
    i64 balance = 0;  // Σ over sequences of E · Σ_i f_i · P_i (1 when balanced), fixed point
    i64 z = 0;        // Σ over tokens of logsumexp(logits)², fixed point
    i64 entropy = 0;  // Σ over tokens of the router distribution's entropy (nats), fixed point
    void reset(i64 experts);
};

// v in units of 2^-kRouterStatBits, rounded to nearest.
i64 router_fixed(double v);
double router_unfixed(i64 v);

// The routed experts of a MoE layer, as above, over a model's LayerOps: what a block
// (gpt2_block.h, llama_block.h) calls for its MoE layers, after their shared experts' MLP. Every tp rank
// runs it whole (its router and experts are not tensor-parallel); no sequence parallelism.
class MoeLayer {
public:
    // experts: null when the model part holds every expert and routes locally; otherwise the
    // ep group the routed rows cross (model.h ExpertLayers). router_stats: one per layer of the
    // whole model (null: none), see GPT::set_router_stats. Not owned; they outlive the MoeLayer.
    MoeLayer(const LayerOps& ops, const ExpertLayers* experts, RouterStats* router_stats);

    // out += the gated sum of each token's kept experts on ln2 of local layer i (model layer l),
    // its routes into a.routes(i). probed: false when backward recomputes the layer (not probed
    // again, nor counted in the router statistics).
    void forward(Activations& a, int l, int i, const Tensor& out, bool probed) const;
    // dln2 += d(ln2) through the experts and the router for dout = d(out), the auxiliary losses'
    // gradients included (dloss: d(mean loss)/d(token loss)). Weight gradients per token node:
    // the router's into `nodes`; the experts' too, or under expert parallelism into the nodes of
    // every rank of the ep group (ExpertLayers::source_nodes).
    void backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                  const Tensor& dout, const Tensor& dln2, float dloss) const;

private:
    const LayerOps& ops_;
    const ModelConfig& mc_;
    const Numerics& nx_;
    const ExpertLayers* experts_;
    RouterStats* router_stats_;
};

}  // namespace px
