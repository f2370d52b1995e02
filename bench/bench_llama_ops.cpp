// bench_llama_ops: the ops a Llama-3 block adds (kernels/ops.h: rmsnorm, rope, swiglu) on a
// Llama-ish layer, in each numerics mode, on every ISA path this CPU has.
//
//   build/bench/bench_llama_ops [--reps N] [--threads N]
//
// Shapes: B=4, T=64 tokens; rmsnorm over C=768; rope on q (B,T,12,64) at a context-parallel
// rank's positions of a 256-token sequence, with Llama 3.1's table (theta 5e5, its scaling, 8192
// positions: built once, timed apart); swiglu on F=2048. Prints the best of N repetitions per
// pass: ns per element of its (BT,C) or (BT,F) tensor, and GB/s of the bytes it must move (each
// tensor read or written once; a gradient that accumulates read and written).
//
// Checks its results: bitwise mode gives the same bits on every ISA path and on 1 thread as on
// the best path with the threads given; rope and swiglu run the bitwise kernels in fast mode
// (the same bits), and fast rmsnorm (its Σx² over C in any order) agrees with bitwise within the
// any-order bound, 2·C·2^-24 of each output's magnitude.
#include "core/base/wait_policy.h"
#include "kernels/ops.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace px;

namespace {

constexpr i64 B = 4, Tn = 64, BT = B * Tn, C = 768, F = 2048, H = 12, HS = 64, h = HS / 2,
              maxT = 8192;

using Vec = std::vector<float>;

Vec random(i64 n, float lo, float hi, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    Vec v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    return v;
}

Tensor T(Vec& v, std::initializer_list<i64> shape) {
    return view_f32(v.data(), shape);
}

ops::RopeScaling llama31() {
    ops::RopeScaling s;
    s.factor = 8;
    s.low_freq_factor = 1;
    s.high_freq_factor = 4;
    s.original_max_position_embeddings = 8192;
    return s;
}

// The inputs and outputs of one layer's three ops.
struct Layer {
    Vec x = random(BT * C, -2, 2, 1), w = random(C, 0.5f, 1.5f, 2), dout = random(BT * C, -1, 1, 3);
    Vec out = Vec(BT * C), rstd = Vec(BT), dinp = Vec(BT * C), dw = Vec(C);
    Vec q = random(BT * C, -1, 1, 4), dq = random(BT * C, -1, 1, 5), qr = Vec(BT * C),
        dqr = Vec(BT * C);
    Vec cos = Vec(maxT * h), sin = Vec(maxT * h);
    Vec g = random(BT * F, -6, 6, 6), u = random(BT * F, -1, 1, 7), dff = random(BT * F, -1, 1, 8);
    Vec act = Vec(BT * F), dg = Vec(BT * F), du = Vec(BT * F);
    std::vector<i64> pos;

    Layer() {
        for (i64 c : {1, 2})  // rank 1 of cp 2 on 256 tokens: chunks 1 and 2 of 4
            for (i64 t = 0; t < Tn / 2; t++) pos.push_back(c * Tn / 2 + t);
    }
    void table(const Numerics& nx) {
        ops::rope_table(nx, T(cos, {maxT, h}), T(sin, {maxT, h}), 500000, llama31());
    }
    void rms_fwd(const Numerics& nx) {
        ops::rmsnorm_forward(nx, T(out, {BT, C}), T(rstd, {BT}), T(x, {BT, C}), T(w, {C}), 1e-5f);
    }
    void rms_bwd(const Numerics& nx) {
        ops::rmsnorm_backward(nx, T(dinp, {BT, C}), T(dw, {C}), T(dout, {BT, C}), T(x, {BT, C}),
                              T(w, {C}), T(rstd, {BT}));
    }
    void rope_fwd(const Numerics& nx) {
        ops::rope_forward(nx, T(qr, {B, Tn, H, HS}), T(q, {B, Tn, H, HS}), T(cos, {maxT, h}),
                          T(sin, {maxT, h}), pos.data());
    }
    void rope_bwd(const Numerics& nx) {
        ops::rope_backward(nx, T(dqr, {B, Tn, H, HS}), T(dq, {B, Tn, H, HS}), T(cos, {maxT, h}),
                           T(sin, {maxT, h}), pos.data());
    }
    void swiglu_fwd(const Numerics& nx) {
        ops::swiglu_forward(nx, T(act, {BT, F}), T(g, {BT, F}), T(u, {BT, F}));
    }
    void swiglu_bwd(const Numerics& nx) {
        ops::swiglu_backward(nx, T(dg, {BT, F}), T(du, {BT, F}), T(g, {BT, F}), T(u, {BT, F}),
                             T(dff, {BT, F}));
    }
    // Every pass once, gradients from zero: the outputs the checks compare.
    void run_all(const Numerics& nx) {
        for (Vec* v : {&dinp, &dw, &dqr, &dg, &du}) std::fill(v->begin(), v->end(), 0.0f);
        table(nx);
        rms_fwd(nx);
        rms_bwd(nx);
        rope_fwd(nx);
        rope_bwd(nx);
        swiglu_fwd(nx);
        swiglu_bwd(nx);
    }
    std::vector<std::pair<const char*, const Vec*>> outputs() const {
        return {
            {"cos", &cos},           {"sin", &sin},    {"rmsnorm out", &out}, {"rstd", &rstd},
            {"rmsnorm dinp", &dinp}, {"dweight", &dw}, {"rope out", &qr},     {"rope dinp", &dqr},
            {"swiglu out", &act},    {"dgate", &dg},   {"dup", &du}};
    }
};

bool same_bits(const Vec& a, const Vec& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double best_ms(int reps, const std::function<void()>& fn) {
    double best = 1e300;
    for (int r = 0; r < reps; r++) {
        const auto t0 = std::chrono::steady_clock::now();
        fn();
        best = std::min(
            best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                      .count());
    }
    return best;
}

}  // namespace

int main(int argc, char** argv) {
    px::openmp_passive_by_default(argv);  // as the trainer runs (core/base/wait_policy.h)
    int reps = 20, threads = 2;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--reps" && i + 1 < argc)
            reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--threads" && i + 1 < argc)
            threads = std::max(1, std::atoi(argv[++i]));
        else {
            std::fprintf(stderr, "usage: bench_llama_ops [--reps N] [--threads N]\n");
            return 2;
        }
    }
    omp_set_num_threads(threads);
    const Isa best = detect_isa();
    std::vector<Isa> isas{Isa::scalar};
    if (best != Isa::scalar) isas.push_back(Isa::avx2);
    if (best == Isa::avx512) isas.push_back(Isa::avx512);
    std::printf(
        "bench_llama_ops: %d threads; B=%lld T=%lld C=%lld F=%lld, rope %lld heads of %lld\n",
        threads, (long long)B, (long long)Tn, (long long)C, (long long)F, (long long)H,
        (long long)HS);
    std::printf("%-8s %-8s %-13s %10s %10s %8s\n", "isa", "mode", "pass", "ms", "ns/elem", "GB/s");
    // Elements of the pass's main tensor, and floats it moves.
    struct Pass {
        const char* name;
        void (Layer::*fn)(const Numerics&);
        double elems, floats;
    };
    const double nc = double(BT * C), nf = double(BT * F);
    const Pass passes[] = {
        {"rmsnorm fwd", &Layer::rms_fwd, nc, 2 * nc},  // x in, out out
        {"rmsnorm bwd", &Layer::rms_bwd, nc, 4 * nc},  // x, dout in, dinp in and out
        {"rope fwd", &Layer::rope_fwd, nc, 2 * nc},
        {"rope bwd", &Layer::rope_bwd, nc, 3 * nc},
        {"swiglu fwd", &Layer::swiglu_fwd, nf, 3 * nf},
        {"swiglu bwd", &Layer::swiglu_bwd, nf, 7 * nf},  // g, u, dout in; dg, du in and out
    };
    Layer layer;
    for (Isa isa : isas)
        for (Mode mode : {Mode::bitwise, Mode::fast}) {
            Numerics nx;
            nx.mode = mode;
            nx.isa = isa;
            layer.run_all(nx);
            const int r = isa == Isa::scalar ? std::max(1, reps / 5) : reps;
            const double tt = best_ms(std::max(1, r / 4), [&] { layer.table(nx); });
            std::printf("%-8s %-8s %-13s %10.3f %10.3f %8s\n", isa_name(isa), mode_name(mode),
                        "rope table", tt, tt * 1e6 / double(maxT * h), "-");
            for (const Pass& p : passes) {
                const double ms = best_ms(r, [&] { (layer.*p.fn)(nx); });
                std::printf("%-8s %-8s %-13s %10.3f %10.3f %8.2f\n", isa_name(isa), mode_name(mode),
                            p.name, ms, ms * 1e6 / p.elems, p.floats * 4 / (ms * 1e6));
            }
        }
    // Checks: bitwise on the best path with `threads` threads is the reference.
    int failures = 0;
    Numerics bitwise;
    bitwise.isa = best;
    Layer ref;
    ref.run_all(bitwise);
    for (Isa isa : isas)
        for (int t : {1, threads}) {
            omp_set_num_threads(t);
            Numerics nx = bitwise;
            nx.isa = isa;
            Layer other;
            other.run_all(nx);
            const auto a = ref.outputs(), b = other.outputs();
            for (size_t k = 0; k < a.size(); k++)
                if (!same_bits(*a[k].second, *b[k].second)) {
                    std::printf("FAIL: bitwise %s on %s, %d thread(s), differs from %s on %d\n",
                                a[k].first, isa_name(isa), t, isa_name(best), threads);
                    failures++;
                }
        }
    omp_set_num_threads(threads);
    Numerics fast = bitwise;
    fast.mode = Mode::fast;
    Layer f;
    f.run_all(fast);
    const auto a = ref.outputs(), b = f.outputs();
    for (size_t k = 0; k < a.size(); k++) {
        const std::string name = a[k].first;
        const bool rms = name.rfind("rmsnorm", 0) == 0 || name == "rstd" || name == "dweight";
        if (!rms) {
            if (!same_bits(*a[k].second, *b[k].second)) {
                std::printf("FAIL: fast %s differs from bitwise (the same kernel)\n", a[k].first);
                failures++;
            }
            continue;
        }
        double diff = 0, scale = 0;
        for (size_t i = 0; i < a[k].second->size(); i++) {
            diff = std::max(diff, double(std::fabs((*a[k].second)[i] - (*b[k].second)[i])));
            scale = std::max(scale, double(std::fabs((*a[k].second)[i])));
        }
        const double bound = 2.0 * double(C) * std::ldexp(1.0, -24) * scale;
        if (!(diff <= bound)) {
            std::printf("FAIL: fast %s differs from bitwise by %g (bound %g)\n", a[k].first, diff,
                        bound);
            failures++;
        }
    }
    std::printf(failures == 0 ? "checks passed: bitwise bit-identical across ISA paths and thread "
                                "counts; fast = bitwise for rope and swiglu, rmsnorm within the "
                                "any-order bound\n"
                              : "checks FAILED\n");
    return failures == 0 ? 0 : 1;
}
