// The trainer's composition and its step: the rank's parts made once in seam order, the model
// they plan and attach to, and the loop of a step that calls them (job.h). What a part does at a
// seam is in its own file (core/parallel/<x>/part.cpp, core/train/precision.cpp).
#include "core/train/job.h"

#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/io/checkpoint_llmc.h"
#include "core/model/data.h"
#include "core/parallel/context/part.h"
#include "core/parallel/expert/part.h"
#include "core/parallel/state_slices.h"
#include "core/parallel/tensor/part.h"
#include "core/train/memory.h"
#include "kernels/ops.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

namespace px {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
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

}  // namespace

Job::Job(const Config& cfg) : Job(cfg, one_device_layout(cfg), RankGroups{}) {}

// Parallelism is applied in fixed steps:
//   1. the parts, in the order every seam calls them: tensor (tp > 1), context (cp > 1), data
//      and ZeRO, expert (ep > 1), pipeline, precision;
//   2. the model they plan: the pipeline stage's layers, this rank's experts, over TpLayers;
//   3. its weights: model.init_from's logical tensors, or the Philox initialisation (a part
//      draws exactly what the whole model has there);
//   4. the parts attach to it: the cp attention, the gradient buffers and accumulators, the
//      ZeRO shards, the expert exchange, the activation sets, fp8's scales.
Job::Job(const Config& cfg, const Layout& layout, RankGroups groups)
    : rank_(make_rank_setup(cfg, layout, groups)) {
    if (cfg.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg.train.threads));
    source_ = make_source(cfg);
    if (source_->vocab() > cfg.model.vocab)
        throw ConfigError("the data has " + std::to_string(source_->vocab()) +
                          " symbols but model.vocab = " + std::to_string(cfg.model.vocab));

    auto pipeline = std::make_unique<PipelineParallel>(rank_);  // the context part reads it
    if (layout.tp > 1) add(std::make_unique<TensorParallel>(rank_));
    if (layout.cp > 1) add(std::make_unique<ContextParallel>(rank_, *pipeline));
    data_ = add(std::make_unique<DataParallel>(rank_));
    if (layout.ep > 1) add(std::make_unique<ExpertParallel>(rank_, *data_));
    pipeline_ = add(std::move(pipeline));
    precision_ = add(std::make_unique<Precision>(rank_));
    data_->set_tap([this](int m, float* g, i64 lo, i64 hi) { microbatch_grad(m, g, lo, hi); });

    ModelPlan plan{pipeline_->stage_part(), nullptr};
    for (auto& p : parts_) p->plan(plan);
    model_ = std::make_unique<GPT>(cfg.model, rank_.nx, plan.part, plan.layers,
                                   activation_dtype(cfg.precision));
    init_weights();
    for (auto& p : parts_) p->attach(*model_);
    ops::warm_up_matmul(rank_.nx);  // the fast matmul's one-time setup: not inside the first step
}

Job::~Job() = default;

template <class T>
T* Job::add(std::unique_ptr<T> part) {
    T* p = part.get();
    parts_.push_back(std::move(part));
    return p;
}

void Job::init_weights() {
    const ModelConfig& mc = rank_.cfg.model;
    if (mc.init_from.empty()) {
        model_->init_random(rank_.cfg.train.seed, mc.init_std);
        return;
    }
    const ParamTable full = ParamTable::build(mc);
    for (auto& p : parts_)
        if (p->load_weights(*model_, full)) return;
    // This part's tensors in place; the rest is read into a scratch buffer and dropped.
    const GPT& m = *model_;
    std::vector<float> discard;
    read_init_weights(mc.init_from, mc, [&](const std::string& name) {
        if (float* p = m.param_ptr(name)) return p;
        const int i = full.find(name);
        if (i < 0) return static_cast<float*>(nullptr);
        discard.resize(static_cast<size_t>(full.entries[static_cast<size_t>(i)].numel()));
        return discard.data();
    });
}

i64 Job::num_params() const {
    return ParamTable::build(rank_.cfg.model).num_params;
}

double Job::loss_floor() const {
    return source_->base().window_floor(rank_.cfg.model.seq_len);
}

double Job::entropy_rate() const {
    return source_->base().entropy_rate();
}

// ---- the step --------------------------------------------------------------------------------

// The model's probes for microbatch m: this replica's rows of it in the step's batch.
void Job::set_probe_rows(int m) {
    if (!probes_) return;
    probe_ctx_.step = step_ + 1;
    probe_ctx_.batch_total = rank_.cfg.train.batch_size;
    probe_ctx_.batch_lo = data_->first_row(m);
    model_->set_probes(probes_, &probe_ctx_);
}

// Microbatch m's gradient [lo, hi) as backward leaves it: offered to the hooks, then probed as
// node first_row/micro_B of the batch's microbatches (when it is a node: not a context-parallel
// rank's part of one, nor other ranks' experts).
void Job::microbatch_grad(int m, float* grads, i64 lo, i64 hi) {
    for (const StepHooks& h : hooks_)
        if (h.microbatch_grad) h.microbatch_grad(step_ + 1, m, grads, lo, hi);
    if (!probes_) return;
    for (const auto& p : parts_)
        if (p->splits_microbatch_grads()) return;
    model_->probe_params(*probes_, step_ + 1, "mgrad", "param", grads + lo, lo, hi,
                         data_->first_row(m) / rank_.micro_B,
                         rank_.cfg.train.batch_size / rank_.micro_B);
}

void Job::compute_hooks(const Action& a, bool done) {
    for (const StepHooks& h : hooks_)
        if (h.compute) h.compute(step_ + 1, a, done);
}

void Job::forward(const Action& a, Activations& acts, bool last) {
    const int m = a.microbatch;
    compute_hooks(a, false);
    set_probe_rows(m);
    model_->forward(acts, a.chunk, data_->tokens(m), data_->targets(m));
    if (last)
        std::copy_n(acts.losses().f32(), rank_.micro_B * rank_.Tl, data_->losses(m));
    compute_hooks(a, true);
}

void Job::backward(const Action& a, Activations& acts, WeightGradQueue* defer) {
    const int c = a.chunk, m = a.microbatch;
    compute_hooks(a, false);
    set_probe_rows(m);
    for (auto& p : parts_) p->begin_backward(c, m);
    data_->backward(*model_, acts, c, m,
                    precision_->dloss(rank_.cfg.train.batch_size * rank_.T),  // × the loss scale
                    defer);
    for (auto& p : parts_) p->end_backward(c, m);
    compute_hooks(a, true);
}

// W of a zero-bubble schedule: what B of (chunk, microbatch) kept.
void Job::weight_backward(const Action& a, WeightGradQueue& defer) {
    compute_hooks(a, false);
    set_probe_rows(a.microbatch);
    data_->weight_backward(a.chunk, a.microbatch, defer);
    compute_hooks(a, true);
}

StepMetrics Job::step() {
    const auto t0 = std::chrono::steady_clock::now();
    const comm::Communicator* any = rank_.groups.world ? rank_.groups.world
                                    : rank_.groups.pp   ? rank_.groups.pp
                                    : rank_.groups.dp   ? rank_.groups.dp
                                                        : rank_.groups.tp;
    // Every communicator of a rank shares one book (comm.h): any group's counts all of them.
    auto bytes_sent = [any] {
        double b = 0;
        if (any)
            for (const comm::StatRow& r : any->stats_book()->rows())
                b += static_cast<double>(r.bytes_sent);
        return b;
    };
    const double sent0 = bytes_sent();
    const TrainConfig& tc = rank_.cfg.train;
    const i64 N = tc.batch_size * rank_.T;

    for (const StepHooks& h : hooks_)
        if (h.before) h.before(step_ + 1);
    for (auto& p : parts_) p->begin_step();
    i64 batch = batch_index(step_);
    if (swap_step_ == step_ + 1) batch = swap_batch_;
    swap_step_ = swap_batch_ = -1;
    data_->draw(*source_, batch);
    if (watch_logits_) {
        std::fill(logit_max_.begin(), logit_max_.end(), -std::numeric_limits<float>::infinity());
        model_->set_logit_max(logit_max_.data());
    }
    router_.begin(*model_);
    pipeline_->run({[this](const Action& a, Activations& acts, bool last) { forward(a, acts, last); },
                    [this](const Action& a, Activations& acts, WeightGradQueue* defer) {
                        backward(a, acts, defer);
                    },
                    [this](const Action& a, WeightGradQueue& defer) { weight_backward(a, defer); }});
    model_->set_probes(nullptr, nullptr);
    if (rank_.cfg.model.is_moe()) emit_values(step_ + 1, router_.end(*model_, rank_.groups));
    if (watch_logits_) {
        model_->set_logit_max(nullptr);
        all_reduce_max(logit_max_.data(), static_cast<i64>(logit_max_.size()));
    }
    for (auto& p : parts_) p->after_schedule();

    StepGrads sg;
    sg.g = data_->grads();
    for (auto& p : parts_) p->reduce_grads(sg);
    float* g = sg.g;
    for (const StepHooks& h : hooks_)
        if (h.grads) h.grads(step_ + 1, g);
    const bool finite = !loss_scaler().dynamic() || precision_->grads_finite(sg);
    if (probes_) {  // ZeRO-2/3: only this rank's shard of g is complete
        const Range r = sg.complete.front();
        model_->probe_params(*probes_, step_ + 1, "grad", "param", g + r.lo, r.lo, r.hi);
    }

    StepMetrics m;
    m.step = step_ + 1;
    m.grad_norm = grad_norm(g);
    if (probes_) {  // the global norm clipping sees (every rank computes the same bits)
        const ProbeKey key{step_ + 1, "grad", -1, "clip", "norm"};
        const float norm = static_cast<float>(m.grad_norm);
        if (probes_->wants(key)) probes_->capture(key, &norm, flat_shard({1}, 0, 1));
    }
    m.loss = pipeline_->from_last_stage(rank_.last_stage() ? data_->step_loss() : 0);
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
    // A step the judges skip leaves the loss scale as it is.
    const bool applied =
        choice.apply && precision_->take_update(finite && std::isfinite(m.grad_norm));
    if (applied)
        data_->update(g, static_cast<float>(m.grad_norm), static_cast<float>(m.lr),
                      static_cast<int>(step_ + 1), clipped);
    for (auto& p : parts_) p->after_update(applied);
    step_++;
    for (const StepHooks& h : hooks_)
        if (h.updated) h.updated(step_);
    if (probes_) probe_update();

    const double secs = seconds_since(t0);
    m.comm_bytes = bytes_sent() - sent0;
    for (auto& p : parts_) p->end_step();
    m.step_ms = secs * 1e3;
    m.tokens_per_s = static_cast<double>(N) / secs;
    if (tc.eval_every > 0 && (step_ % tc.eval_every == 0 || step_ == tc.steps)) {
        for (auto& p : parts_) p->begin_eval();
        m.val_loss = evaluate();
        for (auto& p : parts_) p->end_eval();
    }
    history_.push_back(m);
    for (Observer* o : observers_) o->on_step(*this, m);
    if (after_step_) after_step_(*this);
    return m;
}

// ‖g‖₂: each tensor's canonical Σg² on the stage that owns it (from tp shards' exact block
// partials, from ZeRO-2/3's gradient shards), gathered over the pp group, then the tree over
// tensors in the whole model's order (global_grad_norm's).
float Job::grad_norm(float* g) {
    grad_sq_ = tensor_sums_of_squares(g, data_->zero_stage() >= 2);
    const i64 n = static_cast<i64>(grad_sq_.size());
    float total = 0.0f;
    if (rank_.nx.mode == Mode::bitwise) {
        total = tree_sum(grad_sq_.data(), n);
    } else {
        for (float x : grad_sq_) total += x;
    }
    return std::sqrt(total);
}

std::vector<float> Job::tensor_sums_of_squares(const float* g, bool zero_shard) {
    EntrySums s;
    s.owned = pipeline_->owned_entries(*model_);
    if (zero_shard && data_->zero_sharded()) {
        const Range r = data_->update_range();
        s.group = rank_.groups.dp, s.lo = r.lo, s.hi = r.hi;
    }
    for (auto& p : parts_) p->entry_sums(g, s);
    return pipeline_->by_tensor(*model_, s.sums);
}

void Job::all_reduce_max(float* v, i64 n) {
    const RankGroups& g = rank_.groups;
    for (comm::Communicator* c : {g.tp, g.cp, g.dp, g.pp})
        if (c && n > 0) c->all_reduce_max(v, n);
}

void Job::watch_logits(bool on) {
    watch_logits_ = on;
    logit_max_.assign(on ? static_cast<size_t>(rank_.cfg.model.layers) : 0,
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

void Job::report_event(const RunEvent& e) {
    for (Observer* o : observers_) o->on_event(*this, e);
}

void Job::report_fp8(const std::vector<Fp8Stat>& rows) {
    for (Observer* o : observers_) o->on_fp8(*this, rows);
}

// Forward only, microbatch after microbatch, each through the virtual stages in order; the
// last stage keeps the losses in token order (batch j, then sequence).
double Job::evaluate() {
    const i64 batches = rank_.cfg.train.val_batches;
    const i64 per_rank = rank_.local_B * rank_.Tl, mb_tokens = rank_.micro_B * rank_.Tl;
    std::vector<float> local(rank_.last_stage() ? static_cast<size_t>(batches * per_rank) : 0);
    for (i64 j = 0; j < batches; j++)
        for (int k = 0; k < rank_.layout.microbatches; k++) {
            data_->draw_val(*source_, j, k);
            pipeline_->forward_only(data_->val_tokens(), data_->val_targets(),
                                    local.empty() ? nullptr
                                                  : local.data() + j * per_rank + k * mb_tokens);
        }
    pipeline_->wait_sends();
    return pipeline_->from_last_stage(rank_.last_stage() ? data_->mean_loss(local, batches) : 0);
}

void Job::run() {
    for (Observer* o : observers_) o->on_start(*this);
    while (step_ < std::min(rank_.cfg.train.steps, stop_after_)) step();
    for (auto& p : parts_) p->end_run();
    const OutputConfig& out = rank_.cfg.output;
    if (!out.export_llmc.empty()) {
        std::vector<float> params;
        gather_full(*this, &params, nullptr, nullptr);
        if (rank_.at.pp == 0 && rank_.at.dp == 0 && rank_.at.tp == 0) {  // one writer
            const ParamTable full = ParamTable::build(rank_.cfg.model);
            write_llmc_checkpoint(out.export_llmc, rank_.cfg.model, [&](const std::string& name) {
                const int i = full.find(name);
                return i < 0 ? nullptr
                             : params.data() + full.entries[static_cast<size_t>(i)].offset;
            });
        }
    }
    for (Observer* o : observers_) o->on_end(*this);
}

// ---- state -----------------------------------------------------------------------------------

void Job::snapshot(LocalSnapshot& s) const {
    const Range w = data_->weights_held();  // ZeRO-3: only its shard between steps
    const AdamW& opt = optimizer();
    s.params.assign(model_->params() + w.lo, model_->params() + w.hi);
    s.m.assign(opt.m(), opt.m() + opt.size());
    s.v.assign(opt.v(), opt.v() + opt.size());
    s.parts.resize(parts_.size());
    for (size_t i = 0; i < parts_.size(); i++) parts_[i]->save(s.parts[i]);
    s.step = step_;
    s.history = history_;
}

void Job::rewind(const LocalSnapshot& s) {
    const Range w = data_->weights_held();
    const AdamW& opt = optimizer();
    PX_ASSERT(s.step >= 0 && static_cast<i64>(s.params.size()) == w.hi - w.lo &&
                  static_cast<i64>(s.m.size()) == opt.size() && s.m.size() == s.v.size() &&
                  s.parts.size() == parts_.size(),
              "a snapshot of another model or optimizer shard");
    std::copy(s.params.begin(), s.params.end(), model_->params() + w.lo);
    std::copy(s.m.begin(), s.m.end(), opt.m());
    std::copy(s.v.begin(), s.v.end(), opt.v());
    for (size_t i = 0; i < parts_.size(); i++) parts_[i]->restore(s.parts[i]);
    step_ = s.step;
    history_ = s.history;
}

void Job::probe_update() {
    // ZeRO-3 holds only its shard of the weights between steps; ZeRO-1..3 only theirs of the
    // moments.
    const Range w = data_->weights_held();
    const AdamW& opt = optimizer();
    model_->probe_params(*probes_, step_, "optim", "param", model_->params() + w.lo, w.lo, w.hi);
    model_->probe_params(*probes_, step_, "optim", "adam.m", opt.m(), opt.lo(), opt.hi());
    model_->probe_params(*probes_, step_, "optim", "adam.v", opt.v(), opt.lo(), opt.hi());
    for (const auto& p : parts_) p->probe(*probes_, step_);
}

RankState Job::rank_state() {
    RankState s = data_->replica_state();
    const ParamTable& t = model_->table();
    for (size_t i = 0; i < t.entries.size(); i++) {
        bool w = true;
        for (const auto& p : parts_) w = w && p->writes(t.entries[i]);
        s.writes_entry[i] = w;
    }
    return s;
}

void Job::restore_local(const CheckpointReader& file, const std::vector<StepMetrics>& history) {
    read_rank_state(file, rank_state());
    history_ = history;
    step_ = static_cast<i64>(history.size());
    skipped_ = file.meta().skipped_batches;  // the batches the writer never drew again
    for (auto& p : parts_) p->restore(file);
}

// ---- accounting ------------------------------------------------------------------------------

MemoryStats Job::memory() const {
    MemoryStats m;
    m.params = model_->table().total * static_cast<i64>(sizeof(float));
    for (const auto& p : parts_) p->memory(m);
    return m;
}

CpStats Job::cp_stats() const {
    PartStats s;
    for (const auto& p : parts_) p->stats(s);
    return s.cp;
}

EpStats Job::ep_stats() const {
    PartStats s;
    for (const auto& p : parts_) p->stats(s);
    return s.ep;
}

}  // namespace px
