// Events: resumes, re-runs, checkpoints, faults and failures, in the order they happened.
#include "app/gui/panels.h"

#include <imgui.h>

namespace px::gui {

void draw_events_panel(const RunData& d, EventsPanelState&) {
    const std::vector<RunEvent>& ev = d.snap.events;
    ImGui::Text("%s: %s, %zu events", d.source.c_str(), run_state_name(d.snap.state), ev.size());
    if (!d.snap.error.empty())
        ImGui::TextColored(ImVec4(1, 0.45f, 0.4f, 1), "%s", d.snap.error.c_str());
    if (ev.empty()) {
        empty_state("no events: nothing was resumed, re-run, checkpointed or faulted in this run");
        return;
    }
    if (ImGui::BeginTable(
            "events", 3,
            ImGuiTableFlags_RowBg | ImGuiTableFlags_Borders | ImGuiTableFlags_ScrollY)) {
        ImGui::TableSetupColumn("step", ImGuiTableColumnFlags_WidthFixed, ImGui::GetFontSize() * 5);
        ImGui::TableSetupColumn("kind", ImGuiTableColumnFlags_WidthFixed, ImGui::GetFontSize() * 7);
        ImGui::TableSetupColumn("what happened");
        ImGui::TableHeadersRow();
        ImGuiListClipper clip;
        clip.Begin(static_cast<int>(ev.size()));
        while (clip.Step())
            for (int i = clip.DisplayStart; i < clip.DisplayEnd; i++) {
                const RunEvent& e = ev[static_cast<size_t>(i)];
                ImGui::TableNextRow();
                ImGui::TableNextColumn();
                ImGui::Text("%lld", static_cast<long long>(e.step));
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(event_kind_name(e.kind));
                ImGui::TableNextColumn();
                ImGui::TextWrapped("%s", e.message.c_str());
            }
        ImGui::EndTable();
    }
}

}  // namespace px::gui
