// The router panel's model: a mixture-of-experts run's router statistics (core/train/job.h
// router_values: named values moe.h.<l>.* of every step, from the live job or an opened run.h5)
// arranged for drawing, with no window: the MoE layers and experts found in the names, each
// layer's series by step, and each expert's load against the even share.
//
// Index
//   RouterName         one parsed value name: layer, statistic, expert
//   parse_router_name  "moe.h.3.tokens.5" -> {3, "tokens", 5}; false for other names
//   RouterView         layers, experts, steps, per-layer series, tokens, loads
//   make_router_view   from a snapshot's named values
//   update_router_view appends a grown snapshot's new steps (a live job's), else makes it anew
//   router_empty_state the panel's sentence when there is nothing to draw ("" when there is)
#pragma once
#include "core/base/config.h"
#include "core/train/job_view.h"

#include <memory>
#include <string>
#include <vector>

namespace px::views {

struct RouterName {
    int layer = -1;    // the model's block index l of moe.h.<l>
    std::string stat;  // drop_fraction, balance, aux_loss, z_loss, router_entropy, tokens
    int expert = -1;   // tokens only
};
bool parse_router_name(const std::string& name, RouterName* out);

struct RouterView {
    std::vector<int> layers;    // MoE layers' block indices, ascending
    int experts = 0;            // E: one more than the largest expert index seen
    std::vector<double> steps;  // steps with router values, ascending
    // [layer index][step index]; NaN where a step has no value.
    std::vector<std::vector<double>> drop_fraction, balance, aux_loss, z_loss, entropy;
    // [layer index][expert][step index]: slots the expert kept (after capacity).
    std::vector<std::vector<std::vector<double>>> tokens;

    bool empty() const { return steps.empty(); }
    int layer_index(int block) const;  // index into `layers`, -1: not a MoE layer here
    double uniform_entropy() const;    // ln E, the router's entropy when it is uniform
    // Expert e's slots over the even share of the slots the router chose (kept and dropped):
    // tokens_e · E / (Σ tokens / (1 - drop_fraction)); 1 is an even share. NaN: no value.
    double load(int layer, int expert, int step) const;
    double share(int layer, int expert, int step) const;  // of the kept slots, 1/E when even
    int step_index(double step) const;  // of the step, else of the last one before it; -1 none

    std::size_t seen = 0;  // the snapshot's StepValues it was made from
    std::shared_ptr<const std::vector<NamedValue>> last;  // the last of them, to know it again
};

RouterView make_router_view(const RunSnapshot& s);
// Brings `v` up to `s`: when `s` holds the values `v` was made from and more (a live job's next
// steps, the same layers and experts), only the new steps are read; otherwise (a re-run, another
// run, an opened file, a layer or expert not seen before) it is made anew. True when it changed.
bool update_router_view(RouterView& v, const RunSnapshot& s);

// Why the router panel has nothing to draw, as a sentence ("" when it has): a dense model, a
// MoE run before its first step, a run file without router statistics. `cfg` is the run's
// config (the editor's before a job starts).
std::string router_empty_state(const RouterView& v, const Config& cfg, RunState state);

}  // namespace px::views
