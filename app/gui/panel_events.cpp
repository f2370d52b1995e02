// Events: resumes, re-runs, checkpoints, faults, failures, alerts and spikes, in the order they
// happened; a run of one kind at one step is one line ("step 31  rerun ×12", fold_events), so a
// step re-run again and again does not flood the list.
#include "app/gui/panels.h"

#include <imgui.h>

namespace px::gui {

void draw_events_panel(const RunData& d, EventsPanelState&) {
    const std::vector<RunEvent>& ev = d.snap.events;
    const std::vector<EventLine> lines = fold_events(ev);
    ImGui::Text("%s: %s, %zu events", d.source.c_str(), run_state_name(d.snap.state), ev.size());
    if (lines.size() < ev.size()) {
        ImGui::SameLine();
        ImGui::TextDisabled("(%zu lines: repeats at one step folded)", lines.size());
    }
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
        clip.Begin(static_cast<int>(lines.size()));
        while (clip.Step())
            for (int i = clip.DisplayStart; i < clip.DisplayEnd; i++) {
                const EventLine& e = lines[static_cast<size_t>(i)];
                ImGui::TableNextRow();
                ImGui::TableNextColumn();
                ImGui::Text("%lld", static_cast<long long>(e.step));
                ImGui::TableNextColumn();
                if (e.count > 1)
                    ImGui::Text("%s \u00d7%d", event_kind_name(e.kind), e.count);
                else
                    ImGui::TextUnformatted(event_kind_name(e.kind));
                ImGui::TableNextColumn();
                if (e.count > 1 && e.last != e.first)
                    ImGui::TextWrapped("%s (%d times; the last: %s)", e.first.c_str(), e.count,
                                       e.last.c_str());
                else if (e.count > 1)
                    ImGui::TextWrapped("%s (%d times)", e.first.c_str(), e.count);
                else
                    ImGui::TextWrapped("%s", e.first.c_str());
            }
        ImGui::EndTable();
    }
}

}  // namespace px::gui
