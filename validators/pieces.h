// Every rank's pieces of a logical tensor against the reference's (the harness compares logical
// tensors, put together from every rank that holds a piece of one; docs/validation.md). This is the
// one comparison parallax validate makes after every step of a layout, for every reduced
// gradient, weight, Adam moment, fp8 scale and history and loss scale: each rank's pieces (its
// pipeline stage's tensors, its ZeRO shards, its tp columns, its experts) are compared where they
// sit in the logical tensor, a replica (dp replicas, tp ranks' copies of a replicated tensor, the
// two stages' wte, cp ranks) on every rank that holds it, so a fault on any rank is named on that
// rank, at the tensor where it is.
//
// Cost. A rank whose pieces are bit-identical to the reference's costs one memcmp per run of
// contiguous elements and no copy; only a rank whose pieces differ is compared element by
// element (its pieces over the reference, validators/compare.h), which is what a report needs.
// The logical tensor is never gathered on a rank.
//
// Nothing left out. The pieces of every rank must together cover the logical tensor (a hole is
// reported, not taken as agreement), and each rank must have offered the pieces its job holds
// (Holdings: its stage's tensors, its shard of them under ZeRO, counted from the job's own
// tables, apart from the probe path): a rank whose probes went missing fails the check instead of
// passing unseen.
//
// Index
//   StepProbes    a rank's ProbeSink keeping each step's probes in a recorder of their own, so
//                 that step s is compared while the rank runs step s + 1
//   RankPieces    one rank's pieces of one tensor against the reference's
//   PieceCheck    one tensor over every rank: each holder's comparison, the ranks that differ,
//                 the elements no rank holds, replicas that disagree with their twins
//   check_pieces  makes a PieceCheck
//   assemble      the logical tensor from every rank's pieces (the lowest rank's where several
//                 hold an element)
//   Holdings      the probes and element counts a rank's job holds after a step; missing_pieces
//                 names what a rank's recorder lacks of them
#pragma once
#include "validators/compare.h"
#include "core/train/probe_recorder.h"

#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace px {

class Job;

class StepProbes : public ProbeSink {
public:
    explicit StepProbes(std::vector<std::string> patterns);
    bool wants(const ProbeKey& key) const override;
    void capture(const ProbeKey& key, const float* local, const ShardSpec& spec) override;
    // Step `step`'s recorder, taken out (an empty one when the step captured nothing): call it
    // once the rank has finished the step. Hand it back with recycle() when done with it.
    std::unique_ptr<ProbeRecorder> take(i64 step);
    void recycle(std::unique_ptr<ProbeRecorder> rec);  // cleared, its buffers kept for later steps

private:
    ProbeRecorder filter_;  // wants() only
    std::vector<std::string> patterns_;
    std::mutex mu_;
    std::map<i64, std::unique_ptr<ProbeRecorder>> steps_;
    std::vector<std::unique_ptr<ProbeRecorder>> spare_;
};

struct RankPieces {
    int rank = -1;      // world rank (the index into check_pieces' recorders)
    Comparison cmp;     // its pieces against the reference; count: the elements it holds
};

struct PieceCheck {
    std::vector<RankPieces> holders;  // every rank with a piece, ascending
    std::vector<int> differing;       // the holders whose pieces differ from the reference
    i64 uncovered = 0;                // logical elements no rank holds
    i64 first_uncovered = -1;
    // A rank whose own captures of the tensor disagreed (two copies of one piece on one rank):
    // its rank and what disagreed; -1 / empty when none.
    int fault_rank = -1;
    std::string fault;
    // With twins: ranks whose copy of a piece differs from the same piece on other ranks (the
    // majority's, or without one the lowest rank's), ascending; the first of them and its twin.
    std::vector<int> odd_replicas;
    int odd_twin = -1;
    bool equal() const { return differing.empty(); }
    const RankPieces* first_differing() const;  // the lowest differing rank's; null when none
    std::int64_t worst_ulp() const;             // over the holders (kNoUlp: a NaN mismatch)
};

// Tensor `name` of logical `shape`: the reference's elements `want` (row-major) against the
// pieces of probe `probe` in ranks[k] (world rank k; null or without the probe: k holds none).
// twins: also compare the copies of each piece held by several ranks with each other (fast mode,
// where every rank differs from the reference and only the twins can show which one is odd).
PieceCheck check_pieces(const std::string& name, const std::string& probe,
                        std::span<const float> want, const std::vector<i64>& shape,
                        const std::vector<const ProbeRecorder*>& ranks, bool twins = false);

// out (the logical tensor's size, row-major) with every rank's pieces of `probe` written into it,
// the lowest rank's last (so it is the one kept where ranks overlap).
void assemble(std::span<float> out, const std::string& probe,
              const std::vector<const ProbeRecorder*>& ranks);

// What a rank's job offers as probes after each step, by probe name without its step
// ("grad/1/param/mlp.c_fc.weight", "optim/-/param/wte", "optim/-/fp8/scale"), with the elements
// of each it holds: its model's tensors (its stage's, its tp shard, its experts), under ZeRO-2/3
// only its shard of the gradient, under ZeRO-3 of the weights, under ZeRO-1..3 of the moments.
struct Holdings {
    std::map<std::string, i64> elements;
    explicit Holdings(const Job& job);
};

// What `rec` (a rank's recorder of one step) lacks of `held`: "" when it holds every probe with
// all its elements, else a sentence naming the rank, the probe and the counts.
std::string missing_pieces(const Holdings& held, const ProbeRecorder& rec, i64 step, int rank);

}  // namespace px
