#include "views/router_view.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>

namespace px::views {

namespace {

constexpr const char* kStats[] = {"drop_fraction", "balance",        "aux_loss",
                                  "z_loss",        "router_entropy", "tokens"};

// A non-negative decimal integer filling [b, e); -1 otherwise.
int number(const std::string& s, size_t b, size_t e) {
    if (b >= e || e - b > 9) return -1;
    for (size_t i = b; i < e; i++)
        if (s[i] < '0' || s[i] > '9') return -1;
    return std::atoi(s.c_str() + b);
}

// The per-layer, per-step grids of the statistics other than tokens, and one by its name.
using Grid = std::vector<std::vector<double>>;
std::array<Grid*, 5> stat_grids(RouterView& v) {
    return {&v.drop_fraction, &v.balance, &v.aux_loss, &v.z_loss, &v.entropy};
}
Grid& stat_grid(RouterView& v, const std::string& stat) {
    if (stat == "drop_fraction") return v.drop_fraction;
    if (stat == "balance") return v.balance;
    if (stat == "aux_loss") return v.aux_loss;
    if (stat == "z_loss") return v.z_loss;
    return v.entropy;  // "router_entropy" (parse_router_name admits no other)
}

}  // namespace

bool parse_router_name(const std::string& name, RouterName* out) {
    static const std::string prefix = "moe.h.";
    if (name.rfind(prefix, 0) != 0) return false;
    const size_t dot = name.find('.', prefix.size());
    if (dot == std::string::npos) return false;
    RouterName r;
    r.layer = number(name, prefix.size(), dot);
    if (r.layer < 0) return false;
    r.stat = name.substr(dot + 1);
    if (r.stat.rfind("tokens.", 0) == 0) {
        r.expert = number(name, dot + 8, name.size());
        if (r.expert < 0) return false;
        r.stat = "tokens";
    } else if (r.stat == "tokens" ||
               std::find(std::begin(kStats), std::end(kStats), r.stat) == std::end(kStats)) {
        return false;
    }
    *out = r;
    return true;
}

int RouterView::layer_index(int block) const {
    const auto it = std::lower_bound(layers.begin(), layers.end(), block);
    return it != layers.end() && *it == block ? static_cast<int>(it - layers.begin()) : -1;
}

double RouterView::uniform_entropy() const {
    return experts > 0 ? std::log(static_cast<double>(experts)) : NAN;
}

double RouterView::share(int layer, int expert, int step) const {
    if (layer < 0 || layer >= static_cast<int>(layers.size()) || expert < 0 || expert >= experts ||
        step < 0 || step >= static_cast<int>(steps.size()))
        return NAN;
    const auto& t = tokens[static_cast<size_t>(layer)];
    double kept = 0;
    for (const std::vector<double>& e : t) kept += e[static_cast<size_t>(step)];
    const double mine = t[static_cast<size_t>(expert)][static_cast<size_t>(step)];
    return std::isfinite(kept) && kept > 0 ? mine / kept : NAN;
}

double RouterView::load(int layer, int expert, int step) const {
    const double sh = share(layer, expert, step);
    if (!std::isfinite(sh)) return NAN;
    // Dropped slots count in the share the router asked for: an expert at capacity while others
    // dropped shows above 1 even though its kept slots may look even.
    double drop = drop_fraction[static_cast<size_t>(layer)][static_cast<size_t>(step)];
    if (!std::isfinite(drop) || drop >= 1) drop = 0;
    return sh * (1 - drop) * experts;
}

int RouterView::step_index(double step) const {
    const auto it = std::upper_bound(steps.begin(), steps.end(), step);
    return static_cast<int>(it - steps.begin()) - 1;
}

RouterView make_router_view(const RunSnapshot& s) {
    RouterView v;
    RouterName n;
    std::vector<const StepValues*> with;  // steps with router values
    for (const StepValues& sv : s.values) {
        bool any = false;
        for (const NamedValue& x : *sv.values) {
            if (!parse_router_name(x.name, &n)) continue;
            any = true;
            if (std::find(v.layers.begin(), v.layers.end(), n.layer) == v.layers.end())
                v.layers.push_back(n.layer);
            v.experts = std::max(v.experts, n.expert + 1);
        }
        if (any) with.push_back(&sv);
    }
    std::sort(v.layers.begin(), v.layers.end());
    const size_t L = v.layers.size(), S = with.size(), E = static_cast<size_t>(v.experts);
    for (auto* grid : stat_grids(v)) grid->assign(L, std::vector<double>(S, NAN));
    v.tokens.assign(L, std::vector<std::vector<double>>(E, std::vector<double>(S, NAN)));
    for (size_t i = 0; i < S; i++) {
        v.steps.push_back(static_cast<double>(with[i]->step));
        for (const NamedValue& x : *with[i]->values) {
            if (!parse_router_name(x.name, &n)) continue;
            const size_t l = static_cast<size_t>(v.layer_index(n.layer));
            if (n.stat == "tokens")
                v.tokens[l][static_cast<size_t>(n.expert)][i] = x.value;
            else
                stat_grid(v, n.stat)[l][i] = x.value;
        }
    }
    v.seen = s.values.size();
    v.last = s.values.empty() ? nullptr : s.values.back().values;
    return v;
}

bool update_router_view(RouterView& v, const RunSnapshot& s) {
    const size_t n_values = s.values.size();
    const bool grown = n_values >= v.seen &&
                       (v.seen == 0 ? v.last == nullptr : s.values[v.seen - 1].values == v.last);
    if (!grown) {
        v = make_router_view(s);
        return true;
    }
    if (n_values == v.seen) return false;
    // The new steps' names first: a layer or an expert not seen before makes the view anew.
    RouterName n;
    for (size_t i = v.seen; i < n_values; i++)
        for (const NamedValue& x : *s.values[i].values)
            if (parse_router_name(x.name, &n) &&
                (v.layer_index(n.layer) < 0 || n.expert >= v.experts)) {
                v = make_router_view(s);
                return true;
            }
    bool changed = false;
    for (size_t i = v.seen; i < n_values; i++) {
        bool column = false;  // this step's column, added at its first router value
        for (const NamedValue& x : *s.values[i].values) {
            if (!parse_router_name(x.name, &n)) continue;
            if (!column) {
                column = changed = true;
                v.steps.push_back(static_cast<double>(s.values[i].step));
                for (auto* grid : stat_grids(v))
                    for (std::vector<double>& row : *grid) row.push_back(NAN);
                for (auto& layer : v.tokens)
                    for (std::vector<double>& row : layer) row.push_back(NAN);
            }
            const size_t l = static_cast<size_t>(v.layer_index(n.layer));
            if (n.stat == "tokens")
                v.tokens[l][static_cast<size_t>(n.expert)].back() = x.value;
            else
                stat_grid(v, n.stat)[l].back() = x.value;
        }
    }
    v.seen = n_values;
    v.last = s.values.back().values;
    return changed;
}

std::string router_empty_state(const RouterView& v, const Config& cfg, RunState state) {
    if (!v.empty()) return "";
    const ModelConfig& m = cfg.model;
    if (!m.is_moe())
        return "no MoE layers: set model.moe_experts (and moe_top_k, moe_every) to route each "
               "token to its top-k of E expert MLPs; this model's feed-forwards are dense";
    i64 moe_layers = 0;
    for (i64 l = 0; l < m.layers; l++) moe_layers += m.moe_layer(l) ? 1 : 0;
    const std::string shape = std::to_string(moe_layers) + " MoE layers x " +
                              std::to_string(m.moe_experts) + " experts, top-" +
                              std::to_string(m.moe_top_k);
    if (state == RunState::not_started || state == RunState::running)
        return "no step yet: the router's statistics come at the end of each step (" + shape + ")";
    return "this run holds no router statistics (" + shape +
           "): a run file written before they "
           "were recorded, or a run that stopped before its first step";
}

}  // namespace px::views
