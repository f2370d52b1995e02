// The ops of a Llama-3 / Qwen3 block (kernels/ops.h): rmsnorm, rope (and its table), swiglu, and
// the sin and cos of core/base/mathfun.h the table is made of. test_ops runs gradcheck's table on
// every op (error-bound references, finite differences, threads, ISAs, fast mode, the canonical
// order); this suite adds what is particular to these three.
//
// Index
//   helpers                 bit comparison, ISAs, views, a bound check that names the worst element
//   plain fp64 references   each op written plainly in double, with the scale of its rounding
//   references              the kernels within fp32 rounding of them, on Llama-ish shapes
//   invariance              every ISA and 1, 2, 3 threads give the same bits; fast mode
//   layouts                 rmsnorm's dweight node by node; column slices, in place, positions
//   dtypes and errors       bf16 activations rounded once; what is refused, and how
//   frequencies             rope_inv_freq against pow and Hugging Face's Llama 3.1 formula
//   sin and cos             against long double libm (max ulp printed), special values, ISAs
//
// Bounds come from the standard model of fp32 arithmetic (u = 2^-24 per operation, a canonical sum
// of depth d within γ_d of the sum of its terms' magnitudes); none is tuned to make a test pass.
#include <catch2/catch.hpp>

#include "core/base/dtype.h"
#include "core/base/error.h"
#include "core/base/mathfun.h"
#include "core/base/numerics.h"
#include "kernels/cpu/vecmath.h"
#include "kernels/ops.h"
#include "validators/gradcheck.h"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

using namespace px;
using gradcheck::randv;
using gradcheck::Rng;
using Vec = std::vector<float>;
using Vec64 = std::vector<double>;

namespace {

// ---------------------------------------------------------------------------------------------
// helpers

constexpr double kU = 0x1p-24;

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

Numerics numerics(Mode mode, Isa isa, int block = 64) {
    Numerics nx;
    nx.mode = mode;
    nx.isa = isa;
    nx.block = block;
    return nx;
}

Tensor T(Vec& v, std::initializer_list<i64> shape) {
    return view_f32(v.data(), shape);
}

i64 ceil_log2(i64 n) {
    i64 d = 0;
    while ((i64(1) << d) < n) d++;
    return d;
}
// Depth of a canonical sum of n terms in blocks of blk.
double depth(i64 n, int blk) {
    return double(std::min<i64>(n, blk) + ceil_log2(num_blocks(n, blk)));
}

// |got[i] - ref[i]| <= tol[i] for every i; the count outside and the worst ratio are reported.
void check_within(const std::string& what, const Vec& got, const Vec64& ref, const Vec64& tol) {
    REQUIRE(got.size() == ref.size());
    i64 bad = 0, worst_at = -1;
    double worst = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double err = std::fabs(double(got[i]) - ref[i]);
        const double r = tol[i] > 0 ? err / tol[i] : (err > 0 ? INFINITY : 0);
        if (r > worst) {
            worst = r;
            worst_at = i64(i);
        }
        if (!(err <= tol[i])) bad++;
    }
    INFO(what << ": " << bad << " of " << ref.size() << " outside the bound; worst error/bound "
              << worst << " at " << worst_at
              << (worst_at >= 0 ? " (got " + std::to_string(got[worst_at]) + ", fp64 " +
                                      std::to_string(ref[worst_at]) + ")"
                                : std::string()));
    CHECK(bad == 0);
}

// The outputs of one run of the three ops, by name.
using Named = std::vector<std::pair<std::string, Vec>>;

// Positions of cp rank `rank` of `cp` (zig-zag: chunks rank and 2cp-1-rank of T tokens).
std::vector<i64> zigzag(i64 T, int cp, int rank) {
    const i64 chunk = T / (2 * cp);
    std::vector<i64> pos;
    for (i64 c : {i64(rank), i64(2 * cp - 1 - rank)})
        for (i64 t = 0; t < chunk; t++) pos.push_back(c * chunk + t);
    return pos;
}

// Llama 3.1's scaling (Hugging Face's rope_type "llama3", Llama-3.1-8B's values).
ops::RopeScaling llama31() {
    ops::RopeScaling s;
    s.factor = 8;
    s.low_freq_factor = 1;
    s.high_freq_factor = 4;
    s.original_max_position_embeddings = 8192;
    return s;
}

// ---------------------------------------------------------------------------------------------
// plain fp64 references, with the magnitude each result's fp32 rounding scales with

struct Ref {
    Vec64 v, scale;
};

// out, rstd, dinp, dweight of rmsnorm on x (BT,C), w (C), dout (BT,C); dinp0, dw0 their priors.
struct RmsRef {
    Ref out, rstd, dinp, dw;
};
RmsRef rmsnorm64(const Vec& x, const Vec& w, const Vec& dout, const Vec& dinp0, const Vec& dw0,
                 i64 BT, i64 C, double eps) {
    RmsRef r;
    r.out.v.resize(BT * C);
    r.out.scale.resize(BT * C);
    r.rstd.v.resize(BT);
    r.rstd.scale.resize(BT);
    r.dinp.v.resize(BT * C);
    r.dinp.scale.resize(BT * C);
    r.dw.v.assign(dw0.begin(), dw0.end());
    for (float v : dw0) r.dw.scale.push_back(std::fabs(v));
    for (i64 t = 0; t < BT; t++) {
        double ss = 0;
        for (i64 i = 0; i < C; i++) ss += double(x[t * C + i]) * x[t * C + i];
        const double s = 1.0 / std::sqrt(ss / double(C) + eps);
        r.rstd.v[t] = s;
        r.rstd.scale[t] = s;
        double dnm = 0, adnm = 0;
        for (i64 i = 0; i < C; i++) {
            const double nr = x[t * C + i] * s, dn = w[i] * double(dout[t * C + i]);
            dnm += dn * nr;
            adnm += std::fabs(dn * nr);
            r.out.v[t * C + i] = nr * w[i];
            r.out.scale[t * C + i] = std::fabs(nr * w[i]);
            r.dw.v[i] += nr * dout[t * C + i];
            r.dw.scale[i] += std::fabs(nr * dout[t * C + i]);
        }
        for (i64 i = 0; i < C; i++) {
            const double nr = x[t * C + i] * s, dn = w[i] * double(dout[t * C + i]);
            const double d = (dn - nr * dnm / double(C)) * s;
            r.dinp.v[t * C + i] = dinp0[t * C + i] + d;
            r.dinp.scale[t * C + i] = (std::fabs(dn) + std::fabs(nr) * adnm / double(C)) * s +
                                      std::fabs(dinp0[t * C + i]);
        }
    }
    return r;
}

// out, dgate, dup of swiglu on gate, up, dout (N); dg0, du0 the priors.
struct SwigluRef {
    Ref out, dg, du;
};
SwigluRef swiglu64(const Vec& g, const Vec& u, const Vec& dout, const Vec& dg0, const Vec& du0) {
    const size_t N = g.size();
    SwigluRef r;
    for (Ref* x : {&r.out, &r.dg, &r.du}) {
        x->v.resize(N);
        x->scale.resize(N);
    }
    for (size_t i = 0; i < N; i++) {
        const double sig = 1.0 / (1.0 + std::exp(-double(g[i]))), silu = g[i] * sig;
        const double om = 1.0 - sig, d = dout[i];
        r.out.v[i] = silu * u[i];
        r.out.scale[i] = std::fabs(silu * u[i]);
        r.dg.v[i] = dg0[i] + d * u[i] * sig * (1.0 + g[i] * om);
        r.dg.scale[i] =
            std::fabs(d * u[i]) * sig * (1.0 + std::fabs(g[i]) * om) + std::fabs(dg0[i]);
        r.du.v[i] = du0[i] + d * silu;
        r.du.scale[i] = std::fabs(d * silu) + std::fabs(du0[i]);
    }
    return r;
}

// rope of x (B,T,NH,HS) at positions pos by angles angle(p, j); scale: |x1|+|x2| of the pair.
Ref rope64(const Vec& x, const std::vector<i64>& pos, i64 B, i64 Tn, i64 H, i64 HS,
           const std::function<long double(i64, i64)>& angle) {
    const i64 h = HS / 2;
    Ref r;
    r.v.resize(x.size());
    r.scale.resize(x.size());
    for (i64 row = 0; row < B * Tn; row++)
        for (i64 k = 0; k < H; k++)
            for (i64 j = 0; j < h; j++) {
                const i64 at = (row * H + k) * HS + j;
                const long double a = angle(pos[row % Tn], j);
                const long double c = std::cos(a), s = std::sin(a), x1 = x[at], x2 = x[at + h];
                r.v[at] = double(x1 * c - x2 * s);
                r.v[at + h] = double(x2 * c + x1 * s);
                r.scale[at] = r.scale[at + h] = double(std::fabs(x1) + std::fabs(x2));
            }
    return r;
}

Vec64 tolerance(const Ref& r, double k) {
    Vec64 t(r.v.size());
    for (size_t i = 0; i < t.size(); i++)
        t[i] = k * kU * r.scale[i] + 4 * 0x1p-53 * std::fabs(r.v[i]);
    return t;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// references

TEST_CASE("llama ops: rmsnorm within fp32 rounding of a plain fp64 reference", "[llama]") {
    const i64 BT = 2 * 33, C = 96;
    const float eps = 1e-6f;
    Rng r(1);
    Vec x = randv(r, BT * C, -3.0f, 3.0f);
    for (i64 t = 0; t < BT; t++)
        for (i64 i = 0; i < C; i++) x[t * C + i] *= 0.01f + float(t % 7);  // rows of many scales
    Vec w = randv(r, C, 0.5f, 1.5f), dout = randv(r, BT * C);
    const Vec dinp0 = randv(r, BT * C), dw0 = randv(r, C);
    const RmsRef ref = rmsnorm64(x, w, dout, dinp0, dw0, BT, C, eps);
    for (int blk : {64, 8}) {
        // Σx² of depth dC, then /C, +eps, sqrt, 1/: rstd within (dC/2 + 3)·u; out two more
        // products; dinp: the row's dot (depth dC) and four operations on the scale of its terms;
        // dweight: the token tree (depth dT) over terms each within rstd's error and two products.
        const double dC = depth(C, blk), dT = depth(BT, blk);
        for (Isa isa : permitted_isas()) {
            INFO("block " << blk << " on " << isa_name(isa));
            const Numerics nx = numerics(Mode::bitwise, isa, blk);
            Vec out(BT * C), rstd(BT), dinp = dinp0, dw = dw0;
            ops::rmsnorm_forward(nx, T(out, {BT, C}), T(rstd, {BT}), T(x, {BT, C}), T(w, {C}), eps);
            ops::rmsnorm_backward(nx, T(dinp, {BT, C}), T(dw, {C}), T(dout, {BT, C}), T(x, {BT, C}),
                                  T(w, {C}), T(rstd, {BT}));
            check_within("rstd", rstd, ref.rstd.v, tolerance(ref.rstd, dC / 2 + 3));
            check_within("out", out, ref.out.v, tolerance(ref.out, dC / 2 + 5));
            check_within("dinp", dinp, ref.dinp.v, tolerance(ref.dinp, dC + dC / 2 + 8));
            check_within("dweight", dw, ref.dw.v, tolerance(ref.dw, dT + dC / 2 + 6));
        }
    }
}

TEST_CASE("llama ops: swiglu within fp32 rounding of a plain fp64 reference", "[llama]") {
    const i64 BT = 66, F = 130;
    Rng r(2);
    Vec g = randv(r, BT * F, -12.0f, 12.0f);
    g[0] = 0.0f;
    g[1] = -1e-30f;
    g[2] = 60.0f;  // exp(-60) is normal: beyond 87 it is subnormal, relatively less exact
    g[3] = -60.0f;
    g[4] = -1.2785f;  // silu' crosses zero near here: the bound scales with its terms
    const Vec u = randv(r, BT * F, -2.0f, 2.0f), dout = randv(r, BT * F), dg0 = randv(r, BT * F),
              du0 = randv(r, BT * F);
    const SwigluRef ref = swiglu64(g, u, dout, dg0, du0);
    for (Isa isa : permitted_isas()) {
        INFO("on " << isa_name(isa));
        const Numerics nx = numerics(Mode::bitwise, isa);
        Vec out(BT * F), dg = dg0, du = du0, uu = u, dd = dout;
        ops::swiglu_forward(nx, T(out, {BT, F}), T(g, {BT, F}), T(uu, {BT, F}));
        ops::swiglu_backward(nx, T(dg, {BT, F}), T(du, {BT, F}), T(g, {BT, F}), T(uu, {BT, F}),
                             T(dd, {BT, F}));
        // exp within 2 ulp (4u); 1 + t, 1/d or t/d: sigmoid and 1 - sigmoid within 10u; silu 11u,
        // out 12u. dgate: the fma on the scale of its terms, three products: 16u; dup 13u; each
        // added to its prior (one more rounding).
        check_within("out", out, ref.out.v, tolerance(ref.out, 12));
        check_within("dgate", dg, ref.dg.v, tolerance(ref.dg, 17));
        check_within("dup", du, ref.du.v, tolerance(ref.du, 14));
    }
}

TEST_CASE("llama ops: rope within fp32 rounding of a plain fp64 reference", "[llama]") {
    // Llama 3.1-8B's rope (theta 500000, its scaling, HS 128), positions over the whole table out
    // of order, at the far end too (angles up to about 8e3 in the fastest pair).
    const i64 B = 2, H = 3, HS = 128, h = HS / 2, maxT = 8192;
    const std::vector<i64> pos{0, 1, 517, 2048, 8191, 6000, 7001, 4095, 31};
    const i64 Tn = i64(pos.size());
    const double theta = 500000;
    Vec cos(maxT * h), sin(maxT * h);
    ops::rope_table(Numerics{}, T(cos, {maxT, h}), T(sin, {maxT, h}), theta, llama31());
    const std::vector<float> inv = ops::rope_inv_freq(HS, theta, llama31());
    Rng r(3);
    Vec x = randv(r, B * Tn * H * HS, -2.0f, 2.0f), dout = randv(r, B * Tn * H * HS);
    // What the kernel promises: the rotation by cos and sin (each within 2 ulp) of the fp32 angle
    // float(p)·inv_freq: two products and an add on |x1| + |x2|.
    const auto angle32 = [&](i64 p, i64 j) { return (long double)(float(p) * inv[j]); };
    const Ref want = rope64(x, pos, B, Tn, H, HS, angle32);
    // The same rotation backwards: R(-a) applied to dout is R(a)ᵀ.
    Ref back = rope64(dout, pos, B, Tn, H, HS, [&](i64 p, i64 j) { return -angle32(p, j); });
    const Vec dinp0 = randv(r, B * Tn * H * HS);
    for (size_t i = 0; i < back.v.size(); i++) {
        back.v[i] += dinp0[i];
        back.scale[i] += std::fabs(dinp0[i]);
    }
    // The angle of exact arithmetic, p·inv_freq in fp64: Hugging Face's fp32 angle rounds the
    // product, as ours does, by up to u·|angle|, which turns the pair by as much.
    const auto angle64 = [&](i64 p, i64 j) { return (long double)p * inv[j]; };
    const Ref exact = rope64(x, pos, B, Tn, H, HS, angle64);
    for (Isa isa : permitted_isas()) {
        INFO("on " << isa_name(isa));
        const Numerics nx = numerics(Mode::bitwise, isa);
        Vec out(x.size()), dinp = dinp0;
        ops::rope_forward(nx, T(out, {B, Tn, H, HS}), T(x, {B, Tn, H, HS}), T(cos, {maxT, h}),
                          T(sin, {maxT, h}), pos.data());
        ops::rope_backward(nx, T(dinp, {B, Tn, H, HS}), T(dout, {B, Tn, H, HS}), T(cos, {maxT, h}),
                           T(sin, {maxT, h}), pos.data());
        check_within("out", out, want.v, tolerance(want, 2 * 2 * gradcheck::kMathUlp + 2));
        check_within("dinp", dinp, back.v, tolerance(back, 2 * 2 * gradcheck::kMathUlp + 3));
        Vec64 tol = tolerance(exact, 2 * 2 * gradcheck::kMathUlp + 2);
        double worst = 0;
        for (i64 row = 0; row < B * Tn; row++)
            for (i64 k = 0; k < H; k++)
                for (i64 j = 0; j < h; j++) {
                    const i64 at = (row * H + k) * HS + j;
                    const double a = double(pos[row % Tn]) * inv[j];
                    for (i64 e : {at, at + h}) {
                        tol[e] += exact.scale[e] * kU * a;
                        worst = std::max(worst, std::fabs(out[e] - exact.v[e]) / exact.scale[e]);
                    }
                }
        check_within("out vs the exact angle", out, exact.v, tol);
        std::printf("rope (%s): max |out - exact-angle rotation| / (|x1|+|x2|) = %.3g\n",
                    isa_name(isa), worst);
    }
}

// ---------------------------------------------------------------------------------------------
// invariance

namespace {

// Every output of the three ops (and the table) on a Llama-ish layer: B=4, T=64, C=768, F=2048,
// 12 heads of 64; rope at a cp rank's positions of a longer sequence.
Named run_llama(const Numerics& nx) {
    const i64 B = 4, Tn = 64, C = 768, F = 2048, H = 12, HS = 64, h = HS / 2, maxT = 8192;
    Rng r(7);
    Vec x = randv(r, B * Tn * C, -2.0f, 2.0f), w = randv(r, C, 0.5f, 1.5f),
        dout = randv(r, B * Tn * C), g = randv(r, B * Tn * F, -8.0f, 8.0f),
        u = randv(r, B * Tn * F), dff = randv(r, B * Tn * F), q = randv(r, B * Tn * C),
        dq = randv(r, B * Tn * C);
    Vec out(x.size()), rstd(B * Tn), dinp = randv(r, x.size()), dw = randv(r, C);
    ops::rmsnorm_forward(nx, T(out, {B * Tn, C}), T(rstd, {B * Tn}), T(x, {B * Tn, C}), T(w, {C}),
                         1e-5f);
    ops::rmsnorm_backward(nx, T(dinp, {B * Tn, C}), T(dw, {C}), T(dout, {B * Tn, C}),
                          T(x, {B * Tn, C}), T(w, {C}), T(rstd, {B * Tn}));
    Vec act(B * Tn * F), dg = randv(r, act.size()), du = randv(r, act.size());
    ops::swiglu_forward(nx, T(act, {B * Tn, F}), T(g, {B * Tn, F}), T(u, {B * Tn, F}));
    ops::swiglu_backward(nx, T(dg, {B * Tn, F}), T(du, {B * Tn, F}), T(g, {B * Tn, F}),
                         T(u, {B * Tn, F}), T(dff, {B * Tn, F}));
    Vec cos(maxT * h), sin(maxT * h), qr(q.size()), dqr = randv(r, q.size());
    ops::rope_table(nx, T(cos, {maxT, h}), T(sin, {maxT, h}), 500000, llama31());
    const std::vector<i64> pos = zigzag(4 * Tn, 2, 1);  // rank 1 of cp 2 on 256 tokens
    ops::rope_forward(nx, T(qr, {B, Tn, H, HS}), T(q, {B, Tn, H, HS}), T(cos, {maxT, h}),
                      T(sin, {maxT, h}), pos.data());
    ops::rope_backward(nx, T(dqr, {B, Tn, H, HS}), T(dq, {B, Tn, H, HS}), T(cos, {maxT, h}),
                       T(sin, {maxT, h}), pos.data());
    return {{"rmsnorm out", out}, {"rstd", rstd},      {"rmsnorm dinp", dinp},
            {"dweight", dw},      {"swiglu out", act}, {"dgate", dg},
            {"dup", du},          {"cos", cos},        {"sin", sin},
            {"rope out", qr},     {"rope dinp", dqr}};
}

void check_same(const Named& a, const Named& b, const std::string& what) {
    REQUIRE(a.size() == b.size());
    for (size_t k = 0; k < a.size(); k++) {
        const i64 d = first_diff(a[k].second, b[k].second);
        INFO(what << ": " << a[k].first << " differs first at " << d);
        CHECK(d == -1);
    }
}

}  // namespace

TEST_CASE("llama ops: identical bits on every ISA (bitwise) and for 1, 2, 3 threads (both modes)",
          "[llama]") {
    const Named base = run_llama(numerics(Mode::bitwise, Isa::scalar));
    for (Isa isa : permitted_isas())
        check_same(base, run_llama(numerics(Mode::bitwise, isa)), isa_name(isa));
    const int saved = omp_get_max_threads();
    for (Mode mode : {Mode::bitwise, Mode::fast}) {
        const Numerics nx = numerics(mode, detect_isa());
        omp_set_num_threads(1);
        const Named one = run_llama(nx);
        for (int threads : {2, 3}) {
            omp_set_num_threads(threads);
            check_same(one, run_llama(nx),
                       std::string(mode_name(mode)) + ", " + std::to_string(threads) + " threads");
        }
    }
    omp_set_num_threads(saved);
}

TEST_CASE("llama ops: fast mode: rope and swiglu are the bitwise kernels, rmsnorm within rounding",
          "[llama]") {
    const Named bw = run_llama(numerics(Mode::bitwise, detect_isa()));
    const Named fast = run_llama(numerics(Mode::fast, detect_isa()));
    for (size_t k = 0; k < bw.size(); k++) {
        const std::string& name = bw[k].first;
        INFO(name);
        if (name.rfind("rmsnorm", 0) == 0 || name == "rstd" || name == "dweight") {
            // Any order of the C = 768 channels: depth 768 instead of the tree's 64 + 4; the
            // token tree is the same. A loose common bound on the scale of each output.
            double worst = 0, scale = 0;
            for (size_t i = 0; i < bw[k].second.size(); i++) {
                worst = std::max(worst, double(std::fabs(bw[k].second[i] - fast[k].second[i])));
                scale = std::max(scale, double(std::fabs(bw[k].second[i])));
            }
            CHECK(worst <= 2 * 768 * kU * scale);
        } else {
            CHECK(first_diff(bw[k].second, fast[k].second) == -1);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// layouts

TEST_CASE("llama ops: rmsnorm's dweight node by node equals the whole batch's", "[llama]") {
    // 44 tokens in blocks of 8: 6 blocks, the last one short. Each token node's dweight (its rows
    // alone, from zero), combined in the tree, is the whole call's bit for bit: per block (the
    // leaves), and per half at the root's split; dinp is per row either way.
    const i64 BT = 44, C = 37;
    const int blk = 8;
    const i64 nb = num_blocks(BT, blk);
    Rng r(5);
    Vec x = randv(r, BT * C, -2.0f, 2.0f), w = randv(r, C, 0.5f, 1.5f), dout = randv(r, BT * C);
    for (Isa isa : permitted_isas()) {
        INFO("on " << isa_name(isa));
        const Numerics nx = numerics(Mode::bitwise, isa, blk);
        Vec out(BT * C), rstd(BT), dinp(BT * C, 0.0f), dw(C, 0.0f);
        ops::rmsnorm_forward(nx, T(out, {BT, C}), T(rstd, {BT}), T(x, {BT, C}), T(w, {C}), 1e-5f);
        ops::rmsnorm_backward(nx, T(dinp, {BT, C}), T(dw, {C}), T(dout, {BT, C}), T(x, {BT, C}),
                              T(w, {C}), T(rstd, {BT}));
        // A node's rows, as the model cuts them (core/model/layer_ops.cpp: node_rows).
        const auto node = [&](i64 lo, i64 hi, float* dw_node, float* dinp_rows) {
            Tensor di = view_f32(dinp_rows, {hi - lo, C});
            Tensor dwn = view_f32(dw_node, {C});
            ops::rmsnorm_backward(nx, dinp_rows ? &di : nullptr, &dwn,
                                  view_f32(dout.data() + lo * C, {hi - lo, C}),
                                  view_f32(x.data() + lo * C, {hi - lo, C}), T(w, {C}),
                                  view_f32(rstd.data() + lo, {hi - lo}));
        };
        Vec leaves(nb * C, 0.0f), dinp_nodes(BT * C, 0.0f);
        for (i64 b = 0; b < nb; b++)
            node(b * blk, std::min(BT, (b + 1) * blk), leaves.data() + b * C,
                 dinp_nodes.data() + b * blk * C);
        tree_combine_rows(leaves.data(), nb, C);
        CHECK(first_diff(Vec(leaves.begin(), leaves.begin() + C), dw) == -1);
        CHECK(first_diff(dinp_nodes, dinp) == -1);
        const i64 mid = tree_mid(0, nb) * blk;  // the root's split: 3 blocks | 3 blocks
        Vec left(C, 0.0f), right(C, 0.0f), sum(C);
        node(0, mid, left.data(), nullptr);
        node(mid, BT, right.data(), nullptr);
        for (i64 i = 0; i < C; i++) sum[i] = left[i] + right[i];
        CHECK(first_diff(sum, dw) == -1);
    }
}

TEST_CASE("llama ops: swiglu on the halves of one (BT,2F) tensor, in place", "[llama]") {
    const i64 BT = 9, F = 37;
    Rng r(6);
    Vec h = randv(r, BT * 2 * F, -6.0f, 6.0f), dout = randv(r, BT * F);
    Vec g(BT * F), u(BT * F);
    for (i64 t = 0; t < BT; t++)
        for (i64 i = 0; i < F; i++) {
            g[t * F + i] = h[t * 2 * F + i];
            u[t * F + i] = h[t * 2 * F + F + i];
        }
    // gate = h[:, :F], up = h[:, F:]: (BT,F) views with rows 2F apart.
    const auto half = [&](Vec& v, i64 off) {
        Tensor t = view_f32(v.data() + off, {BT, F});
        t.strides[0] = 2 * F;
        return t;
    };
    for (Isa isa : permitted_isas()) {
        INFO("on " << isa_name(isa));
        const Numerics nx = numerics(Mode::bitwise, isa);
        Vec want(BT * F), dg(BT * F, 0.5f), du(BT * F, -0.25f);
        ops::swiglu_forward(nx, T(want, {BT, F}), T(g, {BT, F}), T(u, {BT, F}));
        ops::swiglu_backward(nx, T(dg, {BT, F}), T(du, {BT, F}), T(g, {BT, F}), T(u, {BT, F}),
                             T(dout, {BT, F}));
        Vec got(BT * F), dh(BT * 2 * F);
        for (i64 t = 0; t < BT; t++)
            for (i64 i = 0; i < F; i++) {
                dh[t * 2 * F + i] = 0.5f;
                dh[t * 2 * F + F + i] = -0.25f;
            }
        ops::swiglu_forward(nx, T(got, {BT, F}), half(h, 0), half(h, F));
        CHECK(first_diff(got, want) == -1);
        ops::swiglu_backward(nx, half(dh, 0), half(dh, F), half(h, 0), half(h, F),
                             T(dout, {BT, F}));
        Vec dg2(BT * F), du2(BT * F);
        for (i64 t = 0; t < BT; t++)
            for (i64 i = 0; i < F; i++) {
                dg2[t * F + i] = dh[t * 2 * F + i];
                du2[t * F + i] = dh[t * 2 * F + F + i];
            }
        CHECK(first_diff(dg2, dg) == -1);
        CHECK(first_diff(du2, du) == -1);
        // out over gate (in place): the same values.
        Vec gi = g;
        ops::swiglu_forward(nx, T(gi, {BT, F}), T(gi, {BT, F}), T(u, {BT, F}));
        CHECK(first_diff(gi, want) == -1);
        // gate and up of different row strides are refused.
        CHECK_THROWS_AS(ops::swiglu_forward(nx, T(got, {BT, F}), half(h, 0), T(u, {BT, F})), Error);
    }
}

TEST_CASE("llama ops: rope on a fused qkv's columns, in place, and at a cp rank's positions",
          "[llama]") {
    const i64 B = 2, Tn = 16, H = 2, HS = 8, C = H * HS, h = HS / 2, maxT = 16;
    Vec cos(maxT * h), sin(maxT * h);
    ops::rope_table(Numerics{}, T(cos, {maxT, h}), T(sin, {maxT, h}), 10000.0);
    Rng r(8);
    Vec qkv = randv(r, B * Tn * 3 * C), dout = randv(r, B * Tn * C);
    Vec q(B * Tn * C), k(B * Tn * C);
    for (i64 n = 0; n < B * Tn; n++)
        for (i64 i = 0; i < C; i++) {
            q[n * C + i] = qkv[n * 3 * C + i];
            k[n * C + i] = qkv[n * 3 * C + C + i];
        }
    // Part `part` of qkv (B,T,3C) as (B,T,NH,HS): strides (T·3C, 3C, HS, 1).
    const auto part = [&](Vec& v, i64 which) {
        Tensor t = view_f32(v.data() + which * C, {B, Tn, H, HS});
        t.strides[0] = Tn * 3 * C;
        t.strides[1] = 3 * C;
        return t;
    };
    const Tensor tc = T(cos, {maxT, h}), ts = T(sin, {maxT, h});
    for (Isa isa : permitted_isas()) {
        INFO("on " << isa_name(isa));
        const Numerics nx = numerics(Mode::bitwise, isa);
        Vec qr(q.size()), kr(k.size());
        ops::rope_forward(nx, T(qr, {B, Tn, H, HS}), T(q, {B, Tn, H, HS}), tc, ts, nullptr);
        ops::rope_forward(nx, T(kr, {B, Tn, H, HS}), T(k, {B, Tn, H, HS}), tc, ts, nullptr);
        // In place on the fused tensor's q and k columns; v untouched.
        Vec fused = qkv;
        ops::rope_forward(nx, part(fused, 0), part(fused, 0), tc, ts, nullptr);
        ops::rope_forward(nx, part(fused, 1), part(fused, 1), tc, ts, nullptr);
        Vec q2(q.size()), k2(k.size());
        bool v_same = true;
        for (i64 n = 0; n < B * Tn; n++)
            for (i64 i = 0; i < C; i++) {
                q2[n * C + i] = fused[n * 3 * C + i];
                k2[n * C + i] = fused[n * 3 * C + C + i];
                v_same = v_same &&
                         bits(fused[n * 3 * C + 2 * C + i]) == bits(qkv[n * 3 * C + 2 * C + i]);
            }
        CHECK(first_diff(q2, qr) == -1);
        CHECK(first_diff(k2, kr) == -1);
        CHECK(v_same);
        // Positions 0..T-1 given are null's.
        std::vector<i64> all(Tn);
        for (i64 t = 0; t < Tn; t++) all[t] = t;
        Vec qa(q.size());
        ops::rope_forward(nx, T(qa, {B, Tn, H, HS}), T(q, {B, Tn, H, HS}), tc, ts, all.data());
        CHECK(first_diff(qa, qr) == -1);
        // Backward into the fused gradient's q columns: the contiguous call's bits.
        Vec dq(q.size(), 0.125f), dfused(qkv.size(), 0.125f);
        ops::rope_backward(nx, T(dq, {B, Tn, H, HS}), T(dout, {B, Tn, H, HS}), tc, ts, nullptr);
        ops::rope_backward(nx, part(dfused, 0), T(dout, {B, Tn, H, HS}), tc, ts, nullptr);
        Vec dq2(q.size());
        for (i64 n = 0; n < B * Tn; n++)
            for (i64 i = 0; i < C; i++) dq2[n * C + i] = dfused[n * 3 * C + i];
        CHECK(first_diff(dq2, dq) == -1);
        // Context parallelism, cp 2: each rank's zig-zag rows at their logical positions get the
        // rows of the whole sequence's call, forward and backward.
        for (int rank : {0, 1}) {
            const std::vector<i64> pos = zigzag(Tn, 2, rank);
            const i64 Tl = i64(pos.size());
            Vec ql(B * Tl * C), dl(B * Tl * C), outl(B * Tl * C), dql(B * Tl * C, 0.125f);
            for (i64 b = 0; b < B; b++)
                for (i64 t = 0; t < Tl; t++)
                    for (i64 i = 0; i < C; i++) {
                        ql[(b * Tl + t) * C + i] = q[(b * Tn + pos[t]) * C + i];
                        dl[(b * Tl + t) * C + i] = dout[(b * Tn + pos[t]) * C + i];
                    }
            ops::rope_forward(nx, T(outl, {B, Tl, H, HS}), T(ql, {B, Tl, H, HS}), tc, ts,
                              pos.data());
            ops::rope_backward(nx, T(dql, {B, Tl, H, HS}), T(dl, {B, Tl, H, HS}), tc, ts,
                               pos.data());
            bool same = true;
            for (i64 b = 0; b < B; b++)
                for (i64 t = 0; t < Tl; t++)
                    for (i64 i = 0; i < C; i++) {
                        same = same && bits(outl[(b * Tl + t) * C + i]) ==
                                           bits(qr[(b * Tn + pos[t]) * C + i]);
                        same = same && bits(dql[(b * Tl + t) * C + i]) ==
                                           bits(dq[(b * Tn + pos[t]) * C + i]);
                    }
            INFO("cp rank " << rank);
            CHECK(same);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// dtypes and errors

namespace {

// A bf16 copy of v, and v rounded through bf16 (the values the bf16 kernels widen).
std::vector<std::uint16_t> to_bf16(const Vec& v) {
    std::vector<std::uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); i++) b[i] = f32_to_bf16(v[i]);
    return b;
}
Vec through_bf16(const Vec& v) {
    Vec r(v.size());
    for (size_t i = 0; i < v.size(); i++) r[i] = round_to(DType::bf16, v[i]);
    return r;
}
Vec from_bf16(const std::vector<std::uint16_t>& b) {
    Vec r(b.size());
    for (size_t i = 0; i < b.size(); i++) r[i] = bf16_to_f32(b[i]);
    return r;
}
Tensor B16(std::vector<std::uint16_t>& v, std::initializer_list<i64> shape) {
    return view_of(DType::bf16, v.data(), shape);
}

}  // namespace

TEST_CASE("llama ops: bf16 activations are the fp32 kernels on their values, rounded once",
          "[llama]") {
    const i64 BT = 6, C = 40, F = 24, B = 2, Tn = 3, H = 2, HS = 20, h = HS / 2, maxT = 8;
    Rng r(9);
    const Vec x = through_bf16(randv(r, BT * C, -2.0f, 2.0f)),
              dout = through_bf16(randv(r, BT * C));
    Vec w = randv(r, C, 0.5f, 1.5f);  // weights and statistics stay fp32
    for (Mode mode : {Mode::bitwise, Mode::fast}) {
        INFO(mode_name(mode));
        const Numerics nx = numerics(mode, detect_isa());
        // rmsnorm
        Vec x32 = x, d32 = dout, out32(BT * C), rstd32(BT), dinp32(BT * C, 0.0f), dw32(C, 0.0f);
        ops::rmsnorm_forward(nx, T(out32, {BT, C}), T(rstd32, {BT}), T(x32, {BT, C}), T(w, {C}),
                             1e-6f);
        ops::rmsnorm_backward(nx, T(dinp32, {BT, C}), T(dw32, {C}), T(d32, {BT, C}),
                              T(x32, {BT, C}), T(w, {C}), T(rstd32, {BT}));
        auto xb = to_bf16(x), db = to_bf16(dout), ob = to_bf16(Vec(BT * C)),
             dib = to_bf16(Vec(BT * C, 0.0f));
        Vec rstd(BT), dw(C, 0.0f);
        ops::rmsnorm_forward(nx, B16(ob, {BT, C}), T(rstd, {BT}), B16(xb, {BT, C}), T(w, {C}),
                             1e-6f);
        ops::rmsnorm_backward(nx, B16(dib, {BT, C}), T(dw, {C}), B16(db, {BT, C}), B16(xb, {BT, C}),
                              T(w, {C}), T(rstd, {BT}));
        CHECK(first_diff(from_bf16(ob), through_bf16(out32)) == -1);
        CHECK(first_diff(rstd, rstd32) == -1);
        CHECK(first_diff(from_bf16(dib), through_bf16(dinp32)) == -1);
        CHECK(first_diff(dw, dw32) == -1);
        // swiglu on the bf16 halves of one (BT,2F) tensor (widened and rounded back row by row)
        const Vec hh = through_bf16(randv(r, BT * 2 * F, -5.0f, 5.0f)),
                  df = through_bf16(randv(r, BT * F));
        Vec g32(BT * F), u32(BT * F), a32(BT * F), dg32(BT * F, 0.0f), du32(BT * F, 0.0f),
            df32 = df;
        for (i64 t = 0; t < BT; t++)
            for (i64 i = 0; i < F; i++) {
                g32[t * F + i] = hh[t * 2 * F + i];
                u32[t * F + i] = hh[t * 2 * F + F + i];
            }
        ops::swiglu_forward(nx, T(a32, {BT, F}), T(g32, {BT, F}), T(u32, {BT, F}));
        ops::swiglu_backward(nx, T(dg32, {BT, F}), T(du32, {BT, F}), T(g32, {BT, F}),
                             T(u32, {BT, F}), T(df32, {BT, F}));
        auto hb = to_bf16(hh), dfb = to_bf16(df), ab = to_bf16(Vec(BT * F)),
             dhb = to_bf16(Vec(BT * 2 * F, 0.0f));
        const auto half = [&](std::vector<std::uint16_t>& v, i64 off) {
            Tensor t = view_of(DType::bf16, v.data() + off, {BT, F});
            t.strides[0] = 2 * F;
            return t;
        };
        ops::swiglu_forward(nx, B16(ab, {BT, F}), half(hb, 0), half(hb, F));
        ops::swiglu_backward(nx, half(dhb, 0), half(dhb, F), half(hb, 0), half(hb, F),
                             B16(dfb, {BT, F}));
        CHECK(first_diff(from_bf16(ab), through_bf16(a32)) == -1);
        const Vec dh = from_bf16(dhb);
        Vec dg(BT * F), du(BT * F);
        for (i64 t = 0; t < BT; t++)
            for (i64 i = 0; i < F; i++) {
                dg[t * F + i] = dh[t * 2 * F + i];
                du[t * F + i] = dh[t * 2 * F + F + i];
            }
        CHECK(first_diff(dg, through_bf16(dg32)) == -1);
        CHECK(first_diff(du, through_bf16(du32)) == -1);
        // rope, in place on bf16 q
        Vec cos(maxT * h), sin(maxT * h);
        ops::rope_table(nx, T(cos, {maxT, h}), T(sin, {maxT, h}), 10000.0);
        const std::vector<i64> pos{1, 4, 7};
        Vec q32 = through_bf16(randv(r, B * Tn * H * HS)), qr32(q32.size());
        ops::rope_forward(nx, T(qr32, {B, Tn, H, HS}), T(q32, {B, Tn, H, HS}), T(cos, {maxT, h}),
                          T(sin, {maxT, h}), pos.data());
        auto qb = to_bf16(q32);
        ops::rope_forward(nx, B16(qb, {B, Tn, H, HS}), B16(qb, {B, Tn, H, HS}), T(cos, {maxT, h}),
                          T(sin, {maxT, h}), pos.data());
        CHECK(first_diff(from_bf16(qb), through_bf16(qr32)) == -1);
    }
    for (ops::Op op : {ops::Op::rmsnorm, ops::Op::rope, ops::Op::swiglu})
        for (DType t : {DType::f32, DType::bf16, DType::f16})
            for (Mode mode : {Mode::bitwise, Mode::fast})
                CHECK(ops::supports(op, Device::cpu, t, mode));
}

TEST_CASE("llama ops: bad arguments are refused with a sentence", "[llama]") {
    const Numerics nx;
    const auto error_of = [](auto&& f) -> std::string {
        try {
            f();
        } catch (const Error& e) {
            return e.what();
        }
        return "";
    };
    Vec cos(8 * 2), sin(8 * 2), q(1 * 2 * 1 * 4), o(q.size());
    const Tensor tc = T(cos, {8, 2}), ts = T(sin, {8, 2});
    ops::rope_table(nx, tc, ts, 10000.0);
    const std::vector<i64> far{3, 8};
    CHECK(error_of([&] {
              ops::rope_forward(nx, T(o, {1, 2, 1, 4}), T(q, {1, 2, 1, 4}), tc, ts, far.data());
          }).find("position 8") != std::string::npos);
    Vec q5(1 * 2 * 1 * 5), o5(q5.size());
    CHECK(error_of([&] {
              ops::rope_forward(nx, T(o5, {1, 2, 1, 5}), T(q5, {1, 2, 1, 5}), tc, ts, nullptr);
          }).find("not even") != std::string::npos);
    CHECK(error_of([&] { ops::rope_inv_freq(5, 10000.0); }).find("not even") != std::string::npos);
    CHECK(error_of([&] { ops::rope_inv_freq(4, -1.0); }).find("theta") != std::string::npos);
    ops::RopeScaling bad = llama31();
    bad.high_freq_factor = 0.5;
    CHECK(error_of([&] { ops::rope_inv_freq(4, 10000.0, bad); }).find("high_freq_factor") !=
          std::string::npos);
    // sin/cos's domain: (maxT - 1)·1 above 2^20.
    Vec big_c(2 * ((1 << 20) + 2)), big_s(big_c.size());
    CHECK(error_of([&] {
              ops::rope_table(nx, T(big_c, {(1 << 20) + 2, 1}), T(big_s, {(1 << 20) + 2, 1}),
                              10000.0);
          }).find("domain") != std::string::npos);
    // Non-positive eps, or a wrongly shaped weight, is an invariant the caller broke.
    Vec x(6, 1.0f), y(6), rs(2), w(3, 1.0f), w2(2, 1.0f);
    CHECK_THROWS_AS(
        ops::rmsnorm_forward(nx, T(y, {2, 3}), T(rs, {2}), T(x, {2, 3}), T(w2, {2}), 1e-5f), Error);
    CHECK_THROWS_AS(
        ops::rmsnorm_forward(nx, T(y, {2, 3}), T(rs, {2}), T(x, {2, 3}), T(w, {3}), -1.0f), Error);
}

// ---------------------------------------------------------------------------------------------
// frequencies

TEST_CASE("llama ops: rope_inv_freq is theta^(-2j/HS), and Llama 3.1's scaling", "[llama]") {
    for (i64 HS : {64, 128, 6})
        for (double theta : {10000.0, 500000.0, 1000000.0}) {
            const std::vector<float> inv = ops::rope_inv_freq(HS, theta);
            REQUIRE(i64(inv.size()) == HS / 2);
            CHECK(inv[0] == 1.0f);
            for (i64 j = 0; j < HS / 2; j++) {
                const long double want =
                    std::pow((long double)theta, -(long double)(2 * j) / (long double)HS);
                INFO("HS " << HS << " theta " << theta << " j " << j);
                // Rounded once from an fp64 value within a few fp64 ulps: within half an ulp
                // and a hair.
                CHECK(std::fabs(double(inv[j] - want)) <=
                      0.5000001 * double(std::ldexp(1.0f, std::ilogb(inv[j]) - 23)));
            }
        }
    // Hugging Face's _compute_llama3_parameters, transcribed in long double: three bands.
    const ops::RopeScaling s = llama31();
    const double theta = 500000;
    const i64 HS = 128;
    const std::vector<float> inv = ops::rope_inv_freq(HS, theta, s);
    const long double pi = 3.14159265358979323846264338327950288L;
    int kept = 0, slowed = 0, mixed = 0;
    for (i64 j = 0; j < HS / 2; j++) {
        const long double f = std::pow((long double)theta, -(long double)(2 * j) / (long double)HS);
        const long double wavelen = 2 * pi / f,
                          low = s.original_max_position_embeddings / s.low_freq_factor,
                          high = s.original_max_position_embeddings / s.high_freq_factor;
        long double want = f;
        if (wavelen > low) {
            want = f / s.factor;
            slowed++;
        } else if (!(wavelen < high)) {
            const long double sm =
                (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                (s.high_freq_factor - s.low_freq_factor);
            want = (1 - sm) * f / s.factor + sm * f;
            mixed++;
        } else {
            kept++;
        }
        INFO("j " << j);
        CHECK(std::fabs(double(inv[j] - want)) <=
              0.5000001 * double(std::ldexp(1.0f, std::ilogb(inv[j]) - 23)));
    }
    CHECK(kept > 0);
    CHECK(slowed > 0);
    CHECK(mixed > 0);
    std::printf(
        "rope_inv_freq, Llama 3.1 (theta 5e5, HS 128): %d pairs kept, %d interpolated, %d "
        "slowed by 8\n",
        kept, mixed, slowed);
}

// ---------------------------------------------------------------------------------------------
// sin and cos

namespace {

// |got - ref| in ulps of ref in fp32 (ulp of a subnormal: 2^-149).
double ulp_error(float got, long double ref) {
    int e = 0;
    std::frexp(double(ref), &e);
    const double ulp = std::ldexp(1.0, std::max(e - 24, -149));
    return double(std::fabs((long double)got - ref)) / ulp;
}

struct Worst {
    double sin = 0, cos = 0;
    float sin_at = 0, cos_at = 0;
    void add(float x, float s, float c) {
        const double es = ulp_error(s, std::sin((long double)x)),
                     ec = ulp_error(c, std::cos((long double)x));
        if (es > sin) {
            sin = es;
            sin_at = x;
        }
        if (ec > cos) {
            cos = ec;
            cos_at = x;
        }
    }
};

// Every stride-th bit pattern of the floats in [0, 2^20], through vm.sincos, and their negations
// (sin odd and cos even, bit for bit).
Worst sweep(const cpu::VecMath& vm, uint32_t stride, i64* odd_even_breaks) {
    uint32_t hi;
    const float lim = mathfun::kTrigMax;
    std::memcpy(&hi, &lim, 4);
    const i64 N = 1 << 16;
    Vec x(N), s(N), c(N), ns(N), nc(N), nx(N);
    Worst w;
    for (uint64_t base = 0; base <= hi; base += uint64_t(N) * stride) {
        i64 n = 0;
        for (; n < N && base + uint64_t(n) * stride <= hi; n++) {
            const uint32_t b = uint32_t(base + uint64_t(n) * stride);
            std::memcpy(&x[n], &b, 4);
            nx[n] = -x[n];
        }
        vm.sincos(s.data(), c.data(), x.data(), n);
        vm.sincos(ns.data(), nc.data(), nx.data(), n);
        for (i64 i = 0; i < n; i++) {
            w.add(x[i], s[i], c[i]);
            if (bits(ns[i]) != (bits(s[i]) ^ 0x80000000u) || bits(nc[i]) != bits(c[i]))
                (*odd_even_breaks)++;
        }
    }
    return w;
}

}  // namespace

TEST_CASE("mathfun: sin and cos within 2 ulp of long double libm on [-2^20, 2^20]",
          "[llama][mathfun]") {
    i64 breaks = 0;
    const Worst w = sweep(cpu::vecmath(detect_isa()), 251, &breaks);
    std::printf(
        "sin: max %.4f ulp at %a; cos: max %.4f ulp at %a (every 251st float of [0, 2^20], "
        "and negated)\n",
        w.sin, double(w.sin_at), w.cos, double(w.cos_at));
    CHECK(w.sin <= gradcheck::kMathUlp);
    CHECK(w.cos <= gradcheck::kMathUlp);
    CHECK(breaks == 0);
    // Every angle of a Llama 3.1-8B table (theta 5e5, scaled, HS 128, 8192 positions): up to 8191.
    const std::vector<float> inv = ops::rope_inv_freq(128, 500000, llama31());
    Worst t;
    for (i64 p = 0; p < 8192; p++)
        for (float f : inv) {
            const float a = float(p) * f;
            float s, c;
            mathfun::sincos(a, &s, &c);
            t.add(a, s, c);
        }
    std::printf("Llama 3.1 table angles: sin max %.4f ulp at %a, cos max %.4f ulp at %a\n", t.sin,
                double(t.sin_at), t.cos, double(t.cos_at));
    CHECK(t.sin <= gradcheck::kMathUlp);
    CHECK(t.cos <= gradcheck::kMathUlp);
}

// Every float of [-2^20, 2^20]: about five minutes on one core; run with
// `test_llama_ops "[exhaustive]"`. Measured: sin 0.795 ulp, cos 0.805 ulp.
TEST_CASE("mathfun: sin and cos within 2 ulp (every float of [-2^20, 2^20])", "[.][exhaustive]") {
    i64 breaks = 0;
    const Worst w = sweep(cpu::vecmath(detect_isa()), 1, &breaks);
    std::printf("sin: max %.4f ulp at %a; cos: max %.4f ulp at %a\n", w.sin, double(w.sin_at),
                w.cos, double(w.cos_at));
    CHECK(w.sin <= gradcheck::kMathUlp);
    CHECK(w.cos <= gradcheck::kMathUlp);
    CHECK(breaks == 0);
}

TEST_CASE("mathfun: sin and cos special values", "[llama][mathfun]") {
    const float inf = INFINITY, tiny = 0x1p-149f;
    CHECK(bits(mathfun::sin(0.0f)) == bits(0.0f));
    CHECK(bits(mathfun::sin(-0.0f)) == bits(-0.0f));
    CHECK(mathfun::cos(0.0f) == 1.0f);
    CHECK(mathfun::cos(-0.0f) == 1.0f);
    CHECK(mathfun::sin(tiny) == tiny);
    CHECK(mathfun::sin(0x1p-20f) == 0x1p-20f);  // sin x rounds to x below about 2^-12
    CHECK(mathfun::cos(0x1p-13f) == 1.0f);
    for (float x : {inf, -inf, NAN, std::nextafter(mathfun::kTrigMax, inf), -3e6f, 1e30f}) {
        INFO(x);
        CHECK(std::isnan(mathfun::sin(x)));
        CHECK(std::isnan(mathfun::cos(x)));
    }
    CHECK_FALSE(std::isnan(mathfun::sin(mathfun::kTrigMax)));
    // Within 2^-30 of a multiple of π/2 the reduction must keep the small remainder exact:
    // the nearest float to 355·π/2 and others checked against libm in the sweep; here exact
    // quadrant values.
    CHECK(mathfun::sin(0x1.921fb6p+0f) == 1.0f);   // float(π/2)
    CHECK(mathfun::cos(0x1.921fb6p+1f) == -1.0f);  // float(π)
    CHECK(ulp_error(mathfun::sin(0x1.921fb6p+1f), std::sin(0x1.921fb6p+1L)) <= 1.0);
    float s = 0, c = 0;
    mathfun::sincos(2.5f, &s, &c);
    CHECK(bits(s) == bits(mathfun::sin(2.5f)));
    CHECK(bits(c) == bits(mathfun::cos(2.5f)));
}

TEST_CASE("vecmath: sincos, swiglu and rope give identical bits on every ISA, bodies and tails",
          "[llama][vecmath]") {
    const auto& s = cpu::vecmath(Isa::scalar);
    Rng r(10);
    for (i64 n : {1, 7, 15, 16, 17, 32, 63, 64, 100, 1029}) {
        Vec x = randv(r, n, -3e5f, 3e5f), g = randv(r, n, -20.0f, 20.0f), u = randv(r, n),
            d = randv(r, n), y = randv(r, n);
        x[n - 1] = (n % 2) ? NAN : 2e6f;
        Vec xx = randv(r, 2 * n), cs = randv(r, n), sn = randv(r, n);
        for (Isa isa : permitted_isas()) {
            const auto& v = cpu::vecmath(isa);
            INFO("n = " << n << " on " << isa_name(isa));
            Vec s1(n), c1(n), s2(n), c2(n);
            s.sincos(s1.data(), c1.data(), x.data(), n);
            v.sincos(s2.data(), c2.data(), x.data(), n);
            for (i64 i = 0; i < n; i++) {
                float ss, cc;
                mathfun::sincos(x[i], &ss, &cc);
                CHECK((bits(s1[i]) == bits(s2[i]) || (s1[i] != s1[i] && s2[i] != s2[i])));
                CHECK((bits(c1[i]) == bits(c2[i]) || (c1[i] != c1[i] && c2[i] != c2[i])));
                CHECK((bits(s1[i]) == bits(ss) || (ss != ss && s1[i] != s1[i])));
                CHECK((bits(c1[i]) == bits(cc) || (cc != cc && c1[i] != c1[i])));
            }
            Vec a(n), b(n);
            s.swiglu_forward(a.data(), g.data(), u.data(), n);
            v.swiglu_forward(b.data(), g.data(), u.data(), n);
            CHECK(first_diff(a, b) == -1);
            Vec a2 = y, b2 = y;
            a = y;
            b = y;
            s.swiglu_backward(a.data(), a2.data(), g.data(), u.data(), d.data(), n);
            v.swiglu_backward(b.data(), b2.data(), g.data(), u.data(), d.data(), n);
            CHECK(first_diff(a, b) == -1);
            CHECK(first_diff(a2, b2) == -1);
            Vec ra(2 * n), rb(2 * n);
            s.rope_forward(ra.data(), xx.data(), cs.data(), sn.data(), n);
            v.rope_forward(rb.data(), xx.data(), cs.data(), sn.data(), n);
            CHECK(first_diff(ra, rb) == -1);
            Vec inplace = xx;
            v.rope_forward(inplace.data(), inplace.data(), cs.data(), sn.data(), n);
            CHECK(first_diff(inplace, ra) == -1);
            ra = xx;
            rb = xx;
            s.rope_backward(ra.data(), d.data(), cs.data(), sn.data(), n / 2);
            v.rope_backward(rb.data(), d.data(), cs.data(), sn.data(), n / 2);
            CHECK(first_diff(ra, rb) == -1);
        }
    }
}
