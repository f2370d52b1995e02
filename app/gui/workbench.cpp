#include "app/gui/workbench.h"

#include "app/gui/panels.h"
#include "views/run_files.h"
#include "views/trace_view.h"
#include "core/base/error.h"
#include "core/train/memory.h"
#include "core/train/session.h"
#include "core/train/stepped_run.h"

#define GL_SILENCE_DEPRECATION
#include <GLFW/glfw3.h>
#include <backends/imgui_impl_glfw.h>
#include <backends/imgui_impl_opengl3.h>
#include <imgui.h>
#include <stb_image_write.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

namespace px::gui {

namespace {

using Clock = std::chrono::steady_clock;

// A job larger than this is not explored again on every start (the exploration runs one step of
// it beside the job): the Explore button still does.
constexpr double kAutoExploreBytes = 2.0 * (1 << 30);

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The panels, in tab order: one entry per panel (the dispatch list).
enum class Panel {
    loss,
    layout_check,
    pipeline,
    memory,
    plan,
    fp8,
    router,
    events,
    layout_explorer,
    schedule,
    numerics,
    count
};
struct PanelInfo {
    Panel id;
    const char* name;   // the screenshot's file name
    const char* title;  // the tab
};
constexpr PanelInfo kPanels[] = {
    {Panel::loss, "loss", "Loss"},
    {Panel::layout_check, "layout_check", "Layout check"},
    {Panel::pipeline, "pipeline", "Pipeline"},
    {Panel::memory, "memory", "Memory & comm"},
    {Panel::plan, "plan", "Plan"},
    {Panel::fp8, "fp8", "FP8 & spikes"},
    {Panel::router, "router", "Router (MoE)"},
    {Panel::events, "events", "Events"},
    {Panel::layout_explorer, "layout_explorer", "Layout explorer"},
    {Panel::schedule, "schedule", "Schedule explorer"},
    {Panel::numerics, "numerics", "Numerics explorer"},
};
static_assert(std::size(kPanels) == static_cast<size_t>(Panel::count),
              "kPanels and Panel are out of sync");

class Workbench {
public:
    Workbench(const WorkbenchOptions& opt);
    ~Workbench();
    bool open() const { return !glfwWindowShouldClose(window_); }
    // One frame: events, the models' new state, the panels, the actions asked for. `only`:
    // draw that panel alone over the whole window (screenshots); `capture`: read it back.
    void frame(int only = -1, const std::string& capture = "");
    JobController& job() { return job_; }
    LayoutCheck& check() { return check_; }
    LayoutExplorer& explorer() { return explorer_; }
    Planner& planner() { return planner_; }
    PlanPanelState& plan_panel() { return plan_s_; }
    const RunData& data() const { return data_; }
    LayoutCheckPanelState& check_panel() { return check_s_; }
    const std::string& open_message() const { return job_s_.message; }
    void start_job(bool run);  // the editor's config; errors beside the keys
    // As the job bar's Open: false, with the error in the job bar's message, when it cannot.
    bool open_file(const std::string& path);
    // The layout check panel's Compare: both traces op by op (on the check's thread), or the one
    // given alone; false, with the error in the panel's message, when it cannot start.
    bool compare(const std::string& reference, const std::string& run);
    std::vector<double> frame_ms;  // wall time of each frame, from its events to its swap
    std::vector<double> build_ms;  // of which: the models and panels (ImGui), before GL

private:
    void draw_panel(Panel p);
    void act();
    void print_state();
    Config current_config();
    i64 explored_experts();

    WorkbenchOptions opt_;
    GLFWwindow* window_ = nullptr;
    JobController job_;
    LayoutCheck check_;
    LayoutExplorer explorer_;
    Planner planner_;
    RunData data_;
    UiRects rects_;
    bool opened_file_ = false;  // the panels show an opened run file, not the job
    JobPanelState job_s_;
    LossPanelState loss_s_;
    LayoutCheckPanelState check_s_;
    PipelinePanelState pipe_s_;
    MemoryPanelState mem_s_;
    PlanPanelState plan_s_;
    Fp8PanelState fp8_s_;
    RouterPanelState router_s_;
    EventsPanelState events_s_;
    LayoutExplorerPanelState expl_s_;
    SchedulePanelState sched_s_;
    NumericsPanelState num_s_;
    int frames_ = 0;

public:
    bool state_requested_ = false;  // F12 was pressed: print the state line after this frame
    bool input_ = false;            // an input event came since the last frame
};

Workbench::Workbench(const WorkbenchOptions& opt) : opt_(opt) {
    if (!glfwInit())
        throw NoWindow(
            "cannot open a window: GLFW found no display (set DISPLAY, or run under "
            "xvfb-run -a -s \"-screen 0 1600x1000x24\")");
    glfwWindowHint(GLFW_CONTEXT_VERSION_MAJOR, 3);
    glfwWindowHint(GLFW_CONTEXT_VERSION_MINOR, 3);
    glfwWindowHint(GLFW_OPENGL_PROFILE, GLFW_OPENGL_CORE_PROFILE);
    window_ = glfwCreateWindow(opt.width, opt.height, "Parallax workbench", nullptr, nullptr);
    if (!window_) {
        glfwTerminate();
        throw NoWindow("cannot open a window: no OpenGL 3.3 context on this display");
    }
    glfwMakeContextCurrent(window_);
    // F12 by a callback, set before ImGui's (which chains to it): a press and its release within
    // one frame are both seen, where polling the key would miss them.
    glfwSetWindowUserPointer(window_, this);
    glfwSetKeyCallback(window_, [](GLFWwindow* w, int key, int, int action, int) {
        Workbench* wb = static_cast<Workbench*>(glfwGetWindowUserPointer(w));
        wb->input_ = true;
        if (key == GLFW_KEY_F12 && action == GLFW_PRESS) wb->state_requested_ = true;
    });
    // Any input makes the next frames be drawn (run_workbench draws on input, else a few times
    // a second for the job's new steps: software GL under Xvfb costs the job's cores).
    glfwSetCursorPosCallback(window_, [](GLFWwindow* w, double, double) {
        static_cast<Workbench*>(glfwGetWindowUserPointer(w))->input_ = true;
    });
    glfwSetMouseButtonCallback(window_, [](GLFWwindow* w, int, int, int) {
        static_cast<Workbench*>(glfwGetWindowUserPointer(w))->input_ = true;
    });
    glfwSetScrollCallback(window_, [](GLFWwindow* w, double, double) {
        static_cast<Workbench*>(glfwGetWindowUserPointer(w))->input_ = true;
    });
    glfwSetCharCallback(window_, [](GLFWwindow* w, unsigned int) {
        static_cast<Workbench*>(glfwGetWindowUserPointer(w))->input_ = true;
    });
    glfwSetWindowSizeCallback(window_, [](GLFWwindow* w, int, int) {
        static_cast<Workbench*>(glfwGetWindowUserPointer(w))->input_ = true;
    });

    glfwSwapInterval(0);  // frames are paced below, not by the display
    IMGUI_CHECKVERSION();
    ImGui::CreateContext();
    ImGuiIO& io = ImGui::GetIO();
    io.IniFilename = nullptr;  // no imgui.ini beside the user's files
    const char* font = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
    if (std::filesystem::exists(font)) io.Fonts->AddFontFromFileTTF(font, 15.0f);
    ImGui::StyleColorsDark();
    ImGuiStyle& st = ImGui::GetStyle();
    st.FrameRounding = 3;
    st.WindowRounding = 0;
    ImGui_ImplGlfw_InitForOpenGL(window_, true);
    ImGui_ImplOpenGL3_Init("#version 330 core");

    job_s_.editor.load_base(opt.config);
    job_s_.job = &job_;
    check_s_.check = &check_;
    expl_s_.explorer = &explorer_;
    init_plan_panel(plan_s_, &planner_, opt.plan_cluster, opt.plan_calibrate);
    data_.config = opt.config;
    data_.source = "live job";
    data_.rects = &rects_;
}

Workbench::~Workbench() {
    check_.cancel();
    ImGui_ImplOpenGL3_Shutdown();
    ImGui_ImplGlfw_Shutdown();
    ImGui::DestroyContext();
    glfwDestroyWindow(window_);
    glfwTerminate();
}

Config Workbench::current_config() {
    if (job_.status() != JobStatus::none) return job_.config();
    if (auto c = job_s_.editor.build()) return *c;
    return job_s_.editor.base();
}

// model.moe_experts of the config Explore runs (current_config), read every frame without
// building the editor: the job's, else the edited text when it is a number, else the base's.
i64 Workbench::explored_experts() {
    if (job_.status() != JobStatus::none) return job_.config().model.moe_experts;
    const EditorField* f = job_s_.editor.field("model.moe_experts");
    if (f && !f->text.empty() &&
        std::all_of(f->text.begin(), f->text.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        return std::strtoll(f->text.c_str(), nullptr, 10);
    return job_s_.editor.base().model.moe_experts;
}

void Workbench::start_job(bool run) {
    std::optional<Config> cfg = job_s_.editor.build();
    if (!cfg) {
        job_s_.message = job_s_.editor.error_count() > 1
                             ? "not started: the config has errors (each beside its key)"
                             : "not started: the config has an error (beside its key)";
        return;
    }
    try {
        job_.start(*cfg, run);
        opened_file_ = false;
        data_.source = "live job";
        data_.config = *cfg;
        job_s_.message.clear();
        // The explorer explores the job with its picks (the job's layout while it follows the
        // job bar), when one more step of it is small to hold.
        const Config explored = explored_config(expl_s_.picks, *cfg);
        if (estimate_memory(explored, MemoryScope::process).total < kAutoExploreBytes)
            explorer_.explore(explored);
    } catch (const ConfigError& e) {
        job_s_.message = e.what();
        job_s_.editor.build();  // no field named: shown above the editor
    }
}

bool Workbench::open_file(const std::string& path) {
    try {
        if (path.size() > 5 && path.substr(path.size() - 5) == ".json") {
            // A compare report (parallax compare --json), its traces in the panel's fields, or a
            // validate.json.
            if (is_compare_report(path)) {
                const TraceComparison tc = comparison_from_report(path);
                check_s_.view = check_from_comparison(tc);
                check_s_.reference_trace = tc.ref_path;
                check_s_.run_trace = tc.run_path;
            } else {
                check_s_.view = check_from_report(path);
            }
            check_s_.from_file = true;
            check_s_.layout = 0;
            check_s_.row = check_s_.col = -1;
            job_s_.message = "opened " + path + " in the layout check panel";
        } else {
            try {
                data_.snap = snapshot_from_run_file(path);
                data_.config = data_.snap.config;
                data_.source = path;
                opened_file_ = true;
                job_s_.message = "opened " + path + " (Start returns to the live job)";
            } catch (const std::exception& not_a_run) {
                // A golden trace: the layout check's layouts against it.
                try {
                    check_.start_golden(path, check_s_.layouts);
                } catch (const std::exception& e) {
                    throw Error(std::string(not_a_run.what()) + "; as a golden trace: " + e.what());
                }
                check_s_.from_file = false;
                job_s_.message = "checking " + check_s_.layouts + " against the golden trace " +
                                 path + " in the layout check panel";
            }
        }
    } catch (const std::exception& e) {
        job_s_.message = e.what();
        return false;
    }
    return true;
}

bool Workbench::compare(const std::string& reference, const std::string& run) {
    check_s_.reference_trace = reference;
    check_s_.run_trace = run;
    check_s_.layout = 0;
    check_s_.row = check_s_.col = -1;
    try {
        if (!reference.empty() && !run.empty()) {
            check_.start_compare(reference, run);
            check_s_.from_file = false;
        } else if (!reference.empty() || !run.empty()) {
            check_s_.view = check_from_trace(reference.empty() ? run : reference);
            check_s_.from_file = true;
        } else {
            throw ConfigError(
                "give a reference trace and a run trace to compare them (one alone shows its "
                "probes by step)");
        }
        check_s_.message.clear();
    } catch (const std::exception& e) {
        check_s_.message = e.what();
        return false;
    }
    return true;
}

void Workbench::draw_panel(Panel p) {
    switch (p) {
        case Panel::loss:
            draw_loss_panel(data_, loss_s_);
            break;
        case Panel::layout_check:
            draw_layout_check_panel(data_, check_s_);
            break;
        case Panel::pipeline:
            draw_pipeline_panel(data_, pipe_s_);
            break;
        case Panel::memory:
            draw_memory_panel(data_, mem_s_);
            break;
        case Panel::plan:
            draw_plan_panel(data_, plan_s_);
            break;
        case Panel::fp8:
            draw_fp8_panel(data_, fp8_s_);
            break;
        case Panel::router:
            draw_router_panel(data_, router_s_);
            break;
        case Panel::events:
            draw_events_panel(data_, events_s_);
            break;
        case Panel::layout_explorer:
            expl_s_.experts = explored_experts();
            draw_layout_explorer_panel(data_, expl_s_);
            break;
        case Panel::schedule:
            draw_schedule_panel(data_, sched_s_);
            break;
        case Panel::numerics:
            draw_numerics_panel(data_, num_s_);
            break;
        case Panel::count:
            break;
    }
}

void Workbench::act() {
    const JobAction a = job_s_.requested;
    job_s_.requested = JobAction::none;
    switch (a) {
        case JobAction::none:
            break;
        case JobAction::start:
        case JobAction::restart:
            start_job(true);
            break;
        case JobAction::pause:
            job_.pause();
            break;
        case JobAction::resume:
            job_.resume();
            break;
        case JobAction::step:
            if (job_.status() == JobStatus::none || job_.status() == JobStatus::stopped ||
                job_.status() == JobStatus::finished || job_.status() == JobStatus::failed)
                start_job(false);
            job_.single_step();
            break;
        case JobAction::stop:
            job_.stop();
            break;
        case JobAction::open:
            open_file(job_s_.open_path);
            break;
    }
    if (plan_s_.plan_requested) {
        plan_s_.plan_requested = false;
        planner_.start(plan_request(plan_s_, current_config()));
    }
    if (check_s_.compare_requested) {
        check_s_.compare_requested = false;
        compare(check_s_.reference_trace, check_s_.run_trace);
    }
    if (check_s_.start_requested) {
        check_s_.start_requested = false;
        Config c = current_config();
        if (check_s_.mode == 1) c.numerics.mode = Mode::bitwise;
        if (check_s_.mode == 2) c.numerics.mode = Mode::fast;
        try {
            check_.start(c, check_s_.layouts, check_s_.steps);
            check_s_.from_file = false;
            check_s_.message.clear();
        } catch (const std::exception& e) {
            check_s_.message = e.what();
        }
    }
    // The explorer follows the job bar's fields as they are typed, no Start needed.
    const bool followed = follow_job_bar(expl_s_.picks, job_s_.editor);
    if (expl_s_.explore_requested || followed) {
        expl_s_.explore_requested = false;
        std::optional<Config> bar = job_s_.editor.build();
        const Config c = explored_config(expl_s_.picks, bar ? *bar : current_config());
        // Waits behind a running exploration, never on it; a typed layout only when small (a
        // layout that cannot run is explored: the explorer shows the library's message).
        bool small = true;
        try {
            small = estimate_memory(c, MemoryScope::process).total < kAutoExploreBytes;
        } catch (const Error&) {
        }
        if (!followed || small) explorer_.explore(c);
    }
}

void Workbench::print_state() {
    nlohmann::json j;
    j["frame"] = frames_;
    j["status"] = job_status_name(job_.status());
    j["source"] = data_.source;
    j["steps_done"] = data_.snap.steps_done;
    j["loss_points"] = data_.snap.metrics.size();
    j["loss_last"] = data_.snap.metrics.size() ? data_.snap.metrics.loss.back() : -1.0;
    const ExplorerResult& r = expl_s_.result;
    j["explorer_busy"] = explorer_.busy();
    j["explorer_ranks"] = r.ready && r.error.empty() ? r.layout.world_size() : 0;
    j["explorer_error"] = r.error;
    j["explorer_ep"] = r.ready && r.error.empty() ? r.layout.ep : 0;
    nlohmann::json experts = nlohmann::json::array();  // per rank: [lo, hi) of every MoE layer
    if (r.ready && r.error.empty())
        for (const ExpertRange& e : r.experts) experts.push_back({e.lo, e.hi});
    j["explorer_experts"] = experts;
    const ExplorerPicks& pk = expl_s_.picks;
    j["explorer_picks"] = {{"dp", pk.dp},     {"tp", pk.tp},         {"pp", pk.pp},
                           {"cp", pk.cp},     {"ep", pk.ep},         {"zero", pk.zero},
                           {"block", pk.block}, {"follow", pk.follow}};
    j["explorer_block"] = r.ready && r.error.empty() ? r.config.numerics.block : 0;
    nlohmann::json held = nlohmann::json::array();  // the shown matrix: each block's holders
    if (r.ready && r.error.empty() && expl_s_.tensor >= 0 &&
        expl_s_.tensor < static_cast<int>(r.tensors.size())) {
        const TensorHolding& t = r.tensors[static_cast<size_t>(expl_s_.tensor)];
        j["explorer_tensor"] = t.name;
        for (const HeldBlock& b : held_blocks(t, expl_s_.show_moments))
            held.push_back({{"ranks", b.ranks}, {"replicated", b.replicated()}});
    }
    j["explorer_held"] = held;
    nlohmann::json heads = nlohmann::json::object();  // llama: the attention heads on the tp ranks
    if (r.ready && r.error.empty() && r.config.model.llama()) {
        heads["split"] = r.heads.split;
        heads["kind"] = r.heads.kind();
        heads["ranks"] = nlohmann::json::array();
        for (const RankHeads& h : r.heads.ranks)
            heads["ranks"].push_back({{"q", {h.q.lo, h.q.hi}}, {"kv", {h.kv.lo, h.kv.hi}},
                                      {"text", r.heads.rank_text(h.tp_rank)}});
    }
    j["explorer_heads"] = heads;
    j["job_tp"] = job_.status() != JobStatus::none ? job_.config().layout.tp : 0;
    nlohmann::json errors = nlohmann::json::object();
    for (const EditorField& f : job_s_.editor.fields())
        if (!f.error.empty()) errors[f.key] = f.error;
    j["editor_errors"] = errors;
    nlohmann::json fields = nlohmann::json::object();
    for (const EditorField& f : job_s_.editor.fields()) fields[f.key] = f.text;
    fields["open"] = job_s_.open_path;
    fields["check_layouts"] = check_s_.layouts;
    fields["check_steps"] = std::to_string(check_s_.steps);
    fields["reference_trace"] = check_s_.reference_trace;
    fields["run_trace"] = check_s_.run_trace;
    fields["explorer_tp"] = std::to_string(expl_s_.picks.tp);
    fields["explorer_block"] = std::to_string(expl_s_.picks.block);
    j["plan"] = plan_state(plan_s_, fields);
    j["fields"] = fields;
    // What the panels hold: the layout check's grids, the FP8 rows, the spike evidence, memory.
    const CheckView cv = check_s_.from_file ? check_s_.view : check_.view();
    nlohmann::json check = nlohmann::json::object();
    check["running"] = cv.running;
    check["mode"] = cv.mode;
    check["steps"] = cv.steps;
    check["header"] = cv.header;
    check["error"] = cv.error;
    check["message"] = check_s_.message;
    check["layouts"] = nlohmann::json::array();
    for (const LayoutGrid& g : cv.layouts) {
        i64 done = 0, differing = 0, over = 0, cells = 0;
        for (const std::vector<CheckCell>& line : g.cells)
            for (const CheckCell& k : line) {
                cells++;
                done += k.done;
                differing += k.done && k.rank >= 0;
                over += k.done && k.ratio > 1;
            }
        check["layouts"].push_back({{"name", g.name},
                                    {"steps_done", g.steps_done},
                                    {"finished", g.finished},
                                    {"verdict", g.finished ? g.result.verdict : ""},
                                    {"rows", g.tensors.size()},
                                    {"cells", cells},
                                    {"cells_done", done},
                                    {"differing", differing},
                                    {"over_budget", over},
                                    {"summary", g.summary},
                                    {"first_cell", {g.first_row, g.first_col}}});
    }
    j["check"] = check;
    j["fp8_rows"] = data_.snap.fp8.size();
    j["spike_steps"] = data_.snap.values.size();
    i64 spikes = 0;
    for (const RunEvent& e : data_.snap.events) spikes += e.kind == EventKind::spike;
    j["spike_events"] = spikes;
    // The router panel's view as last drawn (it is remade when the panel is shown).
    const RouterView& rv = router_s_.view;
    const int rs = router_s_.step >= 0 ? router_s_.step : static_cast<int>(rv.steps.size()) - 1;
    double load_max = 0;
    for (int l = 0; l < static_cast<int>(rv.layers.size()); l++)
        for (int e = 0; e < rv.experts; e++)
            for (int k = 0; k < static_cast<int>(rv.steps.size()); k++)
                load_max =
                    std::max(load_max, std::isfinite(rv.load(l, e, k)) ? rv.load(l, e, k) : 0.0);
    j["router"] = {{"layers", rv.layers},
                   {"experts", rv.experts},
                   {"steps", rv.steps.size()},
                   {"layer", router_s_.layer < static_cast<int>(rv.layers.size())
                                 ? rv.layers[static_cast<size_t>(router_s_.layer)]
                                 : -1},
                   {"step", rs >= 0 && rs < static_cast<int>(rv.steps.size())
                                ? rv.steps[static_cast<size_t>(rs)]
                                : -1.0},
                   {"following", router_s_.step < 0},
                   {"expert", router_s_.expert},
                   {"load_max", load_max}};
    j["memory_ranks"] = data_.snap.memory.size();
    // The pipeline and memory panels' measured data: per lane, its bars; per rank, its bytes.
    nlohmann::json pipe = {{"lanes", nlohmann::json::array()}, {"problem", "no job"}};
    nlohmann::json mem = nlohmann::json::array();
    if (data_.trace) {
        const Timeline tl = measured_timeline(data_.trace->mesh(), data_.trace->last_steps());
        std::vector<int> bars(tl.lanes.size(), 0);
        for (const TimelineBar& b : tl.bars)
            if (b.kind == TimelineBar::forward || b.kind == TimelineBar::backward ||
                b.kind == TimelineBar::weight)
                bars[static_cast<size_t>(b.lane)]++;
        for (size_t i = 0; i < tl.lanes.size(); i++)
            pipe["lanes"].push_back({{"name", tl.lanes[i]}, {"compute_bars", bars[i]}});
        pipe["problem"] = tl.problem;
        pipe["step"] = tl.step;
        for (const MemoryStats& m : data_.trace->memory())
            mem.push_back({{"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer}});
    }
    j["pipeline"] = pipe;
    j["memory_per_rank"] = mem;
    j["general_error"] = job_s_.editor.general_error();
    j["message"] = job_s_.message;
    nlohmann::json rects = nlohmann::json::object();
    for (const auto& [name, v] : rects_.rects) rects[name] = {v.x, v.y, v.z, v.w};
    j["rects"] = rects;
    std::vector<double> f(frame_ms.end() - std::min<size_t>(frame_ms.size(), 240), frame_ms.end());
    std::sort(f.begin(), f.end());
    j["frame_ms_median"] = f.empty() ? 0.0 : f[f.size() / 2];
    std::printf("STATE %s\n", j.dump().c_str());
    std::fflush(stdout);
}

void Workbench::frame(int only, const std::string& capture) {
    const auto t0 = Clock::now();
    glfwPollEvents();
    job_.poll();
    if (!opened_file_) {
        job_.update(data_.snap);
        data_.trace = job_.trace();
        if (job_.status() != JobStatus::none) data_.config = job_.config();
    } else {
        data_.trace = nullptr;
    }
    rects_.rects.clear();  // what this frame draws, nothing older
    ImGui_ImplOpenGL3_NewFrame();
    ImGui_ImplGlfw_NewFrame();
    ImGui::NewFrame();
    const ImGuiViewport* vp = ImGui::GetMainViewport();
    ImGui::SetNextWindowPos(vp->WorkPos);
    ImGui::SetNextWindowSize(vp->WorkSize);
    ImGui::Begin("workbench", nullptr,
                 ImGuiWindowFlags_NoDecoration | ImGuiWindowFlags_NoMove |
                     ImGuiWindowFlags_NoSavedSettings | ImGuiWindowFlags_NoBringToFrontOnFocus |
                     ImGuiWindowFlags_NoBackground);
    if (only >= 0) {
        ImGui::Text("Parallax workbench: %s", kPanels[only].title);
        ImGui::Separator();
        ImGui::BeginChild("panel");
        draw_panel(kPanels[only].id);
        ImGui::EndChild();
    } else {
        ImGui::BeginChild("jobbar", ImVec2(ImGui::GetFontSize() * 32, 0), true);
        draw_job_panel(data_, job_s_);
        ImGui::EndChild();
        ImGui::SameLine();
        ImGui::BeginChild("panels");
        if (ImGui::BeginTabBar("tabs")) {
            for (const PanelInfo& p : kPanels) {
                const bool open_tab = ImGui::BeginTabItem(p.title);
                rects_.mark(std::string("tab:") + p.name);
                if (open_tab) {
                    ImGui::BeginChild(p.name);
                    draw_panel(p.id);
                    ImGui::EndChild();
                    ImGui::EndTabItem();
                }
            }
            ImGui::EndTabBar();
        }
        ImGui::EndChild();
    }
    ImGui::End();
    ImGui::Render();
    build_ms.push_back(ms_since(t0));
    int w, h;
    glfwGetFramebufferSize(window_, &w, &h);
    glViewport(0, 0, w, h);
    // The window's background is this clear (no full-window quad: under Xvfb's software GL a
    // frame costs what it fills).
    glClearColor(0.06f, 0.06f, 0.06f, 1);
    glClear(GL_COLOR_BUFFER_BIT);
    ImGui_ImplOpenGL3_RenderDrawData(ImGui::GetDrawData());
    if (!capture.empty()) {
        std::vector<unsigned char> px(static_cast<size_t>(w) * h * 3), flipped(px.size());
        glPixelStorei(GL_PACK_ALIGNMENT, 1);
        glReadBuffer(GL_BACK);
        glReadPixels(0, 0, w, h, GL_RGB, GL_UNSIGNED_BYTE, px.data());
        const size_t row = static_cast<size_t>(w) * 3;
        for (int y = 0; y < h; y++)
            std::copy_n(px.data() + static_cast<size_t>(h - 1 - y) * row, row,
                        flipped.data() + static_cast<size_t>(y) * row);
        if (!stbi_write_png(capture.c_str(), w, h, 3, flipped.data(), static_cast<int>(row)))
            throw StorageError("cannot write " + capture);
    }
    glfwSwapBuffers(window_);
    frame_ms.push_back(ms_since(t0));  // the whole frame: events, models, panels, GL, swap
    frames_++;
    act();
    if (state_requested_) print_state();
    state_requested_ = false;
}

// The job's median step time over steps [from, to] of a snapshot, in ms.
double median_step_ms(const RunSnapshot& s, i64 from) {
    std::vector<double> v;
    for (size_t i = 0; i < s.metrics.size(); i++)
        if (s.metrics.step[i] >= from) v.push_back(s.metrics.step_ms[i]);
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Draws when needed: within 1/60 s of an input event (and two frames after it, so hover and
// release settle), else every 100 ms (or ten frame times, when longer) while something may
// change, else every 500 ms.
class Pacer {
public:
    void wait_and_frame(Workbench& wb) {
        const double since = ms_since(last_);
        if (wb.input_) settle_ = 3;
        const bool busy = wb.job().status() == JobStatus::running ||
                          wb.job().status() == JobStatus::starting || wb.check().busy() ||
                          wb.explorer().busy() || wb.planner().busy();
        // While the job runs, a frame takes at most a tenth of a core: software OpenGL
        // (llvmpipe) draws a frame in tens of ms, and a core it holds is one the job's OpenMP
        // threads wait for at their barriers (the job must never wait on a frame).
        const double period = settle_ > 0 ? 16.6 : busy ? std::max(100.0, 10 * frame_ms_) : 500.0;
        if (since < period) {
            glfwWaitEventsTimeout((period - since) / 1000.0);
            if (!wb.input_ && settle_ == 0 && ms_since(last_) < period) return;
            if (wb.input_) settle_ = 3;
            if (settle_ > 0 && ms_since(last_) < 16.6) return;
        }
        wb.input_ = false;
        if (settle_ > 0) settle_--;
        last_ = Clock::now();
        wb.frame();
        frame_ms_ = ms_since(last_);
    }

private:
    Clock::time_point last_{};
    int settle_ = 0;
    double frame_ms_ = 0;  // the last frame's, events to swap
};

// Screenshots: frames as fast as 60 per second, the models' work is what is waited for.
void pace(Clock::time_point start) {
    const double left = 16.6 - ms_since(start);
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(left));
}

int screenshots(const WorkbenchOptions& opt) {
    std::filesystem::create_directories(opt.screenshot_dir);
    Workbench wb(opt);
    ImGui::GetIO().ConfigFlags |=
        ImGuiConfigFlags_NoMouse;  // no hover where the pointer happens to be
    wb.check_panel().layouts = opt.check_layouts;
    wb.start_job(false);
    if (wb.job().status() == JobStatus::none)
        throw ConfigError(opt.config.source_name + ": the job cannot start");
    const i64 steps = std::min(opt.steps, opt.config.train.steps);
    wb.job().run_to(steps);
    wb.check_panel().steps = static_cast<int>(std::min<i64>(steps, 20));
    const bool files = !opt.open_path.empty() || !opt.compare_reference.empty();
    if (!files) wb.check().start(opt.config, opt.check_layouts, wb.check_panel().steps);
    wb.plan_panel().plan_requested = true;  // the job's world size on the cluster (--cluster)
    const auto t0 = Clock::now();
    while (true) {
        const auto f0 = Clock::now();
        wb.frame();
        // Shots of the job's end show it finished (its last step, the observers' on_end); of
        // `steps` before it, paused there.
        const JobStatus st = wb.job().status();
        const bool at_steps = wb.data().snap.steps_done >= steps && st == JobStatus::paused;
        const bool job_done = st == JobStatus::failed ||
                              (steps >= opt.config.train.steps ? st == JobStatus::finished
                                                               : at_steps);
        if (job_done && !wb.check().busy() && !wb.explorer().busy() && !wb.planner().busy())
            break;
        if (ms_since(t0) > 600e3)
            throw Error("the screenshot run did not finish within 10 minutes");
        pace(f0);
    }
    if (wb.job().status() == JobStatus::failed) {
        std::fprintf(stderr, "parallax gui: the job failed: %s\n", wb.data().snap.error.c_str());
        return 3;  // the run itself failed (app/commands.h kRunFailed)
    }
    // The files after the job's steps (an opened run file replaces the job in the panels).
    if (files) {
        if (!opt.open_path.empty() && !wb.open_file(opt.open_path))
            throw DataError(wb.open_message());
        if (!opt.compare_reference.empty() && !wb.compare(opt.compare_reference, opt.compare_run))
            throw DataError(wb.check_panel().message);
        while (wb.check().busy()) {
            const auto f0 = Clock::now();
            wb.frame();
            if (ms_since(t0) > 600e3)
                throw Error("the screenshot run did not finish within 10 minutes");
            pace(f0);
        }
        wb.frame();  // the finished view
        if (!wb.check().view().error.empty() && !wb.check_panel().from_file)
            throw DataError(wb.check().view().error);
    }
    for (int i = 0; i < static_cast<int>(std::size(kPanels)); i++) {
        wb.frame(i);  // one frame to lay the panel out, one to capture it
        wb.frame(i);
        const std::string path = opt.screenshot_dir + "/" + kPanels[i].name + ".png";
        wb.frame(i, path);
        std::printf("wrote %s\n", path.c_str());
    }
    const std::string whole =
        opt.screenshot_dir + "/workbench.png";  // the window as a person sees it
    wb.frame();
    wb.frame(-1, whole);
    std::printf("wrote %s\n", whole.c_str());
    std::fflush(stdout);
    return 0;
}

// The job's step time headless (no window, no reader) against with the workbench drawing every
// frame, alternating, and the frame time with the job running.
int measure(const WorkbenchOptions& opt) {
    Config cfg = opt.config;
    const i64 steps = std::min(opt.measure_steps, cfg.train.steps);
    const i64 from = std::min<i64>(4, steps);  // steps before this warm up
    std::vector<double> headless, attached, frames, builds;
    Workbench wb(opt);
    for (int round = 0; round < 3; round++) {
        {  // the same run session as the workbench's job (its run file too), without a window
            JobView view;
            SessionOptions so;
            so.observers = {&view};
            RunSession session(cfg, std::move(so));
            SteppedRun& run = session.start();
            run.advance_to(steps);
            while (!run.wait(1.0)) {
            }
            headless.push_back(median_step_ms(view.snapshot(), from));
        }
        wb.frame_ms.clear();
        wb.build_ms.clear();
        wb.start_job(false);
        wb.job().run_to(steps);
        Pacer pacer;
        while (wb.data().snap.steps_done < steps && wb.job().status() != JobStatus::failed)
            pacer.wait_and_frame(wb);
        attached.push_back(median_step_ms(wb.data().snap, from));
        frames.insert(frames.end(), wb.frame_ms.begin(), wb.frame_ms.end());
        builds.insert(builds.end(), wb.build_ms.begin(), wb.build_ms.end());
        wb.job().stop();
        wb.job().wait_stopped();  // its folders free for the next headless run
    }
    std::sort(frames.begin(), frames.end());
    std::sort(builds.begin(), builds.end());
    auto pct = [&](double q) {
        return frames.empty() ? 0.0 : frames[static_cast<size_t>(q * (frames.size() - 1))];
    };
    auto bpct = [&](double q) {
        return builds.empty() ? 0.0 : builds[static_cast<size_t>(q * (builds.size() - 1))];
    };
    double h = 0, a = 0;
    for (double v : headless) h += v / headless.size();
    for (double v : attached) a += v / attached.size();
    std::printf(
        "job: %s, %lld steps per run, 3 runs each way, alternating (medians of steps %lld..)\n",
        cfg.source_name.c_str(), static_cast<long long>(steps), static_cast<long long>(from));
    std::printf(
        "frame time with the job running (events to swap): median %.2f ms, p95 %.2f ms, max %.2f "
        "ms "
        "(%zu frames, drawn every 100 ms or 10 frame times while the job runs)\n",
        pct(0.5), pct(0.95), pct(1.0), frames.size());
    std::printf("  of which the models and panels (before GL): median %.2f ms, p95 %.2f ms\n",
                bpct(0.5), bpct(0.95));
    std::printf("step time: headless %.2f ms, with the workbench %.2f ms: slowdown %+.1f%%\n", h, a,
                100 * (a / h - 1));
    return 0;
}

}  // namespace

int run_workbench(const WorkbenchOptions& opt) {
    if (!opt.screenshot_dir.empty()) return screenshots(opt);
    if (opt.measure) return measure(opt);
    Workbench wb(opt);
    if (!opt.open_path.empty()) wb.open_file(opt.open_path);
    if (!opt.compare_reference.empty()) wb.compare(opt.compare_reference, opt.compare_run);
    Pacer pacer;
    while (wb.open()) pacer.wait_and_frame(wb);
    return 0;
}

}  // namespace px::gui
