// Fitting achievable compute and link bandwidth to measured runs (calibrate.h): least squares of
// log(predicted / measured) step time, by golden-section search (each prediction is monotone in
// either factor).
#include "validators/plan/calibrate.h"

#include "core/base/config.h"
#include "core/base/error.h"
#include "core/io/runfile.h"
#include "validators/plan/plan.h"
#include "validators/plan/traffic.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>

namespace px::plan {

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

const RunRecords::Rows* metric(const RunRecords& r, const std::string& name) {
    for (const auto& [n, rows] : r.metrics)
        if (n == name) return &rows;
    return nullptr;
}

// The x in [lo, hi] (log scale) minimising f.
double golden(const std::function<double(double)>& f, double lo, double hi) {
    double a = std::log(lo), b = std::log(hi);
    const double g = (std::sqrt(5.0) - 1) / 2;
    double c = b - g * (b - a), d = a + g * (b - a);
    double fc = f(std::exp(c)), fd = f(std::exp(d));
    for (int i = 0; i < 80; i++) {
        if (fc < fd) {
            b = d, d = c, fd = fc;
            c = b - g * (b - a), fc = f(std::exp(c));
        } else {
            a = c, c = d, fc = fd;
            d = a + g * (b - a), fd = f(std::exp(d));
        }
    }
    return std::exp(0.5 * (a + b));
}

struct Run {
    Config cfg;
    RunFit fit;
};

double predicted(const Run& r, const ClusterSpec& c) { return predict(r.cfg, c).time.step; }

}  // namespace

ClusterSpec apply(const ClusterSpec& cluster, const Calibration& cal) {
    ClusterSpec c = cluster;
    c.achievable = cal.achievable;
    c.nvlink.gb_per_s *= cal.link_scale;
    c.ib.gb_per_s *= cal.link_scale;
    return c;
}

Calibration calibrate(const ClusterSpec& cluster, const std::vector<std::string>& run_files) {
    if (run_files.empty()) throw ConfigError("--calibrate: give at least one run file (.h5)");
    std::vector<Run> runs;
    bool communicated = false;
    for (const std::string& path : run_files) {
        const RunRecords rec = read_run_records(path);
        Run r{parse_config(rec.config_toml, path + " (its config)"), {}};
        r.fit.path = path;
        const RunRecords::Rows* ms = metric(rec, "step_ms");
        if (!ms || ms->values.empty())
            throw DataError(path + ": the run file has no step_ms rows: give the run file of a "
                                   "training run that took at least one step");
        std::vector<double> steps(ms->values.begin() + (ms->values.size() > 1 ? 1 : 0),
                                  ms->values.end());
        r.fit.steps = static_cast<int>(steps.size());
        r.fit.measured_s = median(steps) / 1e3;
        if (const RunRecords::Rows* cb = metric(rec, "comm_bytes"); cb && !cb->values.empty())
            r.fit.comm_bytes = median(cb->values);
        communicated = communicated || r.fit.comm_bytes > 0;
        for (const PlannedOp& op : step_traffic(r.cfg, Coord{}))
            r.fit.predicted_comm_bytes += op.calls * double(op.bytes().sent);
        const Candidate c = predict(r.cfg, cluster);
        r.fit.layout = c.label();
        r.fit.before_s = c.time.step;
        runs.push_back(std::move(r));
    }
    Calibration cal;
    cal.bandwidth = communicated && runs.size() >= 2;
    ClusterSpec c = cluster;
    const auto loss = [&](const ClusterSpec& s) {
        double e = 0;
        for (const Run& r : runs) {
            const double d = std::log(predicted(r, s) / r.fit.measured_s);
            e += d * d;
        }
        return e;
    };
    cal.achievable = cluster.achievable;
    for (int round = 0; round < (cal.bandwidth ? 6 : 1); round++) {
        cal.achievable = golden(
            [&](double a) {
                ClusterSpec s = apply(c, cal);
                s.achievable = a;
                return loss(s);
            },
            1e-4, 1e2);
        if (!cal.bandwidth) break;
        cal.link_scale = golden(
            [&](double k) {
                Calibration t = cal;
                t.link_scale = k;
                return loss(apply(c, t));
            },
            1e-4, 1e4);
    }
    const ClusterSpec fitted = apply(cluster, cal);
    for (Run& r : runs) {
        r.fit.after_s = predicted(r, fitted);
        cal.runs.push_back(r.fit);
    }
    return cal;
}

std::string text(const ClusterSpec& cluster, const Calibration& cal) {
    std::string s;
    char buf[512];
    std::snprintf(buf, sizeof buf, "calibrated %s on %zu run%s:\n", cluster.source.c_str(),
                  cal.runs.size(), cal.runs.size() == 1 ? "" : "s");
    s += buf;
    std::snprintf(buf, sizeof buf, "  [compute] achievable %.4g (was %.4g)%s\n", cal.achievable,
                  cluster.achievable,
                  cal.achievable > 1 ? ": above 1, the file's peak is below what was measured; "
                                       "raise its [compute] peak"
                                     : "");
    s += buf;
    if (cal.bandwidth) {
        std::snprintf(buf, sizeof buf,
                      "  links: bandwidth x %.4g (NVLink %.4g GB/s, IB %.4g GB/s before the "
                      "achievable fraction)\n",
                      cal.link_scale, cluster.nvlink.gb_per_s * cal.link_scale,
                      cluster.ib.gb_per_s * cal.link_scale);
    } else {
        std::snprintf(buf, sizeof buf,
                      "  links: kept as the file says (fitting them needs two or more runs, some "
                      "of which communicated)\n");
    }
    s += buf;
    for (const RunFit& r : cal.runs) {
        std::snprintf(buf, sizeof buf,
                      "  %s (%s, %d steps): measured %.4g s/step, predicted %.4g before, %.4g "
                      "after (x%.3f); comm bytes/step rank 0 measured %.0f, predicted %.0f\n",
                      r.path.c_str(), r.layout.c_str(), r.steps, r.measured_s, r.before_s,
                      r.after_s, r.after_s / r.measured_s, r.comm_bytes, r.predicted_comm_bytes);
        s += buf;
    }
    return s;
}

}  // namespace px::plan
