// Bulk elementwise and block-reduction routines, one table per ISA (scalar, AVX2, AVX-512).
//
// Index
//   AdamWCoeffs        per-call constants of the AdamW element update
//   VecMath            the table of routines; vecmath(isa) picks one
//   reduce_sum/_dot    a row's sum in the mode's order (canonical tree in Mode::bitwise)
//   impl:: templates   the loop bodies, written once over a SIMD-ops type (see core/base/mathfun.h)
//
// Every routine computes, per element (or per block), the same sequence of IEEE operations on
// every ISA: the vector body and the tail run the same template (the tail through masked loads
// and stores, so it is the same code on a partial vector), and the scalar table runs it on one
// float at a time. Hence scalar, AVX2 and AVX-512 give identical bits; tests/kernels/test_ops.cpp checks.
// Each ISA lives in its own translation unit and namespace (px::cpu::scalar, ::avx2, ::avx512),
// so nothing compiled with -mavx512f reaches code that runs on an older CPU.
#pragma once
#include "core/base/numerics.h"

#include <vector>

namespace px::cpu {

// param -= lr·( (m/bc1) / (sqrt(v/bc2) + eps) + wd·param ) after the moment updates; the bias
// corrections bc1, bc2 are computed once per call (adamw.cpp).
struct AdamWCoeffs {
    float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay, grad_scale, bc1,
        bc2;
};

struct VecMath {
    Isa isa;
    // out (n) = f(x (n)); out may alias x.
    void (*exp)(float* out, const float* x, i64 n);
    void (*log)(float* out, const float* x, i64 n);
    void (*tanh)(float* out, const float* x, i64 n);
    void (*erf)(float* out, const float* x, i64 n);
    // out (n) = exp(x - shift): the numerator of a softmax.
    void (*exp_sub)(float* out, const float* x, float shift, i64 n);
    // max of x (n >= 1); NaN if any element is NaN. (The sign of a zero maximum is unspecified;
    // callers only subtract it, where ±0 give the same exp.)
    float (*max)(const float* x, i64 n);
    // out (n) = gelu(x); dinp (n) += gelu'(x)·dout
    void (*gelu_forward)(float* out, const float* x, i64 n);
    void (*gelu_backward)(float* dinp, const float* x, const float* dout, i64 n);
    // AdamW on n elements, in place.
    void (*adamw)(float* param, float* m, float* v, const float* grad, i64 n, const AdamWCoeffs& c);
    // acc (w) : for r in [0, rows) in order, acc[i] = fma(coef[r·cs], x[r·ldx + i], acc[i]).
    // The sequential in-block part of a canonical reduction, vectorised across w outputs.
    void (*fma_rows)(float* acc, const float* coef, i64 cs, const float* x, i64 ldx, i64 rows,
                     i64 w);
    // fma_rows on m <= kFmaRowsGroup accumulators sharing x: accumulator q (w) at acc + q·lacc
    // takes its coefficients from coef + q·cq. Each output's chain is fma_rows' (the same bits);
    // the group keeps m·w independent chains in flight where one row of short w is
    // latency-bound (attention's rows: w <= T keys or HS channels).
    void (*fma_rows_group)(float* acc, i64 lacc, int m, const float* coef, i64 cq, i64 cs,
                           const float* x, i64 ldx, i64 rows, i64 w);
    // acc (n) = fma(a, b, acc) elementwise.
    void (*fma_elem)(float* acc, const float* a, const float* b, i64 n);
    // part (num_blocks(n, block)): part[j] = sequential fp32 sum from +0 of block j of x (n),
    // resp. of fma(x, y, ·). The in-block half of canonical_sum / canonical_dot, vectorised
    // across blocks; combine with tree_sum or tree_combine_rows.
    void (*block_sums)(float* part, const float* x, i64 n, int block);
    void (*block_dots)(float* part, const float* x, const float* y, i64 n, int block);
    // Any-order sums for Mode::fast (several vector accumulators).
    float (*fast_sum)(const float* x, i64 n);
    float (*fast_dot)(const float* x, const float* y, i64 n);
    // s (n) = sin x, c (n) = cos x (mathfun::sincos_t) for x (n).
    void (*sincos)(float* s, float* c, const float* x, i64 n);
    // SwiGLU: out (n) = silu(g)·u; dg (n) += silu'(g)·u·dout, du (n) += silu(g)·dout. out may
    // alias g or u.
    void (*swiglu_forward)(float* out, const float* g, const float* u, i64 n);
    void (*swiglu_backward)(float* dg, float* du, const float* g, const float* u, const float* dout,
                            i64 n);
    // One head of rotary embeddings, pairs (i, i + h): out (2h) = x (2h) rotated by the angles
    // whose cos, sin (h) are given; out may alias x. Backward: dinp (2h) += the inverse rotation
    // of dout (2h).
    void (*rope_forward)(float* out, const float* x, const float* cos, const float* sin, i64 h);
    void (*rope_backward)(float* dinp, const float* dout, const float* cos, const float* sin,
                          i64 h);
};

inline constexpr int kFmaRowsGroup = 4;

// The table for isa. Throws px::Error when this CPU cannot run it.
const VecMath& vecmath(Isa isa);

#if !defined(PX_MATHFUN_NO_SCALAR)
// Σ x (n) for kernels: the canonical tree (blocks of nx.block) in Mode::bitwise, any order in
// Mode::fast. part is scratch for the block partials. An empty sum is +0.
inline float reduce_sum(const Numerics& nx, const VecMath& vm, const float* x, i64 n,
                        std::vector<float>& part) {
    if (n <= 0) return 0.0f;
    if (nx.mode == Mode::fast) return vm.fast_sum(x, n);
    const i64 nb = num_blocks(n, nx.block);
    part.resize(nb);
    vm.block_sums(part.data(), x, n, nx.block);
    return tree_sum(part.data(), nb);
}
// Σ x·y (n), fma inside a block; as reduce_sum.
inline float reduce_dot(const Numerics& nx, const VecMath& vm, const float* x, const float* y,
                        i64 n, std::vector<float>& part) {
    if (n <= 0) return 0.0f;
    if (nx.mode == Mode::fast) return vm.fast_dot(x, y, n);
    const i64 nb = num_blocks(n, nx.block);
    part.resize(nb);
    vm.block_dots(part.data(), x, y, n, nx.block);
    return tree_sum(part.data(), nb);
}
#endif

namespace scalar {
extern const VecMath table;
}
namespace avx2 {
extern const VecMath table;
}
namespace avx512 {
extern const VecMath table;
}

}  // namespace px::cpu

#if defined(PX_VECMATH_IMPL)
#include "core/base/mathfun.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

// The loop bodies. Included only by the vecmath_*.cpp files, each with its own ops type S, which
// adds to the arithmetic of core/base/mathfun.h:
//   load(p) store(p, v)                  full vector
//   load_n(p, k) store_n(p, v, k)        first k lanes (k <= W), other lanes read as 0
//   iload(const int32_t*)                int vector
//   igt(I, I) -> M                       int compare
//   gather(base, I idx), mask_gather(base, I idx, M)   base[idx] (masked lanes: 0, not read)
//   transpose(F r[W])                    r[j] lane l ← r[l] lane j (a W×W transpose in registers)
namespace px::cpu::impl {

inline constexpr float kGeluS = 0x1.988454p-1f;   // float(sqrt(2/pi))
inline constexpr float kGeluA = 0x1.6e4e26p-5f;   // float(0.044715)
inline constexpr float kGeluA3 = 0x1.12ba9ep-3f;  // float(3·0.044715)

// Calls fn(i, k) over [0, n) in steps of W; the last call may have k < W.
template <class S, class Fn>
inline void for_each_vec(i64 n, Fn fn) {
    i64 i = 0;
    for (; i + S::W <= n; i += S::W) fn(i, i64(S::W));
    if (i < n) fn(i, n - i);
}

template <class S>
inline typename S::F ld(const float* p, i64 k) {
    return k == S::W ? S::load(p) : S::load_n(p, k);
}
template <class S>
inline void st(float* p, typename S::F v, i64 k) {
    if (k == S::W)
        S::store(p, v);
    else
        S::store_n(p, v, k);
}

template <class S>
void exp_n(float* out, const float* x, i64 n) {
    for_each_vec<S>(n,
                    [&](i64 i, i64 k) { st<S>(out + i, mathfun::exp_t<S>(ld<S>(x + i, k)), k); });
}
template <class S>
void log_n(float* out, const float* x, i64 n) {
    for_each_vec<S>(n,
                    [&](i64 i, i64 k) { st<S>(out + i, mathfun::log_t<S>(ld<S>(x + i, k)), k); });
}
template <class S>
void tanh_n(float* out, const float* x, i64 n) {
    for_each_vec<S>(n,
                    [&](i64 i, i64 k) { st<S>(out + i, mathfun::tanh_t<S>(ld<S>(x + i, k)), k); });
}
template <class S>
void erf_n(float* out, const float* x, i64 n) {
    for_each_vec<S>(n,
                    [&](i64 i, i64 k) { st<S>(out + i, mathfun::erf_t<S>(ld<S>(x + i, k)), k); });
}
template <class S>
void exp_sub_n(float* out, const float* x, float shift, i64 n) {
    const auto sh = S::set(shift);
    for_each_vec<S>(n, [&](i64 i, i64 k) {
        st<S>(out + i, mathfun::exp_t<S>(S::sub(ld<S>(x + i, k), sh)), k);
    });
}

// Lane rule: take v when v > m or v is NaN, so a NaN lane stays NaN.
template <class S>
inline typename S::F max_nan(typename S::F m, typename S::F v) {
    return S::select(S::mor(S::gt(v, m), S::isnan(v)), v, m);
}

template <class S>
float max_n(const float* x, i64 n) {
    auto m = S::set(-INFINITY);
    for_each_vec<S>(n, [&](i64 i, i64 k) {
        auto v = ld<S>(x + i, k);
        if (k < S::W) {  // lanes past n must not win: fill them with -inf
            alignas(64) int32_t lane[64];
            for (int l = 0; l < S::W; l++) lane[l] = l;
            v = S::select(S::igt(S::iset(int32_t(k)), S::iload(lane)), v, S::set(-INFINITY));
        }
        m = max_nan<S>(m, v);
    });
    alignas(64) float lanes[64];
    S::store(lanes, m);
    float r = lanes[0];
    for (int l = 1; l < S::W; l++)
        if (lanes[l] > r || lanes[l] != lanes[l]) r = lanes[l];
    return r != r ? NAN : r;  // one NaN for every path, whatever the payloads were
}

// gelu(x) = 0.5·x·(1 + tanh(u)), u = s·(x + a·x³).
template <class S>
inline typename S::F gelu_u(typename S::F x) {
    const auto cube = S::mul(S::mul(S::mul(S::set(kGeluA), x), x), x);
    return S::mul(S::set(kGeluS), S::add(x, cube));
}

template <class S>
void gelu_forward_n(float* out, const float* x, i64 n) {
    for_each_vec<S>(n, [&](i64 i, i64 k) {
        const auto xv = ld<S>(x + i, k);
        const auto t = mathfun::tanh_t<S>(gelu_u<S>(xv));
        st<S>(out + i, S::mul(S::mul(S::set(0.5f), xv), S::add(S::set(1.0f), t)), k);
    });
}

// gelu'(x) = 0.5·(1 + t) + 0.5·x·(1 - t²)·s·(1 + 3a·x²), t = tanh(u). 1 - t² is one fma, so it is
// rounded once (cosh, as in llm.c, would overflow for large u).
template <class S>
void gelu_backward_n(float* dinp, const float* x, const float* dout, i64 n) {
    for_each_vec<S>(n, [&](i64 i, i64 k) {
        const auto xv = ld<S>(x + i, k);
        const auto t = mathfun::tanh_t<S>(gelu_u<S>(xv));
        const auto sech2 = S::fma(S::sub(S::set(0.0f), t), t, S::set(1.0f));
        const auto du =
            S::mul(S::set(kGeluS), S::add(S::set(1.0f), S::mul(S::mul(S::set(kGeluA3), xv), xv)));
        const auto half_x = S::mul(S::set(0.5f), xv);
        const auto local = S::add(S::mul(S::set(0.5f), S::add(S::set(1.0f), t)),
                                  S::mul(S::mul(half_x, sech2), du));
        const auto d = ld<S>(dinp + i, k);
        st<S>(dinp + i, S::add(d, S::mul(local, ld<S>(dout + i, k))), k);
    });
}

template <class S>
void adamw_n(float* param, float* m, float* v, const float* grad, i64 n, const AdamWCoeffs& c) {
    for_each_vec<S>(n, [&](i64 i, i64 k) {
        const auto g = S::mul(ld<S>(grad + i, k), S::set(c.grad_scale));
        const auto mv =
            S::add(S::mul(S::set(c.beta1), ld<S>(m + i, k)), S::mul(S::set(c.one_minus_beta1), g));
        const auto vv = S::add(S::mul(S::set(c.beta2), ld<S>(v + i, k)),
                               S::mul(S::set(c.one_minus_beta2), S::mul(g, g)));
        const auto mhat = S::div(mv, S::set(c.bc1));
        const auto vhat = S::div(vv, S::set(c.bc2));
        const auto p = ld<S>(param + i, k);
        const auto upd = S::add(S::div(mhat, S::add(S::sqrt(vhat), S::set(c.eps))),
                                S::mul(S::set(c.weight_decay), p));
        st<S>(m + i, mv, k);
        st<S>(v + i, vv, k);
        st<S>(param + i, S::sub(p, S::mul(S::set(c.lr), upd)), k);
    });
}

// Four vectors of outputs stay in registers while the rows stream past.
template <class S>
void fma_rows_n(float* acc, const float* coef, i64 cs, const float* x, i64 ldx, i64 rows, i64 w) {
    constexpr i64 W = S::W;
    i64 i = 0;
    for (; i + 4 * W <= w; i += 4 * W) {
        auto a0 = S::load(acc + i), a1 = S::load(acc + i + W);
        auto a2 = S::load(acc + i + 2 * W), a3 = S::load(acc + i + 3 * W);
        for (i64 r = 0; r < rows; r++) {
            const auto c = S::set(coef[r * cs]);
            const float* xr = x + r * ldx + i;
            a0 = S::fma(c, S::load(xr), a0);
            a1 = S::fma(c, S::load(xr + W), a1);
            a2 = S::fma(c, S::load(xr + 2 * W), a2);
            a3 = S::fma(c, S::load(xr + 3 * W), a3);
        }
        S::store(acc + i, a0);
        S::store(acc + i + W, a1);
        S::store(acc + i + 2 * W, a2);
        S::store(acc + i + 3 * W, a3);
    }
    for (; i < w; i += W) {
        const i64 k = std::min(W, w - i);
        auto a = ld<S>(acc + i, k);
        for (i64 r = 0; r < rows; r++)
            a = S::fma(S::set(coef[r * cs]), ld<S>(x + r * ldx + i, k), a);
        st<S>(acc + i, a, k);
    }
}

// fma_rows_n's chains for M accumulators at once, two vectors of outputs at a time (2·M
// accumulators: within AVX2's 16 registers for M = 4).
template <class S, int M>
void fma_rows_m(float* acc, i64 lacc, const float* coef, i64 cq, i64 cs, const float* x, i64 ldx,
                i64 rows, i64 w) {
    constexpr i64 W = S::W;
    i64 i = 0;
    for (; i + 2 * W <= w; i += 2 * W) {
        typename S::F a0[M], a1[M];
        for (int q = 0; q < M; q++) {
            a0[q] = S::load(acc + q * lacc + i);
            a1[q] = S::load(acc + q * lacc + i + W);
        }
        for (i64 r = 0; r < rows; r++) {
            const float* xr = x + r * ldx + i;
            const auto x0 = S::load(xr), x1 = S::load(xr + W);
            for (int q = 0; q < M; q++) {
                const auto c = S::set(coef[q * cq + r * cs]);
                a0[q] = S::fma(c, x0, a0[q]);
                a1[q] = S::fma(c, x1, a1[q]);
            }
        }
        for (int q = 0; q < M; q++) {
            S::store(acc + q * lacc + i, a0[q]);
            S::store(acc + q * lacc + i + W, a1[q]);
        }
    }
    for (; i < w; i += W) {
        const i64 k = std::min(W, w - i);
        typename S::F a[M];
        for (int q = 0; q < M; q++) a[q] = ld<S>(acc + q * lacc + i, k);
        for (i64 r = 0; r < rows; r++) {
            const auto xv = ld<S>(x + r * ldx + i, k);
            for (int q = 0; q < M; q++) a[q] = S::fma(S::set(coef[q * cq + r * cs]), xv, a[q]);
        }
        for (int q = 0; q < M; q++) st<S>(acc + q * lacc + i, a[q], k);
    }
}

template <class S>
void fma_rows_group_n(float* acc, i64 lacc, int m, const float* coef, i64 cq, i64 cs,
                      const float* x, i64 ldx, i64 rows, i64 w) {
    static_assert(kFmaRowsGroup == 4);
    switch (m) {
        case 1: return fma_rows_m<S, 1>(acc, lacc, coef, cq, cs, x, ldx, rows, w);
        case 2: return fma_rows_m<S, 2>(acc, lacc, coef, cq, cs, x, ldx, rows, w);
        case 3: return fma_rows_m<S, 3>(acc, lacc, coef, cq, cs, x, ldx, rows, w);
        case 4: return fma_rows_m<S, 4>(acc, lacc, coef, cq, cs, x, ldx, rows, w);
        default: return;
    }
}

template <class S>
void fma_elem_n(float* acc, const float* a, const float* b, i64 n) {
    for_each_vec<S>(n, [&](i64 i, i64 k) {
        st<S>(acc + i, S::fma(ld<S>(a + i, k), ld<S>(b + i, k), ld<S>(acc + i, k)), k);
    });
}

// Lane l of a group handles block g+l: its element i is base[l·block + i]. A full group reads W
// consecutive elements of each of its W blocks and transposes them in registers (gathers are slow
// on CPUs with the gather-data-sampling mitigation); what a block's length leaves over, and a
// partial group, is gathered. Lanes whose block is shorter (the last block) or absent are masked
// and keep their sum. Either way a lane's chain is its block's elements in index order.
template <class S, bool Dot>
void block_reduce_n(float* part, const float* x, const float* y, i64 n, int block) {
    constexpr int W = S::W;
    const i64 nb = num_blocks(n, block);
    // Block b alone: the chain a lane computes (from +0, in index order, add or fma), so the
    // same bits.
    const auto chain = [&](i64 b) {
        float acc = 0.0f;
        for (i64 i = b * block, end = std::min(n, (b + 1) * block); i < end; i++)
            acc = Dot ? std::fma(x[i], y[i], acc) : acc + x[i];
        part[b] = acc;
    };
    if (i64(W) * block > INT32_MAX) {  // the gathers' offsets are 32-bit: one block at a time
        for (i64 b = 0; b < nb; b++) chain(b);
        return;
    }
    // A last group of this few blocks runs them one at a time: its gathers would cost more than
    // the chains' latency (a row of attention scores is one or two blocks).
    constexpr i64 kChainBlocks = 4;
    alignas(64) int32_t off[64], len[64];
    for (int l = 0; l < W; l++) off[l] = l * block;
    const auto offv = S::iload(off);
    for (i64 g = 0; g < nb; g += W) {
        const float* xb = x + g * block;
        const float* yb = Dot ? y + g * block : nullptr;
        const i64 rem = n - g * block;  // elements from this group's first block on
        bool full = rem >= i64(W) * block;
        if (!full && nb - g <= kChainBlocks) {
            for (i64 b = g; b < nb; b++) chain(b);
            break;
        }
        int maxlen = 0;
        for (int l = 0; l < W; l++) {
            len[l] = int(std::clamp<i64>(rem - i64(l) * block, 0, block));
            maxlen = std::max(maxlen, len[l]);
        }
        auto acc = S::set(0.0f);
        if (full) {
            int i = 0;
            for (; i + W <= block; i += W) {
                typename S::F xr[W];
                for (int l = 0; l < W; l++) xr[l] = S::load(xb + i64(l) * block + i);
                S::transpose(xr);
                if constexpr (Dot) {
                    if (yb == xb) {  // a sum of squares
                        for (int j = 0; j < W; j++) acc = S::fma(xr[j], xr[j], acc);
                    } else {
                        typename S::F yr[W];
                        for (int l = 0; l < W; l++) yr[l] = S::load(yb + i64(l) * block + i);
                        S::transpose(yr);
                        for (int j = 0; j < W; j++) acc = S::fma(xr[j], yr[j], acc);
                    }
                } else {
                    for (int j = 0; j < W; j++) acc = S::add(acc, xr[j]);
                }
            }
            for (; i < block; i++) {
                const auto idx = S::iadd(offv, S::iset(i));
                if constexpr (Dot)
                    acc = S::fma(S::gather(xb, idx), S::gather(yb, idx), acc);
                else
                    acc = S::add(acc, S::gather(xb, idx));
            }
        } else {
            const auto lenv = S::iload(len);
            for (int i = 0; i < maxlen; i++) {
                const auto act = S::igt(lenv, S::iset(i));
                const auto idx = S::iadd(offv, S::iset(i));
                if constexpr (Dot)
                    acc = S::select(
                        act,
                        S::fma(S::mask_gather(xb, idx, act), S::mask_gather(yb, idx, act), acc),
                        acc);
                else
                    acc = S::select(act, S::add(acc, S::mask_gather(xb, idx, act)), acc);
            }
        }
        st<S>(part + g, acc, std::min<i64>(W, nb - g));
    }
}

template <class S>
void block_sums_n(float* part, const float* x, i64 n, int block) {
    block_reduce_n<S, false>(part, x, nullptr, n, block);
}
template <class S>
void block_dots_n(float* part, const float* x, const float* y, i64 n, int block) {
    block_reduce_n<S, true>(part, x, y, n, block);
}

// Inlined into its callers: called out of line, it takes its vector in a ymm/zmm register, so the
// caller tail-calls it without vzeroupper and returns to the kernels' SSE code (built for plain
// x86-64) with the upper halves dirty, which slows every SSE instruction after it until the next
// vzeroupper (4x on a row of RMSNorm's backward on an AMD EPYC under KVM). Inlined, the caller
// returns a float and the compiler puts vzeroupper before its ret.
template <class S>
[[gnu::always_inline]] inline float hsum(typename S::F v) {
    alignas(64) float lanes[64];
    S::store(lanes, v);
    float r = 0.0f;
    for (int l = 0; l < S::W; l++) r += lanes[l];
    return r;
}

template <class S>
float fast_sum_n(const float* x, i64 n) {
    constexpr i64 W = S::W;
    auto a0 = S::set(0.0f), a1 = a0, a2 = a0, a3 = a0;
    i64 i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        a0 = S::add(a0, S::load(x + i));
        a1 = S::add(a1, S::load(x + i + W));
        a2 = S::add(a2, S::load(x + i + 2 * W));
        a3 = S::add(a3, S::load(x + i + 3 * W));
    }
    for (; i < n; i += W) a0 = S::add(a0, ld<S>(x + i, std::min(W, n - i)));
    return hsum<S>(S::add(S::add(a0, a1), S::add(a2, a3)));
}

template <class S>
float fast_dot_n(const float* x, const float* y, i64 n) {
    constexpr i64 W = S::W;
    auto a0 = S::set(0.0f), a1 = a0, a2 = a0, a3 = a0;
    i64 i = 0;
    for (; i + 4 * W <= n; i += 4 * W) {
        a0 = S::fma(S::load(x + i), S::load(y + i), a0);
        a1 = S::fma(S::load(x + i + W), S::load(y + i + W), a1);
        a2 = S::fma(S::load(x + i + 2 * W), S::load(y + i + 2 * W), a2);
        a3 = S::fma(S::load(x + i + 3 * W), S::load(y + i + 3 * W), a3);
    }
    for (; i < n; i += W) {
        const i64 k = std::min(W, n - i);
        a0 = S::fma(ld<S>(x + i, k), ld<S>(y + i, k), a0);
    }
    return hsum<S>(S::add(S::add(a0, a1), S::add(a2, a3)));
}

template <class S>
void sincos_n(float* s, float* c, const float* x, i64 n) {
    for_each_vec<S>(n, [&](i64 i, i64 k) {
        typename S::F sv, cv;
        mathfun::sincos_t<S>(ld<S>(x + i, k), sv, cv);
        st<S>(s + i, sv, k);
        st<S>(c + i, cv, k);
    });
}

// sigmoid(g) and 1 - sigmoid(g) from t = exp(-|g|) in (0, 1] (no overflow, and 1 - sigmoid
// without cancellation for either sign): 1/(1 + t) and t/(1 + t), the larger one for g >= 0's
// sigmoid.
template <class S>
inline void sigmoid_pair(typename S::F g, typename S::F& sig, typename S::F& one_minus) {
    const auto a = S::fbits(S::iand(S::ibits(g), S::iset(0x7fffffff)));
    const auto t = mathfun::exp_t<S>(S::sub(S::set(0.0f), a));
    const auto d = S::add(S::set(1.0f), t);
    const auto big = S::div(S::set(1.0f), d), small = S::div(t, d);
    const auto neg = S::lt(g, S::set(0.0f));
    sig = S::select(neg, small, big);
    one_minus = S::select(neg, big, small);
}

// silu(g) = g·sigmoid(g); silu'(g) = sigmoid(g)·(1 + g·(1 - sigmoid(g))).
template <class S>
void swiglu_forward_n(float* out, const float* g, const float* u, i64 n) {
    for_each_vec<S>(n, [&](i64 i, i64 k) {
        const auto gv = ld<S>(g + i, k);
        typename S::F sig, om;
        sigmoid_pair<S>(gv, sig, om);
        st<S>(out + i, S::mul(S::mul(gv, sig), ld<S>(u + i, k)), k);
    });
}

template <class S>
void swiglu_backward_n(float* dg, float* du, const float* g, const float* u, const float* dout,
                       i64 n) {
    for_each_vec<S>(n, [&](i64 i, i64 k) {
        const auto gv = ld<S>(g + i, k), uv = ld<S>(u + i, k), dv = ld<S>(dout + i, k);
        typename S::F sig, om;
        sigmoid_pair<S>(gv, sig, om);
        const auto dsilu = S::mul(sig, S::fma(gv, om, S::set(1.0f)));
        st<S>(dg + i, S::add(ld<S>(dg + i, k), S::mul(S::mul(dv, uv), dsilu)), k);
        st<S>(du + i, S::add(ld<S>(du + i, k), S::mul(dv, S::mul(gv, sig))), k);
    });
}

// Hugging Face's fp32 sequence, x·cos + rotate_half(x)·sin: two products, then one add.
template <class S>
void rope_forward_n(float* out, const float* x, const float* cos, const float* sin, i64 h) {
    for_each_vec<S>(h, [&](i64 i, i64 k) {
        const auto x1 = ld<S>(x + i, k), x2 = ld<S>(x + h + i, k);
        const auto c = ld<S>(cos + i, k), s = ld<S>(sin + i, k);
        st<S>(out + i, S::sub(S::mul(x1, c), S::mul(x2, s)), k);
        st<S>(out + h + i, S::add(S::mul(x2, c), S::mul(x1, s)), k);
    });
}

template <class S>
void rope_backward_n(float* dinp, const float* dout, const float* cos, const float* sin, i64 h) {
    for_each_vec<S>(h, [&](i64 i, i64 k) {
        const auto d1 = ld<S>(dout + i, k), d2 = ld<S>(dout + h + i, k);
        const auto c = ld<S>(cos + i, k), s = ld<S>(sin + i, k);
        st<S>(dinp + i, S::add(ld<S>(dinp + i, k), S::add(S::mul(d1, c), S::mul(d2, s))), k);
        st<S>(dinp + h + i, S::add(ld<S>(dinp + h + i, k), S::sub(S::mul(d2, c), S::mul(d1, s))),
              k);
    });
}

template <class S>
constexpr VecMath make_table(Isa isa) {
    return VecMath{
        isa,           exp_n<S>,      log_n<S>,          tanh_n<S>,          erf_n<S>,
        exp_sub_n<S>,  max_n<S>,      gelu_forward_n<S>, gelu_backward_n<S>, adamw_n<S>,
        fma_rows_n<S>, fma_rows_group_n<S>, fma_elem_n<S>, block_sums_n<S>, block_dots_n<S>,
        fast_sum_n<S>, fast_dot_n<S>, sincos_n<S>, swiglu_forward_n<S>, swiglu_backward_n<S>,
        rope_forward_n<S>, rope_backward_n<S>};
}

}  // namespace px::cpu::impl
#endif
