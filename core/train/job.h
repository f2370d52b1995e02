// The trainer: one per rank, for every layout. A Job owns the model (the whole of it, or the
// layers of its pipeline stage, or its tensor-parallel shard of those), the optimizer (or its ZeRO
// shard) and the data source of one config, and runs optimizer steps by executing its rank's
// schedule of actions (core/parallel/schedule.h): forward and backward of microbatches on its
// model chunks, with messages to the neighbouring pipeline stages. A single device is the trivial
// schedule (forward, backward, for each microbatch); the layout (core/parallel/mesh.h) is made
// and checked once, and the Job only reads it. It evaluates the validation loss every N steps
// and streams metrics to observers (the CLI's progress bar, the run file, core/job_view.h).
//
// Why every bit equals the single device's under every layout: see core/parallel/pipeline.h
// (stages, data and tensor parallelism within a stage), core/parallel/zero.h (ZeRO) and
// core/parallel/tp_model.h (tensor and sequence parallelism) and core/parallel/context_parallel.h
// (context parallelism: a rank runs the model on its T/cp zig-zag tokens of every sequence of its
// replica; its token nodes, the maximal nodes of the batch's tree inside its chunks, combine with
// every dp and cp rank's over RankGroups::data; the losses are gathered to their logical places
// before the canonical mean).
//
// Index
//   RankGroups    this rank's communicators: the pipeline, data-, context- and tensor-parallel
//                 groups
//   MemoryStats   a rank's bytes by what they are for
//   RunView       what observers read of a running job, on the job's thread
//   StepHooks     hooks around each step and each microbatch gradient (faults, tests, tools)
//   EventKind, RunEvent  what an event says happened
//   LocalSnapshot one rank's state between steps, for re-running steps (the replica check)
//   Observer      receives metrics as they happen
//   router_values the MoE router statistics as named values
//   Job           construction makes the rank's model; step(), evaluate(), run()
//   absorb        a rank's part of the logical state (core/io/state.h)
#pragma once
#include "core/base/arena.h"
#include "core/base/metrics.h"
#include "core/comm/comm.h"
#include "core/base/config.h"
#include "core/model/model.h"
#include "core/model/optimizer.h"
#include "core/parallel/mesh.h"
#include "core/parallel/tree_exchange.h"
#include "core/train/loss_scaler.h"
#include "core/model/probe.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace px {

class TokenSource;
class ZeroShards;
class ZeroUnits;
class TreeAccumulator;
class EpExchange;  // core/parallel/expert_parallel.h
class CheckpointReader;  // core/io/checkpoint.h
struct RankState;        // core/parallel/state_slices.h

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

// Bytes a rank holds, by what they are for (core/parallel: per-rank memory accounting).
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
// (core/parallel/context_parallel.h); cp = 1: nothing.
struct CpStats {
    int cp = 1;
    std::string method;                 // "ring", "ulysses"
    double comm_bytes_per_step = 0;     // measured: sent in the cp group, mean over training steps
    double comm_bytes_formula = 0;      // cp_costs
    double attention_bytes = 0;         // measured: one activation set's att, dpreatt and datt
    double attention_bytes_formula = 0;  // cp_costs
};

// Expert parallelism's traffic on a rank, measured against ep_comm_bytes' formula
// (core/parallel/expert_parallel.h); ep = 1: nothing.
struct EpStats {
    int ep = 1;
    double comm_bytes_per_step = 0;  // measured: the ep group's all-to-alls, mean over steps
    double comm_bytes_formula = 0;   // ep_comm_bytes: evenly spread routing, every slot kept
};

// What observers may read of a running job. Observers are called on the job's thread, between
// steps; nothing here may be read from another thread while the job runs (core/job_view.h is
// the thread-safe view). Observers see world rank 0.
class RunView {
public:
    virtual ~RunView() = default;
    virtual const Config& config() const = 0;
    virtual i64 num_params() const = 0;  // of the whole model
    virtual i64 steps_done() const = 0;
    virtual const std::vector<StepMetrics>& history() const = 0;  // the job's thread only
    virtual int dp_size() const = 0;
    virtual double entropy_rate() const = 0;  // of the source, nats/token, when known (else -1)
    virtual double loss_floor() const = 0;    // minimal loss on validation windows (else -1)
    virtual MemoryStats memory() const = 0;   // this rank's
    virtual CpStats cp_stats() const { return {}; }  // this rank's (layout.cp > 1)
    virtual EpStats ep_stats() const { return {}; }  // this rank's (layout.ep > 1)
};

// What a StepHooks::judge decides about a step's update.
struct UpdateChoice {
    bool apply = true;     // false: the step's update is skipped (its batch is not drawn again)
    double clip_norm = 0;  // > 0: clip the gradient to this global norm (with train.grad_clip)
};

// Hooks around each optimizer step, on every rank: the fault injector (core/train/faults.h),
// and tests and tools that wrap a job from outside (a planted bug, a tracer). Empty members do
// nothing. `step` is the 1-based step being run. A job runs every StepHooks added, in order.
struct StepHooks {
    std::function<void(i64 step)> before;  // before anything of the step happens
    // A microbatch's gradient as its backward leaves it, before it joins the other microbatches
    // and replicas: floats [lo, hi) of `grads` (a GradLayout buffer; a chunk's span, or under
    // ZeRO-2/3 one unit's) hold this rank's local microbatch `microbatch` of the step.
    std::function<void(i64 step, int microbatch, float* grads, i64 lo, i64 hi)> microbatch_grad;
    // The step's reduced gradient (a GradLayout buffer; ZeRO-2/3: this rank's shard of it, the
    // rest reads 0), before the norm and the update read it.
    std::function<void(i64 step, float* grads)> grads;
    // Once the step's loss and gradient norm are known (the same on every rank), before the
    // update: whether to apply it, and a clipping norm of its own (core/train/spikes.h). Every
    // rank must answer alike. The update runs when every judge says apply; the smallest clip
    // norm given (> 0) joins train.grad_clip.
    std::function<UpdateChoice(i64 step, const StepMetrics& m)> judge;
    std::function<void(i64 step)> updated;  // after the update: the weights of the step are final
    // Around each compute action of the rank's schedule (the forward or the backward of one
    // microbatch and chunk, core/parallel/schedule.h): done = false just before it, true just
    // after it. A tracer measures the stage's work with it (the workbench's pipeline timeline).
    std::function<void(i64 step, const Action& a, bool done)> compute;
};

// One rank's training state between steps, copied out and back in without communication, so
// that steps can be re-run on the same rank (the replica check of core/train/faults.h): the
// weights it holds (under ZeRO-3 its shard of them), its Adam moments, the second copy of the
// next rank's shard it keeps for the replica check (Job::check_updates), the step count and the
// history.
struct LocalSnapshot {
    std::vector<float> params, m, v;
    std::vector<float> checked_w, checked_m, checked_v;
    i64 step = -1;  // steps done; -1: empty
    std::vector<StepMetrics> history;
    LossScaleState scaler;  // fp16's loss scale (core/train/loss_scaler.h)
    std::vector<float> fp8;  // fp8's scales and amax histories (core/model/fp8.h)
};

// A ZeRO shard as the replica check reads it: elements [lo, hi) of the rank's parameter table,
// its weights and Adam moments (w == nullptr: none).
struct ShardState {
    int dp_rank = -1;  // whose shard it is
    i64 lo = 0, hi = 0;
    const float* w = nullptr;
    const float* m = nullptr;
    const float* v = nullptr;
};

// A named per-step value beyond StepMetrics (a layer's gradient norm, core/train/spikes.h).
struct NamedValue {
    std::string name;  // the run file's metric, e.g. "layer.h.3.grad_norm" (no '/')
    double value = 0;
};

// The named values of the MoE layers' router statistics (Job::router_stats), per MoE layer l:
// moe.h.<l>.drop_fraction, balance (E·Σ f_i·P_i averaged over sequences: 1 when balanced),
// aux_loss (moe_aux_loss × balance), z_loss, router_entropy (mean nats), tokens.<e>.
std::vector<NamedValue> router_values(const ModelConfig& mc, const std::vector<RouterStats>& st);

enum class EventKind {
    resume,      // the run started from a checkpoint (logged by the view at on_start)
    rerun,       // a step ran again and replaced the rows from it on (logged by the view)
    checkpoint,  // a checkpoint was saved (the job's side: add_event)
    fault,       // a fault was detected or injected (the job's side: add_event)
    failure,     // the run stopped with an error (fail)
    alert,       // a monitor's alert (the FP8 drift monitor: Job::report_event)
    spike,       // a loss spike, its evidence, verdict and action (core/train/spikes.h)
};
const char* event_kind_name(EventKind k);  // "resume", ..., as the run file's /events/kind
// The kind a run file's /events/kind names; false for a word that is none of them.
bool event_kind_from_name(const std::string& name, EventKind* k);

struct RunEvent {
    i64 step = 0;  // the step it happened at (after that step's update; 0: before any)
    EventKind kind = EventKind::fault;
    std::string message;  // a sentence for people
    // Values that go with it (a spike's per-layer values as its first run saw them), maybe none.
    std::vector<NamedValue> evidence = {};
};

class Observer {
public:
    virtual ~Observer() = default;
    virtual void on_start(const RunView&) {}
    // Named values of a step, before that step's on_step (Job::emit_values). A step that is run
    // again sends them again.
    virtual void on_values(const RunView&, i64 /*step*/, const std::vector<NamedValue>&) {}
    virtual void on_step(const RunView&, const StepMetrics&) {}
    virtual void on_end(const RunView&) {}
    // What a tool beside the job reports through it (Job::report_event, report_fp8): an event as
    // it happens (an alert, a spike), and the FP8 drift monitor's rows of one step (before that
    // step's on_step; a step run again reports its rows again).
    virtual void on_event(const RunView&, const RunEvent&) {}
    virtual void on_fp8(const RunView&, const std::vector<Fp8Stat>&) {}
};

struct LogicalState;  // core/io/state.h

class Job : public RunView {
public:
    // A job on one device: the config's layout must be of one rank (ConfigError otherwise).
    explicit Job(const Config& cfg);
    // One rank of `layout` (made by make_layout from cfg, validated once): its groups must have
    // the layout's sizes (a ConfigError names both numbers).
    Job(const Config& cfg, const Layout& layout, RankGroups groups);
    ~Job() override;
    Job(const Job&) = delete;
    Job& operator=(const Job&) = delete;

    void add_observer(Observer* obs) { observers_.push_back(obs); }
    // A tool beside the job (core/train/fp8_monitor.h, core/train/spikes.h) reports to the job's
    // observers: world rank 0's (other ranks have none). On the job's thread, between a step's
    // update and its on_step (a StepHooks `updated`), or after the step (RankGuards).
    void report_event(const RunEvent& e);
    void report_fp8(const std::vector<Fp8Stat>& rows);
    void emit_values(i64 step, const std::vector<NamedValue>& values);  // on_values
    // Called on every rank after each step, after the observers (checkpoints: a collective).
    void set_after_step(std::function<void(Job&)> f) { after_step_ = std::move(f); }
    void add_step_hooks(StepHooks hooks) { hooks_.push_back(std::move(hooks)); }
    // run() stops after this step, the learning-rate schedule staying train.steps' (a golden
    // trace recorded fewer steps than the job has).
    void stop_after(i64 step) { stop_after_ = step; }
    // Probes (core/model/probe.h) on every step from now on (null: none; not owned, must outlive the
    // job's steps): the model's fwd/bwd probes at the batch rows each microbatch holds, each
    // microbatch's gradient ("mgrad": of a chunk before it joins the others, under ZeRO-2/3 of a
    // unit before its reduce-scatter), then "grad" for every parameter where the grads hooks
    // run, "optim" after the update. Under ZeRO only this rank's shard of a tensor is valid: its
    // pieces are the flat shard [lo, hi) of the arena cut into slabs (flat_shard), of the tp
    // shard's pieces under tensor parallelism (ParallelLayers::param_shard); a stage offers the
    // tensors it holds (the tied wte from both stages that hold it). Evaluation is never probed.
    // "optim" also holds what else the step leaves that must be the same under every layout:
    // precision.fp8's delayed scales and amax histories ("optim/-/fp8/scale", (gemms, roles);
    // "optim/-/fp8/amax_history", (gemms · roles, history_len)) and fp16's dynamic loss scale
    // ("optim/-/loss_scaler/state": the next step's scale and its growth tracker), every rank a
    // whole copy.
    void set_probes(ProbeSink* sink) { probes_ = sink; }
    ProbeSink* probes() const { return probes_; }  // null: none
    // This rank's state between steps, and back (no communication; every rank of the job must
    // rewind to the same step before the next one).
    void snapshot(LocalSnapshot& into) const;
    void rewind(const LocalSnapshot& s);
    // The replica check (core/train/faults.h) under ZeRO >= 1 with dp > 1, where a shard's update
    // has one owner and so nothing to compare with: from now on this rank also reduces the
    // gradient shard of the next dp rank ((dp rank + 1) mod dp; ZeRO-2/3), and keeps a second,
    // independent copy of that shard's weights and Adam moments, updated every step as the owner
    // updates its own. Starts from the owner's state. Collective over the dp group; does nothing
    // without ZeRO shards.
    void check_updates();
    ShardState own_shard() const;      // under ZeRO >= 1 with dp > 1
    ShardState checked_shard() const;  // after check_updates

    // The logical, layout-free state (what checkpoints hold) out of a job of any layout: a
    // collective of every group that gives every rank the whole model's weights and Adam
    // moments, laid out as ParamTable::build(config().model) (null pointers are skipped). Throws
    // InternalError if two stages' copies of wte differ.
    void gather_full(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v);
    // Collective over the dp group: ZeRO's shards of the Adam moments (and ZeRO-3's weights) are
    // gathered, so every replica holds its whole state, as under ZeRO-0 (later steps run so).
    void unshard();

    // ---- per-rank checkpoints (core/parallel/state_slices.h) --------------------------------
    // No communication, and never the whole model on one rank. rank_state: this rank's weights
    // and Adam moments and its share of a checkpoint (each logical element written by one rank
    // of the world: the stage that owns a tensor, wte the first; its dp replica's cut of it; a
    // tp-sharded tensor by every tp rank, a replicated one by tp rank id mod tp). restore_local
    // reads the pieces this rank holds from an open checkpoint (hyperslabs; the last stage's
    // copy of wte too) and continues after history.size() steps exactly as the run that wrote
    // it would; the caller verified the file and serialises HDF5 calls across threads.
    RankState rank_state();
    void restore_local(const CheckpointReader& file, const std::vector<StepMetrics>& history);

    // One optimizer step over train.batch_size sequences. Every rank returns the same metrics,
    // except comm_bytes (this rank's).
    StepMetrics step();
    double evaluate();  // mean validation loss over train.val_batches batches (every rank)
    void run();         // the remaining steps, with evaluation, observers and the llm.c export

    const Config& config() const override { return cfg_; }
    const Layout& layout() const { return layout_; }
    const Schedule& schedule() const { return schedule_; }
    i64 num_params() const override;  // of the whole model, also when this rank holds a part
    GPT& model() { return *model_; }
    const GPT& model() const { return *model_; }
    AdamW& optimizer() { return *opt_; }  // under ZeRO: the moments of [lo, hi)
    const AdamW& optimizer() const { return *opt_; }
    const TokenSource& source() const { return *source_; }
    // fp16's dynamic loss scale; a scale of 1 that never moves otherwise. restore_local and
    // rewind set its state; checkpoints keep it under /scaler.
    const LossScaler& loss_scaler() const { return scaler_; }
    // precision.fp8's scales and histories (null when off), the same on every rank.
    const Fp8Scaling* fp8() const { return fp8_.get(); }
    // The last step's complete gradients (GradLayout; ZeRO-2/3: this rank's shard, the rest 0).
    float* grads() const;

    // ---- data order (core/train/spikes.h) ---------------------------------------------------
    // Step s (0-based index) draws batch batch_index(s): s itself, moved past every skipped batch
    // (the batches in order, minus the skipped ones). A batch swapped for one step (swap_batch)
    // goes before that. The skipped batches are kept in checkpoints (/data skipped_batches).
    i64 batch_index(i64 step) const;
    void skip_batches(const std::vector<i64>& batches);  // 0-based batch indices
    const std::vector<i64>& skipped_batches() const { return skipped_; }
    // The next run of step `step` (1-based) draws `batch` instead; once.
    void swap_batch(i64 step, i64 batch) { swap_step_ = step, swap_batch_ = batch; }

    // ---- per-tensor statistics (collectives over the tp, dp and pp groups) ------------------
    // Per tensor of the whole model (by id), Σx² of a buffer laid out as this rank's parameter
    // table, the same on every rank: the canonical per-tensor sums the gradient norm is made of
    // (grad_norm's). zero_shard: only floats [lo, hi) of this rank's ZeRO shard are valid (the
    // elements it updates: update_range), summed over the dp group.
    std::vector<float> tensor_sums_of_squares(const float* buf, bool zero_shard);
    // The same sums of the last step's reduced gradient, as the gradient norm used them.
    const std::vector<float>& grad_sums_of_squares() const { return grad_sq_; }
    // Floats [lo, hi) of the parameter table whose update this rank computes (its ZeRO shard, or
    // all), and whether that is a shard.
    Range update_range() const;
    bool zero_sharded() const { return shards_ != nullptr; }
    int zero_stage() const { return zero_; }  // the ZeRO stage this rank runs (0 when unsharded)
    // Max over the tp, dp and pp groups, in place (exact in any order).
    void all_reduce_max(float* v, i64 n);
    // Max attention logit per layer of the whole model (-inf: none) over the step's forwards,
    // recorded while watch_logits(true), reduced over the groups at the step's end.
    void watch_logits(bool on);
    const std::vector<float>& logit_max() const { return logit_max_; }
    // MoE router statistics of the last step, per layer of the whole model (core/model/moe.h),
    // summed over the dp and pp groups; empty without MoE. Offered to the observers each step
    // as named values moe.h.<l>.{drop_fraction, balance, aux_loss, z_loss, router_entropy,
    // tokens.<e>} (router_values).
    const std::vector<RouterStats>& router_stats() const { return router_stats_; }
    i64 steps_done() const override { return step_; }
    const std::vector<StepMetrics>& history() const override { return history_; }
    MemoryStats memory() const override;
    CpStats cp_stats() const override;  // job_cp.cpp
    EpStats ep_stats() const override;  // job_ep.cpp
    int pp_rank() const { return pp_rank_; }
    int pp_size() const { return layout_.pp; }
    int dp_rank() const { return dp_rank_; }
    int dp_size() const override { return layout_.dp; }
    int tp_rank() const { return tp_rank_; }
    int tp_size() const { return layout_.tp; }
    int cp_rank() const { return cp_rank_; }
    int cp_size() const { return layout_.cp; }
    i64 local_seq_len() const { return Tl_; }  // T/cp: the tokens of a sequence this rank runs
    const RankGroups& groups() const { return groups_; }
    double loss_floor() const override;
    double entropy_rate() const override;
    // Activation sets made for chunk c: the most (microbatch, chunk) forwards held at once (plus
    // any whose outgoing message was still in flight), e.g. min(pp, m) on 1F1B's first stage.
    int activation_sets(int chunk) const;
    i64 activation_bytes() const;  // all of them

private:
    struct Slot {  // one microbatch's activations on one chunk, and its outgoing message
        Activations acts;
        comm::Handle pending;
    };
    void build_model();
    Slot* acquire(int chunk);
    void release(int chunk, Slot* s);
    void wait_sends();
    void run_actions();
    void compute_hooks(const Action& a, bool done);  // StepHooks::compute of every hook
    void backward(Slot& slot, int chunk, int m);
    void microbatch_grad(int m, float* grads, i64 lo, i64 hi);  // probes and hooks
    void probe_update();  // the "optim" probes of the step just done
    void set_probe_rows(int m);
    i64 first_row(int m) const;  // microbatch m's first sequence in the step's batch
    void reduce_grads(float* g);
    void combine_nodes_across_replicas(float* g);
    void exchange_tied_grads(float* g);
    // The loss scale's part of a step: g unscaled where this rank holds it complete, then whether
    // every rank's gradient is finite (one flag reduced over tp, dp and pp: the same answer
    // everywhere).
    void unscale_grads(float* g);
    bool grads_finite_everywhere(const float* g);
    // fp8: the step's amaxes, max over the tp, dp and pp groups, make the next step's scales.
    void update_fp8_scales();
    float grad_norm(float* g);
    double step_loss();
    void gather_losses(std::vector<float>& all, const std::vector<float>& local, i64 batches,
                       bool by_microbatch);
    bool first_stage() const { return pp_rank_ == 0; }
    bool last_stage() const { return pp_rank_ == layout_.pp - 1; }
    bool is_last_virtual(int chunk) const;
    const int* tokens(int m) const {
        return (layout_.cp > 1 ? cp_inputs_ : inputs_).data() + m * micro_B_ * Tl_;
    }
    const int* targets(int m) const {
        return (layout_.cp > 1 ? cp_targets_ : targets_).data() + m * micro_B_ * Tl_;
    }
    // Context parallelism (core/train/job_cp.cpp): the token nodes and plan over the data group,
    // a rank's tokens (B, T/cp) of full (B, T) rows, and every rank's losses to logical places.
    void build_cp_leaves();
    void localise(int* out, const int* full, i64 B) const;
    void gather_cp_losses(std::vector<float>& all, const std::vector<float>& local, i64 batches);
    comm::Communicator* data_group() const { return layout_.cp > 1 ? groups_.data : groups_.dp; }
    // The replicas that shard ZeRO's state: the dp group, or under expert parallelism the
    // expert-data group (the dp ranks whose local arrays are the same: same experts).
    comm::Communicator* zero_group() const {
        return layout_.ep > 1 ? groups_.expert_data : groups_.dp;
    }
    // Expert parallelism (core/train/job_ep.cpp): the model's expert layers over the ep group,
    // per chunk and ep-group rank (source) an accumulator of the gradients of this rank's experts
    // over that source's token nodes, and after backward their combination over the sources and
    // the expert-data group (the owners of the same experts), written over g's expert tensors.
    void build_ep();
    void ep_begin_backward(int chunk, int m);
    void ep_end_backward(int chunk, int m);
    void reduce_expert_grads(float* g);
    int ep_rank_ = 0;
    std::shared_ptr<EpExchange> ep_;
    std::vector<Arena> ep_grads_;                      // per source: its first target's buffer
    std::vector<std::vector<TreeAccumulator>> ep_acc_;  // per chunk, per source
    // Per source and microbatch: its token nodes as batch tokens [lo, hi).
    std::vector<std::vector<std::vector<Range>>> ep_leaf_tokens_;
    NodePlan ep_plan_;  // per expert-data rank: its sources' targets, source after source
    std::vector<float> ep_values_;
    // Bytes this rank has sent, over the rows of c's book that keep accepts (all when null).
    static double book_bytes_sent(const comm::Communicator* c,
                                  bool (*keep)(const comm::StatRow&) = nullptr);
    double bytes_sent() const;
    double cp_bytes_sent() const;  // in the cp group
    double cp_sent_ = 0;           // training steps' cp traffic so far (this process)
    i64 accounted_steps_ = 0;      // training steps cp_sent_ and ep_sent_ cover
    double ep_bytes_sent() const;  // by the ep group's all-to-alls
    double ep_sent_ = 0;           // training steps' ep traffic so far (this process)

    Config cfg_;
    Layout layout_;
    Numerics nx_;
    Mesh mesh_;
    Schedule schedule_;
    RankGroups groups_;
    int pp_rank_ = 0, dp_rank_ = 0, tp_rank_ = 0, cp_rank_ = 0;
    i64 T_ = 0, micro_B_ = 0, local_B_ = 0;
    i64 Tl_ = 0;  // tokens of a sequence on this rank: T/cp
    i64 msg_lo_ = 0, msg_n_ = 0;  // a message: elements [msg_lo_, +msg_n_) of a (B,T,C) state
    Tensor message(const Tensor& state) const { return subview(state, msg_lo_, {msg_n_}); }
    bool recompute_ = false;
    int zero_ = 0;                  // ZeRO stage over dp (0 when dp = 1)
    std::vector<ModelPart> parts_;  // every pp rank's, for the norm's owners and gather_full
    std::vector<int> owner_;        // per tensor id of the whole model: the pp rank owning it
    std::unique_ptr<GPT> model_;
    std::unique_ptr<AdamW> opt_;
    std::unique_ptr<TokenSource> source_;
    LossScaler scaler_;
    std::shared_ptr<Fp8Scaling> fp8_;  // precision.fp8 != "off"; shared with the model
    std::unique_ptr<ZeroShards> shards_;  // ZeRO >= 1 with dp > 1
    std::unique_ptr<ZeroUnits> units_;    // ZeRO-2/3 with dp > 1 on one stage (zero.h)
    std::unique_ptr<AdamW> checked_opt_;  // check_updates: the next rank's shard, a second copy
    std::vector<float> checked_w_;        // of its moments and its weights
    Arena grads_;                         // the step's gradient (GradLayout), fp32
    std::vector<TreeAccumulator> acc_;    // per chunk (not under ZeroUnits)
    // Per microbatch: token rows [lo, hi) of each of its nodes of the batch's token tree (one
    // when its range is a node), in TreeAccumulator::leaves order.
    std::vector<std::vector<Range>> leaf_rows_;
    NodePlan plan_;  // every replica's nodes of the batch's token tree (not under ZeroUnits)
    std::vector<float> node_values_;  // combine_nodes_across_replicas' rows, reused every step
    std::vector<std::vector<std::unique_ptr<Slot>>> slots_;  // per chunk: every set made
    std::vector<std::vector<Slot*>> free_;                   // per chunk: sets not in use
    std::vector<std::vector<Slot*>> live_;                   // per chunk, per microbatch

    std::vector<Observer*> observers_;
    std::function<void(Job&)> after_step_;
    std::vector<StepHooks> hooks_;
    i64 stop_after_ = INT64_MAX;
    ProbeSink* probes_ = nullptr;
    ProbeContext probe_ctx_;

    i64 step_ = 0;
    std::vector<int> windows_;           // (local_B, T+1), microbatch after microbatch
    std::vector<int> inputs_, targets_;  // (local_B, T): microbatch m at m·micro_B·T
    std::vector<int> cp_inputs_, cp_targets_;  // cp > 1: (local_B, T/cp), this rank's tokens
    std::vector<PositionRun> cp_runs_;         // cp > 1: where they sit in each sequence
    std::vector<float> losses_;          // (local_B·T/cp), last stage: this rank's
    std::vector<float> all_losses_;      // (batch_size·T), last stage: every replica's
    std::vector<StepMetrics> history_;
    std::vector<i64> skipped_;  // batches never drawn (sorted)
    i64 swap_step_ = -1, swap_batch_ = -1;
    std::vector<float> grad_sq_;    // per tensor id: Σg² of the last step
    bool watch_logits_ = false;
    std::vector<float> logit_max_;  // per model layer
    std::vector<RouterStats> router_stats_;  // per model layer (MoE models)
    void begin_router_stats();        // core/train/router_stats.cpp
    void end_router_stats(i64 step);  // reduce, then offer to the observers
};

// The rank's part of the logical state, after Job::unshard (or its ZeRO slice of the moments):
// its tensors go to their places in the whole model by tensor id, a tensor-parallel shard's
// elements to their logical places (tp_model.h logical_indices). Every element two ranks hold
// (replicas, replicated tensors, the two stages' wte) must agree, and so must the histories:
// returns false otherwise.
bool absorb(LogicalState& state, const Job& job);

}  // namespace px
