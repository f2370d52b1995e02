// The gradient check's driver: test data, finite differences of one op, and the rows of one
// problem (see gradcheck.h for the derivation of every bound). The ops are gradcheck_ops.cpp's,
// their references gradcheck_math.h's, the report's formatting gradcheck_report.cpp's and the
// whole model's check gradcheck_model.cpp's.
#include "validators/gradcheck.h"

#include "core/base/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace px::gradcheck {

// ---------------------------------------------------------------------------------------------
// data

std::uint64_t Rng::next() {  // splitmix64
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// A grid of 2^-23 would make sums exact and hide rounding.
float Rng::uniform(float lo, float hi) {
    return float(lo + (double(hi) - lo) * double(next() >> 11) * 0x1p-53);
}

Vec randv(Rng& r, i64 n, float lo, float hi) {
    Vec v(n);
    for (auto& x : v) x = r.uniform(lo, hi);
    return v;
}

OpShape op_shape(i64 B, i64 T, i64 C, i64 NH, i64 V, i64 N, int block) {
    OpShape s;
    s.B = B;
    s.T = T;
    s.C = C;
    s.NH = NH;
    s.V = V;
    s.N = N;
    s.block = block;
    return s;
}

std::string describe(const std::string& op, const OpShape& s) {
    char buf[160];
    std::snprintf(buf, sizeof buf, " B=%lld T=%lld C=%lld NH=%lld V=%lld N=%lld block=%d",
                  (long long)s.B, (long long)s.T, (long long)s.C, (long long)s.NH, (long long)s.V,
                  (long long)s.N, s.block);
    std::string r = op;
    r += buf;
    return r;
}

namespace {

Inputs64 to64(const std::vector<Vec>& in) {
    Inputs64 r;
    for (const auto& v : in) r.emplace_back(v.begin(), v.end());
    return r;
}

}  // namespace

Numerics make_numerics_for(const OpProblem& p, Mode mode, Isa isa) {
    Numerics nx;
    nx.mode = mode;
    nx.block = p.block;
    nx.isa = isa;
    return nx;
}

const Vec* find_output(const Named& n, const std::string& name) {
    for (const auto& [k, v] : n)
        if (k == name) return &v;
    return nullptr;
}

// ---------------------------------------------------------------------------------------------
// finite differences of one op

double FdSample::error() const {
    return std::fabs(kernel - expect);
}
double FdSample::bound() const {
    return ref_bound + fd_err;
}
bool FdSample::ref_ok() const {
    return std::fabs(ref - expect) <= fd_err + ref_bound * 0x1p-29 + 0x1p-50 * std::fabs(expect);
}

std::vector<FdSample> fd_samples(const OpProblem& p, size_t k, const Named& got, const NamedEB& ref,
                                 int random_samples, i64 every_up_to) {
    PX_ASSERT(p.loss && k < p.diff.size(), "fd_samples: the problem has no such gradient");
    const int which = p.diff[k];
    const Vec* g = find_output(got, p.grad_name[k]);
    const std::vector<EB>* r = nullptr;
    for (const auto& [name, v] : ref)
        if (name == p.grad_name[k]) r = &v;
    PX_ASSERT(g && r, "fd_samples: the run or the reference lacks " + p.grad_name[k]);
    const Vec& init = p.grad_init[k];
    const Inputs64 x0 = to64(p.in);
    const i64 n = i64(p.in[which].size());
    std::vector<i64> idx;
    if (n <= every_up_to) {
        for (i64 i = 0; i < n; i++) idx.push_back(i);
    } else {
        Rng rng(1000 + n);
        idx = {0, n - 1};
        for (int s = 0; s < random_samples; s++) idx.push_back(rng.below(n));
    }
    std::vector<FdSample> out;
    Inputs64 x = x0;
    for (i64 i : idx) {
        const double h = 0x1p-12;
        const auto L = [&](double dx) {
            x[which][i] = x0[which][i] + dx;
            const auto l = p.loss(x);
            x[which][i] = x0[which][i];
            return l;
        };
        const auto [lp1, a1] = L(h);
        const auto [lm1, a2] = L(-h);
        const auto [lp2, a3] = L(h / 2);
        const auto [lm2, a4] = L(-h / 2);
        const double d1 = (lp1 - lm1) / (2 * h), d2 = (lp2 - lm2) / h;
        const double dr = (4 * d2 - d1) / 3;
        const double labs = std::max({a1, a2, a3, a4});
        FdSample s;
        s.index = i;
        s.fd_err = std::fabs(dr - d2) + 64 * 0x1p-53 * labs / (h / 2);
        s.expect = double(init[i]) + dr;
        s.kernel = double((*g)[i]);
        s.ref = (*r)[i].v;
        s.ref_bound = (*r)[i].e;
        out.push_back(s);
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// checks

std::vector<GradcheckRow> check_problem(const OpProblem& p, const Numerics& nx, i64 every_up_to) {
    const Named got = p.run(nx);
    const NamedEB ref = p.ref(nx.mode == Mode::fast ? Order::any : Order::canonical);
    std::vector<GradcheckRow> rows;
    if (p.loss) {
        for (size_t k = 0; k < p.diff.size(); k++) {
            GradcheckRow row;
            row.op = p.op;
            row.tensor = p.grad_name[k];
            row.kind = "gradient";
            row.size = i64(p.in[p.diff[k]].size());
            for (const FdSample& s : fd_samples(p, k, got, ref, 30, every_up_to)) {
                row.add(s.index, s.error(), s.bound(), s.kernel, s.expect);
                if (!s.ref_ok()) row.reference_failing++;
            }
            rows.push_back(row);
        }
        return rows;
    }
    // No backward: every output against the fp64 forward, within its EB bound plus a few double
    // ulps for the reference's own rounding.
    for (const auto& [name, r] : ref) {
        const Vec* g = find_output(got, name);
        PX_ASSERT(g && g->size() == r.size(), "check_problem: the run lacks " + name);
        GradcheckRow row;
        row.op = p.op;
        row.tensor = name;
        row.kind = "value";
        row.size = i64(r.size());
        for (size_t i = 0; i < r.size(); i++) {
            const double err = std::fabs(double((*g)[i]) - r[i].v);
            row.add(i64(i), err, r[i].e + 4 * 0x1p-53 * std::fabs(r[i].v), (*g)[i], r[i].v);
        }
        rows.push_back(row);
    }
    return rows;
}

std::vector<GradcheckRow> gradcheck_op(const std::string& name, const OpShape& shape,
                                       const Numerics& nx) {
    const OpProblem p = find_op(name).make(shape);
    return check_problem(p, make_numerics_for(p, nx.mode, nx.isa));
}

std::vector<GradcheckRow> gradcheck_op(const std::string& name, const Numerics& nx) {
    return gradcheck_op(name, find_op(name).small, nx);
}

}  // namespace px::gradcheck
