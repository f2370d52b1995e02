// parallax validate: the single-device reference and each parallel layout of one job, compared
// step by step (docs/validation.md), with a table, a JSON report and a Markdown report.
//
// Index
//   LayoutSpec        one layout of the matrix: "dp2", "tp2", "pp2", "cp2", "dp2xtp2xpp2",
//                     "dp4xz3", "cp2xtp2xdp2", "cp4xulysses", ...
//   parse_layout(s)   one layout, or a comma-separated list of them (ConfigError naming the part)
//   single_axis_parts a layout's dp, tp, pp and cp parts, each alone
//   with_layout       a config run under a layout
//   LayoutResult      one layout's outcome: verdict, steps, max ULP, first divergence
//   max_ulp_text, first_divergence_text   the table's cells
//   ValidationReport  every layout's; table(), to_json(), to_markdown()
//   ValidateWatch     what a watcher is told as validation goes (the workbench's live heatmap)
//   validate_layouts  runs the reference and every layout in lockstep, comparing after every step
//   kReportSchema     the JSON report's schema version (validators/README.md documents it)
//
// Lockstep. The reference (and in fast mode the single-device runs that size its error) and
// every layout run side by side, one step at a time, in turns: step s of the reference, then of
// each alternate, then of each layout in the order given, and no run begins step s + 1 before
// every run has finished step s. So a watcher sees every layout's step s compared before any
// layout's step s + 1, and only one run computes at any moment (each as fast as alone; the
// others wait, holding their state: memory is every layout's at once). A layout that fails
// leaves the turns; the others go on. The verdicts are those of running each alone: a run's
// numbers do not depend on when it runs.
//
// What is compared. After every step, every rank's pieces of the step's state are compared with
// the reference's after the same step, piece by piece where each sits in the logical tensor
// (validators/pieces.h; nothing is gathered): the reduced gradients (each rank's "grad" probes:
// its stage's tensors, under ZeRO-2/3 its shard, its tp columns, its experts), every weight and
// both Adam moments of every parameter (its ZeRO shard of them, its stage's, its tp piece), fp8's
// scales and amax histories and the loss scaler's state where the precision has them, and each
// rank's loss and grad norm of every step so far. A tensor held by several ranks (dp replicas, tp
// ranks' copies of a replicated tensor, the two stages' wte, cp ranks) is compared on every one
// of them, and the ranks' pieces must cover the tensor and hold what each rank's job holds
// (Holdings): a rank whose pieces are missing makes the layout "error", never "match". A gradient
// difference that the update rounds away (a flipped lowest bit) is still seen at its step. The
// reference's states and gradients are kept for every step: memory is steps × 4 × the model,
// which suits the small jobs validation is run on (use --steps to bound it for larger ones).
//
// First divergence. When a layout diverges in bitwise mode, the reference and the layout are run
// again with probes (core/model/probe.h) on every op of the step before the first differing step
// and of that step, one recorder per rank, and the probes are compared in the single device's order
// of execution (forward ops, backward ops, the reduced gradients, the update): the first probe
// where a rank's piece differs is the first op whose output differs while everything computed
// before it (its inputs) agrees. The answer names the step, phase, layer, op, tensor, the rank,
// the element and both values, and every rank whose piece differs there (all of them when the
// op is a collective whose result every rank shares). The reference runs that search cut into as
// many microbatches as the layout has in all, so that its microbatch gradients ("mgrad") are the
// nodes the layout's ranks reduce: a fault in one rank's local gradient is named on that rank.
// Every layout is probed: dp (ZeRO 0-3), tp, sp, pp, cp and their products (under cp a rank's
// probes are placed at its tokens' logical positions; its microbatch gradients, parts of nodes,
// are not probed, so a fault is named at the reduced gradient).
//
// Which parallelism. A multi-axis layout that diverges is split into its single-axis parts
// (single_axis_parts: dp2xtp2xpp2 -> dp2, tp2, pp2), each run against the reference up to the
// first differing step: the parts that diverge alone name the parallelism that introduces the
// difference; when none does, only their combination does.
//
// Every rank, named. The first divergence is the first tensor, in the order a step makes them,
// where some rank's pieces differ, with the lowest such rank (first_rank) and all of them
// (first_ranks): a fault on any rank, stage, shard or expert is named there. In fast mode, where
// every rank differs from the reference by design, the copies of each replicated piece are also
// compared with each other: a replica that disagrees with its twins is a divergence of its own
// (replica_step, replica_ranks).
//
// Verdicts. bitwise mode: "match" when every comparison of every step (on every rank) is
// bit-identical, else "diverged", naming the first step with a difference and, in it, the first
// differing tensor (the reduced gradients, then the weights, the first moments, the second
// moments, the scaling state, the metrics), its ranks, its element (flat and per dimension) and both values.
// fast mode: the per-step comparisons are reported the same way, and the verdict is the error
// budget of the final state (validators/budget.h; in a precision coarser than fp32 also against
// the same job in fp32, run once): "within budget" or "over budget", or "diverged" when replicas
// disagreed with their twins. A layout that cannot run (a config error, a failed collective) is
// "error" with its message; the other layouts still run. The reference runs without the config's
// [fault] and [validate] settings: an injected fault (core/train/faults.h) strikes the layouts
// only, which is how the harness itself is shown to find one.
#pragma once
#include "core/base/config.h"
#include "core/train/runner.h"
#include "validators/compare.h"

#include <functional>
#include <string>
#include <vector>

namespace px {

inline constexpr int kReportSchema = 1;
inline constexpr std::int64_t kGridNotRun = -2;  // a grid cell never compared (kNoUlp is -1)

struct LayoutSpec {
    std::string name;  // as written: "dp2xtp2xpp2"
    int dp = 1, tp = 1, pp = 1;
    int cp = 1;                      // "cpN": context parallelism (layout.cp)
    bool ulysses = false;            // "ulysses": layout.cp_method = "ulysses" (else the config's)
    int ep = 1;                      // "epN": expert parallelism (layout.ep; dp is N unless given)
    int zero = -1;                   // "zN"; -1: the config's layout.zero
    int microbatches = -1;           // "mbN"; -1: the config's layout.microbatches
    bool sequence_parallel = false;  // "sp"
};

// "dp2xtp2xpp2": parts joined by 'x' — dpN, tpN, ppN, cpN, epN (expert parallelism over the dp
// ranks: "ep2" alone is dp2 with ep2, "ep2xdp4" two ep groups), zN (ZeRO stage), mbN (microbatches
// per replica), sp (sequence parallelism), ulysses (cp's all-to-all method). An axis not named
// is 1 (the layout is the string, whatever the config's layout.dp/tp/pp/cp/ep say); zN, mbN, sp
// and ulysses not named keep the config's. Throws ConfigError naming the part.
LayoutSpec parse_layout(const std::string& text);
// A comma-separated list of them: "dp2,tp2,pp2,dp2xtp2xpp2".
std::vector<LayoutSpec> parse_layouts(const std::string& text);
// The layout's parallelisms one at a time: dpN (with its zN and mbN), tpN (with sp), ppN (with
// mbN), cpN (with ulysses), epN, named as parse_layout reads them. Empty when the layout has fewer than
// two.
std::vector<LayoutSpec> single_axis_parts(const LayoutSpec& l);
// cfg with the layout's dp, tp, pp (and zero, microbatches, sp when given), validated as a
// config and as a layout (the mesh's and the pipeline's checks): ConfigError naming the keys.
Config with_layout(Config cfg, const LayoutSpec& l);

struct LayoutResult {
    std::string layout;        // LayoutSpec::name
    std::string verdict;       // "match", "diverged", "within budget", "over budget", "error"
    i64 steps = 0;             // steps compared
    std::int64_t max_ulp = 0;  // over every element of every step (kNoUlp: a NaN mismatch)
    i64 first_step = -1;       // the first step with a difference; -1: none
    // The first differing tensor of first_step, in the order a step makes them (the reduced
    // gradients, then every weight, every first moment, every second moment, fp8's scales and
    // histories, the loss scale, the metrics): the lowest world rank whose pieces of it differ, its comparison
    // (in logical coordinates), and every world rank whose pieces of it differ.
    int first_rank = -1;
    Comparison first;
    std::vector<int> first_ranks;
    // Every differing tensor of first_step (each its lowest differing rank's comparison).
    std::vector<Comparison> differing;
    // Every comparison after the last step: a tensor's lowest differing rank's, else its
    // agreement over the whole logical tensor; max_ulp the worst over the ranks.
    std::vector<Comparison> final_step;
    // Replicas that disagree with their twins (the same piece on several ranks with other bits;
    // checked in fast mode, where every rank differs from the reference): the first step it
    // happened, the tensor, the odd ranks and a twin they differ from. A divergence in any mode.
    i64 replica_step = -1;
    std::string replica_tensor;
    std::vector<int> replica_ranks;
    int replica_twin = -1;
    // The first-divergence search (bitwise mode, layouts with probes: the single device, data and
    // pipeline parallelism for now): the first probe, in the single device's execution order over
    // the step before first_step and first_step, where a rank's piece differs from the reference;
    // its Comparison is in logical coordinates and names the element and both values.
    int first_op_rank = -1;           // the world rank whose piece differs first; -1: not found
    std::vector<int> first_op_ranks;  // every world rank whose piece of that probe differs
    std::string first_op_where;       // first_op_rank's mesh coordinates: "pp0 dp1 tp0"
    Comparison first_op;              // name: the probe, "4/bwd/1/mlp.fc/dinp"
    std::string first_op_note;        // why there is no op-level answer, when there is none
    // A multi-axis layout that diverged: each single-axis part, run to first_step.
    struct Axis {
        std::string layout;   // "tp2"
        std::string verdict;  // "match", "diverged", or "error" (it could not run)
        i64 first_step = -1;
        std::string error;  // verdict "error": why
    };
    std::vector<Axis> axes;
    double budget_ratio = -1;  // fast mode: error / budget of the worst tensor (≤ 1 within)
    std::string budget_worst;
    // Every comparison of every step, worst over the ranks (the grid the workbench draws, in the
    // JSON report's "grid"): rows in the order they were first compared (the reduced gradients,
    // then compare_states' order), columns steps 1..steps.
    std::vector<std::string> grid_tensors;
    std::vector<std::vector<std::int64_t>> grid_ulp;  // [row][step - 1]; kGridNotRun: not compared
    // Fast mode: [row][step - 1] the error / budget of that tensor after that step (the budget
    // of the final verdict, made from the alternates' state at the same step); empty in bitwise.
    std::vector<std::vector<double>> grid_ratio;
    std::string error;  // verdict "error": what went wrong
    double seconds = 0;
    bool ok() const { return verdict == "match" || verdict == "within budget"; }
};

// The table's cells, as `parallax validate` prints them (the workbench's verdict table too): a
// max ULP ("NaN" for kNoUlp), and the first divergence (step, tensor, ranks, element, both
// values, the first op, the parallelism at fault; the error of a layout that did not run; "-").
std::string max_ulp_text(std::int64_t ulp);
std::string first_divergence_text(const LayoutResult& r);

struct ValidationReport {
    std::string job;   // the config's source
    std::string mode;  // "bitwise" or "fast"
    i64 steps = 0;
    double reference_seconds = 0;
    std::vector<LayoutResult> layouts;
    bool all_ok() const;
    bool any_error() const;
    std::string table() const;    // layout | steps | verdict | max ULP | first divergence
    std::string to_json() const;  // schema kReportSchema, validators/README.md
    std::string to_markdown() const;
};

class TraceReader;

// Each layout against a golden trace (validators/trace.h) instead of a reference run: the layout
// runs the trace's steps with one probe recorder per rank (the trace's patterns and stride), and
// every probe of the trace, in its order, is compared with every rank's pieces. The first probe
// that differs is `first` and `first_op` (with its rank; first_step is its step). cfg must be the
// trace's job (check_trace_config). A trace probe that no rank of the layout records (a
// microbatch gradient under ZeRO-2/3 or a pipeline) makes the layout "error", not "match".
// `cancel` as validate_layouts's.
ValidationReport validate_golden(const Config& cfg, const std::vector<LayoutSpec>& layouts,
                                 const TraceReader& trace,
                                 void (*progress)(const LayoutResult&) = nullptr,
                                 const Cancel& cancel = {});
// The verdict of one layout from a comparison with a trace (the MPI path of parallax validate
// builds it from its ranks' results).
struct GoldenResult;
void set_golden_result(LayoutResult& r, const GoldenResult& g, i64 steps);

// Told as validation goes, so that a watcher (the workbench's layout-check panel) fills in while
// the layouts run, in lockstep order (step s of every run before step s + 1 of any).
// layout_step is called on the layout's rank threads, several at once: after step `step` of
// `layout`, world rank `rank`'s comparisons of that step (its reduced gradients
// "grad/<layer>/param/<tensor>", then compare_states' order), the same ones the verdict is made
// from; in fast mode `budget_ratios` holds each one's error / budget at that step (the budget of
// validators/budget.h from the alternates' state and gradients at the same step; for a reduced
// gradient, the error of the rank's pieces against the whole tensor's budget), empty in bitwise
// mode. An exception from either stops the run it came from (a watcher that closes): from
// reference_step it leaves validate_layouts, from layout_step that layout ends as "error".
struct ValidateWatch {
    std::function<void(i64 step)> reference_step;  // the reference finished `step`
    std::function<void(const std::string& layout, i64 step, int rank,
                       const std::vector<Comparison>& comparisons,
                       const std::vector<double>& budget_ratios)>
        layout_step;
};

// Runs cfg on the single device for `steps` steps (cfg.train.steps is set to it) and each
// layout on in-process ranks, in lockstep (above), comparing after every step; then, one layout
// after the other, the verdicts (fast mode: the budget; bitwise: the first-op search and the
// single-axis parts of a layout that diverged). `progress`, when given, is told each layout's
// result as it is made, in the order given. `decorate` wraps every run of a layout's ranks
// (never the reference's): a test's planted bug, a tracer; the layouts run at once, so a
// decorator shared by several layouts is called from all of their ranks' threads. `cancel` is
// asked after every step of every run (the reference, the alternates, the layouts, the
// first-divergence search, the single-axis parts): when it answers true, Cancelled leaves
// validate_layouts (no layout ends as "error" for it).
ValidationReport validate_layouts(const Config& cfg, const std::vector<LayoutSpec>& layouts,
                                  i64 steps, void (*progress)(const LayoutResult&) = nullptr,
                                  const RunHooks& decorate = {}, const ValidateWatch& watch = {},
                                  const Cancel& cancel = {});

}  // namespace px
