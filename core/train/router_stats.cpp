// The MoE router statistics of a step (core/model/moe.h RouterStats): collected by the model
// during the step's forwards, summed over the dp and pp groups, and offered to the observers as
// named values per MoE layer.
#include "core/train/job.h"

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

void Job::begin_router_stats() {
    if (!cfg_.model.is_moe()) return;
    router_stats_.resize(static_cast<size_t>(cfg_.model.layers));
    for (RouterStats& s : router_stats_) s.reset(cfg_.model.moe_experts);
    model_->set_router_stats(router_stats_.data());
}

// Every count and fixed-point sum is an integer below 2^53, so the sums over the groups are
// exact doubles whatever their order.
void Job::end_router_stats(i64 step) {
    if (!cfg_.model.is_moe()) return;
    model_->set_router_stats(nullptr);
    const size_t E = static_cast<size_t>(cfg_.model.moe_experts), per = E + 7;
    std::vector<double> flat(router_stats_.size() * per);
    for (size_t l = 0; l < router_stats_.size(); l++) {
        const RouterStats& s = router_stats_[l];
        double* f = flat.data() + l * per;
        for (size_t e = 0; e < E; e++) f[e] = double(s.tokens[e]);
        const i64 rest[] = {s.slots, s.dropped, s.sequences, s.token_count, s.balance, s.z,
                            s.entropy};
        for (size_t k = 0; k < 7; k++) f[E + k] = double(rest[k]);
    }
    for (comm::Communicator* c : {groups_.dp, groups_.pp})
        if (c) c->all_reduce(flat.data(), static_cast<i64>(flat.size()));
    for (size_t l = 0; l < router_stats_.size(); l++) {
        RouterStats& s = router_stats_[l];
        const double* f = flat.data() + l * per;
        for (size_t e = 0; e < E; e++) s.tokens[e] = static_cast<i64>(f[e]);
        i64* rest[] = {&s.slots, &s.dropped, &s.sequences, &s.token_count, &s.balance, &s.z,
                       &s.entropy};
        for (size_t k = 0; k < 7; k++) *rest[k] = static_cast<i64>(f[E + k]);
    }
    emit_values(step, router_values(cfg_.model, router_stats_));
}

}  // namespace px
