// Expert parallelism (docs/layouts.md): groups of layout.ep consecutive data-parallel ranks share
// out every MoE layer's experts, and each routed token row travels to its expert's rank and back
// (all-to-alls over the ep group), bit-identical to the single device in Mode::bitwise.
//
// Index
//   EpExchange        the model's ExpertLayers over an ep group: the all-to-alls, and which
//                     microbatch runs (its first token, every rank's token nodes and buffers)
//   expert_part       the ModelPart of ep rank r: a stage's part with experts [r·E/ep, (r+1)·E/ep)
//   ep_sum_squares    the stacked expert tensors' canonical Σg² from every ep rank's share
//
// Why exact. Everything a MoE layer decides (top-k, capacity, the gates) is per sequence and
// happens on the rank that holds the sequence (core/model/moe.h). The ep group's ranks own
// consecutive token ranges of the batch (mesh.h: ep divides dp, ep consecutive dp ranks), so an
// expert's owner, taking the rows source by source, sees them in batch token order: the rows of
// the single device, and a matmul's output rows do not depend on the other rows. The combine
// runs back on the token's own rank, in k order. An expert's weight gradient is the canonical
// token tree over its rows: its owner computes every source rank's token nodes (each into that
// source's accumulator, core/parallel/data/token_tree.h TreeAccumulator), and the owners of the
// same experts in the other ep groups combine them in the tree (core/parallel/expert/part.h), as
// the dense weights' nodes combine over dp.
//
// Communication per MoE layer and microbatch, for a rank that routes R kept rows of C floats
// (R = B·T·K without drops): forward, the rows to their owners and the outputs back (2·R·C
// floats out of which R·C·(ep-1)/ep leave the rank on average); backward, [input | d(output)]
// rows and their token ids out, d(input) back (3·R·C floats and R ids). The counts per expert
// go ahead of each exchange (ep · E/ep integers).
#pragma once
#include "core/comm/comm.h"
#include "core/model/model.h"

#include <span>
#include <vector>

namespace px {

class EpExchange : public ExpertLayers {
public:
    explicit EpExchange(comm::Communicator& ep) : comm_(ep) {}
    int size() const override { return comm_.size(); }
    int rank() const override { return comm_.rank(); }
    void exchange(float* out, std::span<const i64> out_counts, const float* in,
                  std::span<const i64> in_counts) const override;
    void exchange(i64* out, std::span<const i64> out_counts, const i64* in,
                  std::span<const i64> in_counts) const override;
    void exchange_counts(i64* out, const i64* in, i64 n) const override;
    i64 token_base() const override { return base_; }
    std::span<const TokenNode> source_nodes(int rank) const override;
    // Before a microbatch's backward: its first token in the batch, and per rank of the group
    // that rank's token nodes of the microbatch (batch tokens) with this rank's buffers for them.
    void set_microbatch(i64 token_base, std::vector<std::vector<TokenNode>> nodes);

private:
    comm::Communicator& comm_;
    i64 base_ = 0;
    std::vector<std::vector<TokenNode>> nodes_;
};

// The part of `stage` (a pipeline stage's part, or the whole model) that ep rank r of ep holds.
ModelPart expert_part(ModelPart stage, const ModelConfig& mc, int ep, int r);

// A rank's bytes sent in its ep group per training step when routing spreads evenly and no slot
// drops: per MoE layer of its stage and microbatch, with S = micro_B·T·K·(ep-1)/ep rows leaving
// the rank (and as many arriving), forward S·C floats out and S·C back, backward S·2C floats and
// S ids out and S·C back, each exchange preceded by (ep-1)·E/ep counts; recomputation runs the
// forward's twice. (Measured bytes differ by the routing's imbalance and drops.)
double ep_comm_bytes(const ModelConfig& mc, int ep, i64 moe_layers, i64 micro_B, int microbatches,
                     bool recompute);

// sums[i] = the canonical Σg² (ops::sum_squares of the logical tensor) of every stacked expert
// tensor of model's table (GPT::expert_tensor): this rank's blocks of it (its share is whole
// blocks, mesh.h) with the other ep ranks', exchanged as block vectors in which the others
// contribute +0 (exact), then the tree over blocks. Other entries are left as they are. A
// collective of the ep group.
void ep_sum_squares(const GPT& model, const float* grads, comm::Communicator& ep,
                    std::vector<float>& sums);

}  // namespace px
