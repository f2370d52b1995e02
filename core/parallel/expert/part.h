// Expert parallelism's part of a rank's trainer (core/parallel/part.h; layout.ep > 1): the
// model's expert layers over the ep group, per chunk and ep-group rank (source) an accumulator
// of the gradients of this rank's experts over that source's token nodes, and after backward
// their combination over the sources and the expert-data group (the owners of the same
// experts), written over the gradient's expert tensors.
//
// An expert's weight gradient sums over the tokens routed to it, in the batch's token tree. Its
// owner runs the expert on the rows of every rank of its ep group, so it computes, for each of
// those source ranks, exactly the node partials that source would compute on one device's
// layout of the batch (its microbatches' token nodes). They accumulate per source, as any
// rank's do (TreeAccumulator: into the source's maximal nodes), and after backward the owners
// of the same experts (one per ep group: the expert-data group) combine all of them in the tree
// over the batch's blocks (tree_exchange.h), with every source's nodes listed in token order.
//
// Index
//   ExpertParallel   the part: plan (this rank's experts), attach (the exchange and the
//                    accumulators), the backward's nodes, the experts' reduction, their norm
#pragma once
#include "core/base/arena.h"
#include "core/parallel/estimate.h"
#include "core/parallel/part.h"
#include "core/parallel/data/token_tree.h"

#include <memory>
#include <vector>

namespace px {

class DataParallel;  // core/parallel/data/part.h
class EpExchange;    // core/parallel/expert/expert_parallel.h

class ExpertParallel final : public TrainerPart {
public:
    // data: the replicas' part, whose microbatches' first sequences this part's reads.
    ExpertParallel(const RankSetup& rank, const DataParallel& data);
    ~ExpertParallel() override;
    const char* name() const override { return "expert"; }
    // The memory estimate's terms (core/parallel/estimate.h): what a rank of group g holds for
    // expert parallelism: a gradient buffer (and its microbatch tree) per rank
    // of the ep group, for its token nodes of this rank's experts, from the config's sizes alone, before anything is made.
    static void estimate(const MemorySizes& s, const StageParams& p, const MemoryGroup& g,
                         MemoryTerms& t);

    void plan(ModelPlan& plan) override;  // the stage's part with this rank's experts
    void attach(GPT& model) override;
    void begin_step() override;
    void begin_backward(int chunk, int m) override;
    void end_backward(int chunk, int m) override;
    void reduce_grads(StepGrads& grads) override;
    void entry_sums(const float* g, EntrySums& s) override;
    void end_step() override;
    bool splits_microbatch_grads() const override { return true; }
    // The replicated tensors by ep index 0 only; each ep index writes its experts' rows.
    bool writes(const TableEntry& e) const override;
    void memory(MemoryStats& m) const override;
    void stats(PartStats& s) const override;

private:
    double bytes_sent() const;  // by the ep group's all-to-alls, so far

    const RankSetup& rank_;
    const DataParallel& data_;
    const GPT* model_ = nullptr;
    std::shared_ptr<EpExchange> exchange_;
    std::vector<Arena> grads_;                      // per source: its first target's buffer
    std::vector<std::vector<TreeAccumulator>> acc_;  // per chunk, per source
    // Per source and microbatch: its token nodes as batch tokens [lo, hi).
    std::vector<std::vector<std::vector<Range>>> leaf_tokens_;
    NodePlan plan_;  // per expert-data rank: its sources' targets, source after source
    std::vector<float> values_;
    double sent_ = 0, sent0_ = 0;  // training steps' ep traffic so far; before this step
    i64 steps_ = 0;                // training steps sent_ covers
};

}  // namespace px
