// The spike half of the FP8-and-spikes panel, as data (core/train/spikes.h): the per-layer
// evidence of every step as series by layer group, the spike events, and one step's evidence
// as a table. Made from a RunSnapshot (a live job's or an opened run file's), so the drawing
// only draws.
//
// Index
//   SpikeModel        steps, layer groups, per-group series of each kind, z-scores, spikes
//   spike_model       from a snapshot's named values and events
//   EvidenceRow       one layer group's evidence at one step
//   evidence_at       the table of a step
//   EventLine, fold_events   the Events panel's lines: repeats of a step's event folded
#pragma once
#include "core/train/job_view.h"

#include <map>
#include <string>
#include <vector>

namespace px::views {

struct SpikeModel {
    std::vector<double> steps;        // steps with evidence, ascending
    std::vector<std::string> groups;  // "embed", "h.0", ..., "ln_f", in model order
    // kind ("grad_norm", "update_ratio", "adam_eps_ratio", "attn_logit_max") -> per group, a
    // value per step (NaN where a step has none: a skipped update's eps ratio, an embedding's
    // logit).
    std::map<std::string, std::vector<std::vector<double>>> series;
    std::vector<double> loss_z, grad_norm_z;  // per step (+inf recorded as 1e300)
    std::vector<RunEvent> spikes;             // the spike events, in order
    bool empty() const { return steps.empty(); }
    // The index of a group in `groups`, -1 if none.
    int group(const std::string& name) const;
};
SpikeModel spike_model(const RunSnapshot& s);

struct EvidenceRow {
    std::string group;
    double grad_norm = 0, grad_norm_ratio = 0;  // and against its median over the window before
    double update_ratio = 0, adam_eps_ratio = 0, attn_logit_max = 0;  // NaN: none
};
// Every group's evidence at a spike: the values its event carries (the first run's: a rollback
// replaces the step's rows), else the step's series; the ratio is against the median of the
// `window` steps before it. Empty when there is none.
std::vector<EvidenceRow> evidence_at(const SpikeModel& m, const RunEvent& spike, int window);
// One kind's value per group in a spike's evidence (NaN where it has none), for the plot.
std::vector<double> spike_values(const SpikeModel& m, const RunEvent& spike, const std::string& kind);

// One line of the Events panel: a run of events of one kind at one step (a step re-run again
// and again, a step's many alerts) folded into one, "step 31 rerun ×12".
struct EventLine {
    i64 step = 0;
    EventKind kind = EventKind::fault;
    int count = 1;            // events folded into this line
    std::string first, last;  // the first one's message and the last one's ("" when count 1)
    int index = 0;            // of the first in the snapshot's events
};
// Consecutive events with the same step and kind become one line; order is kept.
std::vector<EventLine> fold_events(const std::vector<RunEvent>& events);

}  // namespace px::views
