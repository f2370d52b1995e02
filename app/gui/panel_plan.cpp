// Plan: the layout planner (docs/planner.md) for the workbench's config on N devices of a cluster
// file, off the window's thread (views/plan_view.h): every layout the runtime accepts, ranked (the
// fitting ones by predicted step time), each with its schedule, ZeRO stage, microbatches,
// recompute, memory per rank, step time, MFU, bubble and its largest terms; and, once the job has
// run, its own layout's prediction beside what it measured: memory per rank, step time (after
// calibration from run files, when given) and communication bytes per group.
#include "app/gui/panels.h"

#include "core/base/error.h"
#include "core/train/memory.h"

#include <imgui.h>
#include <imgui_stdlib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>

namespace px::gui {

namespace {

using plan::format_seconds;

std::string value(const PlanComparisonRow& r, double v) {
    if (v < 0) return "-";
    return r.unit == "seconds" ? format_seconds(v) : format_bytes(v);
}

// The config's world size: the devices the panel plans for until the person types another.
int world_size(const Config& c) {
    return std::max(1, c.layout.dp * c.layout.tp * c.layout.pp * c.layout.cp);
}

void cell(const std::string& s) {
    ImGui::TableNextColumn();
    ImGui::TextUnformatted(s.c_str());
}

// The ranked layouts, the job's own highlighted.
void plan_table(const RunData& d, const PlanOutcome& o, const std::string& job_label, float h) {
    const plan::Plan& p = o.plan;
    const ImGuiTableFlags flags = ImGuiTableFlags_RowBg | ImGuiTableFlags_Borders |
                                  ImGuiTableFlags_ScrollY | ImGuiTableFlags_SizingFixedFit;
    if (!ImGui::BeginTable("plan_rows", 12, flags, ImVec2(-1, h))) return;
    ImGui::TableSetupScrollFreeze(0, 1);
    for (const char* c : {"#", "layout", "schedule", "ZeRO", "microbatches", "recompute",
                          "memory / rank", "fits", "step", "MFU", "bubble", "largest terms"})
        ImGui::TableSetupColumn(c);
    ImGui::TableHeadersRow();
    ImGuiListClipper clip;
    clip.Begin(static_cast<int>(p.candidates.size()));
    while (clip.Step()) {
        for (int i = clip.DisplayStart; i < clip.DisplayEnd; i++) {
            const plan::Candidate& c = p.candidates[static_cast<size_t>(i)];
            ImGui::TableNextRow();
            const std::string label = c.label();
            if (label == job_label)
                ImGui::TableSetBgColor(ImGuiTableBgTarget_RowBg1, IM_COL32(40, 80, 130, 255));
            ImGui::TableNextColumn();
            ImGui::Text("%d", i + 1);
            std::string mesh = "dp" + std::to_string(c.dp);
            const std::pair<const char*, int> dims[] = {
                {"tp", c.tp}, {"pp", c.pp}, {"cp", c.cp}, {"ep", c.ep}};
            for (const auto& [n, v] : dims)
                if (v > 1) mesh += std::string(" ") + n + std::to_string(v);
            cell(mesh + (label == job_label ? "  (the job's)" : ""));
            cell(c.pp > 1
                     ? c.schedule +
                           (c.virtual_stages > 1 ? " v" + std::to_string(c.virtual_stages) : "")
                     : "-");
            cell(std::to_string(c.zero));
            cell(std::to_string(c.microbatches));
            cell(c.recompute);
            cell(format_bytes(c.memory_bytes));
            ImGui::TableNextColumn();
            if (c.fits)
                ImGui::TextUnformatted("yes");
            else
                ImGui::TextColored(ImVec4(1.0f, 0.45f, 0.4f, 1), "no");
            cell(format_seconds(c.time.step));
            ImGui::TableNextColumn();
            ImGui::Text("%.1f%%", 100 * c.mfu);
            ImGui::TableNextColumn();
            ImGui::Text("%.1f%%", c.time.step > 0 ? 100 * c.time.bubble / c.time.step : 0.0);
            std::string terms;
            for (const TermShare& t : top_terms(c.time, 3))
                terms += (terms.empty() ? "" : ", ") + std::string(t.name) + " " +
                         std::to_string(static_cast<int>(100 * t.seconds / c.time.step + 0.5)) +
                         "%";
            cell(terms);
        }
    }
    ImGui::EndTable();
    if (d.rects) d.rects->mark("plan_table");
}

void comparison_table(const RunData& d, const PlanComparison& c) {
    const ImGuiTableFlags flags =
        ImGuiTableFlags_RowBg | ImGuiTableFlags_Borders | ImGuiTableFlags_SizingFixedFit;
    if (!ImGui::BeginTable("plan_vs_run", 4, flags)) return;
    for (const char* h : {"", "predicted", "measured", "predicted / measured"})
        ImGui::TableSetupColumn(h);
    ImGui::TableHeadersRow();
    for (const PlanComparisonRow& r : c.rows) {
        ImGui::TableNextRow();
        cell(r.what);
        cell(value(r, r.predicted));
        cell(value(r, r.measured));
        ImGui::TableNextColumn();
        if (r.measured > 0) {
            const double q = r.ratio();
            const bool off = q > 1.5 || q < 1 / 1.5;
            ImGui::TextColored(off ? ImVec4(1.0f, 0.7f, 0.3f, 1) : ImVec4(0.6f, 0.9f, 0.6f, 1),
                               "%.3g", q);
        } else {
            ImGui::TextDisabled("-");
        }
    }
    ImGui::EndTable();
    if (d.rects) d.rects->mark("plan_comparison");
}

}  // namespace

void init_plan_panel(PlanPanelState& s, Planner* planner, const std::string& cluster,
                     const std::string& calibrate) {
    s.planner = planner;
    std::error_code ec;
    s.clusters =
        cluster_files({std::filesystem::current_path(ec).string(),
                       std::filesystem::canonical("/proc/self/exe", ec).parent_path().string()});
    s.cluster = cluster.empty() ? default_cluster(s.clusters) : cluster;
    s.calibrate = calibrate;
}

PlanRequest plan_request(const PlanPanelState& s, const Config& config) {
    PlanRequest r;
    r.config = config;
    r.gpus = s.gpus > 0 ? s.gpus : world_size(config);
    r.cluster = s.cluster;
    std::stringstream runs(s.calibrate);
    for (std::string f; std::getline(runs, f, ',');) {
        f.erase(0, f.find_first_not_of(" \t"));
        f.erase(f.find_last_not_of(" \t") + 1);
        if (!f.empty()) r.calibrate.push_back(f);
    }
    return r;
}

nlohmann::json plan_state(const PlanPanelState& s, nlohmann::json& fields) {
    fields["plan_gpus"] = std::to_string(s.gpus);
    fields["plan_cluster"] = s.cluster;
    fields["plan_calibrate"] = s.calibrate;
    const PlanOutcome& o = s.outcome;
    nlohmann::json j = {{"busy", s.planner && s.planner->busy()},
                        {"ready", o.ready},
                        {"error", o.error},
                        {"clusters", s.clusters},
                        {"gpus", o.plan.gpus},
                        {"candidates", o.plan.candidates.size()},
                        {"fitting", o.plan.fitting},
                        {"rejected", o.plan.rejected},
                        {"usable_bytes", o.plan.usable_bytes},
                        {"calibrated", o.calibration.has_value()},
                        {"achievable", o.fitted.achievable}};
    nlohmann::json rows = nlohmann::json::array();
    for (size_t i = 0; i < o.plan.candidates.size() && i < 10; i++) {
        const plan::Candidate& c = o.plan.candidates[i];
        rows.push_back({{"label", c.label()},
                        {"fits", c.fits},
                        {"memory_bytes", c.memory_bytes},
                        {"step_s", c.time.step},
                        {"mfu", c.mfu},
                        {"bubble_s", c.time.bubble}});
    }
    j["rows"] = rows;
    nlohmann::json cmp = {{"layout", s.comparison.layout},
                          {"error", s.comparison.error},
                          {"steps", s.compared_steps},
                          {"rows", nlohmann::json::array()}};
    for (const PlanComparisonRow& r : s.comparison.rows)
        cmp["rows"].push_back({{"what", r.what},
                               {"unit", r.unit},
                               {"predicted", r.predicted},
                               {"measured", r.measured}});
    j["comparison"] = cmp;
    return j;
}

void draw_plan_panel(const RunData& d, PlanPanelState& s) {
    if (s.planner && s.planner->version() != s.seen) {
        s.seen = s.planner->version();
        s.outcome = s.planner->outcome();
        s.compared_steps = -1;  // compare again with the new cluster
    }
    if (s.gpus < 1) s.gpus = world_size(d.config);
    // Inputs: devices, the cluster (a file of examples/clusters/ or any path), run files.
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 6);
    ImGui::InputInt("devices", &s.gpus, 0, 0);
    if (d.rects) d.rects->mark("field:plan_gpus");
    if (s.gpus < 1) s.gpus = 1;
    ImGui::SameLine();
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 14);
    const std::string shown = s.cluster.substr(s.cluster.find_last_of('/') + 1);
    if (ImGui::BeginCombo("##cluster_files",
                          shown.empty() ? "examples/clusters/" : shown.c_str())) {
        for (const std::string& f : s.clusters) {
            const std::string name = f.substr(f.find_last_of('/') + 1);
            if (ImGui::Selectable(name.c_str(), f == s.cluster)) s.cluster = f;
        }
        if (s.clusters.empty()) ImGui::TextDisabled("no examples/clusters/ found: give a path");
        ImGui::EndCombo();
    }
    if (d.rects) d.rects->mark("plan_cluster_files");
    ImGui::SameLine();
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 22);
    ImGui::InputTextWithHint("cluster", "cluster.toml", &s.cluster);
    if (d.rects) d.rects->mark("field:plan_cluster");
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 30);
    ImGui::InputTextWithHint("calibrate from", "run.h5 (optional; several: comma-separated)",
                             &s.calibrate);
    if (d.rects) d.rects->mark("field:plan_calibrate");
    ImGui::SameLine();
    const bool busy = s.planner && s.planner->busy();
    if (ImGui::Button(busy ? "Planning...###plan" : "Plan###plan") && !busy)
        s.plan_requested = true;
    if (d.rects) d.rects->mark("plan_button");
    if (ImGui::IsItemHovered())
        ImGui::SetTooltip(
            "Every layout of this many devices for the job bar's config, ranked\n"
            "(parallax plan; the cluster's figures fitted to the run files first)");

    const PlanOutcome& o = s.outcome;
    if (!o.ready) {
        empty_state(busy ? "planning..."
                         : "press Plan: every layout of this many devices for the job's config, "
                           "ranked by predicted step time");
        return;
    }
    if (!o.error.empty()) {
        ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 110, 100, 255));
        ImGui::TextWrapped("%s", o.error.c_str());
        ImGui::PopStyleColor();
        return;
    }
    const plan::Plan& p = o.plan;
    ImGui::Text(
        "%s on %d x %s: %zu layouts, %d refused by the runtime's rules, %d fit in %s per "
        "device (planned in %.2f s)",
        o.request.config.source_name.c_str(), p.gpus, o.fitted.name.c_str(), p.candidates.size(),
        p.rejected, p.fitting, format_bytes(p.usable_bytes).c_str(), o.seconds);
    if (o.calibration) {
        const plan::Calibration& c = *o.calibration;
        ImGui::TextWrapped("calibrated on %zu run%s: [compute] achievable %.3g (the file's %.3g)%s",
                           c.runs.size(), c.runs.size() == 1 ? "" : "s", c.achievable,
                           o.cluster.achievable,
                           c.bandwidth ? (", links x " + std::to_string(c.link_scale)).c_str()
                                       : "; links as the file says");
        if (ImGui::IsItemHovered()) ImGui::SetTooltip("%s", o.calibration_text.c_str());
    }
    if (p.fitting == 0)
        ImGui::TextColored(ImVec4(1.0f, 0.45f, 0.4f, 1),
                           "no layout fits in the devices' memory: the smallest comes first");

    // The job's own layout: its label marks its row, and its prediction stands beside the run.
    const bool has_run = d.snap.steps_done >= 2;
    if (has_run && (d.snap.steps_done != s.compared_steps || d.source != s.compared_source)) {
        s.compared_steps = d.snap.steps_done;
        s.compared_source = d.source;
        s.comparison = compare_with_run(d.config, o.cluster, o.calibration ? &o.fitted : nullptr,
                                        measured_run(d.snap, d.trace));
    }
    const float h = ImGui::GetContentRegionAvail().y;
    plan_table(d, o, has_run ? s.comparison.layout : "", has_run ? h * 0.55f : -1);
    if (!has_run) return;
    ImGui::Separator();
    const PlanComparison& c = s.comparison;
    if (!c.error.empty()) {
        empty_state(c.error.c_str());
        return;
    }
    ImGui::Text("the job's layout, %s (%s, %lld steps): predicted beside measured",
                c.layout.c_str(), d.source.c_str(), static_cast<long long>(d.snap.steps_done));
    comparison_table(d, c);
    ImGui::TextDisabled(
        "memory: the runtime's estimate against its accounting; step time: the median after the "
        "first step; comm: the last step's bytes of every rank");
}

}  // namespace px::gui
