// Finished runs opened in the workbench's panels: a run file (`run.h5`, core/io/runfile.h) as a
// RunSnapshot, and a `validate.json` report (validators/README.md) as the layout check's view.
//
// Index
//   snapshot_from_run_file   run.h5 -> RunSnapshot (state finished; config, metrics, events,
//                            the spike evidence, the MoE router statistics, /fp8's rows,
//                            rank 0's memory at the end)
//   view_of_report           a ValidationReport -> CheckView (verdicts; the grid of every step,
//                            worst over the ranks; an older report without one: the first
//                            differing step and the last)
//   check_from_report        validate.json -> CheckView, as view_of_report
#pragma once
#include "views/layout_check.h"
#include "core/train/job_view.h"

#include <string>

namespace px::views {

RunSnapshot snapshot_from_run_file(const std::string& path);  // px::Error naming the file
CheckView view_of_report(const ValidationReport& rep);
CheckView check_from_report(const std::string& path);  // px::Error naming the file

}  // namespace px::views
