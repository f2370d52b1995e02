// The spike half of the FP8-and-spikes panel (core/train/spikes.h): the per-layer gradient norms
// (or another kind of evidence) against step with the spikes marked, the spike list, and a
// chosen spike's evidence table. Data: gui/spike_model.h. Without [spikes] the run recorded no
// evidence, and the section says so in one line.
#include "app/gui/panels.h"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace px::gui {

namespace {

constexpr const char* kKinds[] = {"grad_norm", "update_ratio", "adam_eps_ratio",
                                  "attn_logit_max"};
constexpr const char* kKindLabels[] = {"gradient norm", "update ratio |dW|/|W|",
                                       "Adam eps / sqrt(v)", "max attention logit"};

ImU32 group_colour(size_t i, size_t n) {
    const float h = n > 1 ? 0.66f * static_cast<float>(i) / static_cast<float>(n - 1) : 0.0f;
    float r, g, b;
    ImGui::ColorConvertHSVtoRGB(h, 0.65f, 0.95f, r, g, b);
    return IM_COL32(static_cast<int>(r * 255), static_cast<int>(g * 255),
                    static_cast<int>(b * 255), 255);
}

std::string num(double x) {
    if (!std::isfinite(x)) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g", x);
    return buf;
}

}  // namespace

void draw_spike_section(const RunData& d, SpikeSectionState& s) {
    const SpikeModel m = spike_model(d.snap);
    if (m.empty() && m.spikes.empty()) {
        empty_state(d.config.spikes.action == "off"
                        ? "no spike evidence: spikes.action is \"off\" (set it to log, skip, clip "
                          "or rollback to record per-layer evidence and catch spikes)"
                        : "no step has finished yet");
        return;
    }
    ImGui::SetNextItemWidth(200);
    ImGui::Combo("evidence", &s.kind, kKindLabels, IM_ARRAYSIZE(kKindLabels));
    ImGui::SameLine();
    ImGui::Checkbox("log y", &s.view.log_y);
    ImGui::SameLine();
    ImGui::TextDisabled("%zu spike%s; window %lld, z > %.3g", m.spikes.size(),
                        m.spikes.size() == 1 ? "" : "s",
                        static_cast<long long>(d.config.spikes.window), d.config.spikes.z_threshold);
    plot::LinePlot p;
    p.title = std::string(kKindLabels[s.kind]) + " per layer";
    p.x_label = "step";
    p.y_label = kKindLabels[s.kind];
    const auto& per_group = m.series.at(kKinds[s.kind]);
    const int n = static_cast<int>(m.steps.size());
    for (size_t g = 0; g < m.groups.size(); g++) {
        bool any = false;
        for (double v : per_group[g]) any = any || std::isfinite(v);
        if (any)
            p.series.push_back({m.groups[g], m.steps.data(), per_group[g].data(), n,
                                group_colour(g, m.groups.size())});
    }
    // Each spike's own values as its first run saw them (a rollback replaced that step's rows).
    std::vector<std::vector<double>> sx(m.groups.size()), sy(m.groups.size());
    for (const RunEvent& e : m.spikes) {
        p.markers.push_back({static_cast<double>(e.step), "spike", plot::kRed});
        const std::vector<double> v = spike_values(m, e, kKinds[s.kind]);
        for (size_t g = 0; g < m.groups.size(); g++)
            if (std::isfinite(v[g])) {
                sx[g].push_back(static_cast<double>(e.step));
                sy[g].push_back(v[g]);
            }
    }
    for (size_t g = 0; g < m.groups.size(); g++)
        if (!sx[g].empty()) {
            plot::Series pts{m.groups[g] + " at the spike", sx[g].data(), sy[g].data(),
                             static_cast<int>(sx[g].size()), group_colour(g, m.groups.size()), true};
            p.series.push_back(pts);
        }
    const float h = ImGui::GetContentRegionAvail().y * 0.45f;
    const int clicked = plot::draw_lines("spike_evidence", p, s.view, ImVec2(-1, std::max(h, 120.0f)));
    if (d.rects) d.rects->mark("spike_plot");
    if (clicked >= 0) s.selected = clicked;
    if (m.spikes.empty()) {
        empty_state("no spike in this run so far: every step's loss and gradient norm stayed "
                    "under the threshold");
        return;
    }
    // The spikes, a few lines at most (the list scrolls), so the chosen one's evidence shows.
    const float row_h = ImGui::GetTextLineHeightWithSpacing();
    ImGui::BeginChild("spike_list",
                      ImVec2(-1, row_h * static_cast<float>(std::min<size_t>(m.spikes.size(), 4)) +
                                     ImGui::GetStyle().WindowPadding.y));
    for (size_t i = 0; i < m.spikes.size(); i++) {
        char label[64];
        std::snprintf(label, sizeof label, "step %lld##spike%zu",
                      static_cast<long long>(m.spikes[i].step), i);
        if (ImGui::Selectable(label, s.selected == static_cast<int>(i)))
            s.selected = static_cast<int>(i);
        if (i == 0 && d.rects) d.rects->mark("spike_list");
    }
    ImGui::EndChild();
    if (s.selected < 0 || s.selected >= static_cast<int>(m.spikes.size())) s.selected = 0;
    const RunEvent& e = m.spikes[static_cast<size_t>(s.selected)];
    ImGui::PushStyleColor(ImGuiCol_Text, plot::kRed);
    ImGui::TextWrapped("%s", e.message.c_str());
    ImGui::PopStyleColor();
    const std::vector<EvidenceRow> rows =
        evidence_at(m, e, static_cast<int>(d.config.spikes.window));
    if (rows.empty()) return;
    if (ImGui::BeginTable("evidence", 6, ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg |
                                             ImGuiTableFlags_SizingStretchProp)) {
        for (const char* c : {"layer", "grad norm", "x median", "update ratio",
                              "Adam eps/sqrt(v)", "max logit"})
            ImGui::TableSetupColumn(c);
        ImGui::TableHeadersRow();
        double worst = 0;
        for (const EvidenceRow& r : rows)
            if (std::isfinite(r.grad_norm_ratio)) worst = std::max(worst, r.grad_norm_ratio);
        for (const EvidenceRow& r : rows) {
            ImGui::TableNextRow();
            const bool top = r.grad_norm_ratio == worst && worst > 0;
            if (top) ImGui::TableSetBgColor(ImGuiTableBgTarget_RowBg0, IM_COL32(120, 40, 40, 160));
            const std::string cells[] = {r.group, num(r.grad_norm), num(r.grad_norm_ratio),
                                         num(r.update_ratio), num(r.adam_eps_ratio),
                                         num(r.attn_logit_max)};
            for (const std::string& c : cells) {
                ImGui::TableNextColumn();
                ImGui::TextUnformatted(c.c_str());
            }
        }
        ImGui::EndTable();
    }
}

}  // namespace px::gui
