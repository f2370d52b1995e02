// Running a job under its layout on in-process ranks (threads sharing memory).
//
// Index
//   world_size       dp × pp × tp of a config's layout
//   run_layout       trains a config on its ranks; observers see rank 0; errors name the rank
//
// Parallelism is applied in fixed steps (DESIGN.md §1), each commented where it happens:
//   1. ranks: one thread per rank of the mesh, with the OpenMP threads divided among them;
//   2. data parallelism: each replica is a Job over its share of every batch (core/job.h
//      ReplicaContext), its gradients combined by a canonical all-reduce over the dp group;
//   3. ZeRO-1: optimizer state sharded over the dp group, weights all-gathered after the update
//      (ZeRO-2/3: gradients, then weights, sharded too; core/parallel/zero.h);
//   4. pipeline parallelism (layout.pp > 1): run_layout hands the layout to run_pipeline
//      (pipeline.h);
//   5. tensor parallelism (layout.tp > 1): the world splits into tp and dp groups; each dp
//      replica is a tp group of ranks holding one shard of the model each
//      (core/parallel/tp_model.h); with pp > 1 each pipeline stage is such a group.
#pragma once
#include "core/config.h"
#include "core/job.h"

#include <functional>
#include <vector>

namespace px {

int world_size(const LayoutConfig& layout);

// Trains cfg for train.steps steps on world_size(cfg.layout) in-process ranks. `observers`
// receive rank 0's metrics. `inspect`, when given, is called once per data-parallel replica after
// its last step, one rank at a time (tests read every replica's weights and moments there);
// pipeline layouts hand their stages to run_pipeline's own inspect instead (pipeline.h).
void run_layout(const Config& cfg, const std::vector<Observer*>& observers,
                const std::function<void(Job&)>& inspect = {});

}  // namespace px
