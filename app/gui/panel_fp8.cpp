// FP8 and spikes: amax and scale histories, saturation and underflow, the alert and spike
// lists. The FP8 data comes from the FP8 drift monitor, which this build does not have yet: the
// panel says so in one line, and lists the run's alerts (fault events) meanwhile. The spikes'
// half is panel_spikes.cpp. It never shows made-up data.
#include "app/gui/panels.h"

#include <imgui.h>

namespace px::gui {

void draw_fp8_panel(const RunData& d, Fp8PanelState& s) {
    const std::string precision = d.config.precision.activations;
    ImGui::TextUnformatted("FP8 amax / scale histories, saturation and underflow");
    empty_state(("no FP8 tensors in this run: precision.activations is " + precision +
                 " (FP8 recipes and the drift monitor have not landed)")
                    .c_str());
    ImGui::Spacing();
    draw_spike_section(d, s.spikes);
    ImGui::Spacing();
    ImGui::TextUnformatted("Alerts");
    int n = 0;
    for (const RunEvent& e : d.snap.events)
        if (e.kind == EventKind::fault || e.kind == EventKind::failure) {
            ImGui::BulletText("step %lld, %s: %s", static_cast<long long>(e.step),
                              event_kind_name(e.kind), e.message.c_str());
            n++;
        }
    if (n == 0) empty_state("no alerts in this run");
}

}  // namespace px::gui
