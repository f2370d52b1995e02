// Pipeline timeline: the last measured step of every rank (CommTrace: each microbatch's forward
// and backward timed around the stage's work, the waits in its receives, its sends, its dp,
// tp, cp and ep collectives; idle is what no bar covers) beside the schedule's plan in unit time
// (check_schedule), with the bubble measured, simulated and by formula. pp = 1 is one stage:
// its forwards, backwards and collectives, with no bubble to speak of.
#include "app/gui/panels.h"

#include "core/base/error.h"
#include "core/parallel/mesh.h"

#include <imgui.h>

#include <algorithm>

namespace px::gui {

namespace {

ImU32 bar_colour(TimelineBar::Kind k) {
    switch (k) {
        case TimelineBar::forward:
            return plot::kBlue;
        case TimelineBar::backward:
            return plot::kOrange;
        case TimelineBar::weight:
            return plot::kGreen;
        case TimelineBar::recv_wait:
            return IM_COL32(90, 90, 100, 255);
        case TimelineBar::send:
            return plot::kYellow;
        case TimelineBar::collective:
            return plot::kPurple;
    }
    return plot::kGrey;
}

void legend() {
    const std::pair<TimelineBar::Kind, const char*> items[] = {
        {TimelineBar::forward, "forward"},
        {TimelineBar::backward, "backward (B: input gradient, under zb-h1 and zbv)"},
        {TimelineBar::weight, "W: weight gradients, deferred (zb-h1, zbv)"},
        {TimelineBar::recv_wait, "waiting in a receive"},
        {TimelineBar::send, "send posted"},
        {TimelineBar::collective, "collective of dp, tp, cp or ep (thin band)"}};
    // Idle: the gaps, in the plot's background.
    for (const auto& [k, name] : items) {
        const ImVec2 p = ImGui::GetCursorScreenPos();
        const float h = ImGui::GetTextLineHeight();
        ImGui::GetWindowDrawList()->AddRectFilled(ImVec2(p.x, p.y + 2),
                                                  ImVec2(p.x + h, p.y + h - 2), bar_colour(k));
        ImGui::Dummy(ImVec2(h + 2, h));
        ImGui::SameLine();
        ImGui::TextUnformatted(name);
        ImGui::SameLine(0, 18);
    }
    ImGui::TextDisabled("idle: no bar");
}

}  // namespace

void draw_pipeline_panel(const RunData& d, PipelinePanelState& s) {
    Layout layout;
    try {
        layout = make_layout(d.config);
    } catch (const Error& e) {
        empty_state(e.what());
        return;
    }
    const Mesh mesh(layout, Mesh::Validated{});
    const Schedule plan = mesh.schedule();
    const SimResult sim = check_schedule(plan, kUnitFBW);
    ImGui::Text("%s, pp = %d, %d microbatches%s", schedule_name(layout.schedule), layout.pp,
                layout.microbatches,
                layout.virtual_stages > 1
                    ? (", v = " + std::to_string(layout.virtual_stages)).c_str()
                    : "");
    ImGui::Text(
        "idle per work by the paper's formula: %.1f%%   planned (F = B = W = 1 slot): %.1f%% "
        "(%.1f%% of the makespan)",
        100 * bubble_rate_formula(schedule_name(layout.schedule), layout.pp, layout.microbatches,
                                  layout.virtual_stages),
        100 * sim.bubble_rate, 100 * sim.bubble);
    legend();
    const float h = ImGui::GetContentRegionAvail().y;
    // Measured.
    Timeline tl;
    if (!d.trace)
        tl.problem = d.source == "live job" ? "no job running: press Start to measure a step"
                                            : "an opened run file holds no timeline";
    else
        tl = measured_timeline(d.trace->mesh(), d.trace->last_steps(),
                               s.first_replica ? TimelineRanks::first_replica : TimelineRanks::all);
    if (tl.problem.empty()) {
        ImGui::Text(
            "measured, step %lld: %.2f ms to the last backward; bubble measured %.1f%%%s",
            static_cast<long long>(tl.step), 1e3 * tl.makespan, 100 * tl.bubble,
            layout.pp == 1 ? " (pp = 1: one stage; the gaps are the step's other work)" : "");
        ImGui::SameLine();
        ImGui::Checkbox("dp 0, tp 0 only", &s.first_replica);
        std::vector<plot::GanttBar> bars;
        double end = tl.makespan;
        for (const TimelineBar& b : tl.bars) {
            bars.push_back({b.lane, 1e3 * b.t0, 1e3 * b.t1, bar_colour(b.kind), b.label});
            if (b.kind == TimelineBar::collective) bars.back().height = 0.3f;  // under the compute
            end = std::max(end, b.t1);
        }
        plot::draw_gantt("measured", tl.lanes, bars, 0, 1e3 * end,
                         "milliseconds since the first rank's step began", ImVec2(-1, h * 0.5f));
        if (d.rects) d.rects->mark("measured_timeline");
    } else {
        ImGui::TextUnformatted("measured:");
        ImGui::SameLine();
        empty_state(tl.problem.c_str());
    }
    // The plan, in unit slots.
    ImGui::Text("plan (F, B and W one slot each, a whole backward two): %d slots", sim.makespan);
    std::vector<std::string> lanes;
    std::vector<plot::GanttBar> bars;
    for (int p = 0; p < plan.pp; p++) {
        lanes.push_back("pp" + std::to_string(p));
        const std::vector<Action>& acts = plan.ranks[static_cast<size_t>(p)];
        for (size_t i = 0; i < acts.size(); i++) {
            const Action& a = acts[i];
            const int s0 = sim.start.empty() ? -1 : sim.start[static_cast<size_t>(p)][i];
            if (!a.is_compute() || s0 < 0) continue;
            const ImU32 c = a.kind == Action::forward           ? plot::kBlue
                            : a.kind == Action::backward_weight ? plot::kGreen
                                                                : plot::kOrange;
            bars.push_back({p, static_cast<double>(s0),
                            static_cast<double>(s0 + slots_of(a, kUnitFBW)), c,
                            compute_label(a, plan.virtual_stages)});
        }
    }
    plot::draw_gantt("plan", lanes, bars, 0, std::max(1, sim.makespan), "slot", ImVec2(-1, -1),
                     true);
}

}  // namespace px::gui
