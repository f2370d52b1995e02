// Loss spikes: caught as they start, with evidence of where, attributed by replay, and logged,
// skipped, clipped or rolled back ([spikes], off unless spikes.action is set).
//
// Index
//   RobustStats   median and MAD of a window; the robust z-score of a value against them
//   robust_stats  of a window of values (NaN and inf left out)
//   LayerGroups   the whole model's tensors grouped by layer: embed, h.0 .. h.L-1, ln_f
//   SpikeGuard    on every rank: detection, evidence, replay and the action (RankGuards)
//
// Detection. Before each step's update, its loss and its global gradient norm (the same on every
// rank) are judged against the previous spikes.window steps of the history: the robust z-score
// z = (x - median) / (1.4826 MAD), MAD the median absolute deviation (1.4826 MAD estimates the
// standard deviation of normal noise, and one outlier in the window moves neither). A step is a
// spike when either z is above spikes.z_threshold, or its loss or norm is not finite; nothing is
// judged before spikes.min_history steps. Spikes are upward: a loss that drops is not one. Every
// rank's verdict is reduced (max over the world), so all act alike even when a fault made one
// rank's gradient differ.
//
// How much history a verdict needs. The median and MAD of a few steps are themselves noisy: on
// steady Gaussian noise, a z above 6 comes by chance on 8% of the steps judged against 3 steps,
// 0.24% against 10 and 0.02% against 20 (bench_spikes measures the table on this detector), so
// a short history flags normal batches — and early on, during warm-up, the loss and norm also
// move fastest. The rule: no step is judged against fewer than kSpikeMinHistory (20) finite
// steps; the config refuses a smaller spikes.min_history (default 20) and a window shorter than
// that. Until then a spike is seen only when the loss or norm is not finite.
//
// Evidence, every step, per layer group (LayerGroups), the same bits on every rank and layout:
//   layer.<g>.grad_norm         ‖∇‖ of the group's tensors (the canonical per-tensor sums of
//                               the global norm, Job::grad_sums_of_squares)
//   layer.<g>.update_ratio      ‖ΔW‖ / ‖W‖ of the step's update (0 for a skipped update)
//   layer.h.<l>.attn_logit_max  the largest attention logit q·k/√HS of the step's forwards
//   layer.<g>.adam_eps_ratio    ε / √(mean v̂), v̂ = v / (1 - β2^t) (√v summed as squares: its
//                               canonical per-tensor sums): near 1 or above, ε and not the
//                               gradient's history sets the step size (Adam's ε-dominated
//                               regime, where a sudden gradient is not damped)
//   spike.loss_z, spike.grad_norm_z (1e300 for +inf), spike.clip_norm (clip)
// They go to observers (Observer::on_values: the run file's /metrics/<name>, the job view).
// Group sums are in double in a fixed order from the per-tensor sums, so layouts agree.
// A spike's event names the layer whose gradient norm grew most against its own median.
//
// Actions (spikes.action):
//   log        record the spike (an event "spike" with its evidence) and go on;
//   skip       and skip its update (its batch is not drawn again);
//   clip       every step after min_history, the gradient is clipped to the norm
//              median + clip_z · 1.4826 MAD of the window (ZClip's adaptive clipping, with the
//              robust statistics instead of an EMA); a spike is recorded and clipped;
//   rollback   every rank goes back to the newest in-memory snapshot before the spike (taken
//              every spikes.snapshot_every steps), or to the newest checkpoint before it
//              (rollback_to = "checkpoint"), and never draws the spike step's batch (skip =
//              "spike") or any batch since that state (skip = "since_snapshot") again, as PaLM
//              did. A step that spikes again after two rollbacks to the same state is skipped.
//              Every later step then draws the batch one further on per batch skipped
//              (Job::batch_index): batches keep their order, steps no longer match a clean run's.
//
// Attribution by replay (spikes.replay, with a snapshot to start from). Bitwise mode makes a
// step a pure function of the state and the batch, so re-running it tells causes apart:
//   1. from the snapshot, the steps up to the spike are re-run and the spike step's loss,
//      gradient norm and every rank's gradient hash are compared with the first run's: if they
//      differ, the spike is not reproducible (a hardware fault or non-determinism), and the
//      ranks whose gradients differ are named, as the replica check names them;
//   2. if they match, the spike step is run once more from the state before it with the next
//      step's batch in place of its own: no spike then means the batch caused it ("data"),
//      a spike again means the state did ("state").
// The verdict goes in the event. Replayed steps send their rows and values again (the run file
// replaces them); the replay never applies the spike step's update.
#pragma once
#include "core/base/config.h"
#include "core/comm/comm.h"
#include "core/train/job.h"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace px {

struct RobustStats {
    double median = 0, mad = 0;
    i64 n = 0;  // finite values the statistics are of
    // (x - median) / (1.4826 MAD); with MAD 0 (a flat window) any x above the median is +inf,
    // and x at or below it 0. NaN and inf x give +inf.
    double z(double x) const;
};
RobustStats robust_stats(std::vector<double> values);

// The whole model's tensors (by id) in groups: "embed" (wte, wpe), "h.<l>" per block, "ln_f".
struct LayerGroups {
    std::vector<std::string> names;
    std::vector<int> group_of;  // per tensor id
    std::vector<i64> numel;     // per group
    explicit LayerGroups(const ModelConfig& mc);
};

class SpikeGuard {
public:
    SpikeGuard(const Config& cfg, comm::Communicator& world);
    bool active() const { return active_; }
    // Adds the step hooks (judge, gradient hash, evidence) and takes the first snapshot.
    void attach(Job& job);
    // After each step, on every rank. False when the job was rewound (a replay or a rollback):
    // the caller skips its own per-step work, and the job's loop re-runs from there.
    bool after_step(Job& job);

private:
    enum class Phase { normal, replay, swap };
    struct Evidence {
        std::vector<double> grad_norm, update_ratio, logit_max, eps_ratio;
        double loss_z = 0, grad_z = 0;
    };
    UpdateChoice judge(Job& job, i64 step, const StepMetrics& m);
    void before_update(Job& job);
    void after_update(Job& job, i64 step);
    bool wants_snapshots() const;
    void attribute(Job& job);
    bool act(Job& job, bool replayed);
    std::string roll_back(Job& job);
    std::string checkpoint_before(i64 step) const;
    std::string evidence_text(i64 step, const Evidence& e) const;

    Config cfg_;
    SpikesConfig sc_;
    comm::Communicator& world_;
    bool active_ = false;
    LayerGroups groups_;

    // Detection of the step being run.
    double loss_z_ = 0, grad_z_ = 0, clip_norm_ = 0;
    bool spiked_ = false;
    int raised_on_ = -1;  // the world rank whose z-scores were the worst, when not this one's
    std::map<i64, Evidence> evidence_;  // by step (a re-run step replaces its entry)
    std::map<i64, std::vector<NamedValue>> values_;  // what each step emitted
    std::vector<float> w_before_, scratch_;
    std::vector<float> w_sq_;  // ‖W‖² per tensor before the update

    // The spike being handled.
    Phase phase_ = Phase::normal;
    i64 target_ = -1;      // its step
    i64 attributed_ = -1;  // a step whose verdict is known: its re-run acts and reports
    std::uint64_t grad_hash_ = 0;  // this rank's gradient hash of the step being run
    std::uint64_t first_hash_ = 0, first_loss_bits_ = 0, first_norm_bits_ = 0;
    std::string verdict_;
    std::string pending_;  // the event of a spike whose step runs once more (attributed_)
    StepMetrics first_;  // the spike step's metrics in the first run
    Evidence first_evidence_;
    std::vector<NamedValue> first_values_;  // the spike step's values, sent with its event
    int first_raised_on_ = -1;
    LocalSnapshot snap_, prev_;  // the newest snapshot; the state before the spike (replay)
    i64 rollbacks_to_ = -1;      // the snapshot step rolled back to, and how often
    int rollback_count_ = 0;
};

}  // namespace px
