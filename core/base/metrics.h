// What one optimizer step reports: the trainer (core/train/job.h) fills it, observers, run files
// and checkpoints (core/io) keep it. And what the FP8 drift monitor (core/train/fp8_monitor.h)
// reports of one fp8-scaled tensor at one step: the job view and the run file's /fp8 keep it.
#pragma once
#include "core/base/shapes.h"

#include <cmath>
#include <iterator>
#include <string>

namespace px {

struct StepMetrics {
    i64 step = 0;          // 1-based
    double loss = 0;       // mean training loss of the step's batch, nats/token
    double val_loss = -1;  // validation loss when evaluated this step, else -1
    double grad_norm = 0;  // before clipping
    double lr = 0;
    double tokens_per_s = 0;
    double step_ms = 0;
    double comm_bytes = 0;  // bytes this rank sent in collectives during the step, all groups
};

// One fp8-scaled tensor of one step, over its whole logical tensor: every microbatch and every
// rank's piece (a layout gives the same row as the single device). `recipe` says what cast it:
// the run's own ("delayed", "block"), or a comparison the monitor made on the same values
// ("current": per-tensor current scaling from the step's amax; "block": 1 x b tiles, b x b
// weight blocks). Elements that are inf or NaN count only in `nonfinite`.
struct Fp8Stat {
    i64 step = 0;
    std::string tensor;  // "<matmul>/<role>": "h.3.attn.c_attn/x", "h.3.mlp.c_proj/dy", "lm_head/w"
    std::string recipe;
    i64 count = 0;      // finite elements measured
    i64 nonfinite = 0;  // elements that were inf or NaN
    i64 alerts = 0;     // Fp8Alert bits that fired on this row (the run's recipe only)
    double amax = 0;    // max |x|
    // The scale x was multiplied by before the cast: delayed, the tensor's; block, the scale of
    // the tile holding amax (448 / amax); current, fp8_max / amax.
    double scale = 0;
    // scale / the scale of the step before (delayed; block and current: of the last monitored
    // step); NaN when there is none, or it was the initial scale made from no amax.
    double scale_ratio = NAN;
    double saturated = 0;      // fraction of the finite elements with |x · scale| > fp8 max
    double underflow = 0;      // fraction of the nonzero finite elements that cast to 0
    double dynamic_range = 0;  // log2(amax) - log2(smallest nonzero |x|), in binades; 0: none
    double mse = 0;            // mean of (x - q)², q the read-back value
    double sqnr_db = 0;        // 10 log10(Σx² / Σ(x - q)²); inf when q = x everywhere
};

enum Fp8Alert : i64 {
    kFp8ScaleJump = 1,   // the scale changed by more than fp8_monitor.scale_jump
    kFp8Saturation = 2,  // saturated above fp8_monitor.saturation_max
    kFp8Sqnr = 4,        // SQNR below fp8_monitor.sqnr_min_db
};

// Fp8Stat's numeric fields by name, in the order of the run file's /fp8 datasets and Python's
// arrays (tensor and recipe are the string columns).
struct Fp8IntField {
    const char* name;
    i64 Fp8Stat::*field;
};
struct Fp8RealField {
    const char* name;
    double Fp8Stat::*field;
};
inline constexpr Fp8IntField kFp8Ints[] = {
    {"step", &Fp8Stat::step},
    {"count", &Fp8Stat::count},
    {"nonfinite", &Fp8Stat::nonfinite},
    {"alerts", &Fp8Stat::alerts},
};
inline constexpr Fp8RealField kFp8Reals[] = {
    {"amax", &Fp8Stat::amax},
    {"scale", &Fp8Stat::scale},
    {"scale_ratio", &Fp8Stat::scale_ratio},
    {"saturated", &Fp8Stat::saturated},
    {"underflow", &Fp8Stat::underflow},
    {"dynamic_range", &Fp8Stat::dynamic_range},
    {"mse", &Fp8Stat::mse},
    {"sqnr_db", &Fp8Stat::sqnr_db},
};
static_assert(std::size(kFp8Ints) == 4 && std::size(kFp8Reals) == 8,
              "a field added to Fp8Stat needs its entry here");

}  // namespace px
