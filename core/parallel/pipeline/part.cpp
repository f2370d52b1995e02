// Pipeline parallelism's part of a rank's trainer (part.h): the schedule's actions with their
// activation sets and messages, validation forwards, the tied exchange, the stages' values.
#include "core/parallel/pipeline/part.h"

#include "core/base/error.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

namespace px {

namespace {

// Tags outside message_tag's range [0, 2·microbatches·S) of a step's messages.
constexpr int kTiedTag = 1 << 29;      // the two parts of dwte, first <-> last stage
constexpr int kEvalTagBase = 1 << 28;  // validation forwards: + the receiving virtual stage

// Activation sets a chunk keeps at once: the trivial schedule one, GPipe every microbatch,
// 1F1B at most the pipeline's depth (interleaved: about twice that, over its chunks).
// (ZB-H1: pp on every rank, each until its W. ZBV: each chunk keeps the sets of its own peak,
// from the schedule's simulation, each half of a rank's layers.)
double sets_in_flight(const MemorySizes& s) {
    if (s.pp == 1) return 1;
    if (s.schedule == "gpipe") return s.M;
    if (s.schedule == "interleaved") return std::min(s.M, 2 * s.pp);
    // zbv: its list scheduler holds at most 2·pp chunk sets; past a few thousand microbatches
    // the simulation would be long, and that bound (plus a set per chunk in flight) is the count.
    if (s.schedule == "zbv" && s.M * s.pp > 65536) return std::min(s.M, s.pp) + 1;
    if (s.schedule == "zbv") {  // cached: the planner asks for many layouts of one shape
        static std::mutex mu;
        static std::map<std::pair<int, int>, double> known;
        const std::pair<int, int> key{static_cast<int>(s.pp), static_cast<int>(s.M)};
        std::lock_guard<std::mutex> lock(mu);
        if (const auto it = known.find(key); it != known.end()) return it->second;
        const SimResult r = check_schedule(zbv(key.first, key.second));
        double most = 0;
        for (const std::vector<int>& chunks : r.peak_chunk_in_flight) {
            double sets = 0;
            for (const int c : chunks) sets += c + 1.0;  // + a set whose message is in flight
            most = std::max(most, sets / 2);
        }
        return known[key] = most;
    }
    return std::min(s.M, s.pp);
}

// What B keeps for W of one microbatch on `layers` layers (zero-bubble schedules): the output
// gradient of each linear and norm whose weight gradient waits (column-parallel ones cut over tp),
// and under recompute the block internals those read, which the next block's recompute refills.
double deferred_bytes(const MemorySizes& s, double layers, double chunks, double heads) {
    const double rows = s.micro_B * s.T;
    const double per_token = s.model.llama()
                                 ? 4 * s.C + (s.CA + 2 * s.KV + 2 * s.F) / s.tp  // o, down; q k v, gate up
                                 : 4 * s.C + (3 * s.C + s.F) / s.tp;  // proj, fc_proj, ln1, ln2; qkv, fc
    double bytes = rows * layers * per_token * s.act_bytes + rows * heads * s.C * s.act_bytes;
    if (s.recompute) {  // the internals of every layer, not one slot
        MemorySizes kept = s;
        kept.recompute = false;
        bytes += activation_set_bytes(kept, layers, chunks, heads) -
                 activation_set_bytes(s, layers, chunks, heads);
    }
    return bytes;
}

}  // namespace

void PipelineParallel::estimate(const MemorySizes& s, const StageParams& /*p*/,
                                const MemoryGroup& g, MemoryTerms& t) {
    t.activations += sets_in_flight(s) * activation_set_bytes(s, g.layers, g.chunks, g.heads);
    if (s.pp > 1 && (s.schedule == "zb-h1" || s.schedule == "zbv"))  // Bs awaiting their W
        t.activations += std::min(s.M, s.pp) * deferred_bytes(s, g.layers, g.chunks, g.heads);
    t.bookkeeping += g.ranks * 6 * s.M * s.S * 32;  // the schedule's actions
}

PipelineParallel::PipelineParallel(const RankSetup& rank)
    : rank_(rank), schedule_(rank.mesh.schedule()), placement_(schedule_.placement()) {
    const Layout& l = rank.layout;
    // Who owns which tensor of the whole model: a layer's stage's rank; wte and wpe the first
    // stage (which holds wte's complete gradient as well as the last), ln_f the last.
    for (int r = 0; r < l.pp; r++) parts_.push_back(px::stage_part(rank.mesh, r, rank.cfg.model));
    owner_.assign(static_cast<size_t>(ParamTable::num_tensors(rank.cfg.model)), -1);
    for (int r = 0; r < l.pp; r++) {
        const ParamTable t = ParamTable::build(rank.cfg.model, parts_[static_cast<size_t>(r)]);
        for (const TableEntry& e : t.entries)
            if (owner_[static_cast<size_t>(e.id)] < 0) owner_[static_cast<size_t>(e.id)] = r;
    }
}

PipelineParallel::~PipelineParallel() = default;

std::vector<char> PipelineParallel::owned_entries(const GPT& model) const {
    std::vector<char> owned(model.table().entries.size());
    for (size_t i = 0; i < owned.size(); i++)
        owned[i] = owner(model.table().entries[i].id) == rank_.at.pp;
    return owned;
}

// Messages: the whole (micro_B,T,C) hidden state, or under sequence parallelism this tp rank's
// token rows of it (all that a stage's first block reads and its last block writes; the same
// tp rank of the next stage holds the same rows). Then every chunk's first activation set, its
// pages mapped: not inside the first step.
void PipelineParallel::attach(GPT& model) {
    model_ = &model;
    const i64 C = rank_.cfg.model.hidden, rows = rank_.micro_B * rank_.Tl;
    msg_n_ = rows * C;
    if (const ParallelLayers* pl = model.parallel_layers(); pl && pl->sequence_parallel()) {
        const TokenRows r = pl->token_rows(rows);
        msg_lo_ = r.lo * C;
        msg_n_ = (r.hi - r.lo) * C;
    }
    const size_t chunks = static_cast<size_t>(model.num_chunks());
    slots_.resize(chunks);
    free_.resize(chunks);
    live_.assign(chunks,
                 std::vector<Slot*>(static_cast<size_t>(rank_.layout.microbatches), nullptr));
    for (int c = 0; c < static_cast<int>(chunks); c++) release(c, acquire(c));
}

bool PipelineParallel::is_last_virtual(int chunk) const {
    return stage_of(rank_.at.pp, chunk, rank_.layout.pp, placement_) ==
           rank_.layout.num_stages() - 1;
}

// ---- activation sets -------------------------------------------------------------------------

// A free set of activations whose last outgoing message has landed; a new one if none has.
// Never waiting on a send here keeps sends asynchronous, as the schedule's deadlock argument
// requires.
PipelineParallel::Slot* PipelineParallel::acquire(int chunk) {
    auto& pool = free_[static_cast<size_t>(chunk)];
    for (size_t i = 0; i < pool.size(); i++) {
        Slot* s = pool[i];
        if (!s->pending.test()) continue;
        s->pending.wait();  // completed: returns at once (and rethrows a failure)
        pool.erase(pool.begin() + static_cast<std::ptrdiff_t>(i));
        return s;
    }
    auto slot = std::make_unique<Slot>();
    slot->acts = model_->make_activations(chunk, rank_.micro_B, rank_.Tl,
                                          rank_.layout.recompute == Recompute::full);
    slots_[static_cast<size_t>(chunk)].push_back(std::move(slot));
    return slots_[static_cast<size_t>(chunk)].back().get();
}

void PipelineParallel::release(int chunk, Slot* s) {
    free_[static_cast<size_t>(chunk)].push_back(s);
}

void PipelineParallel::wait_sends() {
    for (auto& chunk : slots_)
        for (auto& s : chunk) s->pending.wait();
}

int PipelineParallel::activation_sets(int chunk) const {
    return static_cast<int>(slots_[static_cast<size_t>(chunk)].size());
}

i64 PipelineParallel::activation_bytes() const {
    i64 n = 0;
    for (const auto& chunk : slots_)
        for (const auto& s : chunk) n += s->acts.bytes() + static_cast<i64>(s->deferred.bytes());
    return n;
}

const Activations* PipelineParallel::first_activations() const {
    return slots_.empty() || slots_[0].empty() ? nullptr : &slots_[0][0]->acts;
}

// The set of microbatch m on virtual stage k when k is this rank's and m is in flight there.
PipelineParallel::Slot* PipelineParallel::local_stage(int k, int m) const {
    const int pp = rank_.layout.pp;
    if (rank_of_stage(k, pp, placement_) != rank_.at.pp) return nullptr;
    return live_[static_cast<size_t>(chunk_of_stage(k, pp))][static_cast<size_t>(m)];
}

// What a message between the two stages would carry, copied within the rank.
void PipelineParallel::copy_message(const Tensor& from, const Tensor& to) const {
    const Tensor src = message(from), dst = message(to);
    PX_ASSERT(src.dtype == dst.dtype && src.numel() == dst.numel(),
              "a local stage's message of another shape");
    std::memcpy(dst.data, src.data, static_cast<size_t>(bytes_of(src.dtype, src.numel())));
}

// ---- the step --------------------------------------------------------------------------------

// This rank's list, in order (schedule.h gives each action's meaning).
void PipelineParallel::run(const StageWork& work) {
    comm::Communicator* pp = rank_.groups.pp;
    const int pp_rank = rank_.at.pp;
    const bool split = schedule_.splits();
    for (const Action& a : schedule_.ranks[static_cast<size_t>(pp_rank)]) {
        const int c = a.chunk, m = a.microbatch;
        Slot*& live = live_[static_cast<size_t>(c)][static_cast<size_t>(m)];
        switch (a.kind) {
            case Action::recv_act:
                PX_ASSERT(live == nullptr, "recv_act for a microbatch already in flight");
                live = acquire(c);
                recv_message(*pp, message(live->acts.input()), a.peer,
                             message_tag(schedule_, pp_rank, a));
                break;
            case Action::forward:
                if (live == nullptr) {
                    const int k = stage_of(pp_rank, c, rank_.layout.pp, placement_);
                    live = acquire(c);
                    if (k > 0) {  // the previous stage is this rank's (zbv's turn of the V)
                        const Slot* prev = local_stage(k - 1, m);
                        PX_ASSERT(prev != nullptr, "forward before its input arrived");
                        copy_message(prev->acts.output(), live->acts.input());
                    }
                }
                work.forward(a, live->acts, is_last_virtual(c));
                break;
            case Action::send_act:
                live->pending = send_message(*pp, message(live->acts.output()), a.peer,
                                             message_tag(schedule_, pp_rank, a));
                break;
            case Action::recv_grad:
                // Into dresidual, which the pending send of the output does not read.
                recv_message(*pp, message(live->acts.dresidual()), a.peer,
                             message_tag(schedule_, pp_rank, a));
                break;
            case Action::backward:
            case Action::backward_input:
                // The output's send has landed (the gradient that came back needed it): complete
                // it before a recomputing backward writes the output again.
                live->pending.wait();
                work.backward(a, live->acts, split ? &live->deferred : nullptr);
                if (const int k = stage_of(pp_rank, c, rank_.layout.pp, placement_); k > 0) {
                    // the previous stage is this rank's: its output gradient, as recv_grad
                    // would have delivered it
                    if (Slot* prev = local_stage(k - 1, m))
                        copy_message(live->acts.dresidual(), prev->acts.dresidual());
                }
                if (!split && stage_of(pp_rank, c, rank_.layout.pp, placement_) == 0) {
                    release(c, live);  // nothing to send back
                    live = nullptr;
                }
                break;
            case Action::send_grad:
                live->pending = send_message(*pp, message(live->acts.dresidual()), a.peer,
                                             message_tag(schedule_, pp_rank, a));
                if (!split) {  // under a split schedule W still reads the set
                    release(c, live);
                    live = nullptr;
                }
                break;
            case Action::backward_weight:
                work.weight(a, live->deferred);
                release(c, live);
                live = nullptr;
                break;
        }
    }
    wait_sends();
    for (const auto& chunk : live_)
        for (const Slot* s : chunk)
            PX_ASSERT(s == nullptr, "the schedule left a microbatch in flight");
}

// A message's tag names its receiving stage, so each channel carries one stage's messages in
// (batch, microbatch) order on both sides.
void PipelineParallel::forward_only(const int* tokens, const int* targets, float* losses) {
    const int pp = rank_.layout.pp, S = rank_.layout.num_stages();
    Slot* prev = nullptr;  // the previous chunk's set, when its stage precedes this one's
    for (int c = 0; c < model_->num_chunks(); c++) {
        const int stage = stage_of(rank_.at.pp, c, pp, placement_);
        Slot* s = acquire(c);
        if (stage > 0 && rank_of_stage(stage - 1, pp, placement_) == rank_.at.pp) {
            PX_ASSERT(prev != nullptr, "validation: a local stage's input before its forward");
            copy_message(prev->acts.output(), s->acts.input());
        } else if (stage > 0) {
            recv_message(*rank_.groups.pp, message(s->acts.input()),
                         rank_of_stage(stage - 1, pp, placement_), kEvalTagBase + stage);
        }
        if (prev) release(c - 1, prev);
        prev = nullptr;
        model_->forward(s->acts, c, tokens, targets);
        const bool next_local =
            stage < S - 1 && rank_of_stage(stage + 1, pp, placement_) == rank_.at.pp;
        if (stage < S - 1 && !next_local)
            s->pending = send_message(*rank_.groups.pp, message(s->acts.output()),
                                      rank_of_stage(stage + 1, pp, placement_), kEvalTagBase + stage + 1);
        else if (stage == S - 1)
            std::memcpy(losses, s->acts.losses().f32(),
                        static_cast<size_t>(rank_.micro_B * rank_.Tl) * sizeof(float));
        if (next_local)
            prev = s;  // read by the next chunk
        else
            release(c, s);
    }
}

double PipelineParallel::from_last_stage(double value) const {
    if (rank_.groups.pp) rank_.groups.pp->broadcast(&value, 1, rank_.layout.last_stage_rank());
    return value;
}

std::vector<float> PipelineParallel::by_tensor(const GPT& model,
                                               const std::vector<float>& entry_sums) const {
    const i64 n = static_cast<i64>(owner_.size());
    std::vector<float> mine(static_cast<size_t>(n), 0.0f);
    const std::vector<char> owned = owned_entries(model);
    for (size_t i = 0; i < owned.size(); i++)
        if (owned[i]) mine[static_cast<size_t>(model.table().entries[i].id)] = entry_sums[i];
    if (rank_.layout.pp == 1) return mine;
    // The owners' values are gathered (copied, not added).
    std::vector<float> all(static_cast<size_t>(n * rank_.layout.pp)), per_tensor(mine.size());
    rank_.groups.pp->all_gather(all.data(), mine.data(), n);
    for (i64 id = 0; id < n; id++)
        per_tensor[static_cast<size_t>(id)] =
            all[static_cast<size_t>(owner_[static_cast<size_t>(id)] * n + id)];
    return per_tensor;
}

// dwte = dwte(embedding) + dwte(LM head). On one stage, GPT::combine_tied_grads. Across stages
// the first sends its embedding part and receives the head's into its head region; the last
// the other way round, into its wte slot. Both then add in the same order.
void PipelineParallel::reduce_grads(StepGrads& grads) {
    const GPT& m = *model_;
    if (grads.tied_combined || !m.part().head_region()) return;  // untied: nothing to add
    float* g = grads.g;
    if (rank_.layout.pp > 1 && rank_.layout.last_stage_rank() != 0) {
        // This tp rank's rows of wte: the same rows on the first and the last stage. (zbv's V
        // puts both on rank 0: it adds them there, as the single device does.)
        const TableEntry& wte = m.table().entries[static_cast<size_t>(m.table().wte)];
        float* emb = g + wte.offset;
        float* head = g + m.grad_layout().head_offset;
        const bool first = rank_.first_stage();
        const int peer = first ? rank_.layout.last_stage_rank() : 0;
        comm::Handle h = rank_.groups.pp->send_async(static_cast<const float*>(first ? emb : head),
                                                     wte.numel(), peer, kTiedTag);
        rank_.groups.pp->recv(first ? head : emb, wte.numel(), peer, kTiedTag);
        h.wait();
    }
    m.combine_tied_grads(g);
}

}  // namespace px
