// The gradient check's report rows and tables (gradcheck.h): text, JSON and the verdicts.
#include "validators/gradcheck.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace px::gradcheck {

namespace {

std::string num(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g", x);
    return b;
}

// One row as JSON (nlohmann writes a non-finite number as null).
nlohmann::ordered_json row_json(const GradcheckRow& r) {
    return {{"op", r.op},
            {"tensor", r.tensor},
            {"kind", r.kind},
            {"size", r.size},
            {"checked", r.checked},
            {"failing", r.failing},
            {"reference_failing", r.reference_failing},
            {"ratio", r.ratio},
            {"worst", r.worst},
            {"max_error", r.max_error},
            {"bound", r.bound},
            {"got", r.got},
            {"expect", r.expect},
            {"pass", r.pass()}};
}

}  // namespace

void GradcheckRow::add(i64 index, double err, double err_bound, double value, double fp64) {
    checked++;
    if (!(err <= err_bound)) failing++;
    const double r = err_bound > 0 ? err / err_bound : (err > 0 ? INFINITY : 0.0);
    if (worst < 0 || r > ratio || (std::isnan(r) && !std::isnan(ratio))) {
        ratio = r;
        worst = index;
        max_error = err;
        bound = err_bound;
        got = value;
        expect = fp64;
    }
}

std::string GradcheckRow::text() const {
    std::string s = op;
    s += " ";
    s += tensor;
    s += " (";
    s += kind;
    s += "): ";
    s += std::to_string(checked);
    s += " of ";
    s += std::to_string(size);
    s += " elements, worst error ";
    s += num(max_error);
    s += " vs bound ";
    s += num(bound);
    s += " at [";
    s += std::to_string(worst);
    s += "] (got ";
    s += num(got);
    s += ", fp64 ";
    s += num(expect);
    s += ")";
    if (pass()) {
        s += ": pass";
    } else {
        s += ": FAIL";
        if (failing > 0) {
            s += ", ";
            s += std::to_string(failing);
            s += " elements outside the bound";
        }
        if (reference_failing > 0) {
            s += ", the fp64 backward disagrees with the differences at ";
            s += std::to_string(reference_failing);
            s += " elements (a bug in the reference)";
        }
    }
    return s;
}

std::string GradcheckRow::to_json() const {
    return row_json(*this).dump(2);
}

bool GradcheckReport::pass() const {
    return std::all_of(rows.begin(), rows.end(), [](const GradcheckRow& r) { return r.pass(); });
}

std::string GradcheckReport::table() const {
    std::string s;
    char line[320];
    // error and bound: at the element with the largest error / bound (ratio), "at".
    std::snprintf(line, sizeof line, "%-13s %-28s %-8s %9s %10s %10s %8s %8s  %s\n", "op", "tensor",
                  "kind", "elements", "error", "bound", "ratio", "at", "verdict");
    s += line;
    i64 failed = 0;
    for (const GradcheckRow& r : rows) {
        std::snprintf(line, sizeof line, "%-13s %-28s %-8s %9lld %10.3e %10.3e %8.2g %8lld  %s\n",
                      r.op.c_str(), r.tensor.c_str(), r.kind.c_str(), (long long)r.checked,
                      r.max_error, r.bound, r.ratio, (long long)r.worst,
                      r.pass() ? "pass" : "FAIL");
        s += line;
        if (!r.pass()) failed++;
    }
    for (const GradcheckRow& r : rows)
        if (!r.pass()) {
            s += "  ";
            s += r.text();
            s += "\n";
        }
    if (pass()) {
        s += "all ";
        s += std::to_string(rows.size());
        s += " checks pass\n";
    } else {
        s += std::to_string(failed);
        s += " of ";
        s += std::to_string(rows.size());
        s += " checks FAIL\n";
    }
    return s;
}

std::string GradcheckReport::to_json() const {
    nlohmann::ordered_json j;
    j["pass"] = pass();
    j["notes"] = notes;
    j["rows"] = nlohmann::ordered_json::array();
    for (const GradcheckRow& r : rows) j["rows"].push_back(row_json(r));
    return j.dump(2) + "\n";
}

}  // namespace px::gradcheck
