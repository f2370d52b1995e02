// One rank's local state as pieces of the logical checkpoint, which every rank writes into its
// own hyperslab (docs/files.md): where the rank's weights and Adam moments sit in /model/<name>,
// /optim/m/<name> and /optim/v/<name>, which of them it writes so that every logical element is
// written by exactly one rank of the world, and which it reads back on resume. Nothing here
// communicates, and no rank ever holds more than its own arrays plus one piece of staging.
//
// Index
//   StatePiece        a run of a local array that is one 2-D slab of one logical tensor
//   state_pieces      the pieces of local floats [lo, hi) of a model's (tp shard's, stage's) table
//   RankState         one rank's arrays and its shares: what it writes, what it reads
//   replica_state     the RankState of a replica's ZeRO cut (Job::rank_state adds tp and pp)
//   SliceStats        what a transfer moved: pieces, floats, the largest staging buffer
//   write_rank_state  a rank's pieces into a CheckpointWriter (write(): 2-D hyperslabs)
//   read_rank_state   a rank's pieces from a CheckpointReader (hyperslab reads)
//
// Local arrays. A rank's weights, gradients and moments are flat arrays laid out by its model's
// ParamTable: the whole model, a pipeline stage's part, or the tp shard of either (tp_model.h:
// the whole model's names and ids, local shapes). A tp shard of a tensor is a product of row
// ranges and column ranges of the logical tensor (TpLayers::row_split / col_split):
//   column-parallel rows (c_fc, and qkv's three row blocks of the rank's heads), row-parallel
//   column blocks (attn.c_proj, mlp.c_proj), vocabulary rows of wte, column ranges of the
//   column-parallel biases; everything else is replicated (LayerNorms, wpe, row-parallel biases).
// An expert-parallel part (expert_parallel.h) holds rows [expert_lo·R, (expert_lo + EL)·R) of each
// stacked expert tensor (E·R, cols). A ZeRO shard (zero.h) is a flat range [lo, hi) of that local array, cut on block edges; it may
// start and end inside a row. The pieces of a flat range are therefore: per column range, the
// partial first row, the whole rows between, the partial last row, each cut at the row ranges'
// edges. A piece is one 2-D slab of the logical tensor (a 1-D tensor is one row), and its rows
// lie `stride` floats apart in the local array (stride = its width when contiguous).
//
// Who writes what (each logical element exactly once over the world):
//   dp   replica d of D writes local floats [c_d, c_{d+1}), c = zero_shard_edges(table, D,
//        numerics.block): its ZeRO shard (ZeRO-1/2/3: exactly the moments it holds, and under
//        ZeRO-3 the weights), and without ZeRO a share of the replicated state, so the replicas
//        split the I/O instead of one writing it all;
//   tp   a tp-sharded tensor by every tp rank (its own elements); a replicated one only by tp
//        rank (tensor id mod tp), which spreads the small tensors over the group;
//   ep   (no ZeRO) the replicated tensors by dp rank 0, a stacked expert tensor's rows by the
//        first ep group (dp ranks 0 .. ep-1, each its own experts);
//   pp   a tensor by the stage that owns it: the tied wte by the first stage (the last stage's
//        copy holds the same bits and is read back, not written).
// Who reads what: every rank reads exactly the local elements it holds between steps, whatever
// the layout that wrote the file: its weights (ZeRO-3: its shard; else its whole local array)
// and its moments [opt.lo, opt.hi), replicated and tied tensors included.
#pragma once
#include "core/io/checkpoint.h"
#include "core/model/model.h"
#include "core/model/optimizer.h"
#include "core/parallel/tree_exchange.h"

#include <vector>

namespace px {

struct StatePiece {
    int entry = 0;   // index in the local table
    int id = 0;      // tensor id in the whole model's table (its name names the datasets)
    i64 local = 0;   // the piece's first element in the local array (table offsets)
    i64 stride = 0;  // local floats from the start of one of its rows to the next
    Slab slab;       // where it lies in the logical tensor, seen as (rows, cols)
    bool contiguous() const { return slab.rows == 1 || stride == slab.cols; }
};

// The pieces of local floats [lo, hi) of model's table (padding between tensors holds none),
// entries in table order; `only` (per local entry), when given, keeps the entries marked.
std::vector<StatePiece> state_pieces(const GPT& model, Range floats,
                                     const std::vector<char>* only = nullptr);

// One rank's arrays and its shares of the logical state (Job::rank_state builds it).
struct RankState {
    const GPT* model = nullptr;  // the local table and, under tp, its TpLayers
    float* params = nullptr;     // the weight array, laid out by model->table()
    float* m = nullptr;          // Adam moments of local floats [moments.lo, moments.hi)
    float* v = nullptr;
    Range moments;                   // the moments held: [opt.lo, opt.hi)
    Range weights;                   // the weights held between steps (ZeRO-3: the shard; else all)
    Range writes;                    // the local floats this rank writes (inside both ranges above)
    std::vector<char> writes_entry;  // per local entry: this rank writes its part of `writes`
};

// The part of a RankState that every rank has: the model's arrays and moments, and
// replica dp_rank's cut of the ZeRO shard edges as what it writes (without ZeRO the replicas split
// the writing the same way); under ZeRO-3 it holds only those weights. writes_entry is left to
// the caller (which tensors this rank writes over tp and pp), all 1.
RankState replica_state(const GPT& model, float* params, const AdamW& opt, int dp_size, int dp_rank,
                        bool zero3);

struct SliceStats {
    i64 pieces = 0;         // hyperslabs moved (each of /model, /optim/m, /optim/v counts)
    i64 floats = 0;         // floats moved
    i64 staging_bytes = 0;  // the largest staging buffer (a non-contiguous piece), 0 if none
};

// Writes this rank's pieces of /model, /optim/m and /optim/v (CheckpointWriter::write). HDF5 is
// not thread-safe: in-process ranks call it one at a time.
SliceStats write_rank_state(CheckpointWriter& w, const RankState& s);
// Reads this rank's pieces from a checkpoint of the same model into s.params (weights held) and
// s.m, s.v (moments held). The hyperslabs are not verified here: the rank that chose the file
// verified every checksum (RunCheckpoints). One thread at a time, as above.
SliceStats read_rank_state(const CheckpointReader& r, const RankState& s);

}  // namespace px
