// Precision's part of a rank's trainer (core/parallel/part.h): fp16's dynamic loss scale
// (loss_scaler.h) and fp8's scales and amax histories (core/model/fp8.h), both the same on every
// rank because every decision they take comes from canonical reductions over every group.
//
// Index
//   Precision   the part: the loss gradient's scale, unscaling and the finite check, the step's
//               fp8 amaxes made into the next step's scales, and their state in snapshots,
//               checkpoints and probes
#pragma once
#include "core/model/fp8.h"
#include "core/parallel/estimate.h"
#include "core/parallel/part.h"
#include "core/train/loss_scaler.h"

#include <memory>

namespace px {

class Precision final : public TrainerPart {
public:
    explicit Precision(const RankSetup& rank);
    const char* name() const override { return "precision"; }
    // The memory estimate's terms (core/parallel/estimate.h): what a rank of group g holds for
    // precision: fp8 delayed scaling's scales and amax histories, from the config's sizes alone, before anything is made.
    static void estimate(const MemorySizes& s, const StageParams& p, const MemoryGroup& g,
                         MemoryTerms& t);

    // fp16's dynamic loss scale; a scale of 1 that never moves otherwise.
    const LossScaler& loss_scaler() const { return scaler_; }
    // precision.fp8's scales and histories (null when off), the same on every rank.
    const Fp8Scaling* fp8() const { return fp8_.get(); }
    // d(mean loss)/d(token loss) for a batch of `tokens`, times the loss scale.
    float dloss(i64 tokens) const { return scaler_.dloss(tokens); }
    // Whether every rank's reduced gradient is finite where it is complete: 0/1 flags summed
    // over each group in turn (exact in any order), so every rank gets the same answer.
    bool grads_finite(const StepGrads& grads);
    // After the judges: whether the update runs (fp16: a step with an inf or a NaN anywhere is
    // skipped, on every rank alike, and the scale moves). `finite`: the gradient's and its norm's.
    bool take_update(bool finite) { return scaler_.update(finite); }

    void attach(GPT& model) override;
    void begin_step() override;
    void after_schedule() override;                // fp8: the step's amaxes make the next scales
    void reduce_grads(StepGrads& grads) override;  // g unscaled where complete
    void save(PartState& s) const override;
    void restore(const PartState& s) override;
    void restore(const CheckpointReader& file) override;
    void probe(ProbeSink& sink, i64 step) const override;

private:
    const RankSetup& rank_;
    LossScaler scaler_;
    std::shared_ptr<Fp8Scaling> fp8_;  // precision.fp8 != "off"; shared with the model
};

}  // namespace px
