#include "views/trace_view.h"

#include "core/base/error.h"
#include "validators/trace.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>

namespace px::views {

namespace {

using json = nlohmann::json;

std::string file_name(const std::string& path) {
    const std::string name = std::filesystem::path(path).filename().string();
    return name.empty() ? path : name;
}

std::string ratio_text(double r) {
    if (!std::isfinite(r)) return "inf";
    return r >= 1e4 || (r > 0 && r < 1e-3) ? fmt::format("{:.3g}", r) : fmt::format("{:.3f}", r);
}

std::string index_text(const std::vector<i64>& at) {
    std::string s = "[";
    for (size_t d = 0; d < at.size(); d++) s += (d ? ", " : "") + std::to_string(at[d]);
    return s + "]";
}

// The step a probe name starts with ("3/bwd/2/attn.qkv/dinp" -> 3); DataError when it has none.
i64 probe_step(const std::string& probe, const std::string& path) {
    char* end = nullptr;
    const i64 step = std::strtoll(probe.c_str(), &end, 10);
    if (end == probe.c_str() || *end != '/' || step < 1)
        throw DataError(
            path + ": probe " + probe +
            " is not named step/phase/layer/op/tensor (e.g. \"3/bwd/2/attn.qkv/dinp\")");
    return step;
}

std::string op_of(const std::string& probe) {
    const size_t slash = probe.find('/');
    return slash == std::string::npos ? probe : probe.substr(slash + 1);
}

std::string row_name(const CompareRow& w) {
    return w.rank < 0 ? w.op() : fmt::format("{} (rank {})", w.op(), w.rank);
}

CheckCell cell_of(const CompareRow& w) {
    CheckCell k;
    k.done = true;
    k.rel = w.rel;
    k.budget = w.budget;
    k.ratio = w.ratio;
    if (w.error != 0) {  // else bit-identical (rank -1)
        k.rank = std::max(w.rank, 0);
        k.max_ulp = std::isfinite(w.error) ? 1 : kNoUlp;  // the ULP distance is not measured
        k.at = w.worst_at;
        k.reference = w.worst_ref;
        k.candidate = w.worst_run;
    }
    return k;
}

// A report's number: JSON holds no inf or NaN, and the report writes the largest double for them.
double number(const json& j) {
    if (!j.is_number()) return 0;
    const double v = j.get<double>();
    return v >= std::numeric_limits<double>::max() ? std::numeric_limits<double>::infinity() : v;
}

}  // namespace

CheckView check_from_comparison(const TraceComparison& tc) {
    CheckView v;
    v.mode = "compare";
    for (const CompareRow& w : tc.rows) v.steps = std::max(v.steps, w.step);
    v.reference_steps = v.steps;
    v.header = fmt::format("reference {} ({}) against run {} ({}): {} probes, u = 2^{}, {} blocks",
                           tc.ref_path, tc.ref_source, tc.run_path, tc.run_source, tc.rows.size(),
                           tc.unit > 0 ? std::lround(std::log2(tc.unit)) : 0L, tc.layers);
    // Rows: the ops in the reference's order, each op's differing replicas right under it.
    std::vector<std::string> ops;
    std::map<std::string, std::set<int>> replicas;
    for (const CompareRow& w : tc.rows) {
        if (w.rank >= 0) {
            replicas[w.op()].insert(w.rank);
        } else if (std::find(ops.begin(), ops.end(), w.op()) == ops.end()) {
            ops.push_back(w.op());
        }
    }
    LayoutGrid g;
    g.name = file_name(tc.run_path);
    std::map<std::string, size_t> row_of;
    auto add_row = [&](const std::string& name) {
        row_of.emplace(name, g.tensors.size());
        g.tensors.push_back(name);
    };
    for (const std::string& op : ops) {
        add_row(op);
        for (int r : replicas[op]) add_row(fmt::format("{} (rank {})", op, r));
        replicas.erase(op);
    }
    for (const auto& [op, ranks] : replicas)  // a replica whose op the run has no row of
        for (int r : ranks) add_row(fmt::format("{} (rank {})", op, r));
    g.cells.assign(g.tensors.size(), std::vector<CheckCell>(static_cast<size_t>(v.steps)));
    for (size_t i = 0; i < tc.rows.size(); i++) {
        const CompareRow& w = tc.rows[i];
        const size_t row = row_of.at(row_name(w));
        g.cells[row][static_cast<size_t>(w.step - 1)] = cell_of(w);
        if (static_cast<i64>(i) == tc.first_over) {
            g.first_row = static_cast<int>(row);
            g.first_col = static_cast<int>(w.step - 1);
        }
    }
    LayoutResult& r = g.result;
    r.layout = g.name;
    r.verdict = tc.within() ? "within budget" : "over budget";
    r.steps = v.steps;
    r.budget_ratio = tc.max_ratio;
    r.budget_worst = tc.worst;
    if (!tc.within()) {
        const CompareRow& w = tc.rows[static_cast<size_t>(tc.first_over)];
        r.first_step = w.step;
        r.first_rank = w.rank;
        r.first.name = row_name(w);
        r.first.first_reference = w.worst_ref;
        r.first.first_candidate = w.worst_run;
    }
    g.summary = tc.verdict();
    g.finished = true;
    g.steps_done = v.steps;
    v.layouts.push_back(std::move(g));
    if (!tc.split.empty()) {
        v.notes.push_back(
            "by the run's ranks (each rank's piece of the first over-budget op, "
            "error / budget):");
        for (const PieceRatio& p : tc.split)
            v.notes.push_back(fmt::format(
                "  rank {}{}{}: {}", p.rank, p.coords.empty() ? "" : " (" + p.coords + ")",
                p.slab.lo.empty() ? " (a replica)"
                                  : ", " + index_text(p.slab.lo) + ".." + index_text(p.slab.hi),
                ratio_text(p.ratio)));
    }
    if (!tc.only_ref.empty())
        v.notes.push_back(
            fmt::format("not in the run: {} probes (e.g. {})", tc.only_ref.size(), tc.only_ref[0]));
    if (!tc.only_run.empty())
        v.notes.push_back(fmt::format("not in the reference: {} probes (e.g. {})",
                                      tc.only_run.size(), tc.only_run[0]));
    v.version = 1;
    return v;
}

bool is_compare_report(const std::string& path) {
    std::ifstream in(path);
    if (!in) return false;
    try {
        const json j = json::parse(in);
        return j.is_object() && j.value("schema", "") == "parallax-compare";
    } catch (const json::exception&) {
        return false;
    }
}

TraceComparison comparison_from_report(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw DataError(path + ": cannot open the compare report");
    json j;
    try {
        in >> j;
    } catch (const std::exception& e) {
        throw DataError(path + ": not a compare report (" + e.what() + ")");
    }
    if (!j.is_object() || j.value("schema", "") != "parallax-compare")
        throw DataError(path +
                        ": not a compare report (no schema \"parallax-compare\"; write "
                        "one with parallax compare REF.h5 RUN.h5 --json FILE)");
    TraceComparison tc;
    try {
        tc.ref_path = j.value("reference", "");
        tc.run_path = j.value("run", "");
        tc.ref_source = j.value("reference_source", "parallax");
        tc.run_source = j.value("run_source", "parallax");
        tc.unit = number(j["unit"]);
        tc.layers = j.value("layers", 0);
        tc.max_ratio = number(j["max_ratio"]);
        tc.worst = j.value("worst", "");
        for (const json& w : j.at("rows")) {
            CompareRow row;
            row.probe = w.at("probe").get<std::string>();
            row.rank = w.value("rank", -1);
            row.step = w.value("step", i64{0});
            if (row.step < 1) row.step = probe_step(row.probe, path);
            row.elements = w.value("elements", i64{0});
            row.error = number(w["error"]);
            row.scale = number(w["scale"]);
            row.rel = number(w["rel"]);
            row.depth = w.value("depth", i64{0});
            row.budget = number(w["budget"]);
            row.ratio = number(w["ratio"]);
            if (w.contains("worst_at") && w["worst_at"].is_array())
                row.worst_at = w["worst_at"].get<std::vector<i64>>();
            row.worst_ref = number(w["worst_ref"]);
            row.worst_run = number(w["worst_run"]);
            tc.rows.push_back(std::move(row));
        }
        const json& first = j["first_over"];
        if (first.is_object()) {
            const std::string probe = first.at("probe").get<std::string>();
            const int rank = first.value("rank", -1);
            for (size_t i = 0; i < tc.rows.size() && tc.first_over < 0; i++)
                if (tc.rows[i].probe == probe && tc.rows[i].rank == rank)
                    tc.first_over = static_cast<i64>(i);
            if (tc.first_over < 0)
                throw DataError(path + ": its first_over, " + probe + ", is none of its rows");
        }
        for (const json& p : j.value("split", json::array())) {
            PieceRatio pr;
            pr.rank = p.value("rank", 0);
            pr.coords = p.value("coords", "");
            pr.slab.lo = p.value("lo", std::vector<i64>{});
            pr.slab.hi = p.value("hi", std::vector<i64>{});
            pr.rel = number(p["rel"]);
            pr.ratio = number(p["ratio"]);
            tc.split.push_back(std::move(pr));
        }
        tc.only_ref = j.value("only_reference", std::vector<std::string>{});
        tc.only_run = j.value("only_run", std::vector<std::string>{});
    } catch (const json::exception& e) {
        throw DataError(path + ": a damaged compare report (" + e.what() + ")");
    }
    if (tc.rows.empty()) throw DataError(path + ": a compare report without rows");
    return tc;
}

CheckView check_from_compare_report(const std::string& path) {
    return check_from_comparison(comparison_from_report(path));
}

CheckView check_from_trace(const std::string& path) {
    const TraceReader t(path);
    const TraceInfo& info = t.info();
    CheckView v;
    v.mode = "trace";
    std::vector<std::string> ops;
    std::map<std::string, size_t> row_of;
    std::vector<std::pair<size_t, i64>> present;  // (row, step) of each probe
    for (const std::string& probe : info.order) {
        const i64 step = probe_step(probe, path);
        const auto [it, fresh] = row_of.try_emplace(op_of(probe), ops.size());
        if (fresh) ops.push_back(it->first);
        present.emplace_back(it->second, step);
        v.steps = std::max(v.steps, step);
    }
    v.reference_steps = v.steps;
    LayoutGrid g;
    g.name = file_name(path);
    g.tensors = ops;
    g.cells.assign(ops.size(), std::vector<CheckCell>(static_cast<size_t>(v.steps)));
    for (const auto& [row, step] : present) g.cells[row][static_cast<size_t>(step - 1)].done = true;
    g.finished = true;
    g.steps_done = v.steps;
    g.result.layout = g.name;
    g.result.verdict = "recorded";
    g.result.steps = v.steps;
    // The attributes a comparison reads: who recorded it, in which precision, on which layout.
    std::string precision = info.precision;
    if (precision.empty()) {
        try {
            precision =
                fmt::format("the config's (u = 2^{})", std::lround(std::log2(trace_unit(t))));
        } catch (const Error&) {
            precision = "unknown";
        }
    }
    std::string layout = "one device";
    if (!info.layout_json.empty()) {
        try {
            const json l = json::parse(info.layout_json);
            std::string axes;
            for (const auto& [axis, n] : l.value("axes", json::object()).items())
                if (n.is_number() && n.get<i64>() > 1)
                    axes += fmt::format("{}{}{}", axes.empty() ? "" : " x ", axis, n.get<i64>());
            layout = fmt::format("{} ({} ranks)", axes.empty() ? "one device" : axes,
                                 l.value("world", 1));
        } catch (const json::exception&) {
            layout = "unreadable";
        }
    }
    v.header = fmt::format(
        "trace {}: source {}, precision {}, layout {}; {} probes ({} ops) over {} steps{}", path,
        info.source, precision, layout, info.order.size(), ops.size(), v.steps,
        info.stride > 1 ? fmt::format(", every {}", info.stride) : "");
    g.summary = fmt::format("{} probes recorded", info.order.size());
    v.layouts.push_back(std::move(g));
    v.version = 1;
    return v;
}

}  // namespace px::views
