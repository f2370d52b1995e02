// The layout planner (docs/planner.md): for a job config and N devices of a cluster file, every
// layout the runtime accepts, each with its memory per rank, step time and MFU predicted, ranked.
//
// Index
//   TimeTerms        a step's time, term by term
//   Candidate        one layout and what it is predicted to cost
//   PlanOptions      devices, how many rows, what to enumerate
//   Plan             every candidate, the fitting ones first by step time
//   plan_layouts     enumerate, predict, rank
//   predict          one layout (a config whose [layout] is set) on a cluster
//   model_flops      a step's model FLOPs (6·N·tokens + attention), and its matmul parameters
//   sim_options      F, B (and W) in slots for check_schedule
//   plan_json        the plan as JSON (schema "parallax-plan")
//
// The model (docs/planner.md has the formulas):
//   memory     estimate_memory (core/train/memory.h), the estimate the runtime checks its budget
//              with, for one rank of the layout (the larger of its first and last stage)
//   compute    FLOPs of each microbatch's forward and backward on a stage (6·params·tokens plus
//              attention's 12·L·T·C per token; MoE: the routed experts a token uses; recompute
//              adds a forward), at the cluster's peak for the activation dtype × achievable
//   comm       every operation of step_traffic (traffic.h), timed on its group's link: NVLink
//              inside a node, InfiniBand across (a group that spans nodes runs at IB speed);
//              ring or tree, whichever is faster, with a latency and a bandwidth term
//   schedule   the layout's own schedule run by check_schedule with each chunk's forward and
//              backward (compute, tensor-parallel collectives, stage messages) in slots; the
//              makespan is the pipeline's time, its idle part the bubble
//   overlap    the gradient reduction overlaps the last microbatch's backward but for its last
//              layer's bucket (Megatron, FSDP); ZeRO-3's gathers are prefetched under compute
//              but for one unit; tensor-parallel collectives and the rest are exposed
//   step       pipeline + exposed gradient reduction + exposed gathers + update collectives
//   MFU        model FLOPs (no recompute) / (step × devices × peak)
#pragma once
#include "core/base/config.h"
#include "core/parallel/pipeline/schedule.h"
#include "core/train/memory.h"
#include "validators/plan/cluster.h"

#include <string>
#include <vector>

namespace px::plan {

struct TimeTerms {
    double compute = 0;      // the bottleneck stage's forwards and backwards (recompute included)
    double tp_comm = 0;      // tensor-parallel collectives inside them (never overlapped)
    double pp_comm = 0;      // stage-to-stage messages on the schedule's path
    double bubble = 0;       // the schedule's idle time on the bottleneck stage
    double dp_comm = 0;      // the gradient reduction, whole
    double dp_exposed = 0;   // of it, what does not overlap the backward
    double gather = 0;       // ZeRO-3's weight gathers, whole
    double gather_exposed = 0;
    double update = 0;       // collectives after the schedule: norm, losses, ZeRO-1/2 gathers
    double other = 0;        // context and expert parallelism's traffic (formulas)
    double step = 0;         // the sum of the exposed terms
};

// The exposed terms, whose sum is the step, with the names the plan shows them by.
struct TimeTermName {
    const char* name;
    double TimeTerms::*field;
};
inline constexpr TimeTermName kTimeTerms[] = {
    {"compute", &TimeTerms::compute},
    {"tp comm", &TimeTerms::tp_comm},
    {"pp messages", &TimeTerms::pp_comm},
    {"bubble", &TimeTerms::bubble},
    {"dp reduction (exposed)", &TimeTerms::dp_exposed},
    {"ZeRO-3 gathers (exposed)", &TimeTerms::gather_exposed},
    {"update collectives", &TimeTerms::update},
    {"cp/ep traffic", &TimeTerms::other},
};

// A time as the plan prints it: "1.23 s", "45.6 ms", "789 us".
std::string format_seconds(double s);

struct Candidate {
    int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1, zero = 0, microbatches = 1, virtual_stages = 1;
    std::string schedule, recompute;  // names as the config writes them
    std::vector<MemoryItem> memory;   // estimate_memory's parts, one rank
    double memory_bytes = 0;
    bool fits = false;  // memory_bytes <= the cluster's usable HBM
    TimeTerms time;
    double schedule_bubble = 0;  // check_schedule's idle fraction
    double model_flops = 0;      // per step, all devices
    double mfu = 0, tokens_per_s = 0;
    double comm_bytes = 0;  // sent per step by the bottleneck rank (comm::traffic)
    std::string label() const;  // "dp8 tp8 pp16 zero1 1f1b m192 recompute"
};

struct PlanOptions {
    int gpus = 1;
    // Restrict the search (empty: everything); tests and the bench pin a layout this way.
    std::vector<int> only_tp, only_pp, only_cp;
};

struct Plan {
    std::string config, cluster;
    int gpus = 0;
    std::vector<Candidate> candidates;  // fitting ones by step time, then the rest by memory
    int fitting = 0;
    int rejected = 0;  // layouts the runtime's rules refused
    double usable_bytes = 0;
};

// ConfigError when gpus < 1, or nothing can be enumerated for them (no mesh of the model fits
// the runtime's rules: the message names the first rule that failed).
Plan plan_layouts(const Config& cfg, const ClusterSpec& cluster, const PlanOptions& opt);

// One layout: cfg's [layout] as it is (make_layout validates it; ConfigError otherwise).
Candidate predict(const Config& cfg, const ClusterSpec& cluster);
struct ModelFlops;
// The same with the model's FLOPs computed once (model_flops(cfg.model)) for many layouts.
Candidate predict(const Config& cfg, const ClusterSpec& cluster, const ModelFlops& flops);

struct ModelFlops {
    double per_token_forward = 0;  // whole model, one token (matmuls and attention)
    double layer_forward = 0;      // one layer's, per token (the mean over dense and MoE)
    double head_forward = 0;       // the LM head's, per token
    double matmul_params = 0;      // active parameters in matmuls (N of 6·N)
};
ModelFlops model_flops(const ModelConfig& mc);

// Forward, backward (and, for schedules that split it, weight-gradient) costs in whole slots for
// check_schedule: the forward is `scale` slots, the others in proportion (at least 1).
SimOptions sim_options(double forward_s, double backward_s, double weight_s, int scale = 64);

std::string plan_json(const Plan& p);

}  // namespace px::plan
