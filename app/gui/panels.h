// The workbench's panels: one file each (panel_<name>.cpp), one dispatch list (kPanels in
// workbench.cpp). A panel is draw_<name>_panel(const RunData&, <Name>PanelState&): it reads the
// run's data (a snapshot of the live job or of an opened file) and its own state (its model,
// its plot views), draws into the current ImGui window, shows a one-line empty state when it
// has no data, and never touches the running job.
//
// Index
//   UiRects                where named widgets were drawn (the state line reports them)
//   RunData                what every panel reads this frame
//   JobPanelState .. NumericsPanelState   each panel's own state (RouterPanelState: MoE,
//                          PlanPanelState: the layout planner)
//   draw_*_panel           the panels
//   empty_state            the one-line sentence of a panel without data
#pragma once
#include "app/gui/plot.h"
#include "core/train/job_view.h"
#include "core/train/memory.h"
#include "views/comm_trace.h"
#include "views/config_editor.h"
#include "views/fp8_view.h"
#include "views/job_controller.h"
#include "views/layout_check.h"
#include "views/layout_explorer.h"
#include "views/plan_view.h"
#include "views/router_view.h"
#include "views/spike_model.h"
#include "views/teaching.h"

#include <nlohmann/json_fwd.hpp>

#include <map>
#include <string>
#include <vector>

namespace px::gui {

// The panels draw the models of views/ (what each panel shows, computed without a window).
using namespace px::views;

struct UiRects {
    std::map<std::string, ImVec4> rects;  // name -> x, y, w, h in window pixels
    void mark(const std::string& name);   // the last item's rectangle
};

struct RunData {
    RunSnapshot snap;                  // the live job's latest snapshot, or an opened run file's
    const CommTrace* trace = nullptr;  // the live job's measurements; null for a file
    std::string source;                // "live job" or the opened file
    Config config;                     // the job's config (the editor's when no job ran)
    UiRects* rects = nullptr;
};

// ---- the job bar -----------------------------------------------------------------------------
enum class JobAction { none, start, pause, resume, step, stop, restart, open };
struct JobPanelState {
    ConfigEditor editor;
    JobController* job = nullptr;
    std::string message;                    // the last action's outcome or error
    std::string open_path;                  // a run.h5 or validate.json to open
    JobAction requested = JobAction::none;  // what the person asked for this frame
    bool llama_open = false;  // the llama keys' group unfolded (at first: when arch is llama)
    std::string arch_seen;    // model.arch as last drawn: a new value folds or unfolds the group
};
void draw_job_panel(const RunData& d, JobPanelState& s);

// ---- live panels -----------------------------------------------------------------------------
struct LossPanelState {
    plot::PlotView loss_view, norm_view;
    bool log_y = false;
    int selected_event = -1;  // a marker clicked: its evidence shows below
};
void draw_loss_panel(const RunData& d, LossPanelState& s);

struct LayoutCheckPanelState {
    LayoutCheck* check = nullptr;
    std::string layouts = "dp2,tp2,pp2";
    int steps = 10;
    int mode = 0;    // 0 the job's numerics mode, 1 bitwise, 2 fast
    CheckView view;  // refreshed when the model's version changes (or opened from a report)
    bool from_file = false;
    int layout = 0, row = -1, col = -1;  // the selected layout and cell
    std::string message;
    bool start_requested = false;
    std::string reference_trace, run_trace;  // Compare: both; one of them alone: its probes
    bool compare_requested = false;
};
void draw_layout_check_panel(const RunData& d, LayoutCheckPanelState& s);

struct PipelinePanelState {
    bool first_replica = false;  // lanes: dp 0, tp 0 of each stage only (else every rank)
};
void draw_pipeline_panel(const RunData& d, PipelinePanelState& s);

struct MemoryPanelState {};
void draw_memory_panel(const RunData& d, MemoryPanelState& s);

// The spike half of the FP8-and-spikes panel (panel_spikes.cpp).
struct SpikeSectionState {
    plot::PlotView view;
    int kind = 0;       // the evidence plotted: gradient norm, update ratio, eps ratio, logit
    int selected = -1;  // the spike whose evidence shows
};
void draw_spike_section(const RunData& d, SpikeSectionState& s);

struct Fp8PanelState {
    SpikeSectionState spikes;
    Fp8View view;  // remade when the snapshot's rows change
    std::uint64_t epoch = ~std::uint64_t{0};
    std::size_t rows = 0;
    int tensor = -1;  // the tensor whose histories show; -1: the view's default
    std::vector<Fp8History> histories;  // of `tensor`, for `hist_rows` rows
    int hist_tensor = -1;
    std::size_t hist_rows = 0;
    plot::PlotView amax_view, scale_view;
    int step_col = -1;  // a heatmap column clicked (with `tensor` its row)
    int alert = -1;     // the alert selected in the list
};
void draw_fp8_panel(const RunData& d, Fp8PanelState& s);

struct RouterPanelState {
    RouterView view;  // brought up to the snapshot each frame (update_router_view)
    int layer = 0;    // index into view.layers: the experts × steps heatmap's layer
    int step = -1;    // index into view.steps: the experts × layers heatmap's; -1: the latest
    int expert = -1;  // the cell clicked: its expert
    plot::PlotView drop_view, balance_view, entropy_view, loss_view;
};
void draw_router_panel(const RunData& d, RouterPanelState& s);

// The layout planner for the job's config, and the job's layout predicted beside the run.
struct PlanPanelState {
    Planner* planner = nullptr;
    std::vector<std::string> clusters;  // examples/clusters/*.toml found (the combo's entries)
    std::string cluster;                // the cluster file planned with (the combo sets it)
    int gpus = 0;                       // devices; 0 until drawn: the config's world size
    std::string calibrate;              // run files, comma-separated; empty: the file's figures
    bool plan_requested = false;
    PlanOutcome outcome;  // the planner's latest
    std::uint64_t seen = 0;
    PlanComparison comparison;  // the job's layout beside its run, remade as steps go by
    i64 compared_steps = -1;
    std::string compared_source;
};
void draw_plan_panel(const RunData& d, PlanPanelState& s);
// The cluster files found beside the working directory or the executable; `cluster` (else
// cpu-inprocess.toml) chosen, `calibrate` the run files.
void init_plan_panel(PlanPanelState& s, Planner* planner, const std::string& cluster,
                     const std::string& calibrate);
// What Plan asks the planner for: the config, the devices, the cluster, the run files.
PlanRequest plan_request(const PlanPanelState& s, const Config& config);
// The panel for the state line (F12): the planner's outcome, its rows and the comparison; its
// inputs into `fields` (plan_gpus, plan_cluster, plan_calibrate).
nlohmann::json plan_state(const PlanPanelState& s, nlohmann::json& fields);

struct EventsPanelState {};
void draw_events_panel(const RunData& d, EventsPanelState& s);

// ---- teaching views --------------------------------------------------------------------------
struct LayoutExplorerPanelState {
    LayoutExplorer* explorer = nullptr;
    ExplorerPicks picks;    // the job bar's layout until the person picks their own
    i64 experts = 0;        // model.moe_experts of the config Explore runs (0: dense, ep stays 1)
    ExplorerResult result;  // refreshed when the model's version changes
    std::uint64_t seen = 0;
    int tensor = -1;  // the weight matrix shown; -1: the first attention (ep: expert) matrix
    bool show_moments = false;
    bool explore_requested = false;
};
void draw_layout_explorer_panel(const RunData& d, LayoutExplorerPanelState& s);

struct SchedulePanelState {
    ScheduleModel model;
    int slot = -1;  // the plan stepped to this slot; -1: all of it
    bool made = false;
};
void draw_schedule_panel(const RunData& d, SchedulePanelState& s);

struct NumericsPanelState {
    NumericsModel model;
    bool made = false;
};
void draw_numerics_panel(const RunData& d, NumericsPanelState& s);

// A panel's one-line empty state, greyed.
void empty_state(const char* sentence);

// Memory per rank as stacked bars (parameters, gradients, optimizer state, activations,
// buffers), after a first bar of the estimate the job was admitted by, cut into the same parts
// (core/train/memory.h: the ZeRO formulas per rank); its total is also a tick on every bar.
plot::StackedBars memory_bars(const std::vector<MemoryStats>& ranks, const MemoryEstimate& est,
                              const std::string& rank_prefix);

}  // namespace px::gui
