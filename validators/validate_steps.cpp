// One layout's run in parallax validate's lockstep, every rank's state compared with the
// reference after every step (validate_steps.h), and the turns the runs take.
#include "validators/validate_steps.h"

#include "core/base/error.h"
#include "core/parallel/mesh.h"
#include "core/train/job.h"
#include "validators/budget.h"
#include "validators/pieces.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>

namespace px {

// ---- the turns -------------------------------------------------------------------------------

Pacer::Pacer(int runs)
    : done_(static_cast<size_t>(runs), 0), seconds_(static_cast<size_t>(runs), 0.0) {}

void Pacer::wait_turn(int k, i64 step, const std::function<std::string()>& failed) {
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

void Pacer::finished(int k, i64 step) {
    std::lock_guard lk(mu_);
    done_[static_cast<size_t>(k)] = step;
    const auto now = Clock::now();
    seconds_[static_cast<size_t>(k)] += std::chrono::duration<double>(now - last_).count();
    last_ = now;
    cv_.notify_all();
}

void Pacer::retire(int k) {
    std::lock_guard lk(mu_);
    done_[static_cast<size_t>(k)] = std::numeric_limits<i64>::max();
    last_ = Clock::now();
    cv_.notify_all();
}

void Pacer::abort(const std::string& why) {
    std::lock_guard lk(mu_);
    aborted_ = why;
    cv_.notify_all();
}

double Pacer::seconds(int k) const {
    std::lock_guard lk(mu_);
    return seconds_[static_cast<size_t>(k)];
}

bool Pacer::turn(int k, i64 step) const {
    for (size_t j = 0; j < done_.size(); j++)
        if (done_[j] < (static_cast<int>(j) < k ? step : step - 1)) return false;
    return true;
}

const std::vector<std::string> kReferencePatterns = {"*/grad/**", "*/optim/-/fp8/*",
                                                     "*/optim/-/loss_scaler/*"};

ReferenceRun::ReferenceRun() : probes(kReferencePatterns) {}

namespace {

std::vector<double> widened(std::span<const float> v) {
    return std::vector<double>(v.begin(), v.end());
}

// One reduced gradient's error / budget at its step (tensor_budget over the whole tensor); -1
// when an alternate did not record it.
double grad_ratio(const std::string& name, std::span<const float> want,
                  std::span<const float> got, const Budgets& b) {
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

// A probe's logical tensor in a single-device recorder: its one piece where it covers the
// tensor (no copy), else put together in `storage`.
std::span<const float> reference_tensor(const ProbeRecorder& rec, const std::string& name,
                                        std::vector<i64>* shape, std::vector<float>& storage) {
    *shape = rec.shape(name);
    i64 n = 1;
    for (i64 d : *shape) n *= d;
    const std::vector<ProbeRecorder::PieceView> ps = rec.pieces(name);
    if (ps.size() == 1 && ps.front().slab->numel() == n) return {ps.front().data, size_t(n)};
    storage = rec.unshard(name, shape);
    return storage;
}

// One comparison of a step over the ranks: the tensor as every rank holds it.
struct Item {
    std::string name;  // as the report names it: "grad/1/param/mlp.c_fc.weight", "params/wte"
    PieceCheck check;
    i64 numel = 0;       // of the logical tensor
    double ratio = -1;   // fast mode: the assembled tensor's error / budget
};

// The layout's ranks after every step, compared with the reference once all have finished it
// (arrive). Steps are compared in order: the rank that compares step s arrives at s + 1 only
// after it.
class Checker {
public:
    Checker(const Config& c, const ReferenceRun& ref, LayoutResult& result, const ValidateWatch* w,
            const Budgets* budgets, i64 steps, int ranks)
        : ref_(ref), result_(result), watch_(w), budgets_(budgets), steps_(steps),
          table_(ParamTable::build(c.model)), probes_(static_cast<size_t>(ranks)),
          holdings_(static_cast<size_t>(ranks)) {
        for (auto& p : probes_) {
            p = std::make_unique<StepProbes>(
                std::vector<std::string>{"*/grad/**", "*/optim/**"});
        }
        if (budgets_) last_.allocate(c.model);
    }

    // Before rank `rank`'s first step.
    void attach(Job& job, int rank) {
        holdings_[static_cast<size_t>(rank)] = std::make_unique<Holdings>(job);
        job.set_probes(probes_[static_cast<size_t>(rank)].get());
    }

    // Rank `rank` finished `step`: true when it was the last of the step's ranks (its pieces
    // have then been compared).
    bool arrive(int rank, i64 step, const std::vector<StepMetrics>& history) {
        std::vector<std::vector<StepMetrics>> hist;
        {
            std::lock_guard lk(mu_);
            Pending& p = pending_[step];
            if (p.history.empty()) p.history.resize(probes_.size());
            p.history[static_cast<size_t>(rank)] = history;
            if (++p.arrived < static_cast<int>(probes_.size())) return false;
            hist = std::move(p.history);
            pending_.erase(step);
        }
        compare_step(step, hist);
        return true;
    }

    i64 steps_compared() const { return compared_; }
    LogicalState take_last() { return std::move(last_); }

private:
    struct Pending {
        int arrived = 0;
        std::vector<std::vector<StepMetrics>> history;  // per world rank: after the step
    };

    void compare_step(i64 step, const std::vector<std::vector<StepMetrics>>& history);
    void state_items(i64 step, const std::vector<const ProbeRecorder*>& view,
                     std::vector<Item>& items);
    void metric_items(i64 step, const std::vector<std::vector<StepMetrics>>& history,
                      std::vector<Item>& items) const;
    void state_budgets(i64 step, std::vector<Item>& items) const;
    void record(i64 step, const std::vector<Item>& items);

    const ReferenceRun& ref_;
    LayoutResult& result_;
    const ValidateWatch* watch_;
    const Budgets* budgets_;
    i64 steps_;
    ParamTable table_;
    std::vector<std::unique_ptr<StepProbes>> probes_;  // per world rank
    std::vector<std::unique_ptr<Holdings>> holdings_;  // per world rank
    std::mutex mu_;
    std::map<i64, Pending> pending_;
    i64 compared_ = 0;
    LogicalState last_;  // fast mode: the ranks' state after the last step, put together
};

// The check's coverage: no element of a tensor is left without a rank to compare it.
void require_covered(const Item& it) {
    if (it.check.holders.empty())
        throw InternalError("no rank of the layout offered a piece of " + it.name +
                            ": the comparison would leave it out");
    if (it.check.uncovered > 0)
        throw InternalError(std::to_string(it.check.uncovered) + " of the " +
                            std::to_string(it.numel) + " elements of " + it.name +
                            " (first: flat " + std::to_string(it.check.first_uncovered) +
                            ") are held by no rank's pieces: the comparison would leave them out");
    if (it.check.fault_rank >= 0)
        throw InternalError("world rank " + std::to_string(it.check.fault_rank) + "'s captures of " +
                            it.name + " disagree with each other: " + it.check.fault);
}

void Checker::compare_step(i64 step, const std::vector<std::vector<StepMetrics>>& history) {
    const size_t n = probes_.size();
    std::vector<std::unique_ptr<ProbeRecorder>> recs(n);
    std::vector<const ProbeRecorder*> view(n);
    for (size_t k = 0; k < n; k++) {
        recs[k] = probes_[k]->take(step);
        view[k] = recs[k].get();
        const std::string missing =
            missing_pieces(*holdings_[k], *recs[k], step, static_cast<int>(k));
        if (!missing.empty()) throw InternalError(missing);
    }
    const bool fast = budgets_ != nullptr;
    std::vector<Item> items;
    // The reduced gradients, in the reference's order.
    const std::string grads = std::to_string(step) + "/grad/";
    std::vector<float> storage, got;
    for (const std::string& probe : ref_.probes.names()) {
        if (probe.compare(0, grads.size(), grads) != 0) continue;
        std::vector<i64> shape;
        const std::span<const float> want = reference_tensor(ref_.probes, probe, &shape, storage);
        // "3/grad/1/param/mlp.c_fc.weight" -> "grad/1/param/mlp.c_fc.weight"
        Item it{probe.substr(grads.size() - std::string("grad/").size()), {},
                static_cast<i64>(want.size())};
        it.check = check_pieces(it.name, probe, want, shape, view, fast);
        require_covered(it);
        if (fast) {
            got.assign(want.begin(), want.end());
            assemble(got, probe, view);
            it.ratio = grad_ratio(probe, want, got, *budgets_);
        }
        items.push_back(std::move(it));
    }
    if (fast && !history.empty()) last_.history = history.front();  // the budgets' metrics
    state_items(step, view, items);
    metric_items(step, history, items);
    if (fast) state_budgets(step, items);
    for (size_t k = 0; k < n; k++) probes_[k]->recycle(std::move(recs[k]));
    record(step, items);
}

// Every parameter's weights, then every first moment, then every second moment (compare_states'
// order), then fp8's scales and
// histories and the loss scale; in fast mode the state is put together for its budgets.
void Checker::state_items(i64 step, const std::vector<const ProbeRecorder*>& view,
                          std::vector<Item>& items) {
    const LogicalState& want = ref_.states.at(static_cast<size_t>(step - 1));
    const bool fast = budgets_ != nullptr;
    const std::string at = std::to_string(step) + "/optim/";
    const struct {
        const char* prefix;
        const char* op;
        std::vector<float> LogicalState::*field;
    } kinds[] = {{"params/", "param", &LogicalState::params},
                 {"adam/m/", "adam.m", &LogicalState::m},
                 {"adam/v/", "adam.v", &LogicalState::v}};
    for (const auto& k : kinds) {
        for (const TableEntry& e : table_.entries) {
            const std::string layer = e.layer < 0 ? "-" : std::to_string(e.layer);
            const std::string probe =
                at + layer + "/" + k.op + "/" + e.short_name;
            const std::span<const float> ref(
                (want.*k.field).data() + e.offset, static_cast<size_t>(e.numel()));
            Item it{k.prefix + e.name, {}, e.numel()};
            it.check = check_pieces(it.name, probe, ref, e.shape(), view, fast);
            require_covered(it);
            if (fast) {
                std::span<float> out((last_.*k.field).data() + e.offset,
                                     static_cast<size_t>(e.numel()));
                std::copy(ref.begin(), ref.end(), out.begin());
                assemble(out, probe, view);
            }
            items.push_back(std::move(it));
        }
    }
    // The scaling state the next step starts from (whole on every rank), as the reference has it.
    const std::string scaling = at + "-/";
    std::vector<float> storage;
    for (const std::string& probe : ref_.probes.names()) {
        if (probe.compare(0, scaling.size(), scaling) != 0) continue;
        std::vector<i64> shape;
        const std::span<const float> ref = reference_tensor(ref_.probes, probe, &shape, storage);
        Item it{probe.substr(scaling.size()), {}, static_cast<i64>(ref.size())};
        it.check = check_pieces(it.name, probe, ref, shape, view, fast);
        require_covered(it);
        items.push_back(std::move(it));
    }
}

// The loss and gradient norm of every step so far, as each rank's history holds them.
void Checker::metric_items(i64 step, const std::vector<std::vector<StepMetrics>>& history,
                           std::vector<Item>& items) const {
    const std::vector<StepMetrics>& want = ref_.states.at(static_cast<size_t>(step - 1)).history;
    const struct {
        const char* name;
        double StepMetrics::*field;
    } metrics[] = {{"steps/loss", &StepMetrics::loss}, {"steps/grad_norm", &StepMetrics::grad_norm}};
    std::vector<double> r;
    for (const auto& mt : metrics) {
        r.clear();
        for (const StepMetrics& s : want) r.push_back(s.*mt.field);
        Item it{mt.name, {}, static_cast<i64>(r.size())};
        for (size_t k = 0; k < history.size(); k++) {
            std::vector<double> c;
            for (const StepMetrics& s : history[k]) c.push_back(s.*mt.field);
            if (c.size() != r.size())
                throw InternalError("world rank " + std::to_string(k) + " has " +
                                    std::to_string(c.size()) + " steps of history after step " +
                                    std::to_string(step));
            RankPieces h{static_cast<int>(k),
                         compare(mt.name, std::span<const double>(r), std::span<const double>(c),
                                 {static_cast<i64>(r.size())})};
            if (!h.cmp.equal()) it.check.differing.push_back(h.rank);
            it.check.holders.push_back(std::move(h));
        }
        items.push_back(std::move(it));
    }
}

// Fast mode: the state put together from the ranks' pieces against the alternates' at the same
// step (error_budget), each tensor's error / budget on its item.
void Checker::state_budgets(i64 step, std::vector<Item>& items) const {
    std::vector<const LogicalState*> alts;
    for (const Alternate* a : budgets_->alternates) alts.push_back(&a->state);
    const BudgetReport rep =
        error_budget(ref_.states.at(static_cast<size_t>(step - 1)), alts, last_,
                     budgets_->finer != nullptr ? &budgets_->finer->state : nullptr);
    std::map<std::string, double> by;
    for (const TensorBudget& t : rep.rows) {
        const std::string w = "weights/";  // the budget's name for compare_states' "params/"
        by[t.name.compare(0, w.size(), w) == 0 ? "params/" + t.name.substr(w.size()) : t.name] =
            t.ratio;
    }
    for (Item& it : items) {
        auto b = by.find(it.name);
        if (b != by.end() && it.ratio < 0) it.ratio = b->second;
    }
}

// The step's items into the result: the grid (worst over the ranks), the first divergence (the
// first item, in order, with a rank that differs: the lowest such rank), the watcher.
void Checker::record(i64 step, const std::vector<Item>& items) {
    std::lock_guard lk(mu_);
    LayoutResult& r = result_;
    if (watch_ && watch_->layout_step)
        for (size_t k = 0; k < probes_.size(); k++) {
            std::vector<Comparison> cmp;
            std::vector<double> ratios;
            for (const Item& it : items)
                for (const RankPieces& h : it.check.holders)
                    if (h.rank == static_cast<int>(k)) {
                        cmp.push_back(h.cmp);
                        if (budgets_) ratios.push_back(it.ratio);
                    }
            watch_->layout_step(r.layout, step, static_cast<int>(k), cmp, ratios);
        }
    std::vector<Comparison> final_step, differing;
    const Item* first = nullptr;
    for (const Item& it : items) {
        const RankPieces* d = it.check.first_differing();
        Comparison merged;
        if (d != nullptr) {
            merged = d->cmp;
            differing.push_back(d->cmp);
            if (first == nullptr) first = &it;
        } else {
            merged.name = it.name;
            merged.shape = it.check.holders.front().cmp.shape;
            merged.bits = it.check.holders.front().cmp.bits;
            merged.count = it.numel;
        }
        merged.max_ulp = it.check.worst_ulp();
        r.max_ulp = worse_ulp(r.max_ulp, merged.max_ulp);
        final_step.push_back(std::move(merged));
        if (!it.check.odd_replicas.empty() && r.replica_step < 0) {
            r.replica_step = step;
            r.replica_ranks = it.check.odd_replicas;
            r.replica_tensor = it.name;
            r.replica_twin = it.check.odd_twin;
        }
        // The grid: a row per item, made at its first step.
        if (step < 1 || step > steps_) continue;
        auto row = std::find(r.grid_tensors.begin(), r.grid_tensors.end(), it.name);
        if (row == r.grid_tensors.end()) {
            r.grid_tensors.push_back(it.name);
            r.grid_ulp.emplace_back(static_cast<size_t>(steps_), kGridNotRun);
            if (budgets_) r.grid_ratio.emplace_back(static_cast<size_t>(steps_), -1.0);
            row = r.grid_tensors.end() - 1;
        }
        const size_t i = static_cast<size_t>(row - r.grid_tensors.begin());
        r.grid_ulp[i][static_cast<size_t>(step - 1)] = it.check.worst_ulp();
        if (budgets_) r.grid_ratio[i][static_cast<size_t>(step - 1)] = it.ratio;
    }
    if (first != nullptr && r.first_step < 0) {
        const RankPieces* d = first->check.first_differing();
        r.first_step = step;
        r.first_rank = d->rank;
        r.first = d->cmp;
        r.first_ranks = first->check.differing;
        r.differing = std::move(differing);
    }
    r.final_step = std::move(final_step);
    r.steps = std::max(r.steps, step);
    compared_ = std::max(compared_, step);
}

}  // namespace

int world_rank(const Mesh& mesh, const Job& job) {
    return mesh.rank_of(Coord{job.pp_rank(), job.dp_rank(), job.tp_rank(), job.cp_rank()});
}

LogicalState lockstep(const Config& c, const ReferenceRun& ref, LayoutResult& r, i64 steps,
                      const RunHooks& decorate, const Cancel& cancel, const ValidateWatch* watch,
                      const Budgets* budgets, Turn turn) {
    const Mesh mesh(make_layout(c));
    const int n = c.layout.dp * c.layout.tp * c.layout.pp * c.layout.cp;
    Checker check(c, ref, r, watch, budgets, steps, n);
    // A rank waiting for its turn learns from its world that another rank of its job failed.
    auto failure_of = [](Job& job) {
        return
            [&job] { return job.groups().world ? job.groups().world->failure() : std::string(); };
    };
    RunHooks hooks;
    hooks.setup = [&](Job& job) {
        job.stop_after(steps);
        check.attach(job, world_rank(mesh, job));
        if (turn.pacer) turn.pacer->wait_turn(turn.run, 1, failure_of(job));
    };
    hooks.each_step = [&](Job& job) {
        const i64 step = job.steps_done();
        const bool last = check.arrive(world_rank(mesh, job), step, job.history());
        if (!turn.pacer) return;
        if (last) turn.pacer->finished(turn.run, step);  // the layout's turn ends
        if (step < steps) turn.pacer->wait_turn(turn.run, step + 1, failure_of(job));
    };
    run_layout(c, {}, chain(decorate, chain(hooks, cancel.hooks())));
    if (check.steps_compared() != steps)
        throw InternalError("the layout compared " + std::to_string(check.steps_compared()) +
                            " of " + std::to_string(steps) + " steps");
    return check.take_last();
}

}  // namespace px
