// The trainer's step: the rank's schedule of actions executed with asynchronous sends and
// blocking recvs, microbatch gradients combined in the token tree per chunk (or, under ZeRO-2/3
// on one stage, reduce-scattered unit by unit), then the step's reductions over replicas and
// stages (tied wte, loss, grad norm) formed exactly as the single device forms them, and the
// update. Construction, evaluation and the run are here too; the state the job hands out
// (snapshots, checkpoints' pieces, the logical state, memory) is in job_state.cpp.
#include "core/train/job.h"

#include "core/io/checkpoint_llmc.h"
#include "core/train/memory.h"
#include "core/model/data.h"
#include "core/base/error.h"
#include "core/parallel/context_parallel.h"
#include "core/parallel/expert_parallel.h"
#include "core/parallel/pipeline.h"
#include "core/parallel/tp_model.h"
#include "core/parallel/zero.h"
#include "kernels/ops.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>

namespace px {

namespace {

// Tags outside message_tag's range [0, 2·microbatches·S) of a step's messages.
constexpr int kTiedTag = 1 << 29;      // the two parts of dwte, first <-> last stage
constexpr int kEvalTagBase = 1 << 28;  // validation forwards: + the receiving virtual stage

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Windows (count, T+1) -> inputs and targets (count, T).
void split_windows(int* inputs, int* targets, const int* windows, i64 count, i64 T) {
    for (i64 b = 0; b < count; b++) {
        const int* w = windows + b * (T + 1);
        std::memcpy(inputs + b * T, w, static_cast<size_t>(T) * sizeof(int));
        std::memcpy(targets + b * T, w + 1, static_cast<size_t>(T) * sizeof(int));
    }
}

int size_of(const comm::Communicator* c) {
    return c ? c->size() : 1;
}
int rank_in(const comm::Communicator* c) {
    return c ? c->rank() : 0;
}

Layout one_device_layout(const Config& cfg) {
    check_memory(cfg, MemoryScope::process);  // before the layout's tables and the job's arenas
    Layout l = make_layout(cfg);
    if (l.world_size() != 1)
        throw ConfigError(cfg.source_name + ": layout.dp × layout.pp × layout.cp × layout.tp = " +
                          std::to_string(l.dp) + " × " + std::to_string(l.pp) + " × " +
                          std::to_string(l.cp) + " × " + std::to_string(l.tp) +
                          " ranks, but this job runs on one device; run the layout on its ranks "
                          "(parallax train, run_layout), or set the four to 1");
    return l;
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

// One set of activations for one (microbatch, chunk), and the send that still reads from it.
Job::Job(const Config& cfg) : Job(cfg, one_device_layout(cfg), RankGroups{}) {}

Job::Job(const Config& cfg, const Layout& layout, RankGroups groups)
    : cfg_(cfg),
      layout_(layout),
      nx_(make_numerics(cfg.numerics)),
      mesh_(layout, Mesh::Validated{}),
      schedule_(mesh_.schedule()),
      groups_(groups),
      scaler_(cfg.precision) {
    const std::pair<const char*, comm::Communicator*> given[] = {
        {"pp", groups_.pp}, {"dp", groups_.dp}, {"tp", groups_.tp}, {"cp", groups_.cp}};
    const int want[] = {layout_.pp, layout_.dp, layout_.tp, layout_.cp};
    for (int d = 0; d < 4; d++)
        if (size_of(given[d].second) != want[d])
            throw ConfigError("the " + std::string(given[d].first) + " group has " +
                              std::to_string(size_of(given[d].second)) + " ranks but layout." +
                              given[d].first + " = " + std::to_string(want[d]));
    pp_rank_ = rank_in(groups_.pp);
    dp_rank_ = rank_in(groups_.dp);
    tp_rank_ = rank_in(groups_.tp);
    cp_rank_ = rank_in(groups_.cp);
    ep_rank_ = dp_rank_ % layout_.ep;
    if (layout_.ep > 1 && (size_of(groups_.ep) != layout_.ep ||
                           size_of(groups_.expert_data) != layout_.dp / layout_.ep))
        throw ConfigError("the ep group has " + std::to_string(size_of(groups_.ep)) +
                          " ranks and the expert-data group " +
                          std::to_string(size_of(groups_.expert_data)) + " but layout.ep = " +
                          std::to_string(layout_.ep) + " of layout.dp = " +
                          std::to_string(layout_.dp));
    if (layout_.cp > 1 && size_of(groups_.data) != layout_.dp * layout_.cp)
        throw ConfigError("the data group has " + std::to_string(size_of(groups_.data)) +
                          " ranks but layout.dp × layout.cp = " +
                          std::to_string(layout_.dp * layout_.cp));
    if (cfg_.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg_.train.threads));

    T_ = cfg_.model.seq_len;
    Tl_ = layout_.local_seq_len();
    micro_B_ = layout_.microbatch_size();
    local_B_ = micro_B_ * layout_.microbatches;
    recompute_ = layout_.recompute == Recompute::full;

    source_ = make_source(cfg_);
    if (source_->vocab() > cfg_.model.vocab)
        throw ConfigError("the data has " + std::to_string(source_->vocab()) +
                          " symbols but model.vocab = " + std::to_string(cfg_.model.vocab));

    // Who owns which tensor of the whole model: a layer's stage's rank; wte and wpe the first
    // stage (which holds wte's complete gradient as well as the last), ln_f the last.
    for (int r = 0; r < layout_.pp; r++) parts_.push_back(stage_part(mesh_, r));
    owner_.assign(static_cast<size_t>(ParamTable::num_tensors(cfg_.model)), -1);
    for (int r = 0; r < layout_.pp; r++) {
        const ParamTable t = ParamTable::build(cfg_.model, parts_[static_cast<size_t>(r)]);
        for (const TableEntry& e : t.entries)
            if (owner_[static_cast<size_t>(e.id)] < 0) owner_[static_cast<size_t>(e.id)] = r;
    }
    build_model();

    // Messages: the whole (micro_B,T,C) hidden state, or under sequence parallelism this tp
    // rank's token rows of it (all that a stage's first block reads and its last block writes;
    // the same tp rank of the next stage holds the same rows).
    msg_n_ = micro_B_ * Tl_ * cfg_.model.hidden;
    if (const ParallelLayers* pl = model_->parallel_layers(); pl && pl->sequence_parallel()) {
        const TokenRows r = pl->token_rows(micro_B_ * Tl_);
        msg_lo_ = r.lo * cfg_.model.hidden;
        msg_n_ = (r.hi - r.lo) * cfg_.model.hidden;
    }

    // ZeRO: each replica keeps the AdamW moments of one shard of its parameters and updates
    // only that shard (core/parallel/zero.h). Under expert parallelism the replicas of a local
    // array are the expert-data group's ranks (ZeRO-1 only: the optimizer state).
    const int zero_ranks = layout_.dp / layout_.ep;
    zero_ = zero_ranks > 1 ? layout_.zero : 0;
    // The gradient buffer is written whole every step, except under ZeRO-2/3, which hand its
    // pages back between units and steps.
    grads_ = Arena(bytes_of(DType::f32, model_->grad_layout().total),
                   layout_.zero >= 2 && layout_.dp / layout_.ep > 1 ? Arena::Pages::on_touch
                                                                   : Arena::Pages::now);
    if (zero_ >= 1) {
        shards_ = std::make_unique<ZeroShards>(*model_, zero_ranks, dp_rank_ / layout_.ep);
        opt_ = std::make_unique<AdamW>(*model_, shards_->lo(), shards_->hi());
    } else {
        opt_ = std::make_unique<AdamW>(*model_);
    }
    if (layout_.microbatch_major()) {
        const i64 bpm = layout_.microbatches > 1 ? micro_B_ * T_ / nx_.block : 1;
        // ZeRO-2/3 on one stage: the model tells ZeroUnits before and after each unit; weights
        // (ZeRO-3) and gradients are mapped only while a unit runs, and only the shard is kept.
        // Microbatch k of the batch is one node, cut into one piece per replica; the nodes
        // combine in the tree over microbatches.
        std::vector<unsigned char> merges(static_cast<size_t>(layout_.microbatches), 0);
        leaf_schedule(0, bpm * layout_.dp * layout_.microbatches, bpm * layout_.dp, merges);
        units_ = std::make_unique<ZeroUnits>(*model_, *shards_, *groups_.dp, zero_, grads_,
                                             std::move(merges));
        model_->set_unit_hooks(units_.get());
        units_->reset_peaks();
    } else if (layout_.cp > 1) {
        build_cp_leaves();  // job_cp.cpp
    } else {
        // Microbatch m owns token blocks [lo, hi) of the batch's tree (mesh.h token_ranges): one
        // node, or several when the cut does not follow the tree's splits (dp = 3, 6, ...). Its
        // nodes are the accumulator's leaves; GPT::backward computes each one's weight gradients
        // over its rows alone. The subtree below a node has the same shape wherever it starts.
        const i64 nb = layout_.token_blocks(), N = cfg_.train.batch_size * T_;
        std::vector<std::vector<Range>> leaves;
        std::vector<std::vector<Range>> owned(static_cast<size_t>(layout_.dp));
        for (const TokenRange& r : token_ranges(layout_)) {
            owned[static_cast<size_t>(r.dp_rank)].push_back({r.block_lo, r.block_hi});
            if (r.dp_rank != dp_rank_) continue;
            leaves.push_back(maximal_nodes(nb, r.block_lo, r.block_hi));
            std::vector<Range> rows;
            const i64 first = r.sample_lo * T_;
            for (const Range& n : leaves.back())
                rows.push_back({n.lo * nx_.block - first, std::min(n.hi * nx_.block, N) - first});
            leaf_rows_.push_back(std::move(rows));
        }
        plan_ = make_plan(nb, owned);
        for (int c = 0; c < model_->num_chunks(); c++)
            acc_.emplace_back(nb, leaves, grads_.f32(), model_->grad_layout().total,
                              model_->grad_span(c));
        if (layout_.ep > 1) build_ep();  // job_ep.cpp
    }
    if (zero_ == 3) shards_->release_params(model_->param_arena());
    const size_t chunks = static_cast<size_t>(model_->num_chunks());
    slots_.resize(chunks);
    free_.resize(chunks);
    live_.assign(chunks, std::vector<Slot*>(static_cast<size_t>(layout_.microbatches), nullptr));
    // Every chunk's first activation set now, its pages mapped, and the fast matmul's one-time
    // setup: not inside the first step.
    for (int c = 0; c < static_cast<int>(chunks); c++) release(c, acquire(c));
    ops::warm_up_matmul(nx_);

    windows_.resize(static_cast<size_t>(local_B_ * (T_ + 1)));
    inputs_.resize(static_cast<size_t>(local_B_ * T_));
    targets_.resize(static_cast<size_t>(local_B_ * T_));
    losses_.resize(static_cast<size_t>(local_B_ * Tl_));
    if (layout_.cp > 1) {
        cp_inputs_.resize(static_cast<size_t>(local_B_ * Tl_));
        cp_targets_.resize(static_cast<size_t>(local_B_ * Tl_));
    }
    all_losses_.resize(static_cast<size_t>(cfg_.train.batch_size * T_));
}

Job::~Job() = default;

// The rank's model: its stage's part of the layers, over its tp group's TpLayers when the stage
// is cut over one; its weights from model.init_from (whole logical tensors: this rank keeps its
// part) or the Philox initialisation (a part draws exactly what the whole model has there).
void Job::build_model() {
    // Expert parallelism: the stage's part with this rank's share of the experts.
    const ModelPart part = expert_part(parts_[static_cast<size_t>(pp_rank_)], cfg_.model,
                                       layout_.ep, ep_rank_);
    std::shared_ptr<const TpLayers> tpl;
    if (layout_.tp > 1)
        tpl = std::make_shared<const TpLayers>(*groups_.tp, nx_, cfg_.model,
                                               cfg_.layout.sequence_parallel);
    model_ = std::make_unique<GPT>(cfg_.model, nx_, part, tpl, activation_dtype(cfg_.precision));
    if (layout_.cp > 1) {  // context parallelism: this rank's zig-zag tokens, core/parallel
        if (model_->activation_dtype() != DType::f32)
            throw ConfigError("layout.cp=" + std::to_string(layout_.cp) +
                              " runs fp32 activations only for now; set precision.activations = "
                              "\"fp32\" or layout.cp = 1");
        auto cpa = make_cp_attention(*groups_.cp, layout_.cp_method, T_, nx_.block);
        cp_runs_ = cpa->runs(Tl_);
        model_->set_context(std::move(cpa));
    }
    if (cfg_.precision.fp8 != "off") {
        fp8_ = std::make_shared<Fp8Scaling>(cfg_.model, cfg_.precision, layout_.tp, nx_);
        model_->set_fp8(fp8_);
    }
    if (cfg_.model.init_from.empty()) {
        model_->init_random(cfg_.train.seed, cfg_.model.init_std);
        return;
    }
    const ParamTable full = ParamTable::build(cfg_.model);
    if (tpl) {  // the logical tensors whole, then this shard's slices
        std::vector<float> buf(static_cast<size_t>(full.total));
        read_init_weights(cfg_.model.init_from, cfg_.model, [&](const std::string& name) {
            const int i = full.find(name);
            return i < 0 ? nullptr : buf.data() + full.entries[static_cast<size_t>(i)].offset;
        });
        load_logical(*tpl, *model_, full, buf.data());
        return;
    }
    // This part's tensors in place; the rest is read into a scratch buffer and dropped.
    const GPT& m = *model_;
    std::vector<float> discard;
    read_init_weights(cfg_.model.init_from, cfg_.model, [&](const std::string& name) {
        if (float* p = m.param_ptr(name)) return p;
        const int i = full.find(name);
        if (i < 0) return static_cast<float*>(nullptr);
        discard.resize(static_cast<size_t>(full.entries[static_cast<size_t>(i)].numel()));
        return discard.data();
    });
}

i64 Job::num_params() const {
    return ParamTable::build(cfg_.model).num_params;
}

double Job::loss_floor() const {
    return source_->base().window_floor(cfg_.model.seq_len);
}

double Job::entropy_rate() const {
    return source_->base().entropy_rate();
}

float* Job::grads() const {
    return grads_.f32();
}

bool Job::is_last_virtual(int chunk) const {
    return stage_of(pp_rank_, chunk, layout_.pp) == layout_.num_stages() - 1;
}

double Job::book_bytes_sent(const comm::Communicator* c, bool (*keep)(const comm::StatRow&)) {
    if (!c) return 0;
    double b = 0;
    for (const comm::StatRow& r : c->stats_book()->rows())
        if (!keep || keep(r)) b += static_cast<double>(r.bytes_sent);
    return b;
}

double Job::bytes_sent() const {
    // Every communicator of a rank shares one book (comm.h): any group's counts all of them.
    return book_bytes_sent(groups_.world ? groups_.world
                           : groups_.pp  ? groups_.pp
                           : groups_.dp  ? groups_.dp
                                         : groups_.tp);
}

// ---- activation sets -------------------------------------------------------------------------

// A free set of activations whose last outgoing message has landed; a new one if none has.
// Never waiting on a send here keeps sends asynchronous, as the schedule's deadlock argument
// requires.
Job::Slot* Job::acquire(int chunk) {
    auto& pool = free_[static_cast<size_t>(chunk)];
    for (size_t i = 0; i < pool.size(); i++) {
        Slot* s = pool[i];
        if (!s->pending.test()) continue;
        s->pending.wait();  // completed: returns at once (and rethrows a failure)
        pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(i));
        return s;
    }
    auto slot = std::make_unique<Slot>();
    slot->acts = model_->make_activations(chunk, micro_B_, Tl_, recompute_);
    slots_[static_cast<size_t>(chunk)].push_back(std::move(slot));
    return slots_[static_cast<size_t>(chunk)].back().get();
}

void Job::release(int chunk, Slot* s) {
    free_[static_cast<size_t>(chunk)].push_back(s);
}

void Job::wait_sends() {
    for (auto& chunk : slots_)
        for (auto& s : chunk) s->pending.wait();
}

// ---- the step --------------------------------------------------------------------------------

// This replica's sequences of the step's batch: [dp_rank·local_B, (dp_rank+1)·local_B), cut
// into microbatches; under ZeroUnits piece dp_rank of every microbatch's range (zero.h).
i64 Job::first_row(int m) const {
    if (layout_.microbatch_major())
        return m * (cfg_.train.batch_size / layout_.microbatches) + dp_rank_ * micro_B_;
    return dp_rank_ * local_B_ + m * micro_B_;
}

// The model's probes for microbatch m: this replica's rows of it in the step's batch.
void Job::set_probe_rows(int m) {
    if (!probes_) return;
    probe_ctx_.step = step_ + 1;
    probe_ctx_.batch_total = cfg_.train.batch_size;
    probe_ctx_.batch_lo = first_row(m);
    model_->set_probes(probes_, &probe_ctx_);
}

// Microbatch m's gradient [lo, hi) as backward leaves it: probed as node first_row/micro_B of
// the batch's microbatches, then offered to the hooks.
void Job::microbatch_grad(int m, float* grads, i64 lo, i64 hi) {
    for (const StepHooks& h : hooks_)
        if (h.microbatch_grad) h.microbatch_grad(step_ + 1, m, grads, lo, hi);
    // Under cp a rank's microbatch gradient is its part of a node only, and under ep its experts'
    // gradients are other ranks' nodes: no "mgrad" probe.
    if (probes_ && layout_.cp == 1 && layout_.ep == 1)
        model_->probe_params(*probes_, step_ + 1, "mgrad", "param", grads + lo, lo, hi,
                             first_row(m) / micro_B_, cfg_.train.batch_size / micro_B_);
}

void Job::backward(Slot& slot, int c, int m) {
    const float dloss = scaler_.dloss(cfg_.train.batch_size * T_);  // times the loss scale
    set_probe_rows(m);
    if (units_) {  // the hooks zero, reduce-scatter and accumulate unit by unit
        units_->begin_microbatch(
            m, [this, m](float* g, i64 lo, i64 hi) { microbatch_grad(m, g, lo, hi); });
        model_->backward(slot.acts, c, grads_.f32(), tokens(m), targets(m), dloss);
        return;
    }
    TreeAccumulator& acc = acc_[static_cast<size_t>(c)];
    const std::vector<float*> bufs = acc.begin(m);
    const std::vector<Range>& rows = leaf_rows_[static_cast<size_t>(m)];
    std::vector<TokenNode> nodes;
    for (size_t i = 0; i < bufs.size(); i++) nodes.push_back({rows[i].lo, rows[i].hi, bufs[i]});
    if (ep_) ep_begin_backward(c, m);
    model_->backward(slot.acts, c, nodes, tokens(m), targets(m), dloss);
    if (ep_) ep_end_backward(c, m);
    // The hooks and the "mgrad" probe see the microbatch's first node (all of it when it is one).
    const GradSpan span = model_->grad_span(c);
    microbatch_grad(m, bufs[0], span.lo, span.hi);
    acc.end(m);
}

void Job::compute_hooks(const Action& a, bool done) {
    for (const StepHooks& h : hooks_)
        if (h.compute) h.compute(step_ + 1, a, done);
}

// This rank's list, in order (schedule.h gives each action's meaning).
void Job::run_actions() {
    comm::Communicator* pp = groups_.pp;
    for (const Action& a : schedule_.ranks[static_cast<size_t>(pp_rank_)]) {
        const int c = a.chunk, m = a.microbatch;
        Slot*& live = live_[static_cast<size_t>(c)][static_cast<size_t>(m)];
        switch (a.kind) {
            case Action::recv_act:
                PX_ASSERT(live == nullptr, "recv_act for a microbatch already in flight");
                live = acquire(c);
                recv_message(*pp, message(live->acts.input()), a.peer,
                             message_tag(schedule_, pp_rank_, a));
                break;
            case Action::forward:
                compute_hooks(a, false);
                set_probe_rows(m);
                if (live == nullptr) {
                    PX_ASSERT(stage_of(pp_rank_, c, layout_.pp) == 0,
                              "forward before its input arrived");
                    live = acquire(c);
                }
                model_->forward(live->acts, c, tokens(m), targets(m));
                if (is_last_virtual(c))
                    std::memcpy(losses_.data() + m * micro_B_ * Tl_, live->acts.losses().f32(),
                                static_cast<size_t>(micro_B_ * Tl_) * sizeof(float));
                compute_hooks(a, true);
                break;
            case Action::send_act:
                live->pending = send_message(*pp, message(live->acts.output()), a.peer,
                                             message_tag(schedule_, pp_rank_, a));
                break;
            case Action::recv_grad:
                // Into dresidual, which the pending send of the output does not read.
                recv_message(*pp, message(live->acts.dresidual()), a.peer,
                             message_tag(schedule_, pp_rank_, a));
                break;
            case Action::backward:
                // The output's send has landed (the gradient that came back needed it): complete
                // it before a recomputing backward writes the output again.
                live->pending.wait();
                compute_hooks(a, false);
                backward(*live, c, m);
                compute_hooks(a, true);
                if (stage_of(pp_rank_, c, layout_.pp) == 0) {  // nothing to send back
                    release(c, live);
                    live = nullptr;
                }
                break;
            case Action::send_grad:
                live->pending = send_message(*pp, message(live->acts.dresidual()), a.peer,
                                             message_tag(schedule_, pp_rank_, a));
                release(c, live);
                live = nullptr;
                break;
        }
    }
    model_->set_probes(nullptr, nullptr);
    wait_sends();
    for (size_t c = 0; c < live_.size(); c++) {
        PX_ASSERT(units_ || acc_[c].complete(), "the schedule left a microbatch's backward out");
        for (Slot* s : live_[c])
            PX_ASSERT(s == nullptr, "the schedule left a microbatch in flight");
    }
}

// The replicas' nodes of the token tree combine above them (the LM head's part of dwte too),
// before anything reads the gradient: then wte's two parts.
void Job::reduce_grads(float* g) {
    if (units_) {  // reduced unit by unit during backward: the step's shard
        units_->finish();
        shards_->combine_tied(g);
        return;
    }
    if (!plan_.rank_tree && data_group()) {
        combine_nodes_across_replicas(g);
    } else if (zero_ >= 2) {
        shards_->reduce_scatter_stage(*groups_.dp, g, layout_.algo);
    } else if (data_group()) {
        data_group()->all_reduce(g, model_->grad_layout().total, layout_.algo);
    }
    if (ep_) reduce_expert_grads(g);  // job_ep.cpp: over the expert-data group
    exchange_tied_grads(g);
}

// The replicas' ranges are not one node each, or their tree over rank indices is not the block
// tree: each replica's nodes (its accumulators' targets: g holds the first, the others their own
// buffers) combine in the block tree by the tree exchange, and every replica gets the whole
// reduced gradient (under ZeRO-2, the shard it owns is a part of it). Fast mode adds a replica's
// nodes locally and reduces as usual.
void Job::combine_nodes_across_replicas(float* g) {
    const i64 w = model_->grad_layout().total;
    const size_t k = acc_.front().targets().size();
    const bool fast = nx_.mode == Mode::fast;
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
        data_group()->all_reduce(g, w, layout_.algo);
    else
        exchange_and_combine(*data_group(), plan_, node_values_.data(), w, g);
}

// dwte = dwte(embedding) + dwte(LM head). On one stage, GPT::combine_tied_grads. Across stages
// the first sends its embedding part and receives the head's into its head region; the last
// the other way round, into its wte slot. Both then add in the same order.
void Job::exchange_tied_grads(float* g) {
    const GPT& m = *model_;
    if (!m.part().holds_wte()) return;
    if (layout_.pp > 1) {
        // This tp rank's rows of wte: the same rows on the first and the last stage.
        const i64 VC = m.table().entries[static_cast<size_t>(m.table().wte)].numel();
        float* emb = g + m.table().entries[static_cast<size_t>(m.table().wte)].offset;
        float* head = g + m.grad_layout().head_offset;
        const int peer = first_stage() ? layout_.pp - 1 : 0;
        comm::Handle h = groups_.pp->send_async(
            static_cast<const float*>(first_stage() ? emb : head), VC, peer, kTiedTag);
        groups_.pp->recv(first_stage() ? head : emb, VC, peer, kTiedTag);
        h.wait();
    }
    m.combine_tied_grads(g);
}

// Where this rank holds g complete after reduce_grads: the whole table, or under ZeRO-2/3 its
// shard (and the replica check's second shard); the rest of the buffer is not read again.
void Job::unscale_grads(float* g) {
    if (!scaler_.dynamic()) return;
    if (zero_ < 2) {
        scaler_.unscale(g, 0, model_->table().total);
        return;
    }
    scaler_.unscale(g, shards_->lo(), shards_->hi());
    if (checked_opt_) scaler_.unscale(g, checked_opt_->lo(), checked_opt_->hi());
}

void Job::update_fp8_scales() {
    if (!fp8_ || !fp8_->delayed()) return;
    std::vector<float>& amax = fp8_->step_amax();
    for (comm::Communicator* c : {groups_.tp, groups_.cp, groups_.dp, groups_.pp})
        if (c && !amax.empty()) c->all_reduce_max(amax.data(), static_cast<i64>(amax.size()));
    fp8_->update();
}

// 0/1 flags summed over each group in turn (exact in any order): every rank learns whether any
// rank of the world holds a non-finite gradient element.
bool Job::grads_finite_everywhere(const float* g) {
    bool ok = zero_ < 2 ? LossScaler::all_finite(g, 0, model_->table().total)
                        : LossScaler::all_finite(g, shards_->lo(), shards_->hi());
    if (checked_opt_) ok = ok && LossScaler::all_finite(g, checked_opt_->lo(), checked_opt_->hi());
    float bad = ok ? 0.0f : 1.0f;
    for (comm::Communicator* c : {groups_.tp, groups_.cp, groups_.dp, groups_.pp})
        if (c) c->all_reduce(&bad, 1, layout_.algo);
    return bad == 0.0f;
}

// ‖g‖₂: each tensor's canonical Σg² on the stage that owns it (from tp shards' exact block
// partials, from ZeRO-2/3's gradient shards), gathered over the pp group, then the tree over
// tensors in the whole model's order (global_grad_norm's).
float Job::grad_norm(float* g) {
    grad_sq_ = tensor_sums_of_squares(g, zero_ >= 2);
    const i64 n = static_cast<i64>(grad_sq_.size());
    float total = 0.0f;
    if (nx_.mode == Mode::bitwise) {
        total = tree_sum(grad_sq_.data(), n);
    } else {
        for (float x : grad_sq_) total += x;
    }
    return std::sqrt(total);
}

std::vector<float> Job::tensor_sums_of_squares(const float* g, bool sharded) {
    const GPT& m = *model_;
    sharded = sharded && shards_ != nullptr;
    const i64 n = static_cast<i64>(owner_.size());
    std::vector<char> owned(m.table().entries.size());
    for (size_t i = 0; i < owned.size(); i++)
        owned[i] = owner_[static_cast<size_t>(m.table().entries[i].id)] == pp_rank_;
    std::vector<float> sums;
    if (const auto* tpl = dynamic_cast<const TpLayers*>(m.parallel_layers()))
        sums = tp_sum_squares(*tpl, m, g, sharded ? groups_.dp : nullptr,
                              sharded ? shards_->lo() : 0, sharded ? shards_->hi() : -1);
    else if (sharded)
        sums = shards_->sum_squares(*groups_.dp, g, owned);
    else {
        sums.assign(owned.size(), 0.0f);
        for (size_t i = 0; i < owned.size(); i++)
            if (owned[i])
                sums[i] = ops::sum_squares(nx_, m.grad(const_cast<float*>(g), static_cast<int>(i)));
    }
    if (groups_.ep) ep_sum_squares(m, g, *groups_.ep, sums);  // the experts' shares
    std::vector<float> mine(static_cast<size_t>(n), 0.0f);
    for (size_t i = 0; i < owned.size(); i++)
        if (owned[i]) mine[static_cast<size_t>(m.table().entries[i].id)] = sums[i];
    std::vector<float> per_tensor(static_cast<size_t>(n));
    if (layout_.pp > 1) {  // the owners' values are gathered (copied, not added)
        std::vector<float> all(static_cast<size_t>(n * layout_.pp));
        groups_.pp->all_gather(all.data(), mine.data(), n);
        for (i64 id = 0; id < n; id++)
            per_tensor[static_cast<size_t>(id)] =
                all[static_cast<size_t>(owner_[static_cast<size_t>(id)] * n + id)];
    } else {
        per_tensor = std::move(mine);
    }
    return per_tensor;
}

Range Job::update_range() const { return {opt_->lo(), opt_->hi()}; }

void Job::all_reduce_max(float* v, i64 n) {
    for (comm::Communicator* c : {groups_.tp, groups_.cp, groups_.dp, groups_.pp})
        if (c && n > 0) c->all_reduce_max(v, n);
}

void Job::watch_logits(bool on) {
    watch_logits_ = on;
    logit_max_.assign(on ? static_cast<size_t>(cfg_.model.layers) : 0,
                      -std::numeric_limits<float>::infinity());
}

i64 Job::batch_index(i64 step) const {
    i64 b = step;
    for (i64 s : skipped_)  // sorted: each skipped batch at or before b moves b one further
        if (s <= b) b++;
    return b;
}

void Job::skip_batches(const std::vector<i64>& batches) {
    skipped_.insert(skipped_.end(), batches.begin(), batches.end());
    std::sort(skipped_.begin(), skipped_.end());
    skipped_.erase(std::unique(skipped_.begin(), skipped_.end()), skipped_.end());
}

void Job::emit_values(i64 step, const std::vector<NamedValue>& values) {
    for (Observer* o : observers_) o->on_values(*this, step, values);
}

// Every replica's per-token losses of `batches` batches (each replica's `local` holds its
// local_B·T per batch), in token order: batch j, then replica (dp-rank-major), then sequence;
// by_microbatch (ZeroUnits' training batch): replica r's microbatch k is piece r of range k.
// Collective over the dp group (the last stages).
void Job::gather_losses(std::vector<float>& all, const std::vector<float>& local, i64 batches,
                        bool by_microbatch) {
    if (layout_.cp > 1) return gather_cp_losses(all, local, batches);  // job_cp.cpp
    const int dp = layout_.dp;
    const i64 per_rank = local_B_ * T_;
    all.resize(static_cast<size_t>(batches * per_rank * dp));
    if (dp == 1) {
        std::copy(local.begin(), local.end(), all.begin());
        return;
    }
    std::vector<float> gathered(all.size());
    groups_.dp->all_gather(gathered.data(), local.data(), batches * per_rank);
    const i64 piece = by_microbatch ? micro_B_ * T_ : per_rank;
    const i64 pieces = per_rank / piece;  // per replica and batch
    for (int r = 0; r < dp; r++)
        for (i64 j = 0; j < batches; j++)
            for (i64 k = 0; k < pieces; k++)
                std::memcpy(all.data() + ((j * pieces + k) * dp + r) * piece,
                            gathered.data() + (r * batches + j) * per_rank + k * piece,
                            static_cast<size_t>(piece) * sizeof(float));
}

// The mean loss of the step's batch: the last stage holds every token's loss; canonical_sum / N
// there, then broadcast over the pipeline.
double Job::step_loss() {
    const i64 N = cfg_.train.batch_size * T_;
    double loss = 0;
    if (last_stage()) {
        gather_losses(all_losses_, losses_, 1, layout_.microbatch_major());
        loss = canonical_sum(all_losses_.data(), N, nx_.block) / static_cast<float>(N);
    }
    if (groups_.pp) groups_.pp->broadcast(&loss, 1, layout_.pp - 1);
    return loss;
}

StepMetrics Job::step() {
    const auto t0 = std::chrono::steady_clock::now();
    const double sent0 = bytes_sent();
    const double cp0 = layout_.cp > 1 ? cp_bytes_sent() : 0;
    const double ep0 = layout_.ep > 1 ? ep_bytes_sent() : 0;
    const TrainConfig& tc = cfg_.train;
    const i64 N = tc.batch_size * T_;

    for (const StepHooks& h : hooks_)
        if (h.before) h.before(step_ + 1);
    if (units_) units_->reset_peaks();
    if (zero_ == 3 && !units_) shards_->all_gather_params(*groups_.dp, model_->params());
    // Every rank of a replica samples the replica's sequences of the step's batch
    // (counter-based, so identically): the first stage needs the tokens, the last the targets.
    i64 batch = batch_index(step_);
    if (swap_step_ == step_ + 1) batch = swap_batch_;
    swap_step_ = swap_batch_ = -1;
    if (layout_.microbatch_major()) {
        for (int k = 0; k < layout_.microbatches; k++)
            source_->sample(windows_.data() + k * micro_B_ * (T_ + 1), T_, Split::train, batch,
                            first_row(k), micro_B_);
    } else {
        source_->sample(windows_.data(), T_, Split::train, batch, first_row(0), local_B_);
    }
    split_windows(inputs_.data(), targets_.data(), windows_.data(), local_B_, T_);
    if (layout_.cp > 1) {  // this rank's zig-zag tokens of every sequence
        localise(cp_inputs_.data(), inputs_.data(), local_B_);
        localise(cp_targets_.data(), targets_.data(), local_B_);
    }
    for (TreeAccumulator& a : acc_) a.reset();
    for (auto& per_source : ep_acc_)
        for (TreeAccumulator& a : per_source) a.reset();
    if (fp8_) fp8_->begin_step();
    if (watch_logits_) {
        std::fill(logit_max_.begin(), logit_max_.end(), -std::numeric_limits<float>::infinity());
        model_->set_logit_max(logit_max_.data());
    }
    begin_router_stats();
    run_actions();
    end_router_stats(step_ + 1);
    if (watch_logits_) {
        model_->set_logit_max(nullptr);
        all_reduce_max(logit_max_.data(), static_cast<i64>(logit_max_.size()));
    }
    update_fp8_scales();

    float* g = grads_.f32();
    reduce_grads(g);
    unscale_grads(g);
    for (const StepHooks& h : hooks_)
        if (h.grads) h.grads(step_ + 1, g);
    const bool finite = !scaler_.dynamic() || grads_finite_everywhere(g);
    const bool probing = probes_ != nullptr;
    const i64 total = model_->table().total;
    if (probing) {  // ZeRO-2/3: only this rank's shard of g is complete
        const i64 lo = zero_ >= 2 ? shards_->lo() : 0;
        model_->probe_params(*probes_, step_ + 1, "grad", "param", g + lo, lo,
                             zero_ >= 2 ? shards_->hi() : total);
    }

    StepMetrics m;
    m.step = step_ + 1;
    m.grad_norm = grad_norm(g);
    m.loss = step_loss();
    m.lr = lr_at(tc, step_);
    // The judges (spike detection) see the step's metrics and may skip or clip its update.
    UpdateChoice choice;
    for (const StepHooks& h : hooks_) {
        if (!h.judge) continue;
        const UpdateChoice c = h.judge(step_ + 1, m);
        choice.apply = choice.apply && c.apply;
        if (c.clip_norm > 0 && (choice.clip_norm <= 0 || c.clip_norm < choice.clip_norm))
            choice.clip_norm = c.clip_norm;
    }
    TrainConfig clipped = tc;
    if (choice.clip_norm > 0 && (tc.grad_clip <= 0 || choice.clip_norm < tc.grad_clip))
        clipped.grad_clip = choice.clip_norm;
    // fp16: a step with an inf or a NaN anywhere is skipped, on every rank alike (a step the
    // judges skip leaves the loss scale as it is).
    if (choice.apply && scaler_.update(finite && std::isfinite(m.grad_norm))) {
        opt_->step(*model_, g, static_cast<float>(m.grad_norm), static_cast<float>(m.lr),
                   static_cast<int>(step_ + 1), clipped);
        if (checked_opt_)  // the replica check's second copy of the next rank's update
            checked_opt_->step(*model_, checked_w_.data(), g, static_cast<float>(m.grad_norm),
                               static_cast<float>(m.lr), static_cast<int>(step_ + 1), clipped);
    }
    // ZeRO-1/2: every replica updated its shard. ZeRO-3 holds only its shard between steps
    // (under ZeroUnits each unit's weights are gathered when it runs).
    if (zero_ == 1 || zero_ == 2) shards_->all_gather_params(*zero_group(), model_->params());
    if (zero_ == 3 && !units_) shards_->release_params(model_->param_arena());
    if (zero_ >= 2 && !units_) {
        // Between steps a replica holds only its shard of the gradient; the microbatch partials
        // and the rest of the buffer go back to the system until the next step's backward.
        decommit_f32(grads_, 0, shards_->lo());
        grads_.decommit(bytes_of(DType::f32, shards_->hi()), grads_.bytes());
        for (TreeAccumulator& a : acc_) a.release();
    }
    step_++;
    for (const StepHooks& h : hooks_)
        if (h.updated) h.updated(step_);
    if (probing) probe_update();  // job_state.cpp

    const double secs = seconds_since(t0);
    m.comm_bytes = bytes_sent() - sent0;
    if (layout_.cp > 1 || layout_.ep > 1) {
        cp_sent_ += layout_.cp > 1 ? cp_bytes_sent() - cp0 : 0;
        ep_sent_ += layout_.ep > 1 ? ep_bytes_sent() - ep0 : 0;
        accounted_steps_++;
    }
    m.step_ms = secs * 1e3;
    m.tokens_per_s = static_cast<double>(N) / secs;
    if ((tc.eval_every > 0 && step_ % tc.eval_every == 0) ||
        (step_ == tc.steps && tc.eval_every > 0)) {
        const bool gather = zero_ == 3 && !units_;
        if (gather) shards_->all_gather_params(*groups_.dp, model_->params());
        m.val_loss = evaluate();
        if (gather) shards_->release_params(model_->param_arena());
    }
    history_.push_back(m);
    for (Observer* o : observers_) o->on_step(*this, m);
    if (after_step_) after_step_(*this);
    return m;
}

void Job::report_event(const RunEvent& e) {
    for (Observer* o : observers_) o->on_event(*this, e);
}

void Job::report_fp8(const std::vector<Fp8Stat>& rows) {
    for (Observer* o : observers_) o->on_fp8(*this, rows);
}

// Forward only, microbatch after microbatch, each through the virtual stages in order; the
// last stage keeps the losses in token order (batch j, then sequence). A message's tag names
// its receiving stage, so each channel carries one stage's messages in (batch, microbatch)
// order on both sides.
double Job::evaluate() {
    const TrainConfig& tc = cfg_.train;
    const int pp = layout_.pp, S = layout_.num_stages();
    const i64 per_rank = local_B_ * Tl_, mb_tokens = micro_B_ * Tl_;
    std::vector<float> local(last_stage() ? static_cast<size_t>(tc.val_batches * per_rank) : 0);
    std::vector<int> win(static_cast<size_t>(micro_B_ * (T_ + 1)));
    std::vector<int> tok(static_cast<size_t>(micro_B_ * T_)), tgt(tok.size());
    for (i64 j = 0; j < tc.val_batches; j++) {
        for (int k = 0; k < layout_.microbatches; k++) {
            source_->sample(win.data(), T_, Split::val, j, dp_rank_ * local_B_ + k * micro_B_,
                            micro_B_);
            split_windows(tok.data(), tgt.data(), win.data(), micro_B_, T_);
            if (layout_.cp > 1) {  // in place: a rank's tokens come first
                localise(tok.data(), std::vector<int>(tok).data(), micro_B_);
                localise(tgt.data(), std::vector<int>(tgt).data(), micro_B_);
            }
            for (int c = 0; c < model_->num_chunks(); c++) {
                const int stage = stage_of(pp_rank_, c, pp);
                Slot* s = acquire(c);
                if (stage > 0)
                    recv_message(*groups_.pp, message(s->acts.input()),
                                 rank_of_stage(stage - 1, pp), kEvalTagBase + stage);
                model_->forward(s->acts, c, tok.data(), tgt.data());
                if (stage < S - 1)
                    s->pending =
                        send_message(*groups_.pp, message(s->acts.output()),
                                     rank_of_stage(stage + 1, pp), kEvalTagBase + stage + 1);
                else
                    std::memcpy(local.data() + j * per_rank + k * mb_tokens, s->acts.losses().f32(),
                                static_cast<size_t>(mb_tokens) * sizeof(float));
                release(c, s);
            }
        }
    }
    wait_sends();
    double val = 0;
    if (last_stage()) {
        std::vector<float> all;
        gather_losses(all, local, tc.val_batches, false);
        const i64 n = static_cast<i64>(all.size());
        val = canonical_sum(all.data(), n, nx_.block) / static_cast<double>(n);
    }
    if (groups_.pp) groups_.pp->broadcast(&val, 1, pp - 1);
    return val;
}

void Job::run() {
    for (Observer* o : observers_) o->on_start(*this);
    while (step_ < std::min(cfg_.train.steps, stop_after_)) step();
    // ZeRO-3 keeps only a shard between steps: the finished run holds the whole model.
    if (zero_ == 3) shards_->all_gather_params(*groups_.dp, model_->params());
    if (!cfg_.output.export_llmc.empty()) {
        std::vector<float> params;
        gather_full(&params, nullptr, nullptr);
        if (pp_rank_ == 0 && dp_rank_ == 0 && tp_rank_ == 0) {  // one writer
            const ParamTable full = ParamTable::build(cfg_.model);
            write_llmc_checkpoint(
                cfg_.output.export_llmc, cfg_.model, [&](const std::string& name) {
                    const int i = full.find(name);
                    return i < 0 ? nullptr
                                 : params.data() + full.entries[static_cast<size_t>(i)].offset;
                });
        }
    }
    for (Observer* o : observers_) o->on_end(*this);
}

}  // namespace px
