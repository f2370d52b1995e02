// A job's state as numpy arrays (state.cpp says when they are views and when copies).
//
// Index
//   What             weights, the last step's gradients, Adam's first and second moments
//   logical_tensors  {name: array} of the whole model, in GPT-2 names and shapes
//   rank_view        one rank's coordinates, layers and own pieces (views)
//   shard_map        per rank and tensor: which slice of the logical tensor it holds
#pragma once
#include "bindings/common.h"

namespace px::py_bind {

enum class What { weights, grads, adam_m, adam_v };
const char* what_name(What w);  // "weights", "grads", "adam_m", "adam_v"

// The run must be paused or finished. `owner` is the Python object that keeps the run alive: the
// base of every view.
py::dict logical_tensors(SteppedRun& run, What what, const py::handle& owner);
py::dict rank_view(SteppedRun& run, int rank, const py::handle& owner);
py::list shard_map(SteppedRun& run);

}  // namespace px::py_bind
