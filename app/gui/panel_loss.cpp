// Loss: training and validation loss against step, the source's entropy floor as a line, the
// gradient norm and learning rate below it; log scale, zoom, pan and hover from the plot module.
// Events are markers (spikes red, the rest grey); a click shows the event, a spike's evidence.
#include "app/gui/panels.h"

#include <imgui.h>

#include <cmath>
#include <vector>

namespace px::gui {

void draw_loss_panel(const RunData& d, LossPanelState& s) {
    const MetricColumns& m = d.snap.metrics;
    if (m.size() == 0) {
        empty_state(d.snap.state == RunState::not_started
                        ? "no job yet: press Start (or open a run.h5) to see its loss"
                        : "no step finished yet");
    }
    std::vector<double> x(m.step.begin(), m.step.end());
    std::vector<double> val(m.val_loss);
    for (double& v : val)
        if (v < 0) v = NAN;  // steps without evaluation
    ImGui::Checkbox("log scale", &s.log_y);
    ImGui::SameLine();
    ImGui::TextDisabled("wheel: zoom x (shift: y), drag: pan, double-click: fit");
    int spikes = 0;
    for (const RunEvent& e : d.snap.events) spikes += e.kind == EventKind::spike;
    ImGui::SameLine();
    if (d.config.spikes.action == "off")
        ImGui::TextDisabled("| spikes: not watched (spikes.action = \"off\")");
    else
        ImGui::TextDisabled("| spikes: %d marked red, click one for its evidence", spikes);
    s.loss_view.log_y = s.log_y;
    plot::LinePlot p;
    p.title = "loss (nats/token)";
    p.x_label = "step";
    p.y_label = "loss";
    const int n = static_cast<int>(x.size());
    p.series.push_back({"train loss", x.data(), m.loss.data(), n, plot::kBlue});
    p.series.push_back({"validation loss", x.data(), val.data(), n, plot::kOrange, true});
    if (d.snap.loss_floor > 0)
        p.hlines.push_back(
            {d.snap.loss_floor,
             "loss floor (source entropy) " + std::to_string(d.snap.loss_floor).substr(0, 6),
             plot::kGreen});
    for (const RunEvent& e : d.snap.events)
        p.markers.push_back({static_cast<double>(e.step), event_kind_name(e.kind),
                             e.kind == EventKind::spike ? plot::kRed : plot::kGrey});
    const float h = ImGui::GetContentRegionAvail().y;
    const int clicked = plot::draw_lines("loss", p, s.loss_view, ImVec2(-1, h * 0.62f));
    if (d.rects) d.rects->mark("loss_plot");
    if (clicked >= 0) s.selected_event = clicked;
    plot::LinePlot q;
    q.title = "gradient norm (before clipping) and learning rate";
    q.x_label = "step";
    q.y_label = "grad norm";
    q.y2_label = "learning rate";
    q.series.push_back({"grad norm", x.data(), m.grad_norm.data(), n, plot::kPurple});
    plot::Series lr{"learning rate", x.data(), m.lr.data(), n, plot::kGreen};
    lr.right_axis = true;
    q.series.push_back(lr);
    const float rest = ImGui::GetContentRegionAvail().y -
                       (s.selected_event >= 0 ? ImGui::GetTextLineHeightWithSpacing() * 2 : 0);
    plot::draw_lines("norm", q, s.norm_view, ImVec2(-1, rest));
    if (s.selected_event >= 0 && s.selected_event < static_cast<int>(d.snap.events.size())) {
        const RunEvent& e = d.snap.events[static_cast<size_t>(s.selected_event)];
        ImGui::TextWrapped("step %lld, %s: %s", static_cast<long long>(e.step),
                           event_kind_name(e.kind), e.message.c_str());
    }
}

}  // namespace px::gui
