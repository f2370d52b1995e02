// Optimizer: AdamW with decoupled weight decay (none on biases and norms), global-norm gradient
// clipping and a cosine learning-rate schedule with linear warm-up.
//
// Index
//   lr_at              the schedule (scheduled_lr), with a learning-rate jump if asked
//   global_grad_norm   sqrt of a canonical sum of squares over every gradient
//   AdamW              first and second moments, one update per step
#pragma once
#include "core/base/arena.h"
#include "core/base/config.h"
#include "core/model/model.h"

namespace px {

// Learning rate for step (0-based): linear warm-up to train.lr over warmup_steps, then a cosine
// decay to train.min_lr at the last step (scheduled_lr); times train.lr_jump_factor at the steps
// of a learning-rate jump (train.lr_jump_step, 1-based, for lr_jump_steps steps).
double lr_at(const TrainConfig& tc, i64 step);
double scheduled_lr(const TrainConfig& tc, i64 step);

// ‖g‖₂ over all parameters: each tensor's Σg² is a canonical reduction over its elements; the
// per-tensor sums then combine in the canonical tree over tensors in table order.
float global_grad_norm(const Numerics& nx, const GPT& model, float* grads);

// AdamW over the slice [lo, hi) of the flat parameter arena (all of it by default; one ZeRO
// shard under data parallelism). The update is elementwise, so a shard updates exactly the
// elements the whole would.
class AdamW {
public:
    explicit AdamW(const GPT& model) : AdamW(model, 0, model.table().total) {}
    AdamW(const GPT& model, i64 lo, i64 hi);

    // One update from `grads` (a GradLayout buffer whose wte gradient is complete). Clips to
    // tc.grad_clip by the given norm. t is the 1-based step.
    void step(GPT& model, float* grads, float grad_norm, float lr, int t, const TrainConfig& tc);
    // The same update of weights kept apart from the model: w[0, size()) are elements [lo, hi)
    // (the replica check's second copy of a ZeRO shard, core/train/job.h).
    void step(const GPT& model, float* w, float* grads, float grad_norm, float lr, int t,
              const TrainConfig& tc);

    float* m() const { return m_.f32(); }  // moments of elements [lo, hi)
    float* v() const { return v_.f32(); }
    i64 lo() const { return lo_; }
    i64 hi() const { return hi_; }
    i64 size() const { return hi_ - lo_; }

private:
    i64 lo_, hi_;
    Arena m_, v_;  // fp32, whatever the activations' dtype
};

}  // namespace px
