// Traces in the layout-check panel (validators/trace.h, validators/trace_compare.h): two traces
// compared op by op under the error budget (`parallax compare`, or its --json report) as one grid
// of ops × steps, each cell coloured by its error / budget as fast mode's are; and one trace
// alone, its probes × steps marked where it holds them, under its attributes.
//
// The comparison's grid: rows are the ops (a probe without its step) in the reference's order, a
// replica that differs from its logical tensor (a rank's piece, validators/trace.h /replicas) as
// a row of its own, "op (rank r)", under its op; columns are steps 1 .. the last; a cell holds its
// row's rel, budget and ratio, and the largest difference (its index, both values). The grid's
// summary is the verdict (TraceComparison::verdict), its first divergence the first over-budget
// cell (first_row, first_col), and the view's notes the verdict's split by the run's ranks and
// the probes one trace holds and the other lacks.
//
// Index
//   check_from_comparison       TraceComparison -> CheckView (mode "compare")
//   comparison_from_report      a `parallax compare --json` report -> TraceComparison
//   check_from_compare_report   that report -> CheckView, as check_from_comparison
//   is_compare_report           a .json file is a compare report (else: a validate.json)
//   check_from_trace            one trace alone -> CheckView (mode "trace"): probes × steps
#pragma once
#include "validators/trace_compare.h"
#include "views/layout_check.h"

#include <string>

namespace px::views {

CheckView check_from_comparison(const TraceComparison& tc);
TraceComparison comparison_from_report(const std::string& path);  // DataError naming the file
CheckView check_from_compare_report(const std::string& path);     // DataError naming the file
bool is_compare_report(const std::string& path);  // schema "parallax-compare"; false if unreadable
// Rows: the trace's ops in its order; a cell done where the trace holds that op at that step. The
// header: its source, precision, layout, probes and steps. DataError naming the file.
CheckView check_from_trace(const std::string& path);

}  // namespace px::views
