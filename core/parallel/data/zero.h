// ZeRO over a data-parallel group (docs/layouts.md): the flat parameter arena is cut into one
// contiguous shard per dp rank, and each rank keeps and updates only its shard of
//   ZeRO-1  the optimizer state                       (gradients all-reduced, weights all-gathered)
//   ZeRO-2  + the gradients                           (reduce-scatter instead of all-reduce)
//   ZeRO-3  + the weights                             (all-gathered before use, released after)
//
// Memory. The arenas stay mapped at their full size, so every offset is the single device's, but
// their pages are handed back to the system wherever a rank holds nothing (Arena::decommit):
// under ZeRO-3 a rank keeps its shard of the weights and, while a unit (the embedding, a block,
// the head) runs, that unit's gathered weights; under ZeRO-2/3 it keeps its shard of the
// gradients and, while a unit's backward runs, that unit's full gradient, reduce-scattered and
// freed as soon as the unit is done (ZeroUnits, called by the model through UnitHooks).
//
// Microbatches under ZeRO-2/3. Replicas and microbatches are owners of token ranges of the
// batch's canonical tree (docs/numerics.md); any assignment that makes each owner's range a node
// gives the single device's bits. ZeRO-0/1 give each replica one contiguous range and split it
// into microbatches (the replica's partial is complete after its last microbatch and is reduced
// once). ZeRO-2/3 instead cut the batch into microbatch ranges first and give every replica a
// piece of each: microbatch k's pieces are the children of one node, reduce-scattered as soon
// as they are computed, and only the shard of that node is kept, so microbatch partials cost a
// shard each instead of a whole gradient (the reduce-scatter then runs once per microbatch, as
// DeepSpeed's ZeRO-2 does).
//
// Shard edges fall on the canonical blocks of the tensors (numerics.block elements from each
// tensor's start), so every block of a gradient has one owner. The global gradient norm is then
// exact under sharding: owners compute the sequential sums of their blocks, exchange them, and
// every rank forms the same per-tensor trees as the single device (subtrees that cross shards
// combine after the exact partials are exchanged; docs/numerics.md).
//
// Index
//   zero_shard_edges           dp+1 cuts of a (whole or stage) parameter table on block edges
//   reduce_scatter_cut         canonical reduce-scatter of a segment cut into uneven pieces
//   ZeroShards                 the shard edges of a model over dp ranks
//   reduce_scatter_stage       ZeRO-2/3 after the last microbatch: this rank's gradient shard
//   combine_tied               dwte = embedding + LM head, on this rank's shard only
//   sum_squares                per-tensor Σg² from sharded gradients, bit-identical to unsharded
//   all_gather_params          every rank gets every shard of the weights
//   release_params             ZeRO-3: drop the weights this rank does not own
//   ZeroUnits                  ZeRO-2/3 per unit: gather and free weights, reduce-scatter and
//                              free gradients, keep the microbatch partials of the shard
//
// The replica check's second copy (core/train/faults.h). What a ZeRO shard's owner alone
// computes (its reduced gradient, its update, its moments, under ZeRO-3 its weights) has no
// replica to compare with. With check_next() every rank also holds the shard of the next dp
// rank, (rank + 1) mod dp: its gradient reduce-scatters to both ranks (the same canonical sum,
// so the same bits) and the job keeps a second, independent copy of its update (job.h).
#pragma once
#include "core/base/arena.h"
#include "core/comm/comm.h"
#include "core/model/model.h"

#include <functional>
#include <vector>

namespace px {

// Cuts of [0, t.total) into dp shards: t.total·r/dp moved up to the next canonical block boundary
// of the tensor it falls in, so no block of a tensor straddles two shards.
std::vector<i64> zero_shard_edges(const ParamTable& t, int dp, int block);

// seg[cuts[0], cuts[p]) cut at `cuts` (group size p + 1 of them, increasing): afterwards this
// rank's piece [cuts[rank], cuts[rank+1]) holds the sum over the group, the rest is untouched.
// Each rank sends every other rank that rank's piece (all_to_all_v: no padding, (n − own piece)
// floats per rank) and sums what it receives in the canonical tree over rank index, so the
// piece is bit for bit that piece of the canonical all-reduce, whatever the cuts. Fast mode
// uses the same exchange (its order is as good as any). `scratch` may be kept between calls.
// twice (every rank of the group or none): each rank also receives the piece of the next rank,
// (rank + 1) mod p, summed the same way into its place: a second copy of that piece, bit for bit.
void reduce_scatter_cut(comm::Communicator& dp, float* seg, const std::vector<i64>& cuts,
                        std::vector<float>& scratch, bool twice = false);

class ZeroShards {
public:
    ZeroShards(const GPT& model, int dp, int rank);

    int size() const { return static_cast<int>(edges_.size()) - 1; }
    i64 lo(int r) const { return edges_[static_cast<size_t>(r)]; }
    i64 hi(int r) const { return edges_[static_cast<size_t>(r) + 1]; }
    i64 lo() const { return lo(rank_); }
    i64 hi() const { return hi(rank_); }
    // The replica check: from now on this rank also reduces (ZeRO-2/3) the gradient shard of
    // dp rank checked() = (rank + 1) mod dp. Every rank of the group calls it, or none.
    void check_next() { checked_ = (rank_ + 1) % size(); }
    int checked() const { return checked_; }  // -1: none

    // grads: a GradLayout buffer holding this rank's partial (its node of the token tree), of a
    // pipeline stage (or the whole model) that reduces after its last microbatch. Afterwards
    // its shard [lo, hi) holds the canonical sum over ranks (and the checked shard), wte's two
    // parts whole (the rest is stale).
    void reduce_scatter_stage(comm::Communicator& dp, float* grads, comm::Algo algo);
    // ZeroUnits' reduced gradient: dwte = embedding + LM head on this rank's (and the checked)
    // shard only.
    void combine_tied(float* grads) const;
    // Per entry of the table: the canonical Σg² of the tensor from this rank's gradient shard
    // (zero for entries not `owned`); owners compute the sequential sums of their blocks, which
    // are gathered, and every rank forms each tensor's tree as the single device does. A
    // collective of the dp group.
    std::vector<float> sum_squares(comm::Communicator& dp, const float* grads,
                                   const std::vector<char>& owned) const;
    void all_gather_params(comm::Communicator& dp, float* params) const;
    // whole (the table's floats) = every rank's shard [lo(r), hi(r)) from its `mine`.
    void all_gather_shards(comm::Communicator& dp, float* whole, const float* mine) const;
    // ZeRO-3 between steps: the pages of every weight this rank does not own go back.
    void release_params(Arena& params) const;
    // Flat ranges [a, b) of a gradient buffer: each rank's piece of it (p + 1 cuts, clamped).
    std::vector<i64> cuts_in(i64 a, i64 b) const;
    i64 staging_bytes() const { return static_cast<i64>(scratch_.capacity() * sizeof(float)); }

private:
    friend class ZeroUnits;
    const GPT& model_;
    int rank_;
    int checked_ = -1;
    std::vector<i64> edges_;       // dp+1 cuts of [0, table.total)
    std::vector<i64> head_edges_;  // dp+1 cuts of the LM-head region [0, V·C)
    std::vector<float> scratch_;
};

// ZeRO-2/3 around the units of a model (UnitHooks), for one step of m microbatches:
//   before a unit runs forward or backward (ZeRO-3)  all-gather its weights over dp;
//   after it (ZeRO-3)                                 free the pages of those it does not own;
//   before its backward                               zero its gradient ranges (fresh pages);
//   after its backward                                reduce-scatter them over dp, add this rank's
//                                                     piece into the microbatch partials (the
//                                                     token tree's merges, per unit), free them.
// After the last microbatch, finish() leaves the step's gradient shard in the gradient buffer
// (its pieces [lo, hi) and the matching head entries), as ZeroShards::reduce_scatter_grads does.
class ZeroUnits : public UnitHooks {
public:
    // merges[k]: how many partials merge after microbatch k (the microbatch nodes' post-order).
    ZeroUnits(GPT& model, ZeroShards& shards, comm::Communicator& dp, int stage, Arena& grads,
              std::vector<unsigned char> merges);
    // Before microbatch k's backward. `tap` (may be empty) is shown each unit's gradient
    // ranges [lo, hi) of the microbatch after its backward, before its reduce-scatter (the
    // job's probes and StepHooks::microbatch_grad).
    using Tap = std::function<void(float* grads, i64 lo, i64 hi)>;
    void begin_microbatch(int k, Tap tap = {}) {
        mb_ = k;
        tap_ = std::move(tap);
    }
    void finish();
    // The replica check: also keep the partials of the shard of ZeroShards::checked() (call
    // after ZeroShards::check_next, between steps).
    void hold_checked();
    i64 partial_bytes() const;  // the microbatch partials of the shard (mapped now)
    // Peak bytes mapped in the weight and gradient arenas since the last reset_peaks().
    i64 peak_params() const { return peak_params_; }
    i64 peak_grads() const { return peak_grads_; }
    void reset_peaks();

    void before_forward(Unit u) override;
    void after_forward(Unit u) override;
    void before_backward(Unit u, float* grads) override;
    void after_backward(Unit u, float* grads) override;

private:
    void gather(Unit u);
    void release(Unit u);
    void note_peaks();
    // A shard whose gradient this rank keeps: its own, and the checked one (hold_checked).
    struct Held {
        int rank = 0;                    // the dp rank whose shard it is
        i64 head_lo = 0, head_hi = 0;    // its head entries, buffer offsets
        std::vector<Arena> partial;      // shard-sized partials (none with one microbatch)
        i64 slot(const ZeroShards& s, i64 i) const;  // position of buffer index i in a partial
    };
    Held make_held(int rank) const;

    GPT& model_;
    ZeroShards& shards_;
    comm::Communicator& dp_;
    int stage_;
    Arena& grads_;
    std::vector<unsigned char> merges_;
    std::vector<int> push_;          // per microbatch: the partial it writes
    int depth_ = 0;                  // partials per held shard (0 with one microbatch)
    std::vector<Held> held_;         // [0]: this rank's shard; [1]: the checked one
    int mb_ = 0;
    i64 peak_params_ = 0, peak_grads_ = 0;
    Tap tap_;
};

}  // namespace px
