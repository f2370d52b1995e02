// The text, JSON and Markdown of a validation report (validate.h ValidationReport), apart from
// the runs that make it (validate.cpp).
#include "validators/validate.h"

#include <nlohmann/json.hpp>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace px {

namespace {

std::string ranks_text(const std::vector<int>& ranks) {
    std::string s = ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); i++) {
        if (i) s += ",";
        s += std::to_string(ranks[i]);
    }
    return s;
}

// "; parallelism: tp2 (dp2, pp2 match)", or that only the combination diverges.
std::string axes_text(const LayoutResult& r) {
    if (r.axes.empty()) return "";
    std::string bad, good;
    for (const LayoutResult::Axis& a : r.axes) {
        if (a.verdict == "error") continue;
        std::string& to = a.verdict == "match" ? good : bad;
        if (!to.empty()) to += ", ";
        to += a.layout;
    }
    if (bad.empty() && good.empty()) return "";
    if (bad.empty()) return "; parallelism: only the combination (" + good + " each match alone)";
    return "; parallelism: " + bad + (good.empty() ? "" : " (" + good + " match)");
}

}  // namespace

std::string max_ulp_text(std::int64_t u) {
    return u == kNoUlp ? "NaN" : std::to_string(u);
}

std::string first_divergence_text(const LayoutResult& r) {
    if (!r.error.empty()) return r.error;
    if (r.first_step < 0) return "-";
    const Comparison& c = r.first;
    std::string s;
    if (r.replica_step >= 0)  // fast mode: twins that disagree come first
        s += "step " + std::to_string(r.replica_step) + ", replicas disagree: " + r.replica_tensor +
             " on " + ranks_text(r.replica_ranks) + " differs from rank " +
             std::to_string(r.replica_twin) + "'s; ";
    s += "step " + std::to_string(r.first_step) + ", " + c.name;
    std::vector<int> where = r.first_ranks;
    if (where.empty() && r.first_rank >= 0) where = {r.first_rank};
    if (!where.empty()) s += " on " + ranks_text(where);
    const bool same = r.first_op_rank >= 0 && r.first_op.name == c.name;  // a golden trace's probe
    s += " [";
    for (size_t i = 0; i < c.first_index.size(); i++) {
        if (i) s += ", ";
        s += std::to_string(c.first_index[i]);
    }
    char vals[96];
    std::snprintf(vals, sizeof vals, "]: %.9g vs %.9g", static_cast<double>(c.first_reference),
                  static_cast<double>(c.first_candidate));
    s += vals;
    if (r.first_op_rank >= 0 && !same) {
        const Comparison& o = r.first_op;
        s += "; first op: " + o.name + " on " + ranks_text(r.first_op_ranks) + " [";
        for (size_t i = 0; i < o.first_index.size(); i++) {
            if (i) s += ", ";
            s += std::to_string(o.first_index[i]);
        }
        std::snprintf(vals, sizeof vals, "]: %.9g vs %.9g", static_cast<double>(o.first_reference),
                      static_cast<double>(o.first_candidate));
        s += vals;
    }
    return s + axes_text(r);
}

bool ValidationReport::all_ok() const {
    return std::all_of(layouts.begin(), layouts.end(),
                       [](const LayoutResult& r) { return r.ok(); });
}

bool ValidationReport::any_error() const {
    return std::any_of(layouts.begin(), layouts.end(),
                       [](const LayoutResult& r) { return r.verdict == "error"; });
}

std::string ValidationReport::table() const {
    size_t w = 6;
    for (const LayoutResult& r : layouts) w = std::max(w, r.layout.size());
    std::string out;
    char line[512];
    std::snprintf(line, sizeof line, "%-*s  %5s  %-13s  %7s  %s\n", static_cast<int>(w), "layout",
                  "steps", "verdict", "max ULP", "first divergence");
    out += line;
    for (const LayoutResult& r : layouts) {
        std::snprintf(line, sizeof line, "%-*s  %5lld  %-13s  %7s  ", static_cast<int>(w),
                      r.layout.c_str(), static_cast<long long>(r.steps), r.verdict.c_str(),
                      max_ulp_text(r.max_ulp).c_str());
        out += line;
        out += first_divergence_text(r);
        out += "\n";
    }
    return out;
}

std::string ValidationReport::to_json() const {
    using json = nlohmann::ordered_json;
    json j;
    j["schema"] = "parallax-validate";
    j["schema_version"] = kReportSchema;
    j["job"] = job;
    j["mode"] = mode;
    j["steps"] = steps;
    j["reference_seconds"] = reference_seconds;
    j["all_ok"] = all_ok();
    j["layouts"] = json::array();
    for (const LayoutResult& r : layouts) {
        json l;
        l["layout"] = r.layout;
        l["verdict"] = r.verdict;
        l["steps"] = r.steps;
        l["max_ulp"] = r.max_ulp;
        l["first_step"] = r.first_step;
        l["first"] = r.first_step < 0 ? json(nullptr) : json::parse(r.first.to_json());
        l["differing"] = json::array();
        for (const Comparison& c : r.differing) l["differing"].push_back(json::parse(c.to_json()));
        l["final_step"] = json::array();
        for (const Comparison& c : r.final_step)
            l["final_step"].push_back(json::parse(c.to_json()));
        l["first_op"] = r.first_op_rank < 0 ? json(nullptr) : json::parse(r.first_op.to_json());
        l["first_op_rank"] = r.first_op_rank;
        l["first_op_ranks"] = r.first_op_ranks;
        l["first_op_where"] = r.first_op_where;
        l["first_op_note"] = r.first_op_note;
        l["first_rank"] = r.first_rank;
        l["first_ranks"] = r.first_ranks;
        l["replicas"] = r.replica_step < 0 ? json(nullptr)
                                           : json{{"step", r.replica_step},
                                                  {"tensor", r.replica_tensor},
                                                  {"ranks", r.replica_ranks},
                                                  {"twin", r.replica_twin}};
        l["axes"] = json::array();
        for (const LayoutResult::Axis& a : r.axes)
            l["axes"].push_back({{"layout", a.layout},
                                 {"verdict", a.verdict},
                                 {"first_step", a.first_step},
                                 {"error", a.error}});
        l["budget_ratio"] = r.budget_ratio < 0 ? json(nullptr) : json(r.budget_ratio);
        l["budget_worst"] = r.budget_worst;
        if (!r.grid_tensors.empty()) {  // every step's comparisons, worst over the ranks
            json g;
            g["tensors"] = r.grid_tensors;
            g["max_ulp"] = json::array();
            for (const std::vector<std::int64_t>& row : r.grid_ulp) {
                json line = json::array();
                for (const std::int64_t u : row)
                    line.push_back(u == kGridNotRun ? json(nullptr) : json(u));
                g["max_ulp"].push_back(std::move(line));
            }
            if (!r.grid_ratio.empty()) {
                g["budget_ratio"] = json::array();
                for (const std::vector<double>& row : r.grid_ratio) {
                    json line = json::array();
                    for (const double q : row)
                        line.push_back(q < 0              ? json(nullptr)
                                       : std::isfinite(q) ? json(q)
                                                          : json("inf"));
                    g["budget_ratio"].push_back(std::move(line));
                }
            }
            l["grid"] = std::move(g);
        }
        l["error"] = r.error;
        l["seconds"] = r.seconds;
        j["layouts"].push_back(std::move(l));
    }
    return j.dump(2) + "\n";
}

std::string ValidationReport::to_markdown() const {
    std::string md = "# parallax validate: " + job + "\n\n";
    md += "Mode " + mode + ", " + std::to_string(steps) +
          " steps, every layout against the single-device reference after every step.\n\n";
    md += "| layout | steps | verdict | max ULP | first divergence |\n|---|---|---|---|---|\n";
    for (const LayoutResult& r : layouts) {
        std::string first = first_divergence_text(r);
        std::replace(first.begin(), first.end(), '|', '/');
        md += "| " + r.layout + " | " + std::to_string(r.steps) + " | " + r.verdict + " | " +
              max_ulp_text(r.max_ulp) + " | " + first + " |\n";
    }
    for (const LayoutResult& r : layouts) {
        if (r.differing.empty() && r.budget_ratio < 0) continue;
        md += "\n## " + r.layout + "\n\n";
        if (r.budget_ratio >= 0) {
            char b[160];
            std::snprintf(b, sizeof b, "Error budget: worst tensor %s at %.3g of its budget.\n\n",
                          r.budget_worst.c_str(), r.budget_ratio);
            md += b;
        }
        if (r.first_op_rank >= 0)
            md += "First op that differs: `" + r.first_op.text() + "` on " +
                  ranks_text(r.first_op_ranks) + " (rank " + std::to_string(r.first_op_rank) +
                  ": " + r.first_op_where + ").\n\n";
        else if (!r.first_op_note.empty())
            md += "First op: " + r.first_op_note + ".\n\n";
        for (const LayoutResult::Axis& a : r.axes)
            md += "- alone, " + a.layout + ": " + a.verdict +
                  (a.first_step > 0 ? " from step " + std::to_string(a.first_step) : "") +
                  (a.error.empty() ? "" : " (" + a.error + ")") + "\n";
        if (!r.axes.empty()) md += "\n";
        if (!r.differing.empty()) {
            md += "Tensors that differ at step " + std::to_string(r.first_step) + ":\n\n";
            for (const Comparison& c : r.differing) md += "- `" + c.text() + "`\n";
        }
    }
    return md;
}

}  // namespace px
