// Pipeline parallelism: one GPT per pp rank over its virtual stages, the schedule's action list
// executed with asynchronous sends and blocking recvs, microbatch gradients combined in the
// token tree per chunk, and the step's cross-stage reductions (tied wte, loss, grad norm) formed
// exactly as the single device forms them. See pipeline.h for the argument.
#include "core/parallel/pipeline.h"

#include "core/checkpoint_llmc.h"
#include "core/comm/comm.h"
#include "core/comm/inproc.h"
#include "core/data.h"
#include "core/error.h"
#include "kernels/ops.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <thread>

namespace px {

namespace {

// Tags outside message_tag's range [0, 2·microbatches·S) of a step's messages.
constexpr int kTiedTag = 1 << 29;      // the two parts of dwte, first <-> last stage
constexpr int kEvalTagBase = 1 << 28;  // validation forwards: + the receiving virtual stage

// Bytes this rank has sent so far, in all its groups (Communicator accounting).
double bytes_sent(const comm::Communicator& c) {
    double b = 0;
    for (const comm::StatRow& r : c.stats_book()->rows()) b += static_cast<double>(r.bytes_sent);
    return b;
}

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

// What this build's pipeline runs; make_layout has checked the rest (pp <= layers, interleaved
// divisibility, microbatches, token-tree nodes).
void check_pipeline_layout(const Layout& l, const std::string& source) {
    if (l.pp < 2)
        throw ConfigError(source + ": layout.pp = " + std::to_string(l.pp) +
                          ": a pipeline needs layout.pp >= 2 (with one stage the job runs as a "
                          "single Job)");
    if (l.dp > 1 || l.tp > 1)
        throw ConfigError(source + ": layout.pp = " + std::to_string(l.pp) + " with layout.dp = " +
                          std::to_string(l.dp) + " and layout.tp = " + std::to_string(l.tp) +
                          ": pipeline parallelism runs with dp = tp = 1 in this build");
}

}  // namespace

ModelPart stage_part(const Mesh& mesh, int pp_rank) {
    const Layout& l = mesh.layout();
    ModelPart part;
    for (int c = 0; c < l.virtual_stages; c++) {
        const LayerRange r = mesh.layers(pp_rank, c);
        part.chunks.push_back({r.lo, r.hi});
    }
    part.embedding = pp_rank == rank_of_stage(0, l.pp);
    part.head = pp_rank == rank_of_stage(l.num_stages() - 1, l.pp);
    return part;
}

// ---- TreeAccumulator -------------------------------------------------------------------------

TreeAccumulator::TreeAccumulator(int microbatches, i64 blocks_per_microbatch, float* result,
                                 i64 floats, GradSpan span)
    : result_(result), floats_(floats), span_(span) {
    PX_ASSERT(microbatches >= 1 && blocks_per_microbatch >= 1, "TreeAccumulator: empty tree");
    PX_ASSERT(0 <= span.lo && span.lo <= span.hi && span.hi <= floats, "TreeAccumulator: span");
    leaf_.assign(static_cast<size_t>(microbatches), -1);
    build(0, blocks_per_microbatch * microbatches, blocks_per_microbatch, -1);
    for (int k = 0; k < microbatches; k++)
        PX_ASSERT(leaf_[static_cast<size_t>(k)] >= 0, "TreeAccumulator: a microbatch is no node");
}

// Node [lo, hi) of token blocks; it splits at ceil(n/2) (DESIGN.md §2.1) until one microbatch's.
int TreeAccumulator::build(i64 lo, i64 hi, i64 bpm, int parent) {
    const int id = static_cast<int>(nodes_.size());
    nodes_.push_back(Node{});
    nodes_[static_cast<size_t>(id)].parent = parent;
    if (hi - lo == bpm) {
        PX_ASSERT(lo % bpm == 0, "TreeAccumulator: a microbatch's blocks are not one node");
        leaf_[static_cast<size_t>(lo / bpm)] = id;
        return id;
    }
    PX_ASSERT(hi - lo > bpm, "TreeAccumulator: a microbatch's blocks are not one node");
    const i64 mid = tree_mid(lo, hi);
    const int left = build(lo, mid, bpm, id);
    const int right = build(mid, hi, bpm, id);
    nodes_[static_cast<size_t>(id)].left = left;
    nodes_[static_cast<size_t>(id)].right = right;
    return id;
}

float* TreeAccumulator::take() {
    if (free_.empty()) {
        pool_.emplace_back(floats_);
        free_.push_back(pool_.back().data());
    }
    float* b = free_.back();
    free_.pop_back();
    return b;
}

float* TreeAccumulator::begin(int k) {
    Node& n = nodes_[static_cast<size_t>(leaf_[static_cast<size_t>(k)])];
    PX_ASSERT(!n.done && n.buf == nullptr, "TreeAccumulator: microbatch " + std::to_string(k) +
                                               " accumulated twice in one step");
    // The leftmost leaf's buffer becomes every ancestor's, up to the root: the result.
    n.buf = k == 0 ? result_ : take();
    std::memset(n.buf + span_.lo, 0, static_cast<size_t>(span_.hi - span_.lo) * sizeof(float));
    return n.buf;
}

void TreeAccumulator::end(int k) {
    int id = leaf_[static_cast<size_t>(k)];
    nodes_[static_cast<size_t>(id)].done = true;
    // Walk up while the sibling is complete too: parent = left + right, in left's buffer.
    for (int p = nodes_[static_cast<size_t>(id)].parent; p >= 0;
         p = nodes_[static_cast<size_t>(p)].parent) {
        Node& node = nodes_[static_cast<size_t>(p)];
        Node& l = nodes_[static_cast<size_t>(node.left)];
        Node& r = nodes_[static_cast<size_t>(node.right)];
        if (!l.done || !r.done) return;
        float* left = l.buf;
        const float* right = r.buf;
        const i64 lo = span_.lo, hi = span_.hi;
#pragma omp parallel for schedule(static)
        for (i64 i = lo; i < hi; i++) left[i] = left[i] + right[i];
        free_.push_back(r.buf);
        node.buf = l.buf;
        node.done = true;
        l.buf = r.buf = nullptr;
    }
}

i64 TreeAccumulator::bytes() const {
    i64 n = 0;
    for (const Arena& a : pool_) n += a.size() * static_cast<i64>(sizeof(float));
    return n;
}

void TreeAccumulator::reset() {
    for (Node& n : nodes_) {
        n.done = false;
        n.buf = nullptr;
    }
    free_.clear();
    for (Arena& a : pool_) free_.push_back(a.data());
}

// ---- PipelineJob -----------------------------------------------------------------------------

// One set of activations for one (microbatch, chunk), and the send that still reads from it.
struct PipelineJob::Slot {
    Activations acts;
    comm::Handle pending;
};

PipelineJob::PipelineJob(const Config& cfg, comm::Communicator& pp)
    : cfg_(cfg),
      nx_(make_numerics(cfg.numerics)),
      mesh_(make_layout(cfg)),
      schedule_(mesh_.schedule()),
      comm_(pp) {
    const Layout& l = mesh_.layout();
    check_pipeline_layout(l, cfg_.source_name);
    if (comm_.size() != l.pp)
        throw ConfigError("the pipeline group has " + std::to_string(comm_.size()) +
                          " ranks but layout.pp = " + std::to_string(l.pp));
    if (cfg_.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg_.train.threads));

    const TrainConfig& tc = cfg_.train;
    rank_ = comm_.rank();
    pp_ = l.pp;
    v_ = l.virtual_stages;
    S_ = l.num_stages();
    M_ = l.microbatches;
    T_ = cfg_.model.seq_len;
    micro_B_ = l.microbatch_size();
    hidden_floats_ = micro_B_ * T_ * cfg_.model.hidden;
    recompute_ = l.recompute == Recompute::full;

    source_ = make_source(cfg_);
    if (source_->vocab() > cfg_.model.vocab)
        throw ConfigError("the data has " + std::to_string(source_->vocab()) +
                          " symbols but model.vocab = " + std::to_string(cfg_.model.vocab));

    // Who owns which tensor of the whole model: a layer's stage's rank; wte and wpe the first
    // stage (which holds wte's complete gradient as well as the last), ln_f the last.
    for (int r = 0; r < pp_; r++) parts_.push_back(stage_part(mesh_, r));
    owner_.assign(static_cast<size_t>(ParamTable::num_tensors(cfg_.model)), -1);
    for (int r = 0; r < pp_; r++) {
        const ParamTable t = ParamTable::build(cfg_.model, parts_[static_cast<size_t>(r)]);
        for (const TableEntry& e : t.entries)
            if (owner_[static_cast<size_t>(e.id)] < 0) owner_[static_cast<size_t>(e.id)] = r;
    }

    model_ = std::make_unique<GPT>(cfg_.model, nx_, parts_[static_cast<size_t>(rank_)]);
    if (!cfg_.model.init_from.empty()) {
        // The checkpoint holds the whole model: this stage keeps its tensors, the rest is read
        // into a scratch buffer and dropped.
        const GPT& m = *model_;
        const ParamTable full = ParamTable::build(cfg_.model);
        std::vector<float> discard;
        read_llmc_checkpoint(cfg_.model.init_from, cfg_.model, [&](const std::string& name) {
            if (float* p = m.param_ptr(name)) return p;
            const int i = full.find(name);
            if (i < 0) return static_cast<float*>(nullptr);
            discard.resize(static_cast<size_t>(full.entries[static_cast<size_t>(i)].numel()));
            return discard.data();
        });
    } else {
        model_->init_random(tc.seed, cfg_.model.init_std);
    }
    opt_ = std::make_unique<AdamW>(*model_);
    grads_ = Arena(model_->grad_layout().total);

    // Microbatches own token blocks [k·b, (k+1)·b) (make_layout checked they are tree nodes).
    const i64 mb_tokens = micro_B_ * T_;
    const i64 bpm = M_ > 1 ? mb_tokens / nx_.block : 1;
    for (int c = 0; c < v_; c++)
        acc_.emplace_back(M_, bpm, grads_.data(), model_->grad_layout().total,
                          model_->grad_span(c));
    slots_.resize(static_cast<size_t>(v_));
    free_.resize(static_cast<size_t>(v_));
    live_.assign(static_cast<size_t>(v_), std::vector<Slot*>(static_cast<size_t>(M_), nullptr));

    windows_.resize(static_cast<size_t>(tc.batch_size * (T_ + 1)));
    inputs_.resize(static_cast<size_t>(tc.batch_size * T_));
    targets_.resize(static_cast<size_t>(tc.batch_size * T_));
    all_losses_.resize(static_cast<size_t>(tc.batch_size * T_));
}

PipelineJob::~PipelineJob() = default;

i64 PipelineJob::num_params() const {
    return ParamTable::build(cfg_.model).num_params;
}

double PipelineJob::loss_floor() const {
    const auto* markov = dynamic_cast<const MarkovSource*>(source_.get());
    return markov ? markov->window_floor(cfg_.model.seq_len) : -1.0;
}

double PipelineJob::entropy_rate() const {
    const auto* markov = dynamic_cast<const MarkovSource*>(source_.get());
    return markov ? markov->entropy_rate() : -1.0;
}

int PipelineJob::activation_sets(int chunk) const {
    return static_cast<int>(slots_[static_cast<size_t>(chunk)].size());
}

i64 PipelineJob::activation_bytes() const {
    i64 n = 0;
    for (const auto& chunk : slots_)
        for (const auto& s : chunk) n += s->acts.bytes();
    return n;
}

MemoryStats PipelineJob::memory() const {
    MemoryStats m;
    m.params = model_->table().total * static_cast<i64>(sizeof(float));
    m.grads = grads_.size() * static_cast<i64>(sizeof(float));
    for (const TreeAccumulator& a : acc_) m.grads += a.bytes();
    m.optimizer = 2 * opt_->size() * static_cast<i64>(sizeof(float));
    m.activations = activation_bytes();
    return m;
}

// A free set of activations whose last outgoing message has landed; a new one if none has.
// Never waiting on a send here keeps sends asynchronous, as the schedule's deadlock argument
// requires.
PipelineJob::Slot* PipelineJob::acquire(int chunk) {
    auto& pool = free_[static_cast<size_t>(chunk)];
    for (size_t i = 0; i < pool.size(); i++) {
        Slot* s = pool[i];
        if (!s->pending.test()) continue;
        s->pending.wait();  // completed: returns at once (and rethrows a failure)
        pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(i));
        return s;
    }
    auto slot = std::make_unique<Slot>();
    slot->acts = model_->make_activations(chunk, micro_B_, T_, recompute_);
    slots_[static_cast<size_t>(chunk)].push_back(std::move(slot));
    return slots_[static_cast<size_t>(chunk)].back().get();
}

void PipelineJob::release(int chunk, Slot* s) {
    free_[static_cast<size_t>(chunk)].push_back(s);
}

void PipelineJob::wait_sends() {
    for (auto& chunk : slots_)
        for (auto& s : chunk) s->pending.wait();
}

// This rank's list, in order (schedule.h gives each action's meaning).
void PipelineJob::run_actions() {
    const i64 N = cfg_.train.batch_size * T_;
    const float dloss = 1.0f / static_cast<float>(N);
    for (const Action& a : schedule_.ranks[static_cast<size_t>(rank_)]) {
        const int c = a.chunk, m = a.microbatch;
        Slot*& live = live_[static_cast<size_t>(c)][static_cast<size_t>(m)];
        switch (a.kind) {
            case Action::recv_act:
                PX_ASSERT(live == nullptr, "recv_act for a microbatch already in flight");
                live = acquire(c);
                comm_.recv(live->acts.input(), hidden_floats_, a.peer,
                           message_tag(schedule_, rank_, a));
                break;
            case Action::forward:
                if (live == nullptr) {
                    PX_ASSERT(stage_of(rank_, c, pp_) == 0, "forward before its input arrived");
                    live = acquire(c);
                }
                model_->forward(live->acts, c, tokens(m), targets(m));
                if (is_last_virtual(c))
                    std::memcpy(all_losses_.data() + m * micro_B_ * T_, live->acts.losses(),
                                static_cast<size_t>(micro_B_ * T_) * sizeof(float));
                break;
            case Action::send_act:
                live->pending =
                    comm_.send_async(static_cast<const float*>(live->acts.output()), hidden_floats_,
                                     a.peer, message_tag(schedule_, rank_, a));
                break;
            case Action::recv_grad:
                // Into dresidual, which the pending send of the output does not read.
                comm_.recv(live->acts.dresidual(), hidden_floats_, a.peer,
                           message_tag(schedule_, rank_, a));
                break;
            case Action::backward: {
                // The output's send has landed (the gradient that came back needed it): complete
                // it before a recomputing backward writes the output again.
                live->pending.wait();
                TreeAccumulator& acc = acc_[static_cast<size_t>(c)];
                model_->backward(live->acts, c, acc.begin(m), tokens(m), targets(m), dloss);
                acc.end(m);
                if (stage_of(rank_, c, pp_) == 0) {  // nothing to send back: done with it
                    release(c, live);
                    live = nullptr;
                }
                break;
            }
            case Action::send_grad:
                live->pending =
                    comm_.send_async(static_cast<const float*>(live->acts.dresidual()),
                                     hidden_floats_, a.peer, message_tag(schedule_, rank_, a));
                release(c, live);
                live = nullptr;
                break;
        }
    }
    wait_sends();
    for (int c = 0; c < v_; c++) {
        PX_ASSERT(acc_[static_cast<size_t>(c)].complete(),
                  "the schedule left a microbatch's backward out");
        for (Slot* s : live_[static_cast<size_t>(c)])
            PX_ASSERT(s == nullptr, "the schedule left a microbatch in flight");
    }
}

// dwte = dwte(embedding) + dwte(LM head): the first stage sends its embedding part and receives
// the head's into its head region; the last stage the other way round, into its wte slot. Both
// then add in the same order, as GPT::combine_tied_grads does on one device.
void PipelineJob::exchange_tied_grads(float* g) {
    const GPT& m = *model_;
    if (!m.part().holds_wte()) return;
    const i64 VC = cfg_.model.vocab * cfg_.model.hidden;
    float* emb = g + m.table().entries[static_cast<size_t>(m.table().wte)].offset;
    float* head = g + m.grad_layout().head_offset;
    if (first_stage()) {
        comm::Handle h = comm_.send_async(static_cast<const float*>(emb), VC, pp_ - 1, kTiedTag);
        comm_.recv(head, VC, pp_ - 1, kTiedTag);
        h.wait();
    } else {
        comm::Handle h = comm_.send_async(static_cast<const float*>(head), VC, 0, kTiedTag);
        comm_.recv(emb, VC, 0, kTiedTag);
        h.wait();
    }
    m.combine_tied_grads(g);
}

// ‖g‖₂ as global_grad_norm: per-tensor canonical Σg² on the owner, then the tree over tensors
// in the whole model's order. The owners' values are gathered (copied, not added).
float PipelineJob::grad_norm(float* g) {
    const GPT& m = *model_;
    const i64 n = static_cast<i64>(owner_.size());
    std::vector<float> mine(static_cast<size_t>(n), 0.0f), all(static_cast<size_t>(n * pp_));
    for (size_t i = 0; i < m.table().entries.size(); i++) {
        const int id = m.table().entries[i].id;
        if (owner_[static_cast<size_t>(id)] == rank_)
            mine[static_cast<size_t>(id)] = ops::sum_squares(nx_, m.grad(g, static_cast<int>(i)));
    }
    comm_.all_gather(all.data(), mine.data(), n);
    std::vector<float> per_tensor(static_cast<size_t>(n));
    for (i64 id = 0; id < n; id++)
        per_tensor[static_cast<size_t>(id)] =
            all[static_cast<size_t>(owner_[static_cast<size_t>(id)] * n + id)];
    float total = 0.0f;
    if (nx_.mode == Mode::bitwise) {
        total = tree_sum(per_tensor.data(), n);
    } else {
        for (float x : per_tensor) total += x;
    }
    return std::sqrt(total);
}

StepMetrics PipelineJob::step() {
    const auto t0 = std::chrono::steady_clock::now();
    const double sent0 = bytes_sent(comm_);
    const TrainConfig& tc = cfg_.train;
    const i64 N = tc.batch_size * T_;

    // Every rank samples the step's batch (counter-based, so identically): the first stage
    // needs the tokens, the last the targets.
    source_->sample(windows_.data(), T_, Split::train, step_, 0, tc.batch_size);
    split_windows(inputs_.data(), targets_.data(), windows_.data(), tc.batch_size, T_);
    for (TreeAccumulator& a : acc_) a.reset();
    run_actions();

    float* g = grads_.data();
    exchange_tied_grads(g);
    const float norm = grad_norm(g);

    StepMetrics m;
    m.step = step_ + 1;
    double loss = 0;
    if (last_stage()) {
        const float mean = canonical_sum(all_losses_.data(), N, nx_.block) / static_cast<float>(N);
        loss = mean;
    }
    comm_.broadcast(&loss, 1, pp_ - 1);
    m.loss = loss;
    m.grad_norm = norm;
    m.lr = lr_at(tc, step_);
    opt_->step(*model_, g, norm, static_cast<float>(m.lr), static_cast<int>(step_ + 1), tc);
    step_++;

    const double secs = seconds_since(t0);
    m.comm_bytes = bytes_sent(comm_) - sent0;
    m.step_ms = secs * 1e3;
    m.tokens_per_s = static_cast<double>(N) / secs;
    if ((tc.eval_every > 0 && step_ % tc.eval_every == 0) ||
        (step_ == tc.steps && tc.eval_every > 0))
        m.val_loss = evaluate();
    history_.push_back(m);
    return m;
}

// Forward only, microbatch after microbatch, each through the virtual stages in order; the
// last stage keeps the losses in token order (batch j, then sequence), as Job::evaluate. A
// message's tag names its receiving stage, so each channel carries one stage's messages in
// (batch, microbatch) order on both sides.
double PipelineJob::evaluate() {
    const TrainConfig& tc = cfg_.train;
    const i64 per_batch = tc.batch_size * T_, mb_tokens = micro_B_ * T_;
    std::vector<float> all(last_stage() ? static_cast<size_t>(tc.val_batches * per_batch) : 0);
    std::vector<int> win(static_cast<size_t>(micro_B_ * (T_ + 1)));
    std::vector<int> tok(static_cast<size_t>(mb_tokens)), tgt(static_cast<size_t>(mb_tokens));
    for (i64 j = 0; j < tc.val_batches; j++) {
        for (int k = 0; k < M_; k++) {
            source_->sample(win.data(), T_, Split::val, j, k * micro_B_, micro_B_);
            split_windows(tok.data(), tgt.data(), win.data(), micro_B_, T_);
            for (int c = 0; c < v_; c++) {
                const int stage = stage_of(rank_, c, pp_);
                Slot* s = acquire(c);
                if (stage > 0)
                    comm_.recv(s->acts.input(), hidden_floats_, rank_of_stage(stage - 1, pp_),
                               kEvalTagBase + stage);
                model_->forward(s->acts, c, tok.data(), tgt.data());
                if (stage < S_ - 1)
                    s->pending = comm_.send_async(static_cast<const float*>(s->acts.output()),
                                                  hidden_floats_, rank_of_stage(stage + 1, pp_),
                                                  kEvalTagBase + stage + 1);
                else
                    std::memcpy(all.data() + j * per_batch + k * mb_tokens, s->acts.losses(),
                                static_cast<size_t>(mb_tokens) * sizeof(float));
                release(c, s);
            }
        }
    }
    wait_sends();
    double val = 0;
    if (last_stage()) {
        const i64 n = static_cast<i64>(all.size());
        val = canonical_sum(all.data(), n, nx_.block) / static_cast<double>(n);
    }
    comm_.broadcast(&val, 1, pp_ - 1);
    return val;
}

void PipelineJob::gather_full(std::vector<float>* params, std::vector<float>* m,
                              std::vector<float>* v) {
    const ParamTable full = ParamTable::build(cfg_.model);
    std::vector<ParamTable> tables;
    std::vector<i64> counts;
    for (const ModelPart& p : parts_) {
        tables.push_back(ParamTable::build(cfg_.model, p));
        counts.push_back(tables.back().total);
    }
    i64 sum = 0;
    for (i64 c : counts) sum += c;
    std::vector<float> gathered(static_cast<size_t>(sum));
    auto assemble = [&](std::vector<float>* out, const float* local, const char* what) {
        if (out == nullptr) return;
        comm_.all_gather_v(gathered.data(), local, std::span<const i64>(counts));
        out->assign(static_cast<size_t>(full.total), 0.0f);
        std::vector<char> seen(full.entries.size(), 0);
        i64 base = 0;
        for (int r = 0; r < pp_; r++) {
            for (const TableEntry& e : tables[static_cast<size_t>(r)].entries) {
                const float* src = gathered.data() + base + e.offset;
                float* dst = out->data() + full.entries[static_cast<size_t>(e.id)].offset;
                const size_t bytes = static_cast<size_t>(e.numel()) * sizeof(float);
                if (seen[static_cast<size_t>(e.id)] && std::memcmp(dst, src, bytes) != 0)
                    throw InternalError(std::string("pipeline: the stages' copies of ") + e.name +
                                        " (" + what + ") differ");
                std::memcpy(dst, src, bytes);
                seen[static_cast<size_t>(e.id)] = 1;
            }
            base += counts[static_cast<size_t>(r)];
        }
    };
    assemble(params, model_->params(), "weights");
    assemble(m, opt_->m(), "Adam m");
    assemble(v, opt_->v(), "Adam v");
}

void PipelineJob::run(const std::function<void(const StepMetrics&)>& on_step) {
    while (step_ < cfg_.train.steps) {
        const StepMetrics m = step();
        if (on_step) on_step(m);
    }
    if (!cfg_.output.export_llmc.empty()) {
        std::vector<float> params;
        gather_full(&params, nullptr, nullptr);
        if (rank_ == 0) {
            const ParamTable full = ParamTable::build(cfg_.model);
            write_llmc_checkpoint(
                cfg_.output.export_llmc, cfg_.model, [&](const std::string& name) {
                    const int i = full.find(name);
                    return i < 0 ? nullptr
                                 : params.data() + full.entries[static_cast<size_t>(i)].offset;
                });
        }
    }
}

// ---- run_pipeline ----------------------------------------------------------------------------

void run_pipeline(const Config& cfg, const std::vector<Observer*>& observers,
                  const std::function<void(PipelineJob&)>& inspect) {
    const Layout l = make_layout(cfg);  // validates before any thread starts
    check_pipeline_layout(l, cfg.source_name);
    const int n = l.pp;
    // Ranks are threads; the cores are shared out so that the ranks together use them once.
    const int threads =
        cfg.train.threads > 0
            ? static_cast<int>(cfg.train.threads)
            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / n);
    Config rank_cfg = cfg;
    rank_cfg.train.threads = threads;

    std::mutex inspect_mutex;
    comm::run_ranks(n, l.timeout_s, [&](comm::Communicator& world) {
        // With dp = tp = 1 the whole world is the pipeline group.
        PipelineJob job(rank_cfg, world);
        const bool report = world.rank() == 0;
        if (report)
            for (Observer* o : observers) o->on_start(job);
        job.run([&](const StepMetrics& m) {
            if (report)
                for (Observer* o : observers) o->on_step(job, m);
        });
        if (report)
            for (Observer* o : observers) o->on_end(job);
        if (inspect) {
            std::lock_guard<std::mutex> lock(inspect_mutex);
            inspect(job);
        }
    });
}

}  // namespace px
