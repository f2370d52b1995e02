#include "views/layout_check.h"

#include "views/run_files.h"
#include "views/trace_view.h"
#include "core/base/error.h"
#include "validators/trace.h"
#include "validators/trace_compare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

namespace px::views {

namespace {

std::uint32_t rgba(int r, int g, int b) {
    return 0xFF000000u | (static_cast<std::uint32_t>(b) << 16) |
           (static_cast<std::uint32_t>(g) << 8) | static_cast<std::uint32_t>(r);
}

std::string summary_of(const LayoutResult& r) {
    ValidationReport one;
    one.layouts.push_back(r);
    // The table's row, as parallax validate prints it (header line dropped).
    const std::string t = one.table();
    const size_t nl = t.find('\n');
    std::string row = nl == std::string::npos ? t : t.substr(nl + 1);
    while (!row.empty() && (row.back() == '\n' || row.back() == ' ')) row.pop_back();
    return row;
}

}  // namespace

LayoutCheck::~LayoutCheck() {
    cancel();
}

void LayoutCheck::cancel() {
    std::vector<std::thread> threads;
    {
        std::lock_guard lk(mu_);
        if (run_) run_->cancel = true;
        threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
}

bool LayoutCheck::busy() const {
    return busy_.load();
}

CheckView LayoutCheck::view() const {
    std::lock_guard lk(mu_);
    return v_;
}

bool LayoutCheck::wait(double timeout_s) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (busy_.load()) {
        if (std::chrono::steady_clock::now() > until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
}

void LayoutCheck::begin_run(const std::shared_ptr<Run>& run, const std::string& mode, i64 steps,
                            const std::vector<LayoutSpec>& specs) {
    if (run_) run_->cancel = true;  // it ends at its next step, on its own thread
    run->id = ++runs_;
    run_ = run;
    v_ = CheckView{};
    v_.running = true;
    v_.mode = mode;
    v_.steps = steps;
    for (const LayoutSpec& s : specs) {
        LayoutGrid g;
        g.name = s.name;
        v_.layouts.push_back(std::move(g));
    }
    v_.version = ++version_;
    busy_ = true;
}

void LayoutCheck::start(const Config& cfg, const std::string& layouts, i64 steps,
                        const RunHooks& decorate) {
    const std::vector<LayoutSpec> specs = parse_layouts(layouts);
    for (const LayoutSpec& s : specs) with_layout(cfg, s);  // each checked before anything runs
    auto run = std::make_shared<Run>();
    {
        std::lock_guard lk(mu_);
        begin_run(run, mode_name(cfg.numerics.mode), steps, specs);
    }
    std::thread t([this, run, cfg, specs, steps, decorate] {
        ValidateWatch watch;
        watch.reference_step = [this, run](i64 step) {
            std::lock_guard lk(mu_);
            if (run_ != run) return;
            v_.reference_steps = step;
            v_.version = ++version_;
        };
        watch.layout_step = [this, run](const std::string& layout, i64 step, int rank,
                                        const std::vector<Comparison>& cmp,
                                        const std::vector<double>& ratios) {
            std::lock_guard lk(mu_);
            if (run_ == run) on_step(layout, step, rank, cmp, ratios);
        };
        ValidationReport rep;
        std::string error;
        try {
            // A cancelled check leaves by Cancelled at its next step (its results are dropped).
            const Cancel cancel{[run] { return run->cancel.load(); }};
            rep = validate_layouts(cfg, specs, steps, nullptr, decorate, watch, cancel);
        } catch (const std::exception& e) {
            error = e.what();
        }
        std::lock_guard lk(mu_);
        if (run_ != run) return;  // a newer check replaced this one
        for (size_t i = 0; i < rep.layouts.size() && i < v_.layouts.size(); i++) {
            v_.layouts[i].result = rep.layouts[i];
            v_.layouts[i].finished = true;
            v_.layouts[i].summary = summary_of(rep.layouts[i]);
        }
        v_.error = error;
        v_.running = false;
        v_.version = ++version_;
        busy_ = false;
    });
    std::lock_guard lk(mu_);
    threads_.push_back(std::move(t));
}

void LayoutCheck::start_golden(const std::string& trace_path, const std::string& layouts) {
    auto trace = std::make_shared<TraceReader>(trace_path);  // DataError: not a trace
    Config cfg = parse_config(trace->info().config_toml, trace_path);
    const std::vector<LayoutSpec> specs = parse_layouts(layouts);
    for (const LayoutSpec& s : specs) with_layout(cfg, s);
    check_trace_config(trace->info(), cfg, trace_path);
    auto run = std::make_shared<Run>();
    {
        std::lock_guard lk(mu_);
        begin_run(run, "golden trace", trace->info().steps, specs);
    }
    std::thread t([this, run, cfg, specs, trace, trace_path] {
        CheckView done;
        std::string error;
        try {
            ValidationReport rep = validate_golden(cfg, specs, *trace);
            rep.mode = "golden trace " + trace_path;
            done = view_of_report(rep);
        } catch (const std::exception& e) {
            error = e.what();
        }
        std::lock_guard lk(mu_);
        if (run_ != run) return;
        if (error.empty()) {
            const std::uint64_t version = ++version_;
            v_ = std::move(done);
            v_.version = version;
        } else {
            v_.error = error;
            v_.version = ++version_;
        }
        v_.running = false;
        busy_ = false;
    });
    std::lock_guard lk(mu_);
    threads_.push_back(std::move(t));
}

void LayoutCheck::start_compare(const std::string& reference_path, const std::string& run_path) {
    auto ref = std::make_shared<TraceReader>(reference_path);  // DataError: not a trace
    auto cand = std::make_shared<TraceReader>(run_path);
    auto run = std::make_shared<Run>();
    {
        std::lock_guard lk(mu_);
        begin_run(run, "compare", 0, {});
        v_.header = "comparing " + run_path + " against " + reference_path + " op by op";
    }
    std::thread t([this, run, ref, cand] {
        CheckView done;
        std::string error;
        try {
            // A cancelled comparison leaves by Cancelled at its next probe (dropped below).
            const Cancel cancel{[run] { return run->cancel.load(); }};
            done = check_from_comparison(compare_traces(*ref, *cand, cancel));
        } catch (const std::exception& e) {
            error = e.what();
        }
        std::lock_guard lk(mu_);
        if (run_ != run) return;
        if (error.empty()) {
            v_ = std::move(done);
        } else {
            v_.error = error;
        }
        v_.running = false;
        v_.version = ++version_;
        busy_ = false;
    });
    std::lock_guard lk(mu_);
    threads_.push_back(std::move(t));
}

void LayoutCheck::on_step(const std::string& layout, i64 step, int rank,
                          const std::vector<Comparison>& cmp, const std::vector<double>& ratios) {
    LayoutGrid* g = nullptr;
    for (LayoutGrid& l : v_.layouts)
        if (l.name == layout && !l.finished) g = &l;
    if (!g) return;
    const size_t col = static_cast<size_t>(step - 1);
    for (size_t i = 0; i < cmp.size(); i++) {
        const Comparison& c = cmp[i];
        auto it = std::find(g->tensors.begin(), g->tensors.end(), c.name);
        size_t row = static_cast<size_t>(it - g->tensors.begin());
        if (it == g->tensors.end()) {
            g->tensors.push_back(c.name);
            g->cells.emplace_back();
        }
        std::vector<CheckCell>& line = g->cells[row];
        if (line.size() < static_cast<size_t>(v_.steps)) line.resize(static_cast<size_t>(v_.steps));
        if (col >= line.size()) continue;
        CheckCell& cell = line[col];
        cell.done = true;
        cell.max_ulp = worse_ulp(cell.max_ulp, c.max_ulp);
        if (i < ratios.size()) cell.ratio = std::max(cell.ratio, ratios[i]);
        if (!c.equal() && (cell.rank < 0 || rank < cell.rank)) {
            cell.rank = rank;
            cell.differing = c.differing;
            cell.first = c.first;
            cell.reference = c.first_reference;
            cell.candidate = c.first_candidate;
        }
        if (c.equal() && cell.rank < 0) {
            cell.first = -1;
            cell.differing = 0;
        }
    }
    g->steps_done = std::max(g->steps_done, step);
    v_.version = ++version_;
}

std::uint32_t ulp_colour(const CheckCell& c) {
    if (!c.done) return rgba(60, 60, 66);
    if (c.max_ulp == kNoUlp) return rgba(230, 40, 230);
    if (c.rank < 0) return rgba(30, 110, 60);
    // log2 of the distance over 0..20: orange to red.
    const double t = std::clamp(
        std::log2(static_cast<double>(std::max<std::int64_t>(c.max_ulp, 1))) / 20.0, 0.0, 1.0);
    return rgba(255, static_cast<int>(110 * (1 - t)), static_cast<int>(40 * (1 - t)));
}

std::uint32_t budget_colour(const CheckCell& c) {
    if (!c.done || c.max_ulp == kNoUlp || c.rank < 0 || c.ratio < 0) return ulp_colour(c);
    if (c.ratio <= 1) {  // log10 of the ratio over -2..0: green to yellow-green
        const double t = std::clamp((std::log10(std::max(c.ratio, 1e-2)) + 2) / 2, 0.0, 1.0);
        return rgba(static_cast<int>(40 + 150 * t), static_cast<int>(150 + 60 * t),
                    static_cast<int>(70 - 30 * t));
    }
    // log10 of the ratio over 0..2: orange to red.
    const double t = std::clamp(std::log10(c.ratio) / 2, 0.0, 1.0);
    return rgba(255, static_cast<int>(110 * (1 - t)), static_cast<int>(40 * (1 - t)));
}

std::uint32_t cell_colour(const CheckCell& c, const std::string& mode) {
    if (mode == "trace") return c.done ? rgba(70, 120, 190) : rgba(60, 60, 66);
    return mode == "fast" || mode == "compare" ? budget_colour(c) : ulp_colour(c);
}

}  // namespace px::views
