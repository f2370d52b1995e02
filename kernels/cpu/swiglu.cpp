// SwiGLU, the gated MLP activation of Llama and Qwen: out = silu(gate)·up, silu(g) = g·sigmoid(g).
// gate and up are two (BT,F) operands whose rows may be apart (ld): two tensors, or the two halves
// [gate | up] of one (BT,2F) matmul output (ld = 2F, up = gate + F).
//
// sigmoid comes from t = exp(-|g|) (mathfun::exp_t): 1/(1 + t) or t/(1 + t), so neither it nor
// 1 - sigmoid overflows or cancels. Backward, with s = sigmoid(g):
//   dgate += (dout·up)·(s·(1 + g·(1 - s))),  dup += dout·(g·s)
// (gradients accumulate, as gelu_backward's dinp). The formulas are in vecmath.h, shared by the
// scalar, AVX2 and AVX-512 tables: elementwise, so the same bits on every path and thread count;
// Mode::fast runs the same kernel (nothing faster is natural). Threads take whole rows.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vecmath.h"

namespace px::cpu {

// out (BT,F) rows ldo apart; gate, up (BT,F) rows ldi apart. out may alias gate or up.
void swiglu_forward(const Numerics& nx, float* out, i64 ldo, const float* gate, const float* up,
                    i64 ldi, i64 BT, i64 F) {
    const VecMath& vm = vecmath(nx.isa);
#pragma omp parallel for schedule(dynamic, 4)
    for (i64 r = 0; r < BT; r++) vm.swiglu_forward(out + r * ldo, gate + r * ldi, up + r * ldi, F);
}

// dgate, dup (BT,F) += rows ldd apart; gate, up (BT,F) rows ldi apart; dout (BT,F) rows ldo apart
void swiglu_backward(const Numerics& nx, float* dgate, float* dup, i64 ldd, const float* gate,
                     const float* up, i64 ldi, const float* dout, i64 ldo, i64 BT, i64 F) {
    const VecMath& vm = vecmath(nx.isa);
#pragma omp parallel for schedule(dynamic, 4)
    for (i64 r = 0; r < BT; r++)
        vm.swiglu_backward(dgate + r * ldd, dup + r * ldd, gate + r * ldi, up + r * ldi,
                           dout + r * ldo, F);
}

}  // namespace px::cpu
