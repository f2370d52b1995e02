// The job bar: the config editor (checked as typed: every bad key's message beside it, in the
// library's words; the llama block's keys folded into one group, greyed while model.arch is
// not "llama"), start / pause / single step / stop / restart, and opening a finished run's
// file. It only records what was asked (JobPanelState::requested); the workbench acts on it
// after the frame.
#include "app/gui/panels.h"

#include <imgui.h>
#include <imgui_stdlib.h>

#include <algorithm>

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
    // The llama block's keys fold into one group, unfolded while model.arch is "llama" and shown
    // there by their names within the section (kv_heads); under another arch they stay editable,
    // greyed: that job ignores them.
    const EditorField* arch = s.editor.field("model.arch");
    const std::string arch_text = arch ? arch->text : std::string();
    if (arch_text != s.arch_seen) {
        s.llama_open = arch_text == "llama";
        s.arch_seen = arch_text;
    }
    for (const EditorField& f : s.editor.fields())  // a message is never folded away
        if (f.llama_only && !f.error.empty()) s.llama_open = true;
    const float indent = ImGui::GetFontSize() * 0.6f;
    auto label = [](const EditorField& f) {
        return f.llama_only ? f.key.substr(f.key.find('.') + 1) : f.key;
    };
    float key_w = ImGui::GetFontSize() * 12.0f;  // the widest key shown
    for (const EditorField& f : s.editor.fields())
        if (!f.llama_only || s.llama_open)
            key_w = std::max(key_w, ImGui::CalcTextSize(label(f).c_str()).x +
                                        (f.llama_only ? indent : 0) + ImGui::GetFontSize());
    if (ImGui::BeginTable("editor", 3, ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_RowBg)) {
        ImGui::TableSetupColumn("key", ImGuiTableColumnFlags_WidthFixed, key_w);
        ImGui::TableSetupColumn("value", ImGuiTableColumnFlags_WidthFixed,
                                ImGui::GetFontSize() * 6.0f);
        ImGui::TableSetupColumn("error", ImGuiTableColumnFlags_WidthStretch);
        bool edited = false;
        bool group_drawn = false;
        const ImVec4 grey = ImGui::GetStyleColorVec4(ImGuiCol_TextDisabled);
        for (EditorField& f : s.editor.fields()) {
            if (f.llama_only && !group_drawn) {
                group_drawn = true;
                ImGui::TableNextRow();
                ImGui::TableNextColumn();
                ImGui::SetNextItemOpen(s.llama_open, ImGuiCond_Always);
                const bool used = arch_text == "llama";
                if (!used) ImGui::PushStyleColor(ImGuiCol_Text, grey);
                s.llama_open = ImGui::TreeNodeEx(
                    "llama block (model.*)##llama",
                    ImGuiTreeNodeFlags_SpanFullWidth | ImGuiTreeNodeFlags_NoTreePushOnOpen);
                if (d.rects) d.rects->mark("editor_llama");
                ImGui::TableNextColumn();
                ImGui::TableNextColumn();
                const std::string note =
                    used ? "(model.arch = llama)" : "(ignored by " + arch_text + ")";
                ImGui::TextUnformatted(note.c_str());
                if (!used) ImGui::PopStyleColor();
            }
            if (f.llama_only && !s.llama_open) continue;
            const bool ignored = s.editor.ignored(f);
            ImGui::TableNextRow();
            ImGui::TableNextColumn();
            ImGui::AlignTextToFramePadding();
            if (f.llama_only) ImGui::Indent(indent);
            const std::string name = label(f);
            if (ignored)
                ImGui::TextDisabled("%s", name.c_str());
            else if (f.edited())
                ImGui::TextColored(ImVec4(1.0f, 0.85f, 0.4f, 1.0f), "%s", name.c_str());
            else
                ImGui::TextUnformatted(name.c_str());
            if (f.llama_only) ImGui::Unindent(indent);
            if (!f.doc.empty() && ImGui::IsItemHovered()) {
                ImGui::BeginTooltip();
                ImGui::PushTextWrapPos(ImGui::GetFontSize() * 28.0f);
                ImGui::TextUnformatted(f.key.c_str());
                if (ignored) ImGui::TextDisabled("ignored while model.arch is not \"llama\"");
                ImGui::TextUnformatted(f.doc.c_str());
                ImGui::PopTextWrapPos();
                ImGui::EndTooltip();
            }
            ImGui::TableNextColumn();
            ImGui::SetNextItemWidth(-1);
            ImGui::PushID(f.key.c_str());
            if (ignored) ImGui::PushStyleColor(ImGuiCol_Text, grey);
            edited |= ImGui::InputText("##v", &f.text);
            if (ignored) ImGui::PopStyleColor();
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
    ImGui::TextWrapped(
        "Open a run.h5, a validate.json, a compare report (parallax compare --json) or a golden "
        "trace (.h5):");
    ImGui::SetNextItemWidth(-ImGui::GetFontSize() * 4.5f);
    ImGui::InputText("##open", &s.open_path);
    if (d.rects) d.rects->mark("field:open");
    ImGui::SameLine();
    if (ImGui::Button("Open")) s.requested = JobAction::open;
    if (d.rects) d.rects->mark("open");
}

}  // namespace px::gui
