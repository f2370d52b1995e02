// The layout-check panel's model: the single-device reference and a chosen set of layouts run as
// `parallax validate` runs them (validators/validate.h validate_layouts: the same lockstep
// comparison after every step, the same verdicts, the same first-op search), on a thread of its
// own, while a grid of tensors × steps fills in from its ValidateWatch. A caller may pass
// RunHooks that wrap the layouts' ranks (a tracer, or a test's planted bug).
//
// The same panel shows two traces compared op by op (`parallax compare`,
// validators/trace_compare.h; start_compare runs it here, views/trace_view.h makes the grid) and
// one trace's probes alone.
//
// Index
//   CheckCell       one tensor at one step of one layout: worst ULP over ranks, first element
//   LayoutGrid      one layout's grid, verdict and first divergence
//   CheckView       what the panel draws, copied out under the model's lock
//   LayoutCheck     start / start_golden / start_compare / cancel / view / busy
//   ulp_colour, budget_colour, cell_colour   a cell's colour
#pragma once
#include "core/base/config.h"
#include "core/train/runner.h"
#include "validators/validate.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace px::views {

struct CheckCell {
    bool done = false;                    // compared at this step
    std::int64_t max_ulp = 0;             // the worst over the ranks (kNoUlp: a NaN mismatch)
    i64 differing = 0;                    // elements whose bits differ, on the worst rank
    int rank = -1;                        // the lowest rank with a difference
    i64 first = -1;                       // its first differing element (flat)
    double reference = 0, candidate = 0;  // both values there
    double ratio = -1;                    // fast mode, compare: the worst error / budget; -1: none
    double rel = -1, budget = 0;  // compare: ‖run − ref‖₂ / ‖ref‖₂ and its budget
    std::vector<i64> at;          // compare: the largest difference's index (both values
                                  // in reference, candidate)
};

struct LayoutGrid {
    std::string name;                           // "dp2"
    std::vector<std::string> tensors;           // rows, in the harness's order
    std::vector<std::vector<CheckCell>> cells;  // [tensor][step - 1]
    i64 steps_done = 0;
    bool finished = false;
    LayoutResult result;  // once finished: verdict, first step, first op
    std::string summary;  // one line: verdict and first divergence, as parallax validate says
    int first_row = -1, first_col = -1;  // compare: the first over-budget cell; -1: none
};

struct CheckView {
    bool running = false;
    std::string mode;  // "bitwise", "fast", "golden trace <path>", "compare", "trace"
    i64 steps = 0;
    i64 reference_steps = 0;
    std::vector<LayoutGrid> layouts;
    std::string error;               // the whole check could not run (a bad layout list)
    std::string header;              // compare, trace: the traces and their attributes
    std::vector<std::string> notes;  // compare: under the grid (the split by ranks, ...)
    std::uint64_t version = 0;
};

class LayoutCheck {
public:
    LayoutCheck() = default;
    ~LayoutCheck();  // cancels and joins
    LayoutCheck(const LayoutCheck&) = delete;
    LayoutCheck& operator=(const LayoutCheck&) = delete;

    // Checks `layouts` ("dp2,tp2"; parse_layouts) of cfg for `steps` steps in cfg's numerics
    // mode. Bad layouts throw ConfigError here; the runs go on a thread. `decorate` wraps the
    // layouts' ranks, never the reference's (validate_layouts). A check still running is told
    // to stop and left to end on its own thread: nothing here waits for it.
    void start(const Config& cfg, const std::string& layouts, i64 steps,
               const RunHooks& decorate = {});
    // The same layouts against a golden trace (parallax record; validate_golden) instead of a
    // reference run, with the trace's job (its config): TraceReader's DataError, or a bad
    // layout's ConfigError, here. The grid fills in when the trace's probes have been compared.
    void start_golden(const std::string& trace_path, const std::string& layouts);
    // Two traces compared op by op (compare_traces, on a thread: a trace of a real model is
    // gigabytes) into one grid (check_from_comparison). Both are opened here: TraceReader's
    // DataError naming the file that is not a trace.
    void start_compare(const std::string& reference_path, const std::string& run_path);
    void cancel();      // stops every check at its next step, and joins them
    bool busy() const;  // a check is running
    CheckView view() const;
    std::uint64_t version() const { return version_.load(); }
    bool wait(double timeout_s) const;  // until the check ends (tests, screenshots)

private:
    struct Run {
        std::uint64_t id = 0;
        std::atomic<bool> cancel{false};
    };
    // Under mu_: stops the current run (it ends at its next step, on its own thread) and makes
    // `run` current, with an empty grid of `specs` for `steps` steps in `mode`.
    void begin_run(const std::shared_ptr<Run>& run, const std::string& mode, i64 steps,
                   const std::vector<LayoutSpec>& specs);
    // Under mu_, for the current run only (a cancelled one's results are dropped).
    void on_step(const std::string& layout, i64 step, int rank, const std::vector<Comparison>& cmp,
                 const std::vector<double>& ratios);

    mutable std::mutex mu_;
    CheckView v_;
    std::shared_ptr<Run> run_;          // the current run, under mu_
    std::uint64_t runs_ = 0;            // under mu_
    std::vector<std::thread> threads_;  // every run's, joined by cancel()
    std::atomic<bool> busy_{false};
    std::atomic<std::uint64_t> version_{0};
};

// The heatmap's colour of a cell as 0xAABBGGRR (ImGui's packing): bit-identical dark green;
// a difference from orange (1 ulp) to red (2^20 ulp and more); NaN magenta; not yet run grey.
std::uint32_t ulp_colour(const CheckCell& c);
// A fast-mode cell, by its error / budget (CheckCell::ratio): bit-identical dark green; within
// the budget (ratio <= 1) green to yellow-green as the ratio grows (0.01 and below, 0.1, 1: a
// log scale), never red; over it orange (just over) to red (100 times and more); NaN magenta;
// not yet run grey. A cell without a ratio (an older report) falls back to ulp_colour.
std::uint32_t budget_colour(const CheckCell& c);
// The colour of a cell in a check of `mode` ("fast", "compare": budget_colour; "trace": a probe
// recorded blue, not recorded grey; else ulp_colour).
std::uint32_t cell_colour(const CheckCell& c, const std::string& mode);

}  // namespace px::views
