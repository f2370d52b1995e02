// Pipeline parallelism: one GPT per pp rank over its virtual stages, the schedule's action list
// executed with asynchronous sends and blocking recvs, microbatch gradients combined in the
// token tree per chunk, and the step's cross-stage reductions (tied wte, loss, grad norm) formed
// exactly as the single device forms them. See pipeline.h for the argument.
#include "core/parallel/pipeline.h"

#include "core/parallel/checkpointing.h"
#include "core/parallel/faults.h"
#include "core/parallel/rank_guards.h"
#include "core/parallel/runner.h"

#include "core/checkpoint_llmc.h"
#include "core/comm/comm.h"
#include "core/comm/inproc.h"
#include "core/data.h"
#include "core/error.h"
#include "core/mutation.h"
#include "core/parallel/state_slices.h"
#include "core/parallel/tp_model.h"
#include "core/parallel/zero.h"
#include "kernels/ops.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>

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
}

// The model's TpLayers; null when the stage is not cut over a tp group.
const TpLayers* tp_layers(const GPT& m) {
    return dynamic_cast<const TpLayers*>(m.parallel_layers());
}

// Per-rank element counts of cuts (size p+1).
std::vector<i64> counts_of(const std::vector<i64>& cuts) {
    std::vector<i64> c(cuts.size() - 1);
    for (size_t r = 0; r + 1 < cuts.size(); r++) c[r] = cuts[r + 1] - cuts[r];
    return c;
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

i64 TreeAccumulator::resident_bytes() const {
    i64 n = 0;
    for (const Arena& a : pool_) n += a.resident_bytes();
    return n;
}

void TreeAccumulator::release() {
    for (Arena& a : pool_) a.decommit(0, a.size());
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

PipelineJob::PipelineJob(const Config& cfg, comm::Communicator& pp, ReplicaContext replica)
    : cfg_(cfg),
      nx_(make_numerics(cfg.numerics)),
      mesh_(make_layout(cfg)),
      schedule_(mesh_.schedule()),
      comm_(pp),
      replica_(replica) {
    const Layout& l = mesh_.layout();
    check_pipeline_layout(l, cfg_.source_name);
    if (comm_.size() != l.pp)
        throw ConfigError("the pipeline group has " + std::to_string(comm_.size()) +
                          " ranks but layout.pp = " + std::to_string(l.pp));
    if (replica_.dp) {
        dp_rank_ = replica_.dp->rank();
        dp_ = replica_.dp->size();
    }
    if (dp_ != l.dp)
        throw ConfigError("the data-parallel group has " + std::to_string(dp_) +
                          " ranks but layout.dp = " + std::to_string(l.dp));
    if (replica_.tp) {
        tp_rank_ = replica_.tp->rank();
        tp_ = replica_.tp->size();
    }
    if (tp_ != l.tp)
        throw ConfigError("the tensor-parallel group has " + std::to_string(tp_) +
                          " ranks but layout.tp = " + std::to_string(l.tp));
    if (cfg_.train.threads > 0) omp_set_num_threads(static_cast<int>(cfg_.train.threads));

    const TrainConfig& tc = cfg_.train;
    rank_ = comm_.rank();
    pp_ = l.pp;
    v_ = l.virtual_stages;
    S_ = l.num_stages();
    M_ = l.microbatches;
    T_ = cfg_.model.seq_len;
    micro_B_ = l.microbatch_size();
    local_B_ = micro_B_ * M_;
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

    const ModelPart& part = parts_[static_cast<size_t>(rank_)];
    if (tp_ > 1) {
        // The stage's part over TpLayers: this tp rank's shard of the stage's tensors.
        // With sequence parallelism the stage's residual stream is sharded by tokens too.
        model_ =
            std::make_unique<GPT>(cfg_.model, nx_, part,
                                  std::make_shared<const TpLayers>(*replica_.tp, nx_, cfg_.model,
                                                                   cfg_.layout.sequence_parallel));
    } else {
        model_ = std::make_unique<GPT>(cfg_.model, nx_, part);
    }
    // Messages: the whole (micro_B,T,C) hidden state, or under sequence parallelism this tp
    // rank's token rows of it (all that a stage's first block reads and its last block writes;
    // the same tp rank of the next stage holds the same rows).
    msg_lo_ = 0;
    msg_floats_ = hidden_floats_;
    if (const ParallelLayers* pl = model_->parallel_layers(); pl && pl->sequence_parallel()) {
        const TokenRows r = pl->token_rows(micro_B_ * T_);
        msg_lo_ = r.lo * cfg_.model.hidden;
        msg_floats_ = (r.hi - r.lo) * cfg_.model.hidden;
    }
    if (const TpLayers* tpl = tp_layers(*model_); tpl && !cfg_.model.init_from.empty()) {
        // The checkpoint holds the logical tensors: read them whole, keep this shard's slices.
        const ParamTable full = ParamTable::build(cfg_.model);
        std::vector<float> buf(static_cast<size_t>(full.total));
        read_init_weights(cfg_.model.init_from, cfg_.model, [&](const std::string& name) {
            const int i = full.find(name);
            return i < 0 ? nullptr : buf.data() + full.entries[static_cast<size_t>(i)].offset;
        });
        load_logical(*tpl, *model_, full, buf.data());
    } else if (!cfg_.model.init_from.empty()) {
        // The checkpoint holds the whole model: this stage keeps its tensors, the rest is read
        // into a scratch buffer and dropped.
        const GPT& m = *model_;
        const ParamTable full = ParamTable::build(cfg_.model);
        std::vector<float> discard;
        read_init_weights(cfg_.model.init_from, cfg_.model, [&](const std::string& name) {
            if (float* p = m.param_ptr(name)) return p;
            const int i = full.find(name);
            if (i < 0) return static_cast<float*>(nullptr);
            discard.resize(static_cast<size_t>(full.entries[static_cast<size_t>(i)].numel()));
            return discard.data();
        });
    } else {
        model_->init_random(tc.seed, cfg_.model.init_std);
    }
    // ZeRO: each replica keeps the moments of one shard of the stage's parameters.
    zero_ = dp_ > 1 ? replica_.zero : 0;
    if (zero_ >= 1) {
        shard_edges_ = zero_shard_edges(model_->table(), dp_, nx_.block);
        opt_ = std::make_unique<AdamW>(*model_, shard_edges_[static_cast<size_t>(dp_rank_)],
                                       shard_edges_[static_cast<size_t>(dp_rank_) + 1]);
        if (zero_ == 3) release_params();
    } else {
        opt_ = std::make_unique<AdamW>(*model_);
    }
    grads_ = Arena(model_->grad_layout().total);

    // Microbatches own token blocks [k·b, (k+1)·b) of the replica's node (make_layout checked
    // they are tree nodes); the subtree below a node has the same shape wherever it starts.
    const i64 mb_tokens = micro_B_ * T_;
    const i64 bpm = M_ > 1 ? mb_tokens / nx_.block : 1;
    for (int c = 0; c < v_; c++)
        acc_.emplace_back(M_, bpm, grads_.data(), model_->grad_layout().total,
                          model_->grad_span(c));
    slots_.resize(static_cast<size_t>(v_));
    free_.resize(static_cast<size_t>(v_));
    live_.assign(static_cast<size_t>(v_), std::vector<Slot*>(static_cast<size_t>(M_), nullptr));

    windows_.resize(static_cast<size_t>(local_B_ * (T_ + 1)));
    inputs_.resize(static_cast<size_t>(local_B_ * T_));
    targets_.resize(static_cast<size_t>(local_B_ * T_));
    losses_.resize(static_cast<size_t>(local_B_ * T_));
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

// Under ZeRO-2/3 the weights (ZeRO-3) and gradients are measured between steps: the shards. A
// pipeline stage gathers its ZeRO-3 weights once per step and keeps them through the schedule,
// and reduce-scatters its gradient after the last microbatch (as TorchTitan's FSDP under pipeline
// parallelism does), so the peaks are the whole stage's.
MemoryStats PipelineJob::memory() const {
    MemoryStats m;
    m.params = model_->table().total * static_cast<i64>(sizeof(float));
    m.grads = grads_.size() * static_cast<i64>(sizeof(float));
    for (const TreeAccumulator& a : acc_) m.grads += a.bytes();
    m.peak_params = m.params;
    m.peak_grads = m.grads;
    if (zero_ == 3) m.params = model_->param_arena().resident_bytes();
    if (zero_ >= 2) {
        m.grads = grads_.resident_bytes();
        for (const TreeAccumulator& a : acc_) m.grads += a.resident_bytes();
    }
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

// The model's probes for microbatch m: this replica's rows of it in the step's batch.
void PipelineJob::set_probe_rows(int m) {
    if (!probes_) return;
    probe_ctx_.step = step_ + 1;
    probe_ctx_.batch_total = cfg_.train.batch_size;
    probe_ctx_.batch_lo = dp_rank_ * local_B_ + m * micro_B_;
    model_->set_probes(probes_, &probe_ctx_);
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
                comm_.recv(live->acts.input() + msg_lo_, msg_floats_, a.peer,
                           message_tag(schedule_, rank_, a));
                break;
            case Action::forward:
                set_probe_rows(m);
                if (live == nullptr) {
                    PX_ASSERT(stage_of(rank_, c, pp_) == 0, "forward before its input arrived");
                    live = acquire(c);
                }
                model_->forward(live->acts, c, tokens(m), targets(m));
                if (is_last_virtual(c))
                    std::memcpy(losses_.data() + m * micro_B_ * T_, live->acts.losses(),
                                static_cast<size_t>(micro_B_ * T_) * sizeof(float));
                break;
            case Action::send_act:
                live->pending =
                    comm_.send_async(static_cast<const float*>(live->acts.output() + msg_lo_),
                                     msg_floats_, a.peer, message_tag(schedule_, rank_, a));
                break;
            case Action::recv_grad:
                // Into dresidual, which the pending send of the output does not read.
                comm_.recv(live->acts.dresidual() + msg_lo_, msg_floats_, a.peer,
                           message_tag(schedule_, rank_, a));
                break;
            case Action::backward: {
                // The output's send has landed (the gradient that came back needed it): complete
                // it before a recomputing backward writes the output again.
                live->pending.wait();
                TreeAccumulator& acc = acc_[static_cast<size_t>(c)];
                set_probe_rows(m);
                float* node = acc.begin(m);
                model_->backward(live->acts, c, node, tokens(m), targets(m), dloss);
                if (mutation::armed() && dp_ > 1) {  // a test's flip_grad or drop_microbatch
                    const GradSpan span = model_->grad_span(c);
                    mutation::strike_gradient(model_->table(), step_ + 1, dp_rank_, m, node,
                                              span.lo, span.hi);
                }
                if (probes_) {  // the microbatch's gradient of this chunk, before it joins
                    const GradSpan span = model_->grad_span(c);
                    model_->probe_params(*probes_, step_ + 1, "mgrad", "param", node + span.lo,
                                         span.lo, span.hi, probe_ctx_.batch_lo / micro_B_,
                                         cfg_.train.batch_size / micro_B_);
                }
                acc.end(m);
                if (stage_of(rank_, c, pp_) == 0) {  // nothing to send back: done with it
                    release(c, live);
                    live = nullptr;
                }
                break;
            }
            case Action::send_grad:
                live->pending =
                    comm_.send_async(static_cast<const float*>(live->acts.dresidual() + msg_lo_),
                                     msg_floats_, a.peer, message_tag(schedule_, rank_, a));
                release(c, live);
                live = nullptr;
                break;
        }
    }
    model_->set_probes(nullptr, nullptr);
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
    // This tp rank's rows of wte: the same rows on the first and the last stage.
    const i64 VC = m.table().entries[static_cast<size_t>(m.table().wte)].numel();
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
    if (const TpLayers* tpl = tp_layers(m)) {
        // Each logical tensor's Σg² from its shards' exact block partials (over dp too when the
        // gradient is sharded there: this replica's floats are [lo, hi)).
        const bool sharded = zero_ >= 2;
        const std::vector<float> sums =
            tp_sum_squares(*tpl, m, g, sharded ? replica_.dp : nullptr, sharded ? opt_->lo() : 0,
                           sharded ? opt_->hi() : -1);
        for (size_t i = 0; i < m.table().entries.size(); i++) {
            const int id = m.table().entries[i].id;
            if (owner_[static_cast<size_t>(id)] == rank_) mine[static_cast<size_t>(id)] = sums[i];
        }
    } else if (zero_ >= 2) {
        stage_sum_squares(g, mine);
    } else {
        for (size_t i = 0; i < m.table().entries.size(); i++) {
            const int id = m.table().entries[i].id;
            if (owner_[static_cast<size_t>(id)] == rank_)
                mine[static_cast<size_t>(id)] =
                    ops::sum_squares(nx_, m.grad(g, static_cast<int>(i)));
        }
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

// ZeRO-2/3: the sharded counterpart of the all-reduce. wte's gradient (the embedding's part on
// the first stage, the LM head's on the last) is all-reduced whole, since the two stages cut
// their tables differently and exchange it whole; the rest of the stage's table is
// reduce-scattered at the shard edges.
void PipelineJob::reduce_scatter_grads(float* g) {
    const GPT& m = *model_;
    comm::Communicator& dp = *replica_.dp;
    i64 from = 0;  // the sharded segment [from, table total)
    if (m.part().holds_wte()) {
        const TableEntry& wte = m.table().entries[static_cast<size_t>(m.table().wte)];
        PX_ASSERT(wte.offset == 0, "a stage's table starts with wte");
        dp.all_reduce(g, wte.numel(), replica_.algo);
        dp.all_reduce(g + m.grad_layout().head_offset, wte.numel(), replica_.algo);
        from = wte.numel();
    }
    std::vector<i64> cuts(shard_edges_.size());
    for (size_t r = 0; r < cuts.size(); r++)
        cuts[r] = std::clamp(shard_edges_[r], from, m.table().total) - from;
    std::vector<float> scratch;
    reduce_scatter_cut(dp, g + from, cuts, scratch);
}

// ZeRO-2/3: the per-tensor Σg² of the tensors this pp rank owns, from sharded gradients. Each
// replica computes the canonical blocks in its shard (shard edges are block boundaries, so
// every block has one owner); gathered in shard order they are every block in flat order, and
// each tensor's tree over its blocks is ops::sum_squares's.
void PipelineJob::stage_sum_squares(const float* g, std::vector<float>& per_id) {
    const auto& entries = model_->table().entries;
    const int block = nx_.block;
    auto owned = [&](const TableEntry& e, int r, i64& b0, i64& b1) {
        b0 = b1 = 0;
        if (owner_[static_cast<size_t>(e.id)] != rank_) return;
        const i64 a = std::max(e.offset, shard_edges_[static_cast<size_t>(r)]);
        const i64 b = std::min(e.offset + e.numel(), shard_edges_[static_cast<size_t>(r) + 1]);
        if (a >= b) return;
        b0 = (a - e.offset) / block;
        b1 = num_blocks(b - e.offset, block);
    };
    std::vector<i64> counts(static_cast<size_t>(dp_), 0);
    for (int r = 0; r < dp_; r++)
        for (const TableEntry& e : entries) {
            i64 b0, b1;
            owned(e, r, b0, b1);
            counts[static_cast<size_t>(r)] += b1 - b0;
        }
    std::vector<float> mine(static_cast<size_t>(counts[static_cast<size_t>(dp_rank_)]));
    i64 at = 0;
    for (const TableEntry& e : entries) {
        i64 b0, b1;
        owned(e, dp_rank_, b0, b1);
        if (b1 == b0) continue;
        const i64 a = e.offset + b0 * block,
                  b = std::min(e.offset + e.numel(), e.offset + b1 * block);
        ops::sum_squares_blocks(nx_, view_f32(mine.data() + at, {b1 - b0}),
                                view_f32(g + a, {b - a}));
        at += b1 - b0;
    }
    i64 all_blocks = 0;
    for (i64 c : counts) all_blocks += c;
    std::vector<float> every(static_cast<size_t>(all_blocks));
    replica_.dp->all_gather_v(every.data(), mine.data(), std::span<const i64>(counts));
    at = 0;
    for (const TableEntry& e : entries) {
        if (owner_[static_cast<size_t>(e.id)] != rank_) continue;
        const i64 nb = num_blocks(e.numel(), block);
        per_id[static_cast<size_t>(e.id)] = tree_sum(every.data() + at, nb);
        at += nb;
    }
    PX_ASSERT(at == all_blocks, "every gradient block has exactly one owner");
}

// ZeRO: every replica's shard of the stage's weights to every replica.
void PipelineJob::all_gather_params() {
    const std::vector<i64> counts = counts_of(shard_edges_);
    float* p = model_->params();
    const std::vector<float> mine(p + opt_->lo(), p + opt_->hi());
    replica_.dp->all_gather_v(p, mine.data(), std::span<const i64>(counts));
}

// ZeRO-3: the pages of the weights this replica does not own go back to the system.
void PipelineJob::release_params() {
    model_->param_arena().decommit(0, opt_->lo());
    model_->param_arena().decommit(opt_->hi(), model_->table().total);
}

StepMetrics PipelineJob::step() {
    const auto t0 = std::chrono::steady_clock::now();
    const double sent0 = bytes_sent(comm_);
    const TrainConfig& tc = cfg_.train;
    const i64 N = tc.batch_size * T_;

    // Every rank of a replica samples the replica's sequences [dp_rank·local_B, ...) of the
    // step's batch (counter-based, so identically): the first stage needs the tokens, the last
    // the targets.
    if (hooks_.before) hooks_.before(step_ + 1);
    if (zero_ == 3) all_gather_params();  // gather before use
    source_->sample(windows_.data(), T_, Split::train, step_, dp_rank_ * local_B_, local_B_);
    split_windows(inputs_.data(), targets_.data(), windows_.data(), local_B_, T_);
    for (TreeAccumulator& a : acc_) a.reset();
    run_actions();

    // The replicas' nodes of the token tree combine above them (the LM head's part of dwte
    // too), before anything reads the gradient: then wte's two parts, the norm, the update.
    float* g = grads_.data();
    if (zero_ >= 2)
        reduce_scatter_grads(g);
    else if (dp_ > 1)
        replica_.dp->all_reduce(g, model_->grad_layout().total, replica_.algo);
    exchange_tied_grads(g);
    if (hooks_.grads) hooks_.grads(step_ + 1, g);
    const bool probing = probes_ != nullptr;
    if (probing) {  // ZeRO-2/3: only this rank's shard of g is complete
        const i64 lo = zero_ >= 2 ? opt_->lo() : 0;
        model_->probe_params(*probes_, step_ + 1, "grad", "param", g + lo, lo,
                             zero_ >= 2 ? opt_->hi() : model_->table().total);
    }
    const float norm = grad_norm(g);

    StepMetrics m;
    m.step = step_ + 1;
    double loss = 0;
    if (last_stage()) {
        gather_losses(all_losses_, losses_, 1);
        const float mean = canonical_sum(all_losses_.data(), N, nx_.block) / static_cast<float>(N);
        loss = mean;
    }
    comm_.broadcast(&loss, 1, pp_ - 1);
    m.loss = loss;
    m.grad_norm = norm;
    m.lr = lr_at(tc, step_);
    opt_->step(*model_, g, norm, static_cast<float>(m.lr), static_cast<int>(step_ + 1), tc);
    if (zero_ == 1 || zero_ == 2) all_gather_params();  // each replica updated its shard
    if (zero_ == 3) release_params();                   // free after use
    if (zero_ >= 2) {
        // Between steps a replica holds only its shard of the gradient; the microbatch partials
        // and the rest of the buffer go back to the system until the next step's backward.
        grads_.decommit(0, opt_->lo());
        grads_.decommit(opt_->hi(), grads_.size());
        for (TreeAccumulator& a : acc_) a.release();
    }
    step_++;
    if (hooks_.updated) hooks_.updated(step_);
    if (probing) {  // ZeRO-3 holds only its shard of the weights; ZeRO-1..3 of the moments
        const i64 lo = zero_ == 3 ? opt_->lo() : 0;
        model_->probe_params(*probes_, step_, "optim", "param", model_->params() + lo, lo,
                             zero_ == 3 ? opt_->hi() : model_->table().total);
        model_->probe_params(*probes_, step_, "optim", "adam.m", opt_->m(), opt_->lo(), opt_->hi());
        model_->probe_params(*probes_, step_, "optim", "adam.v", opt_->v(), opt_->lo(), opt_->hi());
    }

    const double secs = seconds_since(t0);
    m.comm_bytes = bytes_sent(comm_) - sent0;
    m.step_ms = secs * 1e3;
    m.tokens_per_s = static_cast<double>(N) / secs;
    if ((tc.eval_every > 0 && step_ % tc.eval_every == 0) ||
        (step_ == tc.steps && tc.eval_every > 0)) {
        if (zero_ == 3) all_gather_params();
        m.val_loss = evaluate();
        if (zero_ == 3) release_params();
    }
    history_.push_back(m);
    return m;
}

// Forward only, microbatch after microbatch, each through the virtual stages in order; the
// last stage keeps the losses in token order (batch j, then sequence), as Job::evaluate. A
// message's tag names its receiving stage, so each channel carries one stage's messages in
// (batch, microbatch) order on both sides.
double PipelineJob::evaluate() {
    const TrainConfig& tc = cfg_.train;
    const i64 per_rank = local_B_ * T_, mb_tokens = micro_B_ * T_;
    std::vector<float> local(last_stage() ? static_cast<size_t>(tc.val_batches * per_rank) : 0);
    std::vector<int> win(static_cast<size_t>(micro_B_ * (T_ + 1)));
    std::vector<int> tok(static_cast<size_t>(mb_tokens)), tgt(static_cast<size_t>(mb_tokens));
    for (i64 j = 0; j < tc.val_batches; j++) {
        for (int k = 0; k < M_; k++) {
            source_->sample(win.data(), T_, Split::val, j, dp_rank_ * local_B_ + k * micro_B_,
                            micro_B_);
            split_windows(tok.data(), tgt.data(), win.data(), micro_B_, T_);
            for (int c = 0; c < v_; c++) {
                const int stage = stage_of(rank_, c, pp_);
                Slot* s = acquire(c);
                if (stage > 0)
                    comm_.recv(s->acts.input() + msg_lo_, msg_floats_,
                               rank_of_stage(stage - 1, pp_), kEvalTagBase + stage);
                model_->forward(s->acts, c, tok.data(), tgt.data());
                if (stage < S_ - 1)
                    s->pending = comm_.send_async(
                        static_cast<const float*>(s->acts.output() + msg_lo_), msg_floats_,
                        rank_of_stage(stage + 1, pp_), kEvalTagBase + stage + 1);
                else
                    std::memcpy(local.data() + j * per_rank + k * mb_tokens, s->acts.losses(),
                                static_cast<size_t>(mb_tokens) * sizeof(float));
                release(c, s);
            }
        }
    }
    wait_sends();
    double val = 0;
    if (last_stage()) {
        std::vector<float> all;
        gather_losses(all, local, tc.val_batches);
        const i64 n = static_cast<i64>(all.size());
        val = canonical_sum(all.data(), n, nx_.block) / static_cast<double>(n);
    }
    comm_.broadcast(&val, 1, pp_ - 1);
    return val;
}

// Every replica's per-token losses of `batches` batches (each replica's `local` holds its
// local_B·T per batch), in token order: batch j, then replica (dp-rank-major), then sequence.
// Collective over the dp group (the last stages).
void PipelineJob::gather_losses(std::vector<float>& all, const std::vector<float>& local,
                                i64 batches) {
    const i64 per_rank = local_B_ * T_;
    all.resize(static_cast<size_t>(batches * per_rank * dp_));
    if (dp_ == 1) {
        std::copy(local.begin(), local.end(), all.begin());
        return;
    }
    std::vector<float> gathered(all.size());
    replica_.dp->all_gather(gathered.data(), local.data(), batches * per_rank);
    for (int r = 0; r < dp_; r++)
        for (i64 j = 0; j < batches; j++)
            std::memcpy(all.data() + (j * dp_ + r) * per_rank,
                        gathered.data() + (r * batches + j) * per_rank,
                        static_cast<size_t>(per_rank) * sizeof(float));
}

void PipelineJob::gather_full(std::vector<float>* params, std::vector<float>* m,
                              std::vector<float>* v) {
    const ParamTable full = ParamTable::build(cfg_.model);
    const TpLayers* tpl = tp_layers(*model_);
    // tables[t][r]: the table of pp rank r's stage on tp rank t (local shapes).
    std::vector<std::vector<ParamTable>> tables(static_cast<size_t>(tp_));
    std::vector<i64> tp_counts(static_cast<size_t>(tp_), 0);
    for (int t = 0; t < tp_; t++)
        for (const ModelPart& p : parts_) {
            tables[static_cast<size_t>(t)].push_back(
                tpl ? ParamTable::build(cfg_.model, p,
                                        TpDims{tp_, tpl->shards().vocabulary.local(t)})
                    : ParamTable::build(cfg_.model, p));
            tp_counts[static_cast<size_t>(t)] += tables[static_cast<size_t>(t)].back().total;
        }
    std::vector<i64> pp_counts;
    for (const ParamTable& t : tables[static_cast<size_t>(tp_rank_)]) pp_counts.push_back(t.total);
    i64 sum = 0;
    for (i64 c : tp_counts) sum += c;
    std::vector<float> stages(static_cast<size_t>(tp_counts[static_cast<size_t>(tp_rank_)]));
    std::vector<float> gathered(static_cast<size_t>(sum));
    // Every stage's arrays over pp (this tp rank's shards), then every tp rank's over tp; each
    // element then goes to its logical place (identity without tp).
    auto assemble = [&](std::vector<float>* out, const float* local, const char* what) {
        if (out == nullptr) return;
        comm_.all_gather_v(stages.data(), local, std::span<const i64>(pp_counts));
        if (tpl)
            replica_.tp->all_gather_v(gathered.data(), static_cast<const float*>(stages.data()),
                                      std::span<const i64>(tp_counts));
        else
            gathered = stages;
        out->assign(static_cast<size_t>(full.total), 0.0f);
        std::vector<char> seen(full.entries.size() * static_cast<size_t>(tp_), 0);
        i64 base = 0;
        for (int t = 0; t < tp_; t++) {
            for (int r = 0; r < pp_; r++) {
                const ParamTable& table = tables[static_cast<size_t>(t)][static_cast<size_t>(r)];
                for (const TableEntry& e : table.entries) {
                    const float* src = gathered.data() + base + e.offset;
                    float* dst = out->data() + full.entries[static_cast<size_t>(e.id)].offset;
                    const size_t at = static_cast<size_t>(e.id) * static_cast<size_t>(tp_) +
                                      static_cast<size_t>(t);
                    std::vector<i64> idx;
                    if (tpl) idx = logical_indices(*tpl, e, cfg_.model, t);
                    bool same = true;
                    for (i64 j = 0; j < e.numel(); j++) {
                        float& d = dst[tpl ? idx[static_cast<size_t>(j)] : j];
                        if (seen[at] && std::memcmp(&d, src + j, sizeof(float)) != 0) same = false;
                        d = src[j];
                    }
                    if (!same)
                        throw InternalError(std::string("pipeline: the stages' copies of ") +
                                            e.name + " (" + what + ") differ");
                    seen[at] = 1;
                }
                base += table.total;
            }
        }
    };
    // ZeRO: the stage's whole moments from the replicas' shards first.
    const i64 stage_total = model_->table().total;
    auto stage_moments = [&](std::vector<float>& whole, const float* shard) -> const float* {
        if (shard_edges_.empty()) return shard;
        const std::vector<i64> shard_counts = counts_of(shard_edges_);
        whole.resize(static_cast<size_t>(stage_total));
        replica_.dp->all_gather_v(whole.data(), shard, std::span<const i64>(shard_counts));
        return whole.data();
    };
    std::vector<float> whole_m, whole_v;
    const float* stage_m = m ? stage_moments(whole_m, opt_->m()) : nullptr;
    const float* stage_v = v ? stage_moments(whole_v, opt_->v()) : nullptr;
    const bool gather = params && zero_ == 3;  // between steps ZeRO-3 holds only its shard
    if (gather) all_gather_params();
    assemble(params, model_->params(), "weights");
    if (gather) release_params();
    assemble(m, stage_m, "Adam m");
    assemble(v, stage_v, "Adam v");
}

// ---- per-rank checkpoints (core/parallel/state_slices.h) ------------------------------------

RankState PipelineJob::rank_state() {
    RankState s = replica_state(*model_, model_->params(), *opt_, dp_, dp_rank_, zero_ == 3);
    // The stage that owns a tensor writes it (wte: the first); over tp, a sharded tensor every
    // tp rank, a replicated one tp rank (id mod tp).
    const ParamTable& t = model_->table();
    const TpLayers* tpl = tp_layers(*model_);
    for (size_t i = 0; i < t.entries.size(); i++) {
        const TableEntry& e = t.entries[i];
        const bool mine_over_tp = (tpl && tpl->sharded(e)) || e.id % tp_ == tp_rank_;
        s.writes_entry[i] = owner_[static_cast<size_t>(e.id)] == rank_ && mine_over_tp;
    }
    return s;
}

void PipelineJob::restore_local(const CheckpointReader& file,
                                const std::vector<StepMetrics>& history) {
    read_rank_state(file, rank_state());
    if (zero_ == 3) release_params();
    history_ = history;
    step_ = static_cast<i64>(history.size());
}

void PipelineJob::unshard() {
    if (shard_edges_.empty()) return;
    if (zero_ == 3) all_gather_params();  // between steps ZeRO-3 holds only its shard
    const std::vector<i64> counts = counts_of(shard_edges_);
    auto whole = std::make_unique<AdamW>(*model_);
    replica_.dp->all_gather_v(whole->m(), static_cast<const float*>(opt_->m()),
                              std::span<const i64>(counts));
    replica_.dp->all_gather_v(whole->v(), static_cast<const float*>(opt_->v()),
                              std::span<const i64>(counts));
    opt_ = std::move(whole);
    shard_edges_.clear();
    zero_ = 0;
}

void PipelineJob::run(const std::function<void(const StepMetrics&)>& on_step) {
    while (step_ < std::min(cfg_.train.steps, stop_after_)) {
        const StepMetrics m = step();
        if (on_step) on_step(m);
    }
    // ZeRO-3 keeps only a shard between steps: the finished run holds the whole stage.
    if (zero_ == 3) all_gather_params();
    if (!cfg_.output.export_llmc.empty()) {
        std::vector<float> params;
        gather_full(&params, nullptr, nullptr);
        if (rank_ == 0 && dp_rank_ == 0 && tp_rank_ == 0) {  // one writer
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

void PipelineJob::snapshot(LocalSnapshot& into) const {
    if (zero_ == 3)
        throw InternalError(
            "PipelineJob::snapshot under ZeRO-3: between steps this rank holds a "
            "shard of its stage's weights, not a replica of them");
    take_snapshot(*model_, *opt_, step_, history_, into);
}

void PipelineJob::rewind(const LocalSnapshot& s) {
    put_snapshot(s, *model_, *opt_);
    step_ = s.step;
    history_ = s.history;
}

// ---- run_pipeline ----------------------------------------------------------------------------

void run_pipeline_rank(const Config& cfg, comm::Communicator& world,
                       const std::vector<Observer*>& observers,
                       const std::function<void(PipelineJob&)>& inspect,
                       const std::function<void(PipelineJob&)>& each_step,
                       const std::function<void(PipelineJob&)>& setup) {
    const Layout l = make_layout(cfg);
    check_pipeline_layout(l, cfg.source_name);
    const Mesh mesh(l);
    // 1. Groups: a pp group per (replica, tp rank) (pipeline order: the same tp rank of
    //    every stage), a dp group per (stage, tp rank), a tp group per (stage, replica).
    const int r = world.rank();
    const Coord at = mesh.coord_of(r);
    const std::unique_ptr<comm::Communicator> pp =
        world.split(mesh.group_color(MeshDim::pp, r), at.pp, dim_name(MeshDim::pp));
    const std::unique_ptr<comm::Communicator> dp =
        world.split(mesh.group_color(MeshDim::dp, r), at.dp, dim_name(MeshDim::dp));
    const std::unique_ptr<comm::Communicator> tp =
        world.split(mesh.group_color(MeshDim::tp, r), at.tp, dim_name(MeshDim::tp));
    // 2. Each replica's pipeline; a stage is cut over its tp group, and reduces its
    //    gradients over dp.
    PipelineJob job(cfg, *pp,
                    ReplicaContext{l.dp > 1 ? dp.get() : nullptr, l.zero, l.algo,
                                   l.tp > 1 ? tp.get() : nullptr});
    // 3. Checkpoints and faults, as run_rank's (rank_guards.h).
    RankGuards guards(cfg, world, job);
    if (setup) setup(job);
    const bool report = r == 0;
    if (report)
        for (Observer* o : observers) o->on_start(job);
    job.run([&](const StepMetrics& m) {
        if (report)
            for (Observer* o : observers) o->on_step(job, m);
        if (guards.after_step(job) && each_step) each_step(job);
    });
    if (report)
        for (Observer* o : observers) o->on_end(job);
    if (inspect) {
        job.unshard();  // collective: before any rank's turn at inspect
        inspect(job);
    }
}

void run_pipeline(const Config& cfg, const std::vector<Observer*>& observers,
                  const std::function<void(PipelineJob&)>& inspect,
                  const std::function<void(PipelineJob&)>& each_step,
                  const std::function<void(PipelineJob&)>& setup) {
    const Layout l = make_layout(cfg);  // validates before any thread starts
    check_pipeline_layout(l, cfg.source_name);
    const int n = l.world_size();
    // Ranks are threads; the cores are shared out so that the ranks together use them once.
    Config rank_cfg = cfg;
    rank_cfg.train.threads = threads_per_rank(cfg, n);

    std::mutex inspect_mutex;
    comm::run_ranks(n, l.timeout_s, [&](comm::Communicator& world) {
        run_pipeline_rank(
            rank_cfg, world, observers,
            [&](PipelineJob& job) {
                if (!inspect) return;
                std::lock_guard<std::mutex> lock(inspect_mutex);
                inspect(job);
            },
            each_step, setup);
    });
}

}  // namespace px
