// The desktop workbench (`parallax gui`): one window with the job bar on the left and the panels
// in tabs on the right, a job running on its own threads under them.
//
// Index
//   WorkbenchOptions   the config, and the headless modes: screenshots, measurement
//   NoWindow           no window could be opened
//   run_workbench      opens the window and runs until it is closed (or the mode is done)
//
// Modes.
//   interactive   until the window closes. F12 prints one JSON state line on stdout (status,
//                 steps, what the panels show, editor errors, where the named widgets are), so
//                 a test can drive the window with real input events (xdotool) and observe it.
//   screenshot    runs the job `steps` steps, a layout check, the layout explorer and a plan of
//                 the job's world size (the plan panel's cluster file), renders
//                 every panel alone and writes DIR/<panel>.png, then exits. A file to open or
//                 two traces to compare replace the layout check (the panel shows them).
//   measure       frame time with the job running, and the job's step time with the window
//                 attached against the same job headless (alternating runs), printed.
#pragma once
#include "core/base/config.h"
#include "core/base/error.h"

#include <string>

namespace px::gui {

struct WorkbenchOptions {
    Config config;                      // the base config (a file, or the embedded default)
    std::string screenshot_dir;         // screenshot mode when not empty
    i64 steps = 20;                     // screenshot mode: steps the job runs first
    std::string check_layouts = "dp2";  // screenshot mode: the layout check's layouts
    std::string open_path;              // opened at the start, as the job bar's Open does
    std::string compare_reference, compare_run;  // compared at the start (the panel's Compare)
    std::string plan_cluster, plan_calibrate;    // the plan panel's cluster file and run files
    bool measure = false;                        // measure mode
    i64 measure_steps = 30;                      // measure mode: steps per run
    int width = 1600, height = 1000;
};

// No window could be opened: no display, or no OpenGL 3.3 on it.
struct NoWindow : Error {
    using Error::Error;
};

// Throws NoWindow when no window can be opened; a screenshot run whose job fails throws its error.
int run_workbench(const WorkbenchOptions& opt);

}  // namespace px::gui
