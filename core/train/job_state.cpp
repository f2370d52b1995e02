// The state a Job hands out and takes back: snapshots for re-running steps, the pieces of a
// checkpoint each rank writes and reads, the logical state gathered from every rank, ZeRO's
// shards gathered back, and the rank's memory.
#include "core/train/job.h"

#include "core/parallel/context_parallel.h"
#include "core/parallel/expert_parallel.h"

#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/io/state.h"
#include "core/parallel/pipeline.h"
#include "core/parallel/state_slices.h"
#include "core/parallel/tp_model.h"
#include "core/parallel/zero.h"

#include <algorithm>
#include <cstring>
#include <span>

namespace px {

void Job::snapshot(LocalSnapshot& s) const {
    // Between steps ZeRO-3 holds only its shard of the weights.
    const i64 lo = zero_ == 3 ? shards_->lo() : 0;
    const i64 hi = zero_ == 3 ? shards_->hi() : model_->table().total;
    s.params.assign(model_->params() + lo, model_->params() + hi);
    s.m.assign(opt_->m(), opt_->m() + opt_->size());
    s.v.assign(opt_->v(), opt_->v() + opt_->size());
    s.checked_w.clear();
    s.checked_m.clear();
    s.checked_v.clear();
    if (checked_opt_) {
        s.checked_w = checked_w_;
        s.checked_m.assign(checked_opt_->m(), checked_opt_->m() + checked_opt_->size());
        s.checked_v.assign(checked_opt_->v(), checked_opt_->v() + checked_opt_->size());
    }
    s.step = step_;
    s.history = history_;
    s.scaler = scaler_.state();
    s.fp8.clear();
    if (fp8_) s.fp8 = fp8_->state();
}

void Job::rewind(const LocalSnapshot& s) {
    const i64 lo = zero_ == 3 ? shards_->lo() : 0;
    const i64 hi = zero_ == 3 ? shards_->hi() : model_->table().total;
    PX_ASSERT(s.step >= 0 && static_cast<i64>(s.params.size()) == hi - lo &&
                  static_cast<i64>(s.m.size()) == opt_->size() && s.m.size() == s.v.size() &&
                  s.checked_w.size() == checked_w_.size(),
              "a snapshot of another model or optimizer shard");
    std::copy(s.params.begin(), s.params.end(), model_->params() + lo);
    std::copy(s.m.begin(), s.m.end(), opt_->m());
    std::copy(s.v.begin(), s.v.end(), opt_->v());
    if (checked_opt_) {
        checked_w_ = s.checked_w;
        std::copy(s.checked_m.begin(), s.checked_m.end(), checked_opt_->m());
        std::copy(s.checked_v.begin(), s.checked_v.end(), checked_opt_->v());
    }
    step_ = s.step;
    history_ = s.history;
    scaler_.restore(s.scaler);
    if (fp8_) fp8_->restore(s.fp8);
}

void Job::probe_update() {
    // ZeRO-3 holds only its shard of the weights between steps; ZeRO-1..3 only theirs of the
    // moments.
    const i64 lo = zero_ == 3 ? shards_->lo() : 0;
    model_->probe_params(*probes_, step_, "optim", "param", model_->params() + lo, lo,
                         zero_ == 3 ? shards_->hi() : model_->table().total);
    model_->probe_params(*probes_, step_, "optim", "adam.m", opt_->m(), opt_->lo(), opt_->hi());
    model_->probe_params(*probes_, step_, "optim", "adam.v", opt_->v(), opt_->lo(), opt_->hi());
    // The scaling state the next step starts from, whole on every rank.
    auto whole = [&](const char* op, const char* tensor, const float* data,
                     std::vector<i64> shape) {
        const ProbeKey key{step_, "optim", -1, op, tensor};
        if (!probes_->wants(key)) return;
        i64 n = 1;
        for (i64 d : shape) n *= d;
        probes_->capture(key, data, flat_shard(shape, 0, n));
    };
    if (fp8_ && fp8_->delayed() && fp8_->gemms() > 0) {
        const i64 roles = Fp8Scaling::kRoles, slots = fp8_->gemms() * roles;
        whole("fp8", "scale", fp8_->scales().data(), {fp8_->gemms(), roles});
        whole("fp8", "amax_history", fp8_->histories().data(), {slots, fp8_->history_len()});
    }
    if (scaler_.dynamic()) {  // the growth tracker stays below the growth interval: exact
        const float st[2] = {scaler_.state().scale,
                             static_cast<float>(scaler_.state().growth_tracker)};
        whole("loss_scaler", "state", st, {2});
    }
}

void Job::check_updates() {
    if (!shards_ || checked_opt_) return;
    shards_->check_next();
    if (units_) units_->hold_checked();
    const int c = shards_->checked();
    const i64 lo = shards_->lo(c), hi = shards_->hi(c);
    checked_opt_ = std::make_unique<AdamW>(*model_, lo, hi);
    // The owner's state now (zeros, or what a resume read): its shard, gathered once.
    std::vector<float> whole(static_cast<size_t>(model_->table().total));
    auto take = [&](const float* mine, float* out) {
        shards_->all_gather_shards(*zero_group(), whole.data(), mine);
        std::copy(whole.begin() + lo, whole.begin() + hi, out);
    };
    checked_w_.resize(static_cast<size_t>(hi - lo));
    take(model_->params() + shards_->lo(), checked_w_.data());
    take(opt_->m(), checked_opt_->m());
    take(opt_->v(), checked_opt_->v());
}

ShardState Job::own_shard() const {
    if (!shards_) return {};
    return {dp_rank_, opt_->lo(), opt_->hi(), model_->params() + opt_->lo(), opt_->m(), opt_->v()};
}

ShardState Job::checked_shard() const {
    if (!checked_opt_) return {};
    return {shards_->checked(), checked_opt_->lo(), checked_opt_->hi(), checked_w_.data(),
            checked_opt_->m(), checked_opt_->v()};
}

void Job::gather_full(std::vector<float>* params, std::vector<float>* m, std::vector<float>* v) {
    const ParamTable full = ParamTable::build(cfg_.model);
    const auto* tpl = dynamic_cast<const TpLayers*>(model_->parallel_layers());
    const int pp = layout_.pp, tp = layout_.tp;
    // tables[t][r]: the table of pp rank r's stage on tp rank t (local shapes).
    std::vector<std::vector<ParamTable>> tables(static_cast<size_t>(tp));
    std::vector<i64> tp_counts(static_cast<size_t>(tp), 0);
    for (int t = 0; t < tp; t++)
        for (const ModelPart& stage : parts_) {
            // under ep, this rank's experts of every stage (its pp group shares its ep index)
            const ModelPart p = expert_part(stage, cfg_.model, layout_.ep, ep_rank_);
            tables[static_cast<size_t>(t)].push_back(
                tpl ? ParamTable::build(cfg_.model, p,
                                        TpDims{tp, tpl->shards().vocabulary.local(t)})
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
        if (groups_.pp)
            groups_.pp->all_gather_v(stages.data(), local, std::span<const i64>(pp_counts));
        else
            std::copy(local, local + stages.size(), stages.begin());
        if (tpl)
            groups_.tp->all_gather_v(gathered.data(), static_cast<const float*>(stages.data()),
                                     std::span<const i64>(tp_counts));
        else
            gathered = stages;
        out->assign(static_cast<size_t>(full.total), 0.0f);
        std::vector<char> seen(full.entries.size() * static_cast<size_t>(tp), 0);
        i64 base = 0;
        for (int t = 0; t < tp; t++) {
            for (int r = 0; r < pp; r++) {
                const ParamTable& table = tables[static_cast<size_t>(t)][static_cast<size_t>(r)];
                for (const TableEntry& e : table.entries) {
                    const float* src = gathered.data() + base + e.offset;
                    const i64 expert_at =  // an ep rank's experts sit further down their tensor
                        GPT::expert_tensor(e) && layout_.ep > 1 ? ep_rank_ * e.numel() : 0;
                    float* dst =
                        out->data() + full.entries[static_cast<size_t>(e.id)].offset + expert_at;
                    const size_t at = static_cast<size_t>(e.id) * static_cast<size_t>(tp) +
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
                        throw InternalError(std::string("the stages' copies of ") + e.name + " (" +
                                            what + ") differ");
                    seen[at] = 1;
                }
                base += table.total;
            }
        }
        if (groups_.ep)  // every ep rank's experts, from the rank that holds them
            for (const TableEntry& e : full.entries) {
                if (!GPT::expert_tensor(e)) continue;
                const i64 share = e.numel() / layout_.ep;
                for (int q = 0; q < layout_.ep; q++)
                    groups_.ep->broadcast(out->data() + e.offset + q * share, share, q);
            }
    };
    // ZeRO: the stage's whole moments from the replicas' shards first.
    auto whole_moments = [&](std::vector<float>& whole, const float* shard) -> const float* {
        if (!shards_) return shard;
        whole.resize(static_cast<size_t>(model_->table().total));
        shards_->all_gather_shards(*zero_group(), whole.data(), shard);
        return whole.data();
    };
    std::vector<float> whole_m, whole_v;
    const float* stage_m = m ? whole_moments(whole_m, opt_->m()) : nullptr;
    const float* stage_v = v ? whole_moments(whole_v, opt_->v()) : nullptr;
    const bool gather = params && zero_ == 3;  // between steps ZeRO-3 holds only its shard
    if (gather) shards_->all_gather_params(*zero_group(), model_->params());
    assemble(params, model_->params(), "weights");
    if (gather) shards_->release_params(model_->param_arena());
    assemble(m, stage_m, "Adam m");
    assemble(v, stage_v, "Adam v");
}

void Job::unshard() {
    if (!shards_) return;
    if (zero_ == 3) shards_->all_gather_params(*zero_group(), model_->params());
    auto whole = std::make_unique<AdamW>(*model_);
    shards_->all_gather_shards(*zero_group(), whole->m(), opt_->m());
    shards_->all_gather_shards(*zero_group(), whole->v(), opt_->v());
    opt_ = std::move(whole);
    checked_opt_.reset();
    checked_w_.clear();
    model_->set_unit_hooks(nullptr);
    units_.reset();
    shards_.reset();
    zero_ = 0;
}

// ---- per-rank checkpoints (core/parallel/state_slices.h) ------------------------------------

RankState Job::rank_state() {
    // The replicas (and under cp the context ranks, which hold the same state) split the writing;
    // under ep the replicas of a local array are the expert-data group's ranks (ZeRO's, too).
    const bool ep = layout_.ep > 1;
    RankState s = replica_state(
        *model_, model_->params(), *opt_, ep ? layout_.dp / layout_.ep : layout_.dp * layout_.cp,
        ep ? dp_rank_ / layout_.ep : dp_rank_ * layout_.cp + cp_rank_, zero_ == 3);
    // The stage that owns a tensor writes it (wte: the first); over tp, a sharded tensor every
    // tp rank, a replicated one tp rank (id mod tp).
    const ParamTable& t = model_->table();
    const auto* tpl = dynamic_cast<const TpLayers*>(model_->parallel_layers());
    for (size_t i = 0; i < t.entries.size(); i++) {
        const TableEntry& e = t.entries[i];
        const bool mine_over_tp = (tpl && tpl->sharded(e)) || e.id % layout_.tp == tp_rank_;
        s.writes_entry[i] = owner_[static_cast<size_t>(e.id)] == pp_rank_ && mine_over_tp;
        // Expert parallelism: every ep index writes its experts' rows (its cut of them), the
        // replicated tensors only ep index 0 (the other ep indices hold the same values).
        if (ep && !GPT::expert_tensor(e))
            s.writes_entry[i] = s.writes_entry[i] && dp_rank_ % layout_.ep == 0;
    }
    return s;
}

void Job::restore_local(const CheckpointReader& file, const std::vector<StepMetrics>& history) {
    read_rank_state(file, rank_state());
    if (zero_ == 3) shards_->release_params(model_->param_arena());
    history_ = history;
    step_ = static_cast<i64>(history.size());
    // The loss scale goes on from the file's when it was a dynamic one (an fp16 run); a file
    // of a run without loss scaling leaves this run's initial scale.
    const CheckpointMeta& meta = file.meta();
    skipped_ = meta.skipped_batches;  // the batches the writer never drew again
    if (scaler_.dynamic() && meta.loss_scale_dynamic)
        scaler_.restore({static_cast<float>(meta.loss_scale), meta.growth_tracker});
    // fp8's scales and histories go on from the file's; a file without them (a run without fp8)
    // leaves the fresh ones (scale 1, empty histories).
    if (fp8_ && fp8_->delayed() && fp8_->gemms() > 0 && meta.fp8_gemms > 0) {
        if (meta.fp8_gemms != fp8_->gemms() || meta.fp8_history_len != fp8_->history_len())
            throw CheckpointError(
                "checkpoint " + file.path() + " holds fp8 state for " +
                std::to_string(meta.fp8_gemms) + " matmuls with amax histories of " +
                std::to_string(meta.fp8_history_len) + " steps, but this run has " +
                std::to_string(fp8_->gemms()) + " fp8 matmuls and precision.fp8_amax_history_len = " +
                std::to_string(fp8_->history_len()) +
                ": resume with the writer's precision.fp8_amax_history_len and "
                "precision.fp8_layers, fp8_keep_ends_bf16 and fp8_lm_head");
        std::vector<float> st = meta.fp8_scale;
        st.insert(st.end(), meta.fp8_history.begin(), meta.fp8_history.end());
        fp8_->restore(st);
    }
}

// ---- memory ----------------------------------------------------------------------------------

int Job::activation_sets(int chunk) const {
    return static_cast<int>(slots_[static_cast<size_t>(chunk)].size());
}

i64 Job::activation_bytes() const {
    i64 n = 0;
    for (const auto& chunk : slots_)
        for (const auto& s : chunk) n += s->acts.bytes();
    return n;
}

// Under ZeRO-2/3 the weights (ZeRO-3) and gradients are measured: the shards, and under
// ZeroUnits the most that one unit in flight mapped. A pipeline stage gathers its ZeRO-3 weights
// once per step and keeps them through the schedule, and reduce-scatters its gradient after the
// last microbatch (as TorchTitan's FSDP under pipeline parallelism does), so its peaks are the
// whole stage's.
MemoryStats Job::memory() const {
    MemoryStats m;
    m.params = model_->table().total * static_cast<i64>(sizeof(float));
    m.grads = grads_.bytes();
    for (const TreeAccumulator& a : acc_) m.grads += a.bytes();
    for (const Arena& a : ep_grads_) m.grads += a.bytes();  // expert parallelism, per source
    for (const auto& per_source : ep_acc_)
        for (const TreeAccumulator& a : per_source) m.grads += a.bytes();
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
    m.activations = activation_bytes();
    if (shards_) m.comm = shards_->staging_bytes();
    // Context parallelism: the ring's or the all-to-alls' staging (whole-sequence K/V, head rows).
    if (const auto* cpa = dynamic_cast<const CpAttention*>(model_->context()))
        m.comm += cpa->staging_bytes();
    return m;
}

bool absorb(LogicalState& state, const Job& job) {
    const GPT& model = job.model();
    const AdamW& opt = job.optimizer();
    const auto* tpl = dynamic_cast<const TpLayers*>(model.parallel_layers());
    bool agree = state.begin_part(job.config().model, job.history());
    for (const TableEntry& e : model.table().entries) {
        // tp shards' and ep parts' elements at their logical places
        std::vector<i64> idx;
        if (tpl || model.expert_share(e)) idx = logical_indices(model, e);
        const i64* at = idx.empty() ? nullptr : idx.data();
        const float* w = model.params() + e.offset;
        agree = state.put(e.id, e.numel(), at, w, nullptr, nullptr) && agree;
        // The moments of this rank's ZeRO slice [lo, hi) of the table.
        const i64 a = std::max(e.offset, opt.lo()), b = std::min(e.offset + e.numel(), opt.hi());
        if (a >= b) continue;
        const i64 j0 = a - e.offset;
        agree = state.put(e.id, b - a, at ? at + j0 : nullptr, w + j0, opt.m() + (a - opt.lo()),
                          opt.v() + (a - opt.lo())) &&
                agree;
    }
    return agree;
}

}  // namespace px
