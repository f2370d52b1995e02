// The logical state of a job (job.h: gather_full, absorb): every rank's pieces of every tensor at
// their places in the whole model, whatever the layout.
#include "core/train/job.h"

#include "core/base/error.h"
#include "core/io/state.h"
#include "core/parallel/expert/expert_parallel.h"
#include "core/parallel/pipeline/pipeline.h"
#include "core/parallel/tensor/tp_model.h"

#include <algorithm>
#include <cstring>
#include <span>

namespace px {

void gather_full(Job& job, std::vector<float>* params, std::vector<float>* m,
                 std::vector<float>* v) {
    const RankSetup& rank = job.rank();
    const ModelConfig& mc = rank.cfg.model;
    const Layout& layout = rank.layout;
    const RankGroups& groups = rank.groups;
    GPT& model = job.model();
    DataParallel& data = job.data();
    const ParamTable full = ParamTable::build(mc);
    const auto* tpl = dynamic_cast<const TpLayers*>(model.parallel_layers());
    const int pp = layout.pp, tp = layout.tp, tp_rank = rank.at.tp;
    // tables[t][r]: the table of pp rank r's stage on tp rank t (local shapes).
    std::vector<std::vector<ParamTable>> tables(static_cast<size_t>(tp));
    std::vector<i64> tp_counts(static_cast<size_t>(tp), 0);
    for (int t = 0; t < tp; t++)
        for (const ModelPart& stage : job.pipeline().stage_parts()) {
            // under ep, this rank's experts of every stage (its pp group shares its ep index)
            const ModelPart p = expert_part(stage, mc, layout.ep, rank.ep_rank);
            tables[static_cast<size_t>(t)].push_back(
                tpl ? ParamTable::build(mc, p, TpDims{tp, tpl->shards().vocabulary.local(t)})
                    : ParamTable::build(mc, p));
            tp_counts[static_cast<size_t>(t)] += tables[static_cast<size_t>(t)].back().total;
        }
    std::vector<i64> pp_counts;
    for (const ParamTable& t : tables[static_cast<size_t>(tp_rank)]) pp_counts.push_back(t.total);
    i64 sum = 0;
    for (i64 c : tp_counts) sum += c;
    std::vector<float> stages(static_cast<size_t>(tp_counts[static_cast<size_t>(tp_rank)]));
    std::vector<float> gathered(static_cast<size_t>(sum));
    // Every stage's arrays over pp (this tp rank's shards), then every tp rank's over tp; each
    // element then goes to its logical place (identity without tp).
    auto assemble = [&](std::vector<float>* out, const float* local, const char* what) {
        if (out == nullptr) return;
        if (groups.pp)
            groups.pp->all_gather_v(stages.data(), local, std::span<const i64>(pp_counts));
        else
            std::copy(local, local + stages.size(), stages.begin());
        if (tpl)
            groups.tp->all_gather_v(gathered.data(), static_cast<const float*>(stages.data()),
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
                        GPT::expert_tensor(e) && layout.ep > 1 ? rank.ep_rank * e.numel() : 0;
                    float* dst =
                        out->data() + full.entries[static_cast<size_t>(e.id)].offset + expert_at;
                    const size_t at = static_cast<size_t>(e.id) * static_cast<size_t>(tp) +
                                      static_cast<size_t>(t);
                    std::vector<i64> idx;
                    if (tpl) idx = logical_indices(*tpl, e, mc, t);
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
        if (groups.ep)  // every ep rank's experts, from the rank that holds them
            for (const TableEntry& e : full.entries) {
                if (!GPT::expert_tensor(e)) continue;
                const i64 share = e.numel() / layout.ep;
                for (int q = 0; q < layout.ep; q++)
                    groups.ep->broadcast(out->data() + e.offset + q * share, share, q);
            }
    };
    // ZeRO: the stage's whole moments from the replicas' shards first.
    std::vector<float> whole_m, whole_v;
    const AdamW& opt = data.optimizer();
    const float* stage_m = m ? data.whole_moments(whole_m, opt.m()) : nullptr;
    const float* stage_v = v ? data.whole_moments(whole_v, opt.v()) : nullptr;
    // Between steps ZeRO-3 holds only its shard of the weights.
    const bool gathered_weights = params && data.gather_weights();
    assemble(params, model.params(), "weights");
    if (gathered_weights) data.release_weights();
    assemble(m, stage_m, "Adam m");
    assemble(v, stage_v, "Adam v");
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
