// parallax gui [CONFIG] [--set ...] [--out DIR]              the desktop workbench
// parallax gui --screenshot DIR [--steps N] [CONFIG]         every panel to DIR/<panel>.png, after
//                                                            N steps or the job's end
// parallax gui --measure [--steps N] [CONFIG]                frame time and step-time slowdown
// --open FILE (a run.h5, a validate.json, a compare report, a golden trace) and --compare REF RUN
// (two traces, op by op; one alone: its probes) show in the panels at the start, in the window
// and in its screenshots; --cluster FILE and --calibrate RUN.h5 are the plan panel's inputs.
// The window, its panels and its models are in app/gui/ (workbench.h).
#include "app/commands.h"
#include "app/gui/workbench.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/train/runner.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace px::app {

namespace {

struct GuiOptions {
    std::string config_path, screenshot_dir, out_dir, layouts = "dp2";
    i64 steps = -1;
    bool measure = false;
    std::vector<std::string> sets;
    std::string open_path;
    std::vector<std::string> compare;  // REF RUN, or one trace alone
    std::string cluster;               // the plan panel's cluster file
    std::vector<std::string> calibrate;  // and the run files it calibrates from
};

int run_gui(const GuiOptions& opt) {
    Config cfg = job_config(opt.config_path, opt.sets);
    if (!opt.out_dir.empty()) cfg.output.dir = opt.out_dir;
    if (opt.steps != -1 && (opt.steps < 1 || opt.steps > cfg.train.steps))
        throw ConfigError("--steps " + std::to_string(opt.steps) + " must be in 1..train.steps (" +
                          std::to_string(cfg.train.steps) + ")");
    // Headless runs need a job that starts; the window shows a bad config's errors beside its keys.
    if (!opt.screenshot_dir.empty() || opt.measure) make_in_process_layout(cfg);
    gui::WorkbenchOptions w;
    w.config = cfg;
    w.screenshot_dir = opt.screenshot_dir;
    w.check_layouts = opt.layouts;
    w.open_path = opt.open_path;
    if (!opt.compare.empty()) w.compare_reference = opt.compare[0];
    if (opt.compare.size() == 2) w.compare_run = opt.compare[1];
    w.plan_cluster = opt.cluster;
    for (const std::string& f : opt.calibrate)
        w.plan_calibrate += (w.plan_calibrate.empty() ? "" : ",") + f;
    w.measure = opt.measure;
    // Screenshots without --steps wait for the job to end.
    w.steps = opt.steps > 0 ? opt.steps : cfg.train.steps;
    if (opt.steps > 0) w.measure_steps = opt.steps;
    try {
        return gui::run_workbench(w);
    } catch (const gui::NoWindow& e) {
        std::fprintf(stderr, "parallax gui: %s\n", e.what());
        return kBadInput;
    }
}

}  // namespace

std::function<int()> add_gui_command(CLI::App& app) {
    auto opt = std::make_shared<GuiOptions>();
    CLI::App* sub = app.add_subcommand(
        "gui",
        "The desktop workbench: edit and run a job under live panels (loss, layout check, "
        "pipeline, memory and communication, events) and teaching views (layout, schedule "
        "and numerics explorers). F12 prints the window's state as one JSON line.");
    sub->add_option("config", opt->config_path,
                    "TOML job config (the embedded default when omitted)")
        ->check(CLI::ExistingFile);
    sub->add_option("--screenshot", opt->screenshot_dir,
                    "Run the job --steps steps, a layout check and the layout explorer, write one "
                    "PNG per panel into this folder, and exit");
    sub->add_option("--steps", opt->steps,
                    "Steps the job runs before the screenshots (default: the whole job, which "
                    "they wait for), or per measured run (default 30)");
    sub->add_option("--layouts", opt->layouts, "The layout check's layouts for --screenshot")
        ->capture_default_str();
    sub->add_option("--open", opt->open_path,
                    "Open a run.h5, a validate.json, a compare report (parallax compare --json) or "
                    "a golden trace at the start, as the job bar's Open (with --screenshot: "
                    "instead of the layout check)")
        ->check(CLI::ExistingFile);
    sub->add_option("--compare", opt->compare,
                    "Compare two traces op by op in the layout check panel at the start, as its "
                    "Compare button (one trace alone: its probes by step; with --screenshot: "
                    "instead of the layout check)")
        ->expected(1, 2)
        ->type_name("REF.h5 [RUN.h5]")
        ->check(CLI::ExistingFile);
    sub->add_option("--cluster", opt->cluster,
                    "The plan panel's cluster file (default: examples/clusters/cpu-inprocess.toml "
                    "beside the working directory or this program; with --screenshot: the plan "
                    "of the job's world size on it)")
        ->check(CLI::ExistingFile);
    sub->add_option("--calibrate", opt->calibrate,
                    "Run files (.h5) the plan panel fits the cluster's figures to first")
        ->check(CLI::ExistingFile);
    sub->add_flag("--measure", opt->measure,
                  "Print the frame time with the job running and the job's step time with the "
                  "workbench attached against headless");
    sub->add_option("--set", opt->sets,
                    "Override a config key: --set section.key=value (repeatable)")
        ->type_name("KEY=VALUE");
    sub->add_option("--out", opt->out_dir,
                    "Output directory of the job's run file (overrides output.dir)");
    return [opt] { return run_gui(*opt); };
}

}  // namespace px::app
