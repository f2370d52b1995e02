// The FP8 drift monitor (docs/precision.md; its keys in docs/config.md): every fp8_monitor.every
// steps, statistics of every fp8-scaled tensor (each fp8 matmul's input X, weight W and output
// gradient dY) as that step cast it, reported to the job's observers (the run file's /fp8, the job
// view, the workbench, Python) with alerts when a scale jumps, saturation climbs or the SQNR falls.
//
// What a row measures (core/base/metrics.h Fp8Stat). The tensor is the logical one: every
// microbatch of the step and every rank's piece, each element once (a tensor that tensor
// parallelism holds whole on every tp rank is counted on tp rank 0, W on dp rank 0, a stage's
// tensors on their stage; X and W at their forward cast, dY at its backward cast, never the
// backward's or a recomputed block's casts of the same values). With x an element (the bf16
// value, exactly as an fp32), s its scale and q its read-back value (the cast's output):
//   saturated  |x · s| > fp8_max (computed in fp32 as the cast does), over the finite elements;
//   underflow  x != 0 and q == 0, over the nonzero finite elements;
//   mse, sqnr  Σ(x − q)² / count and 10 log10(Σx² / Σ(x − q)²).
// Comparisons (fp8_monitor.compare) measure the same values cast another way, without changing
// the run: "current" with the per-tensor scale fp8_max / amax of this step's whole tensor (e4m3
// for X and W, e5m2 for dY), "block" in DeepSeek-V3's 1 x b tiles and b x b weight blocks (e4m3).
//
// Layout-independent, exactly. Counts are integer sums; amax and the smallest nonzero |x| are a
// max and a min; the two float sums are exact: each term (x − q)² and x² is an fp64 value of a
// per-element computation, and the terms are added in a long fixed-point accumulator (ExactSum)
// whose integer digits are summed over the ranks, so the sum is the same number in any order and
// on any layout, and is rounded to fp64 once, from its digits. Every layout therefore reports
// the rows the single device reports, bit for bit (tests/validators/test_validators.cpp). These are
// statistics of the run, never part of its state: the monitor only reads the casts' inputs and
// outputs, and a run with it on ends in the bits of the run with it off.
//
// Alerts (fp8_monitor.scale_jump, saturation_max, sqnr_min_db) are judged on the rows of the
// run's own recipe, except those cast with delayed scaling's initial scale (step 1, before any
// amax is known: a tensor of tiny gradients underflows there by design). An alert sets the row's
// `alerts` bits and is reported as an event (EventKind::alert) with its evidence.
//
// Cost. Off (every = 0, the default) the monitor is not attached. On, a step that is not
// monitored costs a copy of the scales; a monitored step one pass over each cast's values (two
// with compare = "current", which keeps a copy of them until the step ends) and one reduction
// over the groups. bench/bench_fp8_monitor.cpp measures it.
//
// Index
//   ExactSum            an exact sum of doubles, the same in any order
//   Fp8Accum            one tensor's statistics as they accumulate
//   fp8_accumulate      adds a tensor cast with one scale (the plain computation tests check)
//   fp8_accumulate_blocks   the same for a block cast (b-wide tiles of rows, or b x b blocks)
//   Fp8Thresholds, judge_fp8   the alert rules, on one row
//   Fp8Monitor          one rank's monitor: observes the casts, reduces, reports
#pragma once
#include "core/base/config.h"
#include "core/base/metrics.h"
#include "core/model/fp8.h"
#include "core/train/job.h"
#include "core/train/runner.h"

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace px {

// An exact sum of finite doubles: each is split into 32-bit digits of a fixed-point number wide
// enough for the whole double range, so the sum is exact and does not depend on the order of
// the adds. value() rounds it to a double from its normalised digits (the same digits give the
// same double).
class ExactSum {
public:
    static constexpr int kDigits = 72;  // 2304 bits: 2^-1074 .. 2^1024 and carries
    void add(double x);                 // a finite x (others are the caller's to exclude)
    void add_at(std::uint64_t v, int p, bool negative);  // ± v · 2^(p - 1074)
    void merge(ExactSum& other);                         // this += other (both normalised)
    double value() const;
    void normalize();                   // digits 0 .. kDigits-2 into [0, 2^32), the top one signed
    std::array<i64, kDigits> digits{};  // normalised before being summed over ranks

private:
    int pending_ = 0;  // adds since the last normalize (digits hold 2^31 of them safely)
};

// One tensor's statistics as they accumulate (over microbatches, then ranks).
struct Fp8Accum {
    i64 count = 0, nonfinite = 0, nonzero = 0, saturated = 0, underflow = 0;
    float amax = 0, min_nonzero = INFINITY;
    ExactSum signal, error;  // Σx², Σ(x − q)²
};

// Adds n elements x (fp32 values) read back as q after a cast with scale s into an fp8 format
// of largest value fp8_max.
void fp8_accumulate(Fp8Accum& a, const float* x, const float* q, i64 n, float s, float fp8_max);
// The same for a block cast: x is (rows, K) row-major, cut into tiles of `band` rows (1 for
// activations, b for weights) and b columns, each with Fp8Scaling::block_scale of its own amax.
void fp8_accumulate_blocks(Fp8Accum& a, const float* x, const float* q, i64 rows, i64 K, i64 band,
                           i64 b);

// The row an accumulator makes (step, tensor and recipe, and scale and scale_ratio are the
// caller's).
Fp8Stat fp8_row(const Fp8Accum& a);

struct Fp8Thresholds {
    double scale_jump = 4.0;  // 0: off
    double saturation_max = 0.01;
    double sqnr_min_db = 10.0;
    explicit Fp8Thresholds(const Fp8MonitorConfig& c)
        : scale_jump(c.scale_jump), saturation_max(c.saturation_max), sqnr_min_db(c.sqnr_min_db) {}
};
// The Fp8Alert bits row fires, and the evidence as a sentence ("" when none fires).
i64 judge_fp8(const Fp8Stat& row, const Fp8Thresholds& t, std::string* evidence);

class Fp8Monitor : public Fp8CastObserver {
public:
    // A monitor of job's fp8 casts (its model's Fp8Scaling), attached by attach(): its step hooks
    // hold it, so it lives as long as the job. ConfigError naming the keys when the job has no
    // fp8 matmuls, or a "block" comparison's tiles would span tp ranks.
    static std::shared_ptr<Fp8Monitor> attach(Job& job, const Fp8MonitorConfig& cfg);
    Fp8Monitor(Job& job, const Fp8MonitorConfig& cfg);  // not yet attached
    ~Fp8Monitor() override;
    Fp8Monitor(const Fp8Monitor&) = delete;
    Fp8Monitor& operator=(const Fp8Monitor&) = delete;

    void on_cast(const Fp8Scaling& fp8, int gemm, Fp8Scaling::Role r, const Tensor& src,
                 const float* dst) override;

    // The rows of the last monitored step (every rank holds the same), in gemm, role, recipe
    // order.
    const std::vector<Fp8Stat>& last_rows() const { return rows_; }
    double seconds() const { return seconds_; }  // spent in the monitor so far, this rank

private:
    struct Kept;  // a cast's values, kept for the "current" comparison
    void before(i64 step);
    void updated(i64 step);
    size_t slot(int gemm, int role, int recipe) const {
        return (static_cast<size_t>(gemm) * Fp8Scaling::kRoles + static_cast<size_t>(role)) *
                   recipes_.size() +
               static_cast<size_t>(recipe);
    }
    bool counted_here(int gemm, Fp8Scaling::Role r);  // this rank counts this cast's elements
    void reduce(std::vector<Fp8Accum>& acc, size_t first, size_t stride);

    Job& job_;
    Fp8Scaling& fp8_;
    Fp8MonitorConfig cfg_;
    std::vector<std::string> recipes_;  // [0]: the run's; then the comparisons
    int current_ = -1, block_ = -1;     // their indices in recipes_, -1: not compared
    bool active_ = false;
    i64 step_ = 0;
    std::vector<Fp8Accum> acc_;  // (gemm, role, recipe)
    std::vector<char> w_seen_;   // per gemm: W cast this step
    std::vector<Kept> kept_;     // "current": the casts of this step
    // Delayed: per step, the scales it cast with and whether each was made from an amax.
    std::map<i64, std::vector<float>> scales_at_;
    std::map<i64, std::vector<char>> from_amax_at_;
    // Per (gemm, role, recipe) slot: the scales of the last few monitored steps (block and
    // current), by step.
    std::vector<std::map<i64, double>> monitored_scale_;
    std::vector<Fp8Stat> rows_;
    double seconds_ = 0;
};

}  // namespace px
