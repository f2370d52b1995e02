// Data parallelism's part of a rank's trainer, with ZeRO (part.h): the owners' token nodes and
// their reduction, the rank's batch and losses, the update of its shard and the shards' state.
#include "core/parallel/data/part.h"

#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/model/data.h"
#include "core/model/weight_grads.h"
#include "core/parallel/context/context_parallel.h"
#include "core/parallel/state_slices.h"
#include "core/parallel/data/zero.h"
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace px {

namespace {

// Windows (count, T+1) -> inputs and targets (count, T).
void split_windows(int* inputs, int* targets, const int* windows, i64 count, i64 T) {
    for (i64 b = 0; b < count; b++) {
        const int* w = windows + b * (T + 1);
        std::memcpy(inputs + b * T, w, static_cast<size_t>(T) * sizeof(int));
        std::memcpy(targets + b * T, w + 1, static_cast<size_t>(T) * sizeof(int));
    }
}

// Post-order over the microbatch leaves of the token tree: after leaf k, merge the top two
// partials merges[k] times (make_layout checked that every leaf is a node).
void leaf_schedule(i64 lo, i64 hi, i64 blocks_per_leaf, std::vector<unsigned char>& merges) {
    if (hi - lo <= blocks_per_leaf) return;
    const i64 mid = tree_mid(lo, hi);
    leaf_schedule(lo, mid, blocks_per_leaf, merges);
    leaf_schedule(mid, hi, blocks_per_leaf, merges);
    merges[static_cast<size_t>(hi / blocks_per_leaf - 1)]++;
}

}  // namespace

// Under ZeRO-2/3 microbatch-major (ZeroUnits) a rank holds its shard and, while a unit runs, that
// unit whole (twice: the unit in flight and the one gathered next); otherwise the whole stage, and
// its gradient with the microbatch tree's partial buffers. The moments are a ZeRO shard over the
// replicas of a local array (dp/ep under expert parallelism).
void DataParallel::estimate(const MemorySizes& s, const StageParams& p, const MemoryGroup& g,
                            MemoryTerms& t) {
    const double kF = kEstimateFloat, P = g.P;
    const double unit = std::max({p.layer, p.wte + p.wpe, p.head_wte + p.lnf});  // a ZeRO unit
    const bool units = s.microbatch_major;
    t.weights += s.zero == 3 && units ? kF * (P / s.dp + 2 * unit * g.ranks) : kF * P;
    t.gradients += s.zero >= 2 && units
                       ? kF * (P / s.dp + 2 * unit * g.ranks)
                       : kF * P * (1 + s.v * s.tree_buffers);  // a token tree per chunk
    t.moments += 2 * kF * P / (s.zero >= 1 ? s.dp / s.ep : 1);
    // the batch: windows, inputs, targets, losses, every token's loss, the replicas' gathered
    const double BT = s.B * s.T;
    t.batch += g.ranks * kF *
               (s.local_B * (s.T + 1) + 3 * s.local_B * s.T + BT + (s.dp > 1 ? BT : 0));
    if (s.eval)  // validation losses, on the last stages
        t.validation += g.lasts * kF * s.VB * (s.local_B * s.T + (s.dp > 1 ? 2 * BT : 0));
    t.bookkeeping += g.ranks * (s.dp * s.M * 48 + 2 * s.M * 32);  // token ranges, the tree
}

DataParallel::DataParallel(const RankSetup& rank) : rank_(rank) {
    // ZeRO: each replica keeps the AdamW moments of one shard of its parameters and updates
    // only that shard (zero.h). Under expert parallelism the replicas of a local array are the
    // expert-data group's ranks (ZeRO-1 only: the optimizer state).
    const Layout& l = rank.layout;
    zero_ = l.dp / l.ep > 1 ? l.zero : 0;
    const i64 B = rank.local_B;
    windows_.resize(static_cast<size_t>(B * (rank.T + 1)));
    inputs_.resize(static_cast<size_t>(B * rank.T));
    targets_.resize(static_cast<size_t>(B * rank.T));
    losses_.resize(static_cast<size_t>(B * rank.Tl));
    if (l.cp > 1) {
        cp_inputs_.resize(static_cast<size_t>(B * rank.Tl));
        cp_targets_.resize(static_cast<size_t>(B * rank.Tl));
        cp_runs_ = zigzag_runs(rank.T, l.cp, rank.at.cp);
    }
    all_losses_.resize(static_cast<size_t>(rank.cfg.train.batch_size * rank.T));
    val_win_.resize(static_cast<size_t>(rank.micro_B * (rank.T + 1)));
    val_tok_.resize(static_cast<size_t>(rank.micro_B * rank.T));
    val_tgt_.resize(val_tok_.size());
}

DataParallel::~DataParallel() = default;

// The gradient buffer is written whole every step, except under ZeRO-2/3, which hand its pages
// back between units and steps. The weights are initialised: ZeRO-3 keeps only its shard.
void DataParallel::attach(GPT& model) {
    model_ = &model;
    const Layout& l = rank_.layout;
    const int zero_ranks = l.dp / l.ep;
    grads_ = Arena(bytes_of(DType::f32, model.grad_layout().total),
                   l.zero >= 2 && zero_ranks > 1 ? Arena::Pages::on_touch : Arena::Pages::now);
    if (zero_ >= 1) {
        shards_ = std::make_unique<ZeroShards>(model, zero_ranks, rank_.at.dp / l.ep);
        opt_ = std::make_unique<AdamW>(model, shards_->lo(), shards_->hi());
    } else {
        opt_ = std::make_unique<AdamW>(model);
    }
    if (l.microbatch_major()) {
        const i64 bpm = l.microbatches > 1 ? rank_.micro_B * rank_.T / rank_.nx.block : 1;
        // ZeRO-2/3 on one stage: the model tells ZeroUnits before and after each unit; weights
        // (ZeRO-3) and gradients are mapped only while a unit runs, and only the shard is kept.
        // Microbatch k of the batch is one node, cut into one piece per replica; the nodes
        // combine in the tree over microbatches.
        std::vector<unsigned char> merges(static_cast<size_t>(l.microbatches), 0);
        leaf_schedule(0, bpm * l.dp * l.microbatches, bpm * l.dp, merges);
        units_ = std::make_unique<ZeroUnits>(model, *shards_, *rank_.groups.dp, zero_, grads_,
                                             std::move(merges));
        model.set_unit_hooks(units_.get());
        units_->reset_peaks();
    } else {
        build_leaves();
    }
    if (zero_ == 3) shards_->release_params(model.param_arena());
}

// Microbatch m of owner (d, c) (data-group index d·cp + c; cp = 1: the replicas) owns, of each
// sequence of its range, the token blocks of its zig-zag chunks (all of them without context
// parallelism): one node, or several when the cut does not follow the tree's splits (dp = 3,
// 6, ..., or the chunks of a sequence). Its nodes are the accumulator's leaves; GPT::backward
// computes each one's weight gradients over its rows alone (the subtree below a node has the
// same shape wherever it starts). Under context parallelism a node lies inside one chunk (the
// chunks of a sequence are adjacent only for c = cp-1, where they are one run), so its rows are
// consecutive local rows.
void DataParallel::build_leaves() {
    const Layout& l = rank_.layout;
    const i64 nb = l.token_blocks(), T = rank_.T, N = rank_.cfg.train.batch_size * T;
    const int cp = l.cp, blk = rank_.nx.block;
    std::vector<std::vector<Range>> leaves;
    std::vector<std::vector<Range>> owned(static_cast<size_t>(l.dp * cp));
    for (const TokenRange& r : token_ranges(l)) {
        if (cp == 1) {
            owned[static_cast<size_t>(r.dp_rank)].push_back({r.block_lo, r.block_hi});
        } else {
            for (int c = 0; c < cp; c++) {
                const std::vector<Range> mine =
                    cp_owned_blocks(T, cp, c, blk, r.sample_lo, r.sample_hi);
                auto& o = owned[static_cast<size_t>(r.dp_rank * cp + c)];
                o.insert(o.end(), mine.begin(), mine.end());
            }
        }
        if (r.dp_rank != rank_.at.dp) continue;
        std::vector<Range> rows;
        if (cp == 1) {
            leaves.push_back(maximal_nodes(nb, r.block_lo, r.block_hi));
            const i64 first = r.sample_lo * T;
            for (const Range& n : leaves.back())
                rows.push_back({n.lo * blk - first, std::min(n.hi * blk, N) - first});
        } else {
            leaves.push_back(maximal_nodes(
                nb, cp_owned_blocks(T, cp, rank_.at.cp, blk, r.sample_lo, r.sample_hi)));
            for (const Range& n : leaves.back()) {
                const i64 tok = n.lo * blk, s = tok / T, p = tok % T;
                i64 row = -1;
                for (const PositionRun& run : cp_runs_)
                    if (p >= run.pos && p < run.pos + (run.hi - run.lo))
                        row = (s - r.sample_lo) * rank_.Tl + run.lo + (p - run.pos);
                PX_ASSERT(row >= 0, "a token node outside the rank's chunks");
                rows.push_back({row, row + (n.hi - n.lo) * blk});
            }
        }
        leaf_rows_.push_back(std::move(rows));
    }
    plan_ = make_plan(nb, owned);
    for (int c = 0; c < model_->num_chunks(); c++)
        acc_.emplace_back(nb, leaves, grads_.f32(), model_->grad_layout().total,
                          model_->grad_span(c));
}

// ---- the batch -------------------------------------------------------------------------------

// This replica's sequences of the step's batch: [dp_rank·local_B, (dp_rank+1)·local_B), cut
// into microbatches; under ZeroUnits piece dp_rank of every microbatch's range (zero.h).
i64 DataParallel::first_row(int m) const {
    const Layout& l = rank_.layout;
    if (l.microbatch_major())
        return m * (rank_.cfg.train.batch_size / l.microbatches) + rank_.at.dp * rank_.micro_B;
    return rank_.at.dp * rank_.local_B + m * rank_.micro_B;
}

void DataParallel::draw(const TokenSource& source, i64 batch) {
    const i64 T = rank_.T, mB = rank_.micro_B;
    if (rank_.layout.microbatch_major()) {
        for (int k = 0; k < rank_.layout.microbatches; k++)
            source.sample(windows_.data() + k * mB * (T + 1), T, Split::train, batch,
                          first_row(k), mB);
    } else {
        source.sample(windows_.data(), T, Split::train, batch, first_row(0), rank_.local_B);
    }
    split_windows(inputs_.data(), targets_.data(), windows_.data(), rank_.local_B, T);
    if (rank_.layout.cp > 1) {  // this rank's zig-zag tokens of every sequence
        localise(cp_inputs_.data(), inputs_.data(), rank_.local_B);
        localise(cp_targets_.data(), targets_.data(), rank_.local_B);
    }
}

const int* DataParallel::tokens(int m) const {
    return (rank_.layout.cp > 1 ? cp_inputs_ : inputs_).data() + m * rank_.micro_B * rank_.Tl;
}

const int* DataParallel::targets(int m) const {
    return (rank_.layout.cp > 1 ? cp_targets_ : targets_).data() + m * rank_.micro_B * rank_.Tl;
}

void DataParallel::draw_val(const TokenSource& source, i64 j, int k) {
    const i64 mB = rank_.micro_B;
    source.sample(val_win_.data(), rank_.T, Split::val, j, rank_.at.dp * rank_.local_B + k * mB,
                  mB);
    split_windows(val_tok_.data(), val_tgt_.data(), val_win_.data(), mB, rank_.T);
    if (rank_.layout.cp > 1) {  // in place: a rank's tokens come first
        localise(val_tok_.data(), std::vector<int>(val_tok_).data(), mB);
        localise(val_tgt_.data(), std::vector<int>(val_tgt_).data(), mB);
    }
}

// out (B, T/cp) = this rank's tokens of each row of full (B, T), run after run.
void DataParallel::localise(int* out, const int* full, i64 B) const {
    for (i64 b = 0; b < B; b++)
        for (const PositionRun& r : cp_runs_)
            std::memcpy(out + b * rank_.Tl + r.lo, full + b * rank_.T + r.pos,
                        static_cast<size_t>(r.hi - r.lo) * sizeof(int));
}

float* DataParallel::losses(int m) {
    return losses_.data() + m * rank_.micro_B * rank_.Tl;
}

// The mean loss of the step's batch: the last stage holds every token's loss; canonical_sum / N.
double DataParallel::step_loss() {
    const i64 N = rank_.cfg.train.batch_size * rank_.T;
    gather_losses(all_losses_, losses_, 1, rank_.layout.microbatch_major());
    return canonical_sum(all_losses_.data(), N, rank_.nx.block) / static_cast<float>(N);
}

double DataParallel::mean_loss(const std::vector<float>& local, i64 batches) {
    std::vector<float> all;
    gather_losses(all, local, batches, false);
    const i64 n = static_cast<i64>(all.size());
    return canonical_sum(all.data(), n, rank_.nx.block) / static_cast<double>(n);
}

// Every replica's per-token losses of `batches` batches (each replica's `local` holds its
// local_B·T per batch), in token order: batch j, then replica (dp-rank-major), then sequence;
// by_microbatch (ZeroUnits' training batch): replica r's microbatch k is piece r of range k.
// Collective over the dp group (the last stages).
void DataParallel::gather_losses(std::vector<float>& all, const std::vector<float>& local,
                                 i64 batches, bool by_microbatch) {
    if (rank_.layout.cp > 1) return gather_cp_losses(all, local, batches);
    const int dp = rank_.layout.dp;
    const i64 per_rank = rank_.local_B * rank_.T;
    all.resize(static_cast<size_t>(batches * per_rank * dp));
    if (dp == 1) {
        std::copy(local.begin(), local.end(), all.begin());
        return;
    }
    std::vector<float> gathered(all.size());
    rank_.groups.dp->all_gather(gathered.data(), local.data(), batches * per_rank);
    const i64 piece = by_microbatch ? rank_.micro_B * rank_.T : per_rank;
    const i64 pieces = per_rank / piece;  // per replica and batch
    for (int r = 0; r < dp; r++)
        for (i64 j = 0; j < batches; j++)
            for (i64 k = 0; k < pieces; k++)
                std::memcpy(all.data() + ((j * pieces + k) * dp + r) * piece,
                            gathered.data() + (r * batches + j) * per_rank + k * piece,
                            static_cast<size_t>(piece) * sizeof(float));
}

// Every data-group rank's losses, `batches` batches of local_B sequences of T/cp tokens each, to
// token order: batch j, then replica, then sequence, then logical position (gather_losses').
void DataParallel::gather_cp_losses(std::vector<float>& all, const std::vector<float>& local,
                                    i64 batches) {
    const int dp = rank_.layout.dp, cp = rank_.layout.cp;
    const i64 T = rank_.T, Tl = rank_.Tl, B = rank_.local_B;
    const i64 per_rank = batches * B * Tl;
    std::vector<float> gathered(static_cast<size_t>(per_rank * dp * cp));
    rank_.groups.data->all_gather(gathered.data(), local.data(), per_rank);
    all.resize(static_cast<size_t>(batches * dp * B * T));
    for (int d = 0; d < dp; d++)
        for (int c = 0; c < cp; c++) {
            const float* src = gathered.data() + (d * cp + c) * per_rank;
            const std::vector<PositionRun> runs = zigzag_runs(T, cp, c);
            for (i64 j = 0; j < batches; j++)
                for (i64 s = 0; s < B; s++)
                    for (const PositionRun& r : runs)
                        std::memcpy(all.data() + ((j * dp + d) * B + s) * T + r.pos,
                                    src + (j * B + s) * Tl + r.lo,
                                    static_cast<size_t>(r.hi - r.lo) * sizeof(float));
        }
}

// ---- the step --------------------------------------------------------------------------------

void DataParallel::begin_step() {
    if (units_) units_->reset_peaks();
    if (zero_ == 3 && !units_) shards_->all_gather_params(*rank_.groups.dp, model_->params());
    for (TreeAccumulator& a : acc_) a.reset();
}

void DataParallel::backward(GPT& model, Activations& acts, int c, int m, float dloss,
                            WeightGradQueue* defer) {
    if (units_) {  // the hooks zero, reduce-scatter and accumulate unit by unit
        PX_ASSERT(!defer, "deferred weight gradients under ZeRO-2/3's unit hooks");
        units_->begin_microbatch(m, [this, m](float* g, i64 lo, i64 hi) {
            if (tap_) tap_(m, g, lo, hi);
        });
        model.backward(acts, c, grads_.f32(), tokens(m), targets(m), dloss);
        return;
    }
    TreeAccumulator& acc = acc_[static_cast<size_t>(c)];
    const std::vector<float*> bufs = acc.begin(m);
    const std::vector<Range>& rows = leaf_rows_[static_cast<size_t>(m)];
    std::vector<TokenNode> nodes;
    for (size_t i = 0; i < bufs.size(); i++) nodes.push_back({rows[i].lo, rows[i].hi, bufs[i]});
    model.backward(acts, c, nodes, tokens(m), targets(m), dloss, defer);
    if (!defer) end_microbatch(c, m);
}

// The microbatch's weight gradients are all in its nodes: the tap sees its first node (all of it
// when it is one), and the nodes combine in the token tree.
void DataParallel::end_microbatch(int c, int m) {
    TreeAccumulator& acc = acc_[static_cast<size_t>(c)];
    const GradSpan span = model_->grad_span(c);
    if (tap_) tap_(m, acc.leaf_buffer(m), span.lo, span.hi);
    acc.end(m);
}

void DataParallel::weight_backward(int c, int m, WeightGradQueue& defer) {
    defer.run();
    end_microbatch(c, m);
}

float* DataParallel::grads() const {
    return grads_.f32();
}

// The owners' nodes of the token tree combine above them (the LM head's part of dwte too),
// before anything reads the gradient.
void DataParallel::reduce_grads(StepGrads& grads) {
    float* g = grads.g;
    const i64 total = model_->table().total;
    if (zero_ >= 2) {
        grads.complete = {{shards_->lo(), shards_->hi()}};
        if (checked_opt_) grads.complete.push_back({checked_opt_->lo(), checked_opt_->hi()});
    } else {
        grads.complete = {{0, total}};
    }
    if (units_) {  // reduced unit by unit during backward: the step's shard
        units_->finish();
        shards_->combine_tied(g);
        grads.tied_combined = true;
        return;
    }
    for (const TreeAccumulator& a : acc_)
        PX_ASSERT(a.complete(), "the schedule left a microbatch's backward out");
    comm::Communicator* data = rank_.data_group();
    if (!plan_.rank_tree && data) {
        combine_nodes_across_replicas(g);
    } else if (zero_ >= 2) {
        shards_->reduce_scatter_stage(*rank_.groups.dp, g, rank_.layout.algo);
    } else if (data) {
        data->all_reduce(g, model_->grad_layout().total, rank_.layout.algo);
    }
}

// The owners' ranges are not one node each, or their tree over rank indices is not the block
// tree: each owner's nodes (its accumulators' targets: g holds the first, the others their own
// buffers) combine in the block tree by the tree exchange, and every owner gets the whole
// reduced gradient (under ZeRO-2, the shard it owns is a part of it). Fast mode adds an owner's
// nodes locally and reduces as usual.
void DataParallel::combine_nodes_across_replicas(float* g) {
    const i64 w = model_->grad_layout().total;
    const size_t k = acc_.front().targets().size();
    const bool fast = rank_.nx.mode == Mode::fast;
    // Bitwise: the k targets as rows (k, w), kept between steps (the step's hot path).
    if (!fast) {
        node_values_.resize(k * static_cast<size_t>(w));
        std::memcpy(node_values_.data(), g, static_cast<size_t>(w) * sizeof(float));
    }
    for (size_t c = 0; c < acc_.size(); c++) {
        const GradSpan s = model_->grad_span(static_cast<int>(c));
        for (size_t j = 1; j < k; j++) {
            const float* t = acc_[c].target_buffer(j);
            if (fast)
                for (i64 i = s.lo; i < s.hi; i++) g[i] += t[i];
            else
                std::memcpy(node_values_.data() + j * static_cast<size_t>(w) + s.lo, t + s.lo,
                            static_cast<size_t>(s.hi - s.lo) * sizeof(float));
        }
    }
    if (fast)
        rank_.data_group()->all_reduce(g, w, rank_.layout.algo);
    else
        exchange_and_combine(*rank_.data_group(), plan_, node_values_.data(), w, g);
}

void DataParallel::entry_sums(const float* g, EntrySums& s) {
    if (s.done) return;
    const GPT& m = *model_;
    if (s.group) {
        s.sums = shards_->sum_squares(*s.group, g, s.owned);
    } else {
        s.sums.assign(s.owned.size(), 0.0f);
        for (size_t i = 0; i < s.owned.size(); i++)
            if (s.owned[i])
                s.sums[i] = ops::sum_squares(rank_.nx,
                                             m.grad(const_cast<float*>(g), static_cast<int>(i)));
    }
    s.done = true;
}

void DataParallel::update(float* g, float grad_norm, float lr, int step, const TrainConfig& tc) {
    opt_->step(*model_, g, grad_norm, lr, step, tc);
    if (checked_opt_)  // the replica check's second copy of the next rank's update
        checked_opt_->step(*model_, checked_w_.data(), g, grad_norm, lr, step, tc);
}

// ZeRO-1/2: every replica updated its shard. ZeRO-3 holds only its shard between steps (under
// ZeroUnits each unit's weights are gathered when it runs).
void DataParallel::after_update(bool /*applied*/) {
    if (zero_ == 1 || zero_ == 2)
        shards_->all_gather_params(*rank_.zero_group(), model_->params());
    if (zero_ == 3 && !units_) shards_->release_params(model_->param_arena());
    if (zero_ >= 2 && !units_) {
        // Between steps a replica holds only its shard of the gradient; the microbatch partials
        // and the rest of the buffer go back to the system until the next step's backward.
        decommit_f32(grads_, 0, shards_->lo());
        grads_.decommit(bytes_of(DType::f32, shards_->hi()), grads_.bytes());
        for (TreeAccumulator& a : acc_) a.release();
    }
}

void DataParallel::begin_eval() {
    if (zero_ == 3 && !units_) shards_->all_gather_params(*rank_.groups.dp, model_->params());
}

void DataParallel::end_eval() {
    if (zero_ == 3 && !units_) shards_->release_params(model_->param_arena());
}

// ZeRO-3 keeps only a shard between steps: the finished run holds the whole model.
void DataParallel::end_run() {
    if (zero_ == 3) shards_->all_gather_params(*rank_.groups.dp, model_->params());
}

// ---- the replica check -----------------------------------------------------------------------

void DataParallel::check_updates() {
    if (!shards_ || checked_opt_) return;
    shards_->check_next();
    if (units_) units_->hold_checked();
    const int c = shards_->checked();
    const i64 lo = shards_->lo(c), hi = shards_->hi(c);
    checked_opt_ = std::make_unique<AdamW>(*model_, lo, hi);
    // The owner's state now (zeros, or what a resume read): its shard, gathered once.
    std::vector<float> whole(static_cast<size_t>(model_->table().total));
    auto take = [&](const float* mine, float* out) {
        shards_->all_gather_shards(*rank_.zero_group(), whole.data(), mine);
        std::copy(whole.begin() + lo, whole.begin() + hi, out);
    };
    checked_w_.resize(static_cast<size_t>(hi - lo));
    take(model_->params() + shards_->lo(), checked_w_.data());
    take(opt_->m(), checked_opt_->m());
    take(opt_->v(), checked_opt_->v());
}

ShardState DataParallel::own_shard() const {
    if (!shards_) return {};
    return {rank_.at.dp, opt_->lo(), opt_->hi(), model_->params() + opt_->lo(), opt_->m(),
            opt_->v()};
}

ShardState DataParallel::checked_shard() const {
    if (!checked_opt_) return {};
    return {shards_->checked(), checked_opt_->lo(), checked_opt_->hi(), checked_w_.data(),
            checked_opt_->m(), checked_opt_->v()};
}

// ---- state -----------------------------------------------------------------------------------

Range DataParallel::weights_held() const {
    if (zero_ == 3) return {shards_->lo(), shards_->hi()};
    return {0, model_->table().total};
}

// The replica check's second copy: its weights, then its moments.
void DataParallel::save(PartState& s) const {
    s.floats.clear();
    if (!checked_opt_) return;
    s.floats = checked_w_;
    s.floats.insert(s.floats.end(), checked_opt_->m(), checked_opt_->m() + checked_opt_->size());
    s.floats.insert(s.floats.end(), checked_opt_->v(), checked_opt_->v() + checked_opt_->size());
}

void DataParallel::restore(const PartState& s) {
    const size_t n = checked_w_.size();
    PX_ASSERT(s.floats.size() == (checked_opt_ ? n + 2 * static_cast<size_t>(checked_opt_->size())
                                               : 0),
              "a snapshot of another model or optimizer shard");
    if (!checked_opt_) return;
    const float* at = s.floats.data();
    std::copy(at, at + n, checked_w_.begin());
    at += n;
    std::copy(at, at + checked_opt_->size(), checked_opt_->m());
    at += checked_opt_->size();
    std::copy(at, at + checked_opt_->size(), checked_opt_->v());
}

void DataParallel::restore(const CheckpointReader& /*file*/) {
    if (zero_ == 3) shards_->release_params(model_->param_arena());
}

void DataParallel::unshard() {
    if (!shards_) return;
    if (zero_ == 3) shards_->all_gather_params(*rank_.zero_group(), model_->params());
    auto whole = std::make_unique<AdamW>(*model_);
    shards_->all_gather_shards(*rank_.zero_group(), whole->m(), opt_->m());
    shards_->all_gather_shards(*rank_.zero_group(), whole->v(), opt_->v());
    opt_ = std::move(whole);
    checked_opt_.reset();
    checked_w_.clear();
    model_->set_unit_hooks(nullptr);
    units_.reset();
    shards_.reset();
    zero_ = 0;
}

// The replicas (and under cp the context ranks, which hold the same state) split the writing;
// under ep the replicas of a local array are the expert-data group's ranks (ZeRO's, too).
RankState DataParallel::replica_state() const {
    const Layout& l = rank_.layout;
    const bool ep = l.ep > 1;
    return px::replica_state(*model_, model_->params(), *opt_, ep ? l.dp / l.ep : l.dp * l.cp,
                             ep ? rank_.at.dp / l.ep : rank_.at.dp * l.cp + rank_.at.cp,
                             zero_ == 3);
}

const float* DataParallel::whole_moments(std::vector<float>& buf, const float* shard) const {
    if (!shards_) return shard;
    buf.resize(static_cast<size_t>(model_->table().total));
    shards_->all_gather_shards(*rank_.zero_group(), buf.data(), shard);
    return buf.data();
}

bool DataParallel::gather_weights() {
    if (zero_ != 3) return false;
    shards_->all_gather_params(*rank_.zero_group(), model_->params());
    return true;
}

void DataParallel::release_weights() {
    shards_->release_params(model_->param_arena());
}

// Under ZeRO-2/3 the weights (ZeRO-3) and gradients are measured: the shards, and under
// ZeroUnits the most that one unit in flight mapped. A pipeline stage gathers its ZeRO-3 weights
// once per step and keeps them through the schedule, and reduce-scatters its gradient after the
// last microbatch (as TorchTitan's FSDP under pipeline parallelism does), so its peaks are the
// whole stage's.
void DataParallel::memory(MemoryStats& m) const {
    m.grads = grads_.bytes();
    for (const TreeAccumulator& a : acc_) m.grads += a.bytes();
    m.peak_params = m.params;
    m.peak_grads = m.grads;
    if (zero_ == 3) m.params = model_->param_arena().resident_bytes();
    if (zero_ >= 2) {
        m.grads = grads_.resident_bytes();
        for (const TreeAccumulator& a : acc_) m.grads += a.resident_bytes();
    }
    if (units_) {
        m.grads += units_->partial_bytes();
        m.peak_params = std::max(m.params, units_->peak_params());
        m.peak_grads = std::max(m.grads, units_->peak_grads());
    }
    m.optimizer = 2 * opt_->size() * static_cast<i64>(sizeof(float));
    if (checked_opt_)  // the replica check's second copy of a shard: weights and moments
        m.optimizer += (2 * checked_opt_->size() + static_cast<i64>(checked_w_.size())) *
                       static_cast<i64>(sizeof(float));
    if (shards_) m.comm += shards_->staging_bytes();
}

}  // namespace px
