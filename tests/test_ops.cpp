// CPU ops (all but matmul): references, gradients, invariance, and core/mathfun.h.
//
// Index
//   data and helpers        Rng, bit comparison, the ISAs this CPU permits
//   EB                      error-bound arithmetic: a double value with a bound on the fp32 error
//   references              each op once, templated over double (values, finite differences) and
//                           EB (values with fp32 error bounds); backward written analytically
//   canonical references    plain float code in the canonical order, for bit-exact checks
//   the op table            one OpDef per op, a list of shapes; adding an op adds one entry
//   properties              forward and backward vs the fp64 reference, finite differences,
//                           thread invariance, ISA invariance, bitwise vs canonical, fast mode
//   mathfun and vecmath     accuracy in ulp, special values, identical bits on every ISA
//
// How the error bounds are derived (none is tuned to make a test pass):
//   * EB runs the reference with the standard model of fp32 arithmetic: every +, -, ·, /, sqrt
//     and fma adds u·|result| (u = 2^-24) to the propagated first-order bound of its operands;
//     exp, log and tanh add kMathUlp ulp (the contract of core/mathfun.h, itself tested below);
//     a sum of n terms in the canonical tree (depth d = min(n, block) + ceil(log2(blocks))) adds
//     γ_d·Σ|terms|, γ_d = d·u/(1 - d·u) (Higham, Accuracy and Stability, §4.2). In Mode::fast the
//     order is unknown, so d = n (a bound for any summation order).
//   * The kernel must lie within that bound of the fp64 value (plus a few double ulps for the
//     reference's own rounding).
//   * Finite differences are central, with Richardson extrapolation over steps h and h/2 (h =
//     2^-12, exact in fp64); their error is estimated as |D_R - D_{h/2}| (larger than D_R's own
//     truncation error, which is O(h^4)) plus the fp64 rounding of the two loss evaluations,
//     64·2^-53·Σ|loss terms|/h (64: generous depth of one loss evaluation).
//   * A gradient must match the finite difference within its EB bound plus the FD error, and the
//     analytic fp64 backward must match it within the FD error (plus its own fp64 rounding).
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/mathfun.h"
#include "core/numerics.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vecmath.h"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

using namespace px;

namespace {

// ---------------------------------------------------------------------------------------------
// data and helpers

using Vec = std::vector<float>;

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
    uint64_t next() {  // splitmix64
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    // In double, then rounded: values carry full fp32 mantissas (a grid of 2^-23 would make sums
    // exact and hide rounding).
    float uniform(float lo, float hi) {
        return float(lo + (double(hi) - lo) * double(next() >> 11) * 0x1p-53);
    }
    int below(i64 n) { return int(next() % uint64_t(n)); }
};

Vec randv(Rng& r, i64 n, float lo = -1.0f, float hi = 1.0f) {
    Vec v(n);
    for (auto& x : v) x = r.uniform(lo, hi);
    return v;
}

std::vector<Isa> permitted_isas() {
    std::vector<Isa> v{Isa::scalar};
    const Isa best = detect_isa();
    if (best == Isa::avx2 || best == Isa::avx512) v.push_back(Isa::avx2);
    if (best == Isa::avx512) v.push_back(Isa::avx512);
    return v;
}

uint32_t bits(float x) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    return b;
}

// Index of the first element whose bits differ, or -1.
i64 first_diff(const Vec& a, const Vec& b) {
    if (a.size() != b.size()) return 0;
    for (size_t i = 0; i < a.size(); i++)
        if (bits(a[i]) != bits(b[i])) return i64(i);
    return -1;
}

i64 ceil_log2(i64 n) {
    i64 d = 0;
    while ((i64(1) << d) < n) d++;
    return d;
}

// ---------------------------------------------------------------------------------------------
// EB: error-bound arithmetic (see the top of the file)

constexpr double kU = 0x1p-24;
constexpr double kMathUlp = 2.0;  // core/mathfun.h contract, checked in "mathfun accuracy"
bool g_any_order = false;         // Mode::fast: sums may run in any order

struct EB {
    double v = 0.0, e = 0.0;
    EB() = default;
    EB(double x) : v(x) {}  // NOLINT: constants and inputs are exact fp32 values
    EB(double x, double err) : v(x), e(err) {}
};
EB operator+(EB a, EB b) {
    const double v = a.v + b.v;
    return {v, a.e + b.e + kU * std::fabs(v)};
}
EB operator-(EB a, EB b) {
    const double v = a.v - b.v;
    return {v, a.e + b.e + kU * std::fabs(v)};
}
EB operator-(EB a) {
    return {-a.v, a.e};
}
EB operator*(EB a, EB b) {
    const double v = a.v * b.v;
    return {v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e + a.e * b.e + kU * std::fabs(v)};
}
EB operator/(EB a, EB b) {
    const double v = a.v / b.v;
    const double den = std::fabs(b.v) - b.e;
    const double e = den > 0 ? (a.e + std::fabs(v) * b.e) / den : INFINITY;
    return {v, e + kU * std::fabs(v)};
}
// One ulp of y is at most 2u·|y| for normal y.
EB exp_(EB a) {
    const double v = std::exp(a.v);
    return {v, v * std::expm1(a.e) + kMathUlp * 2 * kU * v * std::exp(a.e)};
}
EB log_(EB a) {
    const double v = std::log(a.v);
    const double den = a.v - a.e;
    return {v, (den > 0 ? a.e / den : INFINITY) + kMathUlp * 2 * kU * std::fabs(v)};
}
EB tanh_(EB a) {
    const double v = std::tanh(a.v);
    return {v, (1 - v * v) * a.e + kMathUlp * 2 * kU * std::fabs(v)};
}
EB sqrt_(EB a) {
    const double v = std::sqrt(a.v);
    return {v, a.e / (v + std::sqrt(std::max(a.v - a.e, 0.0))) + kU * v};
}
EB fma_(EB a, EB b, EB c) {
    const double v = a.v * b.v + c.v;
    return {v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e + a.e * b.e + c.e + kU * std::fabs(v)};
}
double exp_(double a) {
    return std::exp(a);
}
double log_(double a) {
    return std::log(a);
}
double tanh_(double a) {
    return std::tanh(a);
}
double sqrt_(double a) {
    return std::sqrt(a);
}

double gamma_d(i64 d) {
    return double(d) * kU / (1.0 - double(d) * kU);
}
// Depth of a canonical sum of n terms in blocks of blk, in a tree over nb_tree blocks.
i64 sum_depth(i64 n, int blk, i64 nb_tree) {
    if (g_any_order) return n;
    return std::min<i64>(n, blk) + ceil_log2(std::max<i64>(nb_tree, num_blocks(n, blk)));
}

// Σ x (n terms); Σ x·y (fma). nb_tree: blocks of the tree the sum is a subtree of (masked sums).
double sum_(const std::vector<double>& x, int, i64 = 0) {
    double s = 0;
    for (double a : x) s += a;
    return s;
}
EB sum_(const std::vector<EB>& x, int blk, i64 nb_tree = 0) {
    double v = 0, e = 0, a = 0;
    for (const EB& t : x) {
        v += t.v;
        e += t.e;
        a += std::fabs(t.v);
    }
    return {v, e + gamma_d(sum_depth(i64(x.size()), blk, nb_tree)) * a};
}
double dot_(const std::vector<double>& x, const std::vector<double>& y, int, i64 = 0) {
    double s = 0;
    for (size_t i = 0; i < x.size(); i++) s += x[i] * y[i];
    return s;
}
EB dot_(const std::vector<EB>& x, const std::vector<EB>& y, int blk, i64 nb_tree = 0) {
    double v = 0, e = 0, a = 0;
    for (size_t i = 0; i < x.size(); i++) {
        v += x[i].v * y[i].v;
        e += std::fabs(x[i].v) * y[i].e + std::fabs(y[i].v) * x[i].e + x[i].e * y[i].e;
        a += std::fabs(x[i].v * y[i].v);
    }
    return {v, e + gamma_d(sum_depth(i64(x.size()), blk, nb_tree)) * a};
}
double max_(const std::vector<double>& x) {
    return *std::max_element(x.begin(), x.end());
}
EB max_(const std::vector<EB>& x) {
    EB m = x[0];
    double e = 0;
    for (const EB& t : x) {
        if (t.v > m.v) m = t;
        e = std::max(e, t.e);
    }
    return {m.v, e};  // |max(x̂) - max(x)| <= max |x̂ - x|
}

template <class T>
std::vector<T> lift(const Vec& x) {
    return std::vector<T>(x.begin(), x.end());
}

// ---------------------------------------------------------------------------------------------
// references, templated over double and EB. They mirror the kernels' formulas (cpu_kernels.h
// and the comments at the top of each kernel file), with the same fp32 constants.

constexpr float kLnEps = 1e-5f;
const float kGeluS = float(std::sqrt(2.0 / std::numbers::pi));
constexpr float kGeluA = 0.044715f;
constexpr float kGeluA3 = float(3.0 * 0.044715);

template <class T>
void layernorm_fwd_ref(std::vector<T>& out, std::vector<T>& mean, std::vector<T>& rstd,
                       const std::vector<T>& x, const std::vector<T>& w, const std::vector<T>& b,
                       i64 BT, i64 C, int blk) {
    out.assign(BT * C, T(0.0));
    mean.assign(BT, T(0.0));
    rstd.assign(BT, T(0.0));
    for (i64 t = 0; t < BT; t++) {
        std::vector<T> row(x.begin() + t * C, x.begin() + (t + 1) * C), d(C);
        const T m = sum_(row, blk) / T(double(C));
        for (i64 i = 0; i < C; i++) d[i] = row[i] - m;
        const T var = dot_(d, d, blk) / T(double(C));
        const T s = T(1.0) / sqrt_(var + T(kLnEps));
        for (i64 i = 0; i < C; i++) out[t * C + i] = (d[i] * s) * w[i] + b[i];
        mean[t] = m;
        rstd[t] = s;
    }
}

template <class T>
void layernorm_bwd_ref(std::vector<T>& dinp, std::vector<T>& dw, std::vector<T>& db,
                       const std::vector<T>& dout, const std::vector<T>& x, const std::vector<T>& w,
                       const std::vector<T>& mean, const std::vector<T>& rstd, i64 BT, i64 C,
                       int blk) {
    std::vector<std::vector<T>> norm(C, std::vector<T>(BT)), dcol(C, std::vector<T>(BT));
    for (i64 t = 0; t < BT; t++) {
        std::vector<T> nr(C), dn(C);
        for (i64 i = 0; i < C; i++) {
            nr[i] = (x[t * C + i] - mean[t]) * rstd[t];
            dn[i] = w[i] * dout[t * C + i];
            norm[i][t] = nr[i];
            dcol[i][t] = dout[t * C + i];
        }
        const T dm = sum_(dn, blk) / T(double(C));
        const T dnm = dot_(dn, nr, blk) / T(double(C));
        for (i64 i = 0; i < C; i++)
            dinp[t * C + i] = dinp[t * C + i] + ((dn[i] - dm) - nr[i] * dnm) * rstd[t];
    }
    for (i64 i = 0; i < C; i++) {
        db[i] = db[i] + sum_(dcol[i], blk);
        dw[i] = dw[i] + dot_(norm[i], dcol[i], blk);
    }
}

template <class T>
T gelu_u(T x) {
    return T(kGeluS) * (x + ((T(kGeluA) * x) * x) * x);
}
template <class T>
void gelu_fwd_ref(std::vector<T>& out, const std::vector<T>& x) {
    out.resize(x.size());
    for (size_t i = 0; i < x.size(); i++) out[i] = (T(0.5) * x[i]) * (T(1.0) + tanh_(gelu_u(x[i])));
}
template <class T>
void gelu_bwd_ref(std::vector<T>& dinp, const std::vector<T>& x, const std::vector<T>& dout) {
    for (size_t i = 0; i < x.size(); i++) {
        const T t = tanh_(gelu_u(x[i]));
        const T sech2 = fma_(-t, t, T(1.0));
        const T du = T(kGeluS) * (T(1.0) + (T(kGeluA3) * x[i]) * x[i]);
        const T local = T(0.5) * (T(1.0) + t) + ((T(0.5) * x[i]) * sech2) * du;
        dinp[i] = dinp[i] + local * dout[i];
    }
}

struct AttnShape {
    i64 B, T, C, NH;
};

template <class T>
void attention_fwd_ref(std::vector<T>& out, std::vector<T>& pre, std::vector<T>& att,
                       const std::vector<T>& qkv, AttnShape s, int blk) {
    const i64 B = s.B, Tn = s.T, C = s.C, NH = s.NH, HS = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(HS));
    const i64 nkb = num_blocks(Tn, blk);
    out.assign(B * Tn * C, T(0.0));
    pre.assign(B * NH * Tn * Tn, T(0.0));
    att.assign(B * NH * Tn * Tn, T(0.0));
    for (i64 b = 0; b < B; b++)
        for (i64 h = 0; h < NH; h++)
            for (i64 t = 0; t < Tn; t++) {
                const auto at = [&](i64 tok, i64 part, i64 i) {
                    return qkv[(b * Tn + tok) * C3 + part * C + h * HS + i];
                };
                std::vector<T> q(HS), kv(HS), sc(t + 1), e(t + 1);
                for (i64 i = 0; i < HS; i++) q[i] = at(t, 0, i);
                for (i64 j = 0; j <= t; j++) {
                    for (i64 i = 0; i < HS; i++) kv[i] = at(j, 1, i);
                    sc[j] = dot_(q, kv, blk) * T(scale);
                }
                const T mx = max_(sc);
                for (i64 j = 0; j <= t; j++) e[j] = exp_(sc[j] - mx);
                const T sum = sum_(e, blk, nkb);
                const i64 row = ((b * NH + h) * Tn + t) * Tn;
                for (i64 j = 0; j <= t; j++) {
                    pre[row + j] = sc[j];
                    att[row + j] = e[j] / sum;
                }
                for (i64 i = 0; i < HS; i++) {
                    std::vector<T> a(att.begin() + row, att.begin() + row + t + 1), vcol(t + 1);
                    for (i64 j = 0; j <= t; j++) vcol[j] = at(j, 2, i);
                    out[(b * Tn + t) * C + h * HS + i] = dot_(a, vcol, blk, nkb);
                }
            }
}

template <class T>
void attention_bwd_ref(std::vector<T>& dqkv, std::vector<T>& dpre, std::vector<T>& datt,
                       const std::vector<T>& dout, const std::vector<T>& qkv,
                       const std::vector<T>& att, AttnShape s, int blk) {
    const i64 B = s.B, Tn = s.T, C = s.C, NH = s.NH, HS = C / NH, C3 = 3 * C;
    const float scale = 1.0f / std::sqrt(float(HS));
    const i64 nkb = num_blocks(Tn, blk);
    dpre.assign(B * NH * Tn * Tn, T(0.0));
    datt.assign(B * NH * Tn * Tn, T(0.0));
    for (i64 b = 0; b < B; b++)
        for (i64 h = 0; h < NH; h++) {
            const auto at = [&](i64 tok, i64 part, i64 i) {
                return qkv[(b * Tn + tok) * C3 + part * C + h * HS + i];
            };
            const auto dq = [&](i64 tok, i64 part, i64 i) -> T& {
                return dqkv[(b * Tn + tok) * C3 + part * C + h * HS + i];
            };
            const i64 base = (b * NH + h) * Tn * Tn;
            for (i64 t = 0; t < Tn; t++) {
                std::vector<T> d(HS), vv(HS), a(t + 1), da(t + 1);
                for (i64 i = 0; i < HS; i++) d[i] = dout[(b * Tn + t) * C + h * HS + i];
                for (i64 j = 0; j <= t; j++) {
                    for (i64 i = 0; i < HS; i++) vv[i] = at(j, 2, i);
                    da[j] = dot_(d, vv, blk);
                    a[j] = att[base + t * Tn + j];
                    datt[base + t * Tn + j] = da[j];
                }
                const T sm = dot_(a, da, blk, nkb);
                for (i64 j = 0; j <= t; j++) dpre[base + t * Tn + j] = a[j] * (da[j] - sm);
            }
            for (i64 t = 0; t < Tn; t++)
                for (i64 i = 0; i < HS; i++) {
                    std::vector<T> c(t + 1), k(t + 1);
                    for (i64 j = 0; j <= t; j++) {
                        c[j] = dpre[base + t * Tn + j];
                        k[j] = at(j, 1, i);
                    }
                    dq(t, 0, i) = dq(t, 0, i) + dot_(c, k, blk, nkb) * T(scale);
                }
            for (i64 j = 0; j < Tn; j++)
                for (i64 i = 0; i < HS; i++) {
                    std::vector<T> c(Tn - j), q(Tn - j), a(Tn - j), d(Tn - j);
                    for (i64 t = j; t < Tn; t++) {
                        c[t - j] = dpre[base + t * Tn + j];
                        q[t - j] = at(t, 0, i);
                        a[t - j] = att[base + t * Tn + j];
                        d[t - j] = dout[(b * Tn + t) * C + h * HS + i];
                    }
                    dq(j, 1, i) = dq(j, 1, i) + dot_(c, q, blk, nkb) * T(scale);
                    dq(j, 2, i) = dq(j, 2, i) + dot_(a, d, blk, nkb);
                }
        }
}

template <class T>
void embedding_fwd_ref(std::vector<T>& out, const std::vector<int>& tok, const std::vector<T>& wte,
                       const std::vector<T>& wpe, i64 B, i64 Tn, i64 C) {
    out.assign(B * Tn * C, T(0.0));
    for (i64 n = 0; n < B * Tn; n++)
        for (i64 i = 0; i < C; i++) out[n * C + i] = wte[tok[n] * C + i] + wpe[(n % Tn) * C + i];
}

// The tokens of one output row, summed over their flat indices (a sparse subtree of the tree
// over all num_blocks(BT) blocks: depth min(k, blk) + ceil(log2(blocks)) bounds it).
template <class T>
void embedding_bwd_ref(std::vector<T>& dwte, std::vector<T>& dwpe, const std::vector<T>& dout,
                       const std::vector<int>& tok, i64 B, i64 Tn, i64 C, i64 V, int blk) {
    const i64 nb = num_blocks(B * Tn, blk);
    for (i64 v = 0; v < V; v++)
        for (i64 i = 0; i < C; i++) {
            std::vector<T> terms;
            for (i64 n = 0; n < B * Tn; n++)
                if (tok[n] == v) terms.push_back(dout[n * C + i]);
            if (!terms.empty()) dwte[v * C + i] = dwte[v * C + i] + sum_(terms, blk, nb);
        }
    for (i64 t = 0; t < Tn; t++)
        for (i64 i = 0; i < C; i++) {
            std::vector<T> terms;
            for (i64 b = 0; b < B; b++) terms.push_back(dout[(b * Tn + t) * C + i]);
            dwpe[t * C + i] = dwpe[t * C + i] + sum_(terms, blk, nb);
        }
}

template <class T>
void crossentropy_fwd_ref(std::vector<T>& losses, std::vector<T>& probs,
                          const std::vector<T>& logits, const std::vector<int>& tg, i64 BT, i64 V,
                          int blk) {
    losses.assign(BT, T(0.0));
    probs.assign(BT * V, T(0.0));
    for (i64 r = 0; r < BT; r++) {
        std::vector<T> l(logits.begin() + r * V, logits.begin() + (r + 1) * V), e(V);
        const T mx = max_(l);
        for (i64 i = 0; i < V; i++) e[i] = exp_(l[i] - mx);
        const T sum = sum_(e, blk);
        for (i64 i = 0; i < V; i++) probs[r * V + i] = e[i] / sum;
        losses[r] = log_(sum) - (l[tg[r]] - mx);
    }
}

template <class T>
void crossentropy_bwd_ref(std::vector<T>& dlogits, const std::vector<T>& probs,
                          const std::vector<int>& tg, float dloss, i64 BT, i64 V) {
    dlogits.assign(BT * V, T(0.0));
    for (i64 r = 0; r < BT; r++)
        for (i64 i = 0; i < V; i++)
            dlogits[r * V + i] = (probs[r * V + i] - T(i == tg[r] ? 1.0 : 0.0)) * T(dloss);
}

// ---------------------------------------------------------------------------------------------
// the op table

using Named = std::vector<std::pair<std::string, Vec>>;
using NamedEB = std::vector<std::pair<std::string, std::vector<EB>>>;
using Inputs64 = std::vector<std::vector<double>>;

struct Shape {
    i64 B = 1, T = 1, C = 1, NH = 1, V = 1, N = 1;
    int block = 64;
};

std::string describe(const char* op, const Shape& s) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%s B=%lld T=%lld C=%lld NH=%lld V=%lld N=%lld block=%d", op,
                  (long long)s.B, (long long)s.T, (long long)s.C, (long long)s.NH, (long long)s.V,
                  (long long)s.N, s.block);
    return buf;
}

// One op on one shape, with its data.
struct Problem {
    std::string label;
    int block = 64;
    std::vector<Vec> in;                 // float inputs
    std::vector<int> diff;               // inputs the backward differentiates ...
    std::vector<std::string> grad_name;  // ... and the outputs holding their gradients
    std::vector<Vec> grad_init;          // what those outputs held before (gradients accumulate)
    std::function<Named(const Numerics&)> run;  // the kernels: forward, then backward if any
    std::function<NamedEB()> ref;               // EB reference of every output of run
    // fp64 loss of the forward as a function of the inputs, with Σ|terms| (null: no backward)
    std::function<std::pair<double, double>(const Inputs64&)> loss;
    std::function<Named()> canon;  // plain float code in the canonical order (bitwise)
};

struct OpDef {
    const char* name;
    std::vector<Shape> shapes;
    std::function<Problem(const Shape&)> make;
};

Inputs64 to64(const std::vector<Vec>& in) {
    Inputs64 r;
    for (const auto& v : in) r.emplace_back(v.begin(), v.end());
    return r;
}

// Σ out·R, and Σ|out·R|.
std::pair<double, double> weighted(const std::vector<double>& out, const Vec& R) {
    double s = 0, a = 0;
    for (size_t i = 0; i < out.size(); i++) {
        s += out[i] * R[i];
        a += std::fabs(out[i] * R[i]);
    }
    return {s, a};
}

template <class T>
std::vector<T> plus(const Vec& init, const std::vector<T>& g) {
    std::vector<T> r(g.size());
    for (size_t i = 0; i < g.size(); i++) r[i] = T(init[i]) + g[i];
    return r;
}

Problem make_layernorm(const Shape& s) {
    Problem p;
    p.label = describe("layernorm", s);
    p.block = s.block;
    const i64 BT = s.B * s.T, C = s.C;
    const int blk = s.block;
    Rng r(11 + BT * 7 + C);
    Vec x = randv(r, BT * C, -2.0f, 2.0f);
    for (i64 t = 0; t < BT; t++)  // offsets per row, so the mean matters
        for (i64 i = 0; i < C; i++) x[t * C + i] += float(t % 5) - 2.0f;
    p.in = {x, randv(r, C, 0.5f, 1.5f), randv(r, C), randv(r, BT * C)};  // x, weight, bias, R=dout
    p.diff = {0, 1, 2};
    p.grad_name = {"dinp", "dweight", "dbias"};
    p.grad_init = {randv(r, BT * C), randv(r, C), randv(r, C)};
    const auto data = std::make_shared<const Problem>(p);  // the data, shared by the closures
    p.run = [data, BT, C](const Numerics& nx) {
        Vec out(BT * C), mean(BT), rstd(BT);
        Vec dinp = data->grad_init[0], dw = data->grad_init[1], db = data->grad_init[2];
        cpu::layernorm_forward(nx, out.data(), mean.data(), rstd.data(), data->in[0].data(),
                               data->in[1].data(), data->in[2].data(), BT, C);
        cpu::layernorm_backward(nx, dinp.data(), dw.data(), db.data(), data->in[3].data(),
                                data->in[0].data(), data->in[1].data(), mean.data(), rstd.data(),
                                BT, C);
        return Named{{"out", out},   {"mean", mean},  {"rstd", rstd},
                     {"dinp", dinp}, {"dweight", dw}, {"dbias", db}};
    };
    p.ref = [data, BT, C, blk]() {
        std::vector<EB> out, mean, rstd;
        const auto x = lift<EB>(data->in[0]), w = lift<EB>(data->in[1]);
        layernorm_fwd_ref(out, mean, rstd, x, w, lift<EB>(data->in[2]), BT, C, blk);
        auto dinp = lift<EB>(data->grad_init[0]), dw = lift<EB>(data->grad_init[1]),
             db = lift<EB>(data->grad_init[2]);
        layernorm_bwd_ref(dinp, dw, db, lift<EB>(data->in[3]), x, w, mean, rstd, BT, C, blk);
        return NamedEB{{"out", out},   {"mean", mean},  {"rstd", rstd},
                       {"dinp", dinp}, {"dweight", dw}, {"dbias", db}};
    };
    p.loss = [data, BT, C, blk](const Inputs64& in) {
        std::vector<double> out, mean, rstd;
        layernorm_fwd_ref(out, mean, rstd, in[0], in[1], in[2], BT, C, blk);
        return weighted(out, data->in[3]);
    };
    p.canon = [data, BT, C, blk]() {
        const Vec &x = data->in[0], &w = data->in[1], &bb = data->in[2], &dout = data->in[3];
        Vec out(BT * C), mean(BT), rstd(BT), d(C);
        for (i64 t = 0; t < BT; t++) {
            const float m = canonical_sum(&x[t * C], C, blk) / float(C);
            for (i64 i = 0; i < C; i++) d[i] = x[t * C + i] - m;
            const float var = canonical_dot(d.data(), d.data(), C, blk) / float(C);
            const float sd = 1.0f / std::sqrt(var + kLnEps);
            for (i64 i = 0; i < C; i++) out[t * C + i] = (d[i] * sd) * w[i] + bb[i];
            mean[t] = m;
            rstd[t] = sd;
        }
        Vec dinp = data->grad_init[0], dw = data->grad_init[1], db = data->grad_init[2];
        const i64 nb = num_blocks(BT, blk);
        Vec pw(nb * C, 0.0f), pb(nb * C, 0.0f), nr(C), dn(C);
        for (i64 t = 0; t < BT; t++) {
            for (i64 i = 0; i < C; i++) {
                nr[i] = (x[t * C + i] - mean[t]) * rstd[t];
                dn[i] = w[i] * dout[t * C + i];
                float& aw = pw[(t / blk) * C + i];
                float& ab = pb[(t / blk) * C + i];
                aw = std::fma(nr[i], dout[t * C + i], aw);
                ab = ab + dout[t * C + i];
            }
            const float dm = canonical_sum(dn.data(), C, blk) / float(C);
            const float dnm = canonical_dot(dn.data(), nr.data(), C, blk) / float(C);
            for (i64 i = 0; i < C; i++) dinp[t * C + i] += ((dn[i] - dm) - nr[i] * dnm) * rstd[t];
        }
        tree_combine_rows(pw.data(), nb, C);
        tree_combine_rows(pb.data(), nb, C);
        for (i64 i = 0; i < C; i++) {
            dw[i] += pw[i];
            db[i] += pb[i];
        }
        return Named{{"out", out},   {"mean", mean},  {"rstd", rstd},
                     {"dinp", dinp}, {"dweight", dw}, {"dbias", db}};
    };
    return p;
}

Problem make_gelu(const Shape& s) {
    Problem p;
    p.label = describe("gelu", s);
    p.block = s.block;
    const i64 N = s.N;
    Rng r(23 + N);
    Vec x = randv(r, N, -6.0f, 6.0f);
    if (N > 8) {  // the tanh polynomial/exp switch and tiny inputs
        x[0] = 0.0f;
        x[1] = 1e-30f;
        x[2] = -0.9f / kGeluS;
        x[3] = 12.0f;
    }
    p.in = {x, randv(r, N)};
    p.diff = {0};
    p.grad_name = {"dinp"};
    p.grad_init = {randv(r, N)};
    const auto data = std::make_shared<const Problem>(p);  // the data, shared by the closures
    p.run = [data, N](const Numerics& nx) {
        Vec out(N), dinp = data->grad_init[0];
        cpu::gelu_forward(nx, out.data(), data->in[0].data(), N);
        cpu::gelu_backward(nx, dinp.data(), data->in[0].data(), data->in[1].data(), N);
        return Named{{"out", out}, {"dinp", dinp}};
    };
    p.ref = [data]() {
        std::vector<EB> out;
        const auto x = lift<EB>(data->in[0]);
        gelu_fwd_ref(out, x);
        auto dinp = lift<EB>(data->grad_init[0]);
        gelu_bwd_ref(dinp, x, lift<EB>(data->in[1]));
        return NamedEB{{"out", out}, {"dinp", dinp}};
    };
    p.loss = [data](const Inputs64& in) {
        std::vector<double> out;
        gelu_fwd_ref(out, in[0]);
        return weighted(out, data->in[1]);
    };
    p.canon = [data, N]() {
        Vec out(N), dinp = data->grad_init[0];
        for (i64 i = 0; i < N; i++) {
            const float x = data->in[0][i];
            const float u = kGeluS * (x + ((kGeluA * x) * x) * x);
            const float t = mathfun::tanh(u);
            out[i] = (0.5f * x) * (1.0f + t);
            const float sech2 = std::fma(-t, t, 1.0f);
            const float du = kGeluS * (1.0f + (kGeluA3 * x) * x);
            const float local = 0.5f * (1.0f + t) + ((0.5f * x) * sech2) * du;
            dinp[i] = dinp[i] + local * data->in[1][i];
        }
        return Named{{"out", out}, {"dinp", dinp}};
    };
    return p;
}

Problem make_attention(const Shape& s) {
    Problem p;
    p.label = describe("attention", s);
    p.block = s.block;
    const AttnShape a{s.B, s.T, s.C, s.NH};
    const int blk = s.block;
    const i64 B = s.B, Tn = s.T, C = s.C, NH = s.NH, HS = C / NH, C3 = 3 * C;
    Rng r(37 + B * 131 + Tn * 17 + C);
    p.in = {randv(r, B * Tn * C3, -1.5f, 1.5f), randv(r, B * Tn * C)};  // qkv, R=dout
    p.diff = {0};
    p.grad_name = {"dqkv"};
    p.grad_init = {randv(r, B * Tn * C3)};
    const auto data = std::make_shared<const Problem>(p);  // the data, shared by the closures
    p.run = [data, B, Tn, C, NH](const Numerics& nx) {
        const i64 TT = B * NH * Tn * Tn;
        Vec out(B * Tn * C), pre(TT), att(TT), dpre(TT, 7.0f), datt(TT, 7.0f),
            dqkv = data->grad_init[0];
        cpu::attention_forward(nx, out.data(), pre.data(), att.data(), data->in[0].data(), B, Tn, C,
                               NH);
        cpu::attention_backward(nx, dqkv.data(), dpre.data(), datt.data(), data->in[1].data(),
                                data->in[0].data(), att.data(), B, Tn, C, NH);
        return Named{{"out", out},   {"preatt", pre},   {"att", att},
                     {"dqkv", dqkv}, {"dpreatt", dpre}, {"datt", datt}};
    };
    p.ref = [data, a, blk]() {
        std::vector<EB> out, pre, att, dpre, datt;
        const auto qkv = lift<EB>(data->in[0]);
        attention_fwd_ref(out, pre, att, qkv, a, blk);
        auto dqkv = lift<EB>(data->grad_init[0]);
        attention_bwd_ref(dqkv, dpre, datt, lift<EB>(data->in[1]), qkv, att, a, blk);
        return NamedEB{{"out", out},   {"preatt", pre},   {"att", att},
                       {"dqkv", dqkv}, {"dpreatt", dpre}, {"datt", datt}};
    };
    p.loss = [data, a, blk](const Inputs64& in) {
        std::vector<double> out, pre, att;
        attention_fwd_ref(out, pre, att, in[0], a, blk);
        return weighted(out, data->in[1]);
    };
    // Plain canonical order: per query, dots over HS, Σexp over the key blocks of T with the
    // masked blocks absent, att·v as block partials in the same tree; backward likewise.
    p.canon = [data, B, Tn, C, NH, HS, C3, blk]() {
        const Vec& qkv = data->in[0];
        const Vec& dout = data->in[1];
        const float scale = 1.0f / std::sqrt(float(HS));
        const i64 nkb = num_blocks(Tn, blk), TT = B * NH * Tn * Tn;
        Vec out(B * Tn * C), pre(TT, 0.0f), att(TT, 0.0f), dpre(TT, 0.0f), datt(TT, 0.0f),
            dqkv = data->grad_init[0];
        std::vector<unsigned char> present(nkb);
        const auto ptr = [&](i64 b, i64 tok, i64 part, i64 h) {
            return &qkv[(b * Tn + tok) * C3 + part * C + h * HS];
        };
        const auto dptr = [&](i64 b, i64 tok, i64 part, i64 h) {
            return &dqkv[(b * Tn + tok) * C3 + part * C + h * HS];
        };
        // Tree over key (or query) blocks of terms coef[r]·x_r[i] for r in [r0, r1).
        const auto tree_rows = [&](float* res, auto coef, auto xrow, i64 r0, i64 r1) {
            Vec part(nkb * HS, 0.0f);
            for (i64 kb = 0; kb < nkb; kb++) present[kb] = 0;
            for (i64 rr = r0; rr < r1; rr++) {
                present[rr / blk] = 1;
                for (i64 i = 0; i < HS; i++)
                    part[(rr / blk) * HS + i] =
                        std::fma(coef(rr), xrow(rr)[i], part[(rr / blk) * HS + i]);
            }
            tree_combine_rows(part.data(), nkb, HS, present.data());
            std::copy(part.begin(), part.begin() + HS, res);
        };
        for (i64 b = 0; b < B; b++)
            for (i64 h = 0; h < NH; h++) {
                const i64 base = (b * NH + h) * Tn * Tn;
                for (i64 t = 0; t < Tn; t++) {
                    float* pr = &pre[base + t * Tn];
                    float* at = &att[base + t * Tn];
                    for (i64 j = 0; j <= t; j++)
                        pr[j] = canonical_dot(ptr(b, t, 0, h), ptr(b, j, 1, h), HS, blk) * scale;
                    float mx = pr[0];
                    for (i64 j = 1; j <= t; j++) mx = std::max(mx, pr[j]);
                    Vec part(nkb, 0.0f);
                    for (i64 kb = 0; kb < nkb; kb++) present[kb] = kb <= t / blk;
                    for (i64 j = 0; j <= t; j++) {
                        at[j] = mathfun::exp(pr[j] - mx);
                        part[j / blk] = part[j / blk] + at[j];
                    }
                    tree_combine_rows(part.data(), nkb, 1, present.data());
                    for (i64 j = 0; j <= t; j++) at[j] = at[j] / part[0];
                    tree_rows(
                        &out[(b * Tn + t) * C + h * HS], [&](i64 j) { return at[j]; },
                        [&](i64 j) { return ptr(b, j, 2, h); }, 0, t + 1);
                }
                for (i64 t = 0; t < Tn; t++) {
                    const float* at = &att[base + t * Tn];
                    float* da = &datt[base + t * Tn];
                    float* dp = &dpre[base + t * Tn];
                    const float* d = &dout[(b * Tn + t) * C + h * HS];
                    for (i64 j = 0; j <= t; j++) da[j] = canonical_dot(d, ptr(b, j, 2, h), HS, blk);
                    Vec part(nkb, 0.0f);
                    for (i64 kb = 0; kb < nkb; kb++) present[kb] = kb <= t / blk;
                    for (i64 j = 0; j <= t; j++)
                        part[j / blk] = std::fma(at[j], da[j], part[j / blk]);
                    tree_combine_rows(part.data(), nkb, 1, present.data());
                    for (i64 j = 0; j <= t; j++) dp[j] = at[j] * (da[j] - part[0]);
                    Vec res(HS);
                    tree_rows(
                        res.data(), [&](i64 j) { return dp[j]; },
                        [&](i64 j) { return ptr(b, j, 1, h); }, 0, t + 1);
                    for (i64 i = 0; i < HS; i++) dptr(b, t, 0, h)[i] += res[i] * scale;
                }
                for (i64 j = 0; j < Tn; j++) {
                    Vec res(HS);
                    tree_rows(
                        res.data(), [&](i64 t) { return dpre[base + t * Tn + j]; },
                        [&](i64 t) { return ptr(b, t, 0, h); }, j, Tn);
                    for (i64 i = 0; i < HS; i++) dptr(b, j, 1, h)[i] += res[i] * scale;
                    tree_rows(
                        res.data(), [&](i64 t) { return att[base + t * Tn + j]; },
                        [&](i64 t) { return &dout[(b * Tn + t) * C + h * HS]; }, j, Tn);
                    for (i64 i = 0; i < HS; i++) dptr(b, j, 2, h)[i] += res[i];
                }
            }
        return Named{{"out", out},   {"preatt", pre},   {"att", att},
                     {"dqkv", dqkv}, {"dpreatt", dpre}, {"datt", datt}};
    };
    return p;
}

Problem make_residual(const Shape& s) {
    Problem p;
    p.label = describe("residual", s);
    p.block = s.block;
    const i64 N = s.N;
    Rng r(41 + N);
    p.in = {randv(r, N), randv(r, N), randv(r, N)};  // inp1, inp2, R=dout
    p.diff = {0, 1};
    p.grad_name = {"dinp1", "dinp2"};
    p.grad_init = {randv(r, N), randv(r, N)};
    const auto data = std::make_shared<const Problem>(p);  // the data, shared by the closures
    p.run = [data, N](const Numerics& nx) {
        Vec out(N), d1 = data->grad_init[0], d2 = data->grad_init[1];
        cpu::residual_forward(nx, out.data(), data->in[0].data(), data->in[1].data(), N);
        cpu::residual_backward(nx, d1.data(), d2.data(), data->in[2].data(), N);
        return Named{{"out", out}, {"dinp1", d1}, {"dinp2", d2}};
    };
    p.ref = [data, N]() {
        std::vector<EB> out(N);
        for (i64 i = 0; i < N; i++) out[i] = EB(data->in[0][i]) + EB(data->in[1][i]);
        const auto d = lift<EB>(data->in[2]);
        return NamedEB{{"out", out},
                       {"dinp1", plus(data->grad_init[0], d)},
                       {"dinp2", plus(data->grad_init[1], d)}};
    };
    p.loss = [data, N](const Inputs64& in) {
        std::vector<double> out(N);
        for (i64 i = 0; i < N; i++) out[i] = in[0][i] + in[1][i];
        return weighted(out, data->in[2]);
    };
    p.canon = [data, N]() {
        Vec out(N), d1 = data->grad_init[0], d2 = data->grad_init[1];
        for (i64 i = 0; i < N; i++) {
            out[i] = data->in[0][i] + data->in[1][i];
            d1[i] += data->in[2][i];
            d2[i] += data->in[2][i];
        }
        return Named{{"out", out}, {"dinp1", d1}, {"dinp2", d2}};
    };
    return p;
}

Problem make_embedding(const Shape& s) {
    Problem p;
    p.label = describe("embedding", s);
    p.block = s.block;
    const i64 B = s.B, Tn = s.T, C = s.C, V = s.V;
    const int blk = s.block;
    Rng r(53 + B * 7 + Tn + V);
    std::vector<int> tok(B * Tn);
    for (auto& t : tok) t = r.below(V - 1);  // the last id never occurs: its row must not change
    tok[0] = tok[B * Tn - 1];                // one id at both ends: a tree over far-apart blocks
    p.in = {randv(r, V * C), randv(r, Tn * C), randv(r, B * Tn * C)};  // wte, wpe, R=dout
    p.diff = {0, 1};
    p.grad_name = {"dwte", "dwpe"};
    p.grad_init = {randv(r, V * C), randv(r, Tn * C)};
    const auto data = std::make_shared<const Problem>(p);  // the data, shared by the closures
    p.run = [data, tok, B, Tn, C, V](const Numerics& nx) {
        Vec out(B * Tn * C), dwte = data->grad_init[0], dwpe = data->grad_init[1];
        cpu::embedding_forward(nx, out.data(), tok.data(), data->in[0].data(), data->in[1].data(),
                               B, Tn, C);
        cpu::embedding_backward(nx, dwte.data(), dwpe.data(), data->in[2].data(), tok.data(), B, Tn,
                                C, V);
        return Named{{"out", out}, {"dwte", dwte}, {"dwpe", dwpe}};
    };
    p.ref = [data, tok, B, Tn, C, V, blk]() {
        std::vector<EB> out;
        embedding_fwd_ref(out, tok, lift<EB>(data->in[0]), lift<EB>(data->in[1]), B, Tn, C);
        auto dwte = lift<EB>(data->grad_init[0]), dwpe = lift<EB>(data->grad_init[1]);
        embedding_bwd_ref(dwte, dwpe, lift<EB>(data->in[2]), tok, B, Tn, C, V, blk);
        return NamedEB{{"out", out}, {"dwte", dwte}, {"dwpe", dwpe}};
    };
    p.loss = [data, tok, B, Tn, C](const Inputs64& in) {
        std::vector<double> out;
        embedding_fwd_ref(out, tok, in[0], in[1], B, Tn, C);
        return weighted(out, data->in[2]);
    };
    // Plain canonical order: for each output row, dense block partials over all blocks of BT,
    // absent blocks marked, then the tree.
    p.canon = [data, tok, B, Tn, C, V, blk]() {
        const Vec& dout = data->in[2];
        Vec out(B * Tn * C), dwte = data->grad_init[0], dwpe = data->grad_init[1];
        for (i64 n = 0; n < B * Tn; n++)
            for (i64 i = 0; i < C; i++)
                out[n * C + i] = data->in[0][tok[n] * C + i] + data->in[1][(n % Tn) * C + i];
        const i64 nb = num_blocks(B * Tn, blk);
        const auto reduce = [&](float* dst, auto has) {
            Vec part(nb * C, 0.0f);
            std::vector<unsigned char> present(nb, 0);
            for (i64 n = 0; n < B * Tn; n++)
                if (has(n)) {
                    present[n / blk] = 1;
                    for (i64 i = 0; i < C; i++)
                        part[(n / blk) * C + i] = part[(n / blk) * C + i] + dout[n * C + i];
                }
            if (tree_combine_rows(part.data(), nb, C, present.data()))
                for (i64 i = 0; i < C; i++) dst[i] += part[i];
        };
        for (i64 v = 0; v < V; v++) reduce(&dwte[v * C], [&](i64 n) { return tok[n] == v; });
        for (i64 t = 0; t < Tn; t++) reduce(&dwpe[t * C], [&](i64 n) { return n % Tn == t; });
        return Named{{"out", out}, {"dwte", dwte}, {"dwpe", dwpe}};
    };
    return p;
}

Problem make_crossentropy(const Shape& s) {
    Problem p;
    p.label = describe("crossentropy", s);
    p.block = s.block;
    const i64 BT = s.B * s.T, V = s.V;
    const int blk = s.block;
    Rng r(67 + BT + V);
    std::vector<int> tg(BT);
    for (auto& t : tg) t = r.below(V);
    p.in = {randv(r, BT * V, -4.0f, 4.0f)};
    p.diff = {0};
    p.grad_name = {"dlogits"};
    p.grad_init = {Vec(BT * V, 0.0f)};                     // assigned, not accumulated
    const float dloss = 1.0f / float(BT);                  // the mean loss
    const auto data = std::make_shared<const Problem>(p);  // the data, shared by the closures
    p.run = [data, tg, BT, V, dloss](const Numerics& nx) {
        Vec losses(BT), probs(BT * V), dl(BT * V);
        cpu::crossentropy_forward(nx, losses.data(), probs.data(), data->in[0].data(), tg.data(),
                                  BT, V);
        cpu::crossentropy_backward(nx, dl.data(), probs.data(), tg.data(), dloss, BT, V);
        return Named{{"losses", losses}, {"probs", probs}, {"dlogits", dl}};
    };
    p.ref = [data, tg, BT, V, blk, dloss]() {
        std::vector<EB> losses, probs, dl;
        crossentropy_fwd_ref(losses, probs, lift<EB>(data->in[0]), tg, BT, V, blk);
        crossentropy_bwd_ref(dl, probs, tg, dloss, BT, V);
        return NamedEB{{"losses", losses}, {"probs", probs}, {"dlogits", dl}};
    };
    p.loss = [tg, BT, V, blk, dloss](const Inputs64& in) {
        std::vector<double> losses, probs;
        crossentropy_fwd_ref(losses, probs, in[0], tg, BT, V, blk);
        return weighted(losses, Vec(BT, dloss));
    };
    p.canon = [data, tg, BT, V, blk, dloss]() {
        Vec losses(BT), probs(BT * V), dl(BT * V);
        for (i64 r = 0; r < BT; r++) {
            const float* l = &data->in[0][r * V];
            float mx = l[0];
            for (i64 i = 1; i < V; i++) mx = std::max(mx, l[i]);
            for (i64 i = 0; i < V; i++) probs[r * V + i] = mathfun::exp(l[i] - mx);
            const float sum = canonical_sum(&probs[r * V], V, blk);
            for (i64 i = 0; i < V; i++) probs[r * V + i] = probs[r * V + i] / sum;
            losses[r] = mathfun::log(sum) - (l[tg[r]] - mx);
            for (i64 i = 0; i < V; i++)
                dl[r * V + i] = (probs[r * V + i] - (i == tg[r] ? 1.0f : 0.0f)) * dloss;
        }
        return Named{{"losses", losses}, {"probs", probs}, {"dlogits", dl}};
    };
    return p;
}

struct AdamWArgs {
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
};

Problem make_adamw(const Shape& s) {
    Problem p;
    p.label = describe("adamw", s);
    p.block = s.block;
    const i64 N = s.N;
    const int t = int(s.T);  // the step
    Rng r(71 + N + t);
    p.in = {randv(r, N), randv(r, N, -0.1f, 0.1f), randv(r, N, 0.0f, 0.01f),
            randv(r, N)};  // param, m, v, grad
    const AdamWArgs a;
    const auto data = std::make_shared<const Problem>(p);  // the data, shared by the closures
    p.run = [data, N, t, a](const Numerics& nx) {
        Vec param = data->in[0], m = data->in[1], v = data->in[2];
        cpu::adamw_update(nx, param.data(), m.data(), v.data(), data->in[3].data(), N, a.lr,
                          a.beta1, a.beta2, a.eps, a.wd, a.gs, t);
        return Named{{"param", param}, {"m", m}, {"v", v}};
    };
    const float bc1 = float(1.0 - std::pow(double(a.beta1), t)),
                bc2 = float(1.0 - std::pow(double(a.beta2), t));
    p.ref = [data, N, a, bc1, bc2]() {
        std::vector<EB> param(N), m(N), v(N);
        for (i64 i = 0; i < N; i++) {
            const EB g = EB(data->in[3][i]) * EB(a.gs);
            m[i] = EB(a.beta1) * EB(data->in[1][i]) + EB(1.0f - a.beta1) * g;
            v[i] = EB(a.beta2) * EB(data->in[2][i]) + EB(1.0f - a.beta2) * (g * g);
            const EB upd = (m[i] / EB(bc1)) / (sqrt_(v[i] / EB(bc2)) + EB(a.eps)) +
                           EB(a.wd) * EB(data->in[0][i]);
            param[i] = EB(data->in[0][i]) - EB(a.lr) * upd;
        }
        return NamedEB{{"param", param}, {"m", m}, {"v", v}};
    };
    p.canon = [data, N, a, bc1, bc2]() {
        Vec param = data->in[0], m = data->in[1], v = data->in[2];
        for (i64 i = 0; i < N; i++) {
            const float g = data->in[3][i] * a.gs;
            m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * g;
            v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * (g * g);
            const float upd = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + a.eps) + a.wd * param[i];
            param[i] = param[i] - a.lr * upd;
        }
        return Named{{"param", param}, {"m", m}, {"v", v}};
    };
    return p;
}

Problem make_sum_squares(const Shape& s) {
    Problem p;
    p.label = describe("sum_squares", s);
    p.block = s.block;
    const i64 N = s.N;
    const int blk = s.block;
    Rng r(79 + N);
    p.in = {randv(r, N, -3.0f, 3.0f)};
    const auto data = std::make_shared<const Problem>(p);  // the data, shared by the closures
    p.run = [data, N](const Numerics& nx) {
        return Named{{"sumsq", Vec{cpu::sum_squares(nx, data->in[0].data(), N)}}};
    };
    p.ref = [data, blk]() {
        const auto x = lift<EB>(data->in[0]);
        return NamedEB{{"sumsq", {dot_(x, x, blk)}}};
    };
    p.canon = [data, N, blk]() {
        return Named{{"sumsq", Vec{canonical_dot(data->in[0].data(), data->in[0].data(), N, blk)}}};
    };
    return p;
}

Shape shp(i64 B, i64 T, i64 C, i64 NH, i64 V, i64 N, int block) {
    Shape s;
    s.B = B;
    s.T = T;
    s.C = C;
    s.NH = NH;
    s.V = V;
    s.N = N;
    s.block = block;
    return s;
}

// Odd sizes throughout: C not a multiple of 16, T not a multiple of the block, T > block so the
// key tree has several blocks, a small block (8) so short rows have trees too.
const std::vector<OpDef>& op_table() {
    static const std::vector<OpDef> table = {
        {"layernorm",
         {shp(2, 75, 37, 1, 1, 1, 64), shp(1, 19, 70, 1, 1, 1, 8), shp(3, 5, 16, 1, 1, 1, 64)},
         make_layernorm},
        {"gelu", {shp(1, 1, 1, 1, 1, 1037, 64), shp(1, 1, 1, 1, 1, 5, 8)}, make_gelu},
        {"attention",
         {shp(1, 150, 16, 2, 1, 1, 64), shp(2, 13, 24, 3, 1, 1, 8), shp(1, 40, 40, 2, 1, 1, 8),
          shp(1, 1, 8, 1, 1, 1, 64)},
         make_attention},
        {"residual", {shp(1, 1, 1, 1, 1, 1037, 64)}, make_residual},
        {"embedding",
         {shp(3, 50, 19, 1, 23, 1, 8), shp(2, 150, 17, 1, 40, 1, 64), shp(4, 3, 5, 1, 3, 1, 64)},
         make_embedding},
        {"crossentropy",
         {shp(2, 3, 1, 1, 150, 1, 64), shp(1, 5, 1, 1, 1001, 1, 8), shp(1, 2, 1, 1, 7, 1, 64)},
         make_crossentropy},
        {"adamw", {shp(1, 1, 1, 1, 1, 1037, 64), shp(1, 7, 1, 1, 1, 50, 8)}, make_adamw},
        {"sum_squares",
         {shp(1, 1, 1, 1, 1, 1037, 64), shp(1, 1, 1, 1, 1, 100003, 64), shp(1, 1, 1, 1, 1, 13, 8)},
         make_sum_squares},
    };
    return table;
}

std::vector<Problem> all_problems() {
    std::vector<Problem> v;
    for (const auto& op : op_table())
        for (const auto& s : op.shapes) v.push_back(op.make(s));
    return v;
}

Numerics numerics(const Problem& p, Mode mode, Isa isa) {
    Numerics nx;
    nx.mode = mode;
    nx.block = p.block;
    nx.isa = isa;
    return nx;
}

const std::vector<float>& find(const Named& n, const std::string& name) {
    for (const auto& [k, v] : n)
        if (k == name) return v;
    FAIL("no output " << name);
    static Vec none;
    return none;
}

// Every kernel output within its EB bound of the fp64 value.
void check_against_ref(const Problem& p, const Named& got, const NamedEB& ref) {
    REQUIRE(got.size() == ref.size());
    for (size_t k = 0; k < ref.size(); k++) {
        const auto& [name, r] = ref[k];
        const Vec& g = find(got, name);
        REQUIRE(g.size() == r.size());
        i64 bad = 0, first = -1;
        double worst = 0;
        for (size_t i = 0; i < r.size(); i++) {
            const double err = std::fabs(double(g[i]) - r[i].v);
            const double bound = r[i].e + 4 * 0x1p-53 * std::fabs(r[i].v);
            worst = std::max(worst, bound > 0 ? err / bound : (err > 0 ? INFINITY : 0));
            if (!(err <= bound)) {
                if (first < 0) first = i64(i);
                bad++;
            }
        }
        INFO(p.label << " output " << name << ": " << bad << " outside the bound; first at "
                     << first
                     << (first >= 0 ? " got " + std::to_string(g[first]) + " ref " +
                                          std::to_string(r[first].v) + " bound " +
                                          std::to_string(r[first].e)
                                    : std::string())
                     << "; worst error/bound " << worst);
        CHECK(bad == 0);
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// properties, over the whole table

TEST_CASE("ops: forward and backward within the fp32 error bound of the fp64 reference", "[ops]") {
    const Isa best = detect_isa();
    for (const Problem& p : all_problems()) {
        g_any_order = false;
        const NamedEB ref = p.ref();
        for (Isa isa : {Isa::scalar, best})
            check_against_ref(p, p.run(numerics(p, Mode::bitwise, isa)), ref);
    }
}

TEST_CASE("ops: Mode::fast is within the any-order error bound", "[ops]") {
    for (const Problem& p : all_problems()) {
        g_any_order = true;
        const NamedEB ref = p.ref();
        g_any_order = false;
        for (Isa isa : permitted_isas())
            check_against_ref(p, p.run(numerics(p, Mode::fast, isa)), ref);
    }
}

TEST_CASE("ops: gradients match fp64 central finite differences", "[ops]") {
    g_any_order = false;
    for (const Problem& p : all_problems()) {
        if (!p.loss) continue;
        const Named got = p.run(numerics(p, Mode::bitwise, detect_isa()));
        const NamedEB ref = p.ref();
        const Inputs64 x0 = to64(p.in);
        for (size_t k = 0; k < p.diff.size(); k++) {
            const int which = p.diff[k];
            const Vec& g = find(got, p.grad_name[k]);
            const std::vector<EB>* r = nullptr;
            for (const auto& [name, v] : ref)
                if (name == p.grad_name[k]) r = &v;
            REQUIRE(r != nullptr);
            const Vec& init = p.grad_init[k];
            const i64 n = i64(p.in[which].size());
            Rng rng(1000 + n);
            std::vector<i64> idx{0, n - 1};
            for (int s = 0; s < 30; s++) idx.push_back(rng.below(n));
            for (i64 i : idx) {
                const double h = 0x1p-12;
                const auto L = [&](double dx) {
                    Inputs64 x = x0;
                    x[which][i] += dx;
                    return p.loss(x);
                };
                const auto [lp1, a1] = L(h);
                const auto [lm1, a2] = L(-h);
                const auto [lp2, a3] = L(h / 2);
                const auto [lm2, a4] = L(-h / 2);
                const double d1 = (lp1 - lm1) / (2 * h), d2 = (lp2 - lm2) / h;
                const double dr = (4 * d2 - d1) / 3;
                const double labs = std::max({a1, a2, a3, a4});
                const double fd_err = std::fabs(dr - d2) + 64 * 0x1p-53 * labs / (h / 2);
                const double expect = double(init[i]) + dr;
                INFO(p.label << " " << p.grad_name[k] << "[" << i << "]: kernel " << g[i] << " fd "
                             << expect << " ref " << (*r)[i].v << " bound " << (*r)[i].e
                             << " fd_err " << fd_err);
                CHECK(std::fabs(double(g[i]) - expect) <= (*r)[i].e + fd_err);
                CHECK(std::fabs((*r)[i].v - expect) <=
                      fd_err + (*r)[i].e * 0x1p-29 + 0x1p-50 * std::fabs(expect));
            }
        }
    }
}

TEST_CASE("ops: identical bits for 1, 2 and 3 threads", "[ops]") {
    const int saved = omp_get_max_threads();
    for (const Problem& p : all_problems()) {
        for (Mode mode : {Mode::bitwise, Mode::fast}) {
            const Numerics nx = numerics(p, mode, detect_isa());
            omp_set_num_threads(1);
            const Named one = p.run(nx);
            for (int threads : {2, 3}) {
                omp_set_num_threads(threads);
                const Named other = p.run(nx);
                for (size_t k = 0; k < one.size(); k++) {
                    INFO(p.label << " " << mode_name(mode) << " output " << one[k].first << " with "
                                 << threads << " threads");
                    CHECK(first_diff(one[k].second, other[k].second) == -1);
                }
            }
        }
    }
    omp_set_num_threads(saved);
}

TEST_CASE("ops: identical bits on every ISA (bitwise mode)", "[ops]") {
    for (const Problem& p : all_problems()) {
        const Named base = p.run(numerics(p, Mode::bitwise, Isa::scalar));
        for (Isa isa : permitted_isas()) {
            const Named other = p.run(numerics(p, Mode::bitwise, isa));
            for (size_t k = 0; k < base.size(); k++) {
                INFO(p.label << " output " << base[k].first << " on " << isa_name(isa));
                CHECK(first_diff(base[k].second, other[k].second) == -1);
            }
        }
    }
}

TEST_CASE("ops: bitwise mode equals a plainly written canonical-order reference", "[ops]") {
    for (const Problem& p : all_problems()) {
        if (!p.canon) continue;
        const Named want = p.canon();
        for (Isa isa : permitted_isas()) {
            const Named got = p.run(numerics(p, Mode::bitwise, isa));
            for (const auto& [name, v] : want) {
                const i64 d = first_diff(find(got, name), v);
                INFO(p.label << " output " << name << " on " << isa_name(isa)
                             << ", first differing element " << d
                             << (d >= 0 ? ": " + std::to_string(find(got, name)[d]) + " vs " +
                                              std::to_string(v[d])
                                        : std::string()));
                CHECK(d == -1);
            }
        }
    }
}

TEST_CASE("ops: crossentropy_backward may overwrite probs", "[ops]") {
    const i64 BT = 3, V = 37;
    Rng r(5);
    const Vec logits = randv(r, BT * V, -3.0f, 3.0f);
    const std::vector<int> tg{0, 36, 17};
    Numerics nx;
    Vec losses(BT), probs(BT * V), dl(BT * V);
    cpu::crossentropy_forward(nx, losses.data(), probs.data(), logits.data(), tg.data(), BT, V);
    cpu::crossentropy_backward(nx, dl.data(), probs.data(), tg.data(), 0.25f, BT, V);
    cpu::crossentropy_backward(nx, probs.data(), probs.data(), tg.data(), 0.25f, BT, V);
    CHECK(first_diff(dl, probs) == -1);
}

TEST_CASE("ops: bad token and target ids throw", "[ops]") {
    Numerics nx;
    const std::vector<int> tok{0, 5};
    Vec dout(2 * 3, 1.0f), dwte(4 * 3), dwpe(2 * 3);
    CHECK_THROWS_AS(
        cpu::embedding_backward(nx, dwte.data(), dwpe.data(), dout.data(), tok.data(), 1, 2, 3, 4),
        Error);
    Vec logits(2 * 4), losses(2), probs(2 * 4);
    CHECK_THROWS_AS(
        cpu::crossentropy_forward(nx, losses.data(), probs.data(), logits.data(), tok.data(), 2, 4),
        Error);
}

// ---------------------------------------------------------------------------------------------
// mathfun and vecmath

namespace {

// |got - ref| in units of ulp(ref) of fp32 (ulp of a subnormal: 2^-149). Matching infinities and
// NaNs count 0; a finite result where the true value overflows counts by FLT_MAX's ulp.
double ulp_error(float got, double ref) {
    if (std::isnan(ref)) return std::isnan(got) ? 0.0 : INFINITY;
    if (std::isnan(got)) return INFINITY;
    if (std::isinf(ref)) return double(got) == ref ? 0.0 : INFINITY;
    if (std::isinf(got) && std::fabs(ref) > double(FLT_MAX)) return 0.0;
    int e;
    std::frexp(ref, &e);
    const double ulp = std::ldexp(1.0, std::max(e - 24, -149));
    return std::fabs(double(got) - ref) / ulp;
}

struct MathFn {
    const char* name;
    void (*cpu::VecMath::*fn)(float*, const float*, i64);
    double (*ref)(double);
    float (*scalar)(float);
};
const MathFn kMathFns[] = {
    {"exp", &cpu::VecMath::exp, [](double x) { return std::exp(x); },
     [](float x) { return mathfun::exp(x); }},
    {"log", &cpu::VecMath::log, [](double x) { return std::log(x); },
     [](float x) { return mathfun::log(x); }},
    {"tanh", &cpu::VecMath::tanh, [](double x) { return std::tanh(x); },
     [](float x) { return mathfun::tanh(x); }},
    {"erf", &cpu::VecMath::erf, [](double x) { return std::erf(x); },
     [](float x) { return mathfun::erf(x); }},
};

// Max ulp error of f over bit patterns start, start+stride, ... (all of them when stride is 1).
double max_ulp_over_bits(const MathFn& f, const cpu::VecMath& vm, uint64_t stride, float* worst_x) {
    const i64 N = 1 << 16;
    Vec x(N), y(N);
    double worst = 0;
    for (uint64_t base = 0; base < (uint64_t(1) << 32); base += uint64_t(N) * stride) {
        i64 n = 0;
        for (; n < N; n++) {
            const uint64_t b = base + uint64_t(n) * stride;
            if (b >> 32) break;
            const uint32_t b32 = uint32_t(b);
            std::memcpy(&x[n], &b32, 4);
        }
        (vm.*(f.fn))(y.data(), x.data(), n);
        for (i64 i = 0; i < n; i++) {
            const double e = ulp_error(y[i], f.ref(double(x[i])));
            if (e > worst) {
                worst = e;
                *worst_x = x[i];
            }
        }
    }
    return worst;
}

bool same_or_both_nan(float a, float b) {
    return bits(a) == bits(b) || (a != a && b != b);
}

}  // namespace

TEST_CASE("mathfun: exp, log, tanh, erf within 2 ulp (bit patterns, stride 251)", "[mathfun]") {
    const auto& vm = cpu::vecmath(detect_isa());
    for (const MathFn& f : kMathFns) {
        float wx = 0;
        const double worst = max_ulp_over_bits(f, vm, 251, &wx);
        INFO(f.name << ": max " << worst << " ulp at " << wx);
        CHECK(worst <= kMathUlp);
    }
}

// Every float: about a minute per function on one core; run with `test_ops "[exhaustive]"`.
TEST_CASE("mathfun: exp, log, tanh, erf within 2 ulp (every float)", "[.][exhaustive]") {
    const auto& vm = cpu::vecmath(detect_isa());
    for (const MathFn& f : kMathFns) {
        float wx = 0;
        const double worst = max_ulp_over_bits(f, vm, 1, &wx);
        std::printf("%s: max %.4f ulp at %a\n", f.name, worst, double(wx));
        CHECK(worst <= kMathUlp);
    }
}

TEST_CASE("mathfun: special values", "[mathfun]") {
    const float inf = INFINITY, nan = NAN, tiny = 0x1p-149f;
    CHECK(mathfun::exp(0.0f) == 1.0f);
    CHECK(mathfun::exp(-0.0f) == 1.0f);
    CHECK(mathfun::exp(inf) == inf);
    CHECK(mathfun::exp(-inf) == 0.0f);
    CHECK(std::isnan(mathfun::exp(nan)));
    CHECK(mathfun::exp(88.72283935546875f) == inf);    // first float whose exp rounds past FLT_MAX
    CHECK(mathfun::exp(88.72283172607421875f) < inf);  // the float below it
    CHECK(mathfun::exp(-0x1.9fe368p+6f) == tiny);  // just above ln(2^-150): the smallest subnormal
    CHECK(mathfun::exp(-0x1.9fe36ap+6f) == 0.0f);  // just below: rounds to 0
    CHECK(mathfun::exp(-104.0f) == 0.0f);
    CHECK(mathfun::log(1.0f) == 0.0f);
    CHECK(mathfun::log(0.0f) == -inf);
    CHECK(mathfun::log(-0.0f) == -inf);
    CHECK(mathfun::log(inf) == inf);
    CHECK(std::isnan(mathfun::log(-1.0f)));
    CHECK(std::isnan(mathfun::log(-inf)));
    CHECK(std::isnan(mathfun::log(nan)));
    CHECK(ulp_error(mathfun::log(tiny), std::log(double(tiny))) <= kMathUlp);
    CHECK(bits(mathfun::tanh(0.0f)) == bits(0.0f));
    CHECK(bits(mathfun::tanh(-0.0f)) == bits(-0.0f));
    CHECK(mathfun::tanh(tiny) == tiny);
    CHECK(mathfun::tanh(inf) == 1.0f);
    CHECK(mathfun::tanh(-inf) == -1.0f);
    CHECK(mathfun::tanh(20.0f) == 1.0f);
    CHECK(std::isnan(mathfun::tanh(nan)));
    CHECK(bits(mathfun::erf(-0.0f)) == bits(-0.0f));
    CHECK(mathfun::erf(tiny) == tiny);
    CHECK(mathfun::erf(inf) == 1.0f);
    CHECK(mathfun::erf(-inf) == -1.0f);
    CHECK(std::isnan(mathfun::erf(nan)));
    // tanh is odd exactly; exp and tanh are monotone across the switch points.
    Rng r(3);
    for (int i = 0; i < 10000; i++) {
        const float x = r.uniform(-12.0f, 12.0f);
        CHECK(bits(mathfun::tanh(-x)) == (bits(mathfun::tanh(x)) ^ 0x80000000u));
        CHECK(bits(mathfun::erf(-x)) == (bits(mathfun::erf(x)) ^ 0x80000000u));
    }
    for (float x : {0.9f, 10.0f}) CHECK(mathfun::tanh(std::nextafter(x, 0.0f)) <= mathfun::tanh(x));
    for (float x : {1.0f, 3.92f}) CHECK(mathfun::erf(std::nextafter(x, 0.0f)) <= mathfun::erf(x));
}

TEST_CASE("vecmath: every routine gives identical bits on every ISA, bodies and tails alike",
          "[vecmath]") {
    const auto& s = cpu::vecmath(Isa::scalar);
    Rng r(9);
    for (i64 n : {1, 7, 15, 16, 17, 63, 64, 100, 1029}) {
        const Vec x = randv(r, n, -30.0f, 30.0f), y = randv(r, n), z = randv(r, n, 0.0f, 2.0f);
        // Elementwise maps, including special values in the tail.
        Vec xs = x;
        xs[n - 1] = (n % 2) ? NAN : -INFINITY;
        for (Isa isa : permitted_isas()) {
            const auto& v = cpu::vecmath(isa);
            INFO("n = " << n << " on " << isa_name(isa));
            for (const MathFn& f : kMathFns) {
                Vec a(n), b(n);
                (s.*(f.fn))(a.data(), xs.data(), n);
                (v.*(f.fn))(b.data(), xs.data(), n);
                for (i64 i = 0; i < n; i++) CHECK(same_or_both_nan(a[i], b[i]));
                for (i64 i = 0; i < n; i++) CHECK(same_or_both_nan(a[i], f.scalar(xs[i])));
            }
            Vec a(n), b(n);
            s.exp_sub(a.data(), x.data(), 3.5f, n);
            v.exp_sub(b.data(), x.data(), 3.5f, n);
            CHECK(first_diff(a, b) == -1);
            CHECK(bits(s.max(x.data(), n)) == bits(v.max(x.data(), n)));
            CHECK(std::isnan(v.max(xs.data(), n)) == std::isnan(s.max(xs.data(), n)));
            s.gelu_forward(a.data(), x.data(), n);
            v.gelu_forward(b.data(), x.data(), n);
            CHECK(first_diff(a, b) == -1);
            a = y;
            b = y;
            s.gelu_backward(a.data(), x.data(), z.data(), n);
            v.gelu_backward(b.data(), x.data(), z.data(), n);
            CHECK(first_diff(a, b) == -1);
            a = y;
            b = y;
            s.fma_elem(a.data(), x.data(), z.data(), n);
            v.fma_elem(b.data(), x.data(), z.data(), n);
            CHECK(first_diff(a, b) == -1);
            // fma_rows over 5 rows of a (5, n) matrix with row stride n + 3
            Vec mat = randv(r, 5 * (n + 3)), coef = randv(r, 10);
            a = y;
            b = y;
            s.fma_rows(a.data(), coef.data(), 2, mat.data(), n + 3, 5, n);
            v.fma_rows(b.data(), coef.data(), 2, mat.data(), n + 3, 5, n);
            CHECK(first_diff(a, b) == -1);
            cpu::AdamWCoeffs c{1e-3f, 0.9f, 0.99f, 0.1f, 0.01f, 1e-8f, 0.1f, 0.5f, 0.3f, 0.05f};
            Vec p1 = x, m1 = y, v1 = z, p2 = x, m2 = y, v2 = z;
            s.adamw(p1.data(), m1.data(), v1.data(), y.data(), n, c);
            v.adamw(p2.data(), m2.data(), v2.data(), y.data(), n, c);
            CHECK(first_diff(p1, p2) == -1);
            CHECK(first_diff(m1, m2) == -1);
            CHECK(first_diff(v1, v2) == -1);
            for (int blk : {1, 8, 64}) {
                const i64 nb = num_blocks(n, blk);
                Vec pa(nb), pb(nb);
                s.block_sums(pa.data(), x.data(), n, blk);
                v.block_sums(pb.data(), x.data(), n, blk);
                CHECK(first_diff(pa, pb) == -1);
                CHECK(bits(tree_sum(pb.data(), nb)) == bits(canonical_sum(x.data(), n, blk)));
                s.block_dots(pa.data(), x.data(), y.data(), n, blk);
                v.block_dots(pb.data(), x.data(), y.data(), n, blk);
                CHECK(first_diff(pa, pb) == -1);
                CHECK(bits(tree_sum(pb.data(), nb)) ==
                      bits(canonical_dot(x.data(), y.data(), n, blk)));
            }
        }
    }
}
