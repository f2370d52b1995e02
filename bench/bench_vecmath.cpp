// bench_vecmath: ns per element of the elementwise routines (exp, log, tanh, gelu, AdamW, block
// sums) on every ISA path this CPU has, one thread. Checks that every path gives the bits of the
// scalar path on the benchmark's own inputs.
#include "core/base/numerics.h"
#include "kernels/cpu/vecmath.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

using namespace px;

int main() {
    const i64 n = 1 << 16;
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> wide(-5.0f, 5.0f), pos(0.01f, 100.0f), unit(-1.0f, 1.0f);
    std::vector<float> x(n), xp(n), g(n), y(n), ref(n), m(n, 0.0f), v(n, 0.0f);
    for (i64 i = 0; i < n; i++) x[i] = wide(rng), xp[i] = pos(rng), g[i] = unit(rng);

    std::vector<Isa> isas{Isa::scalar};
    if (detect_isa() != Isa::scalar) isas.push_back(Isa::avx2);
    if (detect_isa() == Isa::avx512) isas.push_back(Isa::avx512);

    cpu::vecmath(Isa::scalar).exp(ref.data(), x.data(), n);
    int failures = 0;
    for (Isa isa : isas) {
        const auto& vm = cpu::vecmath(isa);
        vm.exp(y.data(), x.data(), n);
        if (std::memcmp(y.data(), ref.data(), n * sizeof(float)) != 0) {
            std::printf("FAIL: %s exp differs from the scalar path\n", isa_name(isa));
            failures++;
        }
        const auto time = [&](const char* what, auto fn) {
            const int reps = isa == Isa::scalar ? 5 : 100;
            const auto t0 = std::chrono::steady_clock::now();
            for (int k = 0; k < reps; k++) fn();
            const double ns =
                std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
            std::printf("%-8s %-14s %7.3f ns/elem\n", isa_name(isa), what, ns / double(reps * n));
        };
        time("exp", [&] { vm.exp(y.data(), x.data(), n); });
        time("log", [&] { vm.log(y.data(), xp.data(), n); });
        time("tanh", [&] { vm.tanh(y.data(), x.data(), n); });
        time("gelu_fwd", [&] { vm.gelu_forward(y.data(), x.data(), n); });
        time("gelu_bwd", [&] { vm.gelu_backward(y.data(), x.data(), g.data(), n); });
        cpu::AdamWCoeffs c{1e-3f, 0.9f, 0.99f, 0.1f, 0.01f, 1e-8f, 0.1f, 1.0f, 0.3f, 0.05f};
        time("adamw", [&] { vm.adamw(y.data(), m.data(), v.data(), g.data(), n, c); });
        time("block_sums64", [&] { vm.block_sums(y.data(), x.data(), n, 64); });
        time("fast_sum", [&] { y[0] = vm.fast_sum(x.data(), n); });
    }
    return failures == 0 ? 0 : 1;
}
