// The fast-mode error budget; the derivation is in budget.h.
#include "validators/budget.h"

#include "core/base/error.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace px {

double budget_multiplier() { return kBudgetQ * std::sqrt(kBudgetK * kBudgetK + 1.0); }

double precision_multiplier() {
    return kBudgetQ * (kBudgetK - 1.0);
}

double unit_roundoff(DType t) {
    switch (t) {
        case DType::f32:
            return std::ldexp(1.0, -24);
        case DType::bf16:
            return std::ldexp(1.0, -8);
        case DType::f16:
            return std::ldexp(1.0, -11);
        case DType::e4m3:
            return std::ldexp(1.0, -4);
        case DType::e5m2:
            return std::ldexp(1.0, -3);
    }
    return std::ldexp(1.0, -24);
}

double precision_unit(const PrecisionConfig& pc) {
    if (pc.fp8 == "delayed") return unit_roundoff(DType::e5m2);
    if (pc.fp8 == "block") return unit_roundoff(DType::e4m3);
    if (pc.activations == "bf16") return unit_roundoff(DType::bf16);
    if (pc.activations == "fp16") return unit_roundoff(DType::f16);
    return unit_roundoff(DType::f32);
}

namespace {

// ‖a − b‖₂ over n elements (fp64 accumulation: a measurement, not training).
double dist(const double* a, const double* b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = a[i] - b[i];
        s += d * d;
    }
    return std::sqrt(s);
}

std::vector<double> as_double(const float* p, size_t n) { return std::vector<double>(p, p + n); }

std::vector<double> series(const LogicalState& s, double StepMetrics::*field) {
    std::vector<double> out;
    for (const StepMetrics& m : s.history) out.push_back(m.*field);
    return out;
}

void check_same_shape(const LogicalState& ref, const LogicalState& other, const char* what) {
    if (other.params.size() != ref.params.size() || other.m.size() != ref.m.size() ||
        other.v.size() != ref.v.size() || other.history.size() != ref.history.size() ||
        other.table.entries.size() != ref.table.entries.size())
        throw InternalError(fmt::format(
            "error_budget: the {} is not a run of the reference's model and steps ({} vs {} "
            "weights, {} vs {} steps)",
            what, other.params.size(), ref.params.size(), other.history.size(),
            ref.history.size()));
}

}  // namespace

TensorBudget tensor_budget(const std::string& name, const std::vector<double>& r,
                           const std::vector<double>& c,
                           const std::vector<std::vector<double>>& alts,
                           const std::vector<double>& fine) {
    if (alts.empty())
        throw InternalError("tensor_budget needs at least one alternate ordering of " + name);
    const size_t n = r.size();
    bool same = c.size() == n && (fine.empty() || fine.size() == n);
    for (const auto& a : alts) same = same && a.size() == n;
    if (!same) throw InternalError("tensor_budget: the runs' " + name + " differ in size");
    TensorBudget t;
    t.name = name;
    t.error = dist(c.data(), r.data(), n);
    double s2 = 0;
    for (const auto& a : alts) {
        const double d = dist(a.data(), r.data(), n);
        s2 += d * d;
    }
    const std::vector<double> zero(n, 0.0);
    const double floor = kFp32Unit * dist(r.data(), zero.data(), n);
    t.sigma = std::max(std::sqrt(s2 / (2.0 * static_cast<double>(alts.size()))), floor);
    if (!fine.empty()) t.sigma_precision = dist(fine.data(), r.data(), n);
    t.budget = std::max(budget_multiplier() * t.sigma, precision_multiplier() * t.sigma_precision);
    t.ratio = t.budget > 0 ? t.error / t.budget : (t.error > 0 ? INFINITY : 0.0);
    return t;
}

BudgetReport error_budget(const LogicalState& reference,
                          const std::vector<const LogicalState*>& alternates,
                          const LogicalState& candidate, const LogicalState* finer) {
    if (alternates.empty())
        throw InternalError("error_budget needs at least one alternate ordering of the reference");
    check_same_shape(reference, candidate, "candidate");
    for (const LogicalState* a : alternates) check_same_shape(reference, *a, "alternate");
    if (finer != nullptr) check_same_shape(reference, *finer, "finer run");

    BudgetReport rep;
    rep.per_precision = finer != nullptr;
    auto row = [&](const std::string& name, const std::vector<double>& r,
                   const std::vector<double>& c, const std::vector<std::vector<double>>& alts,
                   const std::vector<double>& fine) {
        rep.rows.push_back(tensor_budget(name, r, c, alts, fine));
    };

    const struct {
        const char* prefix;
        std::vector<float> LogicalState::*field;
    } arrays[] = {{"weights/", &LogicalState::params},
                  {"adam/m/", &LogicalState::m},
                  {"adam/v/", &LogicalState::v}};
    for (const auto& arr : arrays) {
        for (const TableEntry& e : reference.table.entries) {
            const size_t off = static_cast<size_t>(e.offset), n = static_cast<size_t>(e.numel());
            auto take = [&](const LogicalState& s) { return as_double((s.*arr.field).data() + off, n); };
            std::vector<std::vector<double>> alts;
            for (const LogicalState* a : alternates) alts.push_back(take(*a));
            row(arr.prefix + e.name, take(reference), take(candidate), alts,
                finer != nullptr ? take(*finer) : std::vector<double>());
        }
    }
    const struct {
        const char* name;
        double StepMetrics::*field;
    } metrics[] = {{"steps/loss", &StepMetrics::loss}, {"steps/grad_norm", &StepMetrics::grad_norm}};
    for (const auto& mt : metrics) {
        std::vector<std::vector<double>> alts;
        for (const LogicalState* a : alternates) alts.push_back(series(*a, mt.field));
        // The series are fp32 values carried in doubles; their floor is fp32's unit too.
        row(mt.name, series(reference, mt.field), series(candidate, mt.field), alts,
            finer != nullptr ? series(*finer, mt.field) : std::vector<double>());
    }

    rep.within = true;
    for (const TensorBudget& t : rep.rows) {
        rep.within = rep.within && t.within();
        if (t.ratio >= rep.max_ratio) {
            rep.max_ratio = t.ratio;
            rep.worst = t.name;
        }
    }
    return rep;
}

std::string BudgetReport::text() const {
    std::vector<const TensorBudget*> order;
    for (const TensorBudget& t : rows) order.push_back(&t);
    std::stable_sort(order.begin(), order.end(),
                     [](const TensorBudget* a, const TensorBudget* b) { return a->ratio > b->ratio; });
    std::string out = fmt::format("{:<28} {:>12} {:>12} {:>12} {:>12} {:>8}\n", "tensor", "error",
                                  "sigma", "sigma_prec", "budget", "ratio");
    for (const TensorBudget* t : order)
        out += fmt::format("{:<28} {:>12.4e} {:>12.4e} {:>12.4e} {:>12.4e} {:>8.3f}{}\n", t->name,
                           t->error, t->sigma, t->sigma_precision, t->budget, t->ratio,
                           t->within() ? "" : "  OVER");
    if (per_precision)
        out += fmt::format(
            "verdict: {} (max ratio {:.3f} at {}; budget = max({:.2f} sigma, {:.2f} "
            "sigma_prec), sigma_prec against the fp32 run)\n",
            within ? "within budget" : "OUT OF BUDGET", max_ratio, worst, budget_multiplier(),
            precision_multiplier());
    else
        out += fmt::format("verdict: {} (max ratio {:.3f} at {}; budget = {:.2f} sigma)\n",
                           within ? "within budget" : "OUT OF BUDGET", max_ratio, worst,
                           budget_multiplier());
    return out;
}

}  // namespace px
