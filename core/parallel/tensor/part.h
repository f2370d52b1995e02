// Tensor parallelism's part of a rank's trainer (core/parallel/part.h; layout.tp > 1): the
// stage's layers cut over the tp group (TpLayers: Megatron's column and row parallel linears,
// the vocabulary-parallel embedding and LM head, sequence parallelism; tp_model.h), the
// logical weights' slices when a job starts from a file, the gradient norm's per-tensor sums
// from the shards' exact block partials, and which tp rank writes which tensor of a checkpoint.
//
// Index
//   TensorParallel   the part: plan (the parallel layers), load_weights, entry_sums, writes
#pragma once
#include "core/parallel/estimate.h"
#include "core/parallel/part.h"

namespace px {

class TpLayers;  // core/parallel/tensor/tp_model.h

class TensorParallel final : public TrainerPart {
public:
    explicit TensorParallel(const RankSetup& rank) : rank_(rank) {}
    const char* name() const override { return "tensor"; }
    // The memory estimate's terms (core/parallel/estimate.h): what a rank of group g holds for
    // tensor parallelism beyond its shards: model.init_from's logical tensors,
    // read whole before each rank keeps its slices, from the config's sizes alone, before anything is made.
    static void estimate(const MemorySizes& s, const StageParams& p, const MemoryGroup& g,
                         MemoryTerms& t);

    void plan(ModelPlan& plan) override;
    void attach(GPT& model) override { model_ = &model; }
    bool load_weights(GPT& model, const ParamTable& full) override;
    void entry_sums(const float* g, EntrySums& s) override;
    // A sharded tensor by every tp rank (its own elements); a replicated one by tp rank (tensor
    // id mod tp), which spreads the small tensors over the group.
    bool writes(const TableEntry& e) const override;

private:
    // The model's layers: TpLayers, or a decorator of them a tool wrapped around them
    // (GPT::wrap_parallel_layers), which has their shards.
    static const TpLayers& layers(const GPT& model);

    const RankSetup& rank_;
    const GPT* model_ = nullptr;
};

}  // namespace px
