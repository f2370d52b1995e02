#include "views/spike_model.h"

#include <algorithm>
#include <cmath>

namespace px::views {

namespace {

constexpr const char* kKinds[] = {"grad_norm", "update_ratio", "adam_eps_ratio",
                                  "attn_logit_max"};

// "layer.h.3.grad_norm" -> ("h.3", "grad_norm"); false for other names.
bool split_name(const std::string& name, std::string* group, std::string* kind) {
    if (name.rfind("layer.", 0) != 0) return false;
    const size_t dot = name.rfind('.');
    if (dot <= 6) return false;
    *group = name.substr(6, dot - 6);
    *kind = name.substr(dot + 1);
    return true;
}

int group_order(const std::string& g) {  // embed, h.0 .. h.L-1, ln_f
    if (g == "embed") return -1;
    if (g.rfind("h.", 0) == 0) return std::atoi(g.c_str() + 2);
    return 1 << 30;
}

}  // namespace

int SpikeModel::group(const std::string& name) const {
    const auto it = std::find(groups.begin(), groups.end(), name);
    return it == groups.end() ? -1 : static_cast<int>(it - groups.begin());
}

SpikeModel spike_model(const RunSnapshot& s) {
    SpikeModel m;
    for (const RunEvent& e : s.events)
        if (e.kind == EventKind::spike) m.spikes.push_back(e);
    std::string g, k;
    // Steps with spike evidence: other named values (a MoE job's router statistics) are not.
    std::vector<const StepValues*> with;
    for (const StepValues& sv : s.values) {
        bool any = false;
        for (const NamedValue& v : *sv.values) {
            if (split_name(v.name, &g, &k)) {
                any = true;
                if (m.group(g) < 0) m.groups.push_back(g);
            }
            any = any || v.name.rfind("spike.", 0) == 0;
        }
        if (any) with.push_back(&sv);
    }
    std::sort(m.groups.begin(), m.groups.end(),
              [](const std::string& a, const std::string& b) { return group_order(a) < group_order(b); });
    const size_t n = with.size();
    for (const char* kind : kKinds)
        m.series[kind].assign(m.groups.size(), std::vector<double>(n, NAN));
    m.loss_z.assign(n, NAN);
    m.grad_norm_z.assign(n, NAN);
    for (size_t i = 0; i < n; i++) {
        m.steps.push_back(static_cast<double>(with[i]->step));
        for (const NamedValue& v : *with[i]->values) {
            if (v.name == "spike.loss_z") m.loss_z[i] = v.value;
            if (v.name == "spike.grad_norm_z") m.grad_norm_z[i] = v.value;
            if (!split_name(v.name, &g, &k)) continue;
            const auto it = m.series.find(k);
            if (it != m.series.end())
                it->second[static_cast<size_t>(m.group(g))][i] = v.value;
        }
    }
    return m;
}

std::vector<double> spike_values(const SpikeModel& m, const RunEvent& spike, const std::string& kind) {
    std::vector<double> out(m.groups.size(), NAN);
    const auto at = std::find(m.steps.begin(), m.steps.end(), static_cast<double>(spike.step));
    const auto series = m.series.find(kind);
    if (spike.evidence.empty()) {  // the step's rows
        if (at == m.steps.end() || series == m.series.end()) return out;
        const size_t i = static_cast<size_t>(at - m.steps.begin());
        for (size_t g = 0; g < m.groups.size(); g++) out[g] = series->second[g][i];
        return out;
    }
    std::string g, k;
    for (const NamedValue& v : spike.evidence)
        if (split_name(v.name, &g, &k) && k == kind && m.group(g) >= 0)
            out[static_cast<size_t>(m.group(g))] = v.value;
    return out;
}

std::vector<EvidenceRow> evidence_at(const SpikeModel& m, const RunEvent& spike, int window) {
    std::vector<EvidenceRow> rows;
    const std::vector<double> gn = spike_values(m, spike, "grad_norm");
    const std::vector<double> ur = spike_values(m, spike, "update_ratio");
    const std::vector<double> er = spike_values(m, spike, "adam_eps_ratio");
    const std::vector<double> lm = spike_values(m, spike, "attn_logit_max");
    bool any = false;
    for (double x : gn) any = any || std::isfinite(x);
    if (!any) return rows;
    for (size_t gi = 0; gi < m.groups.size(); gi++) {
        EvidenceRow r;
        r.group = m.groups[gi];
        r.grad_norm = gn[gi];
        std::vector<double> past;
        const auto& series = m.series.at("grad_norm")[gi];
        for (size_t j = 0; j < m.steps.size() && m.steps[j] < static_cast<double>(spike.step); j++)
            if (m.steps[j] >= static_cast<double>(spike.step - window) && std::isfinite(series[j]))
                past.push_back(series[j]);
        r.grad_norm_ratio = NAN;
        if (!past.empty()) {
            std::nth_element(past.begin(), past.begin() + static_cast<std::ptrdiff_t>(past.size() / 2),
                             past.end());
            const double med = past[past.size() / 2];
            if (med > 0) r.grad_norm_ratio = r.grad_norm / med;
        }
        r.update_ratio = ur[gi];
        r.adam_eps_ratio = er[gi];
        r.attn_logit_max = lm[gi];
        rows.push_back(r);
    }
    return rows;
}

std::vector<EventLine> fold_events(const std::vector<RunEvent>& events) {
    std::vector<EventLine> lines;
    for (size_t i = 0; i < events.size(); i++) {
        const RunEvent& e = events[i];
        if (!lines.empty() && lines.back().step == e.step && lines.back().kind == e.kind) {
            lines.back().count++;
            lines.back().last = e.message;
            continue;
        }
        lines.push_back({e.step, e.kind, 1, e.message, "", static_cast<int>(i)});
    }
    return lines;
}

}  // namespace px::views
