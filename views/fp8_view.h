// The FP8 panel's model: the FP8 drift monitor's rows of a run (RunSnapshot::fp8, from the live
// job or an opened run.h5; core/train/fp8_monitor.h) arranged for drawing, with no window: the
// scaled tensors, their histories of amax and scale (the run's recipe, and the comparisons'
// scales beside it), the tensors × steps grids of saturation and underflow, and the alerts with
// their evidence (the alert event's sentence and the row it fired on).
//
// Index
//   Fp8History   one tensor's columns by step, for one recipe
//   Fp8AlertRow  one alert: the row it fired on and the event's sentence
//   Fp8View      make_fp8_view(snapshot): tensors, steps, grids, alerts, histories
#pragma once
#include "core/base/metrics.h"
#include "core/train/job_view.h"

#include <string>
#include <vector>

namespace px::views {

struct Fp8History {
    std::string recipe;
    std::vector<double> step, amax, scale, saturated, underflow, sqnr_db;
};

struct Fp8AlertRow {
    Fp8Stat row;          // the run's row it fired on (its `alerts` bits say which)
    std::string message;  // the alert event's sentence ("" if the event is not in the snapshot)
    int tensor = -1;      // index into Fp8View::tensors
};

struct Fp8View {
    std::string recipe;                // the run's ("delayed", "block"); "" without rows
    std::vector<std::string> compare;  // the comparisons' recipes, in row order
    std::vector<std::string> tensors;  // "h.1.attn.c_attn/x", in the monitor's order
    std::vector<i64> steps;            // the monitored steps, ascending
    i64 step_stride = 1;               // between consecutive monitored steps (fp8_monitor.every)
    // [tensor][step index], the run's recipe; NaN where a tensor has no row at that step.
    std::vector<std::vector<double>> saturated, underflow;
    std::vector<int> alerts_of;       // per tensor: how many alert rows it has
    std::vector<Fp8AlertRow> alerts;  // in step order, then tensor order
    std::size_t rows = 0;             // rows the view was made from

    // Tensor t's history in the run's recipe and in each comparison (the run's first), from the
    // rows the view was made of; delayed scaling's initial scale at step 1 is NaN (a gap).
    std::vector<Fp8History> histories(const std::vector<Fp8Stat>& rows, int t) const;
    int tensor_index(const std::string& name) const;  // -1: none
    // The tensor to show first: the one with the most alerts (the first tensor when none).
    int default_tensor() const;
};

Fp8View make_fp8_view(const RunSnapshot& s);

}  // namespace px::views
