// Rotary position embeddings (RoPE), Hugging Face's LlamaForCausalLM convention ("rotate_half"):
// a head's HS channels are h = HS/2 pairs (i, i + h), and pair i of the token at position p turns
// by the angle p·inv_freq[i]:
//   out[i]     = x[i]·cos - x[i + h]·sin
//   out[i + h] = x[i + h]·cos + x[i]·sin
// (x·cos + rotate_half(x)·sin: two products and one add, as the fp32 reference computes it; not
// the interleaved pairs (2i, 2i + 1) of Meta's original code). The backward turns the gradient
// back: dx[i] += d[i]·cos + d[i + h]·sin, dx[i + h] += d[i + h]·cos - d[i]·sin.
//
// The angles come from a table computed once (rope_table): inv_freq[i] = theta^(-2i/HS), scaled as
// Llama 3.1 does (rope_inv_freq), in fp64 from IEEE operations and rounded once; the angle is the
// fp32 product float(p)·inv_freq[i] (as Hugging Face forms it) and its cos and sin are
// mathfun::sincos_t's, so the table has the same bits on every ISA and thread count.
//
// Elementwise: no reduction, the same bits on every path and in both modes (Mode::fast runs the
// same kernel: nothing faster is natural). Threads take whole token rows.
#include "core/base/error.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vecmath.h"

#include <cmath>
#include <string>
#include <vector>

namespace px::cpu {

namespace {

// ln 2 in two parts (fdlibm's): e·kLn2Hi is exact for |e| < 2^11.
constexpr double kLn2Hi = 0x1.62e42feep-1;
constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
constexpr double kTwoPi = 0x1.921fb54442d18p+2;

// ln x for a finite x > 0, in fp64 from IEEE operations only (no libm: every machine, the same
// bits): x = 2^e·m with m in [√½, √2), ln m = 2·atanh(s), s = (m - 1)/(m + 1), |s| <= 0.172, whose
// series to s^49 is exact to far below an fp64 ulp.
double log_f64(double x) {
    int e = 0;
    double m = std::frexp(x, &e);  // exact: m in [0.5, 1)
    if (m < 0x1.6a09e667f3bcdp-1) {
        m = m * 2.0;
        e = e - 1;
    }
    const double s = (m - 1.0) / (m + 1.0), z = s * s;
    double p = 1.0 / 49.0;
    for (int k = 23; k >= 0; k--) p = p * z + 1.0 / double(2 * k + 1);
    return double(e) * kLn2Hi + (double(e) * kLn2Lo + 2.0 * s * p);
}

// e^y for |y| < 700, in fp64 from IEEE operations only: y = n·ln2 + r, |r| <= 0.35, e^r by its
// Taylor series to r^24 (truncation below 2^-90), scaled by 2^n exactly.
double exp_f64(double y) {
    const double n = std::nearbyint(y / 0x1.62e42fefa39efp-1);  // round to nearest: exact
    const double r = (y - n * kLn2Hi) - n * kLn2Lo;
    double p = 1.0;
    for (int k = 24; k >= 1; k--) p = 1.0 + p * r / double(k);
    return std::ldexp(p, int(n));
}

}  // namespace

// inv_freq (HS/2)
void rope_inv_freq(float* inv_freq, i64 HS, double theta, double factor, double low_freq_factor,
                   double high_freq_factor, double original_max_position_embeddings) {
    const double ln_theta = log_f64(theta);
    const double low_wavelen = original_max_position_embeddings / low_freq_factor;
    const double high_wavelen = original_max_position_embeddings / high_freq_factor;
    for (i64 j = 0; j < HS / 2; j++) {
        double f = exp_f64(-(double(2 * j) / double(HS)) * ln_theta);
        if (factor > 0) {  // Llama 3.1: long wavelengths slowed by factor, short ones kept
            const double wavelen = kTwoPi / f;
            if (wavelen > low_wavelen) {
                f = f / factor;
            } else if (!(wavelen < high_wavelen)) {  // in between: interpolated
                const double smooth =
                    (original_max_position_embeddings / wavelen - low_freq_factor) /
                    (high_freq_factor - low_freq_factor);
                f = (1.0 - smooth) * f / factor + smooth * f;
            }
        }
        inv_freq[j] = float(f);
    }
}

// cos, sin (maxT, HS/2); inv_freq (HS/2)
void rope_table(const Numerics& nx, float* cos, float* sin, const float* inv_freq, i64 maxT,
                i64 HS) {
    const VecMath& vm = vecmath(nx.isa);
    const i64 h = HS / 2;
#pragma omp parallel
    {
        std::vector<float> angle(h);
#pragma omp for schedule(dynamic, 16)
        for (i64 p = 0; p < maxT; p++) {
            for (i64 j = 0; j < h; j++) angle[j] = float(p) * inv_freq[j];
            vm.sincos(sin + p * h, cos + p * h, angle.data(), h);
        }
    }
}

namespace {

// Position pos[t] (t when pos is null), checked against the table's maxT rows.
void check_positions(const i64* pos, i64 T, i64 maxT) {
    if (pos == nullptr) {
        if (T > maxT)
            throw Error("rope: " + std::to_string(T) + " positions but a table of " +
                        std::to_string(maxT) + "; make the table for the longest sequence");
        return;
    }
    for (i64 t = 0; t < T; t++)
        if (pos[t] < 0 || pos[t] >= maxT)
            throw Error("rope: position " + std::to_string(pos[t]) + " (row " + std::to_string(t) +
                        ") outside the table's [0, " + std::to_string(maxT) + ")");
}

}  // namespace

// out (B,T,NH,HS) rows ldo apart, inp likewise ldi apart (out may alias inp); cos, sin (maxT,HS/2);
// pos (T) or null
void rope_forward(const Numerics& nx, float* out, i64 ldo, const float* inp, i64 ldi,
                  const float* cos, const float* sin, const i64* pos, i64 B, i64 T, i64 NH, i64 HS,
                  i64 maxT) {
    check_positions(pos, T, maxT);
    const VecMath& vm = vecmath(nx.isa);
    const i64 h = HS / 2;
#pragma omp parallel for schedule(dynamic, 8)
    for (i64 r = 0; r < B * T; r++) {
        const i64 p = pos != nullptr ? pos[r % T] : r % T;
        for (i64 k = 0; k < NH; k++)
            vm.rope_forward(out + r * ldo + k * HS, inp + r * ldi + k * HS, cos + p * h,
                            sin + p * h, h);
    }
}

// dinp (B,T,NH,HS) += the inverse rotation of dout (B,T,NH,HS); rows ldd and ldo apart
void rope_backward(const Numerics& nx, float* dinp, i64 ldd, const float* dout, i64 ldo,
                   const float* cos, const float* sin, const i64* pos, i64 B, i64 T, i64 NH, i64 HS,
                   i64 maxT) {
    check_positions(pos, T, maxT);
    const VecMath& vm = vecmath(nx.isa);
    const i64 h = HS / 2;
#pragma omp parallel for schedule(dynamic, 8)
    for (i64 r = 0; r < B * T; r++) {
        const i64 p = pos != nullptr ? pos[r % T] : r % T;
        for (i64 k = 0; k < NH; k++)
            vm.rope_backward(dinp + r * ldd + k * HS, dout + r * ldo + k * HS, cos + p * h,
                             sin + p * h, h);
    }
}

}  // namespace px::cpu
