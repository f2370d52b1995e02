// Internal to the gradient check (validators/gradcheck*.cpp): the error-bound arithmetic EB and
// the fp64 references of every op, templated over double (the loss of the finite differences)
// and EB (the value with its fp32 error bound). The references mirror the kernels' formulas
// (kernels/cpu/cpu_kernels.h and the comments at the top of each kernel file), with the same
// fp32 constants; see gradcheck.h for how the bounds are derived.
//
// Index
//   OrderScope             the summation order the EB reference being computed assumes
//   EB arithmetic          + - · / and exp_ log_ tanh_ sqrt_ fma_, each adding its rounding
//   sum_, dot_, max_       reductions, with the depth of the canonical tree (or any order)
//   lift                   fp32 data as double or EB
//   *_fwd_ref, *_bwd_ref   the references: layernorm, rmsnorm, gelu, swiglu, rope, attention,
//                          residual, embedding, crossentropy, matmul; adamw_ref, sum_squares_ref
#pragma once
#include "validators/gradcheck.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace px::gradcheck {

// ---- error-bound arithmetic ---------------------------------------------------------------------

inline i64 ceil_log2(i64 n) {
    i64 d = 0;
    while ((i64(1) << d) < n) d++;
    return d;
}

// The order the EB reference being computed assumes: set by OrderScope for the duration of one
// OpProblem::ref call (per thread, so references on several threads do not interfere).
inline thread_local Order t_order = Order::canonical;
struct OrderScope {
    Order saved;
    explicit OrderScope(Order o) : saved(t_order) { t_order = o; }
    ~OrderScope() { t_order = saved; }
    OrderScope(const OrderScope&) = delete;
    OrderScope& operator=(const OrderScope&) = delete;
};

inline EB operator+(EB a, EB b) {
    const double v = a.v + b.v;
    return {v, a.e + b.e + kU * std::fabs(v)};
}
inline EB operator-(EB a, EB b) {
    const double v = a.v - b.v;
    return {v, a.e + b.e + kU * std::fabs(v)};
}
inline EB operator-(EB a) {
    return {-a.v, a.e};
}
inline EB operator*(EB a, EB b) {
    const double v = a.v * b.v;
    return {v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e + a.e * b.e + kU * std::fabs(v)};
}
inline EB operator/(EB a, EB b) {
    const double v = a.v / b.v;
    const double den = std::fabs(b.v) - b.e;
    const double e = den > 0 ? (a.e + std::fabs(v) * b.e) / den : INFINITY;
    return {v, e + kU * std::fabs(v)};
}
// One ulp of y is at most 2u·|y| for normal y.
inline EB exp_(EB a) {
    const double v = std::exp(a.v);
    return {v, v * std::expm1(a.e) + kMathUlp * 2 * kU * v * std::exp(a.e)};
}
inline EB log_(EB a) {
    const double v = std::log(a.v);
    const double den = a.v - a.e;
    return {v, (den > 0 ? a.e / den : INFINITY) + kMathUlp * 2 * kU * std::fabs(v)};
}
inline EB tanh_(EB a) {
    const double v = std::tanh(a.v);
    return {v, (1 - v * v) * a.e + kMathUlp * 2 * kU * std::fabs(v)};
}
inline EB sqrt_(EB a) {
    const double v = std::sqrt(a.v);
    return {v, a.e / (v + std::sqrt(std::max(a.v - a.e, 0.0))) + kU * v};
}
inline EB fma_(EB a, EB b, EB c) {
    const double v = a.v * b.v + c.v;
    return {v, std::fabs(a.v) * b.e + std::fabs(b.v) * a.e + a.e * b.e + c.e + kU * std::fabs(v)};
}
inline double exp_(double a) {
    return std::exp(a);
}
inline double log_(double a) {
    return std::log(a);
}
inline double tanh_(double a) {
    return std::tanh(a);
}
inline double sqrt_(double a) {
    return std::sqrt(a);
}

// |a| (exact) and the value a comparison reads.
inline double abs_(double a) {
    return std::fabs(a);
}
inline EB abs_(EB a) {
    return {std::fabs(a.v), a.e};
}
inline double val(double a) {
    return a;
}
inline double val(EB a) {
    return a.v;
}

inline double gamma_d(i64 d) {
    return double(d) * kU / (1.0 - double(d) * kU);
}
// Depth of a canonical sum of n terms in blocks of blk, in a tree over nb_tree blocks.
inline i64 sum_depth(i64 n, int blk, i64 nb_tree) {
    if (t_order == Order::any) return n;
    return std::min<i64>(n, blk) + ceil_log2(std::max<i64>(nb_tree, num_blocks(n, blk)));
}

// Σ x (n terms); Σ x·y (fma). nb_tree: blocks of the tree the sum is a subtree of (masked sums).
inline double sum_(const std::vector<double>& x, int, i64 = 0) {
    double s = 0;
    for (double a : x) s += a;
    return s;
}
inline EB sum_(const std::vector<EB>& x, int blk, i64 nb_tree = 0) {
    double v = 0, e = 0, a = 0;
    for (const EB& t : x) {
        v += t.v;
        e += t.e;
        a += std::fabs(t.v);
    }
    return {v, e + gamma_d(sum_depth(i64(x.size()), blk, nb_tree)) * a};
}
inline double dot_(const std::vector<double>& x, const std::vector<double>& y, int, i64 = 0) {
    double s = 0;
    for (size_t i = 0; i < x.size(); i++) s += x[i] * y[i];
    return s;
}
inline EB dot_(const std::vector<EB>& x, const std::vector<EB>& y, int blk, i64 nb_tree = 0) {
    double v = 0, e = 0, a = 0;
    for (size_t i = 0; i < x.size(); i++) {
        v += x[i].v * y[i].v;
        e += std::fabs(x[i].v) * y[i].e + std::fabs(y[i].v) * x[i].e + x[i].e * y[i].e;
        a += std::fabs(x[i].v * y[i].v);
    }
    return {v, e + gamma_d(sum_depth(i64(x.size()), blk, nb_tree)) * a};
}
inline double max_(const std::vector<double>& x) {
    return *std::max_element(x.begin(), x.end());
}
inline EB max_(const std::vector<EB>& x) {
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

// ---- references --------------------------------------------------------------------------------

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

// out (BT,C), rstd (BT) = rmsnorm(x (BT,C), w (C)): out = (x·rstd)·w, rstd = 1/sqrt(Σx²/C + eps).
template <class T>
void rmsnorm_fwd_ref(std::vector<T>& out, std::vector<T>& rstd, const std::vector<T>& x,
                     const std::vector<T>& w, i64 BT, i64 C, float eps, int blk) {
    out.assign(BT * C, T(0.0));
    rstd.assign(BT, T(0.0));
    for (i64 t = 0; t < BT; t++) {
        const std::vector<T> row(x.begin() + t * C, x.begin() + (t + 1) * C);
        const T ms = dot_(row, row, blk) / T(double(C));
        const T s = T(1.0) / sqrt_(ms + T(eps));
        for (i64 i = 0; i < C; i++) out[t * C + i] = (row[i] * s) * w[i];
        rstd[t] = s;
    }
}

// dinp (BT,C) += per row; dw (C) += Σ over the tokens of norm·dout.
template <class T>
void rmsnorm_bwd_ref(std::vector<T>& dinp, std::vector<T>& dw, const std::vector<T>& dout,
                     const std::vector<T>& x, const std::vector<T>& w, const std::vector<T>& rstd,
                     i64 BT, i64 C, int blk) {
    std::vector<std::vector<T>> norm(C, std::vector<T>(BT)), dcol(C, std::vector<T>(BT));
    for (i64 t = 0; t < BT; t++) {
        std::vector<T> nr(C), dn(C);
        for (i64 i = 0; i < C; i++) {
            nr[i] = x[t * C + i] * rstd[t];
            dn[i] = w[i] * dout[t * C + i];
            norm[i][t] = nr[i];
            dcol[i][t] = dout[t * C + i];
        }
        const T dnm = dot_(dn, nr, blk) / T(double(C));
        for (i64 i = 0; i < C; i++)
            dinp[t * C + i] = dinp[t * C + i] + (dn[i] - nr[i] * dnm) * rstd[t];
    }
    for (i64 i = 0; i < C; i++) dw[i] = dw[i] + dot_(norm[i], dcol[i], blk);
}

// sigmoid(g) and 1 - sigmoid(g) from t = exp(-|g|) (kernels/cpu/vecmath.h's sigmoid_pair).
template <class T>
void sigmoid_pair_ref(T g, T& sig, T& one_minus) {
    const T t = exp_(T(0.0) - abs_(g));
    const T d = T(1.0) + t;
    const T big = T(1.0) / d, small = t / d;
    sig = val(g) < 0 ? small : big;
    one_minus = val(g) < 0 ? big : small;
}
// out (N) = silu(gate)·up; backward: dgate += (dout·up)·silu'(gate), dup += dout·silu(gate).
template <class T>
void swiglu_fwd_ref(std::vector<T>& out, const std::vector<T>& g, const std::vector<T>& u) {
    out.resize(g.size());
    for (size_t i = 0; i < g.size(); i++) {
        T sig, om;
        sigmoid_pair_ref(g[i], sig, om);
        out[i] = (g[i] * sig) * u[i];
    }
}
template <class T>
void swiglu_bwd_ref(std::vector<T>& dg, std::vector<T>& du, const std::vector<T>& g,
                    const std::vector<T>& u, const std::vector<T>& dout) {
    for (size_t i = 0; i < g.size(); i++) {
        T sig, om;
        sigmoid_pair_ref(g[i], sig, om);
        const T dsilu = sig * fma_(g[i], om, T(1.0));
        dg[i] = dg[i] + (dout[i] * u[i]) * dsilu;
        du[i] = du[i] + dout[i] * (g[i] * sig);
    }
}

// out (B,T,NH,HS) = x rotated in pairs (i, i + HS/2) by row pos[t] of the table cos, sin
// (maxT, HS/2), whose values are inputs (exact); backward: dinp += the inverse rotation of dout.
template <class T>
void rope_fwd_ref(std::vector<T>& out, const std::vector<T>& x, const std::vector<T>& cos,
                  const std::vector<T>& sin, const std::vector<int>& pos, i64 B, i64 Tn, i64 H,
                  i64 HS) {
    const i64 h = HS / 2;
    out.assign(x.size(), T(0.0));
    for (i64 r = 0; r < B * Tn; r++)
        for (i64 k = 0; k < H; k++)
            for (i64 i = 0; i < h; i++) {
                const i64 at = (r * H + k) * HS + i, tab = i64(pos[r % Tn]) * h + i;
                const T x1 = x[at], x2 = x[at + h], c = cos[tab], s = sin[tab];
                out[at] = x1 * c - x2 * s;
                out[at + h] = x2 * c + x1 * s;
            }
}
template <class T>
void rope_bwd_ref(std::vector<T>& dinp, const std::vector<T>& dout, const std::vector<T>& cos,
                  const std::vector<T>& sin, const std::vector<int>& pos, i64 B, i64 Tn, i64 H,
                  i64 HS) {
    const i64 h = HS / 2;
    for (i64 r = 0; r < B * Tn; r++)
        for (i64 k = 0; k < H; k++)
            for (i64 i = 0; i < h; i++) {
                const i64 at = (r * H + k) * HS + i, tab = i64(pos[r % Tn]) * h + i;
                const T d1 = dout[at], d2 = dout[at + h], c = cos[tab], s = sin[tab];
                dinp[at] = dinp[at] + (d1 * c + d2 * s);
                dinp[at + h] = dinp[at + h] + (d2 * c - d1 * s);
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

// out (N) = a + b; backward: da += dout, db += dout
template <class T>
void residual_fwd_ref(std::vector<T>& out, const std::vector<T>& a, const std::vector<T>& b) {
    out.resize(a.size());
    for (size_t i = 0; i < a.size(); i++) out[i] = a[i] + b[i];
}
template <class T>
void residual_bwd_ref(std::vector<T>& da, std::vector<T>& db, const std::vector<T>& dout) {
    for (size_t i = 0; i < dout.size(); i++) {
        da[i] = da[i] + dout[i];
        db[i] = db[i] + dout[i];
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

// One AdamW step of param, m, v from grad, into param_out, m_out, v_out (cpu_kernels.h).
template <class T>
void adamw_ref(std::vector<T>& param_out, std::vector<T>& m_out, std::vector<T>& v_out,
               const std::vector<T>& param, const std::vector<T>& m, const std::vector<T>& v,
               const std::vector<T>& grad, const AdamWArgs& a, int t) {
    const float bc1 = float(1.0 - std::pow(double(a.beta1), t)),
                bc2 = float(1.0 - std::pow(double(a.beta2), t));
    for (size_t i = 0; i < param.size(); i++) {
        const T g = grad[i] * T(a.gs);
        m_out[i] = T(a.beta1) * m[i] + T(1.0f - a.beta1) * g;
        v_out[i] = T(a.beta2) * v[i] + T(1.0f - a.beta2) * (g * g);
        const T upd =
            (m_out[i] / T(bc1)) / (sqrt_(v_out[i] / T(bc2)) + T(a.eps)) + T(a.wd) * param[i];
        param_out[i] = param[i] - T(a.lr) * upd;
    }
}

// Σ x² (N) in one canonical sum.
template <class T>
std::vector<T> sum_squares_ref(const std::vector<T>& x, int blk) {
    return {dot_(x, x, blk)};
}

}  // namespace px::gradcheck
