// The router of a mixture-of-experts run (data: gui/router_view.h, from the live job or an
// opened run.h5): each expert's load against the even share as two heatmaps (experts × steps of
// the chosen layer; experts × layers at the chosen step), and per layer against step the
// dropped fraction, the balance E·Σ f_i·P_i, the router's entropy beside ln E, and the aux and z
// losses. A click on a step column chooses the step, one on a layer column the layer. A dense
// run, or a MoE run before its first step, gets its one-line empty state.
#include "app/gui/panels.h"

#include <imgui.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace px::gui {

namespace {

// An expert's load (its slots over the even share) on a log2 scale: from half the even share or
// less (blue) through the even share (a neutral slate) to twice it or more (orange); none dark.
// Capacity factors are mostly 1 to 2, so one octave either side spans what a run can show.
ImU32 load_colour(double load) {
    if (!std::isfinite(load)) return IM_COL32(34, 36, 44, 255);
    const double t = std::clamp(std::log2(std::max(load, 1e-9)), -1.0, 1.0);
    const auto mix = [&](int mid, int end) {
        return static_cast<int>(mid + (end - mid) * std::fabs(t));
    };
    if (t < 0) return IM_COL32(mix(78, 40), mix(84, 110), mix(96, 235), 255);
    return IM_COL32(mix(78, 250), mix(84, 150), mix(96, 30), 255);
}

ImU32 layer_colour(size_t i, size_t n) {
    const float h = n > 1 ? 0.62f * static_cast<float>(i) / static_cast<float>(n - 1) : 0.58f;
    float r, g, b;
    ImGui::ColorConvertHSVtoRGB(h, 0.6f, 0.95f, r, g, b);
    return IM_COL32(static_cast<int>(r * 255), static_cast<int>(g * 255), static_cast<int>(b * 255),
                    255);
}

std::vector<std::pair<ImU32, std::string>> load_legend() {
    return {{load_colour(NAN), "no value"}, {load_colour(0.5), "1/2 or less"},
            {load_colour(0.71), "0.7x"},    {load_colour(1.0), "even share"},
            {load_colour(1.41), "1.4x"},    {load_colour(2.0), "2x or more"}};
}

std::string layer_name(int block) {
    return "h." + std::to_string(block);
}

}  // namespace

void draw_router_panel(const RunData& d, RouterPanelState& s) {
    const Config& cfg = d.snap.state == RunState::not_started ? d.config : d.snap.config;
    ImGui::TextDisabled(
        "tokens per expert against the even share; drops, balance, router entropy, aux and z "
        "losses per MoE layer");
    update_router_view(s.view, d.snap);
    const RouterView& v = s.view;
    if (v.empty()) {
        empty_state(router_empty_state(v, cfg, d.snap.state).c_str());
        return;
    }
    const int L = static_cast<int>(v.layers.size()), S = static_cast<int>(v.steps.size());
    s.layer = std::clamp(s.layer, 0, L - 1);
    if (s.step >= S) s.step = -1;
    const int step = s.step >= 0 ? s.step : S - 1;
    const ModelConfig& m = cfg.model;
    char capacity[64];
    if (m.moe_capacity_factor > 0)
        std::snprintf(capacity, sizeof capacity, "capacity factor %g", m.moe_capacity_factor);
    else
        std::snprintf(capacity, sizeof capacity, "dropless");
    ImGui::Text("%d experts, top-%lld, %s; %d MoE layer%s; steps %lld to %lld", v.experts,
                static_cast<long long>(m.moe_top_k), capacity, L, L == 1 ? "" : "s",
                static_cast<long long>(v.steps.front()), static_cast<long long>(v.steps.back()));

    // The chosen layer and step.
    ImGui::SetNextItemWidth(ImGui::GetFontSize() * 7);
    if (ImGui::BeginCombo("layer", layer_name(v.layers[static_cast<size_t>(s.layer)]).c_str())) {
        for (int l = 0; l < L; l++)
            if (ImGui::Selectable(layer_name(v.layers[static_cast<size_t>(l)]).c_str(),
                                  l == s.layer))
                s.layer = l;
        ImGui::EndCombo();
    }
    if (d.rects) d.rects->mark("router_layer");
    ImGui::SameLine();
    ImGui::Text("   step %lld%s", static_cast<long long>(v.steps[static_cast<size_t>(step)]),
                s.step < 0 ? " (the latest)" : "");
    if (s.step >= 0) {
        ImGui::SameLine();
        if (ImGui::SmallButton("follow the latest")) s.step = -1;
        if (d.rects) d.rects->mark("router_latest");
    }
    ImGui::SameLine();
    ImGui::TextDisabled("   click a step column to choose its step, a layer column its layer");

    // Experts × steps of the chosen layer, and experts × layers at the chosen step.
    const float avail = ImGui::GetContentRegionAvail().y;
    const float line = ImGui::GetTextLineHeightWithSpacing();
    const float heat_h = std::max(170.0f, avail * 0.40f);
    const float w = ImGui::GetContentRegionAvail().x;
    const int layer = s.layer;
    // A long run shows its last steps, two pixels a column at least (the lines below hold all).
    const float heat_w = w * 0.64f - 4;
    const int fit = std::max(16, static_cast<int>((heat_w - 230) / 2));
    const int first = std::max(0, S - fit), shown = S - first;
    plot::Heatmap by_step;
    by_step.rows = v.experts;
    by_step.cols = shown;
    by_step.title = "load of each expert in " + layer_name(v.layers[static_cast<size_t>(layer)]) +
                    " (slots over the even share)";
    by_step.x_label = "step";
    if (first > 0)
        by_step.title +=
            ", the last " + std::to_string(shown) + " of " + std::to_string(S) + " steps";
    by_step.first_col = static_cast<int>(v.steps[static_cast<size_t>(first)]);
    by_step.col_step = S > 1 ? std::max(1, static_cast<int>(v.steps[1] - v.steps[0])) : 1;
    by_step.colour = [&v, layer, first](int r, int c) {
        return load_colour(v.load(layer, r, first + c));
    };
    by_step.row_label = [](int r) { return "expert " + std::to_string(r); };
    by_step.legend = load_legend();
    plot::Heatmap by_layer;
    by_layer.rows = v.experts;
    by_layer.cols = L;
    by_layer.title = "every layer at step " +
                     std::to_string(static_cast<long long>(v.steps[static_cast<size_t>(step)]));
    by_layer.x_label = "layer (block)";
    by_layer.first_col = v.layers.front();
    by_layer.col_step = L > 1 ? std::max(1, v.layers[1] - v.layers[0]) : 1;
    by_layer.colour = [&v, step](int r, int c) { return load_colour(v.load(c, r, step)); };
    by_layer.row_label = [](int r) { return std::string("e").append(std::to_string(r)); };
    by_layer.legend = load_legend();
    const plot::HeatmapHit hs = plot::draw_heatmap("router_tokens", by_step, ImVec2(heat_w, heat_h),
                                                   s.expert, step - first);
    if (d.rects) d.rects->mark("router_tokens");
    ImGui::SameLine();
    const plot::HeatmapHit hl =
        plot::draw_heatmap("router_layers", by_layer, ImVec2(-1, heat_h), s.expert, layer);
    if (d.rects) d.rects->mark("router_layers");
    if (hs.clicked) {
        s.step = first + hs.col;
        s.expert = hs.row;
    }
    if (hl.clicked) {
        s.layer = hl.col;
        s.expert = hl.row;
    }
    // The hovered cell, else the chosen one.
    int hl_layer = layer, hl_expert = s.expert, hl_step = step;
    if (hs.row >= 0) hl_expert = hs.row, hl_step = first + hs.col;
    if (hl.row >= 0) hl_expert = hl.row, hl_layer = hl.col;
    if (hl_expert >= 0 && hl_expert < v.experts) {
        const size_t li = static_cast<size_t>(hl_layer), si = static_cast<size_t>(hl_step);
        ImGui::Text(
            "%s expert %d, step %lld: %.0f slots, %.1f%% of the kept (even %.1f%%), load %.2fx "
            "the even share; the layer dropped %.2f%%",
            layer_name(v.layers[li]).c_str(), hl_expert, static_cast<long long>(v.steps[si]),
            v.tokens[li][static_cast<size_t>(hl_expert)][si],
            100 * v.share(hl_layer, hl_expert, hl_step), 100.0 / v.experts,
            v.load(hl_layer, hl_expert, hl_step), 100 * v.drop_fraction[li][si]);
    } else {
        ImGui::TextDisabled("hover a cell for its slots; even share = 1/%d of the slots chosen",
                            v.experts);
    }

    // Per layer against step.
    const float plot_h = std::max(140.0f, (ImGui::GetContentRegionAvail().y - line * 0.5f) / 2);
    std::vector<plot::VMarker> marks;
    if (s.step >= 0) marks.push_back({v.steps[static_cast<size_t>(step)], "chosen", plot::kGrey});
    auto per_layer = [&](const char* title, const char* y_label,
                         const std::vector<std::vector<double>>& grid) {
        plot::LinePlot p;
        p.title = title;
        p.x_label = "step";
        p.y_label = y_label;
        p.markers = marks;
        for (int l = 0; l < L; l++)
            p.series.push_back({layer_name(v.layers[static_cast<size_t>(l)]), v.steps.data(),
                                grid[static_cast<size_t>(l)].data(), S,
                                layer_colour(static_cast<size_t>(l), static_cast<size_t>(L))});
        return p;
    };
    plot::LinePlot drop =
        per_layer("dropped fraction of the slots chosen (capacity)", "dropped", v.drop_fraction);
    plot::LinePlot balance =
        per_layer("balance E * sum f_i P_i (1: balanced)", "balance", v.balance);
    balance.hlines.push_back({1.0, "balanced", plot::kGrey});
    plot::LinePlot entropy = per_layer("router entropy (nats)", "entropy", v.entropy);
    // ln E as a flat series, so that its label is in the legend rather than under it.
    char uniform[48];
    std::snprintf(uniform, sizeof uniform, "uniform: ln %d = %.3f", v.experts, v.uniform_entropy());
    const std::vector<double> flat(static_cast<size_t>(S), v.uniform_entropy());
    entropy.series.push_back({uniform, v.steps.data(), flat.data(), S, plot::kGrey});
    plot::LinePlot losses =
        per_layer("aux loss (left axis) and z loss (right axis, fainter)", "aux loss", v.aux_loss);
    for (size_t l = 0; l < static_cast<size_t>(L); l++) {
        losses.series[l].label += " aux";
        plot::Series z = losses.series[l];
        z.label = layer_name(v.layers[l]) + " z";
        z.y = v.z_loss[l].data();
        z.colour = (z.colour & 0x00FFFFFF) | (150u << 24);
        z.right_axis = true;
        losses.series.push_back(z);
    }
    losses.y2_label = "z loss";
    plot::draw_lines("router_drop", drop, s.drop_view, ImVec2(w * 0.5f - 4, plot_h));
    if (d.rects) d.rects->mark("router_drop");
    ImGui::SameLine();
    plot::draw_lines("router_balance", balance, s.balance_view, ImVec2(-1, plot_h));
    if (d.rects) d.rects->mark("router_balance");
    plot::draw_lines("router_entropy", entropy, s.entropy_view, ImVec2(w * 0.5f - 4, plot_h));
    if (d.rects) d.rects->mark("router_entropy");
    ImGui::SameLine();
    plot::draw_lines("router_losses", losses, s.loss_view, ImVec2(-1, plot_h));
    if (d.rects) d.rects->mark("router_losses");
}

}  // namespace px::gui
