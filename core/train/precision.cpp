// Precision's part of a rank's trainer (precision.h).
#include "core/train/precision.h"

#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/model/probe.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

namespace px {

void Precision::estimate(const MemorySizes& s, const StageParams& /*p*/, const MemoryGroup& g,
                         MemoryTerms& t) {
    t.bookkeeping += g.ranks * kEstimateFloat * s.fp8_state;
}

Precision::Precision(const RankSetup& rank) : rank_(rank), scaler_(rank.cfg.precision) {}

void Precision::attach(GPT& model) {
    if (rank_.cfg.precision.fp8 == "off") return;
    fp8_ = std::make_shared<Fp8Scaling>(rank_.cfg.model, rank_.cfg.precision, rank_.layout.tp,
                                        rank_.nx);
    model.set_fp8(fp8_);
}

void Precision::begin_step() {
    if (fp8_) fp8_->begin_step();
}

// fp8: the step's amaxes, max over the tp, cp, dp and pp groups, make the next step's scales.
void Precision::after_schedule() {
    if (!fp8_ || !fp8_->delayed()) return;
    std::vector<float>& amax = fp8_->step_amax();
    const RankGroups& g = rank_.groups;
    for (comm::Communicator* c : {g.tp, g.cp, g.dp, g.pp})
        if (c && !amax.empty()) c->all_reduce_max(amax.data(), static_cast<i64>(amax.size()));
    fp8_->update();
}

void Precision::reduce_grads(StepGrads& grads) {
    if (!scaler_.dynamic()) return;
    for (const Range& r : grads.complete) scaler_.unscale(grads.g, r.lo, r.hi);
}

bool Precision::grads_finite(const StepGrads& grads) {
    bool ok = true;
    for (const Range& r : grads.complete)
        ok = ok && LossScaler::all_finite(grads.g, r.lo, r.hi);
    float bad = ok ? 0.0f : 1.0f;
    const RankGroups& g = rank_.groups;
    for (comm::Communicator* c : {g.tp, g.cp, g.dp, g.pp})
        if (c) c->all_reduce(&bad, 1, rank_.layout.algo);
    return bad == 0.0f;
}

// The loss scaler's state in ints (the scale's bits, the good steps), fp8's in floats.
void Precision::save(PartState& s) const {
    float scale = scaler_.state().scale;
    i64 bits = 0;
    std::memcpy(&bits, &scale, sizeof scale);
    s.ints = {bits, scaler_.state().growth_tracker};
    s.floats.clear();
    if (fp8_) s.floats = fp8_->state();
}

void Precision::restore(const PartState& s) {
    PX_ASSERT(s.ints.size() == 2, "a snapshot of another job");
    LossScaleState st;
    std::memcpy(&st.scale, &s.ints[0], sizeof st.scale);
    st.growth_tracker = s.ints[1];
    scaler_.restore(st);
    if (fp8_) fp8_->restore(s.floats);
}

// The loss scale goes on from the file's when it was a dynamic one (an fp16 run); a file of a
// run without loss scaling leaves this run's initial scale. fp8's scales and histories go on
// from the file's; a file without them (a run without fp8) leaves the fresh ones (scale 1,
// empty histories).
void Precision::restore(const CheckpointReader& file) {
    const CheckpointMeta& meta = file.meta();
    if (scaler_.dynamic() && meta.loss_scale_dynamic)
        scaler_.restore({static_cast<float>(meta.loss_scale), meta.growth_tracker});
    if (fp8_ && fp8_->delayed() && fp8_->gemms() > 0 && meta.fp8_gemms > 0) {
        if (meta.fp8_gemms != fp8_->gemms() || meta.fp8_history_len != fp8_->history_len())
            throw CheckpointError(
                "checkpoint " + file.path() + " holds fp8 state for " +
                std::to_string(meta.fp8_gemms) + " matmuls with amax histories of " +
                std::to_string(meta.fp8_history_len) + " steps, but this run has " +
                std::to_string(fp8_->gemms()) + " fp8 matmuls and precision.fp8_amax_history_len = " +
                std::to_string(fp8_->history_len()) +
                ": resume with the writer's precision.fp8_amax_history_len and "
                "precision.fp8_layers, fp8_keep_ends_bf16 and fp8_lm_head");
        std::vector<float> st = meta.fp8_scale;
        st.insert(st.end(), meta.fp8_history.begin(), meta.fp8_history.end());
        fp8_->restore(st);
    }
}

// The scaling state the next step starts from, whole on every rank.
void Precision::probe(ProbeSink& sink, i64 step) const {
    auto whole = [&](const char* op, const char* tensor, const float* data,
                     std::vector<i64> shape) {
        const ProbeKey key{step, "optim", -1, op, tensor};
        if (!sink.wants(key)) return;
        i64 n = 1;
        for (i64 d : shape) n *= d;
        sink.capture(key, data, flat_shard(shape, 0, n));
    };
    if (fp8_ && fp8_->delayed() && fp8_->gemms() > 0) {
        const i64 roles = Fp8Scaling::kRoles, slots = fp8_->gemms() * roles;
        whole("fp8", "scale", fp8_->scales().data(), {fp8_->gemms(), roles});
        whole("fp8", "amax_history", fp8_->histories().data(), {slots, fp8_->history_len()});
    }
    if (scaler_.dynamic()) {  // the growth tracker stays below the growth interval: exact
        const float st[2] = {scaler_.state().scale,
                             static_cast<float>(scaler_.state().growth_tracker)};
        whole("loss_scaler", "state", st, {2});
    }
}

}  // namespace px
