// Matmul and the canonical GEMM (kernels/cpu/matmul*.cpp).
//
//   (a) forward, dinp, dweight, dbias against an fp64 reference, within a rounding bound
//   (b) bitwise mode equals a plain scalar implementation of the canonical order, bit for bit
//   (c) the scalar, AVX2 and AVX-512 paths give the same bits
//   (d) 1, 2 and 3 threads give the same bits
//   (e) accumulate (c += result) and transposed / general strides
//   (f) fp64 finite-difference check of the backward
//   (g) fast mode (oneDNN) against the fp64 reference
//   (h) the narrow accumulator (Numerics::fp8_promote) against a plain model of it, on every path
//
// Error bounds (Higham, Accuracy and Stability of Numerical Algorithms, §3.1). With unit roundoff
// u = 2^-24 and γ(n) = n·u / (1 - n·u), a sum of products computed with n roundings in any order
// (each fma or add rounds once) satisfies |ŝ - s| <= γ(n)·Σ|a_k·b_k|. The canonical order does
// min(K, block) roundings inside a block and ceil(log2(blocks)) in the tree, one more for a bias
// or an accumulated value (whose magnitude joins the sum); any other order needs n = K + 1. The
// fp64 reference itself is off by at most K·2^-53·Σ|a·b|, added to the bound. These bounds are
// derived, not tuned: a kernel that loses one rounding's worth of accuracy somewhere fails them.
#include "core/base/numerics.h"
#include "kernels/cpu/cpu_kernels.h"

#include <omp.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

using namespace px;

namespace {

std::vector<float> random_vec(i64 n, std::uint64_t seed) {
    std::vector<float> v(static_cast<size_t>(n));
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 12345;
    for (auto& e : v) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        e = static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 23) -
                               1.0);
    }
    return v;
}

std::vector<Isa> supported_isas() {
    std::vector<Isa> v{Isa::scalar};
    const Isa best = detect_isa();
    if (best == Isa::avx2 || best == Isa::avx512) v.push_back(Isa::avx2);
    if (best == Isa::avx512) v.push_back(Isa::avx512);
    return v;
}

Numerics bitwise(Isa isa, int block = 64) {
    Numerics nx;
    nx.mode = Mode::bitwise;
    nx.isa = isa;
    nx.block = block;
    return nx;
}

bool same_bits(const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

double gamma_n(double n) {
    const double u = std::ldexp(1.0, -24);
    return n * u / (1 - n * u);
}

// Roundings of one canonical reduction over n terms with blocks of `block`.
double canonical_roundings(i64 n, int block) {
    const i64 nb = num_blocks(n, block);
    return static_cast<double>(std::min<i64>(n, block)) +
           std::ceil(std::log2(static_cast<double>(nb)));
}

// A strided matrix view: element (i,j) at p[i*rs + j*cs].
struct View {
    const float* p;
    i64 rs, cs;
    float at(i64 i, i64 j) const { return p[i * rs + j * cs]; }
};

// The canonical order written plainly: blocks of fma sums from +0, then core's tree_sum.
float canonical_element(View a, View b, i64 i, i64 j, i64 K, int block) {
    const i64 nb = num_blocks(K, block);
    std::vector<float> part(static_cast<size_t>(nb));
    for (i64 blk = 0; blk < nb; blk++) {
        float acc = 0.0f;
        for (i64 k = blk * block; k < std::min(K, (blk + 1) * block); k++)
            acc = std::fma(a.at(i, k), b.at(k, j), acc);
        part[static_cast<size_t>(blk)] = acc;
    }
    return tree_sum(part.data(), nb);
}

// c (M,N) = canonical a·b (+ c0 when given).
std::vector<float> canonical_gemm(View a, View b, i64 M, i64 N, i64 K, int block,
                                  const std::vector<float>* c0 = nullptr) {
    std::vector<float> c(static_cast<size_t>(M * N));
    for (i64 i = 0; i < M; i++)
        for (i64 j = 0; j < N; j++) {
            const float s = canonical_element(a, b, i, j, K, block);
            c[static_cast<size_t>(i * N + j)] = c0 ? (*c0)[static_cast<size_t>(i * N + j)] + s : s;
        }
    return c;
}

// fp64 reference: value and Σ|terms| (including the magnitude of c0 when given).
struct Ref {
    std::vector<double> val, mag;
};
Ref ref_gemm(View a, View b, i64 M, i64 N, i64 K, const std::vector<float>* c0 = nullptr) {
    Ref r;
    r.val.assign(static_cast<size_t>(M * N), 0.0);
    r.mag.assign(static_cast<size_t>(M * N), 0.0);
    for (i64 i = 0; i < M; i++)
        for (i64 j = 0; j < N; j++) {
            double s = 0, m = 0;
            for (i64 k = 0; k < K; k++) {
                const double t = static_cast<double>(a.at(i, k)) * b.at(k, j);
                s += t;
                m += std::fabs(t);
            }
            if (c0) {
                s += (*c0)[static_cast<size_t>(i * N + j)];
                m += std::fabs((*c0)[static_cast<size_t>(i * N + j)]);
            }
            r.val[static_cast<size_t>(i * N + j)] = s;
            r.mag[static_cast<size_t>(i * N + j)] = m;
        }
    return r;
}

// Checks |got - ref| <= (γ(roundings) + K·2^-53)·Σ|terms| element by element.
void check_bound(const std::vector<float>& got, const Ref& ref, double roundings, i64 K,
                 const std::string& what) {
    const double g = gamma_n(roundings) + static_cast<double>(K) * std::ldexp(1.0, -53);
    i64 bad = 0;
    size_t first = 0;
    for (size_t e = 0; e < got.size(); e++) {
        const double err = std::fabs(got[e] - ref.val[e]);
        if (!(err <= g * ref.mag[e])) {
            if (bad++ == 0) first = e;
        }
    }
    INFO(what << ": " << bad << " of " << got.size() << " elements outside the bound; first at "
              << first
              << (bad ? " got " + std::to_string(got[first]) + " want " +
                            std::to_string(ref.val[first])
                      : std::string()));
    CHECK(bad == 0);
}

// A linear layer problem: inp (BT,C), weight (OC,C), bias (OC), dout (BT,OC), and initial
// gradients (they accumulate).
struct Linear {
    i64 BT, C, OC;
    std::vector<float> inp, weight, bias, dout, dinp0, dweight0, dbias0;
    Linear(i64 bt, i64 c, i64 oc, std::uint64_t seed)
        : BT(bt),
          C(c),
          OC(oc),
          inp(random_vec(bt * c, seed)),
          weight(random_vec(oc * c, seed + 1)),
          bias(random_vec(oc, seed + 2)),
          dout(random_vec(bt * oc, seed + 3)),
          dinp0(random_vec(bt * c, seed + 4)),
          dweight0(random_vec(oc * c, seed + 5)),
          dbias0(random_vec(oc, seed + 6)) {}

    // The views of the three GEMMs, as the kernels define them.
    View fwd_a() const { return {inp.data(), C, 1}; }
    View fwd_b() const { return {weight.data(), 1, C}; }  // b[k][o] = weight[o][k]
    View dinp_a() const { return {dout.data(), OC, 1}; }
    View dinp_b() const { return {weight.data(), C, 1}; }
    View dw_a() const { return {dout.data(), 1, OC}; }  // a[o][t] = dout[t][o]
    View dw_b() const { return {inp.data(), C, 1}; }

    struct Out {
        std::vector<float> out, dinp, dweight, dbias;
    };
    Out run(const Numerics& nx) const {
        Out o{std::vector<float>(static_cast<size_t>(BT * OC)), dinp0, dweight0, dbias0};
        cpu::matmul_forward(nx, o.out.data(), inp.data(), weight.data(), bias.data(), BT, C, OC);
        cpu::matmul_backward(nx, o.dinp.data(), o.dweight.data(), o.dbias.data(), dout.data(),
                             inp.data(), weight.data(), BT, C, OC);
        return o;
    }
};

struct Shape {
    i64 BT, C, OC;
};

// Odd shapes: not multiples of any tile (14x32, 6x16, 4x8) or of the block; K < block; K = 1.
const Shape kShapes[] = {
    {1, 1, 1},      {3, 5, 7},  {17, 63, 29}, {37, 64, 65},  {64, 130, 47},
    {29, 200, 100}, {5, 1, 33}, {1, 70, 3},   {15, 33, 129},
};

}  // namespace

// The bias repeated on every row (BT, OC): the forward's starting value as ref_gemm takes it.
std::vector<float> bias_rows(const Linear& L) {
    std::vector<float> r(static_cast<size_t>(L.BT * L.OC));
    for (i64 m = 0; m < L.BT; m++) std::copy(L.bias.begin(), L.bias.end(), r.begin() + m * L.OC);
    return r;
}

TEST_CASE("matmul: forward and backward against an fp64 reference", "[matmul]") {
    for (Isa isa : supported_isas())
        for (int block : {64, 1, 7, 1000})
            for (const Shape& s : kShapes) {
                const Linear L(s.BT, s.C, s.OC, 10);
                const auto o = L.run(bitwise(isa, block));
                const std::string tag = std::string(isa_name(isa)) + " block " +
                                        std::to_string(block) + " shape " + std::to_string(s.BT) +
                                        "x" + std::to_string(s.C) + "x" + std::to_string(s.OC);
                // out = a·b + bias: the bias is one more term and one more rounding.
                const std::vector<float> rows = bias_rows(L);
                check_bound(o.out, ref_gemm(L.fwd_a(), L.fwd_b(), s.BT, s.OC, s.C, &rows),
                            canonical_roundings(s.C, block) + 1, s.C, tag + " out");
                check_bound(o.dinp, ref_gemm(L.dinp_a(), L.dinp_b(), s.BT, s.C, s.OC, &L.dinp0),
                            canonical_roundings(s.OC, block) + 1, s.OC, tag + " dinp");
                check_bound(o.dweight, ref_gemm(L.dw_a(), L.dw_b(), s.OC, s.C, s.BT, &L.dweight0),
                            canonical_roundings(s.BT, block) + 1, s.BT, tag + " dweight");
                // dbias = Σ_t dout[t] (+ dbias0): a GEMM with a column of ones.
                const std::vector<float> ones(static_cast<size_t>(s.BT), 1.0f);
                check_bound(o.dbias,
                            ref_gemm(L.dw_a(), View{ones.data(), 1, 0}, s.OC, 1, s.BT, &L.dbias0),
                            canonical_roundings(s.BT, block) + 1, s.BT, tag + " dbias");
            }
}

TEST_CASE("matmul: bitwise mode is the canonical order, bit for bit", "[matmul]") {
    for (Isa isa : supported_isas())
        for (int block : {64, 1, 7, 1000})
            for (const Shape& s : kShapes) {
                INFO(isa_name(isa)
                     << " block " << block << " shape " << s.BT << "x" << s.C << "x" << s.OC);
                const Linear L(s.BT, s.C, s.OC, 20);
                const auto o = L.run(bitwise(isa, block));
                // Forward: the tree, then + bias.
                std::vector<float> out =
                    canonical_gemm(L.fwd_a(), L.fwd_b(), s.BT, s.OC, s.C, block);
                for (i64 m = 0; m < s.BT; m++)
                    for (i64 j = 0; j < s.OC; j++)
                        out[static_cast<size_t>(m * s.OC + j)] += L.bias[static_cast<size_t>(j)];
                CHECK(same_bits(o.out, out));
                CHECK(same_bits(o.dinp, canonical_gemm(L.dinp_a(), L.dinp_b(), s.BT, s.C, s.OC,
                                                       block, &L.dinp0)));
                CHECK(same_bits(o.dweight, canonical_gemm(L.dw_a(), L.dw_b(), s.OC, s.C, s.BT,
                                                          block, &L.dweight0)));
                // dbias: plain adds (no products), core's canonical_sum over each column.
                std::vector<float> dbias = L.dbias0, col(static_cast<size_t>(s.BT));
                for (i64 j = 0; j < s.OC; j++) {
                    for (i64 m = 0; m < s.BT; m++)
                        col[static_cast<size_t>(m)] = L.dout[static_cast<size_t>(m * s.OC + j)];
                    dbias[static_cast<size_t>(j)] += canonical_sum(col.data(), s.BT, block);
                }
                CHECK(same_bits(o.dbias, dbias));
            }
}

TEST_CASE("matmul: every ISA path gives the same bits", "[matmul]") {
    // Shapes that reach both operand layouts (M <= N and M > N), K split into several chunks
    // (K > 768), deep trees (block 1) and the multi-threaded driver (work >= 2^18).
    const Shape shapes[] = {{37, 64, 65},   {100, 1000, 300}, {300, 1000, 100},
                            {40, 2500, 70}, {70, 2500, 40},   {64, 130, 47}};
    for (const Shape& s : shapes)
        for (int block : {64, 1, 48}) {
            INFO("shape " << s.BT << "x" << s.C << "x" << s.OC << " block " << block);
            const Linear L(s.BT, s.C, s.OC, 30);
            const auto ref = L.run(bitwise(Isa::scalar, block));
            for (Isa isa : supported_isas()) {
                if (isa == Isa::scalar) continue;
                INFO(isa_name(isa));
                const auto o = L.run(bitwise(isa, block));
                CHECK(same_bits(o.out, ref.out));
                CHECK(same_bits(o.dinp, ref.dinp));
                CHECK(same_bits(o.dweight, ref.dweight));
                CHECK(same_bits(o.dbias, ref.dbias));
            }
        }
}

TEST_CASE("matmul: 1, 2 and 3 threads give the same bits", "[matmul]") {
    const int saved = omp_get_max_threads();
    // {300, 64, 1000} has BT·OC >= 2^18, so dbias runs threaded too.
    const Shape shapes[] = {
        {100, 1000, 300}, {300, 1000, 100}, {256, 768, 500}, {70, 2500, 40}, {300, 64, 1000}};
    for (const Shape& s : shapes)
        for (Isa isa : supported_isas()) {
            // The driver is the same for every path; the slow scalar one runs on one shape.
            if (isa == Isa::scalar && &s != &shapes[0]) continue;
            INFO("shape " << s.BT << "x" << s.C << "x" << s.OC << " " << isa_name(isa));
            const Linear L(s.BT, s.C, s.OC, 40);
            omp_set_num_threads(1);
            const auto ref = L.run(bitwise(isa));
            for (int t : {2, 3}) {
                omp_set_num_threads(t);
                const auto o = L.run(bitwise(isa));
                CHECK(same_bits(o.out, ref.out));
                CHECK(same_bits(o.dinp, ref.dinp));
                CHECK(same_bits(o.dweight, ref.dweight));
                CHECK(same_bits(o.dbias, ref.dbias));
            }
        }
    omp_set_num_threads(saved);
}

TEST_CASE("gemm: accumulate and strides", "[matmul]") {
    const i64 M = 23, N = 41, K = 150;
    // Storage large enough for every layout below, including a stride-2 one.
    const std::vector<float> abuf = random_vec(2 * M * K * 2, 50),
                             bbuf = random_vec(2 * K * N * 2, 51);
    struct Layout {
        const char* name;
        View a, b;
    };
    const Layout layouts[] = {
        {"NN", {abuf.data(), K, 1}, {bbuf.data(), N, 1}},
        {"TN", {abuf.data(), 1, M}, {bbuf.data(), N, 1}},
        {"NT", {abuf.data(), K, 1}, {bbuf.data(), 1, K}},
        {"TT", {abuf.data(), 1, M}, {bbuf.data(), 1, K}},
        {"strided",
         {abuf.data() + 1, 2 * K * 2, 2},
         {bbuf.data() + 3, 2, 2 * K}},  // no unit stride
    };
    const i64 ldc = N + 5;  // c is a window into a wider matrix
    for (Isa isa : supported_isas())
        for (const Layout& l : layouts) {
            INFO(isa_name(isa) << " " << l.name);
            const Numerics nx = bitwise(isa, 16);
            const std::vector<float> want = canonical_gemm(l.a, l.b, M, N, K, 16);
            std::vector<float> c(static_cast<size_t>(M * ldc), -7.0f);
            cpu::gemm(nx, c.data(), ldc, l.a.p, l.a.rs, l.a.cs, l.b.p, l.b.rs, l.b.cs, M, N, K,
                      false);
            std::vector<float> got(static_cast<size_t>(M * N));
            for (i64 i = 0; i < M; i++) {
                for (i64 j = 0; j < N; j++)
                    got[static_cast<size_t>(i * N + j)] = c[static_cast<size_t>(i * ldc + j)];
                for (i64 j = N; j < ldc; j++)
                    CHECK(c[static_cast<size_t>(i * ldc + j)] == -7.0f);  // untouched
            }
            CHECK(same_bits(got, want));
            // Accumulate: c = c0 + result, one rounding, bit for bit.
            const std::vector<float> c0 = random_vec(M * ldc, 52);
            std::vector<float> acc = c0;
            cpu::gemm(nx, acc.data(), ldc, l.a.p, l.a.rs, l.a.cs, l.b.p, l.b.rs, l.b.cs, M, N, K,
                      true);
            bool ok = true;
            for (i64 i = 0; i < M; i++)
                for (i64 j = 0; j < ldc; j++) {
                    const size_t e = static_cast<size_t>(i * ldc + j);
                    const float w = j < N ? c0[e] + want[static_cast<size_t>(i * N + j)] : c0[e];
                    ok = ok && std::memcmp(&acc[e], &w, sizeof w) == 0;
                }
            CHECK(ok);
            // Fast mode on the same layout (oneDNN, or the canonical path for "strided").
            Numerics fx = nx;
            fx.mode = Mode::fast;
            std::vector<float> cf(static_cast<size_t>(M * N));
            cpu::gemm(fx, cf.data(), N, l.a.p, l.a.rs, l.a.cs, l.b.p, l.b.rs, l.b.cs, M, N, K,
                      false);
            check_bound(cf, ref_gemm(l.a, l.b, M, N, K), static_cast<double>(K), K,
                        std::string("fast ") + l.name);
        }
}

TEST_CASE("matmul: backward against fp64 finite differences", "[matmul]") {
    // loss = Σ out·R with out = inp·weightᵀ + bias, in fp64. The kernels' gradients with dout = R
    // (from zero) must match central differences of the loss, within the fp32 rounding bound of
    // each gradient plus the rounding error of the two fp64 losses divided by 2h (the loss is
    // linear in every parameter, so the difference has no truncation error).
    const i64 BT = 13, C = 70, OC = 21;
    const Linear L(BT, C, OC, 60);
    const std::vector<float>& R = L.dout;
    auto loss = [&](const std::vector<double>& inp, const std::vector<double>& w,
                    const std::vector<double>& b, double& mag) {
        double s = 0;
        mag = 0;
        for (i64 m = 0; m < BT; m++)
            for (i64 o = 0; o < OC; o++) {
                double y = b[static_cast<size_t>(o)];
                for (i64 k = 0; k < C; k++)
                    y += inp[static_cast<size_t>(m * C + k)] * w[static_cast<size_t>(o * C + k)];
                s += y * R[static_cast<size_t>(m * OC + o)];
                mag += std::fabs(y * R[static_cast<size_t>(m * OC + o)]);
            }
        return s;
    };
    std::vector<double> inp(L.inp.begin(), L.inp.end()), w(L.weight.begin(), L.weight.end()),
        b(L.bias.begin(), L.bias.end());
    const double h = 1e-3;
    for (Isa isa : supported_isas())
        for (Mode mode : {Mode::bitwise, Mode::fast}) {
            INFO(isa_name(isa) << " " << mode_name(mode));
            Numerics nx = bitwise(isa, 16);
            nx.mode = mode;
            std::vector<float> dinp(static_cast<size_t>(BT * C), 0.0f),
                dw(static_cast<size_t>(OC * C), 0.0f), db(static_cast<size_t>(OC), 0.0f);
            cpu::matmul_backward(nx, dinp.data(), dw.data(), db.data(), R.data(), L.inp.data(),
                                 L.weight.data(), BT, C, OC);
            // The gradient bound for parameter p: γ(K+1)·Σ|terms of the gradient|, with any order.
            auto check = [&](std::vector<double>& param, const std::vector<float>& grad, i64 idx,
                             double grad_mag, i64 K, const char* name) {
                const double save = param[static_cast<size_t>(idx)];
                double mag1, mag2;
                param[static_cast<size_t>(idx)] = save + h;
                const double lp = loss(inp, w, b, mag1);
                param[static_cast<size_t>(idx)] = save - h;
                const double lm = loss(inp, w, b, mag2);
                param[static_cast<size_t>(idx)] = save;
                const double fd = (lp - lm) / (2 * h);
                const double tol = gamma_n(static_cast<double>(K + 1)) * grad_mag +
                                   static_cast<double>(C + 2 + BT * OC) * std::ldexp(1.0, -53) *
                                       (mag1 + mag2) / (2 * h);
                INFO(name << "[" << idx << "] kernel " << grad[static_cast<size_t>(idx)] << " fd "
                          << fd << " tol " << tol);
                CHECK(std::fabs(grad[static_cast<size_t>(idx)] - fd) <= tol);
            };
            for (i64 idx = 0; idx < BT * C; idx += 7) {
                const i64 m = idx / C, k = idx % C;
                double gm = 0;
                for (i64 o = 0; o < OC; o++)
                    gm += std::fabs(R[static_cast<size_t>(m * OC + o)] *
                                    L.weight[static_cast<size_t>(o * C + k)]);
                check(inp, dinp, idx, gm, OC, "dinp");
            }
            for (i64 idx = 0; idx < OC * C; idx += 11) {
                const i64 o = idx / C, k = idx % C;
                double gm = 0;
                for (i64 m = 0; m < BT; m++)
                    gm += std::fabs(R[static_cast<size_t>(m * OC + o)] *
                                    L.inp[static_cast<size_t>(m * C + k)]);
                check(w, dw, idx, gm, BT, "dweight");
            }
            for (i64 o = 0; o < OC; o++) {
                double gm = 0;
                for (i64 m = 0; m < BT; m++) gm += std::fabs(R[static_cast<size_t>(m * OC + o)]);
                check(b, db, o, gm, BT, "dbias");
            }
        }
}

TEST_CASE("matmul: fast mode against the fp64 reference", "[matmul]") {
    Numerics fx;
    fx.mode = Mode::fast;
    fx.isa = detect_isa();
    for (const Shape& s : kShapes) {
        const std::string tag = "fast shape " + std::to_string(s.BT) + "x" + std::to_string(s.C) +
                                "x" + std::to_string(s.OC);
        const Linear L(s.BT, s.C, s.OC, 70);
        const auto o = L.run(fx);
        const std::vector<float> rows = bias_rows(L);
        // Any summation order: n = K + 1 roundings (K products, then the bias or the old value).
        check_bound(o.out, ref_gemm(L.fwd_a(), L.fwd_b(), s.BT, s.OC, s.C, &rows),
                    static_cast<double>(s.C + 1), s.C, tag + " out");
        check_bound(o.dinp, ref_gemm(L.dinp_a(), L.dinp_b(), s.BT, s.C, s.OC, &L.dinp0),
                    static_cast<double>(s.OC + 1), s.OC, tag + " dinp");
        check_bound(o.dweight, ref_gemm(L.dw_a(), L.dw_b(), s.OC, s.C, s.BT, &L.dweight0),
                    static_cast<double>(s.BT + 1), s.BT, tag + " dweight");
        const std::vector<float> ones(static_cast<size_t>(s.BT), 1.0f);
        check_bound(o.dbias, ref_gemm(L.dw_a(), View{ones.data(), 1, 0}, s.OC, 1, s.BT, &L.dbias0),
                    static_cast<double>(s.BT + 1), s.BT, tag + " dbias");
    }
    // Larger cases, cut into items that the threads take (matmul_fast.cpp): by columns, and by
    // rows when the output is taller than wide (a weight gradient of 128 tokens, 200 → 900,
    // whose A is doutᵀ); the last item narrower than the others.
    const Linear L(96, 700, 300, 71);
    const auto o = L.run(fx);
    check_bound(o.dinp, ref_gemm(L.dinp_a(), L.dinp_b(), 96, 700, 300, &L.dinp0), 301, 300,
                "fast large dinp");
    check_bound(o.dweight, ref_gemm(L.dw_a(), L.dw_b(), 300, 700, 96, &L.dweight0), 97, 96,
                "fast large dweight");
    const Linear T(128, 200, 900, 72);
    const auto t = T.run(fx);
    const std::vector<float> t_rows = bias_rows(T);
    check_bound(t.out, ref_gemm(T.fwd_a(), T.fwd_b(), 128, 900, 200, &t_rows), 201, 200,
                "fast tall out");
    check_bound(t.dinp, ref_gemm(T.dinp_a(), T.dinp_b(), 128, 200, 900, &T.dinp0), 901, 900,
                "fast tall dinp");
    check_bound(t.dweight, ref_gemm(T.dw_a(), T.dw_b(), 900, 200, 128, &T.dweight0), 129, 128,
                "fast tall dweight (items by rows)");
    // More tokens than outputs: the forward's items are rows, each starting from the bias.
    const Linear R(512, 128, 100, 73);
    const auto r = R.run(fx);
    const std::vector<float> r_rows = bias_rows(R);
    check_bound(r.out, ref_gemm(R.fwd_a(), R.fwd_b(), 512, 100, 128, &r_rows), 129, 128,
                "fast out, items by rows");
}

TEST_CASE("gemm: long K is chunked without changing a bit", "[matmul]") {
    // K = 5000 with block 1: 5000 blocks, a tree 14 levels deep, and the driver's K chunks
    // (tile stacks kept between chunks). Also block 64 and a block that does not divide the chunk.
    const i64 M = 9, N = 35, K = 5000;
    const std::vector<float> a = random_vec(M * K, 80), b = random_vec(K * N, 81);
    const View av{a.data(), K, 1}, bv{b.data(), N, 1};
    for (int block : {1, 64, 300}) {
        const std::vector<float> want = canonical_gemm(av, bv, M, N, K, block);
        for (Isa isa : supported_isas()) {
            INFO(isa_name(isa) << " block " << block);
            std::vector<float> c(static_cast<size_t>(M * N));
            cpu::gemm(bitwise(isa, block), c.data(), N, a.data(), K, 1, b.data(), N, 1, M, N, K,
                      false);
            CHECK(same_bits(c, want));
        }
    }
}

TEST_CASE("matmul: zero inputs keep the canonical sign of zero", "[matmul]") {
    // A block of zero products sums to +0 from the +0 start (+0 + -0 = +0), never to -0: rows of
    // zeros (padding tokens) against negative weights must give +0 on every path.
    const i64 BT = 19, C = 70, OC = 37;
    Linear L(BT, C, OC, 90);
    for (i64 m = 0; m < BT; m += 3)
        for (i64 k = 0; k < C; k++) L.inp[static_cast<size_t>(m * C + k)] = 0.0f;
    for (float& w : L.weight) w = -std::fabs(w);  // zero rows give products of -0 only
    for (i64 m = 1; m < BT; m += 4)
        for (i64 o = 0; o < OC; o++) L.dout[static_cast<size_t>(m * OC + o)] = -0.0f;
    std::fill(L.bias.begin(), L.bias.end(), -0.0f);
    std::fill(L.dinp0.begin(), L.dinp0.end(), -0.0f);
    for (Isa isa : supported_isas())
        for (int block : {64, 5}) {
            INFO(isa_name(isa) << " block " << block);
            const auto o = L.run(bitwise(isa, block));
            std::vector<float> out = canonical_gemm(L.fwd_a(), L.fwd_b(), BT, OC, C, block);
            for (i64 m = 0; m < BT; m++)
                for (i64 j = 0; j < OC; j++)
                    out[static_cast<size_t>(m * OC + j)] += L.bias[static_cast<size_t>(j)];
            CHECK(same_bits(o.out, out));
            CHECK(same_bits(o.dinp,
                            canonical_gemm(L.dinp_a(), L.dinp_b(), BT, C, OC, block, &L.dinp0)));
            CHECK(same_bits(o.dweight,
                            canonical_gemm(L.dw_a(), L.dw_b(), OC, C, BT, block, &L.dweight0)));
            CHECK(!std::signbit(o.out[0]));  // row 0 is zeros: +0 + (-0) = +0
        }
}

// ---- the narrow accumulator (Numerics::fp8_promote, core/base/numerics.h) ----------------------

namespace {

// The narrow accumulator written plainly: in each block, segments of `seg` products from the
// block's first element; a segment's sum starts at +0 and keeps, after every fma, 13 explicit
// mantissa bits (the low 10 bits of the fp32 result cleared); it is then added into the block's
// fp32 sum, which starts at +0; the blocks combine in core's tree_sum.
float keep13(float x) {
    std::uint32_t b;
    std::memcpy(&b, &x, 4);
    b &= ~std::uint32_t{0x3FF};
    std::memcpy(&x, &b, 4);
    return x;
}

float narrow_element(View a, View b, i64 i, i64 j, i64 K, int block, i64 seg) {
    const i64 nb = num_blocks(K, block);
    std::vector<float> part(static_cast<size_t>(nb));
    for (i64 blk = 0; blk < nb; blk++) {
        const i64 end = std::min(K, (blk + 1) * block);
        float acc = 0.0f;
        for (i64 s0 = blk * block; s0 < end; s0 += seg) {
            float s = 0.0f;
            for (i64 k = s0; k < std::min(end, s0 + seg); k++)
                s = keep13(std::fma(a.at(i, k), b.at(k, j), s));
            acc = acc + s;
        }
        part[static_cast<size_t>(blk)] = acc;
    }
    return tree_sum(part.data(), nb);
}

std::vector<float> narrow_gemm(View a, View b, i64 M, i64 N, i64 K, int block, i64 seg,
                               const std::vector<float>* c0 = nullptr) {
    std::vector<float> c(static_cast<size_t>(M * N));
    for (i64 i = 0; i < M; i++)
        for (i64 j = 0; j < N; j++) {
            const float s = narrow_element(a, b, i, j, K, block, seg);
            c[static_cast<size_t>(i * N + j)] = c0 ? (*c0)[static_cast<size_t>(i * N + j)] + s : s;
        }
    return c;
}

Numerics narrow(Isa isa, int block, int seg, Mode mode = Mode::bitwise) {
    Numerics nx = bitwise(isa, block);
    nx.mode = mode;
    nx.fp8_promote = seg;
    return nx;
}

}  // namespace

TEST_CASE("narrow accumulator: a truncated 13-bit sum, promoted to fp32 every N products",
          "[matmul]") {
    // One row of 64 products: 1, then 63 times 2^-14. In a 13-bit sum every 2^-14 is lost
    // (1 + 2^-14 truncates to 1); promoted after each product (N = 1) each counts in fp32.
    std::vector<float> a(64, 1.0f), b(64, std::ldexp(1.0f, -14));
    b[0] = 1.0f;
    for (Isa isa : supported_isas()) {
        INFO(isa_name(isa));
        float c = -1.0f;
        cpu::gemm(narrow(isa, 64, 64), &c, 1, a.data(), 64, 1, b.data(), 1, 1, 1, 1, 64, false);
        CHECK(c == 1.0f);
        cpu::gemm(narrow(isa, 64, 1), &c, 1, a.data(), 64, 1, b.data(), 1, 1, 1, 1, 64, false);
        CHECK(c == 1.0f + 63 * std::ldexp(1.0f, -14));
        // N = 8: segment 0 holds the 1 and loses its seven small products; seven segments of
        // eight small products sum exactly (8·2^-14 fits) and are promoted.
        cpu::gemm(narrow(isa, 64, 8), &c, 1, a.data(), 64, 1, b.data(), 1, 1, 1, 1, 64, false);
        CHECK(c == 1.0f + 56 * std::ldexp(1.0f, -14));
        cpu::gemm(bitwise(isa, 64), &c, 1, a.data(), 64, 1, b.data(), 1, 1, 1, 1, 64, false);
        CHECK(c == 1.0f + 63 * std::ldexp(1.0f, -14));  // fp32 throughout
    }
}

TEST_CASE("narrow accumulator: every path equals the plain model, bit for bit", "[matmul]") {
    struct P {
        int block, seg;
    };
    for (const Shape& s : kShapes) {
        const Linear L(s.BT, s.C, s.OC, static_cast<std::uint64_t>(s.BT * 131 + s.C));
        for (const P p : {P{64, 64}, P{64, 16}, P{64, 5}, P{16, 1}, P{128, 128}, P{128, 48}}) {
            std::vector<float> out =
                narrow_gemm(L.fwd_a(), L.fwd_b(), s.BT, s.OC, s.C, p.block, p.seg);
            for (i64 m = 0; m < s.BT; m++)
                for (i64 j = 0; j < s.OC; j++)
                    out[static_cast<size_t>(m * s.OC + j)] += L.bias[static_cast<size_t>(j)];
            const std::vector<float> dinp =
                narrow_gemm(L.dinp_a(), L.dinp_b(), s.BT, s.C, s.OC, p.block, p.seg, &L.dinp0);
            const std::vector<float> dw =
                narrow_gemm(L.dw_a(), L.dw_b(), s.OC, s.C, s.BT, p.block, p.seg, &L.dweight0);
            for (Isa isa : supported_isas())
                for (Mode mode : {Mode::bitwise, Mode::fast}) {  // no fast form: the same bits
                    INFO(isa_name(isa)
                         << " " << mode_name(mode) << " block " << p.block << " N " << p.seg
                         << " BT=" << s.BT << " C=" << s.C << " OC=" << s.OC);
                    const auto o = L.run(narrow(isa, p.block, p.seg, mode));
                    CHECK(same_bits(o.out, out));
                    CHECK(same_bits(o.dinp, dinp));
                    CHECK(same_bits(o.dweight, dw));
                }
        }
    }
}

TEST_CASE("narrow accumulator: long K in chunks, strided operands, threads", "[matmul]") {
    const i64 M = 9, N = 35, K = 3000;  // K chunks of the driver (kKC) hold several segments
    const std::vector<float> a = random_vec(M * K, 82), b = random_vec(K * N, 83);
    const View at{a.data(), 1, M};  // a transposed in memory: element (i,k) at a[k·M + i]
    const View bv{b.data(), N, 1};
    const std::vector<float> c0 = random_vec(M * N, 84);
    const int saved = omp_get_max_threads();
    for (const int block : {64, 256}) {
        const std::vector<float> want =
            narrow_gemm(at, bv, M, N, K, block, 128 < block ? 128 : block, &c0);
        CHECK_FALSE(same_bits(want, canonical_gemm(at, bv, M, N, K, block, &c0)));
        for (Isa isa : supported_isas())
            for (int threads : {1, 2, 3}) {
                INFO(isa_name(isa) << " block " << block << " threads " << threads);
                omp_set_num_threads(threads);
                std::vector<float> c = c0;
                cpu::gemm(narrow(isa, block, 128 < block ? 128 : block), c.data(), N, a.data(), 1,
                          M, b.data(), N, 1, M, N, K, true);
                CHECK(same_bits(c, want));
            }
    }
    omp_set_num_threads(saved);
}
