// AdamW step and the sum of squares used by global-norm clipping.
//
// adamw: per element (the expression is vecmath.h's adamw_n, the same on every path):
//   g = grad·grad_scale;  m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²
//   param -= lr·( (m/bc1) / (sqrt(v/bc2) + eps) + wd·param ),  bc_i = 1 - β_iᵗ
// The bias corrections are computed once per call in double by repeated squaring (plain IEEE
// multiplies, so every machine and the GPU get the same value; libm pow need not) and rounded to
// float.
//
// sum_squares: Mode::bitwise: block partials Σ fma(x, x, ·) over blocks of nx.block, combined in
// the canonical tree; threads take whole blocks.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vecmath.h"

#include <algorithm>
#include <vector>

namespace px::cpu {

namespace {

// Elements per parallel task; tasks go to whichever thread is free, 8 at a time (a thread that
// shares its core with another process takes fewer). Which thread runs a task changes no bit.
constexpr i64 kChunk = 1 << 14;
// A tensor of at most one grab of tasks (most of a GPT's tensors: the layernorms and biases) runs
// on the calling thread: waking the others would give them nothing to do, and a sleeping thread
// takes tens of µs to wake (measured on a 2-core VM: ~46 µs per parallel region; a GPT-2 step
// called 296 regions here, one per tensor in the update and again in the grad norm).
constexpr i64 kTasksPerGrab = 8;

double pow_int(double b, int t) {
    double r = 1.0;
    for (unsigned e = unsigned(t); e; e >>= 1) {
        if (e & 1u) r *= b;
        b *= b;
    }
    return r;
}

}  // namespace

// param, m, v, grad (N)
void adamw_update(const Numerics& nx, float* param, float* m, float* v, const float* grad, i64 N,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  float grad_scale, int t) {
    const VecMath& vm = vecmath(nx.isa);
    const AdamWCoeffs c{lr,
                        beta1,
                        beta2,
                        1.0f - beta1,
                        1.0f - beta2,
                        eps,
                        weight_decay,
                        grad_scale,
                        float(1.0 - pow_int(double(beta1), t)),
                        float(1.0 - pow_int(double(beta2), t))};
    const i64 nc = (N + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(dynamic, kTasksPerGrab) if (nc > kTasksPerGrab)
    for (i64 k = 0; k < nc; k++) {
        const i64 lo = k * kChunk;
        vm.adamw(param + lo, m + lo, v + lo, grad + lo, std::min(kChunk, N - lo), c);
    }
}

// x (N)
float sum_squares(const Numerics& nx, const float* x, i64 N) {
    if (N <= 0) return 0.0f;
    const VecMath& vm = vecmath(nx.isa);
    if (nx.mode == Mode::fast) {
        // Fixed chunks, each a vector dot, added in double: accurate and still run-to-run stable.
        const i64 nc = (N + kChunk - 1) / kChunk;
        std::vector<float> part(nc);
#pragma omp parallel for schedule(dynamic, kTasksPerGrab) if (nc > kTasksPerGrab)
        for (i64 k = 0; k < nc; k++) {
            const i64 lo = k * kChunk;
            part[k] = vm.fast_dot(x + lo, x + lo, std::min(kChunk, N - lo));
        }
        double s = 0.0;
        for (float p : part) s += p;
        return float(s);
    }
    const i64 nb = num_blocks(N, nx.block);
    std::vector<float> part(nb);
    sum_squares_blocks(nx, part.data(), x, N);
    return tree_sum(part.data(), nb);
}

// part (num_blocks(N)), x (N)
void sum_squares_blocks(const Numerics& nx, float* part, const float* x, i64 N) {
    const VecMath& vm = vecmath(nx.isa);
    const int blk = nx.block;
    const i64 nb = num_blocks(N, blk);
    const i64 per = std::max<i64>(1, kChunk / blk);  // blocks per parallel task
    const i64 ntask = (nb + per - 1) / per;
#pragma omp parallel for schedule(dynamic, kTasksPerGrab) if (ntask > kTasksPerGrab)
    for (i64 k = 0; k < ntask; k++) {
        const i64 b0 = k * per, b1 = std::min(nb, b0 + per);
        const i64 lo = b0 * blk, hi = std::min(N, b1 * blk);
        vm.block_dots(part + b0, x + lo, x + lo, hi - lo, blk);
    }
}

}  // namespace px::cpu
