// GELU, tanh approximation: out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
// Elementwise, so every path gives the same bits; the formulas (and tanh from core/base/mathfun.h)
// are in vecmath.h, shared by the scalar, AVX2 and AVX-512 tables.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vecmath.h"

#include <algorithm>

namespace px::cpu {

namespace {
constexpr i64 kChunk = 1 << 14;  // elements per parallel task
}

// out (N), inp (N)
void gelu_forward(const Numerics& nx, float* out, const float* inp, i64 N) {
    const VecMath& vm = vecmath(nx.isa);
    const i64 nc = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(dynamic, 1)
    for (i64 c = 0; c < nc; c++) {
        const i64 lo = c * kChunk;
        vm.gelu_forward(out + lo, inp + lo, std::min(kChunk, N - lo));
    }
}

// dinp (N) += gelu'(inp)·dout; inp, dout (N)
void gelu_backward(const Numerics& nx, float* dinp, const float* inp, const float* dout, i64 N) {
    const VecMath& vm = vecmath(nx.isa);
    const i64 nc = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(dynamic, 1)
    for (i64 c = 0; c < nc; c++) {
        const i64 lo = c * kChunk;
        vm.gelu_backward(dinp + lo, inp + lo, dout + lo, std::min(kChunk, N - lo));
    }
}

}  // namespace px::cpu
