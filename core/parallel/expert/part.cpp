// Expert parallelism's part of a rank's trainer (part.h).
#include "core/parallel/expert/part.h"

#include "core/base/error.h"
#include "core/parallel/data/part.h"
#include "core/parallel/expert/expert_parallel.h"

#include <algorithm>
#include <cmath>

namespace px {

void ExpertParallel::estimate(const MemorySizes& s, const StageParams& /*p*/, const MemoryGroup& g,
                              MemoryTerms& t) {
    t.gradients += kEstimateFloat * g.P * (1 + (s.M > 1 ? std::ceil(std::log2(s.M)) : 0)) * s.ep;
}

ExpertParallel::ExpertParallel(const RankSetup& rank, const DataParallel& data)
    : rank_(rank), data_(data) {
    PX_ASSERT(rank.groups.ep && rank.groups.ep->size() == rank.layout.ep,
              "layout.ep > 1 needs its ep group");
}

ExpertParallel::~ExpertParallel() = default;

void ExpertParallel::plan(ModelPlan& plan) {
    plan.part = expert_part(plan.part, rank_.cfg.model, rank_.layout.ep, rank_.ep_rank);
}

// Every dp rank's blocks (for the plan), and the microbatch leaves of this group's ranks.
void ExpertParallel::attach(GPT& model) {
    model_ = &model;
    const Layout& l = rank_.layout;
    const int ep = l.ep;
    exchange_ = std::make_shared<EpExchange>(*rank_.groups.ep);
    model.set_experts(exchange_);
    const i64 nb = l.token_blocks(), N = rank_.cfg.train.batch_size * rank_.T;
    const int first = rank_.at.dp / ep * ep, blk = rank_.nx.block;
    std::vector<std::vector<Range>> owned(static_cast<size_t>(l.dp));
    std::vector<std::vector<std::vector<Range>>> leaves(static_cast<size_t>(ep));
    leaf_tokens_.assign(static_cast<size_t>(ep), {});
    for (const TokenRange& r : token_ranges(l)) {
        owned[static_cast<size_t>(r.dp_rank)].push_back({r.block_lo, r.block_hi});
        const int s = r.dp_rank - first;
        if (s < 0 || s >= ep) continue;
        leaves[static_cast<size_t>(s)].push_back(maximal_nodes(nb, r.block_lo, r.block_hi));
        std::vector<Range> tokens;
        for (const Range& n : leaves[static_cast<size_t>(s)].back())
            tokens.push_back({n.lo * blk, std::min(n.hi * blk, N)});
        leaf_tokens_[static_cast<size_t>(s)].push_back(std::move(tokens));
    }
    const i64 total = model.grad_layout().total;
    for (int s = 0; s < ep; s++) grads_.emplace_back(bytes_of(DType::f32, total));
    acc_.resize(static_cast<size_t>(model.num_chunks()));
    for (int c = 0; c < model.num_chunks(); c++)
        for (int s = 0; s < ep; s++)
            acc_[static_cast<size_t>(c)].emplace_back(nb, leaves[static_cast<size_t>(s)],
                                                      grads_[static_cast<size_t>(s)].f32(),
                                                      total, model.grad_span(c));
    // Expert-data rank q holds the nodes of dp ranks q·ep .. q·ep + ep - 1, source by source.
    plan_ = NodePlan{};
    plan_.nb = nb;
    plan_.nodes.resize(static_cast<size_t>(l.dp / ep));
    for (int d = 0; d < l.dp; d++) {
        const std::vector<Range> nodes = maximal_nodes(nb, owned[static_cast<size_t>(d)]);
        auto& q = plan_.nodes[static_cast<size_t>(d / ep)];
        q.insert(q.end(), nodes.begin(), nodes.end());
    }
}

void ExpertParallel::begin_step() {
    for (auto& per_source : acc_)
        for (TreeAccumulator& a : per_source) a.reset();
    sent0_ = bytes_sent();
}

void ExpertParallel::begin_backward(int chunk, int m) {
    const int ep = rank_.layout.ep;
    std::vector<std::vector<TokenNode>> nodes(static_cast<size_t>(ep));
    for (int s = 0; s < ep; s++) {
        const std::vector<float*> bufs =
            acc_[static_cast<size_t>(chunk)][static_cast<size_t>(s)].begin(m);
        const std::vector<Range>& tokens =
            leaf_tokens_[static_cast<size_t>(s)][static_cast<size_t>(m)];
        PX_ASSERT(bufs.size() == tokens.size(), "one buffer per token node");
        for (size_t i = 0; i < bufs.size(); i++)
            nodes[static_cast<size_t>(s)].push_back({tokens[i].lo, tokens[i].hi, bufs[i]});
    }
    exchange_->set_microbatch(data_.first_row(m) * rank_.T, std::move(nodes));
}

void ExpertParallel::end_backward(int chunk, int m) {
    for (TreeAccumulator& a : acc_[static_cast<size_t>(chunk)]) a.end(m);
}

// g's stacked expert tensors = the tree over every ep group's sources' nodes (bitwise), or their
// sum (fast). The values travel packed: only the expert tensors' floats.
void ExpertParallel::reduce_grads(StepGrads& grads) {
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
    for (const TreeAccumulator& a : acc_.front()) rows += a.targets().size();
    values_.resize(rows * static_cast<size_t>(w));
    float* row = values_.data();
    for (size_t s = 0; s < acc_.front().size(); s++)
        for (size_t j = 0; j < acc_.front()[s].targets().size(); j++) {
            for (const Piece& p : pieces) {
                const float* src = acc_[static_cast<size_t>(p.chunk)][s].target_buffer(j) + p.offset;
                row = std::copy(src, src + p.n, row);
            }
        }
    std::vector<float> out(static_cast<size_t>(w));
    comm::Communicator* edp = rank_.groups.expert_data;
    if (rank_.nx.mode == Mode::fast) {
        std::copy(values_.begin(), values_.begin() + w, out.begin());
        for (size_t r = 1; r < rows; r++)
            for (i64 k = 0; k < w; k++) out[static_cast<size_t>(k)] += values_[r * w + k];
        if (edp) edp->all_reduce(out.data(), w, rank_.layout.algo);
    } else if (edp) {
        exchange_and_combine(*edp, plan_, values_.data(), w, out.data());
    } else {
        const bool present = combine_nodes(plan_.nb, plan_.nodes.front(), values_.data(), w);
        PX_ASSERT(present, "an ep group owns tokens");
        std::copy(values_.begin(), values_.begin() + w, out.begin());
    }
    const float* from = out.data();
    for (const Piece& p : pieces) {
        std::copy(from, from + p.n, grads.g + p.offset);
        from += p.n;
    }
}

void ExpertParallel::entry_sums(const float* g, EntrySums& s) {
    ep_sum_squares(*model_, g, *rank_.groups.ep, s.sums);  // the experts' shares
}

bool ExpertParallel::writes(const TableEntry& e) const {
    return GPT::expert_tensor(e) || rank_.at.dp % rank_.layout.ep == 0;
}

// The all-to-alls' bytes (the gradient norm's block exchange over the group is not counted).
double ExpertParallel::bytes_sent() const {
    double b = 0;
    for (const comm::StatRow& r : rank_.groups.ep->stats_book()->rows())
        if (r.group == "ep" && (r.op == "all_to_all" || r.op == "all_to_all_v"))
            b += static_cast<double>(r.bytes_sent);
    return b;
}

void ExpertParallel::end_step() {
    sent_ += bytes_sent() - sent0_;
    steps_++;
}

void ExpertParallel::memory(MemoryStats& m) const {
    for (const Arena& a : grads_) {  // per source
        m.grads += a.bytes();
        m.peak_grads += a.bytes();
    }
    for (const auto& per_source : acc_)
        for (const TreeAccumulator& a : per_source) {
            m.grads += a.bytes();
            m.peak_grads += a.bytes();
        }
}

void ExpertParallel::stats(PartStats& s) const {
    EpStats& e = s.ep;
    e.ep = rank_.layout.ep;
    e.comm_bytes_per_step = steps_ > 0 ? sent_ / static_cast<double>(steps_) : 0;
    i64 moe_layers = 0;
    for (const LayerSpan& c : model_->part().chunks)
        for (int l = c.lo; l < c.hi; l++) moe_layers += rank_.cfg.model.moe_layer(l) ? 1 : 0;
    e.comm_bytes_formula =
        ep_comm_bytes(rank_.cfg.model, rank_.layout.ep, moe_layers, rank_.micro_B,
                      rank_.layout.microbatches, rank_.layout.recompute == Recompute::full);
}

}  // namespace px
