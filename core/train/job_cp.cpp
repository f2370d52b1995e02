// The trainer under context parallelism (layout.cp > 1; core/parallel/context_parallel.h): a
// rank's token nodes and the plan over the data group, its tokens of each sequence, and the
// losses of every rank put back at their logical places.
#include "core/base/error.h"
#include "core/parallel/context_parallel.h"
#include "core/parallel/pipeline.h"
#include "core/train/job.h"

#include <cstring>

namespace px {

// Rank (d, c) of the data group (index d·cp + c) owns, of each sequence of dp rank d's range, the
// blocks of its two zig-zag chunks. A microbatch's leaves are the maximal nodes of its sequences'
// blocks: each lies inside one chunk (the chunks of one sequence are adjacent only for
// c = cp-1, where they are one run), so its rows are consecutive local rows.
void Job::build_cp_leaves() {
    const i64 nb = layout_.token_blocks();
    const int cp = layout_.cp, blk = nx_.block;
    std::vector<std::vector<Range>> leaves;
    std::vector<std::vector<Range>> owned(static_cast<size_t>(layout_.dp * cp));
    for (const TokenRange& r : token_ranges(layout_)) {
        for (int c = 0; c < cp; c++) {
            const std::vector<Range> mine =
                cp_owned_blocks(T_, cp, c, blk, r.sample_lo, r.sample_hi);
            auto& o = owned[static_cast<size_t>(r.dp_rank * cp + c)];
            o.insert(o.end(), mine.begin(), mine.end());
        }
        if (r.dp_rank != dp_rank_) continue;
        const std::vector<Range> blocks =
            cp_owned_blocks(T_, cp, cp_rank_, blk, r.sample_lo, r.sample_hi);
        leaves.push_back(maximal_nodes(nb, blocks));
        std::vector<Range> rows;
        for (const Range& n : leaves.back()) {
            const i64 tok = n.lo * blk, s = tok / T_, p = tok % T_;
            i64 row = -1;
            for (const PositionRun& run : cp_runs_)
                if (p >= run.pos && p < run.pos + (run.hi - run.lo))
                    row = (s - r.sample_lo) * Tl_ + run.lo + (p - run.pos);
            PX_ASSERT(row >= 0, "a token node outside the rank's chunks");
            rows.push_back({row, row + (n.hi - n.lo) * blk});
        }
        leaf_rows_.push_back(std::move(rows));
    }
    plan_ = make_plan(nb, owned);
    for (int c = 0; c < model_->num_chunks(); c++)
        acc_.emplace_back(nb, leaves, grads_.f32(), model_->grad_layout().total,
                          model_->grad_span(c));
}

// out (B, T/cp) = this rank's tokens of each row of full (B, T), run after run.
void Job::localise(int* out, const int* full, i64 B) const {
    for (i64 b = 0; b < B; b++)
        for (const PositionRun& r : cp_runs_)
            std::memcpy(out + b * Tl_ + r.lo, full + b * T_ + r.pos,
                        static_cast<size_t>(r.hi - r.lo) * sizeof(int));
}

// Every data-group rank's losses, `batches` batches of local_B sequences of T/cp tokens each, to
// token order: batch j, then replica, then sequence, then logical position (gather_losses').
void Job::gather_cp_losses(std::vector<float>& all, const std::vector<float>& local, i64 batches) {
    const int dp = layout_.dp, cp = layout_.cp;
    const i64 per_rank = batches * local_B_ * Tl_;
    std::vector<float> gathered(static_cast<size_t>(per_rank * dp * cp));
    groups_.data->all_gather(gathered.data(), local.data(), per_rank);
    all.resize(static_cast<size_t>(batches * dp * local_B_ * T_));
    for (int d = 0; d < dp; d++)
        for (int c = 0; c < cp; c++) {
            const float* src = gathered.data() + (d * cp + c) * per_rank;
            const std::vector<PositionRun> runs = zigzag_runs(T_, cp, c);
            for (i64 j = 0; j < batches; j++)
                for (i64 s = 0; s < local_B_; s++)
                    for (const PositionRun& r : runs)
                        std::memcpy(all.data() + ((j * dp + d) * local_B_ + s) * T_ + r.pos,
                                    src + (j * local_B_ + s) * Tl_ + r.lo,
                                    static_cast<size_t>(r.hi - r.lo) * sizeof(float));
        }
}

double Job::cp_bytes_sent() const {
    return book_bytes_sent(groups_.cp, [](const comm::StatRow& r) { return r.group == "cp"; });
}

CpStats Job::cp_stats() const {
    CpStats s;
    if (layout_.cp <= 1) return s;
    s.cp = layout_.cp;
    s.method = cp_method_name(layout_.cp_method);
    s.comm_bytes_per_step =
        accounted_steps_ > 0 ? cp_sent_ / static_cast<double>(accounted_steps_) : 0;
    i64 layers = 0;
    for (int c = 0; c < model_->num_chunks(); c++) layers += model_->part().chunks[c].size();
    const CpCosts f = cp_costs(layout_, layers, micro_B_);
    s.comm_bytes_formula = f.comm_bytes_per_step;
    s.attention_bytes_formula = f.attention_bytes;
    if (!slots_.empty() && !slots_[0].empty()) {
        const Activations& a = slots_[0][0]->acts;
        for (int t : {ATT, DPREATT, DATT}) {
            const Tensor x = a.tensor(t);
            s.attention_bytes += static_cast<double>(bytes_of(x.dtype, x.numel()));
        }
    }
    return s;
}

}  // namespace px
