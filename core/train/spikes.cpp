#include "core/train/spikes.h"

#include "core/base/arena.h"
#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/train/checkpointing.h"
#include "core/train/faults.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

namespace px {

namespace {

constexpr double kMadToSigma = 1.4826;  // σ of normal noise = 1.4826 MAD
constexpr int kMaxRollbacksToOneState = 2;

double median_of(std::vector<double>& v) {
    const size_t n = v.size(), h = n / 2;
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h), v.end());
    const double hi = v[h];
    if (n % 2) return hi;
    const double lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(h));
    return lo + (hi - lo) / 2;
}

std::uint64_t bits_of(double x) {
    std::uint64_t b;
    std::memcpy(&b, &x, sizeof b);
    return b;
}

std::string fmt(const char* f, double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, x);
    return buf;
}

std::string z_text(double z) { return std::isinf(z) ? std::string("inf") : fmt("%.1f", z); }

}  // namespace

double RobustStats::z(double x) const {
    if (!std::isfinite(x)) return std::numeric_limits<double>::infinity();
    const double d = x - median;
    if (mad <= 0) return d > 0 ? std::numeric_limits<double>::infinity() : 0.0;
    return d / (kMadToSigma * mad);
}

RobustStats robust_stats(std::vector<double> values) {
    values.erase(std::remove_if(values.begin(), values.end(),
                                [](double x) { return !std::isfinite(x); }),
                 values.end());
    RobustStats s;
    s.n = static_cast<i64>(values.size());
    if (values.empty()) return s;
    s.median = median_of(values);
    for (double& x : values) x = std::fabs(x - s.median);
    s.mad = median_of(values);
    return s;
}

LayerGroups::LayerGroups(const ModelConfig& mc) {
    const ParamTable t = ParamTable::build(mc);
    names.push_back("embed");
    for (i64 l = 0; l < mc.layers; l++) names.push_back("h." + std::to_string(l));
    names.push_back("ln_f");
    numel.assign(names.size(), 0);
    group_of.assign(t.entries.size(), 0);
    for (const TableEntry& e : t.entries) {
        const std::string name = e.name;
        int g = 0;
        if (name.rfind("h.", 0) == 0)
            g = 1 + std::stoi(name.substr(2));
        else if (name.rfind("ln_f", 0) == 0)
            g = static_cast<int>(names.size()) - 1;
        group_of[static_cast<size_t>(e.id)] = g;
        numel[static_cast<size_t>(g)] += e.numel();
    }
}

SpikeGuard::SpikeGuard(const Config& cfg, comm::Communicator& world)
    : cfg_(cfg), sc_(cfg.spikes), world_(world), active_(cfg.spikes.action != "off"),
      groups_(cfg.model) {}

bool SpikeGuard::wants_snapshots() const { return sc_.action == "rollback" || sc_.replay; }

void SpikeGuard::attach(Job& job) {
    if (!active_) return;
    job.watch_logits(true);
    StepHooks h;
    h.grads = [this, &job](i64, float* g) {
        const bool shard = cfg_.layout.zero >= 2 && job.dp_size() > 1;
        const Range r = shard ? job.data().update_range() : Range{0, job.model().table().total};
        grad_hash_ = hash_floats(g + r.lo, r.size());
    };
    h.judge = [this, &job](i64 step, const StepMetrics& m) { return judge(job, step, m); };
    h.updated = [this, &job](i64 step) { after_update(job, step); };
    job.add_step_hooks(std::move(h));
    if (wants_snapshots()) job.snapshot(snap_);
}

UpdateChoice SpikeGuard::judge(Job& job, i64 step, const StepMetrics& m) {
    const std::vector<StepMetrics>& hist = job.history();
    const size_t n = hist.size(), w = static_cast<size_t>(sc_.window);
    std::vector<double> losses, norms;
    for (size_t i = n > w ? n - w : 0; i < n; i++) {
        losses.push_back(hist[i].loss);
        norms.push_back(hist[i].grad_norm);
    }
    const RobustStats L = robust_stats(losses), G = robust_stats(norms);
    const bool judged = L.n >= sc_.min_history && G.n >= sc_.min_history;
    loss_z_ = judged ? L.z(m.loss) : 0;
    // fp16's overflowing steps have a non-finite norm by design: the loss scaler skips them.
    const bool norm_counts = std::isfinite(m.grad_norm) || !job.loss_scaler().dynamic();
    grad_z_ = judged && norm_counts ? G.z(m.grad_norm) : 0;
    bool mine;
    if (!std::isfinite(m.loss))
        mine = true;
    else if (!std::isfinite(m.grad_norm))
        mine = !job.loss_scaler().dynamic();
    else
        mine = loss_z_ > sc_.z_threshold || grad_z_ > sc_.z_threshold;
    // Every rank acts alike, on the worst it saw: a fault may have struck one rank's gradient.
    const float inf = std::numeric_limits<float>::infinity();
    auto as_float = [&](double z) { return std::isfinite(z) ? static_cast<float>(z) : inf; };
    float worst[4] = {mine ? 1.0f : 0.0f, as_float(loss_z_), as_float(grad_z_),
                      mine ? static_cast<float>(world_.rank()) : -1.0f};
    if (world_.size() > 1) world_.all_reduce_max(worst, 4);
    spiked_ = worst[0] > 0;
    const bool own = as_float(loss_z_) == worst[1] && as_float(grad_z_) == worst[2];
    loss_z_ = worst[1];
    grad_z_ = worst[2];
    raised_on_ = own ? -1 : static_cast<int>(worst[3]);
    clip_norm_ = 0;
    if (sc_.action == "clip" && judged)
        clip_norm_ = G.median + sc_.clip_z * kMadToSigma * G.mad;
    before_update(job);

    UpdateChoice c;
    c.clip_norm = clip_norm_;
    const bool skip_action = sc_.action == "skip" || sc_.action == "rollback";
    if (phase_ != Phase::normal && step == target_)
        c.apply = false;  // a replay never applies the spike step
    else if (spiked_ && skip_action)
        c.apply = false;
    return c;
}

void SpikeGuard::before_update(Job& job) {
    const bool shard = job.data().zero_sharded();
    const float* p = job.model().params();
    w_sq_ = job.tensor_sums_of_squares(p, shard);
    const Range r = job.data().update_range();
    w_before_.assign(p + r.lo, p + r.hi);
}

void SpikeGuard::after_update(Job& job, i64 step) {
    const bool shard = job.data().zero_sharded();
    const Range r = job.data().update_range();
    const float* p = job.model().params();
    scratch_.resize(static_cast<size_t>(job.model().table().total));
    for (i64 i = r.lo; i < r.hi; i++)
        scratch_[static_cast<size_t>(i)] = p[i] - w_before_[static_cast<size_t>(i - r.lo)];
    const std::vector<float> dw_sq = job.tensor_sums_of_squares(scratch_.data(), shard);
    const float* v = job.optimizer().v();
    for (i64 i = r.lo; i < r.hi; i++) scratch_[static_cast<size_t>(i)] = std::sqrt(v[i - r.lo]);
    const std::vector<float> v_sum = job.tensor_sums_of_squares(scratch_.data(), shard);
    const std::vector<float>& g_sq = job.grad_sums_of_squares();

    const size_t ng = groups_.names.size();
    std::vector<double> g(ng, 0), wsq(ng, 0), dw(ng, 0), vs(ng, 0);
    for (size_t id = 0; id < groups_.group_of.size(); id++) {
        const size_t k = static_cast<size_t>(groups_.group_of[id]);
        g[k] += g_sq[id];
        wsq[k] += w_sq_[id];
        dw[k] += dw_sq[id];
        vs[k] += v_sum[id];
    }
    Evidence e;
    e.loss_z = loss_z_;
    e.grad_z = grad_z_;
    std::vector<NamedValue> values;
    const double bias = 1.0 - std::pow(cfg_.train.beta2, static_cast<double>(step));
    for (size_t k = 0; k < ng; k++) {
        const std::string pre = "layer." + groups_.names[k] + ".";
        e.grad_norm.push_back(std::sqrt(g[k]));
        e.update_ratio.push_back(wsq[k] > 0 ? std::sqrt(dw[k] / wsq[k]) : 0.0);
        const double vhat = vs[k] / static_cast<double>(groups_.numel[k]) / bias;
        e.eps_ratio.push_back(vhat > 0 ? cfg_.train.eps / std::sqrt(vhat) : 0.0);
        values.push_back({pre + "grad_norm", e.grad_norm.back()});
        values.push_back({pre + "update_ratio", e.update_ratio.back()});
        if (vhat > 0) values.push_back({pre + "adam_eps_ratio", e.eps_ratio.back()});
    }
    const std::vector<float>& lm = job.logit_max();
    for (size_t l = 0; l < lm.size(); l++) {
        e.logit_max.push_back(lm[l]);
        if (std::isfinite(lm[l]))
            values.push_back({"layer.h." + std::to_string(l) + ".attn_logit_max", lm[l]});
    }
    values.push_back({"spike.loss_z", std::isfinite(loss_z_) ? loss_z_ : 1e300});
    values.push_back({"spike.grad_norm_z", std::isfinite(grad_z_) ? grad_z_ : 1e300});
    if (sc_.action == "clip") values.push_back({"spike.clip_norm", clip_norm_});
    evidence_[step] = std::move(e);
    values_[step] = values;
    while (!evidence_.empty() && evidence_.begin()->first < step - 4 * sc_.window)
        evidence_.erase(evidence_.begin());
    while (!values_.empty() && values_.begin()->first < step - 4 * sc_.window)
        values_.erase(values_.begin());
    job.emit_values(step, values);
}

// "started in h.1: grad norm 25.3x its median (then h.0 9.1x); update ratio 3.2e-03;
// max attention logit 4.10 (h.1); Adam eps/sqrt(v) 0.01": where a step's evidence stands out
// against the steps before it.
std::string SpikeGuard::evidence_text(i64 step, const Evidence& e) const {
    const size_t ng = e.grad_norm.size();
    if (ng == 0) return "no evidence recorded";
    std::vector<double> ratio(ng, 1.0);
    for (size_t k = 0; k < ng; k++) {
        std::vector<double> past;
        for (auto p = evidence_.begin(); p != evidence_.end() && p->first < step; ++p)
            if (p->first >= step - sc_.window) past.push_back(p->second.grad_norm[k]);
        const RobustStats s = robust_stats(past);
        ratio[k] = s.n > 0 && s.median > 0 ? e.grad_norm[k] / s.median : 1.0;
    }
    std::vector<size_t> order(ng);
    for (size_t k = 0; k < ng; k++) order[k] = k;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ratio[a] > ratio[b]; });
    const size_t top = order[0];
    std::string t = "started in " + groups_.names[top] + ": grad norm " +
                    fmt("%.3g", e.grad_norm[top]) + ", " + fmt("%.1f", ratio[top]) +
                    "x its median";
    if (ng > 1)
        t += " (then " + groups_.names[order[1]] + " " + fmt("%.1f", ratio[order[1]]) + "x)";
    if (e.update_ratio[top] > 0) t += "; its update ratio |dW|/|W| " + fmt("%.2e", e.update_ratio[top]);
    if (!e.logit_max.empty()) {
        const auto m = std::max_element(e.logit_max.begin(), e.logit_max.end());
        t += "; max attention logit " + fmt("%.2f", *m) + " (h." +
             std::to_string(m - e.logit_max.begin()) + ")";
    }
    t += "; Adam eps/sqrt(v) " + fmt("%.2g", e.eps_ratio[top]);
    return t;
}

bool SpikeGuard::after_step(Job& job) {
    if (!active_) return true;
    const i64 step = job.steps_done();
    auto snapshot_if_due = [&] {
        if (wants_snapshots() && step % sc_.snapshot_every == 0) job.snapshot(snap_);
        return true;
    };
    switch (phase_) {
        case Phase::normal: {
            if (step == attributed_) {  // the spike step again, after its replay: as decided
                attributed_ = -1;
                spiked_ = false;
                job.report_event({target_, EventKind::spike, pending_, first_values_});
                return snapshot_if_due();
            }
            if (!spiked_) return snapshot_if_due();
            target_ = step;
            first_ = job.history().back();
            const auto ev = evidence_.find(step);
            first_evidence_ = ev != evidence_.end() ? ev->second : Evidence{};
            const auto vs = values_.find(step);
            first_values_ = vs != values_.end() ? vs->second : std::vector<NamedValue>{};
            first_hash_ = grad_hash_;
            first_raised_on_ = raised_on_;
            first_loss_bits_ = bits_of(first_.loss);
            first_norm_bits_ = bits_of(first_.grad_norm);
            if (sc_.replay && snap_.step >= 0 && snap_.step < step) {
                phase_ = Phase::replay;
                if (snap_.step == step - 1) prev_ = snap_;
                job.rewind(snap_);
                return false;
            }
            verdict_ = sc_.replay ? "not attributed (no snapshot before it)"
                                  : "not attributed (spikes.replay is off)";
            return act(job, false) && snapshot_if_due();
        }
        case Phase::replay: {
            if (step == target_ - 1) job.snapshot(prev_);
            if (step < target_) return true;
            attribute(job);
            if (phase_ == Phase::swap) {
                job.rewind(prev_);
                job.swap_batch(target_, job.batch_index(target_));
                return false;
            }
            return act(job, true);
        }
        case Phase::swap: {
            const StepMetrics& m = job.history().back();
            const i64 batch = job.batch_index(target_ - 1);
            // Batches count from 0 and steps from 1, and skipped batches shift the rest.
            const std::string which = "batch " + std::to_string(batch) + " (the one step " +
                                      std::to_string(target_) + " drew; batches count from 0)";
            if (spiked_)
                verdict_ = "state: from the state before it, the next step's batch spikes too (loss " +
                           fmt("%.4g", m.loss) + ", z " + z_text(loss_z_) + "; grad norm z " +
                           z_text(grad_z_) + "), so the model's state, not " + which +
                           ", is the cause";
            else
                verdict_ = "data: the replay gave the same bits, and from the state before it the next "
                           "step's batch trains normally (loss " + fmt("%.4g", m.loss) + ", z " +
                           z_text(loss_z_) + "), so " + which + " caused it";
            phase_ = Phase::normal;
            return act(job, true);
        }
    }
    return true;
}

// The replay reached the spike step: the same bits everywhere, or the ranks that differ.
void SpikeGuard::attribute(Job& job) {
    const StepMetrics& m = job.history().back();
    std::vector<i64> mine = {static_cast<i64>(first_hash_), static_cast<i64>(grad_hash_)};
    std::vector<i64> all(static_cast<size_t>(2 * world_.size()));
    if (world_.size() > 1)
        world_.all_gather(all.data(), mine.data(), 2);
    else
        all = mine;
    std::vector<int> differ;
    for (int r = 0; r < world_.size(); r++)
        if (all[static_cast<size_t>(2 * r)] != all[static_cast<size_t>(2 * r + 1)])
            differ.push_back(r);
    const bool metrics_same =
        bits_of(m.loss) == first_loss_bits_ && bits_of(m.grad_norm) == first_norm_bits_;
    if (differ.empty() && metrics_same) {
        phase_ = Phase::swap;
        return;
    }
    std::string ranks;
    for (int r : differ) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    verdict_ = "not reproducible: the replay from step " + std::to_string(snap_.step) + " gave " +
               (differ.empty() ? std::string("a different loss or gradient norm")
                               : "different gradient bits on world rank" +
                                     std::string(differ.size() > 1 ? "s " : " ") + ranks) +
               " (first run: loss " + fmt("%.6g", first_.loss) + ", grad norm " +
               fmt("%.6g", first_.grad_norm) + "; replay: " + fmt("%.6g", m.loss) + ", " +
               fmt("%.6g", m.grad_norm) + "): a hardware fault or non-determinism" +
               (differ.empty() ? "" : ", not the data; check that rank's device");
    phase_ = Phase::normal;
}

// The newest checkpoint of checkpoint.dir before `step` ("" if none).
std::string SpikeGuard::checkpoint_before(i64 step) const {
    for (i64 s = step - 1; s >= 1; s--) {
        const std::string path = checkpoint_path(cfg_.checkpoint.dir, s);
        if (std::filesystem::exists(path)) return path;
    }
    return "";
}

// Rolls every rank back (a memory snapshot or a checkpoint) and skips the batches; "" when there
// is nothing to roll back to, else what was done.
std::string SpikeGuard::roll_back(Job& job) {
    const i64 batch = job.batch_index(target_ - 1);
    std::vector<i64> batches;  // of steps 0 .. target_-1, before anything more is skipped
    for (i64 s = 0; s < target_; s++) batches.push_back(job.batch_index(s));
    i64 back_to = -1;
    std::string where;
    if (sc_.rollback_to == "checkpoint") {
        const std::string path = checkpoint_before(target_);
        if (path.empty()) return "";
        const std::vector<i64> before = job.skipped_batches();
        Config c = cfg_;
        c.checkpoint.resume = path;
        RunCheckpoints ck(c, &world_);
        back_to = ck.resume(job);
        job.skip_batches(before);
        where = "the checkpoint of step " + std::to_string(back_to);
    } else {
        if (snap_.step < 0 || snap_.step >= target_) return "";
        job.rewind(snap_);
        back_to = snap_.step;
        where = "step " + std::to_string(back_to);
    }
    if (back_to == rollbacks_to_) {
        rollback_count_++;
    } else {
        rollbacks_to_ = back_to;
        rollback_count_ = 1;
    }
    std::vector<i64> skip;
    if (sc_.skip == "spike")
        skip.push_back(batch);
    else
        skip.assign(batches.begin() + back_to, batches.end());
    job.skip_batches(skip);
    if (snap_.step != back_to) job.snapshot(snap_);  // a checkpoint's state is the new snapshot
    return "rolled back to " + where + ", " +
           (sc_.skip == "spike" ? "batch " + std::to_string(batch)
                                : std::to_string(skip.size()) + " batches") +
           " skipped (" + std::to_string(job.skipped_batches().size()) + " in all)";
}

// The spike's event and its action. replayed: the job stands after a replay of the spike step
// (its update not applied); otherwise after the first run of it, which judge already acted on.
// False when the job was rewound.
bool SpikeGuard::act(Job& job, bool replayed) {
    const StepMetrics& f = first_;
    const bool by_loss = first_evidence_.loss_z > sc_.z_threshold || !std::isfinite(f.loss);
    const bool by_norm = first_evidence_.grad_z > sc_.z_threshold;
    const std::string what =
        std::string(by_loss && by_norm ? "loss and gradient-norm spike"
                    : by_loss          ? "loss spike"
                                       : "gradient-norm spike") +
        " at step " + std::to_string(target_) + ": loss " + fmt("%.4g", f.loss) + " (z " +
        z_text(first_evidence_.loss_z) + "), grad norm " + fmt("%.4g", f.grad_norm) + " (z " +
        z_text(first_evidence_.grad_z) + ") against the last " + std::to_string(sc_.window) +
        " steps" +
        (first_raised_on_ >= 0 ? " (the z-scores are world rank " + std::to_string(first_raised_on_) +
                                     "'s: its metrics differ from rank 0's)"
                               : std::string()) +
        "; " + evidence_text(target_, first_evidence_) + "; verdict: " + verdict_;
    auto report = [&](const std::string& done) {
        if (job.pp_rank() == 0 && job.dp_rank() == 0 && job.tp_rank() == 0)
            std::fprintf(stderr, "parallax: %s; action: %s\n", what.c_str(), done.c_str());
        return what + "; action: " + done;
    };
    std::string done;
    if (sc_.action == "rollback") {
        const bool again = rollback_count_ >= kMaxRollbacksToOneState &&
                           rollbacks_to_ == (sc_.rollback_to == "memory" ? snap_.step : rollbacks_to_);
        if (!again) done = roll_back(job);
        if (!done.empty()) {
            spiked_ = false;
            job.report_event({target_, EventKind::spike, report(done), first_values_});
            return false;
        }
        done = again ? "it spiked again after " + std::to_string(rollback_count_) +
                           " rollbacks to step " + std::to_string(rollbacks_to_) +
                           ", so its update was skipped instead"
                     : "nothing before it to roll back to, so its update was skipped";
    } else if (sc_.action == "skip") {
        done = "its update was skipped";
    } else if (sc_.action == "clip") {
        done = "its gradient was clipped to norm " + fmt("%.4g", clip_norm_);
    } else {
        done = "logged";
    }
    if (replayed) {  // the step runs once more from the state before it, acted on as judged
        pending_ = report(done);
        job.rewind(prev_);
        attributed_ = target_;
        return false;
    }
    spiked_ = false;
    job.report_event({target_, EventKind::spike, report(done), first_values_});
    return true;
}

}  // namespace px
