#include "validators/validate.h"

#include "core/error.h"
#include "core/job.h"
#include "core/parallel/mesh.h"
#include "core/parallel/pipeline.h"
#include "core/parallel/runner.h"
#include "core/state.h"
#include "validators/budget.h"
#include "validators/probes.h"
#include "validators/trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <sstream>

namespace px {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// "dp12" -> 12 when `part` starts with `prefix` followed by digits only.
bool number_after(const std::string& part, const char* prefix, int* out) {
    const std::string p = prefix;
    if (part.size() <= p.size() || part.compare(0, p.size(), p) != 0) return false;
    const std::string digits = part.substr(p.size());
    if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 6)
        return false;
    *out = std::stoi(digits);
    return true;
}

std::int64_t worse(std::int64_t a, std::int64_t b) {
    if (a == kNoUlp || b == kNoUlp) return kNoUlp;
    return std::max(a, b);
}

std::string ulp_text(std::int64_t u) {
    return u == kNoUlp ? "NaN" : std::to_string(u);
}

std::string first_text(const LayoutResult& r) {
    if (!r.error.empty()) return r.error;
    if (r.first_step < 0) return "-";
    const Comparison& c = r.first;
    std::string s = "step " + std::to_string(r.first_step);
    s += ", ";
    s += c.name;
    const bool same = r.first_op_rank >= 0 && r.first_op.name == c.name;  // a golden trace's probe
    if (same) s += " on rank " + std::to_string(r.first_op_rank) + " ";
    s += "[";
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
        s += "; first op: " + o.name + " on rank " + std::to_string(r.first_op_rank) + " [";
        for (size_t i = 0; i < o.first_index.size(); i++) {
            if (i) s += ", ";
            s += std::to_string(o.first_index[i]);
        }
        std::snprintf(vals, sizeof vals, "]: %.9g vs %.9g", static_cast<double>(o.first_reference),
                      static_cast<double>(o.first_candidate));
        s += vals;
    }
    return s;
}

// The layout's state after each step, gathered on its ranks; compared on the rank that gathers.
struct Checker {
    const std::vector<LogicalState>& reference;  // after step s at [s-1]
    LayoutResult& result;
    std::mutex mu;

    void compare_step(LogicalState&& got) {
        const i64 step = static_cast<i64>(got.history.size());
        const LogicalState& ref = reference.at(static_cast<size_t>(step - 1));
        std::vector<Comparison> cmp = compare_states(ref, got);
        std::lock_guard lk(mu);  // pipeline stages of other replicas are not gathering here
        result.steps = step;
        for (const Comparison& c : cmp) result.max_ulp = worse(result.max_ulp, c.max_ulp);
        if (result.first_step < 0)
            for (const Comparison& c : cmp)
                if (!c.equal()) {
                    if (result.first_step < 0) result.first_step = step, result.first = c;
                    result.differing.push_back(c);
                }
        result.final_step = std::move(cmp);
        last = std::move(got);
    }

    LogicalState last;  // the state after the last step compared
};

LogicalState gathered(const Config& cfg, std::vector<float>&& p, std::vector<float>&& m,
                      std::vector<float>&& v, const std::vector<StepMetrics>& history) {
    LogicalState s;
    s.table = ParamTable::build(cfg.model);
    s.params = std::move(p);
    s.m = std::move(m);
    s.v = std::move(v);
    s.history = history;
    return s;
}

// Runs layout config c to step `last` (of c's schedule) with ranks[world rank] as each rank's
// probe recorder.
void record_layout(const Config& c, std::vector<std::unique_ptr<ProbeRecorder>>& ranks, i64 last) {
    const Mesh mesh(make_layout(c));
    run_layout(
        c, {}, {}, {}, {},
        [&](Job& job) {
            const int r = mesh.rank_of(Coord{0, job.dp_rank(), job.tp_rank()});
            job.set_probes(ranks[static_cast<size_t>(r)].get());
            job.stop_after(last);
        },
        [&](PipelineJob& stage) {
            const int r = mesh.rank_of(Coord{stage.pp_rank(), stage.dp_rank(), stage.tp_rank()});
            stage.set_probes(ranks[static_cast<size_t>(r)].get());
            stage.stop_after(last);
        });
}

// One layout's run: `body` fills r; an exception that is not bad input makes the layout
// "error" (the others still run); the time and the progress report follow.
template <class Body>
LayoutResult run_one(const LayoutSpec& spec, void (*progress)(const LayoutResult&), Body&& body) {
    LayoutResult r;
    r.layout = spec.name;
    const auto t0 = Clock::now();
    try {
        body(r);
    } catch (const DataError&) {
        throw;  // a damaged input file (a golden trace): bad input, not a layout's failure
    } catch (const std::exception& e) {
        r.verdict = "error";
        r.error = e.what();
    }
    r.seconds = seconds_since(t0);
    if (progress) progress(r);
    return r;
}

// The first-divergence search (validate.h): probes on every op of steps s-1 and s.
void search_first_op(const Config& ref_cfg, const Config& c, LayoutResult& r) {
    if (c.layout.tp > 1 || c.layout.sequence_parallel) {
        r.first_op_note =
            "no op-level search for this layout yet: probes cover the single device, "
            "data and pipeline parallelism";
        return;
    }
    const i64 s = r.first_step;
    std::vector<std::string> patterns;
    for (i64 k = std::max<i64>(1, s - 1); k <= s; k++)
        patterns.push_back(std::to_string(k) + "/**");
    ProbeRecorder ref(patterns);
    {
        Job job(ref_cfg);
        job.set_probes(&ref);
        while (job.steps_done() < s) job.step();
    }
    const int n = c.layout.dp * c.layout.pp;
    std::vector<std::unique_ptr<ProbeRecorder>> ranks;
    for (int k = 0; k < n; k++) ranks.push_back(std::make_unique<ProbeRecorder>(patterns));
    record_layout(c, ranks, s);
    for (const std::string& name : ref.names()) {
        std::vector<i64> shape;
        const std::vector<float> want = ref.unshard(name, &shape);
        for (int k = 0; k < n; k++) {
            if (!ranks[static_cast<size_t>(k)]->has(name)) continue;
            const std::vector<float> got = ranks[static_cast<size_t>(k)]->overlay(name, want);
            Comparison cmp = compare(name, want, got, shape);
            if (cmp.equal()) continue;
            r.first_op_rank = k;
            r.first_op = std::move(cmp);
            return;
        }
    }
    r.first_op_note = "every probe of steps " + std::to_string(std::max<i64>(1, s - 1)) + ".." +
                      std::to_string(s) + " agrees: the difference is outside the probed ops";
}

LogicalState single_device(const Config& cfg, std::vector<LogicalState>* each_step) {
    Job job(cfg);
    while (job.steps_done() < cfg.train.steps) {
        job.step();
        if (each_step) {
            LogicalState s;
            s.absorb(job);
            each_step->push_back(std::move(s));
        }
    }
    LogicalState s;
    s.absorb(job);
    return s;
}

}  // namespace

LayoutSpec parse_layout(const std::string& item) {
    if (item.empty())
        throw ConfigError("an empty layout; write parts joined by 'x', e.g. dp2xtp2xpp2 or dp4xz3");
    LayoutSpec l;
    l.name = item;
    std::stringstream parts(item);
    std::string part;
    while (std::getline(parts, part, 'x')) {
        int n = 0;
        if (number_after(part, "dp", &n))
            l.dp = n;
        else if (number_after(part, "tp", &n))
            l.tp = n;
        else if (number_after(part, "pp", &n))
            l.pp = n;
        else if (number_after(part, "mb", &n))
            l.microbatches = n;
        else if (number_after(part, "z", &n))
            l.zero = n;
        else if (part == "sp")
            l.sequence_parallel = true;
        else
            throw ConfigError("layout \"" + item + "\": \"" + part +
                              "\" is not a layout part; join "
                              "dpN, tpN, ppN, zN (ZeRO stage), mbN (microbatches) and sp (sequence "
                              "parallelism) with 'x', e.g. dp2xtp2xpp2 or dp4xz3");
        if (n == 0 && part != "sp")
            throw ConfigError("layout \"" + item + "\": \"" + part + "\" must be at least 1");
    }
    return l;
}

std::vector<LayoutSpec> parse_layouts(const std::string& text) {
    std::vector<LayoutSpec> out;
    std::stringstream list(text);
    std::string item;
    try {
        while (std::getline(list, item, ',')) out.push_back(parse_layout(item));
    } catch (const ConfigError& e) {
        throw ConfigError("--layouts " + text + ": " + e.what());
    }
    if (out.empty())
        throw ConfigError("--layouts is empty; write e.g. --layouts dp2,tp2,pp2,dp2xtp2xpp2");
    return out;
}

Config with_layout(Config cfg, const LayoutSpec& l) {
    cfg.layout.dp = l.dp;
    cfg.layout.tp = l.tp;
    cfg.layout.pp = l.pp;
    if (l.zero >= 0) cfg.layout.zero = l.zero;
    if (l.microbatches >= 0) cfg.layout.microbatches = l.microbatches;
    if (l.sequence_parallel) cfg.layout.sequence_parallel = true;
    validate_config(cfg);
    make_layout(cfg);  // the mesh's checks: products, divisibility, pp <= layers, tree nodes
    return cfg;
}

ValidationReport validate_layouts(const Config& base, const std::vector<LayoutSpec>& layouts,
                                  i64 steps, void (*progress)(const LayoutResult&)) {
    Config cfg = base;
    cfg.train.steps = steps;
    cfg.output.run_file = false;
    cfg.output.export_llmc.clear();
    cfg.checkpoint = CheckpointConfig{};
    cfg.layout = LayoutConfig{.timeout_s = base.layout.timeout_s};
    const bool fast = base.numerics.mode == Mode::fast;

    ValidationReport rep;
    rep.job = base.source_name;
    rep.mode = fast ? "fast" : "bitwise";
    rep.steps = steps;

    // The reference: the bitwise single device, its state after every step.
    Config ref_cfg = cfg;
    ref_cfg.numerics.mode = Mode::bitwise;
    ref_cfg.fault = FaultConfig{};  // an injected fault is for the layouts under test
    ref_cfg.validate = ValidateConfig{};
    std::vector<LogicalState> reference;
    const auto t0 = Clock::now();
    single_device(ref_cfg, &reference);
    rep.reference_seconds = seconds_since(t0);
    // Fast mode: the alternates that size the reference's own rounding error (budget.h).
    std::vector<LogicalState> alternates;
    if (fast) {
        Config a = ref_cfg;
        a.numerics.mode = Mode::fast;
        alternates.push_back(single_device(a, nullptr));
        Config b = ref_cfg;
        b.numerics.block = ref_cfg.numerics.block * 2;
        alternates.push_back(single_device(b, nullptr));
    }

    for (const LayoutSpec& spec : layouts)
        rep.layouts.push_back(run_one(spec, progress, [&](LayoutResult& r) {
            Config c = with_layout(cfg, spec);
            if (fast) c.numerics.mode = Mode::fast;
            Checker check{reference, r, {}, {}};
            // Every rank gathers (collectives of the layout); one rank of the world compares.
            auto each_job = [&](Job& job) {
                std::vector<float> p, m, v;
                job.gather_full(&p, &m, &v);
                if (job.dp_rank() == 0 && job.tp_rank() == 0)
                    check.compare_step(
                        gathered(c, std::move(p), std::move(m), std::move(v), job.history()));
            };
            auto each_stage = [&](PipelineJob& stage) {
                std::vector<float> p, m, v;
                stage.gather_full(&p, &m, &v);
                if (stage.pp_rank() == 0 && stage.dp_rank() == 0 && stage.tp_rank() == 0)
                    check.compare_step(
                        gathered(c, std::move(p), std::move(m), std::move(v), stage.history()));
            };
            run_layout(c, {}, {}, each_job, each_stage);
            if (r.steps != steps)
                throw InternalError("the layout compared " + std::to_string(r.steps) + " of " +
                                    std::to_string(steps) + " steps");
            if (fast) {
                std::vector<const LogicalState*> alts;
                for (const LogicalState& a : alternates) alts.push_back(&a);
                const BudgetReport b = error_budget(reference.back(), alts, check.last);
                r.budget_ratio = b.max_ratio;
                r.budget_worst = b.worst;
                r.verdict = b.within ? "within budget" : "over budget";
            } else {
                r.verdict = r.first_step < 0 ? "match" : "diverged";
                if (r.first_step > 0) search_first_op(ref_cfg, c, r);
            }
        }));
    return rep;
}

void set_golden_result(LayoutResult& r, const GoldenResult& g, i64 steps) {
    r.steps = steps;
    r.max_ulp = g.max_ulp;
    if (g.first_order < 0) {
        r.verdict = "match";
        if (g.missing > 0) {  // a probe no rank recorded was not checked: not a match
            r.verdict = "error";
            r.error = std::to_string(g.missing) + " of the trace's " +
                      std::to_string(g.missing + g.probes) +
                      " probes were not recorded by this layout (probes cover the single device, "
                      "data and pipeline parallelism so far)";
        }
        return;
    }
    r.verdict = "diverged";
    r.first_step = std::stoll(g.first.name.substr(0, g.first.name.find('/')));
    r.first = g.first;
    r.differing = {g.first};
    r.first_op = g.first;
    r.first_op_rank = g.rank;
}

ValidationReport validate_golden(const Config& base, const std::vector<LayoutSpec>& layouts,
                                 const TraceReader& trace, void (*progress)(const LayoutResult&)) {
    const TraceInfo& t = trace.info();
    Config cfg = base;
    cfg.train.steps = parse_config(t.config_toml, trace.path()).train.steps;
    check_trace_config(t, cfg, trace.path());
    cfg.output.run_file = false;
    cfg.output.export_llmc.clear();
    cfg.checkpoint = CheckpointConfig{};
    ValidationReport rep;
    rep.job = base.source_name + " against " + trace.path();
    rep.mode = "bitwise";
    rep.steps = t.steps;
    for (const LayoutSpec& spec : layouts)
        rep.layouts.push_back(run_one(spec, progress, [&](LayoutResult& r) {
            Config c = with_layout(cfg, spec);
            const int n = c.layout.dp * c.layout.tp * c.layout.pp;
            std::vector<std::unique_ptr<ProbeRecorder>> recs;
            for (int k = 0; k < n; k++)
                recs.push_back(std::make_unique<ProbeRecorder>(t.patterns, t.stride));
            record_layout(c, recs, t.steps);  // the trace's steps of the trace's schedule
            std::vector<const ProbeRecorder*> view;
            for (const auto& rec : recs) view.push_back(rec.get());
            set_golden_result(r, compare_to_trace(trace, view), t.steps);
        }));
    return rep;
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
                      ulp_text(r.max_ulp).c_str());
        out += line;
        out += first_text(r);
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
        l["first_op_note"] = r.first_op_note;
        l["budget_ratio"] = r.budget_ratio < 0 ? json(nullptr) : json(r.budget_ratio);
        l["budget_worst"] = r.budget_worst;
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
        std::string first = first_text(r);
        std::replace(first.begin(), first.end(), '|', '/');
        md += "| " + r.layout + " | " + std::to_string(r.steps) + " | " + r.verdict + " | " +
              ulp_text(r.max_ulp) + " | " + first + " |\n";
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
            md += "First op that differs: `" + r.first_op.text() + "` on rank " +
                  std::to_string(r.first_op_rank) + ".\n\n";
        else if (!r.first_op_note.empty())
            md += "First op: " + r.first_op_note + ".\n\n";
        if (!r.differing.empty()) {
            md += "Tensors that differ at step " + std::to_string(r.first_step) + ":\n\n";
            for (const Comparison& c : r.differing) md += "- `" + c.text() + "`\n";
        }
    }
    return md;
}

}  // namespace px
