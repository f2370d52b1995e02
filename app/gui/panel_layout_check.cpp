// Layout check: the reference and the chosen layouts in lockstep, as `parallax validate` runs
// them (LayoutCheck over validate_layouts: step s of every run before step s + 1 of any). The
// heatmap of tensors × steps fills in live, every layout's columns together, each cell coloured
// by the worst ULP distance over the ranks (bitwise mode) or by its error against the error
// budget (fast mode: within it never red); the verdict, the first divergence and the first-op
// search are shown as the harness names them; clicking a cell shows both values.
// Two traces (`parallax compare`) show as one grid of ops × steps coloured by error / budget, the
// verdict above it, the first over-budget cell outlined, the split by ranks under it; one trace
// alone shows its probes × steps under its attributes (views/trace_view.h).
#include "app/gui/panels.h"

#include <imgui.h>
#include <imgui_stdlib.h>

#include <cstdio>

namespace px::gui {

namespace {

const char* const kModes[] = {"the job's mode", "bitwise", "fast"};

ImU32 verdict_colour(const LayoutGrid& g) {
    if (!g.finished) return IM_COL32(200, 200, 200, 255);
    return g.result.ok() ? IM_COL32(110, 220, 140, 255) : IM_COL32(255, 100, 90, 255);
}

// "; error 0.031 of its budget (within)", for a fast-mode cell.
std::string budget_text(const CheckCell& k) {
    if (k.ratio < 0) return "";
    char b[96];
    std::snprintf(b, sizeof b, "; error %.3g of its budget (%s)", k.ratio,
                  k.ratio <= 1 ? "within" : "over");
    return b;
}

// Why a layout's grid has no rows, in a sentence; "" when it has some.
std::string empty_grid_reason(const CheckView& v, const LayoutGrid& g) {
    if (!g.tensors.empty()) return "";
    const bool golden = v.mode.rfind("golden trace", 0) == 0;
    if (golden && !g.finished)
        return g.name + ": running the trace's steps; its probes are compared when they are done";
    if (golden)
        return g.name +
               ": a golden trace is compared probe by probe (the tensors the trace "
               "recorded, in its order), not tensor by step: there is no grid to colour; "
               "the verdict above is over every probe of the trace";
    if (!g.finished) return g.name + ": no step compared yet";
    if (g.result.verdict == "error")
        return g.name + ": the layout did not run, so nothing was compared";
    return g.name +
           ": this report has no grid (written by an older parallax validate) and no "
           "step differed, so there is no tensor to show";
}

// The hovered or clicked cell of a comparison or of one trace, in a sentence.
std::string trace_cell_text(const CheckView& v, const std::string& name, int step,
                            const CheckCell& k) {
    char b[512];
    if (v.mode == "trace") {
        std::snprintf(b, sizeof b, "%s, step %d: %s", name.c_str(), step,
                      k.done ? "recorded" : "not recorded");
    } else if (!k.done) {
        std::snprintf(b, sizeof b, "%s, step %d: not in both traces", name.c_str(), step);
    } else if (k.rank < 0) {
        std::snprintf(b, sizeof b, "%s, step %d: bit-identical", name.c_str(), step);
    } else {
        std::string at = "[";
        for (size_t i = 0; i < k.at.size(); i++) at += (i ? ", " : "") + std::to_string(k.at[i]);
        at += "]";
        std::snprintf(b, sizeof b,
                      "%s, step %d: rel. error %.3g, budget %.3g: %.3g of it (%s); largest "
                      "difference at %s: run %.9g, reference %.9g",
                      name.c_str(), step, k.rel, k.budget, k.ratio,
                      k.ratio <= 1 ? "within" : "over", at.c_str(), k.candidate, k.reference);
    }
    return b;
}

// A comparison's or a trace's lines above the grid: the traces, the verdict, the first
// divergence (the outlined cell).
void draw_trace_header(const CheckView& v, const LayoutGrid& g, const RunData& d) {
    ImGui::TextWrapped("%s", v.header.c_str());
    if (v.mode == "trace") {
        ImGui::TextUnformatted(g.summary.c_str());
        return;
    }
    ImGui::PushStyleColor(ImGuiCol_Text, verdict_colour(g));
    ImGui::TextWrapped("verdict: %s", g.summary.c_str());
    ImGui::PopStyleColor();
    if (d.rects) d.rects->mark("compare_verdict");
    if (g.first_row >= 0)  // the verdict within budget names its largest ratio itself
        ImGui::TextColored(ImVec4(0.94f, 0.82f, 0.31f, 1),
                           "first divergence: step %lld, %s (outlined in the grid)",
                           static_cast<long long>(g.result.first_step),
                           g.result.first.name.c_str());
}

// A layout check's lines above the grid: the mode, one row per layout (its verdict under
// parallax validate's column headers; a click selects the layout), the first divergence.
void draw_check_header(const CheckView& v, const RunData& d, LayoutCheckPanelState& s) {
    ImGui::Text("%s mode, %lld steps; reference: %lld of %lld steps%s", v.mode.c_str(),
                static_cast<long long>(v.steps), static_cast<long long>(v.reference_steps),
                static_cast<long long>(v.steps), v.running ? "  (running)" : "");
    if (!v.error.empty()) ImGui::TextColored(ImVec4(1, 0.45f, 0.4f, 1), "%s", v.error.c_str());
    // One row per layout: its verdict under parallax validate's column headers.
    const ImGuiTableFlags tf =
        ImGuiTableFlags_SizingFixedFit | ImGuiTableFlags_RowBg | ImGuiTableFlags_BordersInnerV;
    if (ImGui::BeginTable("verdicts", 5, tf)) {
        for (const char* c : {"layout", "steps", "verdict", "max ULP"}) ImGui::TableSetupColumn(c);
        ImGui::TableSetupColumn("first divergence", ImGuiTableColumnFlags_WidthStretch);
        ImGui::TableHeadersRow();
        for (size_t i = 0; i < v.layouts.size(); i++) {
            const LayoutGrid& g = v.layouts[i];
            ImGui::PushID(static_cast<int>(i));
            ImGui::TableNextRow();
            ImGui::TableNextColumn();
            ImGui::PushStyleColor(ImGuiCol_Text, verdict_colour(g));
            if (ImGui::Selectable(g.name.c_str(), s.layout == static_cast<int>(i),
                                  ImGuiSelectableFlags_SpanAllColumns)) {
                s.layout = static_cast<int>(i);
                s.row = s.col = -1;
            }
            if (d.rects) d.rects->mark("check_layout:" + g.name);
            ImGui::TableNextColumn();
            if (g.finished)
                ImGui::Text("%lld", static_cast<long long>(g.result.steps));
            else
                ImGui::Text("%lld / %lld", static_cast<long long>(g.steps_done),
                            static_cast<long long>(v.steps));
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(g.finished ? g.result.verdict.c_str() : "comparing");
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(g.finished ? max_ulp_text(g.result.max_ulp).c_str() : "");
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(g.finished ? first_divergence_text(g.result).c_str() : "");
            ImGui::PopStyleColor();
            ImGui::PopID();
        }
        ImGui::EndTable();
    }
    if (s.layout >= static_cast<int>(v.layouts.size())) s.layout = 0;
    const LayoutGrid& g = v.layouts[static_cast<size_t>(s.layout)];
    if (g.finished && g.result.first_step >= 0 && v.mode == "fast") {
        // Fast mode differs in its bits by design; the verdict is the budget's.
        ImGui::TextDisabled(
            "first bit difference: step %lld, %s on rank %d (fast mode is judged by the error "
            "budget)",
            static_cast<long long>(g.result.first_step), g.result.first.name.c_str(),
            g.result.first_rank);
    } else if (g.finished && g.result.first_step >= 0) {
        const LayoutResult& r = g.result;
        ImGui::TextColored(ImVec4(1, 0.5f, 0.45f, 1), "first divergence: step %lld, %s on rank %d",
                           static_cast<long long>(r.first_step), r.first.name.c_str(),
                           r.first_rank);
        if (r.first_op_rank >= 0)
            ImGui::TextColored(ImVec4(1, 0.5f, 0.45f, 1),
                               "first op: %s on rank %d (%s), %.9g vs %.9g",
                               r.first_op.name.c_str(), r.first_op_rank, r.first_op_where.c_str(),
                               r.first_op.first_reference, r.first_op.first_candidate);
        else if (!r.first_op_note.empty())
            ImGui::TextDisabled("first op: %s", r.first_op_note.c_str());
    }
    if (g.finished && g.result.budget_ratio >= 0)
        ImGui::Text("error budget: worst tensor %s at %.3g of its budget",
                    g.result.budget_worst.c_str(), g.result.budget_ratio);
}

}  // namespace

void draw_layout_check_panel(const RunData& d, LayoutCheckPanelState& s) {
    (void)d;
    if (s.check && !s.from_file && s.check->version() != s.view.version) s.view = s.check->view();
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 14);
    ImGui::InputText("layouts", &s.layouts);
    if (d.rects) d.rects->mark("field:check_layouts");
    ImGui::SameLine();
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 6);
    ImGui::InputInt("steps", &s.steps, 0, 0);  // no +/- buttons: the field is the widget
    if (d.rects) d.rects->mark("field:check_steps");
    if (s.steps < 1) s.steps = 1;
    ImGui::SameLine();
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 9);
    ImGui::Combo("mode", &s.mode, kModes, 3);
    ImGui::SameLine();
    const bool busy = s.check && s.check->busy();
    if (ImGui::Button(busy ? "Checking..." : "Run check") && !busy) s.start_requested = true;
    if (d.rects) d.rects->mark("run_check");
    // Two traces: compared op by op under the error budget; one alone: what it holds.
    const float field_w = ImGui::GetFontSize() * 17;
    ImGui::SetNextItemWidth(field_w);
    ImGui::InputTextWithHint("reference trace", "ref.h5", &s.reference_trace);
    if (d.rects) d.rects->mark("field:reference_trace");
    ImGui::SameLine();
    ImGui::SetNextItemWidth(field_w);
    ImGui::InputTextWithHint("run trace", "run.h5", &s.run_trace);
    if (d.rects) d.rects->mark("field:run_trace");
    ImGui::SameLine();
    const bool both = !s.reference_trace.empty() && !s.run_trace.empty();
    const bool comparing = busy && s.view.mode == "compare";
    if (ImGui::Button(comparing ? "Comparing...###compare"
                      : both    ? "Compare###compare"
                                : "Show trace###compare") &&
        !busy)
        s.compare_requested = true;
    if (d.rects) d.rects->mark("compare");
    if (ImGui::IsItemHovered())
        ImGui::SetTooltip(
            "Both traces: compared op by op under the error budget (parallax compare).\n"
            "One of them: its probes by step, and its source, precision and layout.");
    if (!s.message.empty()) {
        ImGui::PushStyleColor(ImGuiCol_Text, IM_COL32(255, 110, 100, 255));
        ImGui::TextWrapped("%s", s.message.c_str());
        ImGui::PopStyleColor();
    }
    const CheckView& v = s.view;
    const bool traces = v.mode == "compare" || v.mode == "trace";
    if (v.layouts.empty()) {
        if (!v.header.empty()) ImGui::TextWrapped("%s%s", v.header.c_str(), v.running ? "..." : "");
        if (!v.error.empty()) ImGui::TextColored(ImVec4(1, 0.45f, 0.4f, 1), "%s", v.error.c_str());
        if (v.header.empty() && v.error.empty())
            empty_state(
                "no check yet: pick layouts and press Run check (the reference and every layout "
                "step by step together, compared after every step), or give two traces and "
                "press Compare");
        return;
    }
    if (s.layout >= static_cast<int>(v.layouts.size()) || traces) s.layout = 0;
    if (traces)
        draw_trace_header(v, v.layouts[0], d);
    else
        draw_check_header(v, d, s);
    const LayoutGrid& g = v.layouts[static_cast<size_t>(s.layout)];
    if (const std::string why = empty_grid_reason(v, g); !why.empty()) {
        ImGui::TextWrapped("%s", why.c_str());
        return;
    }
    // Cell details, and the notes (a comparison's split by ranks) under the grid.
    const float detail_h =
        ImGui::GetTextLineHeightWithSpacing() * (2.2f + static_cast<float>(v.notes.size()));
    plot::Heatmap h;
    h.rows = static_cast<int>(g.tensors.size());
    h.cols = static_cast<int>(v.steps);
    const bool fast = v.mode == "fast" || v.mode == "compare";
    if (v.mode == "compare")
        h.title = g.name +
                  ": ops x steps, coloured by error / budget (within: green, never red; "
                  "over: orange to red)";
    else if (v.mode == "trace")
        h.title = g.name + ": ops x steps (blue: recorded)";
    else
        h.title =
            g.name + (fast ? ": tensors x steps, coloured by the worst error / budget over ranks "
                             "(within budget: green; over: orange to red)"
                           : ": tensors x steps, coloured by the worst ULP distance over ranks");
    if (g.first_row >= 0) {
        h.mark_row = g.first_row;
        h.mark_col = g.first_col;
        h.mark_label = "first over budget";
    }
    h.x_label = "step";
    h.row_label = [&](int r) { return g.tensors[static_cast<size_t>(r)]; };
    h.colour = [&](int r, int c) {
        const std::vector<CheckCell>& line = g.cells[static_cast<size_t>(r)];
        return static_cast<ImU32>(c < static_cast<int>(line.size())
                                      ? cell_colour(line[static_cast<size_t>(c)], v.mode)
                                      : cell_colour(CheckCell{}, v.mode));
    };
    auto sample = [&](std::int64_t ulp, bool differs, bool done, double ratio = -1) {
        CheckCell c;
        c.done = done;
        c.max_ulp = ulp;
        c.rank = differs ? 0 : -1;
        c.ratio = ratio;
        return static_cast<ImU32>(cell_colour(c, v.mode));
    };
    if (v.mode == "trace")
        h.legend = {{sample(0, false, false), "not recorded"},
                    {sample(0, false, true), "recorded"}};
    else if (fast)
        h.legend = {
            {sample(0, false, false), v.mode == "compare" ? "not in both" : "not yet"},
            {sample(0, false, true), "bit-identical"},
            {sample(1, true, true, 0.01), "<= 0.01"},
            {sample(1, true, true, 0.1), "0.1 budget"},
            {sample(1, true, true, 1), "1 budget"},
            {sample(1, true, true, 1.5), "> 1: over"},
            {sample(1, true, true, 100), ">= 100"},
            {sample(kNoUlp, true, true), "NaN"},
        };
    else
        h.legend = {{sample(0, false, false), "not yet"},
                    {sample(0, false, true), "bit-identical"},
                    {sample(1, true, true), "1 ulp"},
                    {sample(1 << 10, true, true), "1024 ulp"},
                    {sample(1 << 20, true, true), ">= 2^20 ulp"},
                    {sample(kNoUlp, true, true), "NaN"}};
    const plot::HeatmapHit hit = plot::draw_heatmap("grid", h, ImVec2(-1, -detail_h), s.row, s.col);
    if (d.rects) d.rects->mark("check_grid");
    if (hit.clicked) {
        s.row = hit.row;
        s.col = hit.col;
    }
    const int r = s.row >= 0 ? s.row : hit.row, c = s.row >= 0 ? s.col : hit.col;
    if (r >= 0 && c >= 0 && r < h.rows &&
        c < static_cast<int>(g.cells[static_cast<size_t>(r)].size())) {
        const CheckCell& k = g.cells[static_cast<size_t>(r)][static_cast<size_t>(c)];
        const std::string& name = g.tensors[static_cast<size_t>(r)];
        if (traces)
            ImGui::TextWrapped("%s", trace_cell_text(v, name, c + 1, k).c_str());
        else if (!k.done)
            ImGui::Text("%s, step %d: not compared yet", name.c_str(), c + 1);
        else if (k.rank < 0)
            ImGui::Text("%s, step %d: bit-identical on every rank", name.c_str(), c + 1);
        else if (k.first < 0)  // an opened report's grid: the step's worst only
            ImGui::Text("%s, step %d: max %lld ulp over the ranks%s", name.c_str(), c + 1,
                        static_cast<long long>(k.max_ulp), budget_text(k).c_str());
        else
            ImGui::Text(
                "%s, step %d: %lld elements differ on rank %d, max %lld ulp; first element %lld: "
                "reference %.9g, layout %.9g%s",
                name.c_str(), c + 1, static_cast<long long>(k.differing), k.rank,
                static_cast<long long>(k.max_ulp), static_cast<long long>(k.first), k.reference,
                k.candidate, budget_text(k).c_str());
    } else {
        ImGui::TextDisabled("hover a cell for its values; click to keep it");
    }
    for (const std::string& note : v.notes) ImGui::TextUnformatted(note.c_str());
}

}  // namespace px::gui
