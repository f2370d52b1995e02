// The trainer. A Job owns the model, the optimizer and the data source of one config, and runs
// optimizer steps with gradient accumulation over microbatches, evaluates the validation loss
// every N steps, and streams metrics to observers (the CLI's progress bar, the run file; the GUI
// and Python attach here later).
//
// Gradient accumulation is a canonical reduction (DESIGN.md §2.1): each microbatch owns one node
// of the token tree of the whole batch, and microbatch gradients combine in that tree, so the
// result does not depend on the microbatch count.
//
// Index
//   StepMetrics   what one step reports
//   Observer      receives metrics as they happen
//   Job           construction validates the config against the model and data; step(), run()
#pragma once
#include "core/arena.h"
#include "core/comm/comm.h"
#include "core/config.h"
#include "core/model.h"
#include "core/optimizer.h"
#include "core/mutation.h"
#include "core/probe.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace px {

class TokenSource;
class RunFile;
class ZeroShards;
class ZeroUnits;
class CheckpointReader;  // core/checkpoint.h
struct RankState;        // core/parallel/state_slices.h


// What a Job needs to know when it is one data-parallel replica among several (ranks as threads
// or processes; core/parallel/runner.h starts them). The replica trains on its share of each
// batch, a range of sequences that is one node of the batch's token tree, and the replicas'
// gradients combine in that tree (a canonical all-reduce), so every replica holds exactly the
// single-device gradient.
struct ReplicaContext {
    comm::Communicator* dp = nullptr;  // the data-parallel group; null: the only replica
    int zero = 0;  // ZeRO stage 0..3 (core/parallel/zero.h)
    comm::Algo algo = comm::Algo::canonical;  // of the reducing collectives (layout.comm)
    // The tensor-parallel group this replica is cut over (core/parallel/tp_model.h); null or
    // of size 1: the replica holds the whole model. Each tp rank of a replica trains the same
    // sequences on its shard of the model; gradients are all-reduced over dp only.
    comm::Communicator* tp = nullptr;
};

struct StepMetrics {
    i64 step = 0;           // 1-based
    double loss = 0;        // mean training loss of the step's batch, nats/token
    double val_loss = -1;   // validation loss when evaluated this step, else -1
    double grad_norm = 0;   // before clipping
    double lr = 0;
    double tokens_per_s = 0;
    double step_ms = 0;
    double comm_bytes = 0;  // bytes this rank sent in collectives during the step, all groups
};

// Bytes a rank holds, by what they are for (core/parallel: per-rank memory accounting).
struct MemoryStats {
    i64 params = 0;       // weights held between steps (ZeRO-3: the pages mapped, measured)
    i64 grads = 0;        // gradient buffers, microbatch partials included (ZeRO-2/3: measured)
    i64 optimizer = 0;    // AdamW moments (this rank's shard)
    i64 activations = 0;  // one microbatch's activations and backward scratch
    i64 comm = 0;         // staging buffers of the collectives
    // The most weights and gradients mapped at once during the last step: under ZeRO-2/3 the
    // shard plus the units in flight (measured at every unit); otherwise params and grads.
    i64 peak_params = 0, peak_grads = 0;
    i64 total() const { return params + grads + optimizer + activations + comm; }
};

// What observers may read of a running job, whatever runs it: a single device or data-parallel
// replica (Job) or a pipeline stage (core/parallel/pipeline.h). Observers see rank 0.
class RunView {
public:
    virtual ~RunView() = default;
    virtual const Config& config() const = 0;
    virtual i64 num_params() const = 0;  // of the whole model
    virtual i64 steps_done() const = 0;
    virtual const std::vector<StepMetrics>& history() const = 0;
    virtual int dp_size() const = 0;
    virtual double entropy_rate() const = 0;  // of the source, nats/token, when known (else -1)
    virtual double loss_floor() const = 0;    // minimal loss on validation windows (else -1)
    virtual MemoryStats memory() const = 0;   // this rank's
};

// Hooks around each optimizer step, on every rank (fault injection, core/parallel/faults.h).
// Empty members do nothing. `step` is the 1-based step being run.
struct StepHooks {
    std::function<void(i64 step)> before;  // before anything of the step happens
    // The step's reduced gradient (a GradLayout buffer; ZeRO-2/3: this rank's shard of it, the
    // rest reads 0), before the norm and the update read it.
    std::function<void(i64 step, float* grads)> grads;
    std::function<void(i64 step)> updated;  // after the update: the weights of the step are final
};

// One rank's training state between steps, copied out and back in without communication, so
// that steps can be re-run on the same rank (the replica check of core/parallel/faults.h): the
// weights it holds, its Adam moments, the step count and the history.
struct LocalSnapshot {
    std::vector<float> params, m, v;
    i64 step = -1;  // steps done; -1: empty
    std::vector<StepMetrics> history;
};
// What Job and PipelineJob snapshot: a model's (or stage's) weights, an optimizer's moments,
// into `s` (its buffers are reused: a check every step must not map fresh pages every step).
void take_snapshot(const GPT& model, const AdamW& opt, i64 step,
                   const std::vector<StepMetrics>& history, LocalSnapshot& s);
void put_snapshot(const LocalSnapshot& s, GPT& model, AdamW& opt);  // weights and moments back

class Observer {
public:
    virtual ~Observer() = default;
    virtual void on_start(const RunView&) {}
    virtual void on_step(const RunView&, const StepMetrics&) {}
    virtual void on_end(const RunView&) {}
};

class Job : public RunView {
public:
    explicit Job(const Config& cfg, ReplicaContext replica = {});
    ~Job();
    Job(const Job&) = delete;
    Job& operator=(const Job&) = delete;

    void add_observer(Observer* obs) { observers_.push_back(obs); }
    // Called on every rank after each step, after the observers (checkpoints: a collective).
    void set_after_step(std::function<void(Job&)> f) { after_step_ = std::move(f); }
    void set_step_hooks(StepHooks hooks) { hooks_ = std::move(hooks); }
    // run() stops after this step, the learning-rate schedule staying train.steps' (a golden
    // trace recorded fewer steps than the job has).
    void stop_after(i64 step) { stop_after_ = step; }
    // Probes (core/probe.h) on every step from now on (null: none; not owned, must outlive the
    // job's steps): the model's fwd/bwd probes at the batch rows each microbatch holds, each
    // microbatch's gradient ("mgrad"; under ZeRO-2/3 before each unit's reduce-scatter), then
    // "grad" for every parameter where hooks_.grads runs, "optim" after the update. Under ZeRO only this rank's shard of a tensor
    // is valid: its pieces are the flat shard [lo, hi) of the arena cut into slabs (flat_shard),
    // of the tp shard's pieces under tensor parallelism (ParallelLayers::param_shard). Pipeline
    // stages: PipelineJob::set_probes. Evaluation is never probed.
    void set_probes(ProbeSink* sink) { probes_ = sink; }
    // This rank's state between steps, and back (no communication; every rank of the job must
    // rewind to the same step before the next one). Not under ZeRO-3 with dp > 1, whose
    // weights between steps are shards: an InternalError.
    void snapshot(LocalSnapshot& into) const;
    void rewind(const LocalSnapshot& s);

    // The logical, layout-free state (what checkpoints hold) out of a job of any layout:
    // a collective of the job's dp and tp groups that gives every rank the whole model's
    // weights and Adam moments, laid out as ParamTable::build(model) (null pointers are
    // skipped). Checkpoints come back in per rank (restore_local).
    void gather_full(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v);

    // ---- per-rank checkpoints (core/parallel/state_slices.h) --------------------------------
    // No communication, and never the whole model on one rank. rank_state: this rank's weights
    // and Adam moments and its share of a checkpoint (what it writes: each logical element by
    // one rank of the world). restore_local: reads the pieces this rank holds from an open
    // checkpoint (hyperslabs) and continues after history.size() steps exactly as the run that
    // wrote it would; the caller verified the file and serialises HDF5 calls across threads.
    RankState rank_state();
    void restore_local(const CheckpointReader& file, const std::vector<StepMetrics>& history);

    StepMetrics step();   // one optimizer step over train.batch_size sequences
    double evaluate();    // mean validation loss over train.val_batches batches
    void run();           // the remaining steps, with evaluation, the run file and the export

    const Config& config() const override { return cfg_; }
    i64 num_params() const override {  // of the whole model, also when this rank holds a shard
        return tp_size() > 1 ? ParamTable::build(cfg_.model).num_params : model_->num_params();
    }
    GPT& model() { return *model_; }
    const GPT& model() const { return *model_; }
    AdamW& optimizer() { return *opt_; }
    const AdamW& optimizer() const { return *opt_; }
    const TokenSource& source() const { return *source_; }
    // The last step's complete gradients (ZeRO-2/3: this rank's shard of them; the rest reads 0).
    float* grads() const { return grad_stack_[0].data(); }
    i64 steps_done() const override { return step_; }
    const std::vector<StepMetrics>& history() const override { return history_; }
    MemoryStats memory() const override;
    int dp_rank() const { return dp_rank_; }
    int tp_rank() const { return replica_.tp ? replica_.tp->rank() : 0; }
    int tp_size() const { return replica_.tp ? replica_.tp->size() : 1; }
    int dp_size() const override { return dp_size_; }
    // Expected minimal loss on the validation windows, when the source knows it (else -1).
    double loss_floor() const override;
    double entropy_rate() const override;

private:
    void accumulate_microbatch(int k);
    // Test-only mutations (core/mutation.h): the parameter one names.
    const TableEntry& mutated_entry(const mutation::Mutation& mu) const;
    void all_gather_tokens(std::vector<float>& all, const float* local, i64 per_rank);

    Config cfg_;
    Numerics nx_;
    std::unique_ptr<GPT> model_;
    std::unique_ptr<AdamW> opt_;
    std::unique_ptr<TokenSource> source_;
    ReplicaContext replica_;
    std::unique_ptr<ZeroShards> shards_;  // ZeRO >= 1 with more than one replica
    std::unique_ptr<ZeroUnits> units_;    // ZeRO >= 2 with more than one replica
    bool zero_units() const { return replica_.zero >= 2 && dp_size_ > 1; }
    std::vector<unsigned char> group_merges_;  // ZeRO-2/3: merges after each microbatch node
    int dp_rank_ = 0, dp_size_ = 1;
    int microbatches_ = 1;            // per replica and step
    i64 local_B_ = 0;                 // sequences per replica and step
    std::vector<Observer*> observers_;
    std::function<void(Job&)> after_step_;
    StepHooks hooks_;
    i64 stop_after_ = INT64_MAX;
    ProbeSink* probes_ = nullptr;  // set_probes
    ProbeContext probe_ctx_;       // the model's probes' step and batch rows
    std::vector<StepMetrics> history_;

    i64 step_ = 0;
    i64 micro_B_ = 0;                 // sequences per microbatch
    std::vector<int> windows_;        // (batch_size, T+1) sampled windows of the current step
    std::vector<int> inputs_, targets_;  // (micro_B, T)
    std::vector<float> losses_;       // (local_B*T) per-token losses of this replica's share
    std::vector<float> all_losses_;   // (batch_size*T) the whole batch's, in token order
    std::vector<Arena> grad_stack_;   // [0] is the step's gradient; more for microbatch partials
    std::vector<unsigned char> merges_after_;  // per microbatch: merges in the token tree
    size_t stack_top_ = 0;                      // partials on grad_stack_ during a step
};

// Writes the metrics to <dir>/run.h5 (DESIGN.md §6; core/runfile.h, implemented there). Nothing
// is opened before the run starts. A fresh run (steps_done() == 0) creates the file, replacing an
// old one. A resumed run (steps_done() == k) continues the run file that is there: its rows after
// step k are dropped and a "resume" event is logged; when there is none (or it is not a run file)
// a new one starts with the k restored steps of history(). A run file that is there but cannot be
// opened read-write is an error, never replaced. A step reported again (a re-run) replaces its
// rows and drops the later ones. Either way the file holds each step once, in order, with its
// latest values; it is flushed after every step.
class RunFileObserver : public Observer {
public:
    RunFileObserver(const std::string& path, const Config& cfg);  // opens nothing yet
    ~RunFileObserver() override;
    void on_start(const RunView& run) override;
    void on_step(const RunView& run, const StepMetrics& m) override;
    void on_end(const RunView& run) override;

private:
    void resume();                     // opens the file of a resumed run (at its first step)
    void write(const StepMetrics& m);  // one step's rows

    std::string path_, config_toml_;
    CheckpointConfig checkpoint_;        // where a resume came from, for its event
    std::unique_ptr<RunFile> file_;
    std::vector<StepMetrics> restored_;  // a resumed run's history until the file is open
    i64 last_step_ = 0;                  // the last step written (or restored)
};

}  // namespace px
