// Schedule explorer (teaching view): pick pp, microbatches and the schedule, and step through
// the plan the runtime executes (make_schedule), simulated in unit time (check_schedule), with
// its bubble beside the formula.
#include "app/gui/panels.h"

#include <imgui.h>

#include <algorithm>

namespace px::gui {

void draw_schedule_panel(const RunData&, SchedulePanelState& s) {
    ScheduleModel& m = s.model;
    constexpr int n = static_cast<int>(std::size(kScheduleKinds));
    const char* kinds[n];
    int kind = 1;
    for (int i = 0; i < n; i++) {
        kinds[i] = schedule_name(kScheduleKinds[i]);
        if (m.kind == kinds[i]) kind = i;
    }
    bool changed = !s.made;
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 8);
    if (ImGui::Combo("schedule", &kind, kinds, n)) {
        m.kind = kinds[kind];
        const int chunks = chunks_required(kScheduleKinds[kind]);
        m.virtual_stages = chunks > 0 ? chunks : std::max(m.virtual_stages, 2);
        changed = true;
    }
    const float fw = ImGui::GetFontSize() * 5.5f;
    auto pick = [&](const char* label, int* v, int lo, int hi) {
        ImGui::SameLine();
        ImGui::SetNextItemWidth(fw);
        if (ImGui::InputInt(label, v)) changed = true;
        *v = std::clamp(*v, lo, hi);
    };
    pick("pp", &m.pp, 1, 16);
    pick("microbatches", &m.microbatches, 1, 64);
    pick("v (chunks)", &m.virtual_stages, 1, 8);
    if (changed) {
        m.make();
        s.made = true;
        s.slot = -1;
    }
    if (!m.error.empty()) {
        ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 110, 100, 255));
        ImGui::TextWrapped("%s", m.error.c_str());
        ImGui::PopStyleColor();
        return;
    }
    const SimResult& sim = m.sim;
    ImGui::Text(
        "F = B = W = 1 slot: %d slots; idle per work %.1f%% simulated, %.1f%% by the paper's "
        "formula; peak forwards in flight on rank 0: %d",
        sim.makespan, 100 * sim.bubble_rate,
        100 * bubble_rate_formula(m.kind, m.pp, m.microbatches, m.virtual_stages),
        sim.peak_in_flight.empty() ? 0 : sim.peak_in_flight[0]);
    if (!sim.ok()) ImGui::TextColored(ImVec4(1, 0.45f, 0.4f, 1), "%s", sim.problem.c_str());
    int slot = s.slot < 0 ? sim.makespan : s.slot;
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 20);
    if (ImGui::SliderInt("step through the plan (slot)", &slot, 0, sim.makespan)) s.slot = slot;
    ImGui::SameLine();
    if (ImGui::Button("<")) s.slot = std::max(0, slot - 1);
    ImGui::SameLine();
    if (ImGui::Button(">")) s.slot = std::min(sim.makespan, slot + 1);
    std::vector<std::string> lanes;
    std::vector<plot::GanttBar> bars;
    std::string now;
    for (int p = 0; p < m.schedule.pp; p++) {
        lanes.push_back("pp rank " + std::to_string(p));
        const std::vector<Action>& acts = m.schedule.ranks[static_cast<size_t>(p)];
        for (size_t i = 0; i < acts.size(); i++) {
            const Action& a = acts[i];
            const int s0 = sim.start[static_cast<size_t>(p)][i];
            if (!a.is_compute() || s0 < 0) continue;
            const bool done = s0 < slot;
            ImU32 c = a.kind == Action::forward           ? plot::kBlue
                      : a.kind == Action::backward_weight ? plot::kGreen
                                                          : plot::kOrange;
            if (!done) c = (c & 0x00FFFFFF) | 0x40000000;
            const std::string label = compute_label(a, m.virtual_stages);
            bars.push_back({p, static_cast<double>(s0),
                            static_cast<double>(s0 + slots_of(a, kUnitFBW)), c, label});
            if (s0 == slot - 1) now += "  rank " + std::to_string(p) + ": " + action_text(a);
        }
    }
    ImGui::Text("slot %d:%s", slot, now.empty() ? "  (idle everywhere)" : now.c_str());
    plot::draw_gantt("schedule", lanes, bars, 0, std::max(1, sim.makespan),
                     "slot (one forward or backward each)", ImVec2(-1, -1), true);
}

}  // namespace px::gui
