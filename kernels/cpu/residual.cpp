// Residual connection: out = inp1 + inp2. Elementwise IEEE adds: the same bits on every path.
#include "kernels/cpu/cpu_kernels.h"

namespace px::cpu {

// out, inp1, inp2 (N)
void residual_forward(const Numerics&, float* out, const float* inp1, const float* inp2, i64 N) {
#pragma omp parallel for schedule(dynamic, 1 << 14)
    for (i64 i = 0; i < N; i++) out[i] = inp1[i] + inp2[i];
}

// dinp1, dinp2 (N) += dout (N)
void residual_backward(const Numerics&, float* dinp1, float* dinp2, const float* dout, i64 N) {
#pragma omp parallel for schedule(dynamic, 1 << 14)
    for (i64 i = 0; i < N; i++) {
        dinp1[i] += dout[i];
        dinp2[i] += dout[i];
    }
}

}  // namespace px::cpu
