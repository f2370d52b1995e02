#include "core/parallel/expert/expert_parallel.h"

#include "core/base/error.h"
#include "core/base/numerics.h"
#include "kernels/ops.h"

namespace px {

void EpExchange::exchange(float* out, std::span<const i64> out_counts, const float* in,
                          std::span<const i64> in_counts) const {
    comm_.all_to_all_v(out, out_counts, in, in_counts);
}

void EpExchange::exchange(i64* out, std::span<const i64> out_counts, const i64* in,
                          std::span<const i64> in_counts) const {
    comm_.all_to_all_v(out, out_counts, in, in_counts);
}

void EpExchange::exchange_counts(i64* out, const i64* in, i64 n) const {
    comm_.all_to_all(out, in, n);
}

std::span<const TokenNode> EpExchange::source_nodes(int rank) const {
    PX_ASSERT(rank >= 0 && static_cast<size_t>(rank) < nodes_.size(),
              "the expert layers were not told the microbatch's token nodes");
    return nodes_[static_cast<size_t>(rank)];
}

void EpExchange::set_microbatch(i64 token_base, std::vector<std::vector<TokenNode>> nodes) {
    PX_ASSERT(static_cast<int>(nodes.size()) == size(), "one node list per rank of the ep group");
    base_ = token_base;
    nodes_ = std::move(nodes);
}

ModelPart expert_part(ModelPart stage, const ModelConfig& mc, int ep, int r) {
    if (ep <= 1) return stage;
    const int EL = static_cast<int>(mc.moe_experts) / ep;
    stage.expert_lo = r * EL;
    stage.expert_hi = (r + 1) * EL;
    return stage;
}

double ep_comm_bytes(const ModelConfig& mc, int ep, i64 moe_layers, i64 micro_B, int microbatches,
                     bool recompute) {
    if (ep <= 1 || !mc.is_moe()) return 0;
    const double S = double(micro_B) * double(mc.seq_len) * double(mc.moe_top_k) * (ep - 1) / ep;
    const double C = double(mc.hidden), f = sizeof(float), id = sizeof(i64);
    const double counts = double(ep - 1) * double(mc.moe_experts / ep) * sizeof(i64);
    const double fwd = 2 * S * C * f + counts, bwd = S * (3 * C * f + id) + counts;
    return double(moe_layers) * microbatches * ((recompute ? 2 : 1) * fwd + bwd);
}

void ep_sum_squares(const GPT& model, const float* grads, comm::Communicator& ep,
                    std::vector<float>& sums) {
    const Numerics& nx = model.numerics();
    const auto& entries = model.table().entries;
    const int block = nx.block;
    // The stacked expert tensors' logical block vectors, back to back in table order.
    std::vector<i64> first(entries.size(), -1), nblocks(entries.size(), 0);
    i64 total = 0;
    for (size_t i = 0; i < entries.size(); i++) {
        const TableEntry& e = entries[i];
        if (!GPT::expert_tensor(e)) continue;
        first[i] = total;
        nblocks[i] = num_blocks(e.numel() * ep.size(), block);
        total += nblocks[i];
    }
    std::vector<float> blocks(static_cast<size_t>(total), 0.0f), part;
    for (size_t i = 0; i < entries.size(); i++) {
        if (first[i] < 0) continue;
        const TableEntry& e = entries[i];
        const i64 at = model.expert_row_offset(e) * e.cols;  // whole blocks (mesh.h)
        PX_ASSERT(at % block == 0 && e.numel() % block == 0,
                  "an expert-parallel rank's share of a stacked expert tensor is whole blocks");
        const i64 nb = num_blocks(e.numel(), block);
        if (nb == 0) continue;
        part.assign(static_cast<size_t>(nb), 0.0f);
        ops::sum_squares_blocks(nx, view_f32(part.data(), {nb}),
                                view_f32(const_cast<float*>(grads) + e.offset, {e.numel()}));
        std::copy(part.begin(), part.end(), blocks.begin() + first[i] + at / block);
    }
    if (total > 0) ep.all_reduce(blocks.data(), total, comm::Algo::canonical);
    for (size_t i = 0; i < entries.size(); i++)
        if (first[i] >= 0)
            sums[i] = nblocks[i] == 0 ? 0.0f : tree_sum(blocks.data() + first[i], nblocks[i]);
}

}  // namespace px
