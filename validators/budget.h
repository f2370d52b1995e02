// The fast-mode error budget (docs/numerics.md, fast mode): a candidate run's error against the
// bitwise single-device reference, tensor by tensor, judged against a budget derived from the
// reference's own rounding error, never against a hand-picked tolerance.
//
// Index
//   kBudgetK, kBudgetQ, budget_multiplier   the constants below and where they come from
//   unit_roundoff, precision_unit            each precision's unit roundoff, and a job's coarsest
//   precision_multiplier                     q · (k − 1), applied to a precision's own error
//   TensorBudget, BudgetReport               per tensor: error, budget, ratio; the verdict
//   tensor_budget                            one tensor's row, from its runs' values
//   error_budget                             compares a candidate with the references
//
// The proxy for fp64. There is no fp64 training run, so the exact trajectory x is unknown. What
// exists is several valid fp32 orderings of the same math: the bitwise single device r (the
// reference), the single device in fast mode (oneDNN kernels, any order) and the bitwise single
// device with another numerics.block (another canonical tree). Model each run as x plus its own
// rounding error: r = x + e_r, a_i = x + e_i, with the e independent and of the same size,
// E‖e‖² = σ² per tensor (same kernels class, same precision, same number of steps). Then
//     E‖a_i − r‖² = 2σ²,   so   σ̂² = Σ_i ‖a_i − r‖² / (2·n_alt)
// estimates the reference's own error against the exact run (σ = ‖r − x‖), per tensor, from
// measured quantities only. Floor: a tensor stored in fp32 carries at least one rounding of each
// element, ‖e‖ ≤ u‖x‖ with u = 2⁻²⁴, so σ̂ is never taken below u‖r‖ (a tensor on which the
// orderings happen to agree does not get a zero budget).
// Measured (tests/validators/test_budget.cpp): the block-32 tree sits closer to the block-16 reference than
// the fast single device does (they share the sequential order inside each block), so it alone
// underestimates σ and the fast single device would be out of its budget (ratio 1.39). The
// alternates must therefore include an ordering as different as the candidates' kernels — the
// fast single device — and σ̂ pools them.
//
// The requirement (docs/numerics.md): the candidate's error against the exact run may not exceed k
// times the reference's, ‖c − x‖ ≤ k·σ. We measure c against r, not against x: with c = x + e_c and
// e_c independent of e_r, E‖c − r‖² = ‖e_c‖² + σ² ≤ (k² + 1)·σ², so the measurable statement is
//     ‖c − r‖ ≤ √(k² + 1) · σ.
// k = 2 (kBudgetK): a fast-mode layout composes at most twice the reference's rounding — its own
// kernels' rounding (same size as the fast single device's) plus the ring collectives' partial
// sums, whose rounding is of the same order as one more reordering of the same reduction.
//
// The confidence factor. σ̂ and ‖c − r‖ are both estimates from few effective degrees of freedom:
// errors that grow through training concentrate on few directions of a tensor, and the loss and
// grad-norm series have 5 entries (5 steps). Taking the smallest case, ν = 5 degrees of freedom
// for ‖c − r‖² and 2ν = 10 for the pooled σ̂² (two alternates), the ratio ‖c − r‖²/((k²+1)σ̂²) of
// a candidate that meets the requirement exactly is at most F(5, 10); its 99.9 % quantile is 10.48,
// so q = √10.48 = 3.24 (kBudgetQ) keeps the false-alarm rate of one tensor below 0.1 %.
//
// Together: budget = q · √(k² + 1) · σ̂ = 3.24 · √5 · σ̂ ≈ 7.2 σ̂ per tensor (≈ 5.1 times the
// measured distance between two valid references). A genuinely wrong run (another learning rate,
// a weight perturbed by 1e-3 relative) is off by orders of magnitude more than rounding, and fails.
//
// Per precision. A reference in a precision coarser than fp32 (precision.activations bf16 or
// fp16, precision.fp8) rounds at its cast points to a unit roundoff u_p = 2^-8 (bf16), 2^-11
// (fp16), 2^-4 (e4m3) or 2^-3 (e5m2), against fp32's 2^-24. Its error against the exact run is
// then mostly the casts' error, and every valid ordering of the same job shares it: the
// alternates and a fast candidate cast at the same points and, but for a rare rounding that an
// fp32 reordering tips over, to the same values. So the alternates' spread (σ̂ above, the
// reorderings' rounding, amplified where it tips a cast) does not see it. It is measured instead
// against the same job in fp32 (bitwise, single device): to first order an error scales with the
// unit roundoff of the operations that make it, so the fp32 run is off by about u_32/u_p of
// r's error (2^-16 for bf16, 2^-13 for fp16, 2^-20 and 2^-21 for fp8) and is the exact run for
// this purpose:
//     σ̂_p = ‖r − r_fp32‖   (relative bias at most u_32/u_p).
// The candidate's cast error is not independent of r's (mostly the same casts), so the
// measurable condition comes from the triangle inequality, with no independence assumed:
//     ‖c − x‖ ≤ ‖c − r‖ + ‖r − x‖ ≤ k·σ_p   whenever   ‖c − r‖ ≤ (k − 1)·σ_p,
// and with the same confidence factor, budget_p = q · (k − 1) · σ̂_p = 3.24 σ̂_p. Both budgets are
// sufficient conditions for the requirement above, each from an estimate of σ that can only miss
// part of it (the alternates miss the casts), so a tensor's budget is the larger of the two. A
// fast candidate of the same precision sits far inside it (its casts are r's); a wrong one (a
// layer that reads the wrong weights, a dropped microbatch, a cast to the wrong format) does not
// (tests/validators/test_budget.cpp).
#pragma once
#include "core/base/config.h"
#include "core/base/dtype.h"
#include "core/io/state.h"

#include <string>
#include <vector>

namespace px {

inline constexpr double kBudgetK = 2.0;    // candidate's error ≤ k · reference's error (vs exact)
inline constexpr double kBudgetQ = 3.24;   // √F₀.₉₉₉(5, 10): confidence in the estimates
inline constexpr double kFp32Unit = 5.9604644775390625e-08;  // u = 2⁻²⁴, one fp32 rounding
double budget_multiplier();                // q · √(k² + 1), applied to σ̂
double precision_multiplier();             // q · (k − 1), applied to σ̂_p
// u = 2^-p for p significand bits: f32 2^-24, bf16 2^-8, f16 2^-11, e4m3 2^-4, e5m2 2^-3.
double unit_roundoff(DType t);
// The coarsest unit roundoff among a job's casts: fp32 2^-24; bf16 2^-8; fp16 2^-11; fp8
// "delayed" e5m2's 2^-3 (its output gradients), "block" e4m3's 2^-4. A job coarser than fp32
// needs the fp32 run for its budget (error_budget's `finer`).
double precision_unit(const PrecisionConfig& pc);

struct TensorBudget {
    std::string name;            // "weights/wte", "adam/m/h0.attn_w", "steps/loss", ...
    double error = 0;            // ‖candidate − reference‖₂
    double sigma = 0;            // σ̂: the reference's own rounding error (estimated, floored)
    double sigma_precision = 0;  // σ̂_p = ‖reference − fp32 run‖₂; 0 without a finer run
    double budget = 0;           // the larger of budget_multiplier()·σ̂, precision_multiplier()·σ̂_p
    double ratio = 0;            // error / budget; ≤ 1 is within budget
    bool within() const { return error <= budget; }
};

struct BudgetReport {
    std::vector<TensorBudget> rows;  // every weight, both Adam moments, the loss and grad norms
    double max_ratio = 0;
    std::string worst;               // the row with max_ratio
    bool within = false;             // every row within its budget
    bool per_precision = false;      // budgets include the precision's own error (a finer run)
    std::string text() const;        // a table, worst first, and the verdict
};

// One tensor's row: r the reference's values, c the candidate's, alts the alternates' (at least
// one), fine the finer run's (empty: none), all of the same length (InternalError otherwise).
// error_budget makes each of its rows with it; parallax validate's per-step budgets of the
// reduced gradients too.
TensorBudget tensor_budget(const std::string& name, const std::vector<double>& r,
                           const std::vector<double>& c,
                           const std::vector<std::vector<double>>& alts,
                           const std::vector<double>& fine);

// `reference`: the bitwise single device; `alternates`: other valid orderings of the same job
// on the single device (at least one; e.g. fast mode, another numerics.block); `candidate`: the
// run under test; `finer`: when the job's precision is coarser than fp32, the same job in fp32
// (bitwise, single device), else null. All must be of the same model and number of steps
// (InternalError otherwise).
BudgetReport error_budget(const LogicalState& reference,
                          const std::vector<const LogicalState*>& alternates,
                          const LogicalState& candidate, const LogicalState* finer = nullptr);

}  // namespace px
