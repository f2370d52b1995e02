// CPU ops: references, gradients, invariance, and core/base/mathfun.h. The op table, the fp64 and
// error-bound references and the finite differences live in validators/gradcheck.h (shared with
// `parallax gradcheck`); this file adds the plain canonical-order references and the properties.
//
// Index
//   data and helpers        bit comparison, the ISAs this CPU permits
//   canonical references    plain float code in the canonical order, for bit-exact checks
//   the problems            every op of gradcheck's table on its test shapes (matmul: test_matmul)
//   properties              forward and backward vs the fp64 reference, finite differences,
//                           thread invariance, ISA invariance, bitwise vs canonical, fast mode
//   mathfun and vecmath     accuracy in ulp, special values, identical bits on every ISA
//
// How the error bounds are derived (none is tuned to make a test pass): see validators/gradcheck.h.
//   * The kernel must lie within the EB bound of the fp64 value (plus a few double ulps for the
//     reference's own rounding).
//   * A gradient must match the finite difference within its EB bound plus the FD error, and the
//     analytic fp64 backward must match it within the FD error (plus its own fp64 rounding).
#include <catch2/catch.hpp>

#include "core/base/error.h"
#include "core/base/mathfun.h"
#include "core/base/numerics.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vecmath.h"
#include "kernels/ops.h"
#include "validators/gradcheck.h"

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
#include <string>
#include <utility>
#include <vector>

using namespace px;
using namespace px::gradcheck;

namespace {

// ---------------------------------------------------------------------------------------------
// data and helpers

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

// ---------------------------------------------------------------------------------------------
// canonical references: plain float code in the canonical order (bitwise mode), per op

Named canon_layernorm(const OpProblem& p) {
    const i64 BT = p.shape.B * p.shape.T, C = p.shape.C;
    const int blk = p.block;
    const Vec &x = p.in[0], &w = p.in[1], &bb = p.in[2], &dout = p.in[3];
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
    Vec dinp = p.grad_init[0], dw = p.grad_init[1], db = p.grad_init[2];
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
}

Named canon_rmsnorm(const OpProblem& p) {
    const i64 BT = p.shape.B * p.shape.T, C = p.shape.C;
    const int blk = p.block;
    const Vec &x = p.in[0], &w = p.in[1], &dout = p.in[2];
    Vec out(BT * C), rstd(BT);
    for (i64 t = 0; t < BT; t++) {
        const float ms = canonical_dot(&x[t * C], &x[t * C], C, blk) / float(C);
        const float sd = 1.0f / std::sqrt(ms + kRmsEps);
        for (i64 i = 0; i < C; i++) out[t * C + i] = (x[t * C + i] * sd) * w[i];
        rstd[t] = sd;
    }
    Vec dinp = p.grad_init[0], dw = p.grad_init[1];
    const i64 nb = num_blocks(BT, blk);
    Vec pw(nb * C, 0.0f), nr(C), dn(C);
    for (i64 t = 0; t < BT; t++) {
        for (i64 i = 0; i < C; i++) {
            nr[i] = x[t * C + i] * rstd[t];
            dn[i] = w[i] * dout[t * C + i];
            float& aw = pw[(t / blk) * C + i];
            aw = std::fma(nr[i], dout[t * C + i], aw);
        }
        const float dnm = canonical_dot(dn.data(), nr.data(), C, blk) / float(C);
        for (i64 i = 0; i < C; i++) dinp[t * C + i] += (dn[i] - nr[i] * dnm) * rstd[t];
    }
    tree_combine_rows(pw.data(), nb, C);
    for (i64 i = 0; i < C; i++) dw[i] += pw[i];
    return Named{{"out", out}, {"rstd", rstd}, {"dinp", dinp}, {"dweight", dw}};
}

Named canon_swiglu(const OpProblem& p) {
    const size_t N = p.in[0].size();
    Vec out(N), dg = p.grad_init[0], du = p.grad_init[1];
    for (size_t i = 0; i < N; i++) {
        const float g = p.in[0][i], u = p.in[1][i], d = p.in[2][i];
        const float t = mathfun::exp(0.0f - std::fabs(g)), den = 1.0f + t;
        const float sig = g < 0.0f ? t / den : 1.0f / den, om = g < 0.0f ? 1.0f / den : t / den;
        out[i] = (g * sig) * u;
        dg[i] = dg[i] + (d * u) * (sig * std::fma(g, om, 1.0f));
        du[i] = du[i] + d * (g * sig);
    }
    return Named{{"out", out}, {"dgate", dg}, {"dup", du}};
}

Named canon_rope(const OpProblem& p) {
    const i64 BT = p.shape.B * p.shape.T, H = p.shape.NH, HS = p.shape.C / H, h = HS / 2;
    const Vec &x = p.in[0], &cs = p.in[1], &sn = p.in[2], &dout = p.in[3];
    Vec out(x.size()), dinp = p.grad_init[0];
    for (i64 r = 0; r < BT; r++)
        for (i64 k = 0; k < H; k++)
            for (i64 i = 0; i < h; i++) {
                const i64 at = (r * H + k) * HS + i, tab = i64(p.ids[r % p.shape.T]) * h + i;
                out[at] = x[at] * cs[tab] - x[at + h] * sn[tab];
                out[at + h] = x[at + h] * cs[tab] + x[at] * sn[tab];
                dinp[at] += dout[at] * cs[tab] + dout[at + h] * sn[tab];
                dinp[at + h] += dout[at + h] * cs[tab] - dout[at] * sn[tab];
            }
    return Named{{"out", out}, {"dinp", dinp}};
}

Named canon_gelu(const OpProblem& p) {
    const i64 N = p.shape.N;
    Vec out(N), dinp = p.grad_init[0];
    for (i64 i = 0; i < N; i++) {
        const float x = p.in[0][i];
        const float u = kGeluS * (x + ((kGeluA * x) * x) * x);
        const float t = mathfun::tanh(u);
        out[i] = (0.5f * x) * (1.0f + t);
        const float sech2 = std::fma(-t, t, 1.0f);
        const float du = kGeluS * (1.0f + (kGeluA3 * x) * x);
        const float local = 0.5f * (1.0f + t) + ((0.5f * x) * sech2) * du;
        dinp[i] = dinp[i] + local * p.in[1][i];
    }
    return Named{{"out", out}, {"dinp", dinp}};
}

// Plain canonical order: per query, dots over HS, Σexp over the key blocks of T with the
// masked blocks absent, att·v as block partials in the same tree; backward likewise.
Named canon_attention(const OpProblem& p) {
    const i64 B = p.shape.B, Tn = p.shape.T, C = p.shape.C, NH = p.shape.NH, HS = C / NH,
              C3 = 3 * C;
    const int blk = p.block;
    const Vec& qkv = p.in[0];
    const Vec& dout = p.in[1];
    const float scale = 1.0f / std::sqrt(float(HS));
    const i64 nkb = num_blocks(Tn, blk), TT = B * NH * Tn * Tn;
    Vec out(B * Tn * C), pre(TT, 0.0f), att(TT, 0.0f), dpre(TT, 0.0f), datt(TT, 0.0f),
        dqkv = p.grad_init[0];
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
                for (i64 j = 0; j <= t; j++) part[j / blk] = std::fma(at[j], da[j], part[j / blk]);
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
}

Named canon_residual(const OpProblem& p) {
    const i64 N = p.shape.N;
    Vec out(N), d1 = p.grad_init[0], d2 = p.grad_init[1];
    for (i64 i = 0; i < N; i++) {
        out[i] = p.in[0][i] + p.in[1][i];
        d1[i] += p.in[2][i];
        d2[i] += p.in[2][i];
    }
    return Named{{"out", out}, {"dinp1", d1}, {"dinp2", d2}};
}

// Plain canonical order: for each output row, dense block partials over all blocks of BT,
// absent blocks marked, then the tree.
Named canon_embedding(const OpProblem& p) {
    const std::vector<int>& tok = p.ids;
    const i64 B = p.shape.B, Tn = p.shape.T, C = p.shape.C, V = p.shape.V;
    const int blk = p.block;
    const Vec& dout = p.in[2];
    Vec out(B * Tn * C), dwte = p.grad_init[0], dwpe = p.grad_init[1];
    for (i64 n = 0; n < B * Tn; n++)
        for (i64 i = 0; i < C; i++)
            out[n * C + i] = p.in[0][tok[n] * C + i] + p.in[1][(n % Tn) * C + i];
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
}

Named canon_crossentropy(const OpProblem& p) {
    const std::vector<int>& tg = p.ids;
    const i64 BT = p.shape.B * p.shape.T, V = p.shape.V;
    const int blk = p.block;
    const float dloss = 1.0f / float(BT);  // the mean loss, as the problem's backward
    Vec losses(BT), probs(BT * V), dl(BT * V);
    for (i64 r = 0; r < BT; r++) {
        const float* l = &p.in[0][r * V];
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
}

Named canon_adamw(const OpProblem& p) {
    const i64 N = p.shape.N;
    const int t = int(p.shape.T);  // the step
    const AdamWArgs a;
    const float bc1 = float(1.0 - std::pow(double(a.beta1), t)),
                bc2 = float(1.0 - std::pow(double(a.beta2), t));
    Vec param = p.in[0], m = p.in[1], v = p.in[2];
    for (i64 i = 0; i < N; i++) {
        const float g = p.in[3][i] * a.gs;
        m[i] = a.beta1 * m[i] + (1.0f - a.beta1) * g;
        v[i] = a.beta2 * v[i] + (1.0f - a.beta2) * (g * g);
        const float upd = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + a.eps) + a.wd * param[i];
        param[i] = param[i] - a.lr * upd;
    }
    return Named{{"param", param}, {"m", m}, {"v", v}};
}

Named canon_sum_squares(const OpProblem& p) {
    const i64 N = p.shape.N;
    const int blk = p.block;
    return Named{{"sumsq", Vec{canonical_dot(p.in[0].data(), p.in[0].data(), N, blk)}}};
}

// ---------------------------------------------------------------------------------------------
// the problems

// An op problem of gradcheck's table with its canonical reference (null: none).
struct Problem : OpProblem {
    std::function<Named()> canon;
};

std::function<Named()> canon_of(const Problem& p) {
    static const std::vector<std::pair<std::string, Named (*)(const OpProblem&)>> kCanon = {
        {"layernorm", canon_layernorm},
        {"rmsnorm", canon_rmsnorm},
        {"gelu", canon_gelu},
        {"swiglu", canon_swiglu},
        {"rope", canon_rope},
        {"attention", canon_attention},
        {"residual", canon_residual},
        {"embedding", canon_embedding},
        {"crossentropy", canon_crossentropy},
        {"adamw", canon_adamw},
        {"sum_squares", canon_sum_squares},
    };
    for (const auto& [name, fn] : kCanon)
        if (name == p.op) return [fn, q = std::make_shared<const Problem>(p)]() { return fn(*q); };
    return {};
}

// Every op of gradcheck's table (matmul has its own suite, tests/kernels/test_matmul.cpp).
std::vector<Problem> all_problems() {
    std::vector<Problem> v;
    for (const std::string& name : op_names()) {
        if (name == "matmul") continue;
        for (const auto& s : find_op(name).shapes) {
            Problem p;
            static_cast<OpProblem&>(p) = find_op(name).make(s);
            p.canon = canon_of(p);
            v.push_back(p);
        }
    }
    return v;
}

Numerics numerics(const Problem& p, Mode mode, Isa isa) {
    return make_numerics_for(p, mode, isa);
}

const std::vector<float>& find(const Named& n, const std::string& name) {
    if (const Vec* v = find_output(n, name)) return *v;
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
        const NamedEB ref = p.ref(Order::canonical);
        for (Isa isa : {Isa::scalar, best})
            check_against_ref(p, p.run(numerics(p, Mode::bitwise, isa)), ref);
    }
}

TEST_CASE("ops: Mode::fast is within the any-order error bound", "[ops]") {
    for (const Problem& p : all_problems()) {
        const NamedEB ref = p.ref(Order::any);
        for (Isa isa : permitted_isas())
            check_against_ref(p, p.run(numerics(p, Mode::fast, isa)), ref);
    }
}

TEST_CASE("ops: gradients match fp64 central finite differences", "[ops]") {
    for (const Problem& p : all_problems()) {
        if (!p.loss) continue;
        const Named got = p.run(numerics(p, Mode::bitwise, detect_isa()));
        const NamedEB ref = p.ref(Order::canonical);
        for (size_t k = 0; k < p.diff.size(); k++) {
            for (const FdSample& s : fd_samples(p, k, got, ref)) {
                INFO(p.label << " " << p.grad_name[k] << "[" << s.index << "]: kernel "
                             << float(s.kernel) << " fd " << s.expect << " ref " << s.ref
                             << " bound " << s.ref_bound << " fd_err " << s.fd_err);
                CHECK(std::fabs(s.kernel - s.expect) <= s.ref_bound + s.fd_err);
                CHECK(std::fabs(s.ref - s.expect) <=
                      s.fd_err + s.ref_bound * 0x1p-29 + 0x1p-50 * std::fabs(s.expect));
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

TEST_CASE("ops: embedding_backward over a row range is that node's value, positions kept",
          "[ops]") {
    // Flat tokens [3, 12) of a (3, 5) batch in blocks of 2: the range starts and ends inside
    // sequences. Each output row is the canonical tree over the range's own blocks (counted from
    // its first token), written out plainly here; positions stay n mod T.
    const i64 B = 3, T = 5, C = 4, V = 6, lo = 3, hi = 12;
    Numerics nx;
    nx.block = 2;
    Rng r(11);
    const Vec dout = randv(r, B * T * C, -1.0f, 1.0f);
    std::vector<int> tok(static_cast<size_t>(B * T));
    for (i64 n = 0; n < B * T; n++) tok[static_cast<size_t>(n)] = static_cast<int>((n * 7 + 3) % V);
    Vec dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
    cpu::embedding_backward(nx, dwte.data(), dwpe.data(), dout.data(), tok.data(), B, T, C, V, lo,
                            hi);
    const i64 nb = num_blocks(hi - lo, nx.block);
    auto reference = [&](auto belongs) {  // the tree over the range's blocks of the rows chosen
        Vec p(static_cast<size_t>(nb * C), 0.0f), out(C, 0.0f);
        std::vector<unsigned char> present(static_cast<size_t>(nb), 0);
        for (i64 n = lo; n < hi; n++) {
            if (!belongs(n)) continue;
            const i64 b = (n - lo) / nx.block;
            present[static_cast<size_t>(b)] = 1;
            for (i64 i = 0; i < C; i++) p[b * C + i] = p[b * C + i] + dout[n * C + i];
        }
        if (tree_combine_rows(p.data(), nb, C, present.data()))
            for (i64 i = 0; i < C; i++) out[i] = 0.0f + p[i];
        return out;
    };
    for (i64 v = 0; v < V; v++) {
        const Vec want = reference([&](i64 n) { return tok[static_cast<size_t>(n)] == v; });
        CHECK(first_diff(want, Vec(dwte.begin() + v * C, dwte.begin() + (v + 1) * C)) == -1);
    }
    for (i64 t = 0; t < T; t++) {
        const Vec want = reference([&](i64 n) { return n % T == t; });
        CHECK(first_diff(want, Vec(dwpe.begin() + t * C, dwpe.begin() + (t + 1) * C)) == -1);
    }
    // The whole range is the plain call.
    Vec a(V * C, 0.0f), b(V * C, 0.0f), pa(T * C, 0.0f), pb(T * C, 0.0f);
    cpu::embedding_backward(nx, a.data(), pa.data(), dout.data(), tok.data(), B, T, C, V);
    cpu::embedding_backward(nx, b.data(), pb.data(), dout.data(), tok.data(), B, T, C, V, 0, B * T);
    CHECK(first_diff(a, b) == -1);
    CHECK(first_diff(pa, pb) == -1);
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

TEST_CASE("ops: the backend table answers supports and refuses what no backend runs", "[ops]") {
    for (Mode mode : {Mode::bitwise, Mode::fast}) {
        CHECK(ops::supports(ops::Op::matmul, Device::cpu, DType::f32, mode));
        CHECK(ops::supports(ops::Op::gemm, Device::cpu, DType::f32, mode));
        CHECK(ops::supports(ops::Op::matmul, Device::cpu, DType::bf16, mode));
        CHECK_FALSE(ops::supports(ops::Op::adamw, Device::cpu, DType::bf16, mode));  // fp32 state
        CHECK(ops::supports(ops::Op::matmul, Device::cpu, DType::f16, mode));
        CHECK_FALSE(ops::supports(ops::Op::adamw, Device::cpu, DType::f16, mode));  // fp32 state
        CHECK_FALSE(ops::supports(ops::Op::matmul, Device::cpu, DType::e4m3, mode));
        CHECK_FALSE(ops::supports(ops::Op::matmul, Device::cuda, DType::f32, mode));
    }
    Numerics nx;
    Vec x(6, 1.0f), y(6);
    Tensor in = view_f32(x.data(), {6}, "x16");
    in.dtype = DType::bf16;
    try {
        ops::gelu_forward(nx, view_f32(y.data(), {6}), in);
        FAIL("a bf16 operand ran on the fp32 backend");
    } catch (const Error& e) {
        const std::string what = e.what();
        CHECK(what.find("gelu") != std::string::npos);
        CHECK(what.find("'x16'") != std::string::npos);
        CHECK(what.find("bf16") != std::string::npos);
    }
}

TEST_CASE("ops: each operand is checked against the dtype of its role", "[ops]") {
    // The activations' dtype chooses the backend; every other operand must have the dtype the
    // backend gives its role (kernels/backend.h). The CPU fp32 backend wants fp32 everywhere.
    Numerics nx;
    const i64 BT = 3, C = 4;
    Vec x(BT * C, 0.5f), y(BT * C), w(C, 1.0f), b(C, 0.0f), mu(BT), rs(BT);
    auto ln = [&](DType act, DType stat) {
        Tensor out = view_f32(y.data(), {BT, C}, "out"), inp = view_f32(x.data(), {BT, C}, "inp");
        Tensor mean = view_f32(mu.data(), {BT}, "mean"), rstd = view_f32(rs.data(), {BT}, "rstd");
        out.dtype = inp.dtype = act;
        mean.dtype = rstd.dtype = stat;
        ops::layernorm_forward(nx, out, mean, rstd, inp, view_f32(w.data(), {C}, "w"),
                               view_f32(b.data(), {C}, "b"));
    };
    ln(DType::f32, DType::f32);
    CHECK(mu[0] == 0.5f);
    auto error_of = [](auto&& f) -> std::string {
        try {
            f();
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    // An fp32 sum in a narrow dtype: the tensor, its role and the backend's dtype are named.
    const std::string stat = error_of([&] { ln(DType::f32, DType::bf16); });
    CHECK(stat.find("'mean'") != std::string::npos);
    CHECK(stat.find("fp32 sum") != std::string::npos);
    CHECK(stat.find("cpu f32") != std::string::npos);
    // bf16 and fp16 activations with fp32 statistics run on their backends; fp8 ones are a valid
    // call for which no backend is registered (fp8 needs scales, not a plain cast).
    ln(DType::bf16, DType::f32);
    ln(DType::f16, DType::f32);
    const std::string act = error_of([&] { ln(DType::e4m3, DType::f32); });
    CHECK(act.find("no kernel for e4m3 activations") != std::string::npos);
    CHECK(act.find("'out'") != std::string::npos);
    // A weight gradient is a role of its own: an fp16 one is refused by name.
    Vec g(C * C), dout(BT * C, 1.0f), ww(C * C, 0.25f);
    Tensor dweight = view_f32(g.data(), {C, C}, "dweight");
    dweight.dtype = DType::f16;
    const std::string grad = error_of([&] {
        ops::matmul_backward(nx, nullptr, &dweight, nullptr, view_f32(dout.data(), {BT, C}, "dout"),
                             view_f32(x.data(), {BT, C}, "inp"), view_f32(ww.data(), {C, C}, "w"));
    });
    CHECK(grad.find("'dweight' (weight gradient) is f16") != std::string::npos);
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
    for (i64 n : {1, 7, 15, 16, 17, 63, 64, 100, 1029, 4100}) {
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
            // fma_rows_group: m accumulators (rows n + 1 apart) sharing those 5 rows, coefficients
            // 3 apart: each the bits of its own fma_rows on the scalar table.
            for (int m = 1; m <= cpu::kFmaRowsGroup; m++) {
                const Vec coefs = randv(r, 3 * (m - 1) + 2 * 4 + 1);
                Vec ga = randv(r, m * (n + 1)), gb = ga;
                v.fma_rows_group(ga.data(), n + 1, m, coefs.data(), 3, 2, mat.data(), n + 3, 5, n);
                for (int q = 0; q < m; q++)
                    s.fma_rows(gb.data() + q * (n + 1), coefs.data() + 3 * q, 2, mat.data(), n + 3,
                               5, n);
                INFO("fma_rows_group m = " << m);
                CHECK(first_diff(ga, gb) == -1);
            }
            cpu::AdamWCoeffs c{1e-3f, 0.9f, 0.99f, 0.1f, 0.01f, 1e-8f, 0.1f, 0.5f, 0.3f, 0.05f};
            Vec p1 = x, m1 = y, v1 = z, p2 = x, m2 = y, v2 = z;
            s.adamw(p1.data(), m1.data(), v1.data(), y.data(), n, c);
            v.adamw(p2.data(), m2.data(), v2.data(), y.data(), n, c);
            CHECK(first_diff(p1, p2) == -1);
            CHECK(first_diff(m1, m2) == -1);
            CHECK(first_diff(v1, v2) == -1);
            // Blocks shorter than, equal to and between multiples of a vector: full groups are
            // transposed in registers, the rest gathered; x·x is the sum of squares' own path.
            for (int blk : {1, 8, 16, 24, 64}) {
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
                s.block_dots(pa.data(), x.data(), x.data(), n, blk);
                v.block_dots(pb.data(), x.data(), x.data(), n, blk);
                CHECK(first_diff(pa, pb) == -1);
                CHECK(bits(tree_sum(pb.data(), nb)) ==
                      bits(canonical_dot(x.data(), x.data(), n, blk)));
            }
        }
    }
}
