#include "validators/validate.h"

#include "core/base/error.h"
#include "core/train/job.h"
#include "core/train/memory.h"
#include "core/parallel/mesh.h"
#include "core/train/runner.h"
#include "core/io/state.h"
#include "validators/budget.h"
#include "validators/probes.h"
#include "validators/trace.h"

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

std::int64_t worse(std::int64_t a, std::int64_t b) {
    if (a == kNoUlp || b == kNoUlp) return kNoUlp;
    return std::max(a, b);
}

// Lockstep (validate.h): the runs take turns by step. Run k may begin step s once every run has
// finished step s - 1 and every run before it in the order has finished step s, so exactly one
// run computes at a time and step s of every run comes before step s + 1 of any.
class Pacer {
public:
    explicit Pacer(int runs)
        : done_(static_cast<size_t>(runs), 0), seconds_(static_cast<size_t>(runs), 0.0) {}

    // Blocks until run k's turn at `step`. Ends by throwing when the turns were aborted, or when
    // `failed` (polled while waiting: the run's own job failed elsewhere, a rank that threw or
    // a collective that timed out) returns a message.
    void wait_turn(int k, i64 step, const std::function<std::string()>& failed = {}) {
        std::unique_lock lk(mu_);
        while (true) {
            if (!aborted_.empty()) throw Error(aborted_);
            if (turn(k, step)) return;
            if (failed) {
                const std::string why = failed();
                if (!why.empty()) throw Error(why);
            }
            cv_.wait_for(lk, std::chrono::milliseconds(20));
        }
    }
    // Run k finished `step` (every rank of it): the time since the last turn ended is its.
    void finished(int k, i64 step) {
        std::lock_guard lk(mu_);
        done_[static_cast<size_t>(k)] = step;
        const auto now = Clock::now();
        seconds_[static_cast<size_t>(k)] += std::chrono::duration<double>(now - last_).count();
        last_ = now;
        cv_.notify_all();
    }
    // Run k ended (its last step, or a failure): nobody waits for it any more.
    void retire(int k) {
        std::lock_guard lk(mu_);
        done_[static_cast<size_t>(k)] = std::numeric_limits<i64>::max();
        last_ = Clock::now();
        cv_.notify_all();
    }
    void abort(const std::string& why) {
        std::lock_guard lk(mu_);
        aborted_ = why;
        cv_.notify_all();
    }
    double seconds(int k) const {
        std::lock_guard lk(mu_);
        return seconds_[static_cast<size_t>(k)];
    }

private:
    bool turn(int k, i64 step) const {
        for (size_t j = 0; j < done_.size(); j++)
            if (done_[j] < (static_cast<int>(j) < k ? step : step - 1)) return false;
        return true;
    }
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<i64> done_;  // the last step each run finished; i64 max: ended
    std::vector<double> seconds_;
    Clock::time_point last_ = Clock::now();
    std::string aborted_;
};

// A run's place in the turns; a null pacer: the run goes alone.
struct Turn {
    Pacer* pacer = nullptr;
    int run = 0;
};

// Fast mode: a single-device run that sizes the reference's own rounding error (budget.h), taking
// its turns beside the layouts: after its step s, its state and reduced gradients of step s.
struct Alternate {
    Config cfg;
    LogicalState state;
    ProbeRecorder grads{std::vector<std::string>{"*/grad/**"}};
    std::exception_ptr error;
};

// What a layout's step is judged against in fast mode: the alternates and the finer run (budget.h
// error_budget's), each at the same step as the layout.
struct Budgets {
    std::vector<const Alternate*> alternates;
    const Alternate* finer = nullptr;
};

std::vector<double> widened(const std::vector<float>& v) {
    return std::vector<double>(v.begin(), v.end());
}

// One reduced gradient's error / budget at its step (tensor_budget over the whole tensor); -1
// when an alternate did not record it.
double grad_ratio(const std::string& name, const std::vector<float>& want,
                  const std::vector<float>& got, const Budgets& b) {
    std::vector<std::vector<double>> alts;
    for (const Alternate* a : b.alternates) {
        if (!a->grads.has(name)) return -1;
        alts.push_back(widened(a->grads.unshard(name)));
    }
    std::vector<double> fine;
    if (b.finer != nullptr) {
        if (!b.finer->grads.has(name)) return -1;
        fine = widened(b.finer->grads.unshard(name));
    }
    return tensor_budget(name, widened(want), widened(got), alts, fine).ratio;
}

// Each state comparison's error / budget (error_budget of the layout's state against the
// alternates' at the same step), in cmp's order; -1 for a comparison without a row.
std::vector<double> state_ratios(const LogicalState& ref, const LogicalState& got, const Budgets& b,
                                 const std::vector<Comparison>& cmp) {
    std::vector<const LogicalState*> alts;
    for (const Alternate* a : b.alternates) alts.push_back(&a->state);
    const BudgetReport rep =
        error_budget(ref, alts, got, b.finer != nullptr ? &b.finer->state : nullptr);
    std::map<std::string, double> by;
    for (const TensorBudget& t : rep.rows) {
        const std::string w = "weights/";  // compare_states calls them "params/"
        by[t.name.compare(0, w.size(), w) == 0 ? "params/" + t.name.substr(w.size()) : t.name] =
            t.ratio;
    }
    std::vector<double> out;
    for (const Comparison& c : cmp) {
        auto it = by.find(c.name);
        out.push_back(it == by.end() ? -1 : it->second);
    }
    return out;
}

// The layout's state after each step, gathered on every one of its ranks and compared there:
// a rank whose state departs from the others' (a replica that disagrees) is seen at the step it
// happens. The earliest step wins, then the lowest world rank.
struct Checker {
    const std::vector<LogicalState>& reference;  // after step s at [s-1]
    LayoutResult& result;
    const ValidateWatch* watch;  // null: nobody watches
    const Budgets* budgets;      // fast mode's per-step budgets; null: none
    i64 steps;                   // the grid's columns
    std::mutex mu;
    LogicalState last;  // world rank 0's state after the last step compared

    // grads: this rank's reduced gradients of the step, compared already (they come first: the
    // update reads them); grad_ratios: their error / budget (fast mode), else empty.
    void compare_step(LogicalState&& got, int rank, std::vector<Comparison> grads,
                      std::vector<double> grad_ratios) {
        const i64 step = static_cast<i64>(got.history.size());
        const LogicalState& ref = reference.at(static_cast<size_t>(step - 1));
        std::vector<Comparison> states = compare_states(ref, got);
        std::vector<double> ratios;
        if (budgets != nullptr) {
            ratios = std::move(grad_ratios);
            for (double q : state_ratios(ref, got, *budgets, states)) ratios.push_back(q);
        }
        std::vector<Comparison> cmp = std::move(grads);
        for (Comparison& c : states) cmp.push_back(std::move(c));
        if (watch && watch->layout_step) watch->layout_step(result.layout, step, rank, cmp, ratios);
        std::vector<Comparison> differing;
        for (const Comparison& c : cmp)
            if (!c.equal()) differing.push_back(c);
        std::lock_guard lk(mu);  // ranks are threads
        note_grid(step, cmp, ratios);
        result.steps = std::max(result.steps, step);
        for (const Comparison& c : cmp) result.max_ulp = worse(result.max_ulp, c.max_ulp);
        const bool earlier = result.first_step < 0 || step < result.first_step ||
                             (step == result.first_step && rank < result.first_rank);
        if (!differing.empty() && earlier) {
            result.first_step = step;
            result.first_rank = rank;
            result.first = differing.front();
            result.differing = std::move(differing);
        }
        if (rank == 0) {
            result.final_step = std::move(cmp);
            last = std::move(got);
        }
    }

    // Under mu: the step's comparisons into the grid, worst over the ranks.
    void note_grid(i64 step, const std::vector<Comparison>& cmp,
                   const std::vector<double>& ratios) {
        if (step < 1 || step > steps) return;
        const size_t col = static_cast<size_t>(step - 1);
        for (size_t i = 0; i < cmp.size(); i++) {
            auto it =
                std::find(result.grid_tensors.begin(), result.grid_tensors.end(), cmp[i].name);
            const size_t row = static_cast<size_t>(it - result.grid_tensors.begin());
            if (it == result.grid_tensors.end()) {
                result.grid_tensors.push_back(cmp[i].name);
                result.grid_ulp.emplace_back(static_cast<size_t>(steps), kGridNotRun);
                if (budgets != nullptr)
                    result.grid_ratio.emplace_back(static_cast<size_t>(steps), -1.0);
            }
            std::int64_t& u = result.grid_ulp[row][col];
            u = u == kGridNotRun ? cmp[i].max_ulp : worse(u, cmp[i].max_ulp);
            if (budgets != nullptr && i < ratios.size())
                result.grid_ratio[row][col] = std::max(result.grid_ratio[row][col], ratios[i]);
        }
    }
};

// The grid's rows in the reference's order (the reduced gradients as the reference recorded
// them, then compare_states' order), whatever order the ranks' threads arrived in.
void order_grid(LayoutResult& r, const ProbeRecorder& ref_grads, const LogicalState& ref) {
    std::vector<std::string> order;
    for (const std::string& name : ref_grads.names())
        if (name.compare(0, 2, "1/") == 0) order.push_back(name.substr(2));
    for (const Comparison& c : compare_states(ref, ref)) order.push_back(c.name);
    auto rank_of = [&](const std::string& name) {
        return static_cast<size_t>(std::find(order.begin(), order.end(), name) - order.begin());
    };
    std::vector<size_t> idx(r.grid_tensors.size());
    for (size_t i = 0; i < idx.size(); i++) idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
        return rank_of(r.grid_tensors[a]) < rank_of(r.grid_tensors[b]);
    });
    LayoutResult sorted;
    for (size_t i : idx) {
        sorted.grid_tensors.push_back(std::move(r.grid_tensors[i]));
        sorted.grid_ulp.push_back(std::move(r.grid_ulp[i]));
        if (i < r.grid_ratio.size()) sorted.grid_ratio.push_back(std::move(r.grid_ratio[i]));
    }
    r.grid_tensors = std::move(sorted.grid_tensors);
    r.grid_ulp = std::move(sorted.grid_ulp);
    r.grid_ratio = std::move(sorted.grid_ratio);
}

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

// The world rank of a rank's job.
int world_rank(const Mesh& mesh, const Job& job) {
    return mesh.rank_of(Coord{job.pp_rank(), job.dp_rank(), job.tp_rank(), job.cp_rank()});
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

// This rank's pieces of the reduced gradients of `step` (rec) against the reference's
// (ref_grads), each named "grad/<layer>/param/<tensor>"; rec is emptied for the next step. With
// budgets (fast mode), each one's error / budget goes to `ratios`.
std::vector<Comparison> compare_grads(const ProbeRecorder& ref_grads, ProbeRecorder& rec, i64 step,
                                      const Budgets* budgets, std::vector<double>* ratios) {
    std::vector<Comparison> out;
    const std::string prefix = std::to_string(step) + "/";
    for (const std::string& name : ref_grads.names()) {
        if (name.compare(0, prefix.size(), prefix) != 0 || !rec.has(name)) continue;
        std::vector<i64> shape;
        const std::vector<float> want = ref_grads.unshard(name, &shape);
        const std::vector<float> got = rec.overlay(name, want);
        if (budgets != nullptr) ratios->push_back(grad_ratio(name, want, got, *budgets));
        out.push_back(compare(name.substr(prefix.size()), want, got, shape));
    }
    rec.clear();
    return out;
}

// The ranks of one layout arriving at the end of a step: the last one ends the layout's turn.
struct Arrivals {
    Turn turn;
    int ranks = 0;
    std::mutex mu;
    int arrived = 0;
    void arrive(i64 step) {
        bool last = false;
        {
            std::lock_guard lk(mu);
            last = ++arrived == ranks;
            if (last) arrived = 0;
        }
        if (last) turn.pacer->finished(turn.run, step);
    }
};

// Runs layout config c (its schedule of train.steps), stopping after `steps`; after every step
// each rank gathers the logical state and compares it, and its pieces of the reduced gradients,
// with the reference (Checker) into r. With a pacer, each step waits for its turn (the reference
// and the alternates have then finished that step: reference[step - 1] and the budgets' states
// are there). `cancel` is asked after every step. Returns world rank 0's last state.
LogicalState lockstep(const Config& c, const std::vector<LogicalState>& reference,
                      const ProbeRecorder& ref_grads, LayoutResult& r, i64 steps,
                      const RunHooks& decorate, const Cancel& cancel,
                      const ValidateWatch* watch = nullptr, const Budgets* budgets = nullptr,
                      Turn turn = {}) {
    const Mesh mesh(make_layout(c));
    Checker check{reference, r, watch, budgets, steps, {}, {}};
    const int n = c.layout.dp * c.layout.tp * c.layout.pp * c.layout.cp;
    Arrivals arrivals{turn, n, {}, 0};
    std::vector<std::unique_ptr<ProbeRecorder>> grads;
    for (int k = 0; k < n; k++)
        grads.push_back(std::make_unique<ProbeRecorder>(std::vector<std::string>{"*/grad/**"}));
    // A rank waiting for its turn learns from its world that another rank of its job failed.
    auto failure_of = [](Job& job) {
        return
            [&job] { return job.groups().world ? job.groups().world->failure() : std::string(); };
    };
    RunHooks hooks;
    hooks.setup = [&](Job& job) {
        job.stop_after(steps);
        job.set_probes(grads[static_cast<size_t>(world_rank(mesh, job))].get());
        if (turn.pacer) turn.pacer->wait_turn(turn.run, 1, failure_of(job));
    };
    hooks.each_step = [&](Job& job) {
        const int rank = world_rank(mesh, job);
        const i64 step = job.steps_done();
        std::vector<float> p, m, v;
        job.gather_full(&p, &m, &v);
        std::vector<double> ratios;
        std::vector<Comparison> g =
            compare_grads(ref_grads, *grads[static_cast<size_t>(rank)], step, budgets, &ratios);
        check.compare_step(gathered(c, std::move(p), std::move(m), std::move(v), job.history()),
                           rank, std::move(g), std::move(ratios));
        if (!turn.pacer) return;
        arrivals.arrive(step);
        if (step < steps) turn.pacer->wait_turn(turn.run, step + 1, failure_of(job));
    };
    run_layout(c, {}, chain(decorate, chain(hooks, cancel.hooks())));
    if (r.steps != steps)
        throw InternalError("the layout compared " + std::to_string(r.steps) + " of " +
                            std::to_string(steps) + " steps");
    order_grid(r, ref_grads, reference.front());
    return std::move(check.last);
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
    std::vector<LogicalState> reference;
    reference.reserve(static_cast<size_t>(steps));  // read by the layouts while it grows
    ProbeRecorder ref_grads({"*/grad/**"});         // the reduced gradients of every step
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
                run.last = lockstep(run.config, reference, ref_grads, run.result, steps, decorate,
                                    cancel, &watch, fast ? &budgets : nullptr, Turn{&pacer, k});
            } catch (...) {
                run.error = std::current_exception();
            }
            pacer.retire(k);
        });
    try {
        single_device(ref_cfg, cancel, &ref_grads, Turn{&pacer, 0}, {}, [&](Job& job) {
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
                    r.verdict = b.within ? "within budget" : "over budget";
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
                        lockstep(with_layout(cfg, part), reference, ref_grads, p, r.first_step,
                                 decorate, cancel);
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
