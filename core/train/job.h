// The trainer: one per rank, for every layout. A Job owns the model (the whole of it, or the
// layers of its pipeline stage, or its tensor-parallel shard of those), the data source of one
// config and the loop of a step: draw the batch, run the rank's schedule of forwards and
// backwards, reduce the gradient, take its norm and the loss, let the judges decide, update. What
// each parallelism adds to a rank lives in its part (core/parallel/part.h: data and ZeRO,
// tensor, pipeline, context, expert; precision in core/train/precision.h), which the job composes
// once and calls at the step's seams; a single device is the composition of one replica and one
// stage, whose schedule is forward then backward of each microbatch. The layout
// (core/parallel/mesh.h) is made and checked once, and the job only reads it. It evaluates the
// validation loss every N steps and streams metrics to observers (run_view.h: the CLI's
// progress bar, the run file, core/train/job_view.h).
//
// Why every bit equals the single device's under every layout: the parts' headers
// (core/parallel/<x>/part.h) and the math they use (core/parallel/pipeline/pipeline.h: stages, data
// and tensor parallelism within a stage; zero.h; tp_model.h; context_parallel.h; expert_parallel.h).
//
// Index
//   LocalSnapshot one rank's state between steps, for re-running steps (the replica check)
//   Job           construction composes the rank's parts and builds its model; step(),
//                 evaluate(), run(); its state and its parts
//   gather_full   the logical state out of every rank of a job (a collective)
//   absorb        a rank's part of the logical state (core/io/state.h)
#pragma once
#include "core/base/config.h"
#include "core/base/metrics.h"
#include "core/model/model.h"
#include "core/model/optimizer.h"
#include "core/model/probe.h"
#include "core/parallel/data/part.h"
#include "core/parallel/part.h"
#include "core/parallel/pipeline/part.h"
#include "core/train/precision.h"
#include "core/train/router_stats.h"
#include "core/train/run_view.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace px {

class TokenSource;       // core/model/data.h
class CheckpointReader;  // core/io/checkpoint.h
struct RankState;        // core/parallel/state_slices.h
struct LogicalState;     // core/io/state.h

// One rank's training state between steps, copied out and back in without communication, so
// that steps can be re-run on the same rank (the replica check of core/train/faults.h): the
// weights it holds (under ZeRO-3 its shard of them), its Adam moments, each part's state (the
// loss scale, fp8's scales, the replica check's second copy of a ZeRO shard), the step count and
// the history.
struct LocalSnapshot {
    std::vector<float> params, m, v;
    std::vector<PartState> parts;  // in the job's order of parts
    i64 step = -1;                 // steps done; -1: empty
    std::vector<StepMetrics> history;
};

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

    // ---- observers and hooks ----------------------------------------------------------------
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
    // Probes (core/model/probe.h) on every step from now on (null: none; not owned, must outlive
    // the job's steps): the model's fwd/bwd probes at the batch rows each microbatch holds, each
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

    // ---- the steps --------------------------------------------------------------------------
    // One optimizer step over train.batch_size sequences. Every rank returns the same metrics,
    // except comm_bytes (this rank's).
    StepMetrics step();
    double evaluate();  // mean validation loss over train.val_batches batches (every rank)
    void run();         // the remaining steps, with evaluation, observers and the llm.c export

    // ---- state ------------------------------------------------------------------------------
    // This rank's state between steps, and back (no communication; every rank of the job must
    // rewind to the same step before the next one).
    void snapshot(LocalSnapshot& into) const;
    void rewind(const LocalSnapshot& s);
    // Collective over the ZeRO group: ZeRO's shards of the Adam moments (and ZeRO-3's weights)
    // are gathered, so every replica holds its whole state, as under ZeRO-0 (later steps run so).
    void unshard() { data_->unshard(); }
    // Per-rank checkpoints (core/parallel/state_slices.h). No communication, and never the whole
    // model on one rank. rank_state: this rank's weights and Adam moments and its share of a
    // checkpoint (each logical element written by one rank of the world: the stage that owns a
    // tensor, wte the first; its dp replica's cut of it; a tp-sharded tensor by every tp rank, a
    // replicated one by tp rank id mod tp; each part says which it writes). restore_local reads
    // the pieces this rank holds from an open checkpoint (hyperslabs; the last stage's copy of
    // wte too) and continues after history.size() steps exactly as the run that wrote it would;
    // the caller verified the file and serialises HDF5 calls across threads.
    RankState rank_state();
    void restore_local(const CheckpointReader& file, const std::vector<StepMetrics>& history);

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
    // elements it updates: DataParallel::update_range), summed over the dp group.
    std::vector<float> tensor_sums_of_squares(const float* buf, bool zero_shard);
    // The same sums of the last step's reduced gradient, as the gradient norm used them.
    const std::vector<float>& grad_sums_of_squares() const { return grad_sq_; }
    // Max over the tp, cp, dp and pp groups, in place (exact in any order).
    void all_reduce_max(float* v, i64 n);
    // Max attention logit per layer of the whole model (-inf: none) over the step's forwards,
    // recorded while watch_logits(true), reduced over the groups at the step's end.
    void watch_logits(bool on);
    const std::vector<float>& logit_max() const { return logit_max_; }
    // MoE router statistics of the last step, per layer of the whole model (core/model/moe.h),
    // summed over the dp and pp groups; empty without MoE. Offered to the observers each step
    // as named values (router_stats.h).
    const std::vector<RouterStats>& router_stats() const { return router_.stats(); }

    // ---- what the job is --------------------------------------------------------------------
    const Config& config() const override { return rank_.cfg; }
    const Layout& layout() const { return rank_.layout; }
    const RankSetup& rank() const { return rank_; }
    const Schedule& schedule() const { return pipeline_->schedule(); }
    i64 num_params() const override;  // of the whole model, also when this rank holds a part
    GPT& model() { return *model_; }
    const GPT& model() const { return *model_; }
    AdamW& optimizer() { return data_->optimizer(); }  // under ZeRO: the moments of [lo, hi)
    const AdamW& optimizer() const { return data_->optimizer(); }
    const TokenSource& source() const { return *source_; }
    // The parts that every layout has: the owners of the batch's tokens and ZeRO, the pipeline,
    // and precision (loss scale and fp8: restore_local and rewind set their state; checkpoints
    // keep them under /scaler and /fp8).
    DataParallel& data() { return *data_; }
    const DataParallel& data() const { return *data_; }
    const PipelineParallel& pipeline() const { return *pipeline_; }
    const LossScaler& loss_scaler() const { return precision_->loss_scaler(); }
    const Fp8Scaling* fp8() const { return precision_->fp8(); }
    i64 steps_done() const override { return step_; }
    const std::vector<StepMetrics>& history() const override { return history_; }
    MemoryStats memory() const override;
    CpStats cp_stats() const override;
    EpStats ep_stats() const override;
    int pp_rank() const { return rank_.at.pp; }
    int pp_size() const { return rank_.layout.pp; }
    int dp_rank() const { return rank_.at.dp; }
    int dp_size() const override { return rank_.layout.dp; }
    int tp_rank() const { return rank_.at.tp; }
    int tp_size() const { return rank_.layout.tp; }
    int cp_rank() const { return rank_.at.cp; }
    int cp_size() const { return rank_.layout.cp; }
    i64 local_seq_len() const { return rank_.Tl; }  // T/cp: the tokens of a sequence this rank runs
    const RankGroups& groups() const { return rank_.groups; }
    double loss_floor() const override;
    double entropy_rate() const override;

private:
    template <class T>
    T* add(std::unique_ptr<T> part);   // appended to parts_, in seam order
    void init_weights();
    void forward(const Action& a, Activations& acts, bool last);
    void backward(const Action& a, Activations& acts, WeightGradQueue* defer);
    void weight_backward(const Action& a, WeightGradQueue& defer);
    void compute_hooks(const Action& a, bool done);  // StepHooks::compute of every hook
    void microbatch_grad(int m, float* grads, i64 lo, i64 hi);  // probes and hooks
    void probe_update();  // the "optim" probes of the step just done
    void set_probe_rows(int m);
    float grad_norm(float* g);

    RankSetup rank_;
    std::vector<std::unique_ptr<TrainerPart>> parts_;  // in the order every seam calls them
    DataParallel* data_ = nullptr;                     // the parts every layout has
    PipelineParallel* pipeline_ = nullptr;
    Precision* precision_ = nullptr;
    std::unique_ptr<GPT> model_;
    std::unique_ptr<TokenSource> source_;

    std::vector<Observer*> observers_;
    std::function<void(Job&)> after_step_;
    std::vector<StepHooks> hooks_;
    i64 stop_after_ = INT64_MAX;
    ProbeSink* probes_ = nullptr;
    ProbeContext probe_ctx_;

    i64 step_ = 0;
    std::vector<StepMetrics> history_;
    std::vector<i64> skipped_;  // batches never drawn (sorted)
    i64 swap_step_ = -1, swap_batch_ = -1;
    std::vector<float> grad_sq_;    // per tensor id: Σg² of the last step
    bool watch_logits_ = false;
    std::vector<float> logit_max_;  // per model layer
    RouterStatsSum router_;         // MoE models
};

// The logical, layout-free state (what checkpoints hold) out of a job of any layout: a
// collective of every group that gives every rank the whole model's weights and Adam moments,
// laid out as ParamTable::build(config().model) (null pointers are skipped). Throws
// InternalError if two stages' copies of wte differ. (core/train/logical_state.cpp)
void gather_full(Job& job, std::vector<float>* params, std::vector<float>* m,
                 std::vector<float>* v);

// The rank's part of the logical state, after Job::unshard (or its ZeRO slice of the moments):
// its tensors go to their places in the whole model by tensor id, a tensor-parallel shard's
// elements to their logical places (tp_model.h logical_indices). Every element two ranks hold
// (replicas, replicated tensors, the two stages' wte) must agree, and so must the histories:
// returns false otherwise.
bool absorb(LogicalState& state, const Job& job);

}  // namespace px
