// FP8 and spikes. The FP8 half reads the FP8 drift monitor's rows (core/train/fp8_monitor.h, via
// the Fp8View model): the chosen tensor's amax and scale by step (with current scaling's scale
// beside the run's, when compared), a tensors × steps heatmap of the saturated and of the
// underflowed fraction, and the alerts with their evidence; a click on a cell or an alert
// chooses its tensor. The spike half is panel_spikes.cpp. Each half sits under a collapsing
// header; with data in both, each scrolls in a share of the panel of its own.
// It never shows made-up data.
#include "app/gui/panels.h"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace px::gui {

namespace {

// A fraction's colour: no row (dark), exactly zero (slate), then from 1e-5 (dim, near the
// slate) on a log ramp to amber at the alert threshold (1 without one); past it, bright red.
ImU32 fraction_colour(double v, double alert) {
    if (std::isnan(v)) return IM_COL32(34, 36, 44, 255);
    if (v <= 0) return IM_COL32(44, 62, 84, 255);
    if (alert > 0 && v > alert) return IM_COL32(255, 40, 40, 255);
    const double top = alert > 0 ? std::log10(alert) : 0.0;
    const double t = std::clamp((std::log10(v) + 5.0) / (top + 5.0), 0.0, 1.0);
    const auto lerp = [&](int a, int b) { return static_cast<int>(a + (b - a) * t); };
    return IM_COL32(lerp(70, 245), lerp(78, 150), lerp(80, 30), 255);
}

std::string percent(double v) {
    char buf[32];
    if (std::isnan(v)) return "-";
    std::snprintf(buf, sizeof buf, v == 0 ? "0%%" : v < 1e-3 ? "%.2g%%" : "%.3g%%", 100 * v);
    return buf;
}

std::string alert_kinds(i64 bits) {
    std::string s;
    auto add = [&](const char* w) { s += (s.empty() ? "" : ", ") + std::string(w); };
    if (bits & kFp8ScaleJump) add("scale jump");
    if (bits & kFp8Saturation) add("saturation");
    if (bits & kFp8Sqnr) add("low SQNR");
    return s;
}

plot::Heatmap fraction_map(const Fp8View& v, const std::vector<std::vector<double>>& grid,
                           const char* title, double alert) {
    plot::Heatmap h;
    h.rows = static_cast<int>(v.tensors.size());
    h.cols = static_cast<int>(v.steps.size());
    h.title = title;
    h.x_label = "step";
    h.first_col = v.steps.empty() ? 1 : static_cast<int>(v.steps.front());
    h.col_step = static_cast<int>(std::max<i64>(1, v.step_stride));
    h.colour = [&grid, alert](int r, int c) {
        return fraction_colour(grid[static_cast<size_t>(r)][static_cast<size_t>(c)], alert);
    };
    h.row_label = [&v](int r) { return v.tensors[static_cast<size_t>(r)]; };
    const double top = alert > 0 ? alert : 1.0;
    h.legend = {{fraction_colour(NAN, alert), "not monitored"},
                {fraction_colour(0, alert), "0"},
                {fraction_colour(1e-5, alert), "1e-5"},
                {fraction_colour(std::sqrt(1e-5 * top), alert), percent(std::sqrt(1e-5 * top))},
                {fraction_colour(top, alert), alert > 0 ? "alert " + percent(alert) : "100%"}};
    if (alert > 0) h.legend.push_back({fraction_colour(1, alert), "over alert"});
    return h;
}

void draw_fp8_half(const RunData& d, Fp8PanelState& s) {
    const Config& cfg = d.snap.state == RunState::not_started ? d.config : d.snap.config;
    ImGui::TextDisabled("amax and scale histories, saturation and underflow, alerts");
    if (d.snap.fp8.empty()) {
        if (cfg.precision.fp8 == "off")
            empty_state(("no FP8 tensors in this run: precision.fp8 is \"off\" (activations " +
                         cfg.precision.activations +
                         "); set precision.fp8 and fp8_monitor.every to watch them")
                            .c_str());
        else if (cfg.fp8_monitor.every <= 0)
            empty_state(
                "the FP8 drift monitor is off in this run: set fp8_monitor.every (1: every "
                "step) to record each fp8 tensor's amax, scale, saturation and underflow");
        else
            empty_state(("no monitored step yet (fp8_monitor.every = " +
                         std::to_string(cfg.fp8_monitor.every) + ")")
                            .c_str());
        return;
    }
    if (s.epoch != d.snap.epoch || s.rows != d.snap.fp8.size()) {
        s.view = make_fp8_view(d.snap);
        s.epoch = d.snap.epoch;
        s.rows = d.snap.fp8.size();
        if (s.tensor >= static_cast<int>(s.view.tensors.size())) s.tensor = -1;
    }
    const Fp8View& v = s.view;
    if (s.tensor < 0) s.tensor = v.default_tensor();
    if (s.hist_tensor != s.tensor || s.hist_rows != s.rows) {
        s.histories = v.histories(d.snap.fp8, s.tensor);
        s.hist_tensor = s.tensor;
        s.hist_rows = s.rows;
    }
    std::string compared;
    for (const std::string& c : v.compare) compared += (compared.empty() ? "" : ", ") + c;
    ImGui::Text(
        "%s scaling, %zu tensors, %zu monitored steps (every %lld), %zu alerts%s%s",
        v.recipe.c_str(), v.tensors.size(), v.steps.size(),
        static_cast<long long>(cfg.fp8_monitor.every > 0 ? cfg.fp8_monitor.every : v.step_stride),
        v.alerts.size(), compared.empty() ? "" : "; compared with ", compared.c_str());

    // The tensor chooser: alerted tensors say how many.
    auto label = [&](int t) {
        std::string l = v.tensors[static_cast<size_t>(t)];
        if (const int n = v.alerts_of[static_cast<size_t>(t)]; n > 0)
            l += "  (" + std::to_string(n) + (n == 1 ? " alert)" : " alerts)");
        return l;
    };
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 22);
    if (ImGui::BeginCombo("tensor", label(s.tensor).c_str())) {
        for (int t = 0; t < static_cast<int>(v.tensors.size()); t++)
            if (ImGui::Selectable(label(t).c_str(), t == s.tensor)) s.tensor = t;
        ImGui::EndCombo();
    }
    if (d.rects) d.rects->mark("fp8_tensor");
    ImGui::SameLine();
    ImGui::TextDisabled("click a heatmap cell or an alert to choose its tensor");

    // Histories of the chosen tensor, alerts as markers.
    const float avail = ImGui::GetContentRegionAvail().y;
    const float plot_h = std::max(150.0f, avail * 0.30f);
    const float w = ImGui::GetContentRegionAvail().x;
    std::vector<plot::VMarker> marks;
    for (const Fp8AlertRow& a : v.alerts)
        if (a.tensor == s.tensor)
            marks.push_back(
                {static_cast<double>(a.row.step), alert_kinds(a.row.alerts), plot::kRed});
    const ImU32 colours[] = {plot::kBlue, plot::kOrange, plot::kGreen, plot::kPurple};
    plot::LinePlot amax;
    amax.title = "amax (max |x|) of " + v.tensors[static_cast<size_t>(s.tensor)];
    amax.x_label = "step";
    amax.y_label = "amax";
    amax.markers = marks;
    plot::LinePlot scale;
    scale.title = v.recipe == "delayed"
                      ? "scale (x is cast as fp8(x * scale); step 1's initial 1 not drawn)"
                      : "scale (x is cast as fp8(x * scale))";
    scale.x_label = "step";
    scale.y_label = "scale";
    scale.markers = marks;
    if (!s.histories.empty()) {
        const Fp8History& h = s.histories.front();
        amax.series.push_back({"amax", h.step.data(), h.amax.data(),
                               static_cast<int>(h.step.size()), plot::kBlue, true});
        for (size_t k = 0; k < s.histories.size(); k++) {
            const Fp8History& r = s.histories[k];
            if (r.recipe == "block" && k > 0) continue;  // tiles have their own scales
            std::string name = r.recipe + (k == 0 ? " (the run's)" : " (from this step's amax)");
            scale.series.push_back({name, r.step.data(), r.scale.data(),
                                    static_cast<int>(r.step.size()), colours[k % 4], true});
        }
    }
    s.amax_view.log_y = true;
    s.scale_view.log_y = true;
    plot::draw_lines("fp8_amax", amax, s.amax_view, ImVec2(w * 0.5f - 4, plot_h));
    if (d.rects) d.rects->mark("fp8_amax");
    ImGui::SameLine();
    plot::draw_lines("fp8_scale", scale, s.scale_view, ImVec2(-1, plot_h));
    if (d.rects) d.rects->mark("fp8_scale");

    // Tensors × steps: saturated and underflowed fractions.
    const float heat_h = std::max(150.0f, avail * 0.36f);
    const plot::Heatmap sat = fraction_map(v, v.saturated, "saturated (|x * scale| > fp8 max)",
                                           cfg.fp8_monitor.saturation_max);
    const plot::Heatmap under =
        fraction_map(v, v.underflow, "underflowed (x != 0 cast to 0), of the nonzero", 0);
    const int sel = s.step_col >= 0 ? s.tensor : -1;
    const plot::HeatmapHit hs =
        plot::draw_heatmap("fp8_saturation", sat, ImVec2(w * 0.5f - 4, heat_h), sel, s.step_col);
    if (d.rects) d.rects->mark("fp8_saturation");
    ImGui::SameLine();
    const plot::HeatmapHit hu =
        plot::draw_heatmap("fp8_underflow", under, ImVec2(-1, heat_h), sel, s.step_col);
    if (d.rects) d.rects->mark("fp8_underflow");
    for (const plot::HeatmapHit& h : {hs, hu})
        if (h.clicked) {
            s.tensor = h.row;
            s.step_col = h.col;
        }
    const plot::HeatmapHit& hov = hs.row >= 0 ? hs : hu;
    const int hr = hov.row >= 0 ? hov.row : sel, hc = hov.row >= 0 ? hov.col : s.step_col;
    if (hr >= 0 && hc >= 0)
        ImGui::Text("%s, step %lld: saturated %s, underflowed %s",
                    v.tensors[static_cast<size_t>(hr)].c_str(),
                    static_cast<long long>(v.steps[static_cast<size_t>(hc)]),
                    percent(v.saturated[static_cast<size_t>(hr)][static_cast<size_t>(hc)]).c_str(),
                    percent(v.underflow[static_cast<size_t>(hr)][static_cast<size_t>(hc)]).c_str());
    else
        ImGui::TextDisabled("hover a cell for its values; click to choose its tensor");

    // The alerts, with their evidence.
    ImGui::Text("Alerts (fp8_monitor: scale_jump %g, saturation_max %g, sqnr_min_db %g)",
                cfg.fp8_monitor.scale_jump, cfg.fp8_monitor.saturation_max,
                cfg.fp8_monitor.sqnr_min_db);
    if (v.alerts.empty()) {
        empty_state("no FP8 alert in this run");
        return;
    }
    const float line = ImGui::GetTextLineHeightWithSpacing();
    const float list_h = std::max(line * 4, ImGui::GetContentRegionAvail().y - line * 6.5f);
    if (ImGui::BeginTable("fp8_alerts", 7,
                          ImGuiTableFlags_RowBg | ImGuiTableFlags_Borders | ImGuiTableFlags_ScrollY,
                          ImVec2(0, list_h))) {
        const float f = ImGui::GetFontSize();
        ImGui::TableSetupScrollFreeze(0, 1);
        ImGui::TableSetupColumn("step", ImGuiTableColumnFlags_WidthFixed, f * 3.5f);
        ImGui::TableSetupColumn("tensor", ImGuiTableColumnFlags_WidthFixed, f * 12);
        ImGui::TableSetupColumn("fired", ImGuiTableColumnFlags_WidthFixed, f * 10);
        ImGui::TableSetupColumn("saturated", ImGuiTableColumnFlags_WidthFixed, f * 5);
        ImGui::TableSetupColumn("scale change", ImGuiTableColumnFlags_WidthFixed, f * 6);
        ImGui::TableSetupColumn("SQNR dB", ImGuiTableColumnFlags_WidthFixed, f * 4.5f);
        ImGui::TableSetupColumn("amax, scale");
        ImGui::TableHeadersRow();
        ImGuiListClipper clip;
        clip.Begin(static_cast<int>(v.alerts.size()));
        while (clip.Step())
            for (int i = clip.DisplayStart; i < clip.DisplayEnd; i++) {
                const Fp8AlertRow& a = v.alerts[static_cast<size_t>(i)];
                const Fp8Stat& r = a.row;
                ImGui::TableNextRow();
                ImGui::TableNextColumn();
                ImGui::PushID(i);
                if (ImGui::Selectable(std::to_string(r.step).c_str(), s.alert == i,
                                      ImGuiSelectableFlags_SpanAllColumns)) {
                    s.alert = i;
                    s.tensor = a.tensor;
                    s.step_col = static_cast<int>(
                        std::lower_bound(v.steps.begin(), v.steps.end(), r.step) - v.steps.begin());
                }
                ImGui::PopID();
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(r.tensor.c_str());
                ImGui::TableNextColumn();
                ImGui::TextColored(ImVec4(1, 0.45f, 0.4f, 1), "%s", alert_kinds(r.alerts).c_str());
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(percent(r.saturated).c_str());
                ImGui::TableNextColumn();
                if (std::isfinite(r.scale_ratio))
                    ImGui::Text("x%.3g", r.scale_ratio);
                else
                    ImGui::TextDisabled("-");
                ImGui::TableNextColumn();
                ImGui::Text("%.3g", r.sqnr_db);
                ImGui::TableNextColumn();
                ImGui::Text("%.4g, %.4g", r.amax, r.scale);
            }
        ImGui::EndTable();
    }
    if (d.rects) d.rects->mark("fp8_alerts");
    if (s.alert >= 0 && s.alert < static_cast<int>(v.alerts.size())) {
        const Fp8AlertRow& a = v.alerts[static_cast<size_t>(s.alert)];
        ImGui::TextWrapped(
            "%s", a.message.empty() ? "(no event text in this snapshot)" : a.message.c_str());
    } else {
        ImGui::TextDisabled("click an alert for its evidence");
    }
}

}  // namespace

void draw_fp8_panel(const RunData& d, Fp8PanelState& s) {
    // Three collapsible sections. When both the FP8 rows and the spike evidence are there, each
    // gets a scrolling child of its own (the FP8 half 55% of the height while the spike section
    // is open), so neither pushes the other off the panel.
    int faults = 0;
    for (const RunEvent& e : d.snap.events)
        faults += e.kind == EventKind::fault || e.kind == EventKind::failure;
    const float line = ImGui::GetFrameHeightWithSpacing();
    const float faults_h = line * static_cast<float>(2 + std::min(faults, 3));
    const bool fp8_data = !d.snap.fp8.empty();
    const bool spike_data = !d.snap.values.empty();
    const bool spikes_open = ImGui::GetStateStorage()->GetInt(ImGui::GetID("Loss spikes"), 1) != 0;
    const float avail = ImGui::GetContentRegionAvail().y - faults_h;
    if (ImGui::CollapsingHeader("FP8 drift", ImGuiTreeNodeFlags_DefaultOpen)) {
        if (fp8_data) {
            const float h = !spikes_open ? avail - 2 * line
                            : spike_data ? avail * 0.55f
                                         : avail - 4 * line;
            ImGui::BeginChild("fp8_half", ImVec2(-1, std::max(h, 8 * line)));
            draw_fp8_half(d, s);
            ImGui::EndChild();
        } else {
            draw_fp8_half(d, s);
        }
    }
    if (d.rects) d.rects->mark("fp8_header");
    if (ImGui::CollapsingHeader("Loss spikes", ImGuiTreeNodeFlags_DefaultOpen)) {
        if (spike_data) {
            const float h = ImGui::GetContentRegionAvail().y - faults_h;
            ImGui::BeginChild("spike_half", ImVec2(-1, std::max(h, 8 * line)));
            draw_spike_section(d, s.spikes);
            ImGui::EndChild();
        } else {
            draw_spike_section(d, s.spikes);
        }
    }
    if (d.rects) d.rects->mark("spike_header");
    if (ImGui::CollapsingHeader("Faults and failures", ImGuiTreeNodeFlags_DefaultOpen)) {
        int n = 0;
        for (const RunEvent& e : d.snap.events)
            if (e.kind == EventKind::fault || e.kind == EventKind::failure) {
                ImGui::BulletText("step %lld, %s: %s", static_cast<long long>(e.step),
                                  event_kind_name(e.kind), e.message.c_str());
                n++;
            }
        if (n == 0) empty_state("no faults or failures in this run");
    }
}

}  // namespace px::gui
