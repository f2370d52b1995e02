// A parallelism's part of a rank's trainer. The trainer (core/train/job.h) runs the step's loop:
// draw the batch, run the schedule's forwards and backwards, reduce the gradient, take its norm,
// update. What a parallelism adds to a rank (its buffers, its collectives, its share of the
// state) lives in its part, one module per parallelism under core/parallel/<x>/part.h, and the
// trainer calls every part at the seams below. A layout without a parallelism has no part for
// it, except data and pipeline, whose trivial case (one replica, one stage) is the single device.
//
// Index
//   RankGroups    this rank's communicators: the pipeline, data-, context- and tensor-parallel
//                 groups, and expert parallelism's
//   RankSetup     what every part of a rank reads: config, layout, mesh, groups, coordinates
//   make_rank_setup  checks the groups against the layout and resolves the rank's sizes
//   MemoryStats   a rank's bytes by what they are for
//   CpStats, EpStats, PartStats  context and expert parallelism's traffic, measured
//   ModelPlan     the model a rank builds: which part of it, over which parallel layers
//   StepGrads     the step's gradient buffer and where it holds the reduced gradient
//   EntrySums     the gradient norm's per-tensor sums of squares, as parts fill them in
//   PartState     a part's state in a snapshot between steps (re-running a step)
//   TrainerPart   the seams
//
// The seams, in the order of a job's life. Each part is called in the job's order (tensor,
// context, data, expert, pipeline, precision: core/train/job.cpp), which is the order every
// seam needs: the data part reduces the replicas' gradient before the expert part reduces the
// experts', then the pipeline adds the tied embedding's two halves, then precision unscales.
//   plan           before the model exists: which layers, experts and parallel layers
//   attach         the model exists: hook layers and hooks onto it, size buffers
//   load_weights   model.init_from: the logical tensors into this rank's shards
//   begin_step     before the batch is drawn
//   begin_backward, end_backward  around each microbatch's backward on a chunk
//   after_schedule every forward and backward of the step is done
//   reduce_grads   the microbatch gradients become the step's gradient
//   entry_sums     the gradient norm's parts
//   after_update   the weights of the step are final (or the update was skipped)
//   end_step       the step's accounting
//   begin_eval, end_eval, end_run  around validation forwards, and after the last step
//   save, restore  a snapshot between steps; restore(file) after a checkpoint was read
//   writes         which tensors this rank writes into a checkpoint
//   probe, memory, stats  what the part shows of itself (memory: measured)
// And before any of it, from the config alone: each part's static estimate(...) adds what a rank
// of the layout will hold for it to the memory estimate (core/parallel/estimate.h; summed and
// checked against the budget by core/train/memory.h).
#pragma once
#include "core/base/config.h"
#include "core/comm/comm.h"
#include "core/model/model.h"
#include "core/parallel/mesh.h"
#include "core/parallel/tree_exchange.h"

#include <memory>
#include <string>
#include <vector>

namespace px {

class CheckpointReader;  // core/io/checkpoint.h
class ProbeSink;         // core/model/probe.h

// The groups of one rank of the mesh (core/train/runner.h splits them from the world). A
// null group is a group of one. `world` is only read for the rank's communication accounting.
struct RankGroups {
    comm::Communicator* world = nullptr;
    comm::Communicator* pp = nullptr;  // the pipeline: the same dp and tp rank of every stage
    comm::Communicator* dp = nullptr;  // the replicas of this rank's stage and tp shard
    comm::Communicator* tp = nullptr;  // the ranks that share this stage's layers
    comm::Communicator* cp = nullptr;  // the ranks that share this replica's sequences
    // The dp × cp ranks of this stage and tp shard, ordered by (dp, cp) (Mesh::data_group): the
    // owners of the batch's tokens, over which gradients and losses reduce when cp > 1.
    comm::Communicator* data = nullptr;
    // Expert parallelism (layout.ep > 1; Mesh::ep_group, expert_data_group): the ep consecutive
    // dp ranks that share out the experts, and the dp ranks that hold the same experts.
    comm::Communicator* ep = nullptr;
    comm::Communicator* expert_data = nullptr;
};

// One rank of a layout, as every part of its trainer reads it. Fixed for the job's life.
struct RankSetup {
    Config cfg;
    Layout layout;
    Numerics nx;
    Mesh mesh;
    RankGroups groups;
    Coord at;          // this rank's pp, dp, tp and cp coordinates
    int ep_rank = 0;   // its index in its ep group: dp mod ep
    i64 T = 0;         // tokens of a sequence
    i64 Tl = 0;        // of them on this rank: T/cp
    i64 micro_B = 0;   // sequences of a microbatch
    i64 local_B = 0;   // of a replica's step: micro_B · microbatches

    bool first_stage() const { return at.pp == 0; }
    bool last_stage() const { return at.pp == layout.last_stage_rank(); }  // the loss's stage
    // The owners of the batch's tokens over which gradients and losses reduce: the dp group, or
    // the dp × cp ranks under context parallelism.
    comm::Communicator* data_group() const { return layout.cp > 1 ? groups.data : groups.dp; }
    // The replicas that shard ZeRO's state: the dp group, or under expert parallelism the
    // expert-data group (the dp ranks whose local arrays are the same: same experts).
    comm::Communicator* zero_group() const {
        return layout.ep > 1 ? groups.expert_data : groups.dp;
    }
};

// The setup of the rank the groups belong to; a ConfigError names both numbers when a group's
// size is not the layout's.
RankSetup make_rank_setup(const Config& cfg, const Layout& layout, const RankGroups& groups);

// Bytes a rank holds, by what they are for (measured; core/train/memory.h estimates them).
struct MemoryStats {
    i64 params = 0;       // weights held between steps (ZeRO-3: the pages mapped, measured)
    i64 grads = 0;        // gradient buffers, microbatch partials included (ZeRO-2/3: measured)
    i64 optimizer = 0;    // AdamW moments (this rank's shard)
    i64 activations = 0;  // the activation sets of the microbatches in flight, backward scratch
    i64 comm = 0;         // staging buffers of the collectives
    // The most weights and gradients mapped at once during the last step: under ZeRO-2/3 the
    // shard plus the units in flight (measured at every unit); otherwise params and grads.
    i64 peak_params = 0, peak_grads = 0;
    i64 total() const { return params + grads + optimizer + activations + comm; }
};

// Context parallelism's part of a rank's costs, measured against cp_costs' formulas
// (core/parallel/context/context_parallel.h); cp = 1: nothing.
struct CpStats {
    int cp = 1;
    std::string method;                 // "ring", "ulysses"
    double comm_bytes_per_step = 0;     // measured: sent in the cp group, mean over training steps
    double comm_bytes_formula = 0;      // cp_costs
    double attention_bytes = 0;         // measured: one activation set's att, dpreatt and datt
    double attention_bytes_formula = 0;  // cp_costs
};

// Expert parallelism's traffic on a rank, measured against ep_comm_bytes' formula
// (core/parallel/expert/expert_parallel.h); ep = 1: nothing.
struct EpStats {
    int ep = 1;
    double comm_bytes_per_step = 0;  // measured: the ep group's all-to-alls, mean over steps
    double comm_bytes_formula = 0;   // ep_comm_bytes: evenly spread routing, every slot kept
};

struct PartStats {
    CpStats cp;
    EpStats ep;
};

// What a rank builds: the layers of its pipeline stage (and its share of the experts), run
// through parallel layers (tensor parallelism) or the plain kernels (null).
struct ModelPlan {
    ModelPart part;
    std::shared_ptr<const ParallelLayers> layers;
};

// The step's gradient buffer (a GradLayout buffer, fp32) as the parts reduce it.
struct StepGrads {
    float* g = nullptr;
    // Floats of g that hold the reduced gradient once the data part has reduced it: the whole
    // table, or under ZeRO-2/3 this rank's shard first (and the replica check's second one).
    std::vector<Range> complete;
    bool tied_combined = false;  // dwte = embedding + LM head is formed already (ZeRO-2/3 units)
};

// The canonical Σg² of every tensor of a rank's table (the global gradient norm's parts). The
// first part that can compute them all does (tensor parallelism from its shards' exact
// partials, else the data part: from ZeRO's gradient shards, or locally); the expert part then
// replaces the stacked expert tensors' sums by the ep group's.
struct EntrySums {
    std::vector<char> owned;  // per local entry: this stage owns the tensor (its sum counts)
    // ZeRO-2/3: only floats [lo, hi) of g are this rank's reduced gradient, summed over `group`
    // (null: g is complete).
    comm::Communicator* group = nullptr;
    i64 lo = 0, hi = -1;
    std::vector<float> sums;  // per local entry
    bool done = false;        // sums holds every owned entry's
};

// A part's state between steps, copied out and back without communication.
struct PartState {
    std::vector<float> floats;
    std::vector<i64> ints;
};

class TrainerPart {
public:
    virtual ~TrainerPart() = default;
    virtual const char* name() const = 0;  // "data", "pipeline", ...

    // ---- build ------------------------------------------------------------------------------
    virtual void plan(ModelPlan& /*plan*/) {}
    virtual void attach(GPT& /*model*/) {}
    // model.init_from's logical tensors into this rank's model (`full`: the whole model's
    // table); false when the part does not place them (the trainer then reads its own).
    virtual bool load_weights(GPT& /*model*/, const ParamTable& /*full*/) { return false; }

    // ---- the step ---------------------------------------------------------------------------
    virtual void begin_step() {}
    virtual void begin_backward(int /*chunk*/, int /*microbatch*/) {}
    virtual void end_backward(int /*chunk*/, int /*microbatch*/) {}
    virtual void after_schedule() {}
    virtual void reduce_grads(StepGrads& /*grads*/) {}
    virtual void entry_sums(const float* /*g*/, EntrySums& /*s*/) {}
    // applied: the update ran (false: a judge or the loss scale skipped it).
    virtual void after_update(bool /*applied*/) {}
    virtual void end_step() {}
    // Whether a microbatch's gradient on this rank is only a piece of its token node (context
    // parallelism: a rank's tokens of it; expert parallelism: other ranks' experts).
    virtual bool splits_microbatch_grads() const { return false; }

    // ---- evaluation and the end of the run --------------------------------------------------
    virtual void begin_eval() {}
    virtual void end_eval() {}
    virtual void end_run() {}

    // ---- state ------------------------------------------------------------------------------
    virtual void save(PartState& /*s*/) const {}
    virtual void restore(const PartState& /*s*/) {}
    virtual void restore(const CheckpointReader& /*file*/) {}
    virtual bool writes(const TableEntry& /*e*/) const { return true; }

    // ---- what it shows ----------------------------------------------------------------------
    virtual void probe(ProbeSink& /*sink*/, i64 /*step*/) const {}
    virtual void memory(MemoryStats& /*m*/) const {}
    virtual void stats(PartStats& /*s*/) const {}
};

}  // namespace px
