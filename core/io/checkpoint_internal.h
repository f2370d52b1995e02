// What the checkpoint's files share: core/io/checkpoint.cpp (checksum, names, meta, selections),
// checkpoint_write.cpp (the writer), checkpoint_read.cpp (the reader). Not for users of
// checkpoints: core/io/checkpoint.h is.
//
// Index
//   meta_checksum    checksum_bytes of every meta attribute as one text, in a fixed order
//   kHistoryFields   the float64 columns of /history, each with its StepMetrics field
//   tensor_shape     a tensor's dataset shape: (rows, cols), or (cols) for a vector
//   select_slab      adds a slab of a 1-D or 2-D dataspace to its selection (set or or)
//   select_range     selects a flat range [first, first+count) of a (R, C) dataspace
#pragma once
#include "core/io/checkpoint.h"

#include <hdf5.h>

#include <cstdint>
#include <vector>

namespace px::ckpt {

std::uint64_t meta_checksum(const CheckpointMeta& m, std::int64_t version);
// "3,7,12": the skipped batches as /data skipped_batches holds them.
std::string join_batches(const std::vector<i64>& b);

// The history as columns: /history/step (int64) and one float64 dataset per field.
struct HistoryField {
    const char* name;
    double StepMetrics::*field;
};
inline constexpr HistoryField kHistoryFields[] = {
    {"loss", &StepMetrics::loss},
    {"val_loss", &StepMetrics::val_loss},
    {"grad_norm", &StepMetrics::grad_norm},
    {"lr", &StepMetrics::lr},
    {"tokens_per_s", &StepMetrics::tokens_per_s},
    {"step_ms", &StepMetrics::step_ms},
    {"comm_bytes", &StepMetrics::comm_bytes},
};

inline std::vector<i64> tensor_shape(const TableEntry& e) {
    return e.shape();
}

// rank 1: the slab's columns of the one row; op is H5S_SELECT_SET or H5S_SELECT_OR.
bool select_slab(hid_t fspace, H5S_seloper_t op, int rank, const Slab& s);
bool select_range(hid_t fspace, int rank, i64 C, i64 first, i64 count);

}  // namespace px::ckpt
