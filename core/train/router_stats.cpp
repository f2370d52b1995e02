// The MoE router statistics of a step (router_stats.h).
#include "core/train/router_stats.h"

#include "core/comm/comm.h"

#include <string>

namespace px {

std::vector<NamedValue> router_values(const ModelConfig& mc, const std::vector<RouterStats>& st) {
    std::vector<NamedValue> v;
    for (size_t l = 0; l < st.size(); l++) {
        if (!mc.moe_layer(static_cast<i64>(l))) continue;
        const RouterStats& s = st[l];
        const std::string p = "moe.h." + std::to_string(l) + ".";
        const double seqs = s.sequences > 0 ? double(s.sequences) : 1.0;
        const double toks = s.token_count > 0 ? double(s.token_count) : 1.0;
        const double balance = router_unfixed(s.balance) / seqs;
        v.push_back({p + "drop_fraction", s.slots > 0 ? double(s.dropped) / double(s.slots) : 0.0});
        v.push_back({p + "balance", balance});
        v.push_back({p + "aux_loss", mc.moe_aux_loss * balance});
        v.push_back({p + "z_loss", mc.moe_z_loss * router_unfixed(s.z) / toks});
        v.push_back({p + "router_entropy", router_unfixed(s.entropy) / toks});
        for (size_t e = 0; e < s.tokens.size(); e++)
            v.push_back({p + "tokens." + std::to_string(e), double(s.tokens[e])});
    }
    return v;
}

void RouterStatsSum::begin(GPT& model) {
    const ModelConfig& mc = model.config();
    if (!mc.is_moe()) return;
    stats_.resize(static_cast<size_t>(mc.layers));
    for (RouterStats& s : stats_) s.reset(mc.moe_experts);
    model.set_router_stats(stats_.data());
}

std::vector<NamedValue> RouterStatsSum::end(GPT& model, const RankGroups& groups) {
    const ModelConfig& mc = model.config();
    if (!mc.is_moe()) return {};
    model.set_router_stats(nullptr);
    const size_t E = static_cast<size_t>(mc.moe_experts), per = E + 7;
    std::vector<double> flat(stats_.size() * per);
    for (size_t l = 0; l < stats_.size(); l++) {
        const RouterStats& s = stats_[l];
        double* f = flat.data() + l * per;
        for (size_t e = 0; e < E; e++) f[e] = double(s.tokens[e]);
        const i64 rest[] = {s.slots, s.dropped, s.sequences, s.token_count, s.balance, s.z,
                            s.entropy};
        for (size_t k = 0; k < 7; k++) f[E + k] = double(rest[k]);
    }
    for (comm::Communicator* c : {groups.dp, groups.pp})
        if (c) c->all_reduce(flat.data(), static_cast<i64>(flat.size()));
    for (size_t l = 0; l < stats_.size(); l++) {
        RouterStats& s = stats_[l];
        const double* f = flat.data() + l * per;
        for (size_t e = 0; e < E; e++) s.tokens[e] = static_cast<i64>(f[e]);
        i64* rest[] = {&s.slots, &s.dropped, &s.sequences, &s.token_count, &s.balance, &s.z,
                       &s.entropy};
        for (size_t k = 0; k < 7; k++) *rest[k] = static_cast<i64>(f[E + k]);
    }
    return router_values(mc, stats_);
}

}  // namespace px
