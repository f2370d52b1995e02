// The logical state of a run: the unsharded weights, Adam moments and per-step metrics that every
// layout must reproduce bit for bit (DESIGN.md §2), and the dump file that holds them.
//
// Index
//   LogicalState   flat weights and moments laid out as the full model's ParamTable
//   absorb         add one rank's part (its weights, its optimizer shard, the history)
//   write_dump     the state as HDF5, for comparing two runs with h5py
//
// Dump layout (all little-endian; tensor shapes as in GPT-2, e.g. wte (V,C)):
//   /weights/<name>, /adam/m/<name>, /adam/v/<name>   float32
//   /steps/step (int64 as float64), /steps/loss, /steps/grad_norm, /steps/val_loss (-1: none)
//   root attribute `config`: the job's TOML
#pragma once
#include "core/arena.h"
#include "core/job.h"
#include "core/parallel/pipeline.h"

#include <string>
#include <vector>

namespace px {

struct LogicalState {
    ParamTable table;
    std::vector<float> params, m, v;
    std::vector<StepMetrics> history;

    // Takes the weights and history from the first job absorbed; the Adam moments from every
    // job's optimizer slice [lo, hi). Replicas must agree on the weights: returns false when
    // this job's weights differ from those already absorbed. A tensor-parallel rank's shards go
    // to their logical places (tp_model.h logical_indices); replicated tensors and every dp
    // replica's copy of a shard must agree, and so must the histories.
    bool absorb(const Job& job);
    // A pipeline stage: its tensors go to their places in the whole model by tensor id (a
    // tensor-parallel stage's shards to their logical places). Tensors held by two stages (wte)
    // must agree; returns false otherwise, or when the stage's history differs from what is
    // already absorbed.
    bool absorb(const PipelineJob& stage);
    // Whether every tensor of the whole model has been absorbed from some stage (tensor
    // parallel: every element from some tp rank).
    bool complete() const;

private:
    bool absorb_tp(const Job& job);
    // A tensor-parallel shard of the whole model or of a pipeline stage (after unshard: its
    // optimizer covers [lo, hi) of the local table), its elements to their logical places.
    bool absorb_shards(const GPT& model, const AdamW& opt, const std::vector<StepMetrics>& hist,
                       const ModelConfig& mc);
    std::vector<char> seen_;    // per whole-model tensor id
    std::vector<char> filled_;  // per logical element, tensor-parallel jobs only
};

void write_dump(const std::string& path, const LogicalState& state, const Config& cfg);

}  // namespace px
