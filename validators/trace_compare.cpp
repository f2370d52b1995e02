#include "validators/trace_compare.h"

#include "core/base/config.h"
#include "core/base/error.h"
#include "core/train/probe_recorder.h"  // for_each_run
#include "validators/budget.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

namespace px {

namespace {

struct ProbeParts {
    i64 step = 0;
    std::string phase, op;
    int layer = -1;
};

// "3/bwd/2/attn.qkv/dinp" -> step 3, "bwd", 2, "attn.qkv"; the tensor may hold '/' no more.
ProbeParts parse_probe(const std::string& name) {
    std::vector<std::string> parts;
    size_t at = 0;
    for (int k = 0; k < 4; k++) {
        const size_t slash = name.find('/', at);
        if (slash == std::string::npos) break;
        parts.push_back(name.substr(at, slash - at));
        at = slash + 1;
    }
    ProbeParts p;
    char* end = nullptr;
    bool ok = parts.size() == 4 && at < name.size();
    if (ok) p.step = std::strtoll(parts[0].c_str(), &end, 10);
    ok = ok && *end == '\0' && p.step >= 1;
    if (ok && parts[2] != "-") {
        p.layer = static_cast<int>(std::strtol(parts[2].c_str(), &end, 10));
        ok = *end == '\0' && p.layer >= 0;
    }
    if (!ok)
        throw DataError("probe " + name + " is not named step/phase/layer/op/tensor (e.g. "
                        "\"3/bwd/2/attn.qkv/dinp\")");
    p.phase = parts[1];
    p.op = parts[3];
    return p;
}

const char* kind_of(const std::string& phase) {
    if (phase == "fwd") return "fwd";
    if (phase == "bwd") return "bwd";
    if (phase == "grad" || phase == "mgrad") return "grad";
    return "optim";
}

double json_number(double v) {  // JSON holds no inf or NaN: the largest double stands for them
    return std::isfinite(v) ? v : std::numeric_limits<double>::max();
}

// ‖c − r‖² and ‖r‖² over elements [a, a + n) of c and r, with the largest |c − r|; a NaN on one
// side only is an infinite error, NaN on both an agreement.
struct Sums {
    double err2 = 0, ref2 = 0, worst = -1;
    i64 worst_at = -1;
    double worst_ref = 0, worst_run = 0;
    void add(const float* r, const float* c, i64 n, i64 index0) {
        for (i64 i = 0; i < n; i++) {
            const double rv = r[i], cv = c[i];
            const bool rn = std::isnan(rv), cn = std::isnan(cv);
            double d;
            if (rn || cn)
                d = rn && cn ? 0.0 : std::numeric_limits<double>::infinity();
            else if (rv == cv)
                d = 0.0;  // equal infinities too
            else
                d = std::abs(cv - rv);
            err2 += d * d;
            if (!rn && std::isfinite(rv)) ref2 += rv * rv;
            if (d > worst) {
                worst = d;
                worst_at = index0 + i;
                worst_ref = rv;
                worst_run = cv;
            }
        }
    }
    double rel() const {
        const double e = std::sqrt(err2), s = std::sqrt(ref2);
        if (e == 0) return 0;
        return s > 0 ? e / s : std::numeric_limits<double>::infinity();
    }
};

std::vector<i64> unravel(i64 flat, const std::vector<i64>& shape) {
    std::vector<i64> at(shape.size());
    for (size_t d = shape.size(); d-- > 0;) {
        const i64 n = std::max<i64>(shape[d], 1);
        at[d] = flat % n;
        flat /= n;
    }
    return at;
}

// Whether a slab of the probe's rank lies inside its shape.
bool fits(const Hyperslab& slab, const std::vector<i64>& shape) {
    for (size_t d = 0; d < shape.size(); d++)
        if (slab.hi[d] > shape[d]) return false;
    return true;
}

std::string index_text(const std::vector<i64>& at) {
    std::string s = "[";
    for (size_t d = 0; d < at.size(); d++) s += (d ? ", " : "") + std::to_string(at[d]);
    return s + "]";
}

// The run's layout, as its trace says (validators/trace.h): each world rank's coordinates.
std::vector<std::vector<std::pair<std::string, i64>>> rank_coords(const std::string& layout_json,
                                                                  const std::string& path) {
    std::vector<std::vector<std::pair<std::string, i64>>> out;
    if (layout_json.empty()) return out;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(layout_json);
        // An axis of one rank says nothing about where an error sits: left out.
        auto spans = [&](const char* axis) {
            return !j.contains("axes") || !j["axes"].contains(axis) ||
                   j["axes"][axis].get<i64>() > 1;
        };
        for (const auto& r : j.at("ranks")) {
            std::vector<std::pair<std::string, i64>> c;
            for (const char* axis : {"pp", "dp", "fsdp", "tp", "cp", "ep"})
                if (r.contains(axis) && spans(axis)) c.emplace_back(axis, r.at(axis).get<i64>());
            out.push_back(std::move(c));
        }
    } catch (const nlohmann::json::exception& e) {
        throw DataError("trace " + path + ": its layout attribute is not the layout JSON (" +
                        e.what() + ")");
    }
    return out;
}

}  // namespace

double compare_kappa(const std::string& phase, const std::string& op) {
    const std::string k = kind_of(phase);
    if (k == "fwd") return kCompareKappa.fwd;
    if (k == "bwd") return kCompareKappa.bwd;
    if (k == "grad") return kCompareKappa.grad;
    return op == "param" ? kCompareKappa.param : kCompareKappa.optim;
}

i64 probe_level(const std::string& probe, int layers) {
    const ProbeParts p = parse_probe(probe);
    const i64 L = layers;
    const std::string k = kind_of(p.phase);
    if (k == "fwd") return p.layer >= 0 ? p.layer + 2 : p.op == "embed" ? 1 : L + 2;
    if (k == "bwd") return p.layer >= 0 ? 2 * L + 3 - p.layer : p.op == "embed" ? 2 * L + 4 : L + 3;
    if (k == "grad") return p.layer >= 0 ? 2 * L + 3 - p.layer : 2 * L + 4;
    return 2 * L + 5;
}

i64 probe_depth(const std::string& probe, int layers) {
    const ProbeParts p = parse_probe(probe);
    return (p.step - 1) * (2 * static_cast<i64>(layers) + 5) + probe_level(probe, layers);
}

double trace_unit(const TraceReader& t) {
    const std::string& pr = t.info().precision;
    if (pr == "fp32") return unit_roundoff(DType::f32);
    if (pr == "bf16") return unit_roundoff(DType::bf16);
    if (pr == "fp16") return unit_roundoff(DType::f16);
    if (pr == "fp8") return unit_roundoff(DType::e5m2);
    if (!pr.empty())
        throw DataError("trace " + t.path() + ": precision \"" + pr +
                        "\" is none of fp32, bf16, fp16, fp8");
    if (t.info().config_toml.empty())
        throw DataError("trace " + t.path() + " says neither its precision nor its config");
    return precision_unit(parse_config(t.info().config_toml, t.path()).precision);
}

std::string CompareRow::op() const {
    const size_t slash = probe.find('/');
    return slash == std::string::npos ? probe : probe.substr(slash + 1);
}

TraceComparison compare_traces(const TraceReader& ref, const TraceReader& run,
                               const Cancel& cancel) {
    TraceComparison tc;
    tc.ref_path = ref.path();
    tc.run_path = run.path();
    tc.ref_source = ref.info().source;
    tc.run_source = run.info().source;
    tc.unit = std::max(trace_unit(ref), trace_unit(run));
    const std::set<std::string> in_run(run.info().order.begin(), run.info().order.end());
    const std::set<std::string> in_ref(ref.info().order.begin(), ref.info().order.end());
    for (const std::string& name : ref.info().order)
        tc.layers = std::max(tc.layers, parse_probe(name).layer + 1);
    for (const std::string& name : run.info().order)
        if (!in_ref.count(name)) tc.only_run.push_back(name);
    const auto coords = rank_coords(run.info().layout_json, run.path());
    auto coords_text = [&](int rank) {
        if (rank < 0 || static_cast<size_t>(rank) >= coords.size()) return std::string();
        std::string s;
        for (const auto& [axis, at] : coords[static_cast<size_t>(rank)])
            s += fmt::format("{}{} {}", s.empty() ? "" : ", ", axis, at);
        return s;
    };

    for (const std::string& name : ref.info().order) {
        if (!in_run.count(name)) {
            tc.only_ref.push_back(name);
            continue;
        }
        cancel.check();
        std::vector<i64> rshape, cshape;
        const std::vector<float> r = ref.read(name, &rshape);
        const std::vector<float> c = run.read(name, &cshape);
        if (rshape != cshape)
            throw DataError(fmt::format(
                "probe {} has shape {} in {} and {} in {}: the traces are not of the same model "
                "and batch (record both from the same weights, tokens and batch size)",
                name, index_text(rshape), ref.path(), index_text(cshape), run.path()));
        const ProbeParts pp = parse_probe(name);
        CompareRow row;
        row.probe = name;
        row.step = pp.step;
        row.elements = static_cast<i64>(r.size());
        row.depth = probe_depth(name, tc.layers);
        row.budget = compare_kappa(pp.phase, pp.op) * tc.unit * static_cast<double>(row.depth);
        auto finish = [&](CompareRow& w, const Sums& s, const std::vector<i64>& shape) {
            w.error = std::sqrt(s.err2);
            w.scale = std::sqrt(s.ref2);
            w.rel = s.rel();
            w.ratio = w.rel / w.budget;
            if (s.worst_at >= 0) {
                w.worst_at = unravel(s.worst_at, shape);
                w.worst_ref = s.worst_ref;
                w.worst_run = s.worst_run;
            }
        };
        auto keep = [&](const CompareRow& w) {  // a row, and whether it is the verdict's
            tc.rows.push_back(w);
            if (tc.first_over < 0 && !w.within()) tc.first_over = static_cast<i64>(tc.rows.size()) - 1;
        };
        Sums whole;
        whole.add(r.data(), c.data(), row.elements, 0);
        finish(row, whole, rshape);
        keep(row);

        // The run's replicas that differ from its logical tensor: each judged as its own piece.
        for (const TracePiece& rep : run.replicas(name)) {
            if (rep.slab.lo.size() != rshape.size())
                throw DataError(fmt::format("trace {}: replica of {} on rank {} has a slab of "
                                            "another rank than the probe",
                                            run.path(), name, rep.rank));
            if (!fits(rep.slab, rshape))
                throw DataError(fmt::format("trace {}: replica of {} on rank {} lies outside "
                                            "the probe's shape {}",
                                            run.path(), name, rep.rank, index_text(rshape)));
            Sums s;
            // Sums::add wants the logical index of the first element of each run.
            for_each_run(rshape, rep.slab, [&](i64 logical, i64 local, i64 n) {
                s.add(r.data() + logical, rep.values.data() + local, n, logical);
            });
            CompareRow w = row;
            w.rank = rep.rank;
            w.elements = rep.slab.numel();
            finish(w, s, rshape);
            keep(w);
        }

        // The first over-budget probe, by the run's pieces: which rank's part breaks.
        if (tc.first_over >= 0 && tc.split.empty() &&
            tc.rows[static_cast<size_t>(tc.first_over)].probe == name) {
            std::set<int> replicated;  // ranks whose own copy differs: judged by their replica
            for (const CompareRow& w : tc.rows)
                if (w.probe == name && w.rank >= 0) replicated.insert(w.rank);
            for (const TracePiece& piece : run.pieces(name)) {
                if (piece.slab.lo.size() != rshape.size() || !fits(piece.slab, rshape) ||
                    replicated.count(piece.rank))
                    continue;
                Sums s;
                for_each_run(rshape, piece.slab, [&](i64 logical, i64, i64 n) {
                    s.add(r.data() + logical, c.data() + logical, n, logical);
                });
                PieceRatio pr;
                pr.rank = piece.rank;
                pr.coords = coords_text(piece.rank);
                pr.slab = piece.slab;
                pr.rel = s.rel();
                pr.ratio = pr.rel / row.budget;
                tc.split.push_back(pr);
            }
            for (const CompareRow& w : tc.rows)  // the replicas of this probe, as pieces too
                if (w.probe == name && w.rank >= 0)
                    tc.split.push_back(PieceRatio{w.rank, coords_text(w.rank), {}, w.rel, w.ratio});
        }
    }
    if (tc.rows.empty())
        throw DataError("traces " + ref.path() + " and " + run.path() +
                        " hold no probe in common: record both with the same probe patterns "
                        "and steps, from the same model");
    for (const CompareRow& w : tc.rows)
        if (w.ratio > tc.max_ratio || tc.worst.empty()) {
            tc.max_ratio = w.ratio;
            tc.worst = w.rank < 0 ? w.probe : fmt::format("{} on rank {}", w.probe, w.rank);
        }
    return tc;
}

namespace {

std::string ratio_text(double r) {
    if (!std::isfinite(r)) return "inf";
    if (r >= 1e4) return fmt::format("{:.3g}", r);
    return fmt::format("{:.3f}", r);
}

}  // namespace

std::string TraceComparison::verdict() const {
    if (within()) return fmt::format("consistent with rounding (largest ratio {} at {})",
                                     ratio_text(max_ratio), worst);
    const CompareRow& w = rows[static_cast<size_t>(first_over)];
    std::string s = fmt::format("over budget: step {}, {}", w.step, w.op());
    if (w.rank >= 0) s += fmt::format(" on rank {}", w.rank);
    s += fmt::format(": ratio {} (rel. error {:.3g}, budget {:.3g})", ratio_text(w.ratio), w.rel,
                     w.budget);
    if (!w.worst_at.empty())
        s += fmt::format("; largest at {}: {} vs {}", index_text(w.worst_at),
                         static_cast<float>(w.worst_run), static_cast<float>(w.worst_ref));
    return s;
}

std::string TraceComparison::text() const {
    std::string s = fmt::format("reference {} ({}), run {} ({}): {} probes compared, u = 2^{}, "
                                "{} blocks\n",
                                ref_path, ref_source, run_path, run_source, rows.size(),
                                static_cast<int>(std::lround(std::log2(unit))), layers);
    if (!only_ref.empty())
        s += fmt::format("  not in the run: {} probes (e.g. {})\n", only_ref.size(), only_ref[0]);
    if (!only_run.empty())
        s += fmt::format("  not in the reference: {} probes (e.g. {})\n", only_run.size(),
                         only_run[0]);
    // The largest ratio of each op over the steps, in the reference's order.
    std::vector<std::string> ops;
    std::map<std::string, std::pair<double, i64>> worst_of;
    for (const CompareRow& w : rows) {
        const std::string op = w.rank < 0 ? w.op() : fmt::format("{} (rank {})", w.op(), w.rank);
        auto [it, fresh] = worst_of.try_emplace(op, w.ratio, w.step);
        if (fresh) ops.push_back(op);
        else if (w.ratio > it->second.first) it->second = {w.ratio, w.step};
    }
    std::vector<std::string> shown = ops;
    std::stable_sort(shown.begin(), shown.end(), [&](const std::string& a, const std::string& b) {
        return worst_of[a].first > worst_of[b].first;
    });
    if (shown.size() > 12) shown.resize(12);
    s += fmt::format("\n{:<44} {:>10} {:>5}\n", "op (largest ratio over the steps)", "ratio", "step");
    for (const std::string& op : shown)
        s += fmt::format("{:<44} {:>10} {:>5}\n", op, ratio_text(worst_of[op].first),
                         worst_of[op].second);
    if (ops.size() > shown.size())
        s += fmt::format("({} more ops, all below these)\n", ops.size() - shown.size());
    s += "\nverdict: " + verdict() + "\n";
    if (!split.empty()) {
        s += "  by the run's ranks:";
        for (const PieceRatio& p : split)
            s += fmt::format(" rank {}{} {}{};", p.rank,
                             p.coords.empty() ? "" : " (" + p.coords + ")",
                             p.slab.lo.empty() ? "" : index_text(p.slab.lo) + ".." + index_text(p.slab.hi) + " ",
                             ratio_text(p.ratio));
        s.back() = '\n';
    }
    return s;
}

std::string TraceComparison::json() const {
    nlohmann::ordered_json j;
    j["schema"] = "parallax-compare";  // what the workbench's Open tells from a validate.json
    j["reference"] = ref_path;
    j["run"] = run_path;
    j["reference_source"] = ref_source;
    j["run_source"] = run_source;
    j["unit"] = unit;
    j["layers"] = layers;
    j["kappa"] = {{"fwd", kCompareKappa.fwd}, {"bwd", kCompareKappa.bwd},
                  {"grad", kCompareKappa.grad}, {"param", kCompareKappa.param},
                  {"optim", kCompareKappa.optim}};
    j["within"] = within();
    j["verdict"] = verdict();
    j["max_ratio"] = json_number(max_ratio);
    j["worst"] = worst;
    nlohmann::ordered_json first = nullptr;
    if (!within()) {
        const CompareRow& w = rows[static_cast<size_t>(first_over)];
        first = {{"probe", w.probe}, {"step", w.step}, {"op", w.op()}, {"rank", w.rank},
                 {"ratio", json_number(w.ratio)}};
    }
    j["first_over"] = first;
    auto& sp = j["split"] = nlohmann::ordered_json::array();
    for (const PieceRatio& p : split)
        sp.push_back({{"rank", p.rank}, {"coords", p.coords}, {"lo", p.slab.lo}, {"hi", p.slab.hi},
                      {"rel", json_number(p.rel)}, {"ratio", json_number(p.ratio)}});
    auto& rs = j["rows"] = nlohmann::ordered_json::array();
    for (const CompareRow& w : rows)
        rs.push_back({{"probe", w.probe}, {"rank", w.rank}, {"step", w.step}, {"op", w.op()},
                      {"elements", w.elements}, {"error", json_number(w.error)},
                      {"scale", w.scale}, {"rel", json_number(w.rel)}, {"depth", w.depth},
                      {"budget", w.budget}, {"ratio", json_number(w.ratio)},
                      {"worst_at", w.worst_at}, {"worst_ref", json_number(w.worst_ref)},
                      {"worst_run", json_number(w.worst_run)}});
    j["only_reference"] = only_ref;
    j["only_run"] = only_run;
    return j.dump(1);
}

}  // namespace px
