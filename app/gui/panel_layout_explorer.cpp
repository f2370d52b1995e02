// Layout explorer (teaching view): pick dp / tp / pp / cp / ep / ZeRO / sp and see, from one step
// the runtime itself runs (LayoutExplorer), which rank holds which block of a weight matrix (under
// ep, which experts' rows of a stacked expert tensor), which collectives each layer issues with
// their bytes, and the memory per rank. For a llama job also how attention's heads sit on the tp
// ranks: each rank's query heads and its KV heads, split between them or whole on every rank.
#include "app/gui/panels.h"

#include "core/train/memory.h"

#include <imgui.h>

#include <algorithm>
#include <cstdio>
#include <map>

namespace px::gui {

namespace {

ImU32 rank_colour(int r) {
    static const ImU32 k[] = {IM_COL32(86, 156, 255, 255),  IM_COL32(255, 160, 60, 255),
                              IM_COL32(90, 200, 120, 255),  IM_COL32(200, 110, 255, 255),
                              IM_COL32(240, 210, 80, 255),  IM_COL32(80, 210, 220, 255),
                              IM_COL32(240, 100, 140, 255), IM_COL32(170, 170, 120, 255)};
    return k[r % 8];
}

// Diagonal stripes of the holders' colours over [p0, p1]: each holds the whole block.
void draw_replicated(ImDrawList* dl, ImVec2 p0, ImVec2 p1, const std::vector<int>& ranks) {
    const float w = 7.0f, h = p1.y - p0.y;
    dl->PushClipRect(p0, p1, true);
    int i = 0;
    for (float x = p0.x - h; x < p1.x; x += w, i++)
        dl->AddQuadFilled(ImVec2(x, p1.y), ImVec2(x + w, p1.y), ImVec2(x + w + h, p0.y),
                          ImVec2(x + h, p0.y),
                          rank_colour(ranks[static_cast<size_t>(i) % ranks.size()]));
    dl->PopClipRect();
}

// The tensor's logical (rows, cols) as a rectangle: a shard in its rank's colour, a block that
// several ranks hold whole in diagonal stripes of their colours (never cut between them).
void draw_holding(const TensorHolding& t, bool moments, ImVec2 size) {
    const std::vector<HeldBlock> blocks = held_blocks(t, moments);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const ImVec2 o = ImGui::GetCursorScreenPos();
    const float lh = ImGui::GetTextLineHeight();
    ImGui::Dummy(size);
    const float aspect = static_cast<float>(t.cols) / static_cast<float>(std::max<i64>(t.rows, 1));
    float w = size.x - 10, h = size.y - lh * 2.8f;
    if (w / h > aspect * 6) w = std::max(h * aspect * 6, 120.0f);
    const ImVec2 a(o.x + 4, o.y + lh * 1.4f), b(a.x + w, a.y + h);
    char title[160];
    std::snprintf(title, sizeof title, "%s%s: (%lld, %lld), logical; colour = rank", t.name.c_str(),
                  moments ? " Adam moments" : "", static_cast<long long>(t.rows),
                  static_cast<long long>(t.cols));
    dl->AddText(o, IM_COL32(215, 215, 222, 255), title);
    dl->AddText(ImVec2(o.x + 4, b.y + lh * 0.2f), IM_COL32(170, 170, 180, 255),
                "one colour: that rank's shard; diagonal stripes: every striped rank holds the "
                "whole block (replicated)");
    dl->AddRectFilled(a, b, IM_COL32(22, 24, 30, 255));
    auto X = [&](i64 c) {
        return a.x + static_cast<float>(c) / static_cast<float>(t.cols) * (b.x - a.x);
    };
    auto Y = [&](i64 r) {
        return a.y + static_cast<float>(r) / static_cast<float>(t.rows) * (b.y - a.y);
    };
    for (const HeldBlock& k : blocks) {
        const ImVec2 p0(X(k.slab.col0), Y(k.slab.row0));
        const ImVec2 p1(X(k.slab.col0 + k.slab.cols), Y(k.slab.row0 + k.slab.rows));
        if (k.replicated())
            draw_replicated(dl, p0, p1, k.ranks);
        else
            dl->AddRectFilled(p0, p1, rank_colour(k.ranks.front()));
        dl->AddRect(p0, p1, IM_COL32(10, 10, 14, 255));
        std::string label = "r";
        for (size_t i = 0; i < k.ranks.size(); i++) {
            if (i) label += ',';
            label += std::to_string(k.ranks[i]);
        }
        if (k.replicated()) label += " (each whole)";
        const ImVec2 ts = ImGui::CalcTextSize(label.c_str());
        if (ts.x + 4 < p1.x - p0.x && ts.y < p1.y - p0.y) {
            const ImVec2 at((p0.x + p1.x - ts.x) / 2, (p0.y + p1.y - ts.y) / 2);
            // On stripes: a dark plate under the label, so it reads over any colour.
            if (k.replicated())
                dl->AddRectFilled(ImVec2(at.x - 3, at.y - 1), ImVec2(at.x + ts.x + 3, at.y + ts.y),
                                  IM_COL32(22, 24, 30, 230));
            dl->AddText(at, k.replicated() ? IM_COL32(235, 235, 240, 255) : IM_COL32(10, 10, 14, 255),
                        label.c_str());
        }
    }
    dl->AddRect(a, b, IM_COL32(170, 170, 180, 255));
    if (blocks.empty())
        dl->AddText(ImVec2(a.x + 8, a.y + 8), IM_COL32(170, 170, 180, 255),
                    "no rank holds it between steps");
}

// The heads on the tp ranks (HeadLayout): a row of query heads, each in its tp rank's colour, over
// a row of KV heads, each under the query heads that read it: in its holder's colour where tp
// splits them, in stripes of every tp rank's colour where each rank holds all of them. Then one
// line per tp rank (the first 8).
void draw_heads(const HeadLayout& h) {
    ImGui::TextUnformatted(h.summary().c_str());
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const float lh = ImGui::GetTextLineHeight();
    const float label_w = ImGui::CalcTextSize("KV heads (k_proj, v_proj)").x + 10;
    const float w = std::min(ImGui::GetContentRegionAvail().x * 0.5f, 90.0f * h.heads);
    const float box_h = lh * 1.35f, gap = lh * 1.1f;
    const ImVec2 o = ImGui::GetCursorScreenPos();
    ImGui::Dummy(ImVec2(label_w + w, 2 * box_h + gap));
    const ImU32 text = IM_COL32(215, 215, 222, 255), dark = IM_COL32(10, 10, 14, 255);
    dl->AddText(ImVec2(o.x, o.y + (box_h - lh) / 2), text, "query heads (q_proj)");
    dl->AddText(ImVec2(o.x, o.y + box_h + gap + (box_h - lh) / 2), text,
                "KV heads (k_proj, v_proj)");
    const float x0 = o.x + label_w, qw = w / static_cast<float>(h.heads);
    auto label = [&](ImVec2 p0, ImVec2 p1, const char* s, bool plate) {
        const ImVec2 ts = ImGui::CalcTextSize(s);
        if (ts.x + 4 > p1.x - p0.x) return;
        const ImVec2 at((p0.x + p1.x - ts.x) / 2, (p0.y + p1.y - ts.y) / 2);
        if (plate)
            dl->AddRectFilled(ImVec2(at.x - 3, at.y - 1), ImVec2(at.x + ts.x + 3, at.y + ts.y),
                              IM_COL32(22, 24, 30, 230));
        dl->AddText(at, plate ? text : dark, s);
    };
    char name[48];
    for (const RankHeads& r : h.ranks)
        for (int q = r.q.lo; q < r.q.hi; q++) {
            const ImVec2 p0(x0 + qw * static_cast<float>(q) + 1, o.y);
            const ImVec2 p1(x0 + qw * static_cast<float>(q + 1) - 1, o.y + box_h);
            dl->AddRectFilled(p0, p1, rank_colour(r.tp_rank));
            std::snprintf(name, sizeof name, "q%d", q);
            label(p0, p1, name, false);
        }
    std::vector<int> all(static_cast<size_t>(h.tp));
    for (int t = 0; t < h.tp; t++) all[static_cast<size_t>(t)] = t;
    const float ky = o.y + box_h + gap;
    for (int k = 0; k < h.kv_heads; k++) {
        const ImVec2 p0(x0 + qw * static_cast<float>(k * h.group) + 1, ky);
        const ImVec2 p1(x0 + qw * static_cast<float>((k + 1) * h.group) - 1, ky + box_h);
        // Each query head's line down to the KV head it reads.
        for (int q = k * h.group; q < (k + 1) * h.group; q++) {
            const float x = x0 + qw * (static_cast<float>(q) + 0.5f);
            dl->AddLine(ImVec2(x, o.y + box_h), ImVec2((p0.x + p1.x) / 2, ky),
                        IM_COL32(200, 200, 210, 255), 1.5f);
        }
        int holder = 0;
        for (const RankHeads& r : h.ranks)
            if (k >= r.kv.lo && k < r.kv.hi) holder = r.tp_rank;
        const bool whole = !h.split && h.tp > 1;
        if (whole)
            draw_replicated(dl, p0, p1, all);
        else
            dl->AddRectFilled(p0, p1, rank_colour(holder));
        std::snprintf(name, sizeof name, "kv%d%s", k, whole ? " (every rank)" : "");
        label(p0, p1, name, whole);
    }
    const int shown = std::min(h.tp, 8);
    for (int t = 0; t < shown; t++) {
        const ImVec2 p = ImGui::GetCursorScreenPos();
        dl->AddRectFilled(p, ImVec2(p.x + lh, p.y + lh), rank_colour(t));
        ImGui::Dummy(ImVec2(lh, lh));
        ImGui::SameLine();
        ImGui::TextUnformatted(h.rank_text(t).c_str());
    }
    if (shown < h.tp) ImGui::TextDisabled("... and %d more tp ranks", h.tp - shown);
}

}  // namespace

void draw_layout_explorer_panel(const RunData& d, LayoutExplorerPanelState& s) {
    if (s.explorer && s.explorer->version() != s.seen) {
        // The matrix shown stays by name: another model's table numbers its tensors otherwise.
        const std::string shown =
            s.tensor >= 0 && s.tensor < static_cast<int>(s.result.tensors.size())
                ? s.result.tensors[static_cast<size_t>(s.tensor)].name
                : std::string();
        s.result = s.explorer->result();
        s.seen = s.explorer->version();
        s.tensor = -1;
        for (size_t i = 0; i < s.result.tensors.size(); i++)
            if (s.result.tensors[i].name == shown) s.tensor = static_cast<int>(i);
    }
    // The picks: the job bar's values while following it; a value picked here is the
    // explorer's own from then on (through a Start too), until "follow the job bar".
    ExplorerPicks& p = s.picks;
    const ExplorerPicks before = p;
    const float fw = ImGui::GetFontSize() * 3.0f;
    // A typed field (no step buttons), its label apart: the marked rectangle is the field.
    auto pick = [&](const char* label, int* v, int lo, int hi) {
        ImGui::SetNextItemWidth(fw);
        ImGui::InputInt((std::string("##") + label).c_str(), v, 0, 0);
        *v = std::clamp(*v, lo, hi);
        if (d.rects) d.rects->mark(std::string("explorer_") + label);
        ImGui::SameLine(0, 4);
        ImGui::TextUnformatted(label);
        ImGui::SameLine();
    };
    pick("dp", &p.dp, 1, 64);
    pick("tp", &p.tp, 1, 64);
    pick("pp", &p.pp, 1, 64);
    pick("cp", &p.cp, 1, 64);
    if (p.cp > 1) {
        ImGui::SetNextItemWidth(fw * 2.5f);
        int method = p.ulysses ? 1 : 0;
        ImGui::Combo("cp attention", &method, "ring\0ulysses\0");
        p.ulysses = method == 1;
        ImGui::SameLine();
    }
    const bool dense = s.experts == 0;
    if (dense) p.ep = 1;  // a dense model has no experts to share out
    ImGui::BeginDisabled(dense);
    pick("ep", &p.ep, 1, 64);
    ImGui::EndDisabled();
    pick("ZeRO", &p.zero, 0, 3);
    ImGui::Checkbox("sp", &p.sp);
    ImGui::SameLine();
    pick("block", &p.block, 1, 1 << 16);  // numerics.block
    if (!(p == before) && !(dense && before.ep != 1 && p.ep == 1)) p.follow = false;
    if (p.follow) {
        ImGui::TextDisabled("(the job bar's values)");
    } else if (ImGui::Button("follow the job bar")) {
        p.follow = true;  // the workbench takes the fields' values and explores them
        s.explore_requested = true;
    }
    if (d.rects) d.rects->mark("explorer_follow");
    ImGui::SameLine();
    const bool busy = s.explorer && s.explorer->busy();
    if (ImGui::Button(busy ? "Running one step..." : "Explore") && !busy)
        s.explore_requested = true;
    if (d.rects) d.rects->mark("explore");
    if (dense) empty_state("ep stays 1: a dense model (model.moe_experts = 0) has no experts");
    const ExplorerResult& r = s.result;
    if (!r.ready) {
        empty_state(
            "pick a layout and press Explore: one step of the runtime shows who holds what");
        return;
    }
    if (!r.error.empty()) {
        ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 110, 100, 255));
        ImGui::TextWrapped("%s", r.error.c_str());
        ImGui::PopStyleColor();
        return;
    }
    const Layout& l = r.layout;
    const std::string cp =
        l.cp > 1 ? " x cp " + std::to_string(l.cp) + " (" + cp_method_name(l.cp_method) + ")"
                 : std::string();
    const std::string ep = l.ep > 1 ? " (ep " + std::to_string(l.ep) +
                                          ": experts shared out over groups of " +
                                          std::to_string(l.ep) + " dp ranks)"
                                    : std::string();
    ImGui::Text(
        "world of %d ranks: dp %d x pp %d%s x tp %d%s, ZeRO-%d, %d microbatches%s (one step "
        "traced in %.2f s)",
        l.world_size(), l.dp, l.pp, cp.c_str(), l.tp, ep.c_str(), l.zero, l.microbatches,
        r.config.layout.sequence_parallel ? ", sequence parallel" : "", r.seconds);
    // The ranks.
    for (int k = 0; k < l.world_size(); k++) {
        const Coord c = r.coords[static_cast<size_t>(k)];
        const LayerRange lr = r.layers[static_cast<size_t>(k)];
        const ImVec2 p = ImGui::GetCursorScreenPos();
        const float h = ImGui::GetTextLineHeight();
        ImGui::GetWindowDrawList()->AddRectFilled(p, ImVec2(p.x + h, p.y + h), rank_colour(k));
        ImGui::Dummy(ImVec2(h, h));
        ImGui::SameLine();
        std::string line = "rank " + std::to_string(k) + ": pp" + std::to_string(c.pp) + " dp" +
                           std::to_string(c.dp) +
                           (l.cp > 1 ? " cp" + std::to_string(c.cp) : std::string()) + " tp" +
                           std::to_string(c.tp) + ", layers " + std::to_string(lr.lo) + ".." +
                           std::to_string(lr.hi - 1);
        const ExpertRange e = r.experts[static_cast<size_t>(k)];
        if (e.size() > 0)
            line += ", experts " + std::to_string(e.lo) + ".." + std::to_string(e.hi - 1);
        ImGui::TextUnformatted(line.c_str());
        if (k % 3 != 2 && k + 1 < l.world_size()) ImGui::SameLine(0, 24);
    }
    if (d.rects) d.rects->mark("explorer_ranks");
    // Llama: the attention heads on the tp ranks (colour = tp rank, world ranks 0..tp-1).
    if (r.config.model.llama()) {
        ImGui::Separator();
        ImGui::BeginGroup();
        draw_heads(r.heads);
        ImGui::EndGroup();
        if (d.rects) d.rects->mark("explorer_heads");
        ImGui::Separator();
    }
    // Which matrix.
    std::vector<int> matrices;
    for (size_t i = 0; i < r.tensors.size(); i++)
        if (r.tensors[i].rows > 1) matrices.push_back(static_cast<int>(i));
    if (s.tensor < 0 || s.tensor >= static_cast<int>(r.tensors.size())) {
        // The first attention matrix (llama: k_proj, whose rows tp splits or leaves whole); under
        // ep the first stacked expert matrix, whose rows the ep ranks share out.
        const bool llama = r.config.model.llama();
        const char* first = l.ep > 1 ? (llama ? "mlp.experts.gate_proj" : "moe.experts.c_fc.weight")
                                     : (llama ? "self_attn.k_proj.weight" : "attn.c_attn.weight");
        s.tensor = matrices.empty() ? 0 : matrices.front();
        for (int i : matrices)
            if (r.tensors[static_cast<size_t>(i)].name.find(first) != std::string::npos) {
                s.tensor = i;
                break;
            }
    }
    // Wide enough for the name shown (Hugging Face's llama names are long).
    const char* shown = r.tensors[static_cast<size_t>(s.tensor)].name.c_str();
    ImGui::SetNextItemWidth(std::max(ImGui::GetFontSize() * 16,
                                     ImGui::CalcTextSize(shown).x + ImGui::GetFrameHeight() * 1.6f));
    if (ImGui::BeginCombo("weight matrix", shown)) {
        for (int i : matrices)
            if (ImGui::Selectable(r.tensors[static_cast<size_t>(i)].name.c_str(), i == s.tensor))
                s.tensor = i;
        ImGui::EndCombo();
    }
    ImGui::SameLine();
    ImGui::Checkbox("Adam moments instead of weights", &s.show_moments);
    const float avail_h = ImGui::GetContentRegionAvail().y;
    const float avail_w = ImGui::GetContentRegionAvail().x;
    ImGui::BeginGroup();
    draw_holding(r.tensors[static_cast<size_t>(s.tensor)], s.show_moments,
                 ImVec2(avail_w * 0.42f, avail_h * 0.52f));
    if (d.rects) d.rects->mark("explorer_holding");
    ImGui::EndGroup();
    ImGui::SameLine();
    // Memory per rank, measured after the step, against the estimate.
    plot::StackedBars b = memory_bars(r.memory, r.estimate, "r");
    b.title = "memory per rank after the step, beside the estimate";
    plot::draw_stacked_bars("explorer_memory", b, ImVec2(-1, avail_h * 0.52f));
    // Collectives, in the order the ops run.
    ImGui::Text("collectives of one step (%zu kinds), each named by the op whose probe follows it",
                r.collectives.size());
    if (r.collectives.empty()) {
        empty_state("none: a single device talks to no one");
        return;
    }
    if (ImGui::BeginTable("coll", 7,
                          ImGuiTableFlags_RowBg | ImGuiTableFlags_Borders | ImGuiTableFlags_ScrollY,
                          ImVec2(-1, -1))) {
        for (const char* c : {"phase", "layer", "before op", "group", "collective",
                              "bytes per call", "calls x ranks"})
            ImGui::TableSetupColumn(c);
        ImGui::TableSetupScrollFreeze(0, 1);
        ImGui::TableHeadersRow();
        for (const CollectiveUse& u : r.collectives) {
            ImGui::TableNextRow();
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(u.phase.c_str());
            ImGui::TableNextColumn();
            if (u.layer >= 0)
                ImGui::Text("%d", u.layer);
            else
                ImGui::TextUnformatted("-");
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(u.op.c_str());
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(u.group.c_str());
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(u.collective.c_str());
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(format_bytes(static_cast<double>(u.bytes)).c_str());
            ImGui::TableNextColumn();
            ImGui::Text("%d x %zu", u.calls, u.ranks.size());
        }
        ImGui::EndTable();
    }
}

}  // namespace px::gui
