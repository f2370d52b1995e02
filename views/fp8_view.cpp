#include "views/fp8_view.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

namespace px::views {

Fp8View make_fp8_view(const RunSnapshot& s) {
    Fp8View v;
    v.rows = s.fp8.size();
    if (s.fp8.empty()) return v;
    v.recipe = s.fp8.front().recipe;
    std::map<std::string, int> tensor_at;
    for (const Fp8Stat& r : s.fp8) {
        if (r.recipe != v.recipe) {
            if (std::find(v.compare.begin(), v.compare.end(), r.recipe) == v.compare.end())
                v.compare.push_back(r.recipe);
            continue;
        }
        if (tensor_at.emplace(r.tensor, static_cast<int>(v.tensors.size())).second)
            v.tensors.push_back(r.tensor);
        if (v.steps.empty() || v.steps.back() != r.step) v.steps.push_back(r.step);
    }
    // Rows come in step order; a step run again replaced its rows, so steps ascend.
    if (v.steps.size() >= 2) v.step_stride = v.steps[1] - v.steps[0];
    const size_t T = v.tensors.size(), S = v.steps.size();
    v.saturated.assign(T, std::vector<double>(S, NAN));
    v.underflow.assign(T, std::vector<double>(S, NAN));
    v.alerts_of.assign(T, 0);
    // Alert sentences by (step, tensor): the monitor's events begin "fp8 <tensor> (<recipe>)".
    std::map<std::pair<i64, std::string>, const std::string*> said;
    for (const RunEvent& e : s.events) {
        if (e.kind != EventKind::alert || e.message.rfind("fp8 ", 0) != 0) continue;
        const size_t end = e.message.find(" (", 4);
        if (end != std::string::npos) said[{e.step, e.message.substr(4, end - 4)}] = &e.message;
    }
    for (const Fp8Stat& r : s.fp8) {
        if (r.recipe != v.recipe) continue;
        const int t = tensor_at[r.tensor];
        const size_t k = static_cast<size_t>(
            std::lower_bound(v.steps.begin(), v.steps.end(), r.step) - v.steps.begin());
        v.saturated[static_cast<size_t>(t)][k] = r.saturated;
        v.underflow[static_cast<size_t>(t)][k] = r.underflow;
        if (r.alerts == 0) continue;
        Fp8AlertRow a;
        a.row = r;
        a.tensor = t;
        if (const auto it = said.find({r.step, r.tensor}); it != said.end())
            a.message = *it->second;
        v.alerts.push_back(std::move(a));
        v.alerts_of[static_cast<size_t>(t)]++;
    }
    return v;
}

std::vector<Fp8History> Fp8View::histories(const std::vector<Fp8Stat>& rows, int t) const {
    std::vector<Fp8History> out;
    if (t < 0 || t >= static_cast<int>(tensors.size())) return out;
    out.push_back({recipe, {}, {}, {}, {}, {}, {}});
    for (const std::string& c : compare) out.push_back({c, {}, {}, {}, {}, {}, {}});
    const std::string& name = tensors[static_cast<size_t>(t)];
    for (const Fp8Stat& r : rows) {
        if (r.tensor != name) continue;
        for (Fp8History& h : out)
            if (h.recipe == r.recipe) {
                h.step.push_back(static_cast<double>(r.step));
                h.amax.push_back(r.amax);
                // Delayed scaling's step 1 casts with the initial scale 1, made from no amax: a
                // gap, so that the scales that follow set the plot's range.
                const bool initial = r.recipe == "delayed" && r.step == 1;
                h.scale.push_back(initial ? NAN : r.scale);
                h.saturated.push_back(r.saturated);
                h.underflow.push_back(r.underflow);
                h.sqnr_db.push_back(r.sqnr_db);
            }
    }
    return out;
}

int Fp8View::tensor_index(const std::string& name) const {
    const auto it = std::find(tensors.begin(), tensors.end(), name);
    return it == tensors.end() ? -1 : static_cast<int>(it - tensors.begin());
}

int Fp8View::default_tensor() const {
    if (tensors.empty()) return -1;
    return static_cast<int>(std::max_element(alerts_of.begin(), alerts_of.end()) -
                            alerts_of.begin());
}

}  // namespace px::views
