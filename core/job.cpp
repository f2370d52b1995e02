#include "core/job.h"

#include "core/mutation.h"

#include "core/checkpoint_llmc.h"
#include "core/comm/comm.h"
#include "core/data.h"
#include "core/error.h"
#include "core/mutation.h"
#include "core/parallel/state_slices.h"
#include "core/parallel/tp_model.h"
#include "core/parallel/zero.h"
#include "core/runfile.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

namespace px {

namespace {

// Post-order over the microbatch leaves of the token tree: after leaf k, merge the top two
// partials merges[k] times. Every microbatch range must be one node of the tree.
bool leaf_schedule(i64 lo, i64 hi, i64 blocks_per_mb, std::vector<unsigned char>& merges) {
    if (hi - lo == blocks_per_mb) return lo % blocks_per_mb == 0;
    if (hi - lo < blocks_per_mb) return false;
    const i64 mid = tree_mid(lo, hi);
    if (!leaf_schedule(lo, mid, blocks_per_mb, merges)) return false;
    if (!leaf_schedule(mid, hi, blocks_per_mb, merges)) return false;
    merges[hi / blocks_per_mb - 1]++;
    return true;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Job::Job(const Config& cfg, ReplicaContext replica)
    : cfg_(cfg), nx_(make_numerics(cfg.numerics)), replica_(replica) {
    if (cfg_.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg_.train.threads));
    const TrainConfig& tc = cfg_.train;
    const i64 T = cfg_.model.seq_len;
    if (replica_.dp) {
        dp_rank_ = replica_.dp->rank();
        dp_size_ = replica_.dp->size();
    }
    microbatches_ =
        cfg_.layout.microbatches > 0 ? cfg_.layout.microbatches : static_cast<int>(tc.microbatches);
    if (tc.batch_size % (dp_size_ * microbatches_) != 0)
        throw ConfigError("train.batch_size = " + std::to_string(tc.batch_size) +
                          " is not divisible by layout.dp × microbatches = " +
                          std::to_string(dp_size_) + " × " + std::to_string(microbatches_) +
                          "; every replica and microbatch must hold whole sequences");
    local_B_ = tc.batch_size / dp_size_;
    micro_B_ = local_B_ / microbatches_;

    // Replicas and microbatches own token ranges; each must be one node of the batch's token
    // tree (DESIGN.md §2.1), so that their gradients combine exactly as the whole batch's.
    const int parts = dp_size_ * microbatches_;
    if (parts > 1) {
        const i64 mb_tokens = micro_B_ * T;
        if (mb_tokens % nx_.block != 0)
            throw ConfigError(
                "layout.dp × microbatches = " + std::to_string(dp_size_) + " × " +
                std::to_string(microbatches_) + " gives microbatches of " +
                std::to_string(mb_tokens) +
                " tokens, not a multiple of numerics.block = " + std::to_string(nx_.block) +
                "; a microbatch must own whole blocks of the token reduction "
                "(choose fewer microbatches or a smaller numerics.block)");
        const i64 bpm = mb_tokens / nx_.block;
        std::vector<unsigned char> all_merges(static_cast<size_t>(parts), 0);
        if (!leaf_schedule(0, bpm * parts, bpm, all_merges))
            throw ConfigError("layout.dp × microbatches = " + std::to_string(dp_size_) + " × " +
                              std::to_string(microbatches_) +
                              " (train.microbatches = " + std::to_string(microbatches_) +
                              ") splits the batch's " + std::to_string(bpm * parts) +
                              " token blocks into ranges that are not nodes of the canonical "
                              "reduction tree (DESIGN.md §2.1); use powers of two, or counts "
                              "whose ranges split at ceil(n/2)");
        if (zero_units()) {
            // ZeRO-2/3 (zero.h): microbatch k of the batch is one node, cut into one piece per
            // replica; the microbatch nodes then combine in the tree over microbatches.
            group_merges_.assign(static_cast<size_t>(microbatches_), 0);
            if (!leaf_schedule(0, bpm * parts, bpm * dp_size_, group_merges_))
                throw ConfigError("layout.zero = " + std::to_string(replica_.zero) +
                                  " with layout.dp × microbatches = " + std::to_string(dp_size_) +
                                  " × " + std::to_string(microbatches_) + ": each microbatch's " +
                                  std::to_string(bpm * dp_size_) +
                                  " token blocks (one piece per replica) must be one node of the "
                                  "batch's canonical reduction tree; use powers of two");
        } else {
            const i64 bpr = bpm * microbatches_;  // blocks per replica
            if (!is_tree_node(bpm * parts, dp_rank_ * bpr, (dp_rank_ + 1) * bpr))
                throw ConfigError(
                    "layout.dp = " + std::to_string(dp_size_) + ": replica " +
                    std::to_string(dp_rank_) + " owns token blocks [" +
                    std::to_string(dp_rank_ * bpr) + "," + std::to_string((dp_rank_ + 1) * bpr) +
                    "), not one node of the batch's canonical reduction tree; choose layout.dp "
                    "and train.batch_size so that each replica's share is a node (e.g. powers "
                    "of two)");
            // This replica's microbatches form the subtree of its own range: same shape, so the
            // schedule over its leaves is the first `microbatches_` entries of a tree of that
            // size.
            merges_after_.assign(static_cast<size_t>(microbatches_), 0);
            if (microbatches_ > 1) leaf_schedule(0, bpm * microbatches_, bpm, merges_after_);
        }
    }

    source_ = make_source(cfg_);
    if (source_->vocab() > cfg_.model.vocab)
        throw ConfigError("the data has " + std::to_string(source_->vocab()) +
                          " symbols but model.vocab = " + std::to_string(cfg_.model.vocab));

    if (tp_size() > 1) {
        // Tensor parallelism: this rank holds its shard of every layer (tp_model.h).
        model_ = make_tp_model(*replica_.tp, nx_, cfg_.model, cfg_.layout.sequence_parallel);
    } else {
        model_ = std::make_unique<GPT>(cfg_.model, nx_);
    }
    const auto* tpl = dynamic_cast<const TpLayers*>(model_->parallel_layers());
    if (tpl && !cfg_.model.init_from.empty()) {
        // A checkpoint holds the logical tensors: read them whole, keep this shard's slices.
        const ParamTable full = ParamTable::build(cfg_.model);
        std::vector<float> buf(static_cast<size_t>(full.total));
        read_init_weights(cfg_.model.init_from, cfg_.model, [&](const std::string& name) {
            const int i = full.find(name);
            return i < 0 ? nullptr : buf.data() + full.entries[static_cast<size_t>(i)].offset;
        });
        load_logical(*tpl, *model_, full, buf.data());
    } else if (!cfg_.model.init_from.empty()) {
        const GPT& m = *model_;
        read_init_weights(cfg_.model.init_from, cfg_.model,
                          [&m](const std::string& name) { return m.param_ptr(name); });
    } else {
        model_->init_random(tc.seed, cfg_.model.init_std);
    }
    // ZeRO: each replica keeps the AdamW moments of one shard of the flat parameter arena and
    // updates only that shard (core/parallel/zero.h).
    grad_stack_.emplace_back(model_->grad_layout().total);
    if (replica_.zero >= 1 && dp_size_ > 1) {
        shards_ = std::make_unique<ZeroShards>(*model_, dp_size_, dp_rank_);
        opt_ = std::make_unique<AdamW>(*model_, shards_->lo(), shards_->hi());
    } else {
        opt_ = std::make_unique<AdamW>(*model_);
    }
    if (zero_units()) {
        // ZeRO-2/3: the model tells ZeroUnits before and after each unit; weights (ZeRO-3) and
        // gradients are mapped only while a unit runs, and only the shard is kept.
        units_ = std::make_unique<ZeroUnits>(*model_, *shards_, *replica_.dp, replica_.zero,
                                             grad_stack_[0], group_merges_);
        model_->set_unit_hooks(units_.get());
        if (replica_.zero == 3) shards_->release_params(model_->param_arena());
        units_->reset_peaks();
    }

    windows_.resize(static_cast<size_t>(local_B_ * (T + 1)));
    inputs_.resize(static_cast<size_t>(micro_B_ * T));
    targets_.resize(static_cast<size_t>(micro_B_ * T));
    losses_.resize(static_cast<size_t>(local_B_ * T));
    all_losses_.resize(static_cast<size_t>(tc.batch_size * T));
}

Job::~Job() = default;

void take_snapshot(const GPT& model, const AdamW& opt, i64 step,
                   const std::vector<StepMetrics>& history, LocalSnapshot& s) {
    s.params.assign(model.params(), model.params() + model.table().total);
    s.m.assign(opt.m(), opt.m() + opt.size());
    s.v.assign(opt.v(), opt.v() + opt.size());
    s.step = step;
    s.history = history;
}

void put_snapshot(const LocalSnapshot& s, GPT& model, AdamW& opt) {
    PX_ASSERT(s.step >= 0 && static_cast<i64>(s.params.size()) == model.table().total &&
                  static_cast<i64>(s.m.size()) == opt.size() && s.m.size() == s.v.size(),
              "a snapshot of another model or optimizer shard");
    std::copy(s.params.begin(), s.params.end(), model.params());
    std::copy(s.m.begin(), s.m.end(), opt.m());
    std::copy(s.v.begin(), s.v.end(), opt.v());
}

void Job::snapshot(LocalSnapshot& into) const {
    if (shards_ && replica_.zero == 3)
        throw InternalError(
            "Job::snapshot under ZeRO-3: between steps this rank holds a shard of "
            "the weights, not a replica of them");
    take_snapshot(*model_, *opt_, step_, history_, into);
}

void Job::rewind(const LocalSnapshot& s) {
    put_snapshot(s, *model_, *opt_);
    step_ = s.step;
    history_ = s.history;
}

double Job::loss_floor() const {
    const auto* markov = dynamic_cast<const MarkovSource*>(source_.get());
    return markov ? markov->window_floor(cfg_.model.seq_len) : -1.0;
}

double Job::entropy_rate() const {
    const auto* markov = dynamic_cast<const MarkovSource*>(source_.get());
    return markov ? markov->entropy_rate() : -1.0;
}

void Job::accumulate_microbatch(int k) {
    const i64 T = cfg_.model.seq_len;
    const i64 N = cfg_.train.batch_size * T;
    for (i64 b = 0; b < micro_B_; b++) {
        const int* w = windows_.data() + (k * micro_B_ + b) * (T + 1);
        std::memcpy(inputs_.data() + b * T, w, static_cast<size_t>(T) * sizeof(int));
        std::memcpy(targets_.data() + b * T, w + 1, static_cast<size_t>(T) * sizeof(int));
    }
    model_->forward(inputs_.data(), targets_.data(), micro_B_, T);
    std::memcpy(losses_.data() + k * micro_B_ * T, model_->losses(),
                static_cast<size_t>(micro_B_ * T) * sizeof(float));

    if (units_) {  // ZeRO-2/3: the hooks zero, reduce-scatter and accumulate unit by unit
        model_->backward(grad_stack_[0].data(), inputs_.data(), targets_.data(),
                         1.0f / static_cast<float>(N));
        return;
    }
    // Stack of partial gradients: this microbatch's node goes on top, then siblings merge.
    size_t& sp = stack_top_;
    if (k == 0) sp = 0;
    if (grad_stack_.size() <= sp) grad_stack_.emplace_back(model_->grad_layout().total);
    float* node = grad_stack_[sp].data();
    grad_stack_[sp].zero();
    model_->backward(node, inputs_.data(), targets_.data(), 1.0f / static_cast<float>(N));
    if (mutation::armed() && dp_size_ > 1)  // a test's flip_grad or drop_microbatch
        mutation::strike_gradient(model_->table(), step_ + 1, dp_rank_, k, node, 0,
                                  model_->grad_layout().total);
    if (probes_) {  // the microbatch's gradient: node batch_lo / micro_B of the step's batch
        model_->probe_params(*probes_, step_ + 1, "mgrad", "param", node, 0, model_->table().total,
                             probe_ctx_.batch_lo / micro_B_, cfg_.train.batch_size / micro_B_);
    }
    if (microbatches_ == 1) return;
    sp++;
    const i64 n = model_->grad_layout().total;
    for (int r = 0; r < merges_after_[k]; r++) {
        float* left = grad_stack_[sp - 2].data();
        const float* right = grad_stack_[sp - 1].data();
#pragma omp parallel for schedule(static)
        for (i64 i = 0; i < n; i++) left[i] = left[i] + right[i];
        sp--;
    }
}

// ---- test-only mutations (core/mutation.h) ---------------------------------------------------

const TableEntry& Job::mutated_entry(const mutation::Mutation& mu) const {
    const int i = model_->table().find(mu.tensor);
    PX_ASSERT(i >= 0, "a mutation names no parameter of the model: " + mu.tensor);
    return model_->table().entries[static_cast<size_t>(i)];
}

void Job::gather_full(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v) {
    const GPT& model = *model_;
    const i64 n = model.table().total;
    // This replica's arrays in its local table's layout: ZeRO shards gathered over dp first.
    std::vector<float> local_m(static_cast<size_t>(n), 0.0f), local_v = local_m;
    if (shards_) {
        std::vector<i64> counts(static_cast<size_t>(dp_size_));
        for (int r = 0; r < dp_size_; r++)
            counts[static_cast<size_t>(r)] = shards_->hi(r) - shards_->lo(r);
        replica_.dp->all_gather_v(local_m.data(), opt_->m(), counts);
        replica_.dp->all_gather_v(local_v.data(), opt_->v(), counts);
        if (replica_.zero == 3) shards_->all_gather_params(*replica_.dp, model_->params());
    } else {
        std::memcpy(local_m.data(), opt_->m(), static_cast<size_t>(n) * sizeof(float));
        std::memcpy(local_v.data(), opt_->v(), static_cast<size_t>(n) * sizeof(float));
    }
    // Then the tp shards to their logical places (a collective of the tp group).
    const auto* tpl = dynamic_cast<const TpLayers*>(model.parallel_layers());
    const ParamTable full = tpl ? ParamTable::build(cfg_.model) : model.table();
    auto place = [&](std::vector<float>* out, const float* local) {
        if (!out) return;
        out->assign(static_cast<size_t>(full.total), 0.0f);
        if (tpl)
            gather_logical(*tpl, model, full, out->data(), local);
        else
            std::memcpy(out->data(), local, static_cast<size_t>(n) * sizeof(float));
    };
    place(params, model.params());
    place(m, local_m.data());
    place(v, local_v.data());
    if (shards_ && replica_.zero == 3) shards_->release_params(model_->param_arena());
}

// ---- per-rank checkpoints (core/parallel/state_slices.h) ------------------------------------

RankState Job::rank_state() {
    RankState s = replica_state(*model_, model_->params(), *opt_, dp_size_, dp_rank_,
                                shards_ && replica_.zero == 3);
    // Tensors replicated over tp: written by tp rank (id mod tp) only.
    const ParamTable& t = model_->table();
    if (const auto* tpl = dynamic_cast<const TpLayers*>(model_->parallel_layers()))
        for (size_t i = 0; i < t.entries.size(); i++)
            if (!tpl->sharded(t.entries[i]))
                s.writes_entry[i] = t.entries[i].id % tpl->size() == tpl->rank();
    return s;
}

void Job::restore_local(const CheckpointReader& file, const std::vector<StepMetrics>& history) {
    read_rank_state(file, rank_state());
    if (shards_ && replica_.zero == 3) shards_->release_params(model_->param_arena());
    history_ = history;
    step_ = static_cast<i64>(history.size());
}

void Job::all_gather_tokens(std::vector<float>& all, const float* local, i64 per_rank) {
    if (dp_size_ == 1) {
        std::copy(local, local + per_rank, all.begin());
        return;
    }
    replica_.dp->all_gather(all.data(), local, per_rank);
}

MemoryStats Job::memory() const {
    MemoryStats m;
    m.params = model_->table().total * static_cast<i64>(sizeof(float));
    for (const Arena& a : grad_stack_) m.grads += a.size() * static_cast<i64>(sizeof(float));
    m.peak_params = m.params;
    m.peak_grads = m.grads;
    if (units_) {  // ZeRO-2/3: what is mapped, measured
        if (replica_.zero == 3) m.params = model_->param_arena().resident_bytes();
        m.grads = grad_stack_[0].resident_bytes() + units_->partial_bytes();
        m.peak_params = std::max(m.params, units_->peak_params());
        m.peak_grads = std::max(m.grads, units_->peak_grads());
    }
    m.optimizer = 2 * opt_->size() * static_cast<i64>(sizeof(float));
    m.activations = model_->activation_bytes();
    if (shards_) m.comm = shards_->staging_bytes();
    return m;
}

namespace {
double bytes_sent(const comm::Communicator* c) {
    if (!c) return 0;
    double b = 0;
    for (const comm::StatRow& r : c->stats_book()->rows()) b += static_cast<double>(r.bytes_sent);
    return b;
}
}  // namespace

StepMetrics Job::step() {
    const auto t0 = std::chrono::steady_clock::now();
    const double sent0 = bytes_sent(replica_.dp);
    const TrainConfig& tc = cfg_.train;
    const i64 T = cfg_.model.seq_len;
    const i64 N = tc.batch_size * T;

    const comm::Algo algo = replica_.algo;
    const int zero = shards_ ? replica_.zero : 0;
    if (hooks_.before) hooks_.before(step_ + 1);
    if (units_) units_->reset_peaks();

    // This replica's sequences of the step's batch: [dp_rank·local_B, (dp_rank+1)·local_B),
    // cut into microbatches; under ZeRO-2/3 piece dp_rank of every microbatch (see zero.h).
    const bool probing = probes_ != nullptr;
    for (int k = 0; k < microbatches_; k++) {
        if (k == 0 || units_) {
            const i64 first = units_ ? k * (tc.batch_size / microbatches_) + dp_rank_ * micro_B_
                                     : dp_rank_ * local_B_;
            source_->sample(windows_.data() + k * micro_B_ * (T + 1), T, Split::train, step_, first,
                            units_ ? micro_B_ : local_B_);
        }
        if (units_) units_->begin_microbatch(k);
        // The rows sampled above for microbatch k, for the probes (and a test's mutation).
        probe_ctx_.step = step_ + 1;
        probe_ctx_.batch_total = tc.batch_size;
        probe_ctx_.batch_lo = units_ ? k * (tc.batch_size / microbatches_) + dp_rank_ * micro_B_
                                     : dp_rank_ * local_B_ + k * micro_B_;
        model_->set_probes(probes_, &probe_ctx_);
        if (units_)
            units_->set_probes(probes_, step_ + 1, probe_ctx_.batch_lo / micro_B_,
                               tc.batch_size / micro_B_);
        accumulate_microbatch(k);
    }
    model_->set_probes(nullptr, nullptr);

    // Every replica holds one node of the token tree; the canonical collectives over replicas
    // form the nodes above it. The LM head's part of dwte travels separately (GradLayout) and
    // joins the embedding's once complete.
    float* g = grad_stack_[0].data();
    if (zero >= 2) {
        units_->finish();  // the step's gradient shard, reduced unit by unit during backward
        shards_->combine_tied(g);
    } else {
        if (dp_size_ > 1) {
            const mutation::Mutation* mu = mutation::armed();
            if (mu && mu->kind == mutation::Kind::swap_partials && mu->step == step_ + 1) {
                const TableEntry& e = mutated_entry(*mu);
                PX_ASSERT(mu->rank < dp_size_ && mu->other < dp_size_ && mu->rank != mu->other,
                          "swap_partials needs two different ranks of the dp group");
                mutation::set_swap({mu->rank, mu->other, e.offset, e.offset + e.numel()});
            }
            replica_.dp->all_reduce(g, model_->grad_layout().total, algo);
        }
        model_->combine_tied_grads(g);
    }
    if (hooks_.grads) hooks_.grads(step_ + 1, g);
    if (probing) {  // ZeRO-2/3: only this rank's shard of g is complete
        const i64 lo = zero >= 2 ? shards_->lo() : 0;
        model_->probe_params(*probes_, step_ + 1, "grad", "param", g + lo, lo,
                             zero >= 2 ? shards_->hi() : model_->table().total);
    }
    const auto* tpl = dynamic_cast<const TpLayers*>(model_->parallel_layers());
    float norm = 0.0f;
    if (zero >= 2)
        norm = tpl ? tp_grad_norm(*tpl, *model_, g, replica_.dp, shards_->lo(), shards_->hi())
                   : shards_->grad_norm(*replica_.dp, g, algo);
    else
        norm = tpl ? tp_grad_norm(*tpl, *model_, g) : global_grad_norm(nx_, *model_, g);

    StepMetrics m;
    m.step = step_ + 1;
    all_gather_tokens(all_losses_, losses_.data(), local_B_ * T);
    if (units_ && dp_size_ > 1) {  // rank r's microbatch k is piece r of batch range k
        std::vector<float> by_rank(all_losses_);
        const i64 piece = micro_B_ * T;
        for (int r = 0; r < dp_size_; r++)
            for (int k = 0; k < microbatches_; k++)
                std::memcpy(all_losses_.data() + (k * dp_size_ + r) * piece,
                            by_rank.data() + (r * microbatches_ + k) * piece,
                            static_cast<size_t>(piece) * sizeof(float));
    }
    m.loss = canonical_sum(all_losses_.data(), N, nx_.block) / static_cast<float>(N);
    m.grad_norm = norm;
    m.lr = lr_at(tc, step_);
    opt_->step(*model_, g, norm, static_cast<float>(m.lr), static_cast<int>(step_ + 1), tc);
    // ZeRO-1/2: every replica updated its shard. ZeRO-3 holds only its shard between steps
    // and gathers each unit's weights when it runs.
    if (zero == 1 || zero == 2) shards_->all_gather_params(*replica_.dp, model_->params());
    step_++;
    if (hooks_.updated) hooks_.updated(step_);
    if (probing) {  // ZeRO-3 holds only its shard of the weights; ZeRO-1..3 of the moments
        const i64 lo = zero == 3 ? shards_->lo() : 0;
        model_->probe_params(*probes_, step_, "optim", "param", model_->params() + lo, lo,
                             zero == 3 ? shards_->hi() : model_->table().total);
        model_->probe_params(*probes_, step_, "optim", "adam.m", opt_->m(), opt_->lo(), opt_->hi());
        model_->probe_params(*probes_, step_, "optim", "adam.v", opt_->v(), opt_->lo(), opt_->hi());
    }

    const double secs = seconds_since(t0);
    m.comm_bytes = bytes_sent(replica_.dp) - sent0;
    m.step_ms = secs * 1e3;
    m.tokens_per_s = static_cast<double>(N) / secs;
    if ((tc.eval_every > 0 && step_ % tc.eval_every == 0) ||
        (step_ == tc.steps && tc.eval_every > 0)) {
        m.val_loss = evaluate();
    }
    history_.push_back(m);
    for (Observer* o : observers_) o->on_step(*this, m);
    if (after_step_) after_step_(*this);
    return m;
}

double Job::evaluate() {
    const TrainConfig& tc = cfg_.train;
    const i64 T = cfg_.model.seq_len;
    const i64 per_batch = tc.batch_size * T, per_rank = local_B_ * T;
    std::vector<float> local(static_cast<size_t>(tc.val_batches * per_rank));
    std::vector<int> win(static_cast<size_t>(micro_B_ * (T + 1)));
    for (i64 j = 0; j < tc.val_batches; j++) {
        for (i64 k = 0; k < microbatches_; k++) {
            source_->sample(win.data(), T, Split::val, j, dp_rank_ * local_B_ + k * micro_B_,
                            micro_B_);
            for (i64 b = 0; b < micro_B_; b++) {
                std::memcpy(inputs_.data() + b * T, win.data() + b * (T + 1), T * sizeof(int));
                std::memcpy(targets_.data() + b * T, win.data() + b * (T + 1) + 1, T * sizeof(int));
            }
            model_->forward(inputs_.data(), targets_.data(), micro_B_, T);
            std::memcpy(local.data() + j * per_rank + k * micro_B_ * T, model_->losses(),
                        static_cast<size_t>(micro_B_ * T) * sizeof(float));
        }
    }
    // Gather every replica's losses, then put them in token order: batch j, then sequence.
    std::vector<float> gathered(static_cast<size_t>(tc.val_batches * per_batch));
    all_gather_tokens(gathered, local.data(), static_cast<i64>(local.size()));
    std::vector<float> all(gathered.size());
    for (int r = 0; r < dp_size_; r++)
        for (i64 j = 0; j < tc.val_batches; j++)
            std::memcpy(all.data() + j * per_batch + r * per_rank,
                        gathered.data() + (r * tc.val_batches + j) * per_rank,
                        static_cast<size_t>(per_rank) * sizeof(float));
    const i64 n = static_cast<i64>(all.size());
    return canonical_sum(all.data(), n, nx_.block) / static_cast<double>(n);
}

void Job::run() {
    for (Observer* o : observers_) o->on_start(*this);
    while (step_ < std::min(cfg_.train.steps, stop_after_)) step();
    // ZeRO-3 keeps only a shard between steps: the finished run holds the whole model.
    if (shards_ && replica_.zero == 3) shards_->all_gather_params(*replica_.dp, model_->params());
    const auto* tpl = dynamic_cast<const TpLayers*>(model_->parallel_layers());
    if (tpl && !cfg_.output.export_llmc.empty()) {
        // The logical tensors from every tp rank's shard (a collective of the tp group).
        const ParamTable full = ParamTable::build(cfg_.model);
        std::vector<float> buf(static_cast<size_t>(full.total));
        gather_logical(*tpl, *model_, full, buf.data());
        if (dp_rank_ == 0 && tp_rank() == 0)
            write_llmc_checkpoint(
                cfg_.output.export_llmc, cfg_.model, [&](const std::string& name) -> float* {
                    const int i = full.find(name);
                    return i < 0 ? nullptr
                                 : buf.data() + full.entries[static_cast<size_t>(i)].offset;
                });
    } else if (!cfg_.output.export_llmc.empty() && dp_rank_ == 0) {
        const GPT& m = *model_;
        write_llmc_checkpoint(cfg_.output.export_llmc, cfg_.model,
                              [&m](const std::string& name) { return m.param_ptr(name); });
    }
    for (Observer* o : observers_) o->on_end(*this);
}

}  // namespace px
