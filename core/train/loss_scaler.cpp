#include "core/train/loss_scaler.h"

#include <cmath>
#include <limits>

namespace px {

LossScaler::LossScaler(const PrecisionConfig& pc)
    : dynamic_(pc.activations == "fp16"),
      growth_interval_(pc.loss_scale_growth_interval),
      growth_(static_cast<float>(pc.loss_scale_growth_factor)),
      backoff_(static_cast<float>(pc.loss_scale_backoff_factor)) {
    if (dynamic_) state_.scale = static_cast<float>(pc.loss_scale_init);
}

float LossScaler::dloss(i64 tokens) const {
    return state_.scale / static_cast<float>(tokens);
}

void LossScaler::unscale(float* g, i64 lo, i64 hi) const {
    if (state_.scale == 1.0f) return;
    const float s = state_.scale;
#pragma omp parallel for schedule(static)
    for (i64 i = lo; i < hi; i++) g[i] = g[i] / s;
}

bool LossScaler::all_finite(const float* g, i64 lo, i64 hi) {
    bool bad = false;
#pragma omp parallel for schedule(static) reduction(|| : bad)
    for (i64 i = lo; i < hi; i++) bad = bad || !std::isfinite(g[i]);
    return !bad;
}

bool LossScaler::update(bool finite) {
    if (!dynamic_) return true;
    if (!finite) {
        const float backed = state_.scale * backoff_;
        if (backed >= std::numeric_limits<float>::min()) state_.scale = backed;
        state_.growth_tracker = 0;
        return false;
    }
    if (++state_.growth_tracker >= growth_interval_) {
        const float grown = state_.scale * growth_;
        if (std::isfinite(grown)) state_.scale = grown;
        state_.growth_tracker = 0;
    }
    return true;
}

}  // namespace px
