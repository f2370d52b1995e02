#include "core/model/optimizer.h"

#include "core/base/error.h"
#include "kernels/ops.h"

#include <algorithm>

#include <cmath>
#include <vector>

namespace px {

double lr_at(const TrainConfig& tc, i64 step) {
    const double base = scheduled_lr(tc, step);
    const i64 s = step + 1;  // 1-based, as train.lr_jump_step counts
    if (tc.lr_jump_step > 0 && s >= tc.lr_jump_step && s < tc.lr_jump_step + tc.lr_jump_steps)
        return base * tc.lr_jump_factor;
    return base;
}

double scheduled_lr(const TrainConfig& tc, i64 step) {
    if (step < tc.warmup_steps)
        return tc.lr * static_cast<double>(step + 1) / static_cast<double>(tc.warmup_steps);
    const i64 decay_steps = tc.steps - tc.warmup_steps;
    if (decay_steps <= 1) return tc.lr;
    const double progress =
        static_cast<double>(step - tc.warmup_steps) / static_cast<double>(decay_steps - 1);
    const double coeff = 0.5 * (1.0 + std::cos(M_PI * progress));
    return tc.min_lr + coeff * (tc.lr - tc.min_lr);
}

float global_grad_norm(const Numerics& nx, const GPT& model, float* grads) {
    const auto& entries = model.table().entries;
    std::vector<float> per_tensor(entries.size());
    for (size_t i = 0; i < entries.size(); i++)
        per_tensor[i] = ops::sum_squares(nx, model.grad(grads, static_cast<int>(i)));
    const float total = nx.mode == Mode::bitwise
                            ? tree_sum(per_tensor.data(), static_cast<i64>(per_tensor.size()))
                            : [&] {
                                  float s = 0.0f;
                                  for (float x : per_tensor) s += x;
                                  return s;
                              }();
    return std::sqrt(total);
}

AdamW::AdamW(const GPT& model, i64 lo, i64 hi)
    // (every moment is updated every step: mapped now, not in the first step's update)
    : lo_(lo),
      hi_(hi),
      m_(bytes_of(DType::f32, hi - lo), Arena::Pages::now),
      v_(bytes_of(DType::f32, hi - lo), Arena::Pages::now) {
    PX_ASSERT(0 <= lo && lo <= hi && hi <= model.table().total, "AdamW shard out of range");
}

void AdamW::step(GPT& model, float* grads, float grad_norm, float lr, int t,
                 const TrainConfig& tc) {
    step(model, model.params() + lo_, grads, grad_norm, lr, t, tc);
}

void AdamW::step(const GPT& model, float* w, float* grads, float grad_norm, float lr, int t,
                 const TrainConfig& tc) {
    const float clip = static_cast<float>(tc.grad_clip);
    const float scale = (clip > 0.0f && grad_norm > clip) ? clip / grad_norm : 1.0f;
    const auto& entries = model.table().entries;
    for (size_t i = 0; i < entries.size(); i++) {
        const TableEntry& e = entries[i];
        // The part of this tensor inside the shard, as a flat slice.
        const i64 a = std::max(e.offset, lo_), b = std::min(e.offset + e.numel(), hi_);
        if (a >= b) continue;
        auto named = [&](Tensor t) {
            t.name = e.name.c_str();
            return t;
        };
        const bool decay = kParams[e.spec].decay;
        ops::AdamWStep s{lr,
                         static_cast<float>(tc.beta1),
                         static_cast<float>(tc.beta2),
                         static_cast<float>(tc.eps),
                         decay ? static_cast<float>(tc.weight_decay) : 0.0f,
                         scale,
                         t};
        ops::adamw_update(
            model.numerics(),
            named(view_f32(w + (a - lo_), {b - a})),
            named(m_.view(DType::f32, bytes_of(DType::f32, a - lo_), {b - a})),
            named(v_.view(DType::f32, bytes_of(DType::f32, a - lo_), {b - a})),
            named(view_f32(grads + a, {b - a})), s);
    }
}

}  // namespace px
