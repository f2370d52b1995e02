// Pipeline parallelism (DESIGN.md §3, PP) on the pp group: each pp rank holds the layers of its
// virtual stages as one GPT over a ModelPart (core/model.h) and runs its schedule's action list
// (core/parallel/schedule.h) with point-to-point messages; with dp > 1 each data-parallel
// replica is one pipeline, and a stage's gradient is all-reduced over its dp group. With tp > 1
// each stage is cut over its tp group (tp_model.h's TpLayers on the stage's part).
//
// Index
//   stage_part         the ModelPart of a pp rank: its chunks' layers, embedding, head
//   TreeAccumulator    one chunk's microbatch gradients, combined in the token tree in any order
//   PipelineJob        one pp rank: step(), evaluate(), run(); its stage's model and optimizer
//   run_pipeline       trains a config with layout.pp >= 2 on dp·pp·tp in-process ranks
//   run_pipeline_rank  one rank of it, on a given world communicator (threads or MPI)
//
// The math. Virtual stage k computes h_k = f_k(h_{k-1}) on each microbatch (h_{-1}: the tokens,
// f_0 starts with the embedding; the last stage ends in ln_f, the LM head and the per-token
// losses). Forward: recv h_{k-1}, compute, send h_k. Backward: recv dL/dh_k, compute the chunk's
// weight gradients and dL/dh_{k-1}, send it back (the last stage starts from dL/dloss_t = 1/N,
// N = the tokens of the whole batch). Messages are (B,T,C) fp32 hidden states (under sequence
// parallelism a tp rank's token rows of them, 10.), copied bit for bit.
//
// Why every bit equals the single device's (DESIGN.md §2):
//   1. A stage runs the single device's kernels on the single device's inputs: messages move
//      bits, they never add. Recompute "full" reruns a block's forward from its kept input:
//      same inputs, same kernels, same bits.
//   2. Each chunk combines its microbatch gradients in the token tree (TreeAccumulator) exactly
//      as Job does: node = left + right over the same leaves.
//   3. Tied wte: the first stage holds the embedding's part of dwte, the last stage the LM head's
//      (GradLayout's head region). They swap them, and both form dwte = embedding + head
//      (GPT::combine_tied_grads), so both hold the same gradient and apply the same AdamW update
//      to their copy of wte.
//   4. Loss: the last stage holds every token's loss; canonical_sum / N there, then broadcast.
//   5. Grad norm: each tensor's canonical sum of squares on the stage that owns it (wte: the
//      first stage), gathered over the pp group, then the tree over tensors in the whole model's
//      table order, as global_grad_norm.
//   6. AdamW is elementwise, with the global norm's clip scale: each stage updates its tensors.
//   7. Data parallelism (dp × pp): replica d runs its pipeline on sequences [d·B/dp, (d+1)·B/dp)
//      of the batch, one node of the token tree (token_ranges), its microbatches the nodes below.
//      After the backwards each stage all-reduces its gradient buffer (the LM head's part of
//      dwte included) over its dp group with the canonical algorithm: the nodes above the
//      replicas', as Job forms them. Only then the tied exchange, the norm and AdamW, in the
//      single device's order. Loss: the last stages gather their replicas' per-token losses over
//      dp (token order is dp-rank-major), then 4.
//   8. ZeRO over a stage's dp group: each replica keeps the Adam moments of one block-aligned
//      shard of its stage's parameters and updates that shard (AdamW is elementwise: the same
//      bits as unsharded), then the replicas all-gather the weights (ZeRO-1). ZeRO-2 reduce-
//      scatters the gradient instead of all-reducing it (wte's two parts stay whole: the first
//      and last stages cut their tables differently and swap them whole); the norm's per-tensor
//      trees are formed from the shards' canonical blocks, gathered (zero.h's argument). ZeRO-3
//      also drops the weights outside the shard between steps and gathers them before use.
//   9. Tensor parallelism (tp × pp): a stage is a tp group, each rank holding its shard of the
//      stage's layers (TpLayers), whose layers give the single device's bits (tp_model.h).
//      Messages (B,T,C) are replicated over the stage's tp ranks, so tp rank t of stage s talks
//      to tp rank t of stage s±1 (the pp group is the ranks sharing dp and tp coordinates). wte
//      is vocabulary-parallel with the same row shard on the first and the last stage: tied
//      exchange between the same tp ranks, of the local rows. Norm: each owned tensor's
//      canonical Σg² over its logical blocks (tp_sum_squares: exact partials over tp, and over
//      dp under ZeRO-2/3), then 5. Gradients are all-reduced over dp only (replicated tensors
//      get the same bits on every tp rank).
//  10. Sequence parallelism (tp × pp with layout.sequence_parallel): within a stage tp rank t
//      holds only its token rows tp::token_split(micro_B·T)[t] of the residual stream, and that
//      is all a stage boundary needs: a chunk's last block writes only those rows of its output
//      (and its backward only those rows of d(input)), a chunk's first block reads only those
//      rows of its input (and its backward all-gathers d(output) from them). So each message is
//      tp rank t's token slice, sent to tp rank t of the next (previous) stage, which holds the
//      same rows (every stage cuts the same microbatch alike): 1/tp of the (B,T,C) bytes, moved
//      bit for bit. The embedding writes every row and the head all-gathers ln_f first, as on a
//      whole tp model; the LayerNorm gradients are the same bits on every tp rank (tp_model.h).
//
// Messages. Sends are posted asynchronously and recvs block, as the schedule's contract says
// (so no rank can deadlock on a send); each send's Handle stays with the activations it reads and
// is completed before they are written again, at the latest at the end of the step. Tags:
// message_tag of the action in a step; fixed tags above their range for the tied-wte exchange
// and for validation forwards.
#pragma once
#include "core/arena.h"
#include "core/config.h"
#include "core/job.h"
#include "core/model.h"
#include "core/optimizer.h"
#include "core/probe.h"
#include "core/parallel/mesh.h"
#include "core/parallel/schedule.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace px {

class TokenSource;

// Pipeline rank p holds the virtual stages k = c·pp + p (chunk c = 0 .. v-1), with the layers
// Mesh::layers gives them; the embedding if it holds stage 0, the head if it holds stage S-1.
ModelPart stage_part(const Mesh& mesh, int pp_rank);

// ---- gradient accumulation -------------------------------------------------------------------

// The microbatch gradients of one model chunk, combined in the canonical token tree (DESIGN.md
// §2.1): microbatch k owns token blocks [k·b, (k+1)·b) of the batch's tree, one node of it; a
// node's gradient is left + right once both children are in. Microbatches may finish in any
// order (every schedule here runs a chunk's backwards in increasing microbatch order, which
// makes this Job's stack: at most log2(m)+1 partials); the result is the same bits either way.
// Leaf 0 accumulates into `result`, so the root ends there; other leaves use pooled buffers.
// Only floats [span.lo, span.hi) are zeroed and combined: the chunk's part of a gradient buffer.
class TreeAccumulator {
public:
    TreeAccumulator(int microbatches, i64 blocks_per_microbatch, float* result, i64 floats,
                    GradSpan span);
    float* begin(int k);  // where microbatch k's backward accumulates (its span zeroed)
    void end(int k);      // k is complete: combine every node whose children are complete
    bool complete() const { return nodes_[0].done; }  // the whole batch is in `result`
    void reset();                                     // for the next step
    int buffers() const { return static_cast<int>(pool_.size()); }  // partial buffers made
    i64 bytes() const;            // of those buffers
    i64 resident_bytes() const;   // of those buffers, mapped now
    void release();               // their pages back to the system (they read as zero after)

private:
    struct Node {
        int left = -1, right = -1, parent = -1;
        bool done = false;
        float* buf = nullptr;
    };
    int build(i64 lo, i64 hi, i64 blocks_per_microbatch, int parent);
    float* take();

    float* result_;
    i64 floats_;
    GradSpan span_;
    std::vector<Node> nodes_;  // [0] is the root
    std::vector<int> leaf_;    // per microbatch: its node
    std::vector<Arena> pool_;  // partial gradients made so far
    std::vector<float*> free_;
};

// ---- one pipeline rank -----------------------------------------------------------------------

class PipelineJob : public RunView {
public:
    // `pp` is the pipeline group (its rank is the pp rank); `replica` the data-parallel group of
    // this stage (its rank is the dp rank; null when dp = 1), the ZeRO stage and the algorithm,
    // and the stage's tensor-parallel group (null when tp = 1).
    // Validates the layout (ConfigError naming the keys: pp <= layers, interleaved divisibility,
    // microbatches, token-tree nodes, group sizes).
    PipelineJob(const Config& cfg, comm::Communicator& pp, ReplicaContext replica = {});
    ~PipelineJob();
    PipelineJob(const PipelineJob&) = delete;
    PipelineJob& operator=(const PipelineJob&) = delete;

    // One optimizer step. Every rank returns the same metrics, except comm_bytes (this rank's).
    StepMetrics step();
    double evaluate();  // mean validation loss over train.val_batches batches (every rank)
    // The remaining steps (on_step after each), then the llm.c export on pp rank 0 if asked.
    void run(const std::function<void(const StepMetrics&)>& on_step = {});

    // Collective over the pp group (and the dp group under ZeRO-1, whose moment shards are
    // gathered first; and the tp group, whose shards go to their logical places): the whole
    // model's flat arrays (ParamTable::build(model) layout) of
    // weights and Adam moments, assembled from the stages on every rank. Null pointers are
    // skipped. Throws InternalError if the two copies of wte differ.
    void gather_full(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v);

    // ---- per-rank checkpoints (core/parallel/state_slices.h) --------------------------------
    // Job::rank_state / Job::restore_local for a stage: no communication, never the whole model.
    // The stage writes the tensors it owns (wte: the first stage), its dp replica its cut of
    // them, its tp rank its shard (replicated tensors: tp rank id mod tp); it reads back every
    // element it holds (the last stage's copy of wte included).
    RankState rank_state();
    void restore_local(const CheckpointReader& file, const std::vector<StepMetrics>& history);

    // Collective over the dp group: ZeRO's shards of the stage's Adam moments are gathered, so
    // every replica holds its stage's whole state (as a ZeRO-0 stage; later steps run so).
    // run_pipeline calls it before `inspect`; a no-op without ZeRO.
    void unshard();

    // Fault injection and the replica check (core/parallel/faults.h), as Job's: hooks around
    // each step; this rank's state between steps, copied out and back (not under ZeRO-3 with
    // dp > 1: an InternalError).
    void set_step_hooks(StepHooks hooks) { hooks_ = std::move(hooks); }
    // Probes (core/probe.h), as Job::set_probes: the stage's ops at the batch rows of each
    // microbatch, then its parameters' reduced gradients and updated weights and moments (the
    // tied wte from both stages that hold it), tp shards as Job's; each microbatch's gradient
    // of a chunk ("mgrad") before its TreeAccumulator takes it in.
    void set_probes(ProbeSink* sink) { probes_ = sink; }
    void stop_after(i64 step) { stop_after_ = step; }  // as Job::stop_after
    void snapshot(LocalSnapshot& into) const;
    void rewind(const LocalSnapshot& s);

    const Config& config() const override { return cfg_; }
    const Layout& layout() const { return mesh_.layout(); }
    const Schedule& schedule() const { return schedule_; }
    int pp_rank() const { return rank_; }
    int pp_size() const { return pp_; }
    int dp_rank() const { return dp_rank_; }
    int dp_size() const override { return dp_; }
    int tp_rank() const { return tp_rank_; }
    int tp_size() const { return tp_; }
    GPT& model() { return *model_; }  // this stage
    const GPT& model() const { return *model_; }
    const AdamW& optimizer() const { return *opt_; }  // under ZeRO-1: moments of [lo, hi)
    float* grads() const { return grads_.data(); }    // last step's complete gradients (GradLayout)
    i64 num_params() const override;                  // of the whole model
    i64 steps_done() const override { return step_; }
    const std::vector<StepMetrics>& history() const override { return history_; }
    double loss_floor() const override;
    double entropy_rate() const override;
    // Activation sets made for chunk c: the most (microbatch, chunk) forwards held at once (plus
    // any whose outgoing message was still in flight), e.g. min(pp, m) on 1F1B's first stage.
    int activation_sets(int chunk) const;
    i64 activation_bytes() const;  // all of them
    // This rank's bytes as Job::memory counts them: its stage's weights, gradients (microbatch
    // partials included), moments and activation sets; messages need no staging buffers.
    MemoryStats memory() const override;

private:
    struct Slot;
    Slot* acquire(int chunk);
    void release(int chunk, Slot* s);
    void run_actions();
    void set_probe_rows(int m);  // the model's probes at microbatch m's batch rows

    void wait_sends();
    void exchange_tied_grads(float* g);
    float grad_norm(float* g);
    bool first_stage() const { return rank_ == 0; }
    bool last_stage() const { return rank_ == pp_ - 1; }
    bool is_last_virtual(int chunk) const { return stage_of(rank_, chunk, pp_) == S_ - 1; }
    void gather_losses(std::vector<float>& all, const std::vector<float>& local, i64 batches);
    void reduce_scatter_grads(float* g);
    void stage_sum_squares(const float* g, std::vector<float>& per_id);
    void all_gather_params();
    void release_params();
    const int* tokens(int m) const { return inputs_.data() + m * micro_B_ * T_; }
    const int* targets(int m) const { return targets_.data() + m * micro_B_ * T_; }

    Config cfg_;
    Numerics nx_;
    Mesh mesh_;
    Schedule schedule_;
    comm::Communicator& comm_;  // the pp group
    ReplicaContext replica_;    // the dp group of this stage
    StepHooks hooks_;
    ProbeSink* probes_ = nullptr;
    ProbeContext probe_ctx_;
    i64 stop_after_ = INT64_MAX;
    int rank_ = 0, pp_ = 1, v_ = 1, S_ = 1, M_ = 1;
    int dp_rank_ = 0, dp_ = 1;
    int tp_rank_ = 0, tp_ = 1;
    i64 T_ = 0, micro_B_ = 0, hidden_floats_ = 0;  // hidden_floats_: one (micro_B,T,C) state
    i64 msg_lo_ = 0, msg_floats_ = 0;  // a message: floats [msg_lo_, +msg_floats_) of the state
    i64 local_B_ = 0;                  // sequences per replica and step
    int zero_ = 0;                     // ZeRO stage over dp (0 when dp = 1)
    std::vector<i64> shard_edges_;     // ZeRO >= 1: dp+1 cuts of the stage's parameters; else empty
    bool recompute_ = false;
    std::vector<ModelPart> parts_;  // every pp rank's, for the norm's owners and gather_full
    std::vector<int> owner_;        // per tensor id of the whole model: the pp rank that owns it
    std::unique_ptr<GPT> model_;
    std::unique_ptr<AdamW> opt_;
    std::unique_ptr<TokenSource> source_;
    Arena grads_;                       // the step's gradient (GradLayout of the stage)
    std::vector<TreeAccumulator> acc_;  // per chunk
    std::vector<std::vector<std::unique_ptr<Slot>>> slots_;  // per chunk: every set made
    std::vector<std::vector<Slot*>> free_;                   // per chunk: sets not in use
    std::vector<std::vector<Slot*>> live_;                   // per chunk, per microbatch

    i64 step_ = 0;
    std::vector<int> windows_;           // (local_B, T+1)
    std::vector<int> inputs_, targets_;  // (local_B, T): microbatch m at m·micro_B·T
    std::vector<float> losses_;          // (local_B·T), last stage: this replica's
    std::vector<float> all_losses_;      // (batch_size·T), last stage: every replica's
    std::vector<StepMetrics> history_;
};

// Trains cfg (layout.pp >= 2) for train.steps steps on dp·pp·tp in-process ranks, split into
// pp, dp and tp groups by the Mesh's colors. `observers` follow world rank 0 (metrics
// are the same on every rank but comm_bytes). `inspect`,
// when given, is called once per rank after its last step (and PipelineJob::unshard), one rank
// at a time.
// `each_step`, when given, is called on every rank after each step (and its checkpoint):
// collectives are allowed, every rank calls it at the same step (parallax validate gathers the
// logical state there).
// `setup`, when given, is called on every rank with its stage before the first step.
void run_pipeline(const Config& cfg, const std::vector<Observer*>& observers = {},
                  const std::function<void(PipelineJob&)>& inspect = {},
                  const std::function<void(PipelineJob&)>& each_step = {},
                  const std::function<void(PipelineJob&)>& setup = {});
// One rank's part of run_pipeline: `world` is this rank's world communicator (a thread under
// comm::run_ranks, or this process under MPI, core/comm/mpi.h) of dp·pp·tp ranks, cfg.train.threads
// its OpenMP threads. Observers follow world rank 0; `inspect` is called after unshard.
void run_pipeline_rank(const Config& cfg, comm::Communicator& world,
                       const std::vector<Observer*>& observers,
                       const std::function<void(PipelineJob&)>& inspect = {},
                       const std::function<void(PipelineJob&)>& each_step = {},
                       const std::function<void(PipelineJob&)>& setup = {});

}  // namespace px
