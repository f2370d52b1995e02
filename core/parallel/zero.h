// ZeRO over a data-parallel group (DESIGN.md §3): the flat parameter arena is cut into one
// contiguous shard per dp rank, and each rank keeps and updates only its shard of
//   ZeRO-1  the optimizer state                       (gradients all-reduced, weights all-gathered)
//   ZeRO-2  + the gradients                           (reduce-scatter instead of all-reduce)
//   ZeRO-3  + the weights between steps               (all-gathered before use, released after)
//
// Shard edges fall on the canonical blocks of the tensors (numerics.block elements from each
// tensor's start), so every block of a gradient has one owner. The global gradient norm is then
// exact under sharding: owners compute the sequential sums of their blocks, exchange them, and
// every rank forms the same per-tensor trees as the single device (DESIGN.md §2.1: "subtrees
// that cross shards combine after the exact partials are exchanged").
//
// Index
//   zero_shard_edges           dp+1 cuts of a (whole or stage) parameter table on block edges
//   reduce_scatter_cut         reduce-scatter of a segment cut into uneven pieces
//   ZeroShards                 the shard edges of a model over dp ranks
//   reduce_scatter_grads       ZeRO-2/3: this rank's shard of the whole batch's gradient
//   combine_tied               dwte = embedding + LM head, on this rank's shard only
//   grad_norm                  the global norm from sharded gradients, bit-identical to unsharded
//   all_gather_params          every rank gets every shard of the weights
//   release_params             ZeRO-3: drop the weights this rank does not own
#pragma once
#include "core/arena.h"
#include "core/comm/comm.h"
#include "core/model.h"

#include <vector>

namespace px {

// Cuts of [0, t.total) into dp shards: t.total·r/dp moved up to the next canonical block boundary
// of the tensor it falls in, so no block of a tensor straddles two shards.
std::vector<i64> zero_shard_edges(const ParamTable& t, int dp, int block);

// seg[0, n) cut at `cuts` (group size + 1 of them): afterwards this rank's piece holds the sum
// over the group, the rest is stale. Pieces are padded to the largest so the collective sees
// equal chunks; with Algo::canonical chunk r is bit for bit chunk r of the all-reduce.
// `staging` and `piece` are scratch the caller may keep between calls.
void reduce_scatter_cut(comm::Communicator& dp, float* seg, const std::vector<i64>& cuts,
                        comm::Algo algo, std::vector<float>& staging, std::vector<float>& piece);

class ZeroShards {
public:
    ZeroShards(const GPT& model, int dp, int rank);

    int size() const { return static_cast<int>(edges_.size()) - 1; }
    i64 lo(int r) const { return edges_[static_cast<size_t>(r)]; }
    i64 hi(int r) const { return edges_[static_cast<size_t>(r) + 1]; }
    i64 lo() const { return lo(rank_); }
    i64 hi() const { return hi(rank_); }

    // grads: a GradLayout buffer holding this rank's partial (its node of the token tree).
    // Afterwards its shard [lo, hi), and the LM-head entries that shadow the shard's part of wte,
    // hold the canonical sum over ranks; the rest is stale.
    void reduce_scatter_grads(comm::Communicator& dp, float* grads, comm::Algo algo);
    void combine_tied(float* grads) const;
    float grad_norm(comm::Communicator& dp, const float* grads, comm::Algo algo) const;
    void all_gather_params(comm::Communicator& dp, float* params) const;
    void release_params(float* params) const;
    i64 staging_bytes() const {
        return static_cast<i64>((staging_.capacity() + piece_.capacity()) * sizeof(float));
    }

private:
    const GPT& model_;
    int rank_;
    std::vector<i64> edges_;       // dp+1 cuts of [0, table.total)
    std::vector<i64> head_edges_;  // dp+1 cuts of the LM-head region [0, V·C)
    std::vector<float> staging_, piece_;
};

}  // namespace px
