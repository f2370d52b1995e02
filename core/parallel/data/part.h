// Data parallelism's part of a rank's trainer (core/parallel/part.h), with ZeRO 1-3: the owners
// of the batch's tokens, and what becomes of their gradients.
//
// The replicas (and under context parallelism every dp × cp rank: the data group) own token
// ranges of the batch, and a weight gradient is the canonical tree over the batch's token blocks
// (docs/numerics.md). This part draws the rank's sequences, accumulates each microbatch's
// gradient into its nodes of that tree (TreeAccumulator, one per model chunk), combines them
// with the other owners' (an all-reduce, or the tree exchange when a rank's nodes are not one
// node each), and owns what ZeRO shards: the optimizer's moments (ZeRO-1), the gradient (ZeRO-2:
// reduce-scatter), the weights (ZeRO-3: gathered before use, released after), and the replica
// check's second copy of the next rank's shard. Why the bits are the single device's: zero.h,
// pipeline.h (7., 8.) and context_parallel.h.
//
// Index
//   ShardState     a ZeRO shard as the replica check reads it
//   DataParallel   the part: the batch, the microbatch backward, the reduction, the update,
//                  the ZeRO shards and their state
#pragma once
#include "core/model/optimizer.h"
#include "core/parallel/estimate.h"
#include "core/parallel/part.h"
#include "core/parallel/data/token_tree.h"

#include <functional>
#include <memory>
#include <vector>

namespace px {

class TokenSource;  // core/model/data.h
class ZeroShards;   // core/parallel/data/zero.h
class ZeroUnits;
struct RankState;   // core/parallel/state_slices.h

// A ZeRO shard as the replica check reads it: elements [lo, hi) of the rank's parameter table,
// its weights and Adam moments (w == nullptr: none).
struct ShardState {
    int dp_rank = -1;  // whose shard it is
    i64 lo = 0, hi = 0;
    const float* w = nullptr;
    const float* m = nullptr;
    const float* v = nullptr;
};

class DataParallel final : public TrainerPart {
public:
    explicit DataParallel(const RankSetup& rank);
    ~DataParallel() override;
    const char* name() const override { return "data"; }
    // The memory estimate's terms (core/parallel/estimate.h): what a rank of group g holds for
    // the replicas and ZeRO: the weights, gradients (the microbatch tree's
    // partials; ZeRO-2/3's shard and units), moments, the batch's buffers and the token ranges, from the config's sizes alone, before anything is made.
    static void estimate(const MemorySizes& s, const StageParams& p, const MemoryGroup& g,
                         MemoryTerms& t);

    // ---- the batch ------------------------------------------------------------------------
    // This replica's first sequence of microbatch m in the step's batch.
    i64 first_row(int m) const;
    // The rank's sequences of training batch `batch`: every rank of a replica samples them
    // (counter-based, so identically), as tokens and targets (microbatch after microbatch), of
    // which a context-parallel rank keeps its zig-zag tokens.
    void draw(const TokenSource& source, i64 batch);
    const int* tokens(int m) const;   // microbatch m's (micro_B, Tl) tokens, as this rank runs them
    const int* targets(int m) const;
    // Validation batch j's microbatch k, the same way; val_tokens/val_targets hold it.
    void draw_val(const TokenSource& source, i64 j, int k);
    const int* val_tokens() const { return val_tok_.data(); }
    const int* val_targets() const { return val_tgt_.data(); }
    float* losses(int m);  // where the last stage puts microbatch m's per-token losses
    // The last stages: the mean loss of the step's batch over every owner's tokens (canonical),
    // and the mean of `batches` validation batches from this rank's `local` losses. Collectives
    // of the data group.
    double step_loss();
    double mean_loss(const std::vector<float>& local, i64 batches);

    // ---- the gradient and the update ------------------------------------------------------
    // Shown each microbatch's gradient [lo, hi) of `grads` as its backward leaves it (probes,
    // StepHooks::microbatch_grad).
    using GradTap = std::function<void(int m, float* grads, i64 lo, i64 hi)>;
    void set_tap(GradTap tap) { tap_ = std::move(tap); }
    // Microbatch m's backward on chunk c into its token nodes (or ZeRO-2/3's units). With
    // `defer` (a zero-bubble schedule's B; not under ZeRO-2/3's units) the weight gradients that
    // can wait stay in the queue, and the microbatch's nodes stay open until weight_backward.
    void backward(GPT& model, Activations& acts, int chunk, int m, float dloss,
                  WeightGradQueue* defer = nullptr);
    // W: the deferred weight gradients of (chunk, m), then its nodes combine in the token tree.
    void weight_backward(int chunk, int m, WeightGradQueue& defer);
    float* grads() const;  // the step's gradient buffer (GradLayout)
    // The update of this rank's shard (and the replica check's second copy of the next one).
    void update(float* g, float grad_norm, float lr, int step, const TrainConfig& tc);
    AdamW& optimizer() { return *opt_; }  // under ZeRO: the moments of [lo, hi)
    const AdamW& optimizer() const { return *opt_; }
    // Floats [lo, hi) of the parameter table whose update this rank computes (its ZeRO shard, or
    // all), and the weights it holds between steps (ZeRO-3: that shard; else all).
    Range update_range() const { return {opt_->lo(), opt_->hi()}; }
    Range weights_held() const;
    bool zero_sharded() const { return shards_ != nullptr; }
    int zero_stage() const { return zero_; }  // the ZeRO stage this rank runs (0 when unsharded)

    // ---- the replica check (core/train/faults.h) --------------------------------------------
    // Collective over the ZeRO group: from now on every rank also updates a second copy of the
    // next rank's shard. Nothing without ZeRO shards.
    void check_updates();
    ShardState own_shard() const;      // this rank's shard, when sharded
    ShardState checked_shard() const;  // after check_updates

    // ---- state ----------------------------------------------------------------------------
    // Collective over the ZeRO group: every replica then holds its whole state, as under ZeRO-0
    // (later steps run so).
    void unshard();
    // The rank's arrays and its replica's share of a checkpoint (state_slices.h replica_state).
    RankState replica_state() const;
    // The whole moments of the stage from the replicas' shards (a collective of the ZeRO group;
    // `shard` itself without ZeRO), and ZeRO-3's whole weights for a moment (gather_weights:
    // false when the rank holds them anyway; release_weights after a true).
    const float* whole_moments(std::vector<float>& buf, const float* shard) const;
    bool gather_weights();
    void release_weights();

    void attach(GPT& model) override;
    void begin_step() override;
    void reduce_grads(StepGrads& grads) override;
    void entry_sums(const float* g, EntrySums& s) override;
    void after_update(bool applied) override;
    void begin_eval() override;
    void end_eval() override;
    void end_run() override;
    void save(PartState& s) const override;
    void restore(const PartState& s) override;
    void restore(const CheckpointReader& file) override;
    void memory(MemoryStats& m) const override;

private:
    void end_microbatch(int chunk, int m);  // its nodes complete: tap, then the token tree
    void combine_nodes_across_replicas(float* g);
    void gather_losses(std::vector<float>& all, const std::vector<float>& local, i64 batches,
                       bool by_microbatch);
    void gather_cp_losses(std::vector<float>& all, const std::vector<float>& local, i64 batches);
    void localise(int* out, const int* full, i64 B) const;  // cp: this rank's tokens of rows
    void build_leaves();

    const RankSetup& rank_;
    GPT* model_ = nullptr;
    int zero_ = 0;                        // ZeRO stage over the ZeRO group (0 when of one)
    Arena grads_;                         // the step's gradient (GradLayout), fp32
    std::unique_ptr<AdamW> opt_;          // this rank's shard of the moments
    std::unique_ptr<ZeroShards> shards_;  // ZeRO >= 1 over more than one replica
    std::unique_ptr<ZeroUnits> units_;    // ZeRO-2/3 microbatch-major (one stage: zero.h)
    std::unique_ptr<AdamW> checked_opt_;  // check_updates: the next rank's shard, a second copy
    std::vector<float> checked_w_;        // of its moments and its weights
    std::vector<TreeAccumulator> acc_;    // per chunk (not under ZeroUnits)
    // Per microbatch: local token rows [lo, hi) of each of its nodes of the batch's token tree
    // (one when its range is a node), in TreeAccumulator::leaves order.
    std::vector<std::vector<Range>> leaf_rows_;
    NodePlan plan_;  // every owner's nodes of the batch's token tree (not under ZeroUnits)
    std::vector<float> node_values_;  // combine_nodes_across_replicas' rows, reused every step
    GradTap tap_;

    std::vector<int> windows_;           // (local_B, T+1), microbatch after microbatch
    std::vector<int> inputs_, targets_;  // (local_B, T): microbatch m at m·micro_B·T
    std::vector<int> cp_inputs_, cp_targets_;  // cp > 1: (local_B, T/cp), this rank's tokens
    std::vector<PositionRun> cp_runs_;         // cp > 1: where they sit in each sequence
    std::vector<int> val_win_, val_tok_, val_tgt_;  // a validation microbatch
    std::vector<float> losses_;      // (local_B·T/cp), last stage: this rank's
    std::vector<float> all_losses_;  // (batch_size·T), last stage: every owner's
};

}  // namespace px
