// bench_matmul: the CPU matmuls of GPT-2 124M at B=4, T=64 (BT=256), bitwise against fast
// (oneDNN), beside the machine's fp32 FMA peak measured in the same run; then fast mode's bf16
// matmuls (kernels/cpu/matmul_bf16.h) on both paths beside fp32 sgemm.
//
//   build/bench/bench_matmul [--quick] [--reps N] [--threads N]
//
// For every shape it prints GFLOP/s of the canonical (bitwise) GEMM on the best ISA path (and
// on AVX2 when the best is AVX-512, unless --quick) and of oneDNN, each as a share of peak, and
// their ratio; then each kind of op's share of peak (forward, input and weight gradients). The
// host is noisy (±30% between identical runs), so the programs alternate within each repetition
// and the best of N counts.
//
// It also checks its results (a benchmark that is fast and wrong is worth nothing):
//   * every bitwise run, and the AVX2 run, equals the first bitwise run bit for bit;
//   * bitwise and fast agree within the fp32 rounding bound |Δ| <= 2·γ(K+1)·(Σ|a||b| + |bias|),
//     γ(n) = n·u/(1 - n·u), the worst-case bound for a sum of K products plus the bias in any
//     order (Higham, Accuracy and Stability of Numerical Algorithms, §3.1), once for each side.
//   * bf16: oneDNN's bf16 primitive, sgemm on bf16 values, and the bitwise bf16 reference (the
//     canonical GEMM on them) give the same bits, on operands whose sums are exact in fp32 (small
//     integer activations, weights that round in bf16 onto a 2^-7 grid below 2), so every cast
//     point (weights rounded to bf16 nearest even, each output rounded once) is checked exactly.
// Failures are printed and make the exit status 1.
#include "bench/peak.h"
#include "core/base/dtype.h"
#include "core/base/wait_policy.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/matmul_bf16.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace px;

namespace {

enum class Op { forward, dinp, dweight };

struct Case {
    const char* name;
    Op op;
    i64 C, OC;
    bool bias;  // forward only
};

constexpr i64 BT = 256;

// GPT-2 124M: C = 768, MLP 3072, vocab 50257 (the LM head has no bias).
const Case kCases[] = {
    {"qkv      fwd", Op::forward, 768, 2304, true},
    {"attproj  fwd", Op::forward, 768, 768, true},
    {"fc       fwd", Op::forward, 768, 3072, true},
    {"fcproj   fwd", Op::forward, 3072, 768, true},
    {"lmhead   fwd", Op::forward, 768, 50257, false},
    {"qkv      dinp", Op::dinp, 768, 2304, false},
    {"fc       dinp", Op::dinp, 768, 3072, false},
    {"fcproj   dinp", Op::dinp, 3072, 768, false},
    {"lmhead   dinp", Op::dinp, 768, 50257, false},
    {"qkv      dweight", Op::dweight, 768, 2304, false},
    {"fc       dweight", Op::dweight, 768, 3072, false},
    {"fcproj   dweight", Op::dweight, 3072, 768, false},
    {"lmhead   dweight", Op::dweight, 768, 50257, false},
};

// Deterministic uniform values in [-1, 1) from a 64-bit mix of (seed, index).
void fill_uniform(std::vector<float>& v, std::uint64_t seed) {
    for (size_t i = 0; i < v.size(); i++) {
        std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + i;
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdull;
        x ^= x >> 33;
        x *= 0xc4ceb9fe1a85ec53ull;
        x ^= x >> 33;
        v[i] = static_cast<float>(static_cast<double>(x >> 40) / static_cast<double>(1ull << 23) -
                                  1.0);
    }
}

double seconds_of(const std::function<void()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Problem {
    const Case& cs;
    std::vector<float> inp, weight, bias, dout;
    i64 out_size;

    explicit Problem(const Case& c) : cs(c) {
        inp.resize(static_cast<size_t>(BT * c.C));
        weight.resize(static_cast<size_t>(c.OC * c.C));
        bias.resize(static_cast<size_t>(c.OC));
        dout.resize(static_cast<size_t>(BT * c.OC));
        fill_uniform(inp, 1);
        fill_uniform(weight, 2);
        fill_uniform(bias, 3);
        fill_uniform(dout, 4);
        out_size = c.op == Op::forward ? BT * c.OC : c.op == Op::dinp ? BT * c.C : c.OC * c.C;
    }
    double flops() const { return 2.0 * BT * cs.C * cs.OC; }
    const char* shape() const {
        static char buf[64];
        if (cs.op == Op::forward)
            std::snprintf(buf, sizeof buf, "%lldx%lldx%lld", (long long)BT, (long long)cs.OC,
                          (long long)cs.C);
        else if (cs.op == Op::dinp)
            std::snprintf(buf, sizeof buf, "%lldx%lldx%lld", (long long)BT, (long long)cs.C,
                          (long long)cs.OC);
        else
            std::snprintf(buf, sizeof buf, "%lldx%lldx%lld", (long long)cs.OC, (long long)cs.C,
                          (long long)BT);
        return buf;
    }
    // Runs the op into out (gradients accumulate, so out is cleared first, outside the timing).
    double run(const Numerics& nx, std::vector<float>& out) const {
        std::fill(out.begin(), out.end(), 0.0f);
        return seconds_of([&] {
            switch (cs.op) {
                case Op::forward:
                    cpu::matmul_forward(nx, out.data(), inp.data(), weight.data(),
                                        cs.bias ? bias.data() : nullptr, BT, cs.C, cs.OC);
                    break;
                case Op::dinp:
                    cpu::matmul_backward(nx, out.data(), nullptr, nullptr, dout.data(), inp.data(),
                                         weight.data(), BT, cs.C, cs.OC);
                    break;
                case Op::dweight:
                    cpu::matmul_backward(nx, nullptr, out.data(), nullptr, dout.data(), inp.data(),
                                         weight.data(), BT, cs.C, cs.OC);
                    break;
            }
        });
    }
    // Σ|a||b| (+|bias|) per output element, through the fast GEMM on absolute values, and K.
    std::vector<float> abs_products(i64& K) const {
        auto absv = [](const std::vector<float>& v) {
            std::vector<float> r(v.size());
            for (size_t i = 0; i < v.size(); i++) r[i] = std::fabs(v[i]);
            return r;
        };
        const std::vector<float> ai = absv(inp), aw = absv(weight), ad = absv(dout);
        std::vector<float> s(static_cast<size_t>(out_size));
        Numerics fast;
        fast.mode = Mode::fast;
        switch (cs.op) {
            case Op::forward: {
                const std::vector<float> ab = absv(bias);
                K = cs.C;
                cpu::matmul_forward(fast, s.data(), ai.data(), aw.data(),
                                    cs.bias ? ab.data() : nullptr, BT, cs.C, cs.OC);
                break;
            }
            case Op::dinp:
                K = cs.OC;
                cpu::gemm(fast, s.data(), cs.C, ad.data(), cs.OC, 1, aw.data(), cs.C, 1, BT, cs.C,
                          cs.OC, false);
                break;
            case Op::dweight:
                K = BT;
                cpu::gemm(fast, s.data(), cs.C, ad.data(), 1, cs.OC, ai.data(), cs.C, 1, cs.OC,
                          cs.C, BT, false);
                break;
        }
        return s;
    }
};

int failures = 0;

void fail(const char* what, const char* name, const std::string& detail) {
    std::printf("  FAIL %s %s: %s\n", name, what, detail.c_str());
    failures++;
}

// A case in bf16: activations and output gradients bf16, weights and bias fp32. Values whose
// sums are exact in fp32 in any order: inp in [-7, 7] and dout in {-1, 0, 1} (integers), weights
// m/128 (|m| < 256: bf16's grid below 2) plus, where |w| >= 1, an offset that rounding to bf16
// must remove (ties included), bias on the same grid. Σ|a·b| < 2^17 on a 2^-7 grid for every K
// here (50257 at most), within fp32's 24 bits.
struct Bf16Problem {
    const Case& cs;
    std::vector<std::uint16_t> inp, dout;
    std::vector<float> weight, bias;

    explicit Bf16Problem(const Case& c) : cs(c) {
        std::vector<float> u(
            static_cast<size_t>(std::max(BT * c.C, std::max(BT * c.OC, c.OC * c.C))));
        fill_uniform(u, 11);
        for (i64 i = 0; i < BT * c.C; i++)
            inp.push_back(f32_to_bf16(std::round(7.0f * u[static_cast<size_t>(i)])));
        for (i64 i = 0; i < BT * c.OC; i++)
            dout.push_back(f32_to_bf16(std::round(u[static_cast<size_t>(i)])));
        fill_uniform(u, 12);
        const float offsets[] = {0.0f, 0.003f, -0.003f, 1.0f / 256, -1.0f / 256};
        for (i64 i = 0; i < c.OC * c.C; i++) {
            const float m = std::round(255.0f * u[static_cast<size_t>(i)]);
            const float off = std::fabs(m) >= 128 ? offsets[static_cast<size_t>(i) % 5] : 0.0f;
            weight.push_back(m / 128.0f + (m < 0 ? -off : off));
        }
        for (i64 i = 0; i < c.OC; i++)
            bias.push_back(std::round(255.0f * u[static_cast<size_t>(i)]) / 128.0f);
    }
    // Runs the op on `path` into o16 (forward, dinp: bf16) or o32 (dweight), cleared first.
    double run(const Numerics& nx, cpu::Bf16Path path, std::vector<std::uint16_t>& o16,
               std::vector<float>& o32) const {
        std::fill(o16.begin(), o16.end(), std::uint16_t{0});
        std::fill(o32.begin(), o32.end(), 0.0f);
        return seconds_of([&] {
            switch (cs.op) {
                case Op::forward:
                    cpu::matmul_forward_bf16(nx, path, o16.data(), inp.data(), weight.data(),
                                             cs.bias ? bias.data() : nullptr, BT, cs.C, cs.OC);
                    break;
                case Op::dinp:
                    cpu::matmul_backward_bf16(nx, path, o16.data(), nullptr, nullptr, dout.data(),
                                              inp.data(), weight.data(), BT, cs.C, cs.OC);
                    break;
                case Op::dweight:
                    cpu::matmul_backward_bf16(nx, path, nullptr, o32.data(), nullptr, dout.data(),
                                              inp.data(), weight.data(), BT, cs.C, cs.OC);
                    break;
            }
        });
    }
};

}  // namespace

int main(int argc, char** argv) {
    px::openmp_passive_by_default(argv);  // idle OpenMP threads sleep (core/base/wait_policy.h)
    bool quick = false;
    int reps = 5;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--quick")
            quick = true;
        else if (a == "--reps" && i + 1 < argc)
            reps = std::max(1, std::atoi(argv[++i]));
        else if (a == "--threads" && i + 1 < argc)
            omp_set_num_threads(std::max(1, std::atoi(argv[++i])));
        else {
            std::printf("usage: bench_matmul [--quick] [--reps N] [--threads N]\n");
            return a == "--help" || a == "-h" ? 0 : 2;
        }
    }
    if (quick) reps = std::min(reps, 2);
    const int threads = omp_get_max_threads();
    const Isa best = detect_isa();
    const bool with_avx2 = !quick && best == Isa::avx512;

    Numerics bit, bit2, fast;
    bit.isa = best;
    bit2.isa = Isa::avx2;
    fast.mode = Mode::fast;
    fast.isa = best;

    double peak = 0, peak2 = 0;
    auto measure_peak = [&] {
        if (best != Isa::scalar) peak = std::max(peak, bench::fp32_fma_peak_gflops(threads, best));
        if (best == Isa::avx512)
            peak2 = std::max(peak2, bench::fp32_fma_peak_gflops(threads, Isa::avx2));
        if (best == Isa::scalar)
            peak = std::max(peak, bench::fp32_fma_peak_gflops(threads, Isa::scalar));
    };
    measure_peak();

    std::printf("bench_matmul: BT=%lld, %d threads, best ISA %s, best of %d, block %d\n",
                (long long)BT, threads, isa_name(best), reps, bit.block);
    std::printf("%-17s %-15s %9s %7s %9s %7s %8s %9s %7s\n", "op", "MxNxK", "bitwise", "%peak",
                "fast", "%peak", "bit/fast", with_avx2 ? "bit-avx2" : "", with_avx2 ? "%peak2" : "");

    double sum_bit = 0, sum_fast = 0;  // time-weighted totals
    // Per kind of op (forward, dinp, dweight): FLOPs and times, for the share of peak of each.
    double kind_flops[3] = {}, kind_bit[3] = {}, kind_fast[3] = {};
    struct Row {
        const char* name;
        std::string shape;
        double gb, gf, g2, worst;  // GFLOP/s bitwise, fast, bitwise on AVX2; error / bound
    };
    std::vector<Row> rows;
    for (const Case& cs : kCases) {
        if (quick && cs.OC == 50257 && cs.op != Op::forward) continue;
        const Problem pb(cs);
        std::vector<float> ref(static_cast<size_t>(pb.out_size)), out(ref.size()), outf(ref.size());
        double tb = 1e30, tf = 1e30, t2 = 1e30;
        for (int r = 0; r < reps; r++) {
            // Alternate the programs so that a slow phase of the host hits them alike.
            tb = std::min(tb, pb.run(bit, r == 0 ? ref : out));
            if (r > 0 && std::memcmp(out.data(), ref.data(), ref.size() * sizeof(float)) != 0)
                fail("repeat", cs.name, "a second bitwise run differs from the first");
            tf = std::min(tf, pb.run(fast, outf));
            if (with_avx2) {
                t2 = std::min(t2, pb.run(bit2, out));
                if (std::memcmp(out.data(), ref.data(), ref.size() * sizeof(float)) != 0)
                    fail("isa", cs.name, "the AVX2 path differs from the best path");
            }
        }
        measure_peak();

        // bitwise vs fast within the rounding bound.
        i64 K = 0;
        const std::vector<float> s = pb.abs_products(K);
        const double u = std::ldexp(1.0, -24);
        const double n = static_cast<double>(K + 1);
        const double gamma = n * u / (1 - n * u);
        i64 bad = 0, worst_i = 0;
        double worst = 0;
        for (size_t i = 0; i < ref.size(); i++) {
            const double d = std::fabs(static_cast<double>(ref[i]) - outf[i]);
            const double bound = 2 * gamma * static_cast<double>(s[i]) * (1 + 4 * n * u);
            if (!(d <= bound)) bad++;
            if (bound > 0 && d / bound > worst) {
                worst = d / bound;
                worst_i = static_cast<i64>(i);
            }
        }
        if (bad > 0) {
            char buf[160];
            std::snprintf(buf, sizeof buf,
                          "%lld elements outside the bound, worst at %lld (%.3g of it)",
                          (long long)bad, (long long)worst_i, worst);
            fail("bitwise vs fast", cs.name, buf);
        }

        const double gb = pb.flops() / tb / 1e9, gf = pb.flops() / tf / 1e9,
                     g2 = pb.flops() / t2 / 1e9;
        sum_bit += tb;
        sum_fast += tf;
        const int kind = static_cast<int>(cs.op);
        kind_flops[kind] += pb.flops();
        kind_bit[kind] += tb;
        kind_fast[kind] += tf;
        rows.push_back({cs.name, pb.shape(), gb, gf, g2, worst});
    }
    // Every share against the peak as measured over the whole run (the best of its repeats).
    for (const Row& r : rows) {
        char c2[32] = "";
        if (with_avx2) std::snprintf(c2, sizeof c2, "%9.1f %6.1f%%", r.g2, 100 * r.g2 / peak2);
        std::printf("%-17s %-15s %9.1f %6.1f%% %9.1f %6.1f%% %8.2f %s   (err %.2g of bound)\n",
                    r.name, r.shape.c_str(), r.gb, 100 * r.gb / peak, r.gf, 100 * r.gf / peak,
                    r.gb / r.gf, c2, r.worst);
    }
    std::printf("fp32 FMA peak (%d threads, register-only loop): %s %.1f GFLOP/s", threads,
                isa_name(best), peak);
    if (best == Isa::avx512) std::printf(", avx2 %.1f GFLOP/s", peak2);
    std::printf("\nall shapes: bitwise/fast time ratio %.2f (fast time / bitwise time)\n",
                sum_fast / sum_bit);
    const char* kind_names[3] = {"forward", "input gradients", "weight gradients"};
    for (int k = 0; k < 3; k++)
        if (kind_flops[k] > 0)
            std::printf("%-17s share of peak (all its shapes, time-weighted): bitwise %.1f%%, "
                        "fast %.1f%%\n",
                        kind_names[k], 100 * kind_flops[k] / kind_bit[k] / 1e9 / peak,
                        100 * kind_flops[k] / kind_fast[k] / 1e9 / peak);
    if (failures > 0) {
        std::printf("%d check(s) FAILED\n", failures);
        return 1;
    }
    std::printf(
        "checks passed: repeat runs bit-identical%s, bitwise vs fast within the fp32 bound\n",
        with_avx2 ? ", avx2 == avx512" : "");

    // bf16 in fast mode: both paths beside fp32 sgemm, alternating.
    const cpu::Bf16MatmulInfo& info = cpu::bf16_matmul_info();
    std::printf("\nbf16 fast mode (kernels/cpu/matmul_bf16.h): this CPU takes %s\n  %s\n",
                cpu::bf16_path_name(info.path), info.text.c_str());
    std::printf("%-17s %-15s %11s %11s %11s %9s\n", "op", "MxNxK", "oneDNN bf16", "sgemm bf16",
                "sgemm fp32", "bf16/fp32");
    double t_dnn = 0, t_sg = 0, t_32 = 0;
    for (const Case& cs : kCases) {
        if (quick && cs.OC == 50257 && cs.op != Op::forward) continue;
        const Problem pb(cs);
        const Bf16Problem bp(cs);
        std::vector<float> o32(static_cast<size_t>(pb.out_size)), f32out(o32.size()),
            ref32(o32.size()), s32(o32.size());
        std::vector<std::uint16_t> o16(cs.op == Op::dweight ? 0 : o32.size()), s16(o16.size()),
            ref16(o16.size());
        double td = 1e30, ts = 1e30, tf = 1e30;
        for (int r = 0; r < reps; r++) {
            td = std::min(td, bp.run(fast, cpu::Bf16Path::onednn, o16, o32));
            ts = std::min(ts, bp.run(fast, cpu::Bf16Path::sgemm, s16, s32));
            tf = std::min(tf, pb.run(fast, f32out));
        }
        bp.run(bit, cpu::Bf16Path::sgemm, ref16, ref32);  // the canonical GEMM on bf16 values
        if (o16 != ref16 || std::memcmp(o32.data(), ref32.data(), o32.size() * sizeof(float)) != 0)
            fail("bf16", cs.name,
                 "oneDNN's bf16 primitive differs from the bitwise bf16 reference");
        if (s16 != ref16 || std::memcmp(s32.data(), ref32.data(), s32.size() * sizeof(float)) != 0)
            fail("bf16", cs.name, "sgemm on bf16 values differs from the bitwise bf16 reference");
        t_dnn += td;
        t_sg += ts;
        t_32 += tf;
        const double gd = pb.flops() / td / 1e9, gs = pb.flops() / ts / 1e9,
                     gf = pb.flops() / tf / 1e9;
        const double taken = info.path == cpu::Bf16Path::onednn ? gd : gs;
        std::printf("%-17s %-15s %11.1f %11.1f %11.1f %8.2fx\n", cs.name, pb.shape(), gd, gs, gf,
                    taken / gf);
        std::fflush(stdout);
    }
    std::printf(
        "all shapes, time-weighted: oneDNN bf16 %.2fx, sgemm bf16 %.2fx the speed of fp32 "
        "sgemm; the path taken (%s) %.2fx\n",
        t_32 / t_dnn, t_32 / t_sg, cpu::bf16_path_name(info.path),
        t_32 / (info.path == cpu::Bf16Path::onednn ? t_dnn : t_sg));
    if (failures > 0) {
        std::printf("%d check(s) FAILED\n", failures);
        return 1;
    }
    std::printf("checks passed: both bf16 paths equal the bitwise bf16 reference bit for bit\n");
    return 0;
}
