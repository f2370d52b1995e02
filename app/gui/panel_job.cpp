// The job bar: the config editor (checked as typed: every bad key's message beside it, in the
// library's words), start / pause / single step / stop / restart, and opening a finished run's
// file. It only records what
// was asked (JobPanelState::requested); the workbench acts on it after the frame.
#include "app/gui/panels.h"

#include <imgui.h>
#include <imgui_stdlib.h>

namespace px::gui {

void UiRects::mark(const std::string& name) {
    const ImVec2 a = ImGui::GetItemRectMin(), b = ImGui::GetItemRectMax();
    rects[name] = ImVec4(a.x, a.y, b.x - a.x, b.y - a.y);
}

void empty_state(const char* sentence) {
    ImGui::TextDisabled("%s", sentence);
}

void draw_job_panel(const RunData& d, JobPanelState& s) {
    const JobStatus st = s.job ? s.job->status() : JobStatus::none;
    ImGui::Text("Job: %s", job_status_name(st));
    if (d.snap.steps_total > 0) {
        ImGui::SameLine();
        ImGui::Text("  step %lld / %lld", static_cast<long long>(d.snap.steps_done),
                    static_cast<long long>(d.snap.steps_total));
    }
    const bool live = st == JobStatus::running || st == JobStatus::starting;
    const bool paused = st == JobStatus::paused;
    auto button = [&](const char* label, const char* name, JobAction a) {
        if (ImGui::Button(label)) s.requested = a;
        if (d.rects) d.rects->mark(name);
    };
    if (!live && !paused)
        button("Start", "start", JobAction::start);
    else if (live)
        button("Pause", "pause", JobAction::pause);
    else
        button("Resume", "resume", JobAction::resume);
    ImGui::SameLine();
    button("Step", "step", JobAction::step);
    ImGui::SameLine();
    button("Stop", "stop", JobAction::stop);
    ImGui::SameLine();
    button("Restart", "restart", JobAction::restart);
    if (!s.message.empty()) ImGui::TextWrapped("%s", s.message.c_str());
    if (!s.editor.general_error().empty()) {
        ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 110, 100, 255));
        ImGui::TextWrapped("%s", s.editor.general_error().c_str());
        ImGui::PopStyleColor();
    }
    ImGui::Separator();
    ImGui::TextDisabled("config (%s); edits apply on Start / Restart",
                        s.editor.base().source_name.c_str());
    if (const int n = s.editor.error_count(); n > 0) {
        ImGui::TextColored(ImVec4(1.0f, 0.45f, 0.4f, 1.0f), "%d %s to fix before Start", n,
                           n == 1 ? "problem" : "problems");
        if (d.rects) d.rects->mark("editor_problems");
    }
    if (ImGui::BeginTable("editor", 3, ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_RowBg)) {
        ImGui::TableSetupColumn("key", ImGuiTableColumnFlags_WidthFixed,
                                ImGui::GetFontSize() * 12.0f);
        ImGui::TableSetupColumn("value", ImGuiTableColumnFlags_WidthFixed,
                                ImGui::GetFontSize() * 6.0f);
        ImGui::TableSetupColumn("error", ImGuiTableColumnFlags_WidthStretch);
        bool edited = false;
        for (EditorField& f : s.editor.fields()) {
            ImGui::TableNextRow();
            ImGui::TableNextColumn();
            ImGui::AlignTextToFramePadding();
            if (f.edited())
                ImGui::TextColored(ImVec4(1.0f, 0.85f, 0.4f, 1.0f), "%s", f.key.c_str());
            else
                ImGui::TextUnformatted(f.key.c_str());
            ImGui::TableNextColumn();
            ImGui::SetNextItemWidth(-1);
            ImGui::PushID(f.key.c_str());
            edited |= ImGui::InputText("##v", &f.text);
            ImGui::PopID();
            if (d.rects) d.rects->mark("field:" + f.key);
            ImGui::TableNextColumn();
            if (!f.error.empty()) {
                ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 110, 100, 255));
                ImGui::TextWrapped("%s", f.error.c_str());
                ImGui::PopStyleColor();
                if (d.rects) d.rects->mark("error:" + f.key);
            }
        }
        ImGui::EndTable();
        // Checked as typed: every bad key shows its message, and a fixed one loses it at once.
        if (edited) s.editor.build();
    }
    ImGui::Separator();
    ImGui::TextUnformatted("Open a run.h5, a validate.json or a golden trace (.h5):");
    ImGui::SetNextItemWidth(-ImGui::GetFontSize() * 4.5f);
    ImGui::InputText("##open", &s.open_path);
    if (d.rects) d.rects->mark("field:open");
    ImGui::SameLine();
    if (ImGui::Button("Open")) s.requested = JobAction::open;
    if (d.rects) d.rects->mark("open");
}

}  // namespace px::gui
