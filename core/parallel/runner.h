// Running a job under its layout: on in-process ranks (threads sharing memory), or as this
// process's rank of an MPI world (core/comm/mpi.h; `mpirun -np N parallax train`).
//
// Index
//   world_size        dp × pp × tp of a config's layout
//   threads_per_rank  OpenMP threads of one rank: train.threads, else the node's cores shared out
//   run_rank          one rank's part of a run, on whatever communicator it is given
//   run_layout        trains a config on its in-process ranks; observers see rank 0
//
// Parallelism is applied in fixed steps (DESIGN.md §1), each commented where it happens:
//   1. ranks: one thread per rank of the mesh (run_layout), or one process per rank (MPI), with
//      the OpenMP threads divided among the ranks of a node;
//   2. data parallelism: each replica is a Job over its share of every batch (core/job.h
//      ReplicaContext), its gradients combined by a canonical all-reduce over the dp group;
//   3. ZeRO-1: optimizer state sharded over the dp group, weights all-gathered after the update
//      (ZeRO-2/3: gradients, then weights, sharded too; core/parallel/zero.h);
//   4. pipeline parallelism (layout.pp > 1): run_rank hands the rank to run_pipeline_rank
//      (pipeline.h);
//   5. tensor parallelism (layout.tp > 1): the world splits into tp and dp groups; each dp
//      replica is a tp group of ranks holding one shard of the model each
//      (core/parallel/tp_model.h); with pp > 1 each pipeline stage is such a group.
//   6. checkpoints: resume from the logical state, save every N steps (checkpointing.h);
//   7. faults: the fault injector and the replica check of silent data corruption (faults.h);
//      6 and 7 together for a Job or a pipeline stage: RankGuards (rank_guards.h).
#pragma once
#include "core/comm/comm.h"
#include "core/config.h"
#include "core/job.h"

#include <functional>
#include <vector>

namespace px {

class PipelineJob;

int world_size(const LayoutConfig& layout);

// train.threads when set, else the hardware threads divided by the ranks on this node (at
// least 1): the ranks of a node together use its cores once.
int threads_per_rank(const Config& cfg, int ranks_on_node);

// One rank's part of training cfg: `world` is this rank's world communicator (a thread under
// comm::run_ranks, or this process under MPI) and must have world_size(cfg.layout) ranks, else
// a ConfigError naming both numbers. cfg.train.threads is this rank's OpenMP threads (see
// threads_per_rank). `observers` are attached on world rank 0 only. After the last step,
// `inspect` (tp/dp layouts) or `inspect_stage` (pp > 1, after PipelineJob::unshard, which is
// collective) is called with this rank's job.
// `each_step` / `each_stage_step`, when given, are called on every rank after each step (and
// its checkpoint) with this rank's job or stage; collectives are allowed (every rank calls them
// at the same step). `setup` / `setup_stage`, when given, are called on every rank with its job
// or stage before the first step (e.g. Job::set_probes).
void run_rank(const Config& cfg, comm::Communicator& world, const std::vector<Observer*>& observers,
              const std::function<void(Job&)>& inspect = {},
              const std::function<void(PipelineJob&)>& inspect_stage = {},
              const std::function<void(Job&)>& each_step = {},
              const std::function<void(PipelineJob&)>& each_stage_step = {},
              const std::function<void(Job&)>& setup = {},
              const std::function<void(PipelineJob&)>& setup_stage = {});

// Trains cfg for train.steps steps on world_size(cfg.layout) in-process ranks. `observers`
// receive rank 0's metrics. `inspect`, when given, is called once per data-parallel replica after
// its last step, one rank at a time (tests read every replica's weights and moments there);
// pipeline layouts hand their stages to run_pipeline's own inspect instead (pipeline.h).
// `each_step` / `each_stage_step` and `setup` / `setup_stage` as for run_rank (pipeline layouts
// call the second of each; they run on every rank's thread at once).
void run_layout(const Config& cfg, const std::vector<Observer*>& observers,
                const std::function<void(Job&)>& inspect = {},
                const std::function<void(Job&)>& each_step = {},
                const std::function<void(PipelineJob&)>& each_stage_step = {},
                const std::function<void(Job&)>& setup = {},
                const std::function<void(PipelineJob&)>& setup_stage = {});

}  // namespace px
