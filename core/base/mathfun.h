// The project's own exp, log, tanh, erf, sin and cos in fp32, identical on every path
// (docs/numerics.md).
//
// Index
//   exp_t, log_t, tanh_t, erf_t   the algorithms, written once as templates over a SIMD-ops type S
//   sincos_t                      sin and cos together (rotary position embeddings' tables)
//   ScalarOps                     S for one float at a time (std::fma), used by generic code
//   exp, log, tanh, erf           scalar wrappers over ScalarOps
//   sin, cos, sincos
//
// Why our own: libm differs between versions and machines and has no vector twin that rounds the
// same way, so a kernel that called it could not promise the same bits on every path. Here every
// path (scalar, AVX2, AVX-512, and later CUDA) executes the same sequence of IEEE operations:
// add, sub, mul, div, fma, comparisons, selects, and exact bit manipulations. Nothing depends on
// the vector width, so a lane computes what the scalar code computes, bit for bit.
//
// The ops type S provides (all static):
//   F, I, M                    float vector, int32 vector, lane mask
//   set(float) iset(int32)     broadcast
//   add sub mul div fma        IEEE, fma(a, b, c) = a·b + c rounded once
//   min(a, b) = a < b ? a : b  max(a, b) = a > b ? a : b  (the x86 semantics, also for NaN)
//   lt gt eq(F, F) -> M, isnan(F) -> M, mor(M, M), select(M, a, b) = m ? a : b
//   ibits(F) fbits(I)          reinterpret; iadd isub iand ior, sra<k> sll<k>, cvt(I) -> F
//
// Accuracy, measured over every float against double libm (tests/kernels/test_ops.cpp, "[exhaustive]"):
// exp 0.988 ulp, log 0.940 ulp, tanh 0.996 ulp, erf 0.991 ulp. sin 0.795 ulp, cos 0.805 ulp, over
// every float of [-2^20, 2^20] against long double libm (tests/kernels/test_llama_ops.cpp, also
// "[exhaustive]"). The contract is 2 ulp.
//
// An ISA translation unit (compiled with -mavx2 or -mavx512f) defines PX_MATHFUN_NO_SCALAR
// before including this file: the scalar wrappers are then invisible there, so no inline copy
// compiled with AVX encodings can be picked by the linker for generic code.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace px::mathfun {

// --- constants ----------------------------------------------------------------------------------
// Hex literals so the value is the float written, not a decimal that a reader has to round.

// exp: x = n·ln2 + r with n = round(x·log2e), |r| <= ln2/2. Inputs are clamped first so n stays in
// [-150, 128]: below -104, exp(x) < 2^-150 rounds to 0; above 89, exp(x) > FLT_MAX.
inline constexpr float kExpLo = -104.0f;
inline constexpr float kExpHi = 89.0f;
inline constexpr float kLog2e = 0x1.715476p+0f;
// 1.5·2^23: adding it rounds x·log2e to an integer held in the low mantissa bits (same rounding
// on every path, no float->int conversion instruction involved).
inline constexpr float kShift = 0x1.8p+23f;
inline constexpr float kLn2Hi = 0x1.62e430p-1f;  // float(ln2); n·kLn2Hi subtracted exactly by fma
inline constexpr float kLn2Lo = -0x1.05c610p-29f;  // ln2 - kLn2Hi
// exp(r) = 1 + r + r²·Q(r), Q of degree 5: a weighted least-squares (Lawson, near minimax) fit of
// (exp(r) - 1 - r)/r² on |r| <= 0.35, coefficients rounded to float. Approximation error with the
// rounded coefficients: 0.02 ulp.
inline constexpr float kExpQ0 = 0x1.000000p-1f;
inline constexpr float kExpQ1 = 0x1.555554p-3f;
inline constexpr float kExpQ2 = 0x1.555486p-5f;
inline constexpr float kExpQ3 = 0x1.111280p-7f;
inline constexpr float kExpQ4 = 0x1.6d946ap-10f;
inline constexpr float kExpQ5 = 0x1.9f02bep-13f;

// log: x = 2^e·m with m in [sqrt(1/2), sqrt(2)), f = m - 1 (exact), s = f/(2 + f), z = s²,
// log(1 + f) = f - s·(f - R(z)), R(z) = z·(2/3 + z·(2/5 + z·(2/7 + z·2/9))) (the atanh series;
// truncation below 0.02 ulp for |s| <= 0.172).
inline constexpr int32_t kSqrtHalfBits = 0x3f3504f3;  // bits of float(sqrt(1/2))
inline constexpr float kLogR1 = 0x1.555556p-1f;       // 2/3
inline constexpr float kLogR2 = 0x1.99999ap-2f;       // 2/5
inline constexpr float kLogR3 = 0x1.24924ap-2f;       // 2/7
inline constexpr float kLogR4 = 0x1.c71c72p-3f;       // 2/9

// tanh: |x| < 0.9: x + x·z·P(z), z = x², P of degree 6 (Lawson fit of (tanh(x) - x)/x³ with
// relative weight; approximation error with float coefficients 0.1 ulp). There is no cancellation
// near 0, which the exp form would suffer. |x| >= 0.9: 1 - 2/(exp(2|x|) + 1), where the quotient
// is below 0.3 so its rounding costs little. |x| >= 10 saturates to ±1 (the exact value is within
// 2^-57 of it).
inline constexpr float kTanhSmall = 0.9f;
inline constexpr float kTanhSat = 10.0f;
inline constexpr float kTanhP0 = -0x1.55554ep-2f;
inline constexpr float kTanhP1 = 0x1.110f34p-3f;
inline constexpr float kTanhP2 = -0x1.b9c9f2p-5f;
inline constexpr float kTanhP3 = 0x1.62ef7cp-6f;
inline constexpr float kTanhP4 = -0x1.0ed006p-7f;
inline constexpr float kTanhP5 = 0x1.5283f8p-9f;
inline constexpr float kTanhP6 = -0x1.dd95a8p-12f;

// erf: |x| < 1: x + x·P(x²), P of degree 6 (Lawson fit, relative; 0.04 ulp). 1 <= |x| < 3.92:
// 1 - exp(-x²)·Q(t), t = (|x| - c)·k maps [1, 3.92] to [-1, 1], Q of degree 10 fits erfc(x)·e^{x²}
// (error weighted by e^{-x²}, i.e. absolute in erf: 0.02 ulp). exp(-x²) uses x² = hi + lo (lo by
// fma) so the rounding of x² does not enter. |x| >= 3.92 saturates to ±1 (erfc(3.92) < 2^-25).
inline constexpr float kErfSmall = 1.0f;
inline constexpr float kErfSat = 3.92f;
inline constexpr float kErfP0 = 0x1.06eba8p-3f;
inline constexpr float kErfP1 = -0x1.81273ep-2f;
inline constexpr float kErfP2 = 0x1.ce2cf8p-4f;
inline constexpr float kErfP3 = -0x1.b7f90ep-6f;
inline constexpr float kErfP4 = 0x1.5405b2p-8f;
inline constexpr float kErfP5 = -0x1.a3f700p-11f;
inline constexpr float kErfP6 = 0x1.496a32p-14f;
inline constexpr float kErfC = 0x1.3ae148p+1f;  // centre of [1, 3.92]
inline constexpr float kErfK = 0x1.5eaf58p-1f;  // 2 / (3.92 - 1)
inline constexpr float kErfQ[11] = {0x1.b5e798p-3f,  -0x1.c8c654p-4f,  0x1.c4aaccp-5f,
                                    -0x1.ac729ap-6f, 0x1.87269ep-7f,   -0x1.59470cp-8f,
                                    0x1.fbd128p-10f, -0x1.30cb68p-10f, 0x1.2024a0p-11f,
                                    0x1.564302p-12f, 0x1.448d74p-12f};

// sin, cos: x = n·π/2 + r, n = round(x·2/π) (the kShift trick: |n| < 2^22), |r| <= π/4 + 2^-20.
// π/2 = kPio2_1 + kPio2_2 + kPio2_3 + kPio2_4 (four floats, 103 bits). n·kPio2_1 is subtracted by
// one exact fma (x and n·kPio2_1 are multiples of 2^-24 and the difference is below 1), n·kPio2_2
// as an exact product (hi, lo by fma) with an error-free sum, the last two terms into the low
// part: r = rh + rl, rl below an ulp of rh. So r is good to fp32 rounding even where x is within
// 2^-30 of a multiple of π/2, for |x| <= kTrigMax = 2^20 (rotary embeddings: position ×
// frequency, about 1e5 at 8192 positions; every float of the domain is measured); beyond it, and
// for ±inf, both are NaN. On r: sin r = r + r³·S(z), cos r = 1 - z/2 + z²·C(z), z = r², S and C
// of degree 3 (Lawson fits on |r| <= 0.786, relative error 5e-12 and absolute 1e-13 with the
// float coefficients' rounding below 0.02 ulp); rl enters to first order (rl·cos r, -rl·sin r),
// 1 - z/2 is split so its rounding and z's are carried. The quadrant n mod 4 swaps and negates.
inline constexpr float kTrigMax = 0x1p20f;
inline constexpr float kTwoOverPi = 0x1.45f306p-1f;
inline constexpr float kPio2_1 = 0x1.921fb6p+0f;
inline constexpr float kPio2_2 = -0x1.777a5cp-25f;
inline constexpr float kPio2_3 = -0x1.ee59dap-50f;
inline constexpr float kPio2_4 = 0x1.98a2e0p-77f;
inline constexpr float kSinS0 = -0x1.555556p-3f;
inline constexpr float kSinS1 = 0x1.111108p-7f;
inline constexpr float kSinS2 = -0x1.a00f98p-13f;
inline constexpr float kSinS3 = 0x1.6cd6d8p-19f;
inline constexpr float kCosC0 = 0x1.555556p-5f;
inline constexpr float kCosC1 = -0x1.6c16b8p-10f;
inline constexpr float kCosC2 = 0x1.a0111ap-16f;
inline constexpr float kCosC3 = -0x1.2429b8p-22f;

// --- algorithms ---------------------------------------------------------------------------------

template <class S>
inline typename S::F exp_t(typename S::F x) {
    using F = typename S::F;
    using I = typename S::I;
    const F xc = S::min(S::max(x, S::set(kExpLo)), S::set(kExpHi));
    const F kn = S::fma(xc, S::set(kLog2e), S::set(kShift));
    const F n = S::sub(kn, S::set(kShift));
    // Cody–Waite: the first fma is exact (|r| < 1/2 and both terms are multiples of ulp(r)).
    F r = S::fma(n, S::set(-kLn2Hi), xc);
    r = S::fma(n, S::set(-kLn2Lo), r);
    F q = S::set(kExpQ5);
    q = S::fma(q, r, S::set(kExpQ4));
    q = S::fma(q, r, S::set(kExpQ3));
    q = S::fma(q, r, S::set(kExpQ2));
    q = S::fma(q, r, S::set(kExpQ1));
    q = S::fma(q, r, S::set(kExpQ0));
    // 1 + (r + r²·Q): the small part is formed first so the final add rounds once.
    const F p = S::add(S::set(1.0f), S::fma(S::mul(r, r), q, r));
    // 2^n as two normal factors so n in [-150, 128] needs no special case: p·2^n1 is exact and the
    // second product rounds once, also into the subnormal range and to ±inf.
    const I ni = S::isub(S::ibits(kn), S::ibits(S::set(kShift)));
    const I n1 = S::template sra<1>(ni);
    const I n2 = S::isub(ni, n1);
    const F s1 = S::fbits(S::template sll<23>(S::iadd(n1, S::iset(127))));
    const F s2 = S::fbits(S::template sll<23>(S::iadd(n2, S::iset(127))));
    const F y = S::mul(S::mul(p, s1), s2);
    return S::select(S::isnan(x), S::add(x, x), y);
}

template <class S>
inline typename S::F log_t(typename S::F x) {
    using F = typename S::F;
    using I = typename S::I;
    // Subnormals (and the zero/negative lanes, fixed below) are scaled into the normal range.
    const auto sub = S::lt(x, S::set(0x1p-126f));
    const F xs = S::select(sub, S::mul(x, S::set(0x1p23f)), x);
    const F eadj = S::select(sub, S::set(-23.0f), S::set(0.0f));
    const I ix = S::isub(S::ibits(xs), S::iset(kSqrtHalfBits));
    const I e = S::template sra<23>(ix);
    const F m = S::fbits(S::iadd(S::iand(ix, S::iset(0x007fffff)), S::iset(kSqrtHalfBits)));
    const F f = S::sub(m, S::set(1.0f));  // exact: m in [0.70, 1.42)
    const F s = S::div(f, S::add(S::set(2.0f), f));
    const F z = S::mul(s, s);
    F rz = S::fma(S::set(kLogR4), z, S::set(kLogR3));
    rz = S::fma(rz, z, S::set(kLogR2));
    rz = S::fma(rz, z, S::set(kLogR1));
    rz = S::mul(rz, z);
    // log(1+f) = f - s·(f - R): f is exact, the correction (about f²/2) carries the rounding.
    const F l1p = S::fma(S::sub(S::set(0.0f), s), S::sub(f, rz), f);
    const F ef = S::add(S::cvt(e), eadj);
    F y = S::fma(ef, S::set(kLn2Hi), S::fma(ef, S::set(kLn2Lo), l1p));
    const F inf = S::set(INFINITY);
    y = S::select(S::eq(x, S::set(0.0f)), S::sub(S::set(0.0f), inf), y);
    y = S::select(S::lt(x, S::set(0.0f)), S::set(NAN), y);
    y = S::select(S::eq(x, inf), inf, y);
    return S::select(S::isnan(x), S::add(x, x), y);
}

template <class S>
inline typename S::F tanh_t(typename S::F x) {
    using F = typename S::F;
    const F sign = S::fbits(S::iand(S::ibits(x), S::iset(INT32_MIN)));
    const F a = S::fbits(S::iand(S::ibits(x), S::iset(0x7fffffff)));
    // Near 0: odd polynomial, on |x| (tanh is odd; the sign is OR-ed in at the end, so -0 stays
    // -0).
    const F z = S::mul(a, a);
    F p = S::set(kTanhP6);
    p = S::fma(p, z, S::set(kTanhP5));
    p = S::fma(p, z, S::set(kTanhP4));
    p = S::fma(p, z, S::set(kTanhP3));
    p = S::fma(p, z, S::set(kTanhP2));
    p = S::fma(p, z, S::set(kTanhP1));
    p = S::fma(p, z, S::set(kTanhP0));
    const F small = S::fma(a, S::mul(z, p), a);
    // Elsewhere: 1 - 2/(e^{2|x|} + 1).
    const F e = exp_t<S>(S::add(a, a));
    F big = S::sub(S::set(1.0f), S::div(S::set(2.0f), S::add(e, S::set(1.0f))));
    big = S::select(S::lt(a, S::set(kTanhSat)), big, S::set(1.0f));
    F y = S::select(S::lt(a, S::set(kTanhSmall)), small, big);
    y = S::fbits(S::ior(S::ibits(y), S::ibits(sign)));
    return S::select(S::isnan(x), S::add(x, x), y);
}

template <class S>
inline typename S::F erf_t(typename S::F x) {
    using F = typename S::F;
    const F sign = S::fbits(S::iand(S::ibits(x), S::iset(INT32_MIN)));
    const F a = S::fbits(S::iand(S::ibits(x), S::iset(0x7fffffff)));
    const F z = S::mul(a, a);
    // Near 0: odd polynomial on |x|.
    F p = S::set(kErfP6);
    p = S::fma(p, z, S::set(kErfP5));
    p = S::fma(p, z, S::set(kErfP4));
    p = S::fma(p, z, S::set(kErfP3));
    p = S::fma(p, z, S::set(kErfP2));
    p = S::fma(p, z, S::set(kErfP1));
    p = S::fma(p, z, S::set(kErfP0));
    const F small = S::fma(a, p, a);
    // Middle: 1 - e^{-x²}·Q(t).
    const F t = S::mul(S::sub(a, S::set(kErfC)), S::set(kErfK));
    F q = S::set(kErfQ[10]);
    for (int i = 9; i >= 0; i--) q = S::fma(q, t, S::set(kErfQ[i]));
    const F zlo = S::fma(a, a, S::sub(S::set(0.0f), z));  // a² - z, exact
    F e = exp_t<S>(S::sub(S::set(0.0f), z));
    e = S::fma(S::sub(S::set(0.0f), e), zlo, e);  // e^{-z-zlo} = e^{-z}·(1 - zlo)
    F mid = S::fma(S::sub(S::set(0.0f), e), q, S::set(1.0f));
    mid = S::select(S::lt(a, S::set(kErfSat)), mid, S::set(1.0f));
    F y = S::select(S::lt(a, S::set(kErfSmall)), small, mid);
    y = S::fbits(S::ior(S::ibits(y), S::ibits(sign)));
    return S::select(S::isnan(x), S::add(x, x), y);
}

// sin x and cos x at once (one reduction); see the constants above.
template <class S>
inline void sincos_t(typename S::F x, typename S::F& sin_x, typename S::F& cos_x) {
    using F = typename S::F;
    using I = typename S::I;
    const F zero = S::set(0.0f), one = S::set(1.0f);
    const F kn = S::fma(x, S::set(kTwoOverPi), S::set(kShift));
    const F n = S::sub(kn, S::set(kShift));
    const I q = S::isub(S::ibits(kn), S::ibits(S::set(kShift)));  // n as an int: its quadrant
    const F r1 = S::fma(n, S::set(-kPio2_1), x);                  // exact
    const F th = S::mul(n, S::set(kPio2_2));
    const F tl = S::fma(n, S::set(kPio2_2), S::sub(zero, th));  // n·kPio2_2 - th, exact
    // s + e = r1 - th exactly (two-sum), then the low terms.
    const F s = S::sub(r1, th);
    const F sb = S::sub(s, r1);
    const F e = S::add(S::sub(r1, S::sub(s, sb)), S::sub(S::sub(zero, th), sb));
    F lo = S::sub(e, tl);
    lo = S::fma(n, S::set(-kPio2_3), lo);
    lo = S::fma(n, S::set(-kPio2_4), lo);
    // rh + rl = s + lo (two-sum: lo may exceed s where r is tiny).
    const F rh = S::add(s, lo);
    const F rb = S::sub(rh, s);
    const F rl = S::add(S::sub(s, S::sub(rh, rb)), S::sub(lo, rb));
    const F z = S::mul(rh, rh);
    F ps = S::set(kSinS3);
    ps = S::fma(ps, z, S::set(kSinS2));
    ps = S::fma(ps, z, S::set(kSinS1));
    ps = S::fma(ps, z, S::set(kSinS0));
    // sin(rh + rl) = rh + (rh·z·S(z) + rl·(1 - z/2)): the small part first, one rounding last.
    const F sin_r = S::add(rh, S::fma(S::mul(rh, z), ps, S::fma(rl, S::mul(S::set(-0.5f), z), rl)));
    F pc = S::set(kCosC3);
    pc = S::fma(pc, z, S::set(kCosC2));
    pc = S::fma(pc, z, S::set(kCosC1));
    pc = S::fma(pc, z, S::set(kCosC0));
    // cos(rh + rl) = w + (((1 - w) - hz) - (zl/2 + rh·rl) + z²·C(z)), w = 1 - hz, hz = z/2 and
    // zl = rh² - z: (1 - w) - hz is w's rounding error (exact: w >= 0.69).
    const F hz = S::mul(S::set(0.5f), z);
    const F w = S::sub(one, hz);
    const F zl = S::fma(rh, rh, S::sub(zero, z));
    const F corr = S::sub(S::sub(S::sub(one, w), hz), S::fma(S::set(0.5f), zl, S::mul(rh, rl)));
    const F cos_r = S::add(w, S::fma(S::mul(z, z), pc, corr));
    // Quadrant q = n mod 4: sin x = sin r, cos r, -sin r, -cos r; cos x = cos r, -sin r, -cos r,
    // sin r. The signs are ±1 built from q's bits (a product by them is exact).
    const auto odd = S::eq(S::cvt(S::iand(q, S::iset(1))), one);
    const F sin_sign = S::fbits(S::ior(S::ibits(one), S::template sll<30>(S::iand(q, S::iset(2)))));
    const F cos_sign = S::fbits(
        S::ior(S::ibits(one), S::template sll<30>(S::iand(S::iadd(q, S::iset(1)), S::iset(2)))));
    F sv = S::mul(S::select(odd, cos_r, sin_r), sin_sign);
    F cv = S::mul(S::select(odd, sin_r, cos_r), cos_sign);
    sv = S::select(S::eq(x, zero), x, sv);  // sin(-0) = -0
    const auto out = S::gt(S::fbits(S::iand(S::ibits(x), S::iset(0x7fffffff))), S::set(kTrigMax));
    sv = S::select(out, S::set(NAN), sv);
    cv = S::select(out, S::set(NAN), cv);
    sin_x = S::select(S::isnan(x), S::add(x, x), sv);
    cos_x = S::select(S::isnan(x), S::add(x, x), cv);
}

#if !defined(PX_MATHFUN_NO_SCALAR)
// One float at a time. std::fma is the correctly rounded fused multiply-add on every target
// (a libm call where the target has no FMA instruction: slower, same bits).
struct ScalarOps {
    using F = float;
    using I = uint32_t;  // unsigned: wrap-around instead of overflow; sra casts to signed
    using M = bool;
    static constexpr int W = 1;
    static F set(float a) { return a; }
    static I iset(int32_t a) { return static_cast<uint32_t>(a); }
    static F add(F a, F b) { return a + b; }
    static F sub(F a, F b) { return a - b; }
    static F mul(F a, F b) { return a * b; }
    static F div(F a, F b) { return a / b; }
    static F sqrt(F a) { return std::sqrt(a); }
    static F fma(F a, F b, F c) { return std::fma(a, b, c); }
    static F min(F a, F b) { return a < b ? a : b; }
    static F max(F a, F b) { return a > b ? a : b; }
    static M lt(F a, F b) { return a < b; }
    static M gt(F a, F b) { return a > b; }
    static M eq(F a, F b) { return a == b; }
    static M isnan(F a) { return a != a; }
    static M mor(M a, M b) { return a || b; }
    static F select(M m, F a, F b) { return m ? a : b; }
    static I ibits(F a) {
        I i;
        std::memcpy(&i, &a, 4);
        return i;
    }
    static F fbits(I i) {
        F a;
        std::memcpy(&a, &i, 4);
        return a;
    }
    static I iadd(I a, I b) { return a + b; }
    static I isub(I a, I b) { return a - b; }
    static I iand(I a, I b) { return a & b; }
    static I ior(I a, I b) { return a | b; }
    template <int k>
    static I sra(I a) {
        return static_cast<uint32_t>(static_cast<int32_t>(a) >> k);
    }
    template <int k>
    static I sll(I a) {
        return a << k;
    }
    static F cvt(I a) { return static_cast<float>(static_cast<int32_t>(a)); }
};

inline float exp(float x) {
    return exp_t<ScalarOps>(x);
}
inline float log(float x) {
    return log_t<ScalarOps>(x);
}
inline float tanh(float x) {
    return tanh_t<ScalarOps>(x);
}
inline float erf(float x) {
    return erf_t<ScalarOps>(x);
}
inline void sincos(float x, float* sin_x, float* cos_x) {
    sincos_t<ScalarOps>(x, *sin_x, *cos_x);
}
inline float sin(float x) {
    float s, c;
    sincos_t<ScalarOps>(x, s, c);
    return s;
}
inline float cos(float x) {
    float s, c;
    sincos_t<ScalarOps>(x, s, c);
    return c;
}
#endif

}  // namespace px::mathfun
