// Gradient checks in fp64 (see gradcheck.h for the derivation of every bound).
#include "validators/gradcheck.h"

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/cpu_kernels.h"


#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numbers>
#include <string>
#include <utility>
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

i64 ceil_log2(i64 n) {
    i64 d = 0;
    while ((i64(1) << d) < n) d++;
    return d;
}

// ---------------------------------------------------------------------------------------------
// EB: error-bound arithmetic (see the top of gradcheck.h)

// The order the EB reference being computed assumes: set by OrderScope for the duration of one
// OpProblem::ref call (per thread, so references on several threads do not interfere).
thread_local Order t_order = Order::canonical;
struct OrderScope {
    Order saved;
    explicit OrderScope(Order o) : saved(t_order) { t_order = o; }
    ~OrderScope() { t_order = saved; }
    OrderScope(const OrderScope&) = delete;
    OrderScope& operator=(const OrderScope&) = delete;
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
    if (t_order == Order::any) return n;
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

OpProblem make_layernorm(const OpShape& s) {
    OpProblem p;
    p.op = "layernorm";
    p.label = describe(p.op, s);
    p.shape = s;
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
    const auto data = std::make_shared<const OpProblem>(p);  // the data, shared by the closures
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
    p.ref = [data, BT, C, blk](Order o) {
        const OrderScope scope(o);
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
    return p;
}

OpProblem make_gelu(const OpShape& s) {
    OpProblem p;
    p.op = "gelu";
    p.label = describe(p.op, s);
    p.shape = s;
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
    const auto data = std::make_shared<const OpProblem>(p);  // the data, shared by the closures
    p.run = [data, N](const Numerics& nx) {
        Vec out(N), dinp = data->grad_init[0];
        cpu::gelu_forward(nx, out.data(), data->in[0].data(), N);
        cpu::gelu_backward(nx, dinp.data(), data->in[0].data(), data->in[1].data(), N);
        return Named{{"out", out}, {"dinp", dinp}};
    };
    p.ref = [data](Order o) {
        const OrderScope scope(o);
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
    return p;
}

OpProblem make_attention(const OpShape& s) {
    OpProblem p;
    p.op = "attention";
    p.label = describe(p.op, s);
    p.shape = s;
    p.block = s.block;
    const AttnShape a{s.B, s.T, s.C, s.NH};
    const int blk = s.block;
    const i64 B = s.B, Tn = s.T, C = s.C, NH = s.NH, C3 = 3 * C;
    Rng r(37 + B * 131 + Tn * 17 + C);
    p.in = {randv(r, B * Tn * C3, -1.5f, 1.5f), randv(r, B * Tn * C)};  // qkv, R=dout
    p.diff = {0};
    p.grad_name = {"dqkv"};
    p.grad_init = {randv(r, B * Tn * C3)};
    const auto data = std::make_shared<const OpProblem>(p);  // the data, shared by the closures
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
    p.ref = [data, a, blk](Order o) {
        const OrderScope scope(o);
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
    return p;
}

OpProblem make_residual(const OpShape& s) {
    OpProblem p;
    p.op = "residual";
    p.label = describe(p.op, s);
    p.shape = s;
    p.block = s.block;
    const i64 N = s.N;
    Rng r(41 + N);
    p.in = {randv(r, N), randv(r, N), randv(r, N)};  // inp1, inp2, R=dout
    p.diff = {0, 1};
    p.grad_name = {"dinp1", "dinp2"};
    p.grad_init = {randv(r, N), randv(r, N)};
    const auto data = std::make_shared<const OpProblem>(p);  // the data, shared by the closures
    p.run = [data, N](const Numerics& nx) {
        Vec out(N), d1 = data->grad_init[0], d2 = data->grad_init[1];
        cpu::residual_forward(nx, out.data(), data->in[0].data(), data->in[1].data(), N);
        cpu::residual_backward(nx, d1.data(), d2.data(), data->in[2].data(), N);
        return Named{{"out", out}, {"dinp1", d1}, {"dinp2", d2}};
    };
    p.ref = [data, N](Order o) {
        const OrderScope scope(o);
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
    return p;
}

OpProblem make_embedding(const OpShape& s) {
    OpProblem p;
    p.op = "embedding";
    p.label = describe(p.op, s);
    p.shape = s;
    p.block = s.block;
    const i64 B = s.B, Tn = s.T, C = s.C, V = s.V;
    const int blk = s.block;
    Rng r(53 + B * 7 + Tn + V);
    std::vector<int> tok(B * Tn);
    for (auto& t : tok) t = r.below(V - 1);  // the last id never occurs: its row must not change
    tok[0] = tok[B * Tn - 1];                // one id at both ends: a tree over far-apart blocks
    p.ids = tok;
    p.in = {randv(r, V * C), randv(r, Tn * C), randv(r, B * Tn * C)};  // wte, wpe, R=dout
    p.diff = {0, 1};
    p.grad_name = {"dwte", "dwpe"};
    p.grad_init = {randv(r, V * C), randv(r, Tn * C)};
    const auto data = std::make_shared<const OpProblem>(p);  // the data, shared by the closures
    p.run = [data, tok, B, Tn, C, V](const Numerics& nx) {
        Vec out(B * Tn * C), dwte = data->grad_init[0], dwpe = data->grad_init[1];
        cpu::embedding_forward(nx, out.data(), tok.data(), data->in[0].data(), data->in[1].data(),
                               B, Tn, C);
        cpu::embedding_backward(nx, dwte.data(), dwpe.data(), data->in[2].data(), tok.data(), B, Tn,
                                C, V);
        return Named{{"out", out}, {"dwte", dwte}, {"dwpe", dwpe}};
    };
    p.ref = [data, tok, B, Tn, C, V, blk](Order o) {
        const OrderScope scope(o);
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
    return p;
}

OpProblem make_crossentropy(const OpShape& s) {
    OpProblem p;
    p.op = "crossentropy";
    p.label = describe(p.op, s);
    p.shape = s;
    p.block = s.block;
    const i64 BT = s.B * s.T, V = s.V;
    const int blk = s.block;
    Rng r(67 + BT + V);
    std::vector<int> tg(BT);
    for (auto& t : tg) t = r.below(V);
    p.ids = tg;
    p.in = {randv(r, BT * V, -4.0f, 4.0f)};
    p.diff = {0};
    p.grad_name = {"dlogits"};
    p.grad_init = {Vec(BT * V, 0.0f)};                       // assigned, not accumulated
    const float dloss = 1.0f / float(BT);                    // the mean loss
    const auto data = std::make_shared<const OpProblem>(p);  // the data, shared by the closures
    p.run = [data, tg, BT, V, dloss](const Numerics& nx) {
        Vec losses(BT), probs(BT * V), dl(BT * V);
        cpu::crossentropy_forward(nx, losses.data(), probs.data(), data->in[0].data(), tg.data(),
                                  BT, V);
        cpu::crossentropy_backward(nx, dl.data(), probs.data(), tg.data(), dloss, BT, V);
        return Named{{"losses", losses}, {"probs", probs}, {"dlogits", dl}};
    };
    p.ref = [data, tg, BT, V, blk, dloss](Order o) {
        const OrderScope scope(o);
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
    return p;
}

OpProblem make_adamw(const OpShape& s) {
    OpProblem p;
    p.op = "adamw";
    p.label = describe(p.op, s);
    p.shape = s;
    p.block = s.block;
    const i64 N = s.N;
    const int t = int(s.T);  // the step
    Rng r(71 + N + t);
    p.in = {randv(r, N), randv(r, N, -0.1f, 0.1f), randv(r, N, 0.0f, 0.01f),
            randv(r, N)};  // param, m, v, grad
    const AdamWArgs a;
    const auto data = std::make_shared<const OpProblem>(p);  // the data, shared by the closures
    p.run = [data, N, t, a](const Numerics& nx) {
        Vec param = data->in[0], m = data->in[1], v = data->in[2];
        cpu::adamw_update(nx, param.data(), m.data(), v.data(), data->in[3].data(), N, a.lr,
                          a.beta1, a.beta2, a.eps, a.wd, a.gs, t);
        return Named{{"param", param}, {"m", m}, {"v", v}};
    };
    const float bc1 = float(1.0 - std::pow(double(a.beta1), t)),
                bc2 = float(1.0 - std::pow(double(a.beta2), t));
    p.ref = [data, N, a, bc1, bc2](Order o) {
        const OrderScope scope(o);
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
    return p;
}

OpProblem make_sum_squares(const OpShape& s) {
    OpProblem p;
    p.op = "sum_squares";
    p.label = describe(p.op, s);
    p.shape = s;
    p.block = s.block;
    const i64 N = s.N;
    const int blk = s.block;
    Rng r(79 + N);
    p.in = {randv(r, N, -3.0f, 3.0f)};
    const auto data = std::make_shared<const OpProblem>(p);  // the data, shared by the closures
    p.run = [data, N](const Numerics& nx) {
        return Named{{"sumsq", Vec{cpu::sum_squares(nx, data->in[0].data(), N)}}};
    };
    p.ref = [data, blk](Order o) {
        const OrderScope scope(o);
        const auto x = lift<EB>(data->in[0]);
        return NamedEB{{"sumsq", {dot_(x, x, blk)}}};
    };
    return p;
}

// out (BT,OC) = inp (BT,C)·weight (OC,C)ᵀ + bias; backward: dinp (reduction over OC), dweight and
// dbias (reductions over the BT tokens), all accumulated.
template <class T>
void matmul_fwd_ref(std::vector<T>& out, const std::vector<T>& x, const std::vector<T>& w,
                    const std::vector<T>& b, i64 BT, i64 C, i64 OC, int blk) {
    out.assign(BT * OC, T(0.0));
    std::vector<T> row(C), wr(C);
    for (i64 m = 0; m < BT; m++) {
        for (i64 i = 0; i < C; i++) row[i] = x[m * C + i];
        for (i64 o = 0; o < OC; o++) {
            for (i64 i = 0; i < C; i++) wr[i] = w[o * C + i];
            out[m * OC + o] = dot_(row, wr, blk) + b[o];
        }
    }
}

template <class T>
void matmul_bwd_ref(std::vector<T>& dinp, std::vector<T>& dw, std::vector<T>& db,
                    const std::vector<T>& dout, const std::vector<T>& x, const std::vector<T>& w,
                    i64 BT, i64 C, i64 OC, int blk) {
    std::vector<T> d(OC), wc(OC), dcol(BT), xcol(BT);
    for (i64 m = 0; m < BT; m++)
        for (i64 i = 0; i < C; i++) {
            for (i64 o = 0; o < OC; o++) {
                d[o] = dout[m * OC + o];
                wc[o] = w[o * C + i];
            }
            dinp[m * C + i] = dinp[m * C + i] + dot_(d, wc, blk);
        }
    for (i64 o = 0; o < OC; o++) {
        for (i64 m = 0; m < BT; m++) dcol[m] = dout[m * OC + o];
        db[o] = db[o] + sum_(dcol, blk);
        for (i64 i = 0; i < C; i++) {
            for (i64 m = 0; m < BT; m++) xcol[m] = x[m * C + i];
            dw[o * C + i] = dw[o * C + i] + dot_(dcol, xcol, blk);
        }
    }
}

// The shape's C is the input width, V the output width OC.
OpProblem make_matmul(const OpShape& s) {
    OpProblem p;
    p.op = "matmul";
    p.label = describe(p.op, s);
    p.shape = s;
    p.block = s.block;
    const i64 BT = s.B * s.T, C = s.C, OC = s.V;
    const int blk = s.block;
    Rng r(83 + BT * 13 + C * 3 + OC);
    p.in = {randv(r, BT * C), randv(r, OC * C), randv(r, OC), randv(r, BT * OC)};  // x, w, b, R
    p.diff = {0, 1, 2};
    p.grad_name = {"dinp", "dweight", "dbias"};
    p.grad_init = {randv(r, BT * C), randv(r, OC * C), randv(r, OC)};
    const auto data = std::make_shared<const OpProblem>(p);  // the data, shared by the closures
    p.run = [data, BT, C, OC](const Numerics& nx) {
        Vec out(BT * OC), dinp = data->grad_init[0], dw = data->grad_init[1],
                          db = data->grad_init[2];
        cpu::matmul_forward(nx, out.data(), data->in[0].data(), data->in[1].data(),
                            data->in[2].data(), BT, C, OC);
        cpu::matmul_backward(nx, dinp.data(), dw.data(), db.data(), data->in[3].data(),
                             data->in[0].data(), data->in[1].data(), BT, C, OC);
        return Named{{"out", out}, {"dinp", dinp}, {"dweight", dw}, {"dbias", db}};
    };
    p.ref = [data, BT, C, OC, blk](Order o) {
        const OrderScope scope(o);
        std::vector<EB> out;
        const auto x = lift<EB>(data->in[0]), w = lift<EB>(data->in[1]);
        matmul_fwd_ref(out, x, w, lift<EB>(data->in[2]), BT, C, OC, blk);
        auto dinp = lift<EB>(data->grad_init[0]), dw = lift<EB>(data->grad_init[1]),
             db = lift<EB>(data->grad_init[2]);
        matmul_bwd_ref(dinp, dw, db, lift<EB>(data->in[3]), x, w, BT, C, OC, blk);
        return NamedEB{{"out", out}, {"dinp", dinp}, {"dweight", dw}, {"dbias", db}};
    };
    p.loss = [data, BT, C, OC, blk](const Inputs64& in) {
        std::vector<double> out;
        matmul_fwd_ref(out, in[0], in[1], in[2], BT, C, OC, blk);
        return weighted(out, data->in[3]);
    };
    return p;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// the op table

// Test shapes: odd sizes throughout: C not a multiple of 16, T not a multiple of the block, T >
// block so the key tree has several blocks, a small block (8) so short rows have trees too.
// Gradcheck shapes: the same traits, small enough to difference every element.
const std::vector<OpDef>& op_table() {
    const auto shp = op_shape;
    static const std::vector<OpDef> table = {
        {"layernorm",
         {shp(2, 75, 37, 1, 1, 1, 64), shp(1, 19, 70, 1, 1, 1, 8), shp(3, 5, 16, 1, 1, 1, 64)},
         shp(2, 5, 19, 1, 1, 1, 8),
         make_layernorm},
        {"gelu",
         {shp(1, 1, 1, 1, 1, 1037, 64), shp(1, 1, 1, 1, 1, 5, 8)},
         shp(1, 1, 1, 1, 1, 37, 8),
         make_gelu},
        {"attention",
         {shp(1, 150, 16, 2, 1, 1, 64), shp(2, 13, 24, 3, 1, 1, 8), shp(1, 40, 40, 2, 1, 1, 8),
          shp(1, 1, 8, 1, 1, 1, 64)},
         shp(2, 11, 12, 2, 1, 1, 4),
         make_attention},
        {"residual", {shp(1, 1, 1, 1, 1, 1037, 64)}, shp(1, 1, 1, 1, 1, 37, 8), make_residual},
        {"embedding",
         {shp(3, 50, 19, 1, 23, 1, 8), shp(2, 150, 17, 1, 40, 1, 64), shp(4, 3, 5, 1, 3, 1, 64)},
         shp(3, 7, 5, 1, 11, 1, 4),
         make_embedding},
        {"crossentropy",
         {shp(2, 3, 1, 1, 150, 1, 64), shp(1, 5, 1, 1, 1001, 1, 8), shp(1, 2, 1, 1, 7, 1, 64)},
         shp(2, 3, 1, 1, 37, 1, 8),
         make_crossentropy},
        {"matmul",
         {shp(2, 13, 37, 1, 19, 1, 8), shp(1, 5, 70, 1, 3, 1, 64)},
         shp(2, 5, 19, 1, 13, 1, 8),
         make_matmul},
        {"adamw",
         {shp(1, 1, 1, 1, 1, 1037, 64), shp(1, 7, 1, 1, 1, 50, 8)},
         shp(1, 3, 1, 1, 1, 37, 8),
         make_adamw},
        {"sum_squares",
         {shp(1, 1, 1, 1, 1, 1037, 64), shp(1, 1, 1, 1, 1, 100003, 64), shp(1, 1, 1, 1, 1, 13, 8)},
         shp(1, 1, 1, 1, 1, 37, 8),
         make_sum_squares},
    };
    return table;
}

std::vector<std::string> op_names() {
    std::vector<std::string> v;
    for (const OpDef& d : op_table()) v.emplace_back(d.name);
    return v;
}

const OpDef& find_op(const std::string& name) {
    for (const OpDef& d : op_table())
        if (name == d.name) return d;
    std::string msg = "unknown op '";
    msg += name;
    msg += "'; the ops are:";
    for (const std::string& n : op_names()) {
        msg += " ";
        msg += n;
    }
    msg += " (or 'all')";
    throw ConfigError(msg);
}

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
// reports

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

// Folds one element into a row: error, bound, the values behind them.
void account(GradcheckRow& row, i64 index, double err, double bound, double got, double expect) {
    row.checked++;
    const bool ok = err <= bound;
    if (!ok) row.failing++;
    const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0.0);
    if (row.worst < 0 || ratio > row.ratio || (std::isnan(ratio) && !std::isnan(row.ratio))) {
        row.ratio = ratio;
        row.worst = index;
        row.max_error = err;
        row.bound = bound;
        row.got = got;
        row.expect = expect;
    }
}

}  // namespace

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

std::string GradcheckRow::to_json() const { return row_json(*this).dump(2); }

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
                account(row, s.index, s.error(), s.bound(), s.kernel, s.expect);
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
            account(row, i64(i), err, r[i].e + 4 * 0x1p-53 * std::fabs(r[i].v), (*g)[i], r[i].v);
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

// ---------------------------------------------------------------------------------------------
// the whole model

namespace {

void layernorm64(double* out, const double* x, const double* w, const double* b, int C) {
    double mean = 0, var = 0;
    for (int i = 0; i < C; i++) mean += x[i];
    mean /= C;
    for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + 1e-5);
    for (int i = 0; i < C; i++) out[i] = (x[i] - mean) * rstd * w[i] + b[i];
}
void linear64(double* out, const double* x, const double* w, const double* b, int C, int OC) {
    for (int o = 0; o < OC; o++) {
        double s = b ? b[o] : 0.0;
        for (int i = 0; i < C; i++) s += x[i] * w[o * C + i];
        out[o] = s;
    }
}

}  // namespace

double RefGPT::loss(const std::vector<int>& tok, const std::vector<int>& tgt, int B, int T) const {
    const int C = static_cast<int>(mc.hidden), NH = static_cast<int>(mc.heads), HS = C / NH;
    const int F = static_cast<int>(mc.ffn), V = static_cast<int>(mc.vocab);
    std::vector<double> x(static_cast<size_t>(B * T * C)), ln(x.size()), y(x.size()), tmp(x.size());
    std::vector<double> qkv(static_cast<size_t>(B * T * 3 * C)), h(static_cast<size_t>(F));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++)
                x[(b * T + t) * C + i] =
                    P(table.wte)[tok[b * T + t] * C + i] + P(table.wpe)[t * C + i];
    for (int l = 0; l < mc.layers; l++) {
        auto W = [&](LayerParam q) { return P(table.layer_index(l, q)); };
        for (int r = 0; r < B * T; r++) {
            layernorm64(&ln[r * C], &x[r * C], W(LN1W), W(LN1B), C);
            linear64(&qkv[r * 3 * C], &ln[r * C], W(QKVW), W(QKVB), C, 3 * C);
        }
        for (int b = 0; b < B; b++)
            for (int hh = 0; hh < NH; hh++)
                for (int t = 0; t < T; t++) {
                    std::vector<double> a(static_cast<size_t>(t + 1));
                    const double* q = &qkv[(b * T + t) * 3 * C + hh * HS];
                    double mx = -1e300;
                    for (int s = 0; s <= t; s++) {
                        const double* k = &qkv[(b * T + s) * 3 * C + C + hh * HS];
                        double d = 0;
                        for (int i = 0; i < HS; i++) d += q[i] * k[i];
                        a[s] = d / std::sqrt(static_cast<double>(HS));
                        mx = std::max(mx, a[s]);
                    }
                    double sum = 0;
                    for (int s = 0; s <= t; s++) sum += (a[s] = std::exp(a[s] - mx));
                    for (int i = 0; i < HS; i++) {
                        double o = 0;
                        for (int s = 0; s <= t; s++)
                            o += a[s] / sum * qkv[(b * T + s) * 3 * C + 2 * C + hh * HS + i];
                        y[(b * T + t) * C + hh * HS + i] = o;
                    }
                }
        for (int r = 0; r < B * T; r++) {
            linear64(&tmp[r * C], &y[r * C], W(ATTPROJW), W(ATTPROJB), C, C);
            for (int i = 0; i < C; i++) x[r * C + i] += tmp[r * C + i];
            layernorm64(&ln[r * C], &x[r * C], W(LN2W), W(LN2B), C);
            linear64(h.data(), &ln[r * C], W(FCW), W(FCB), C, F);
            for (double& v : h)
                v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
            linear64(&tmp[r * C], h.data(), W(FCPROJW), W(FCPROJB), F, C);
            for (int i = 0; i < C; i++) x[r * C + i] += tmp[r * C + i];
        }
    }
    double total = 0;
    std::vector<double> logits(static_cast<size_t>(V));
    for (int r = 0; r < B * T; r++) {
        layernorm64(&ln[r * C], &x[r * C], P(table.lnfw), P(table.lnfb), C);
        linear64(logits.data(), &ln[r * C], P(table.wte), nullptr, C, V);
        const double mx = *std::max_element(logits.begin(), logits.end());
        double sum = 0;
        for (double v : logits) sum += std::exp(v - mx);
        total += std::log(sum) - (logits[tgt[r]] - mx);
    }
    return total / (B * T);
}

bool ModelSample::ok() const {
    return std::abs(analytic - fd) <= bound;
}

ModelProbe model_fd_samples(const ModelConfig& mc, const Numerics& nx, const ModelFdOptions& o) {
    const int B = o.B, T = o.T > 0 ? o.T : static_cast<int>(mc.seq_len);
    if (B < 1 || T < 1 || T > mc.seq_len) {
        std::string msg =
            "gradcheck: the batch must be at least one sequence of 1 to model.seq_len (";
        msg += std::to_string(mc.seq_len);
        msg += ") tokens";
        throw ConfigError(msg);
    }
    std::vector<int> tok, tgt;
    for (int i = 0; i < B * T; i++) {
        tok.push_back(static_cast<int>((i * 7 + 3) % mc.vocab));
        tgt.push_back(static_cast<int>((i * 5 + 1) % mc.vocab));
    }
    GPT model(mc, nx);
    for (size_t i = 0; i < model.table().entries.size(); i++) {
        const Tensor t = model.param(static_cast<int>(i));
        fill_normal(t.f32(), t.numel(), 0.0f, o.init_std, o.seed, static_cast<u32>(i), 0);
    }

    ModelProbe probe;
    model.forward(tok.data(), tgt.data(), B, T);
    double loss32 = 0;
    for (int i = 0; i < B * T; i++) loss32 += model.losses()[i];
    probe.loss32 = loss32 / (B * T);
    std::vector<float> grads(static_cast<size_t>(model.grad_layout().total), 0.0f);
    model.backward(grads.data(), tok.data(), tgt.data(), 1.0f / static_cast<float>(B * T));
    model.combine_tied_grads(grads.data());

    RefGPT ref{mc, model.table(), {}};
    ref.p.assign(model.params(), model.params() + model.table().total);
    probe.loss64 = ref.loss(tok, tgt, B, T);
    probe.loss_bound = 60 * 6e-8 * std::abs(probe.loss64) + 1e-6;

    const double h = o.h;
    for (size_t ti = 0; ti < model.table().entries.size(); ti++) {
        const TableEntry& e = model.table().entries[ti];
        probe.names.push_back(e.name);
        probe.sizes.push_back(e.numel());
        const i64 n = e.numel();
        const int samples = static_cast<int>(std::min<i64>(n, o.samples));
        std::vector<ModelSample> got(static_cast<size_t>(samples));
        double scale = 0;
        for (int s = 0; s < samples; s++) {
            const i64 element = (s * 7919) % n, idx = e.offset + element;
            const double orig = ref.p[idx];
            ref.p[idx] = orig + h;
            const double lp = ref.loss(tok, tgt, B, T);
            ref.p[idx] = orig - h;
            const double lm = ref.loss(tok, tgt, B, T);
            ref.p[idx] = orig;
            got[s].tensor = static_cast<int>(ti);
            got[s].element = element;
            got[s].fd = (lp - lm) / (2 * h);
            got[s].analytic = grads[idx];
            scale = std::max(scale, std::abs(got[s].fd));
        }
        for (ModelSample& s : got) {
            s.bound = 1e-4 * scale + 1e-3 * std::abs(s.fd) + 1e-9;
            probe.samples.push_back(s);
        }
    }
    return probe;
}

std::vector<GradcheckRow> gradcheck_model(const ModelConfig& mc, const Numerics& nx,
                                          const ModelFdOptions& o) {
    const ModelProbe probe = model_fd_samples(mc, nx, o);
    std::vector<GradcheckRow> rows;
    GradcheckRow loss;
    loss.op = "model";
    loss.tensor = "loss";
    loss.kind = "loss";
    loss.size = 1;
    account(loss, 0, std::abs(probe.loss32 - probe.loss64), probe.loss_bound, probe.loss32,
            probe.loss64);
    rows.push_back(loss);
    for (size_t t = 0; t < probe.names.size(); t++) {
        GradcheckRow row;
        row.op = "model";
        row.tensor = probe.names[t];
        row.kind = "gradient";
        row.size = probe.sizes[t];
        for (const ModelSample& s : probe.samples)
            if (s.tensor == static_cast<int>(t))
                account(row, s.element, std::abs(s.analytic - s.fd), s.bound, s.analytic, s.fd);
        rows.push_back(row);
    }
    return rows;
}

ModelConfig scaled_model(const ModelConfig& mc, std::string* note) {
    ModelConfig s = mc;
    s.layers = std::min<i64>(mc.layers, 2);
    s.hidden = std::min<i64>(mc.hidden, 32);
    s.heads = std::max<i64>(1, std::min(mc.heads, s.hidden));
    while (s.hidden % s.heads != 0) s.heads--;
    s.ffn = std::min<i64>(mc.ffn, 4 * s.hidden);
    s.vocab = std::min<i64>(mc.vocab, 64);
    s.seq_len = std::min<i64>(mc.seq_len, 16);
    s.init_from.clear();
    if (note) {
        note->clear();
        if (s == mc) return s;
        const auto part = [&](const char* key, i64 from, i64 to) {
            if (from == to) return;
            if (!note->empty()) *note += ", ";
            *note += key;
            *note += " ";
            *note += std::to_string(from);
            *note += " -> ";
            *note += std::to_string(to);
        };
        part("layers", mc.layers, s.layers);
        part("hidden", mc.hidden, s.hidden);
        part("heads", mc.heads, s.heads);
        part("ffn", mc.ffn, s.ffn);
        part("vocab", mc.vocab, s.vocab);
        part("seq_len", mc.seq_len, s.seq_len);
        if (!mc.init_from.empty()) {
            if (!note->empty()) *note += ", ";
            *note += "random weights instead of model.init_from";
        }
    }
    return s;
}

}  // namespace px::gradcheck
