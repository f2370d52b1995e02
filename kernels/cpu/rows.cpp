// Row-wise pieces of a softmax whose rows are split between ranks (vocabulary-parallel
// cross-entropy, core/parallel/tensor/tensor_parallel.cpp): each rank takes the max and the exp of
// its slice of a row, and the sums of the tree nodes it owns. The arithmetic is crossentropy.cpp's
// per element (vecmath's max, exp_sub and block sums), so the pieces combine to its result.
// Threads take whole rows.
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/vecmath.h"

#include <cmath>
#include <vector>

namespace px::cpu {

// out (BT), x (BT,N)
void row_max(const Numerics& nx, float* out, const float* x, i64 BT, i64 N) {
    const VecMath& vm = vecmath(nx.isa);
#pragma omp parallel for schedule(static)
    for (i64 m = 0; m < BT; m++) out[m] = N > 0 ? vm.max(x + m * N, N) : -INFINITY;
}

// out (BT,N), x (BT,N), shift (BT)
void exp_sub(const Numerics& nx, float* out, const float* x, const float* shift, i64 BT, i64 N) {
    const VecMath& vm = vecmath(nx.isa);
#pragma omp parallel for schedule(static)
    for (i64 m = 0; m < BT; m++) vm.exp_sub(out + m * N, x + m * N, shift[m], N);
}

// out (BT), x (BT,N) with row stride ldx
void row_sum(const Numerics& nx, float* out, const float* x, i64 ldx, i64 BT, i64 N) {
    const VecMath& vm = vecmath(nx.isa);
#pragma omp parallel
    {
        std::vector<float> part;
#pragma omp for schedule(static)
        for (i64 m = 0; m < BT; m++) out[m] = reduce_sum(nx, vm, x + m * ldx, N, part);
    }
}

}  // namespace px::cpu
