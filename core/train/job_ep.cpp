// The trainer under expert parallelism (layout.ep > 1; core/parallel/expert_parallel.h): the
// model's expert layers over the ep group, the gradients of this rank's experts over every
// source rank's token nodes, and their combination in the canonical token tree.
//
// An expert's weight gradient sums over the tokens routed to it, in the batch's token tree.
// Its owner runs the expert on the rows of every rank of its ep group, so it computes, for each
// of those source ranks, exactly the node partials that source would compute on one device's
// layout of the batch (its microbatches' token nodes). They accumulate per source, as any rank's
// do (TreeAccumulator: into the source's maximal nodes), and after backward the owners of the
// same experts (one per ep group: the expert-data group) combine all of them in the tree over
// the batch's blocks (tree_exchange.h), with every source's nodes listed in token order.
#include "core/base/error.h"
#include "core/parallel/expert_parallel.h"
#include "core/parallel/pipeline.h"
#include "core/train/job.h"

#include <algorithm>
#include <cstring>

namespace px {

void Job::build_ep() {
    const int ep = layout_.ep;
    PX_ASSERT(groups_.ep && groups_.ep->size() == ep, "layout.ep > 1 needs its ep group");
    ep_ = std::make_shared<EpExchange>(*groups_.ep);
    model_->set_experts(ep_);
    // Every dp rank's blocks (for the plan), and the microbatch leaves of this group's ranks.
    const i64 nb = layout_.token_blocks(), N = cfg_.train.batch_size * T_;
    const int first = dp_rank_ / ep * ep;
    std::vector<std::vector<Range>> owned(static_cast<size_t>(layout_.dp));
    std::vector<std::vector<std::vector<Range>>> leaves(static_cast<size_t>(ep));
    ep_leaf_tokens_.assign(static_cast<size_t>(ep), {});
    for (const TokenRange& r : token_ranges(layout_)) {
        owned[static_cast<size_t>(r.dp_rank)].push_back({r.block_lo, r.block_hi});
        const int s = r.dp_rank - first;
        if (s < 0 || s >= ep) continue;
        leaves[static_cast<size_t>(s)].push_back(maximal_nodes(nb, r.block_lo, r.block_hi));
        std::vector<Range> tokens;
        for (const Range& n : leaves[static_cast<size_t>(s)].back())
            tokens.push_back({n.lo * nx_.block, std::min(n.hi * nx_.block, N)});
        ep_leaf_tokens_[static_cast<size_t>(s)].push_back(std::move(tokens));
    }
    const i64 total = model_->grad_layout().total;
    for (int s = 0; s < ep; s++) ep_grads_.emplace_back(bytes_of(DType::f32, total));
    ep_acc_.resize(static_cast<size_t>(model_->num_chunks()));
    for (int c = 0; c < model_->num_chunks(); c++)
        for (int s = 0; s < ep; s++)
            ep_acc_[static_cast<size_t>(c)].emplace_back(nb, leaves[static_cast<size_t>(s)],
                                                         ep_grads_[static_cast<size_t>(s)].f32(),
                                                         total, model_->grad_span(c));
    // Expert-data rank q holds the nodes of dp ranks q·ep .. q·ep + ep - 1, source by source.
    ep_plan_ = NodePlan{};
    ep_plan_.nb = nb;
    ep_plan_.nodes.resize(static_cast<size_t>(layout_.dp / ep));
    for (int d = 0; d < layout_.dp; d++) {
        const std::vector<Range> nodes = maximal_nodes(nb, owned[static_cast<size_t>(d)]);
        auto& q = ep_plan_.nodes[static_cast<size_t>(d / ep)];
        q.insert(q.end(), nodes.begin(), nodes.end());
    }
}

void Job::ep_begin_backward(int chunk, int m) {
    const int ep = layout_.ep;
    std::vector<std::vector<TokenNode>> nodes(static_cast<size_t>(ep));
    for (int s = 0; s < ep; s++) {
        const std::vector<float*> bufs = ep_acc_[static_cast<size_t>(chunk)][static_cast<size_t>(s)].begin(m);
        const std::vector<Range>& tokens =
            ep_leaf_tokens_[static_cast<size_t>(s)][static_cast<size_t>(m)];
        PX_ASSERT(bufs.size() == tokens.size(), "one buffer per token node");
        for (size_t i = 0; i < bufs.size(); i++)
            nodes[static_cast<size_t>(s)].push_back({tokens[i].lo, tokens[i].hi, bufs[i]});
    }
    ep_->set_microbatch(first_row(m) * T_, std::move(nodes));
}

void Job::ep_end_backward(int chunk, int m) {
    for (TreeAccumulator& a : ep_acc_[static_cast<size_t>(chunk)]) a.end(m);
}

// g's stacked expert tensors = the tree over every ep group's sources' nodes (bitwise), or their
// sum (fast). The values travel packed: only the expert tensors' floats.
void Job::reduce_expert_grads(float* g) {
    const GPT& model = *model_;
    struct Piece {
        i64 offset, n;
        int chunk;
    };
    std::vector<Piece> pieces;
    i64 w = 0;
    for (int c = 0; c < model.num_chunks(); c++) {
        const GradSpan span = model.grad_span(c);
        for (const TableEntry& e : model.table().entries)
            if (GPT::expert_tensor(e) && e.offset >= span.lo && e.offset < span.hi) {
                pieces.push_back({e.offset, e.numel(), c});
                w += e.numel();
            }
    }
    if (w == 0) return;
    size_t rows = 0;
    for (const TreeAccumulator& a : ep_acc_.front()) rows += a.targets().size();
    ep_values_.resize(rows * static_cast<size_t>(w));
    float* row = ep_values_.data();
    for (size_t s = 0; s < ep_acc_.front().size(); s++)
        for (size_t j = 0; j < ep_acc_.front()[s].targets().size(); j++) {
            for (const Piece& p : pieces) {
                const float* src =
                    ep_acc_[static_cast<size_t>(p.chunk)][s].target_buffer(j) + p.offset;
                row = std::copy(src, src + p.n, row);
            }
        }
    std::vector<float> out(static_cast<size_t>(w));
    comm::Communicator* edp = groups_.expert_data;
    if (nx_.mode == Mode::fast) {
        std::copy(ep_values_.begin(), ep_values_.begin() + w, out.begin());
        for (size_t r = 1; r < rows; r++)
            for (i64 k = 0; k < w; k++) out[static_cast<size_t>(k)] += ep_values_[r * w + k];
        if (edp) edp->all_reduce(out.data(), w, layout_.algo);
    } else if (edp) {
        exchange_and_combine(*edp, ep_plan_, ep_values_.data(), w, out.data());
    } else {
        const bool present = combine_nodes(ep_plan_.nb, ep_plan_.nodes.front(), ep_values_.data(), w);
        PX_ASSERT(present, "an ep group owns tokens");
        std::copy(ep_values_.begin(), ep_values_.begin() + w, out.begin());
    }
    const float* from = out.data();
    for (const Piece& p : pieces) {
        std::copy(from, from + p.n, g + p.offset);
        from += p.n;
    }
}

// The all-to-alls' bytes (the gradient norm's block exchange over the group is not counted).
double Job::ep_bytes_sent() const {
    return book_bytes_sent(groups_.ep, [](const comm::StatRow& r) {
        return r.group == "ep" && (r.op == "all_to_all" || r.op == "all_to_all_v");
    });
}

EpStats Job::ep_stats() const {
    EpStats s;
    if (layout_.ep <= 1) return s;
    s.ep = layout_.ep;
    s.comm_bytes_per_step =
        accounted_steps_ > 0 ? ep_sent_ / static_cast<double>(accounted_steps_) : 0;
    i64 moe_layers = 0;
    for (const LayerSpan& c : model_->part().chunks)
        for (int l = c.lo; l < c.hi; l++) moe_layers += cfg_.model.moe_layer(l) ? 1 : 0;
    s.comm_bytes_formula = ep_comm_bytes(cfg_.model, layout_.ep, moe_layers, micro_B_,
                                         layout_.microbatches, recompute_);
    return s;
}

}  // namespace px
