#include "validators/validate.h"

#include "core/base/error.h"
#include "core/train/job.h"
#include "core/train/memory.h"
#include "core/parallel/mesh.h"
#include "core/train/runner.h"
#include "core/io/state.h"
#include "validators/budget.h"
#include "core/train/probe_recorder.h"
#include "validators/trace.h"
#include "validators/validate_steps.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

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

// Runs layout config c to step `last` (of c's schedule) with ranks[world rank] as each rank's
// probe recorder, under the caller's decorators; `cancel` is asked after every step.
void record_layout(const Config& c, std::vector<std::unique_ptr<ProbeRecorder>>& ranks, i64 last,
                   const RunHooks& decorate, const Cancel& cancel) {
    const Mesh mesh(make_layout(c));
    RunHooks hooks;
    hooks.setup = [&](Job& job) {
        job.set_probes(ranks[static_cast<size_t>(world_rank(mesh, job))].get());
        job.stop_after(last);
    };
    run_layout(c, {}, chain(decorate, chain(hooks, cancel.hooks())));
}

// One layout's run: `body` fills r; an exception that is not bad input makes the layout
// "error" (the others still run); the time and the progress report follow. A cancellation is
// no layout's failure: it leaves. `seconds` is time the layout spent before (its turns in the
// lockstep).
template <class Body>
LayoutResult run_one(const LayoutSpec& spec, void (*progress)(const LayoutResult&), Body&& body,
                     double seconds = 0) {
    LayoutResult r;
    r.layout = spec.name;
    const auto t0 = Clock::now();
    try {
        body(r);
    } catch (const DataError&) {
        throw;  // a damaged input file (a golden trace): bad input, not a layout's failure
    } catch (const Cancelled&) {
        throw;
    } catch (const std::exception& e) {
        r.verdict = "error";
        r.error = e.what();
    }
    r.seconds = seconds + seconds_since(t0);
    if (progress) progress(r);
    return r;
}

int microbatches_of(const Config& c) {
    return c.layout.microbatches > 0 ? c.layout.microbatches
                                     : static_cast<int>(c.train.microbatches);
}

std::string coord_text(const Mesh& mesh, int rank) {
    const Coord k = mesh.coord_of(rank);
    return "pp" + std::to_string(k.pp) + " dp" + std::to_string(k.dp) +
           (mesh.layout().cp > 1 ? " cp" + std::to_string(k.cp) : std::string()) + " tp" +
           std::to_string(k.tp);
}

// The first-divergence search (validate.h): probes on every op of steps s-1 and s.
void search_first_op(const Config& ref_cfg, const Config& c, LayoutResult& r,
                     const RunHooks& decorate, const Cancel& cancel) {
    const i64 s = r.first_step;
    std::vector<std::string> patterns;
    for (i64 k = std::max<i64>(1, s - 1); k <= s; k++)
        patterns.push_back(std::to_string(k) + "/**");
    // The reference cut into as many microbatches as the layout has in all: its microbatch
    // gradients ("mgrad") are then the token-tree nodes the layout's ranks reduce.
    Config rc = ref_cfg;
    rc.train.microbatches = c.layout.dp * microbatches_of(c);
    ProbeRecorder ref(patterns);
    {
        Job job(rc);
        job.set_probes(&ref);
        while (job.steps_done() < s) {
            job.step();
            cancel.check();
        }
    }
    const Mesh mesh(make_layout(c));
    const int n = c.layout.dp * c.layout.tp * c.layout.pp * c.layout.cp;
    std::vector<std::unique_ptr<ProbeRecorder>> ranks;
    for (int k = 0; k < n; k++) ranks.push_back(std::make_unique<ProbeRecorder>(patterns));
    record_layout(c, ranks, s, decorate, cancel);
    for (const std::string& name : ref.names()) {
        std::vector<i64> shape;
        const std::vector<float> want = ref.unshard(name, &shape);
        for (int k = 0; k < n; k++) {
            if (!ranks[static_cast<size_t>(k)]->has(name)) continue;
            const std::vector<float> got = ranks[static_cast<size_t>(k)]->overlay(name, want);
            Comparison cmp = compare(name, want, got, shape);
            if (cmp.equal()) continue;
            if (r.first_op_ranks.empty()) {
                r.first_op_rank = k;
                r.first_op = std::move(cmp);
                r.first_op_where = coord_text(mesh, k);
            }
            r.first_op_ranks.push_back(k);
        }
        if (!r.first_op_ranks.empty()) return;
    }
    r.first_op_note = "every probe of steps " + std::to_string(std::max<i64>(1, s - 1)) + ".." +
                      std::to_string(s) + " agrees: the difference is outside the probed ops";
}

// cfg on the single device for its train.steps, in its turns (`turn`; alone without a pacer):
// `before` ahead of each step, `after` once it is done (each may be empty); `cancel` is asked
// after every step. Returns the state after the last step.
LogicalState single_device(const Config& cfg, const Cancel& cancel, ProbeRecorder* probes = nullptr,
                           Turn turn = {}, const std::function<void()>& before = {},
                           const std::function<void(Job&)>& after = {}) {
    Job job(cfg);
    job.set_probes(probes);
    while (job.steps_done() < cfg.train.steps) {
        if (turn.pacer) turn.pacer->wait_turn(turn.run, job.steps_done() + 1);
        if (before) before();
        job.step();
        cancel.check();
        if (after) after(job);
        if (turn.pacer) turn.pacer->finished(turn.run, job.steps_done());
    }
    LogicalState s;
    absorb(s, job);
    return s;
}

}  // namespace

std::vector<LayoutSpec> single_axis_parts(const LayoutSpec& l) {
    std::vector<LayoutSpec> parts;
    auto suffix = [](const char* key, int v) {
        return v >= 0 ? std::string("x") + key + std::to_string(v) : std::string();
    };
    if (l.dp > 1) {
        LayoutSpec p;
        p.dp = l.dp;
        p.zero = l.zero;
        p.microbatches = l.microbatches;
        p.name = "dp" + std::to_string(l.dp) + suffix("z", l.zero) + suffix("mb", l.microbatches);
        parts.push_back(p);
    }
    if (l.tp > 1) {
        LayoutSpec p;
        p.tp = l.tp;
        p.zero = 0;
        p.sequence_parallel = l.sequence_parallel;
        p.name = "tp" + std::to_string(l.tp) + (l.sequence_parallel ? "xsp" : "");
        parts.push_back(p);
    }
    if (l.pp > 1) {
        LayoutSpec p;
        p.pp = l.pp;
        p.zero = 0;
        p.microbatches = l.microbatches;
        p.name = "pp" + std::to_string(l.pp) + suffix("mb", l.microbatches);
        parts.push_back(p);
    }
    if (l.cp > 1) {
        LayoutSpec p;
        p.cp = l.cp;
        p.zero = 0;
        p.ulysses = l.ulysses;
        p.name = "cp" + std::to_string(l.cp) + (l.ulysses ? "xulysses" : "");
        parts.push_back(p);
    }
    if (l.ep > 1) {
        LayoutSpec p;
        p.ep = l.ep;
        p.dp = l.ep;
        p.zero = 0;
        p.name = "ep" + std::to_string(l.ep);
        parts.push_back(p);
    }
    if (parts.size() < 2) parts.clear();
    return parts;
}

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
        else if (number_after(part, "cp", &n))
            l.cp = n;
        else if (number_after(part, "ep", &n))
            l.ep = n;
        else if (number_after(part, "mb", &n))
            l.microbatches = n;
        else if (number_after(part, "z", &n))
            l.zero = n;
        else if (part == "sp")
            l.sequence_parallel = true;
        else if (part == "ulysses")
            l.ulysses = true;
        else
            throw ConfigError("layout \"" + item + "\": \"" + part +
                              "\" is not a layout part; join "
                              "dpN, tpN, ppN, cpN, epN (experts over the dp ranks), zN (ZeRO "
                              "stage), mbN (microbatches), sp (sequence parallelism) and ulysses "
                              "(cp by all-to-all over heads) with 'x', e.g. dp2xtp2xpp2, dp4xz3, "
                              "cp2xtp2 or ep2xdp4");
        // z0: ZeRO off, whatever the config says
        if (n == 0 && part != "sp" && part != "ulysses" && part != "z0")
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
    cfg.layout.cp = l.cp;
    cfg.layout.ep = l.ep;
    if (l.ep > 1 && l.dp == 1) cfg.layout.dp = l.ep;  // "ep2": the experts over dp2
    if (l.ulysses) cfg.layout.cp_method = "ulysses";
    if (l.zero >= 0) cfg.layout.zero = l.zero;
    if (l.microbatches >= 0) cfg.layout.microbatches = l.microbatches;
    if (l.sequence_parallel) cfg.layout.sequence_parallel = true;
    validate_config(cfg);
    check_memory(cfg, MemoryScope::process);  // before the mesh's tables are sized by it
    make_layout(cfg);  // the mesh's checks: products, divisibility, pp <= layers, tree nodes
    return cfg;
}

ValidationReport validate_layouts(const Config& base, const std::vector<LayoutSpec>& layouts,
                                  i64 steps, void (*progress)(const LayoutResult&),
                                  const RunHooks& decorate, const ValidateWatch& watch,
                                  const Cancel& cancel) {
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
    // Fast mode: the alternates that size the reference's own rounding error (budget.h), and in
    // a precision coarser than fp32 the same job in fp32 (the finer run, last).
    std::vector<std::unique_ptr<Alternate>> alternates;
    const bool per_precision = fast && precision_unit(ref_cfg.precision) > kFp32Unit;
    if (fast) {
        Config a = ref_cfg;
        a.numerics.mode = Mode::fast;
        Config b = ref_cfg;
        b.numerics.block = ref_cfg.numerics.block * 2;
        for (const Config& c : {a, b}) {
            alternates.push_back(std::make_unique<Alternate>());
            alternates.back()->cfg = c;
        }
        if (per_precision) {
            alternates.push_back(std::make_unique<Alternate>());
            alternates.back()->cfg = ref_cfg;
            alternates.back()->cfg.precision = PrecisionConfig{};  // fp32, no fp8, no scaling
        }
    }
    Budgets budgets;
    for (const auto& a : alternates) budgets.alternates.push_back(a.get());
    if (per_precision) {
        budgets.finer = budgets.alternates.back();
        budgets.alternates.pop_back();
    }

    // Lockstep (validate.h): the turns go reference, alternates, layouts, step by step. Each
    // alternate and each layout runs on a thread of its own (a layout's ranks on theirs), the
    // reference on this one.
    const int first_layout = 1 + static_cast<int>(alternates.size());
    Pacer pacer(first_layout + static_cast<int>(layouts.size()));
    struct LayoutRun {
        LayoutResult result;
        Config config;
        LogicalState last;
        std::exception_ptr error;
    };
    std::vector<LayoutRun> runs(layouts.size());
    ReferenceRun ref;
    ref.states.reserve(static_cast<size_t>(steps));  // read by the layouts while it grows
    std::vector<LogicalState>& reference = ref.states;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < alternates.size(); i++)
        threads.emplace_back([&, i] {
            Alternate& a = *alternates[i];
            const int k = 1 + static_cast<int>(i);
            try {
                // a.state is set in its turns (the layouts read it in theirs), never after.
                single_device(
                    a.cfg, cancel, &a.grads, Turn{&pacer, k}, [&] { a.grads.clear(); },
                    [&](Job& job) {
                        a.state = LogicalState{};
                        absorb(a.state, job);
                    });
            } catch (...) {
                a.error = std::current_exception();
            }
            pacer.retire(k);
        });
    for (size_t i = 0; i < layouts.size(); i++)
        threads.emplace_back([&, i] {
            LayoutRun& run = runs[i];
            const int k = first_layout + static_cast<int>(i);
            run.result.layout = layouts[i].name;
            try {
                run.config = with_layout(cfg, layouts[i]);
                if (fast) run.config.numerics.mode = Mode::fast;
                run.last = lockstep(run.config, ref, run.result, steps, decorate, cancel, &watch,
                                    fast ? &budgets : nullptr, Turn{&pacer, k});
            } catch (...) {
                run.error = std::current_exception();
            }
            pacer.retire(k);
        });
    try {
        single_device(ref_cfg, cancel, &ref.probes, Turn{&pacer, 0}, {}, [&](Job& job) {
            if (watch.reference_step) watch.reference_step(job.steps_done());
            LogicalState s;
            absorb(s, job);
            reference.push_back(std::move(s));
        });
    } catch (...) {  // a watcher that closed, a cancellation: every run stops at its next turn
        pacer.abort("the reference stopped");
        for (std::thread& t : threads) t.join();
        throw;
    }
    pacer.retire(0);
    for (std::thread& t : threads) t.join();
    for (const auto& a : alternates)
        if (a->error) std::rethrow_exception(a->error);
    rep.reference_seconds = pacer.seconds(0);
    std::vector<const LogicalState*> alts;
    for (const Alternate* a : budgets.alternates) alts.push_back(&a->state);

    // The verdicts, one layout after the other, in the order given.
    for (size_t i = 0; i < layouts.size(); i++) {
        const LayoutSpec& spec = layouts[i];
        LayoutRun& run = runs[i];
        const double turns = pacer.seconds(first_layout + static_cast<int>(i));
        rep.layouts.push_back(run_one(
            spec, progress,
            [&](LayoutResult& r) {
                r = std::move(run.result);
                if (run.error) std::rethrow_exception(run.error);
                const Config& c = run.config;
                if (fast) {
                    const BudgetReport b =
                        error_budget(reference.back(), alts, run.last,
                                     budgets.finer != nullptr ? &budgets.finer->state : nullptr);
                    r.budget_ratio = b.max_ratio;
                    r.budget_worst = b.worst;
                    // Replicas run the same kernels on the same inputs: twins that disagree are
                    // a divergence whatever the budget says.
                    r.verdict = r.replica_step >= 0 ? "diverged"
                                : b.within          ? "within budget"
                                                    : "over budget";
                    return;
                }
                r.verdict = r.first_step < 0 ? "match" : "diverged";
                if (r.first_step < 0) return;
                try {  // the divergence stands even if the search cannot run
                    search_first_op(ref_cfg, c, r, decorate, cancel);
                } catch (const DataError&) {
                    throw;
                } catch (const Cancelled&) {
                    throw;
                } catch (const std::exception& e) {
                    r.first_op_rank = -1;
                    r.first_op_ranks.clear();
                    r.first_op_note =
                        std::string("the first-divergence search failed: ") + e.what();
                }
                // Which parallelism: each single-axis part alone, up to the first differing
                // step. A part that cannot run (a fault's rank beyond its world) says so and
                // the others still run.
                for (const LayoutSpec& part : single_axis_parts(spec)) {
                    LayoutResult p;
                    try {
                        lockstep(with_layout(cfg, part), ref, p, r.first_step, decorate, cancel);
                        r.axes.push_back(
                            {part.name, p.first_step < 0 ? "match" : "diverged", p.first_step, ""});
                    } catch (const Cancelled&) {
                        throw;
                    } catch (const std::exception& e) {
                        r.axes.push_back({part.name, "error", -1, e.what()});
                    }
                }
            },
            turns));
    }
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
                      " probes were not recorded by this layout";
        } else if (g.partial > 0) {  // elements no rank held were not checked: not a match
            r.verdict = "error";
            r.error = std::to_string(g.partial) + " of the trace's probes (first: " +
                      g.partial_probe +
                      ") have elements that no rank's pieces hold, so they were not compared";
        }
        return;
    }
    r.verdict = "diverged";
    r.first_step = std::stoll(g.first.name.substr(0, g.first.name.find('/')));
    r.first = g.first;
    r.differing = {g.first};
    r.first_op = g.first;
    r.first_op_rank = g.rank;
    r.first_op_ranks = {g.rank};
    r.first_rank = g.rank;
    r.first_ranks = {g.rank};
}

ValidationReport validate_golden(const Config& base, const std::vector<LayoutSpec>& layouts,
                                 const TraceReader& trace, void (*progress)(const LayoutResult&),
                                 const Cancel& cancel) {
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
            const int n = c.layout.dp * c.layout.tp * c.layout.pp * c.layout.cp;
            std::vector<std::unique_ptr<ProbeRecorder>> recs;
            for (int k = 0; k < n; k++) {
                recs.push_back(std::make_unique<ProbeRecorder>(t.patterns, t.stride));
                recs.back()->exclude({"*/mgrad/**"});
            }
            record_layout(c, recs, t.steps, {}, cancel);  // the trace's steps and schedule
            std::vector<const ProbeRecorder*> view;
            for (const auto& rec : recs) view.push_back(rec.get());
            set_golden_result(r, compare_to_trace(trace, view), t.steps);
        }));
    return rep;
}

}  // namespace px
