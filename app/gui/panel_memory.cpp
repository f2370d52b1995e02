// Memory and communication: each rank's bytes, stacked by what they hold (parameters,
// gradients, optimizer state, activations, buffers), against the estimate the job was admitted
// by (core/train/memory.h, which follows the ZeRO formulas); bytes and time per collective and
// group, measured (CommTrace over the ranks' communication accounting). A live job's memory per
// rank is the trace's (every world rank after its step, whatever the layout); a file's is its
// snapshot's (rank 0 at the run's end).
#include "app/gui/panels.h"

#include "core/base/error.h"
#include "core/train/memory.h"

#include <imgui.h>

#include <map>

namespace px::gui {

plot::StackedBars memory_bars(const std::vector<MemoryStats>& ranks, const MemoryEstimate& est,
                              const std::string& rank_prefix) {
    plot::StackedBars b;
    b.parts = {"parameters", "gradients", "optimizer state", "activations", "buffers, tables"};
    b.colours = {plot::kBlue, plot::kOrange, plot::kGreen, plot::kPurple, plot::kGrey};
    b.reference_label = "estimate (total)";
    b.format = [](double v) { return format_bytes(v); };
    if (!est.items.empty()) {
        std::vector<double> parts(5, 0.0);
        for (const MemoryItem& it : est.items) {
            size_t k = 4;
            if (it.what == "weights") k = 0;
            if (it.what == "gradients") k = 1;
            if (it.what == "AdamW moments") k = 2;
            if (it.what == "activations") k = 3;
            parts[k] += it.bytes;
        }
        b.categories.push_back("estimate");
        b.values.push_back(parts);
        b.reference.push_back(-1);
    }
    for (size_t r = 0; r < ranks.size(); r++) {
        const MemoryStats& m = ranks[r];
        b.categories.push_back(rank_prefix + std::to_string(r));
        b.values.push_back({static_cast<double>(m.params), static_cast<double>(m.grads),
                            static_cast<double>(m.optimizer), static_cast<double>(m.activations),
                            static_cast<double>(m.comm)});
        b.reference.push_back(est.items.empty() ? -1 : est.total);
    }
    return b;
}

void draw_memory_panel(const RunData& d, MemoryPanelState&) {
    const std::vector<MemoryStats> mem = d.trace ? d.trace->memory() : d.snap.memory;
    MemoryEstimate est;
    try {
        est = estimate_memory(d.config, MemoryScope::one_rank);
    } catch (const Error&) {
    }
    const float h = ImGui::GetContentRegionAvail().y;
    if (mem.empty()) {
        empty_state("no job yet: memory per rank shows once a step has run");
    } else {
        plot::StackedBars b = memory_bars(mem, est, "rank ");
        b.title = d.source == "live job"
                      ? "memory per rank after the last step, beside the estimate per rank the "
                        "job was admitted by (core/train/memory.h: the ZeRO formulas)"
                      : "rank 0's memory at the run's end, as its run file keeps it, beside the "
                        "estimate per rank the job was admitted by (core/train/memory.h)";
        b.y_label = "bytes";
        plot::draw_stacked_bars("memory", b, ImVec2(-1, h * 0.5f));
        if (d.rects) d.rects->mark("memory_plot");
    }
    if (!est.items.empty()) {
        std::string line = "estimate per rank:";
        for (const MemoryItem& it : est.items)
            if (it.bytes > 0) line += "  " + it.what + " " + format_bytes(it.bytes);
        ImGui::TextWrapped("%s", line.c_str());
    }
    ImGui::Separator();
    if (!d.trace) {
        empty_state("no communication measured: it shows while a job runs");
        return;
    }
    // Per group and collective, summed over the ranks.
    struct Sum {
        i64 calls = 0, bytes = 0;
        double seconds = 0;
        int ranks = 0;
    };
    std::map<std::pair<std::string, std::string>, Sum> sums;
    for (const comm::StatRow& r : d.trace->stat_rows()) {
        Sum& s = sums[{r.group, r.op}];
        s.calls += r.calls;
        s.bytes += r.bytes_sent + r.bytes_recv;
        s.seconds += r.seconds;
        s.ranks++;
    }
    if (sums.empty()) {
        empty_state("no collectives: a single device sends nothing");
        return;
    }
    if (ImGui::BeginTable(
            "comm", 6, ImGuiTableFlags_RowBg | ImGuiTableFlags_Borders | ImGuiTableFlags_ScrollY)) {
        for (const char* c : {"group", "collective", "calls (all ranks)", "bytes sent + received",
                              "seconds (all ranks)", "ranks"})
            ImGui::TableSetupColumn(c);
        ImGui::TableHeadersRow();
        for (const auto& [key, s] : sums) {
            ImGui::TableNextRow();
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(key.first.c_str());
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(key.second.c_str());
            ImGui::TableNextColumn();
            ImGui::Text("%lld", static_cast<long long>(s.calls));
            ImGui::TableNextColumn();
            ImGui::TextUnformatted(format_bytes(static_cast<double>(s.bytes)).c_str());
            ImGui::TableNextColumn();
            ImGui::Text("%.3f", s.seconds);
            ImGui::TableNextColumn();
            ImGui::Text("%d", s.ranks);
        }
        ImGui::EndTable();
    }
}

}  // namespace px::gui
