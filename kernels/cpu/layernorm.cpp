// LayerNorm over the C channels of each token, eps 1e-5 (GPT-2 pre-norm).
//
// Forward, per token row x (C):
//   mean = Σx / C,  var = Σ(x - mean)² / C,  rstd = 1/sqrt(var + eps)
//   out  = ((x - mean)·rstd)·weight + bias
// Backward, per row, with norm = (x - mean)·rstd and dnorm = weight·dout:
//   dinp += ((dnorm - Σdnorm/C) - norm·(Σdnorm·norm/C))·rstd
// and over the tokens: dbias += Σ dout, dweight += Σ norm·dout.
//
// Order (Mode::bitwise): the sums over C are canonical trees over blocks of nx.block channels
// (fma inside a block for Σ(x - mean)² and Σdnorm·norm). The token sums run sequentially inside
// a block of nx.block tokens, vectorised across the C columns, and the token blocks combine in the
// canonical tree. Threads take whole rows (forward, dinp) and whole token blocks (the partials),
// never part of a sum.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vecmath.h"
#include "kernels/ops.h"  // kLayerNormEps

#include <algorithm>
#include <cmath>
#include <vector>

namespace px::cpu {

namespace {
constexpr float kEps = ops::kLayerNormEps;
}

// out (BT,C), mean (BT), rstd (BT); inp (BT,C), weight (C), bias (C)
void layernorm_forward(const Numerics& nx, float* out, float* mean, float* rstd, const float* inp,
                       const float* weight, const float* bias, i64 BT, i64 C) {
    const VecMath& vm = vecmath(nx.isa);
#pragma omp parallel
    {
        std::vector<float> part;
#pragma omp for schedule(dynamic, 8)
        for (i64 t = 0; t < BT; t++) {
            const float* x = inp + t * C;
            float* o = out + t * C;
            const float m = reduce_sum(nx, vm, x, C, part) / float(C);
            for (i64 i = 0; i < C; i++) o[i] = x[i] - m;  // deviations, squared-summed in place
            const float var = reduce_dot(nx, vm, o, o, C, part) / float(C);
            const float s = 1.0f / std::sqrt(var + kEps);
            for (i64 i = 0; i < C; i++) o[i] = (o[i] * s) * weight[i] + bias[i];
            mean[t] = m;
            rstd[t] = s;
        }
    }
}

// dinp (BT,C) +=, dweight (C) +=, dbias (C) += (null ones skipped); dout, inp (BT,C);
// weight (C); mean, rstd (BT)
void layernorm_backward(const Numerics& nx, float* dinp, float* dweight, float* dbias,
                        const float* dout, const float* inp, const float* weight, const float* mean,
                        const float* rstd, i64 BT, i64 C) {
    if (BT <= 0 || C <= 0) return;
    const VecMath& vm = vecmath(nx.isa);
    const int blk = nx.block;
    const i64 nb = num_blocks(BT, blk);
    // One partial row per token block: the block's sum over its tokens, from +0.
    std::vector<float> pw(dweight ? nb * C : 0, 0.0f), pb(dbias ? nb * C : 0, 0.0f);
#pragma omp parallel
    {
        std::vector<float> norm(C), dnorm(C), part;
#pragma omp for schedule(dynamic, 8)
        for (i64 jb = 0; jb < nb; jb++) {
            float* aw = dweight ? pw.data() + jb * C : nullptr;
            float* ab = dbias ? pb.data() + jb * C : nullptr;
            const i64 t1 = std::min(BT, (jb + 1) * blk);
            for (i64 t = jb * blk; t < t1; t++) {
                const float* x = inp + t * C;
                const float* d = dout + t * C;
                const float m = mean[t], s = rstd[t];
                for (i64 i = 0; i < C; i++) {
                    norm[i] = (x[i] - m) * s;
                    dnorm[i] = weight[i] * d[i];
                }
                if (ab)
                    for (i64 i = 0; i < C; i++) ab[i] = ab[i] + d[i];
                if (aw) vm.fma_elem(aw, norm.data(), d, C);
                if (dinp) {
                    const float dm = reduce_sum(nx, vm, dnorm.data(), C, part) / float(C);
                    const float dnm =
                        reduce_dot(nx, vm, dnorm.data(), norm.data(), C, part) / float(C);
                    float* di = dinp + t * C;
                    for (i64 i = 0; i < C; i++) di[i] += ((dnorm[i] - dm) - norm[i] * dnm) * s;
                }
            }
        }
    }
    if (dbias) {
        tree_combine_rows(pb.data(), nb, C);
        for (i64 i = 0; i < C; i++) dbias[i] += pb[i];
    }
    if (dweight) {
        tree_combine_rows(pw.data(), nb, C);
        for (i64 i = 0; i < C; i++) dweight[i] += pw[i];
    }
}

}  // namespace px::cpu
