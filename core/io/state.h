// The logical state of a run: the unsharded weights, Adam moments and per-step metrics that every
// layout must reproduce bit for bit (docs/numerics.md), and the dump file that holds them.
//
// Index
//   LogicalState   flat weights and moments laid out as the full model's ParamTable
//   begin_part, put  a rank's part, tensor by tensor (core/train/job.h absorb)
//   absorb         another process's LogicalState (the parts it absorbed)
//   serialize      a LogicalState as words for a communicator; deserialize reads them back
//   gather_state   every rank's LogicalState merged on rank 0 (one process per rank, MPI)
//   write_dump     the state as HDF5, for comparing two runs with h5py
//
// Dump layout (all little-endian; tensor shapes as in GPT-2, e.g. wte (V,C)):
//   /weights/<name>, /adam/m/<name>, /adam/v/<name>   float32
//   /steps/step (int64 as float64), /steps/loss, /steps/grad_norm, /steps/val_loss (-1: none)
//   root attribute `config`: the job's TOML
#pragma once
#include "core/base/arena.h"
#include "core/comm/comm.h"
#include "core/base/metrics.h"

#include <string>
#include <vector>

namespace px {

struct LogicalState {
    ParamTable table;
    std::vector<float> params, m, v;
    std::vector<StepMetrics> history;

    // The whole model's table of mc, with weights and moments all zero (and the history left as
    // it is): what a state is filled into.
    void allocate(const ModelConfig& mc);

    // A rank's part (core/train/job.h absorb(state, job) hands each of its tensors here): on
    // the first call the whole model's table of mc is allocated and `hist` kept; later calls
    // return false when their history differs.
    bool begin_part(const ModelConfig& mc, const std::vector<StepMetrics>& hist);
    // n elements of tensor `id` at the logical flat indices idx (null: 0 .. n-1): weights w and,
    // when m and v are given, their Adam moments. Returns false when an element is held already
    // with other bits (replicas, replicated tensors, the two stages' wte must agree).
    bool put(int id, i64 n, const i64* idx, const float* w, const float* m, const float* v);
    // Whether every element of the whole model has been absorbed from some rank.
    bool complete() const;
    // Another rank's state (a process under MPI): the elements it holds replace these, and
    // returns false when an element both hold, or the histories, differ. Empty states are no-ops.
    bool absorb(const LogicalState& other);

    // Everything absorb(const LogicalState&) needs, as words (with a magic number and a
    // version); deserialize rebuilds the table from the model config and throws DataError on
    // words it cannot read.
    std::vector<i64> serialize() const;
    static LogicalState deserialize(const std::vector<i64>& words, const ModelConfig& mc);

private:
    void init_masks();
    std::vector<char> has_w_;   // per logical element: this state holds its weight
    std::vector<char> has_mv_;  // per logical element: this state holds its Adam moments
    std::vector<char> filled_;  // per logical element: absorbed from some job
};

// Collective over `world`: rank 0's state becomes the merge of every rank's (sent to it point to
// point, one rank at a time); the others' are left as they are. Returns false on rank 0 when two
// ranks disagree on an element or a history (a bug in Parallax); true elsewhere.
bool gather_state(LogicalState& state, comm::Communicator& world, const ModelConfig& mc);

void write_dump(const std::string& path, const LogicalState& state, const Config& cfg);

}  // namespace px
