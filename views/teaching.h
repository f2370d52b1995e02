// The schedule and numerics explorers' models (teaching views that need no job). Both call the
// runtime's own code: the pipeline schedules and their simulation
// (core/parallel/pipeline/schedule.h), and the canonical tree, its distributed form and the
// communicator's ring all-reduce (core/base/numerics.h, core/parallel/tree_exchange.h, core/comm).
//
// Index
//   ScheduleModel     make(kind, pp, microbatches, v): the plan, its simulation, the bubble
//   bubble_formula    (pp-1)/(v·m + pp-1)
//   bubble_rate_formula  idle per work at F = B = W: 1F1B (pp-1)/m, ZB-H1 (pp-1)/(3m), ...
//   compute_label     "F3", "B0", and with v > 1 the chunk as a letter: "F3b"
//   SumRow, NumericsModel   one reduction summed in several orders, against the canonical tree
#pragma once
#include "core/base/shapes.h"
#include "core/parallel/pipeline/schedule.h"
#include "core/parallel/tree_exchange.h"

#include <string>
#include <vector>

namespace px::views {

struct ScheduleModel {
    std::string kind = "1f1b";
    int pp = 4, microbatches = 8, virtual_stages = 1;
    Schedule schedule;
    SimResult sim;  // at F = B = W = one slot (kUnitFBW)
    std::string error;  // the library's message when the combination is impossible
    // Rebuilds from the fields above (error set, schedule empty, when it cannot be made).
    void make();
};

// The idle fraction of GPipe and 1F1B with unit forward and backward, and of interleaved 1F1B
// with v chunks: (pp - 1) / (v·m + pp - 1).
double bubble_formula(int pp, int microbatches, int virtual_stages);

// Idle time per unit of work, as the papers state each schedule's bubble with F = B = W (a
// whole backward 2): GPipe and 1F1B (pp-1)/m, interleaved (pp-1)/(v·m), ZB-H1 (pp-1)/(3m), ZBV
// (pp-1)/(6m) (its chunks are half a stage; the first microbatch's way down the V; m >= pp).
double bubble_rate_formula(const std::string& kind, int pp, int microbatches, int virtual_stages);

std::string compute_label(const Action& a, int virtual_stages);

struct SumRow {
    std::string how;  // "canonical tree, one device", "ring all_reduce over 3 ranks", ...
    float value = 0;
    bool canonical = false;        // an order of the canonical contract
    std::int64_t ulp_vs_tree = 0;  // ULPs from the one-device canonical sum
    double error_vs_exact = 0;     // |value - the fp64 sum|
};

struct NumericsModel {
    int n = 768, block = 64, seed = 1;
    std::vector<float> x;
    std::vector<SumRow> rows;
    double exact = 0;                       // the sum in fp64, sequential (the error reference)
    int split = 3;                          // ranks whose nodes the tree view shows
    std::vector<std::vector<Range>> nodes;  // per rank: its maximal nodes at `split` ranks
    void make();                            // draws x and fills the rows
};

}  // namespace px::views
