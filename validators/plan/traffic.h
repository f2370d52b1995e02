// What one rank of a layout communicates in one training step, operation by operation, as the
// runtime's algorithms send it: the requests its parts issue (element counts and per-rank counts
// as they pass them), each priced by comm::traffic(), the function that fills the communicators'
// accounting. So a step's predicted bytes per group and operation are the stats book's
// (tests/planner checks them against measured runs, byte for byte), and the planner times them.
//
// Index
//   Phase            when in the step an operation runs, which decides what it overlaps
//   PlannedOp        one operation of a rank's step: group, request, calls per step, what for
//   step_traffic     every operation of one training step of one rank
//   GroupOpBytes, by_group_op   the same summed per (group, op): the stats book's rows
//
// Sources, part by part (each mirrors the seam that sends it):
//   data      the gradient reduction (core/parallel/data/part.cpp reduce_grads: all_reduce, the
//             tree exchange of core/parallel/tree_exchange.h, ZeRO's reduce-scatter cut and
//             gathers of core/parallel/data/zero.h, unit by unit under ZeroUnits), the step's
//             losses (all_gather over the replicas on the last stage), ZeRO-2/3's sums of squares
//   tensor    per microbatch and layer the tree exchanges of the row-parallel forwards and the
//             column-parallel backwards (tensor_parallel.cpp reduce_partials), the embedding's
//             all_reduce, the vocabulary-parallel cross-entropy; the gradient norm's block sums
//   pipeline  per microbatch and virtual-stage boundary an activation and a gradient message,
//             the tied embedding's exchange, the loss broadcast and the norm's all_gather
//   context, expert  cp_costs and ep_comm_bytes (their parts' formulas; not byte-exact)
#pragma once
#include "core/base/config.h"
#include "core/comm/request.h"
#include "core/comm/stats.h"
#include "core/parallel/mesh.h"

#include <string>
#include <vector>

namespace px::plan {

enum class Phase {
    forward,    // inside a microbatch's forward (tensor parallel; never overlapped)
    backward,   // inside a microbatch's backward (tensor parallel; never overlapped)
    boundary,   // between pipeline stages (per microbatch, on the schedule's critical path)
    gradients,  // the step's gradient reduction (overlaps the last microbatch's backward)
    gather,     // ZeRO-3's weight gathers before each unit (prefetched under the compute)
    update,     // after the schedule: norms, losses, ZeRO-1/2's gathered weights (exposed)
};
const char* phase_name(Phase p);

struct PlannedOp {
    std::string group;  // "dp", "tp", "pp", "cp", "data", "ep", "edp": the runtime's names
    int size = 1, rank = 0;  // the group, and this rank in it
    comm::Request req;       // what the part passes (element counts, per-rank counts)
    double calls = 1;        // per step
    Phase phase = Phase::update;
    std::string what;  // "gradient all-reduce", "attn.proj forward", ...
    // Bytes this rank sends and receives per call (comm::traffic).
    comm::Traffic bytes() const { return comm::traffic(req, rank, size); }
};

// Every operation of a training step (not the first step's or evaluation's extra work) of the
// rank at `at`. cfg's [layout] is the layout's; throws ConfigError when it is not valid.
std::vector<PlannedOp> step_traffic(const Config& cfg, const Coord& at);

struct GroupOpBytes {
    std::string group, op;
    double calls = 0, sent = 0, recv = 0;
};
std::vector<GroupOpBytes> by_group_op(const std::vector<PlannedOp>& ops);

}  // namespace px::plan
