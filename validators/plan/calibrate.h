// Fitting a cluster file to measured runs (docs/planner.md, --calibrate): the run files of
// training runs (core/io/runfile.h: the config, step_ms and comm_bytes per step) give the
// achievable fraction of the compute peak, and, from two or more runs of which some
// communicated, the links' bandwidth too (one run cannot tell slow links from slow compute).
//
// Index
//   RunFit       one run: what it measured, what the plan predicts before and after the fit
//   Calibration  the fitted values and the runs
//   calibrate    fits; ConfigError/px::Error naming the file when a run file cannot serve
//   apply        the cluster with the fitted values
//   text         what was fitted, for people
#pragma once
#include "validators/plan/cluster.h"

#include <string>
#include <vector>

namespace px::plan {

struct RunFit {
    std::string path, layout;
    int steps = 0;                // timed steps (the first is left out: warm-up)
    double measured_s = 0;        // the median step time
    double before_s = 0, after_s = 0;  // predicted with the file's values, and the fitted ones
    double comm_bytes = 0;        // measured: rank 0's bytes sent per step (median)
    double predicted_comm_bytes = 0;  // step_traffic's for rank 0
};

struct Calibration {
    double achievable = 0;     // fitted fraction of the compute peak
    bool bandwidth = false;    // whether the links were fitted too
    double link_scale = 1;     // the links' bandwidth × this (NVLink and IB alike)
    std::vector<RunFit> runs;
};

Calibration calibrate(const ClusterSpec& cluster, const std::vector<std::string>& run_files);
ClusterSpec apply(const ClusterSpec& cluster, const Calibration& c);
std::string text(const ClusterSpec& cluster, const Calibration& c);

}  // namespace px::plan
