// Numerics explorer (teaching view): one reduction summed in the canonical tree (one device, and
// its blocks spread over ranks, exchanging exact node partials) against the communicator's ring
// all-reduce and a plain loop split over threads: why fp32 sums differ, and why the canonical
// order does not.
#include "app/gui/panels.h"

#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace px::gui {

void draw_numerics_panel(const RunData&, NumericsPanelState& s) {
    NumericsModel& m = s.model;
    bool changed = !s.made;
    const float fw = ImGui::GetFontSize() * 6;
    ImGui::SetNextItemWidth(fw);
    if (ImGui::InputInt("elements", &m.n)) changed = true;
    ImGui::SameLine();
    ImGui::SetNextItemWidth(fw);
    if (ImGui::InputInt("block", &m.block)) changed = true;
    ImGui::SameLine();
    ImGui::SetNextItemWidth(fw);
    if (ImGui::InputInt("seed", &m.seed)) changed = true;
    ImGui::SameLine();
    ImGui::SetNextItemWidth(fw);
    if (ImGui::InputInt("ranks in the tree view", &m.split)) changed = true;
    m.n = std::clamp(m.n, 1, 1 << 20);
    m.block = std::clamp(m.block, 1, 4096);
    m.split = std::clamp(m.split, 1, 8);
    if (changed) {
        m.make();
        s.made = true;
    }
    ImGui::TextWrapped(
        "The same %d fp32 values (magnitudes 1e-3 .. 1e3, mixed signs), summed in different "
        "orders. "
        "fp32 addition is not associative, so orders give different bits; the canonical tree "
        "fixes the order on logical block indices, so every split of it gives the same bits.",
        m.n);
    if (ImGui::BeginTable("sums", 5, ImGuiTableFlags_RowBg | ImGuiTableFlags_Borders)) {
        ImGui::TableSetupColumn("order", ImGuiTableColumnFlags_WidthFixed,
                                ImGui::GetFontSize() * 30);
        for (const char* c : {"sum (fp32)", "bits", "ulp vs canonical", "|error| vs fp64 sum"})
            ImGui::TableSetupColumn(c);
        ImGui::TableHeadersRow();
        for (const SumRow& r : m.rows) {
            ImGui::TableNextRow();
            ImGui::TableNextColumn();
            ImGui::TextColored(
                r.canonical ? ImVec4(0.45f, 0.85f, 0.55f, 1) : ImVec4(1, 0.72f, 0.4f, 1), "%s",
                r.how.c_str());
            ImGui::TableNextColumn();
            ImGui::Text("%.9g", static_cast<double>(r.value));
            ImGui::TableNextColumn();
            std::uint32_t bits;
            std::memcpy(&bits, &r.value, sizeof bits);
            ImGui::Text("0x%08x", bits);
            ImGui::TableNextColumn();
            ImGui::Text("%lld", static_cast<long long>(r.ulp_vs_tree));
            ImGui::TableNextColumn();
            ImGui::Text("%.3g", r.error_vs_exact);
        }
        ImGui::EndTable();
    }
    ImGui::Text("fp64 sum: %.12g", m.exact);
    // The tree over blocks, with the nodes each of `split` ranks computes alone.
    const i64 nb = num_blocks(m.n, m.block);
    ImGui::Text(
        "the canonical tree over %lld blocks; coloured: the maximal nodes each of %d ranks "
        "computes alone",
        static_cast<long long>(nb), m.split);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 o = ImGui::GetCursorScreenPos();
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    ImGui::Dummy(avail);
    if (nb > 256) {
        dl->AddText(o, IM_COL32(170, 170, 180, 255),
                    "(too many blocks to draw: lower the elements or raise the block)");
        return;
    }
    // Depth of the tree.
    int depth = 0;
    for (i64 w = nb; w > 1; w = (w + 1) / 2) depth++;
    const float row_h = std::min(36.0f, (avail.y - 10) / (depth + 1));
    const float bw = (avail.x - 10) / static_cast<float>(nb);
    static const ImU32 colours[] = {plot::kBlue,   plot::kOrange, plot::kGreen,
                                    plot::kPurple, plot::kYellow, IM_COL32(80, 210, 220, 255),
                                    plot::kRed,    plot::kGrey};
    auto owner = [&](i64 lo, i64 hi) {
        for (size_t r = 0; r < m.nodes.size(); r++)
            for (const Range& k : m.nodes[r])
                if (k.lo == lo && k.hi == hi) return static_cast<int>(r);
        return -1;
    };
    // Draw node [lo, hi) at its depth; recurse.
    struct Walk {
        ImDrawList* dl;
        ImVec2 o;
        float bw, row_h;
        const decltype(owner)& own;
        void node(i64 lo, i64 hi, int level) const {
            const ImVec2 p0(o.x + lo * bw + 1, o.y + level * row_h + 1),
                p1(o.x + hi * bw - 1, o.y + (level + 1) * row_h - 3);
            const int r = own(lo, hi);
            dl->AddRectFilled(p0, p1, r >= 0 ? colours[r % 8] : IM_COL32(45, 48, 58, 255), 3);
            dl->AddRect(p0, p1, IM_COL32(120, 120, 130, 255), 3);
            char t[48];
            std::snprintf(t, sizeof t, "[%lld,%lld)", static_cast<long long>(lo),
                          static_cast<long long>(hi));
            const ImVec2 ts = ImGui::CalcTextSize(t);
            if (ts.x + 4 < p1.x - p0.x)
                dl->AddText(ImVec2((p0.x + p1.x - ts.x) / 2, (p0.y + p1.y - ts.y) / 2),
                            r >= 0 ? IM_COL32(10, 10, 14, 255) : IM_COL32(200, 200, 210, 255), t);
            if (hi - lo > 1) {
                const i64 mid = tree_mid(lo, hi);
                node(lo, mid, level + 1);
                node(mid, hi, level + 1);
            }
        }
    };
    Walk{dl, o, bw, row_h, owner}.node(0, nb, 0);
}

}  // namespace px::gui
