#include "core/parallel/zero.h"

#include "core/error.h"
#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace px {

std::vector<i64> zero_shard_edges(const ParamTable& t, int dp, int block) {
    // The first block boundary of a tensor at or after flat position x (tensor ends count too).
    auto snap = [&](i64 x) {
        for (const TableEntry& e : t.entries) {
            const i64 end = e.offset + e.numel();
            if (x <= e.offset) return e.offset;
            if (x < end) return std::min(end, e.offset + (x - e.offset + block - 1) / block * block);
        }
        return t.total;
    };
    std::vector<i64> edges(static_cast<size_t>(dp) + 1, 0);
    for (int r = 1; r < dp; r++)
        edges[static_cast<size_t>(r)] =
            std::max(edges[static_cast<size_t>(r) - 1], snap(t.total * r / dp));
    edges[static_cast<size_t>(dp)] = t.total;
    return edges;
}

void reduce_scatter_cut(comm::Communicator& dp, float* seg, const std::vector<i64>& cuts,
                        comm::Algo algo, std::vector<float>& staging, std::vector<float>& piece) {
    const int p = dp.size(), rank = dp.rank();
    i64 chunk = 0;
    for (int r = 0; r < p; r++) chunk = std::max(chunk, cuts[r + 1] - cuts[r]);
    if (chunk == 0) return;
    staging.assign(static_cast<size_t>(chunk) * p, 0.0f);
    for (int r = 0; r < p; r++)
        std::memcpy(staging.data() + r * chunk, seg + cuts[r],
                    static_cast<size_t>(cuts[r + 1] - cuts[r]) * sizeof(float));
    piece.resize(static_cast<size_t>(chunk));
    dp.reduce_scatter(piece.data(), staging.data(), chunk, algo);
    std::memcpy(seg + cuts[rank], piece.data(),
                static_cast<size_t>(cuts[rank + 1] - cuts[rank]) * sizeof(float));
}

ZeroShards::ZeroShards(const GPT& model, int dp, int rank)
    : model_(model), rank_(rank), edges_(zero_shard_edges(model.table(), dp, model.numerics().block)) {
    // The LM head's gradient shadows wte element for element: cut it where wte is cut.
    const ParamTable& t = model.table();
    const TableEntry& wte = t.entries[t.wte];
    head_edges_.resize(edges_.size());
    for (size_t r = 0; r < edges_.size(); r++)
        head_edges_[r] = std::clamp<i64>(edges_[r] - wte.offset, 0, wte.numel());
}

void ZeroShards::reduce_scatter_grads(comm::Communicator& dp, float* grads, comm::Algo algo) {
    reduce_scatter_cut(dp, grads, edges_, algo, staging_, piece_);
    reduce_scatter_cut(dp, grads + model_.grad_layout().head_offset, head_edges_, algo, staging_,
                       piece_);
}

void ZeroShards::combine_tied(float* grads) const {
    const TableEntry& wte = model_.table().entries[model_.table().wte];
    const float* head = grads + model_.grad_layout().head_offset;
    for (i64 i = head_edges_[rank_]; i < head_edges_[rank_ + 1]; i++)
        grads[wte.offset + i] = grads[wte.offset + i] + head[i];
}

float ZeroShards::grad_norm(comm::Communicator& dp, const float* grads, comm::Algo algo) const {
    const Numerics& nx = model_.numerics();
    const auto& entries = model_.table().entries;
    const int block = nx.block;
    // The blocks of tensor e that lie in shard r (shard edges are block boundaries).
    auto owned = [&](const TableEntry& e, int r, i64& b0, i64& b1) {
        const i64 a = std::max(e.offset, lo(r)), b = std::min(e.offset + e.numel(), hi(r));
        b0 = b1 = 0;
        if (a >= b) return;
        b0 = (a - e.offset) / block;
        b1 = num_blocks(b - e.offset, block);
    };

    if (algo == comm::Algo::ring) {  // fast mode: any order
        double local = 0.0;
        for (const TableEntry& e : entries) {
            const i64 a = std::max(e.offset, lo()), b = std::min(e.offset + e.numel(), hi());
            if (a < b) local += cpu::sum_squares(nx, grads + a, b - a);
        }
        dp.all_reduce(&local, 1, algo);
        return static_cast<float>(std::sqrt(local));
    }

    // Bitwise: this rank's block partials, in flat order; then every rank's, gathered.
    std::vector<i64> counts(static_cast<size_t>(size()), 0);
    for (int r = 0; r < size(); r++)
        for (const TableEntry& e : entries) {
            i64 b0, b1;
            owned(e, r, b0, b1);
            counts[static_cast<size_t>(r)] += b1 - b0;
        }
    std::vector<float> mine(static_cast<size_t>(counts[static_cast<size_t>(rank_)]));
    i64 at = 0;
    for (const TableEntry& e : entries) {
        i64 b0, b1;
        owned(e, rank_, b0, b1);
        if (b1 == b0) continue;
        const i64 a = e.offset + b0 * block, b = std::min(e.offset + e.numel(), e.offset + b1 * block);
        cpu::sum_squares_blocks(nx, mine.data() + at, grads + a, b - a);
        at += b1 - b0;
    }
    i64 all_blocks = 0;
    for (i64 c : counts) all_blocks += c;
    std::vector<float> every(static_cast<size_t>(all_blocks));
    dp.all_gather_v(every.data(), mine.data(), counts);

    // Every block of every tensor, in flat order: the same trees as the single device.
    std::vector<float> per_tensor(entries.size());
    at = 0;
    for (size_t i = 0; i < entries.size(); i++) {
        const i64 nb = num_blocks(entries[i].numel(), block);
        per_tensor[i] = tree_sum(every.data() + at, nb);
        at += nb;
    }
    PX_ASSERT(at == all_blocks, "every gradient block has exactly one owner");
    return std::sqrt(tree_sum(per_tensor.data(), static_cast<i64>(per_tensor.size())));
}

void ZeroShards::all_gather_params(comm::Communicator& dp, float* params) const {
    std::vector<i64> counts(static_cast<size_t>(size()));
    for (int r = 0; r < size(); r++) counts[static_cast<size_t>(r)] = hi(r) - lo(r);
    std::vector<float> mine(params + lo(), params + hi());
    dp.all_gather_v(params, mine.data(), counts);
}

void ZeroShards::release_params(float* params) const {
    std::fill(params, params + lo(), 0.0f);
    std::fill(params + hi(), params + model_.table().total, 0.0f);
}

}  // namespace px
