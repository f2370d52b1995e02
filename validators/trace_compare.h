// Two traces compared op by op under an error budget (docs/validation.md, "Comparing another
// framework's run"): `parallax compare REF.h5 RUN.h5`. The reference is a golden trace of
// Parallax's bitwise single device (parallax record) or a single-device PyTorch run recorded by
// parallax.torch; the run is any trace of the same model, weights and tokens (a PyTorch layout,
// Parallax in fast mode, ...). Unlike validate's bitwise check, the run may sum in any order: a
// difference is judged against what reordering fp32 (or the run's coarser precision) can explain.
//
// The budget. For a probe p of step s (its logical tensors r in the reference and c in the run),
//     rel(p) = ‖c − r‖₂ / ‖r‖₂        budget(p) = κ_phase · u · D(p)        ratio = rel / budget
// u: the coarser unit roundoff of the two traces' precisions (fp32 2⁻²⁴, bf16 2⁻⁸, fp16 2⁻¹¹,
//    fp8 as precision_unit: 2⁻³ for delayed scaling's e5m2 gradients, 2⁻⁴ for block scaling);
// D: the op's depth in the run, in layers traversed since step 1 began. A step of L blocks is
//    S = 2L + 5 levels: the forward's embedding 1, block l l + 2, the head side (ln_f, head, loss)
//    L + 2; the backward's head side L + 3, block l 2L + 3 − l (a block's parameter gradients
//    with it), the embedding and every other parameter gradient and the clipping norm 2L + 4;
//    the update (weights, Adam's moments) 2L + 5. D = (s − 1)·S + level.
// Why this form: every op rounds its outputs (relative error ≤ u each, for sums in any order
// γ_n ≈ n·u on the worst case, far less in practice), and an error made early reaches every later
// op through the layers and, through the weights, every later step; to first order the errors
// add, so a tensor's relative error grows with the ops behind it. κ_phase (the constant per
// phase: fwd, bwd, grad, the updated weights "param", and the optimizer's other state "optim":
// Adam's moments, fp8 scales) is measured, not argued: bench/compare_calibration.py runs Parallax's own jobs with randomised
// summation orders (canonical-tree block sizes drawn at random, fast mode's kernels, thread counts),
// takes the largest rel/(u·D) each phase shows, and κ is that times a margin (kCompareMargin).
// A bug changes a tensor at its op by far more than rounding (a missing all-reduce halves or
// doubles it, a wrong normalisation scales it by the token counts' ratio): ratios of 10³–10⁷.
//
// The verdict: the first probe, in the reference's order and step by step, whose ratio is over 1
// — its step, op and tensor, the largest element (its index and both values), the ratio, and,
// where the run's trace says which rank held which piece (/pieces, validators/trace.h), the ratio
// of each rank's piece, so the axis that breaks shows. Replicas that differ from the logical
// tensor (/replicas: a dp rank whose gradient was never all-reduced) are judged as pieces of
// their own, naming the rank. Within budget everywhere: "consistent with rounding".
//
// Index
//   kCompareKappa, kCompareMargin   the calibrated constants
//   probe_level, probe_depth        a probe's level in its step and its depth D
//   trace_unit                      a trace's unit roundoff (precision attribute or config)
//   CompareRow, PieceRatio, TraceComparison   rows, the first over budget, its split by ranks
//   compare_traces                  the comparison itself
#pragma once
#include "core/base/shapes.h"
#include "validators/trace.h"

#include <string>
#include <vector>

namespace px {

// κ per phase (bench/compare_calibration.py prints the measurement they come from): the largest
// rel / (u·D) seen over the calibration's randomised orderings, times kCompareMargin, rounded up
// to two figures. Measured over 2 × 12 orderings of 3 jobs (GPT-2 with 4 and 8 blocks, the tiny
// Llama), 5 steps, 116,400 probe rows: fwd 3.86, bwd 3.27, grad 3.80, param 412.8, optim 2.12
// (docs/validation.md has the table).
// The weights after an update get their own: where a gradient is zero but for rounding (the
// key bias of attention, whose every gradient cancels), Adam divides rounding noise by
// √v + ε, so the update's rounding is amplified by up to lr/ε; the moments are not.
struct CompareKappa {
    double fwd, bwd, grad, param, optim;
};
inline constexpr double kCompareMargin = 8.0;
inline constexpr CompareKappa kCompareKappa{31.0, 27.0, 31.0, 3300.0, 17.0};
// The κ of a probe's phase and op ("mgrad" as "grad"; "optim" with op "param" as "param").
double compare_kappa(const std::string& phase, const std::string& op);

// The level of a probe in its step (1 .. 2L + 5, above) and its depth D; `layers` the model's
// blocks. DataError naming the probe when its name is not step/phase/layer/op/tensor.
i64 probe_level(const std::string& probe, int layers);
i64 probe_depth(const std::string& probe, int layers);

// A trace's unit roundoff: its precision attribute, else its config's precision (budget.h's
// precision_unit); DataError naming the file when neither says.
double trace_unit(const TraceReader& t);

// One rank's piece of the first over-budget probe (or of a replica), judged alone.
struct PieceRatio {
    int rank = 0;
    std::string coords;  // "dp 0, tp 1" from the run's layout; "" when it has none
    Hyperslab slab;
    double rel = 0, ratio = 0;
};

struct CompareRow {
    std::string probe;       // the probe's name, e.g. "2/bwd/1/attn.proj/dinp"
    int rank = -1;           // a replica's rank (a piece that differs from the run's logical tensor)
    i64 step = 0;
    i64 elements = 0;
    double error = 0;        // ‖c − r‖₂ (infinite where one side holds a NaN the other does not)
    double scale = 0;        // ‖r‖₂
    double rel = 0;          // error / scale (0 when both are 0)
    i64 depth = 0;           // D
    double budget = 0;       // κ_phase · u · D
    double ratio = 0;        // rel / budget
    std::vector<i64> worst_at;  // the element with the largest |c − r| (logical index)
    double worst_ref = 0, worst_run = 0;
    bool within() const { return ratio <= 1.0; }
    std::string op() const;  // the probe without its step: "bwd/1/attn.proj/dinp"
};

struct TraceComparison {
    std::string ref_path, run_path;
    std::string ref_source, run_source;  // "parallax" or "torch"
    double unit = 0;                     // u
    int layers = 0;                      // L
    std::vector<CompareRow> rows;        // every probe both hold, in order; replicas after theirs
    i64 first_over = -1;                 // index into rows of the verdict's probe; -1: none
    std::vector<PieceRatio> split;       // the first over-budget probe by the run's pieces
    std::vector<std::string> only_ref, only_run;  // probes one trace holds and the other lacks
    double max_ratio = 0;
    std::string worst;                   // the row with max_ratio ("probe" or "probe on rank r")
    bool within() const { return first_over < 0; }
    std::string verdict() const;         // one line: "consistent with rounding" or the first op
    std::string text() const;            // the verdict, the split, and the ops' largest ratios
    std::string json() const;            // every row, the verdict and the split (schema
                                         // "parallax-compare"; views/trace_view.h reads it back)
};

// ref against run, probe by probe. DataError naming the probe when the traces disagree on its
// shape or hold no probe in common (not the same model). `cancel` is asked between probes.
TraceComparison compare_traces(const TraceReader& ref, const TraceReader& run,
                               const Cancel& cancel = {});

}  // namespace px
