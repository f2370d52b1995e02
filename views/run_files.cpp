#include "views/run_files.h"

#include "core/base/error.h"
#include "core/io/runfile.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>

namespace px::views {

namespace {

using json = nlohmann::json;

double number(const json& j) {
    if (j.is_number()) return j.get<double>();
    if (j.is_string()) {
        const std::string s = j.get<std::string>();
        if (s.find("nan") != std::string::npos) return NAN;
        if (s.find("inf") != std::string::npos) return s[0] == '-' ? -INFINITY : INFINITY;
    }
    return 0;
}

Comparison comparison(const json& j) {
    Comparison c;
    if (!j.is_object()) return c;
    c.name = j.value("name", "");
    c.count = j.value("count", i64{0});
    c.differing = j.value("differing", i64{0});
    c.max_ulp = j.value("max_ulp", std::int64_t{0});
    c.first = j.value("first", i64{-1});
    if (j.contains("first_index")) c.first_index = j["first_index"].get<std::vector<i64>>();
    if (j.contains("shape")) c.shape = j["shape"].get<std::vector<i64>>();
    if (j.contains("first_reference")) c.first_reference = number(j["first_reference"]);
    if (j.contains("first_candidate")) c.first_candidate = number(j["first_candidate"]);
    return c;
}

CheckCell cell_of(const Comparison& c) {
    CheckCell k;
    k.done = true;
    k.max_ulp = c.max_ulp;
    if (!c.equal()) {
        k.rank = 0;
        k.differing = c.differing;
        k.first = c.first;
        k.reference = c.first_reference;
        k.candidate = c.first_candidate;
    }
    return k;
}

// The table's row, as parallax validate prints it (header line dropped).
std::string summary_of(const LayoutResult& r) {
    ValidationReport one;
    one.layouts.push_back(r);
    const std::string text = one.table();
    const size_t nl = text.find('\n');
    std::string row = nl == std::string::npos ? text : text.substr(nl + 1);
    while (!row.empty() && (row.back() == '\n' || row.back() == ' ')) row.pop_back();
    return row;
}

// A report's grid (every step, worst over the ranks), with the first differing step's
// comparisons (on first_rank) giving those cells their element and values.
void fill_grid(LayoutGrid& g, const LayoutResult& r, i64 steps) {
    g.tensors = r.grid_tensors;
    g.cells.assign(g.tensors.size(), std::vector<CheckCell>(static_cast<size_t>(steps)));
    for (size_t t = 0; t < g.tensors.size() && t < r.grid_ulp.size(); t++)
        for (size_t s = 0; s < g.cells[t].size() && s < r.grid_ulp[t].size(); s++) {
            const std::int64_t u = r.grid_ulp[t][s];
            if (u == kGridNotRun) continue;
            CheckCell& k = g.cells[t][s];
            k.done = true;
            k.max_ulp = u;
            if (u != 0) k.rank = std::max(r.first_rank, 0);  // the worst rank is not kept
            if (t < r.grid_ratio.size() && s < r.grid_ratio[t].size()) k.ratio = r.grid_ratio[t][s];
        }
    if (r.first_step < 1 || r.first_step > steps) return;
    for (const Comparison& d : r.differing) {
        const auto it = std::find(g.tensors.begin(), g.tensors.end(), d.name);
        if (it == g.tensors.end()) continue;
        CheckCell& k = g.cells[static_cast<size_t>(it - g.tensors.begin())]
                              [static_cast<size_t>(r.first_step - 1)];
        const CheckCell worst = k;
        k = cell_of(d);
        k.rank = std::max(r.first_rank, 0);
        k.max_ulp = worst.done ? worst.max_ulp : k.max_ulp;
        k.ratio = worst.ratio;
    }
}

}  // namespace

RunSnapshot snapshot_from_run_file(const std::string& path) {
    const RunRecords rec = read_run_records(path);
    RunSnapshot s;
    s.version = 1;
    s.state = RunState::finished;
    s.config_toml = rec.config_toml;
    try {
        s.config = parse_config(rec.config_toml, path);
    } catch (const ConfigError&) {
        // an older file's config: the metrics still show
    }
    std::map<std::string, const RunRecords::Rows*> by;
    for (const auto& [name, rows] : rec.metrics) by[name] = &rows;
    if (by.count("loss")) {
        const RunRecords::Rows& loss = *by["loss"];
        auto at = [&](const char* name, i64 step, double none) {
            if (!by.count(name)) return none;
            const RunRecords::Rows& r = *by[name];
            for (size_t i = 0; i < r.steps.size(); i++)
                if (r.steps[i] == step) return r.values[i];
            return none;
        };
        for (size_t i = 0; i < loss.steps.size(); i++) {
            StepMetrics m;
            m.step = loss.steps[i];
            m.loss = loss.values[i];
            m.val_loss = at("val_loss", m.step, -1);
            m.grad_norm = at("grad_norm", m.step, 0);
            m.lr = at("lr", m.step, 0);
            m.tokens_per_s = at("tokens_per_s", m.step, 0);
            m.step_ms = at("step_ms", m.step, 0);
            m.comm_bytes = at("comm_bytes", m.step, 0);
            s.metrics.push_back(m);
        }
    }
    for (const RunRecords::Event& e : rec.events) {
        RunEvent ev;
        ev.step = e.step;
        ev.message = e.message;
        if (!event_kind_from_name(e.kind, &ev.kind)) ev.kind = EventKind::fault;
        for (size_t at = 0; at < e.evidence.size();) {  // "name=value;name=value"
            const size_t end = std::min(e.evidence.find(';', at), e.evidence.size());
            const std::string item = e.evidence.substr(at, end - at);
            const size_t eq = item.find('=');
            if (eq != std::string::npos)
                ev.evidence.push_back({item.substr(0, eq), std::strtod(item.c_str() + eq + 1, nullptr)});
            at = end + 1;
        }
        s.events.push_back(std::move(ev));
    }
    // The spike evidence (layer.* and spike.* metrics) and the MoE router statistics (moe.*) as
    // the job view's per-step values.
    std::map<i64, std::vector<NamedValue>> values;
    for (const auto& [name, rows] : rec.metrics) {
        if (name.rfind("layer.", 0) != 0 && name.rfind("spike.", 0) != 0 &&
            name.rfind("moe.", 0) != 0)
            continue;
        for (size_t i = 0; i < rows.steps.size() && i < rows.values.size(); i++)
            values[rows.steps[i]].push_back({name, rows.values[i]});
    }
    for (auto& [step, v] : values)
        s.values.push_back({step, std::make_shared<const std::vector<NamedValue>>(std::move(v))});
    s.fp8 = rec.fp8;
    // The summaries written at the run's end: rank 0's memory, the model's size, the source's
    // entropy.
    std::map<std::string, double> num(rec.numbers.begin(), rec.numbers.end());
    auto bytes = [&](const char* key) { return static_cast<i64>(num.count(key) ? num[key] : 0); };
    if (num.count("memory_params_bytes")) {
        MemoryStats m;
        m.params = m.peak_params = bytes("memory_params_bytes");
        m.grads = m.peak_grads = bytes("memory_grads_bytes");
        m.optimizer = bytes("memory_optimizer_bytes");
        m.activations = bytes("memory_activations_bytes");
        m.comm = bytes("memory_comm_bytes");
        s.memory.push_back(m);
    }
    if (num.count("num_params")) s.num_params = bytes("num_params");
    if (num.count("entropy_rate")) s.entropy_rate = num["entropy_rate"];
    if (num.count("loss_floor")) s.loss_floor = num["loss_floor"];
    s.steps_total = s.config.train.steps;
    s.steps_done = s.metrics.size() ? s.metrics.step.back() : 0;
    s.layout = LayoutSummary{s.config.layout.dp,
                             s.config.layout.tp,
                             s.config.layout.pp,
                             s.config.layout.zero,
                             1,
                             s.config.layout.dp * s.config.layout.tp * s.config.layout.pp};
    return s;
}

CheckView view_of_report(const ValidationReport& rep) {
    CheckView v;
    v.mode = rep.mode;
    v.steps = rep.steps;
    v.reference_steps = rep.steps;
    for (const LayoutResult& r : rep.layouts) {
        LayoutGrid g;
        g.name = r.layout;
        g.finished = true;
        g.result = r;
        g.steps_done = r.steps;
        if (!r.grid_tensors.empty()) {
            fill_grid(g, r, v.steps);
            g.summary = summary_of(r);
            v.layouts.push_back(std::move(g));
            continue;
        }
        // An older report without a grid: every step before the first difference matched; at
        // the first differing step the report lists the tensors that differ; the last step,
        // every comparison.
        for (const Comparison& c : r.final_step) g.tensors.push_back(c.name);
        if (r.final_step.empty() && r.first_step >= 0) g.tensors.push_back(r.first.name);
        g.cells.assign(g.tensors.size(), std::vector<CheckCell>(static_cast<size_t>(v.steps)));
        const i64 known = r.first_step < 0 ? r.steps : r.first_step;
        for (size_t t = 0; t < g.tensors.size(); t++) {
            for (i64 s = 1; s <= known && s <= v.steps; s++) {
                CheckCell& k = g.cells[t][static_cast<size_t>(s - 1)];
                k.done = true;
                if (s == r.first_step) {
                    for (const Comparison& d : r.differing)
                        if (d.name == g.tensors[t]) k = cell_of(d);
                    if (r.first.name == g.tensors[t]) k = cell_of(r.first);
                }
            }
            if (t < r.final_step.size() && r.steps >= 1 && r.steps <= v.steps)
                g.cells[t][static_cast<size_t>(r.steps - 1)] = cell_of(r.final_step[t]);
        }
        g.summary = summary_of(r);
        v.layouts.push_back(std::move(g));
    }
    v.version = 1;
    return v;
}

CheckView check_from_report(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw DataError(path + ": cannot open the validation report");
    json j;
    try {
        in >> j;
    } catch (const std::exception& e) {
        throw DataError(path + ": not a validation report (" + e.what() + ")");
    }
    if (j.value("schema", "") != "parallax-validate")
        throw DataError(path + ": not a validation report (no schema \"parallax-validate\")");
    ValidationReport rep;
    rep.mode = j.value("mode", "bitwise");
    rep.steps = j.value("steps", i64{0});
    for (const json& l : j["layouts"]) {
        LayoutResult r;
        r.layout = l.value("layout", "");
        r.verdict = l.value("verdict", "");
        r.steps = l.value("steps", i64{0});
        r.max_ulp = l.value("max_ulp", std::int64_t{0});
        r.first_step = l.value("first_step", i64{-1});
        r.first_rank = l.value("first_rank", -1);
        if (l.contains("first_ranks") && l["first_ranks"].is_array())
            r.first_ranks = l["first_ranks"].get<std::vector<int>>();
        if (l.contains("replicas") && l["replicas"].is_object()) {
            const json& rep = l["replicas"];
            r.replica_step = rep.value("step", i64{-1});
            r.replica_tensor = rep.value("tensor", "");
            if (rep.contains("ranks") && rep["ranks"].is_array())
                r.replica_ranks = rep["ranks"].get<std::vector<int>>();
            r.replica_twin = rep.value("twin", -1);
        }
        r.first = comparison(l["first"]);
        for (const json& c : l["differing"]) r.differing.push_back(comparison(c));
        for (const json& c : l["final_step"]) r.final_step.push_back(comparison(c));
        r.first_op = comparison(l["first_op"]);
        r.first_op_rank = l.value("first_op_rank", -1);
        if (l.contains("first_op_ranks"))
            r.first_op_ranks = l["first_op_ranks"].get<std::vector<int>>();
        r.first_op_where = l.value("first_op_where", "");
        r.first_op_note = l.value("first_op_note", "");
        if (l["budget_ratio"].is_number()) r.budget_ratio = l["budget_ratio"].get<double>();
        r.budget_worst = l.value("budget_worst", "");
        r.error = l.value("error", "");
        if (l.contains("grid") && l["grid"].is_object()) {
            const json& g = l["grid"];
            r.grid_tensors = g.value("tensors", std::vector<std::string>{});
            for (const json& row : g.value("max_ulp", json::array())) {
                std::vector<std::int64_t> line;
                for (const json& u : row)
                    line.push_back(u.is_number() ? u.get<std::int64_t>() : kGridNotRun);
                r.grid_ulp.push_back(std::move(line));
            }
            for (const json& row : g.value("budget_ratio", json::array())) {
                std::vector<double> line;
                for (const json& q : row) line.push_back(q.is_null() ? -1.0 : number(q));
                r.grid_ratio.push_back(std::move(line));
            }
        }
        rep.layouts.push_back(std::move(r));
    }
    return view_of_report(rep);
}

}  // namespace px::views
