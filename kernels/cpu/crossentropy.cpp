// Softmax cross-entropy per token, over a vocabulary of V logits.
//
// Forward, per row l (V):  e = exp(l - max),  S = Σe,  probs = e / S,
//   loss = log S - (l[target] - max)
// with max exact, exp and log from core/base/mathfun.h, and S the canonical tree over blocks of
// nx.block logits (Mode::bitwise). Backward: dlogits = (probs - onehot(target))·dloss, assigned.
// Threads take whole rows.
#include "core/base/error.h"
#include "core/base/mathfun.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vecmath.h"

#include <string>
#include <vector>

namespace px::cpu {

namespace {
void check_target(int target, i64 row, i64 V) {
    if (target < 0 || target >= V)
        throw Error("crossentropy: target " + std::to_string(target) + " of row " +
                    std::to_string(row) + " is outside the vocabulary [0, " + std::to_string(V) +
                    ")");
}
}  // namespace

// losses (BT), probs (BT,V); logits (BT,V), targets (BT)
void crossentropy_forward(const Numerics& nx, float* losses, float* probs, const float* logits,
                          const int* targets, i64 BT, i64 V) {
    const VecMath& vm = vecmath(nx.isa);
    for (i64 r = 0; r < BT; r++) check_target(targets[r], r, V);
#pragma omp parallel
    {
        std::vector<float> part;
#pragma omp for schedule(dynamic, 2)
        for (i64 r = 0; r < BT; r++) {
            const float* l = logits + r * V;
            float* p = probs + r * V;
            const float mx = vm.max(l, V);
            const float lt = l[targets[r]];  // read first: probs may alias logits
            vm.exp_sub(p, l, mx, V);
            const float sum = reduce_sum(nx, vm, p, V, part);
            for (i64 i = 0; i < V; i++) p[i] = p[i] / sum;
            losses[r] = mathfun::log(sum) - (lt - mx);
        }
    }
}

// dlogits (BT,V) = (probs - onehot(targets))·dloss, assigned (may alias probs); probs (BT,V)
void crossentropy_backward(const Numerics&, float* dlogits, const float* probs, const int* targets,
                           float dloss, i64 BT, i64 V) {
    for (i64 r = 0; r < BT; r++) check_target(targets[r], r, V);
#pragma omp parallel for schedule(dynamic, 2)
    for (i64 r = 0; r < BT; r++) {
        const float* p = probs + r * V;
        float* d = dlogits + r * V;
        const i64 tg = targets[r];
        for (i64 i = 0; i < V; i++) d[i] = (p[i] - (i == tg ? 1.0f : 0.0f)) * dloss;
    }
}

}  // namespace px::cpu
