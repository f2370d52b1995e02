// Dynamic loss scaling for fp16 activations (precision.activations = "fp16"), as PyTorch's
// GradScaler does it: the loss gradient is multiplied by a scale S so that the fp16 activation
// gradients of the backward do not underflow; the fp32 weight gradients come out multiplied by S
// and are divided by it before anything reads them. A step whose gradients hold an inf or a NaN
// on any rank (or whose global norm is not finite) is skipped, S is multiplied by the backoff
// factor and the count of good steps restarts; after growth_interval good steps in a row S is
// multiplied by the growth factor (a growth that would overflow fp32 is not taken, nor a backoff
// below the smallest normal fp32 number).
//
// Why it keeps the bitwise promise: S is the same fp32 number on every rank (it changes only from
// a decision every rank takes from the same canonical reductions: Job::step), so the loss
// gradient S / tokens, every scaled gradient and its quotient by S are the single device's bits.
//
// Index
//   LossScaleState   what a checkpoint and a snapshot keep: the scale and the good steps counted
//   LossScaler       the scale of this step, unscaling, and the decision after the step
#pragma once
#include "core/base/config.h"
#include "core/base/shapes.h"

namespace px {

struct LossScaleState {
    float scale = 1.0f;      // S of the next step
    i64 growth_tracker = 0;  // good steps in a row since the scale last changed
    bool operator==(const LossScaleState&) const = default;
};

class LossScaler {
public:
    // Dynamic exactly when pc.activations is "fp16"; otherwise the scale stays 1 and nothing
    // is skipped (every step updates, as before).
    explicit LossScaler(const PrecisionConfig& pc);

    bool dynamic() const { return dynamic_; }
    float scale() const { return state_.scale; }
    const LossScaleState& state() const { return state_; }
    void restore(const LossScaleState& s) { state_ = s; }

    // d(mean loss)/d(token loss) times the scale: S / tokens in fp32 (1 / tokens when S is 1).
    float dloss(i64 tokens) const;
    // g[lo, hi) /= S (nothing when the scale is 1).
    void unscale(float* g, i64 lo, i64 hi) const;
    // After the step's gradients are complete: whether its update runs (`finite`: no inf or NaN
    // in any rank's gradient nor in the norm). Moves the scale for the next step. Always true
    // when not dynamic.
    bool update(bool finite);

    // Whether every element of g[lo, hi) is finite.
    static bool all_finite(const float* g, i64 lo, i64 hi);

private:
    bool dynamic_ = false;
    i64 growth_interval_ = 1;
    float growth_ = 2.0f, backoff_ = 0.5f;
    LossScaleState state_;
};

}  // namespace px
