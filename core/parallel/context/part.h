// Context parallelism's part of a rank's trainer (core/parallel/part.h; layout.cp > 1): the
// model runs on this rank's zig-zag tokens of every sequence with the cp group's attention
// (context_parallel.h), and the part measures that attention's traffic and memory. Which tokens
// the rank holds, and how their gradients and losses combine with every dp and cp rank's, is
// the data part's (the owners of the batch's tokens: core/parallel/data/part.h).
//
// Index
//   ContextParallel   the part: attach (the attention over the cp group), memory, stats
#pragma once
#include "core/parallel/part.h"

#include <memory>

namespace px {

class CpAttention;       // core/parallel/context/context_parallel.h
class PipelineParallel;  // core/parallel/pipeline/part.h

class ContextParallel final : public TrainerPart {
public:
    // pipeline: the activation sets, whose attention buffers stats() measures.
    ContextParallel(const RankSetup& rank, const PipelineParallel& pipeline);
    ~ContextParallel() override;
    const char* name() const override { return "context"; }

    void attach(GPT& model) override;
    void begin_step() override;
    void end_step() override;
    bool splits_microbatch_grads() const override { return true; }
    void memory(MemoryStats& m) const override;
    void stats(PartStats& s) const override;

private:
    double bytes_sent() const;  // in the cp group, so far

    const RankSetup& rank_;
    const PipelineParallel& pipeline_;
    const GPT* model_ = nullptr;
    std::shared_ptr<CpAttention> attention_;
    double sent_ = 0, sent0_ = 0;  // training steps' cp traffic so far; before this step
    i64 steps_ = 0;                // training steps sent_ covers
};

}  // namespace px
