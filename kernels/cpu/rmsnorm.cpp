// RMSNorm over the C channels of each token (Llama, Qwen): no mean subtraction, no bias, eps given
// (the model's norm_eps).
//
// Forward, per token row x (C):
//   rstd = 1/sqrt(Σx² / C + eps),  out = (x·rstd)·weight
// Backward, per row, with norm = x·rstd and dnorm = weight·dout:
//   dinp += (dnorm - norm·(Σdnorm·norm/C))·rstd
// and over the tokens: dweight += Σ norm·dout.
//
// Rows may come G to a token (Qwen3's qk_norm: a token's heads, one weight of head_dim for all):
// the weight gradient then adds a token's G rows in order, and the tokens as below.
//
// Order (Mode::bitwise), as layernorm.cpp: the sums over C are canonical trees over blocks of
// nx.block channels (fma inside a block for Σx² and Σdnorm·norm). The token sum runs sequentially
// inside a block of nx.block tokens, vectorised across the C columns, and the token blocks combine
// in the canonical tree over the kernel's BT rows (a caller that splits a batch hands each call
// one node's rows). Threads take whole rows (forward, dinp) and whole token blocks (the
// partials), never part of a sum. Mode::fast sums over C in any order (reduce_sum/reduce_dot's
// fast form); the token tree stays, as layernorm's (nothing faster is natural for one vector of
// C partials per block).
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vecmath.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace px::cpu {

// out (BT,C), rstd (BT); inp (BT,C), weight (C)
void rmsnorm_forward(const Numerics& nx, float* out, float* rstd, const float* inp,
                     const float* weight, i64 BT, i64 C, float eps) {
    const VecMath& vm = vecmath(nx.isa);
#pragma omp parallel
    {
        std::vector<float> part;
#pragma omp for schedule(dynamic, 8)
        for (i64 t = 0; t < BT; t++) {
            const float* x = inp + t * C;
            float* o = out + t * C;
            const float ms = reduce_dot(nx, vm, x, x, C, part) / float(C);
            const float s = 1.0f / std::sqrt(ms + eps);
            for (i64 i = 0; i < C; i++) o[i] = (x[i] * s) * weight[i];
            rstd[t] = s;
        }
    }
}

// dinp (BT·G,C) +=, dweight (C) += (null ones skipped); dout, inp (BT·G,C); weight (C); rstd (BT·G).
// G rows per token (a token's heads): the token tree is over the BT tokens, a token's G rows added
// in order inside its block.
void rmsnorm_backward(const Numerics& nx, float* dinp, float* dweight, const float* dout,
                      const float* inp, const float* weight, const float* rstd, i64 BT, i64 C,
                      i64 G) {
    if (BT <= 0 || C <= 0) return;
    const VecMath& vm = vecmath(nx.isa);
    const int blk = nx.block;
    const i64 nb = num_blocks(BT, blk);
    // One partial row per token block: the block's sum over its tokens, from +0.
    std::vector<float> pw(dweight ? nb * C : 0, 0.0f);
#pragma omp parallel
    {
        std::vector<float> norm(C), dnorm(C), part;
#pragma omp for schedule(dynamic, 8)
        for (i64 jb = 0; jb < nb; jb++) {
            float* aw = dweight ? pw.data() + jb * C : nullptr;
            const i64 t1 = std::min(BT, (jb + 1) * blk) * G;
            for (i64 t = jb * blk * G; t < t1; t++) {
                const float* x = inp + t * C;
                const float* d = dout + t * C;
                const float s = rstd[t];
                for (i64 i = 0; i < C; i++) {
                    norm[i] = x[i] * s;
                    dnorm[i] = weight[i] * d[i];
                }
                if (aw) vm.fma_elem(aw, norm.data(), d, C);
                if (dinp) {
                    const float dnm =
                        reduce_dot(nx, vm, dnorm.data(), norm.data(), C, part) / float(C);
                    float* di = dinp + t * C;
                    for (i64 i = 0; i < C; i++) di[i] += (dnorm[i] - norm[i] * dnm) * s;
                }
            }
        }
    }
    if (dweight) {
        tree_combine_rows(pw.data(), nb, C);
        for (i64 i = 0; i < C; i++) dweight[i] += pw[i];
    }
}

}  // namespace px::cpu
