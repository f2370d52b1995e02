// Mode::fast GEMM through oneDNN's sgemm (row-major, any summation order).
//
// oneDNN splits one sgemm statically between its threads, so a thread that shares its core with
// another process holds up the whole product (and a step is hundreds of them). Instead the output
// is cut into a few items along its longer side, handed out dynamically to this library's OpenMP
// threads, and each item is one single-threaded sgemm (oneDNN runs serially inside a parallel
// region): a thread slowed down takes fewer items. Measured on GPT-2 124M's shapes (2 cores,
// bench/bench_matmul.cpp): as fast or faster than oneDNN's own threading when quiet (fcproj's
// forward 232 → 397 GFLOP/s, where oneDNN's K-long split lags), and less hurt by a busy neighbour.
#include "core/base/error.h"
#include "kernels/cpu/matmul_kernels.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <string>

namespace px::cpu {

namespace {

// One operand (rows,cols) with element (i,j) at p[i*rs + j*cs], as sgemm's (trans, ld):
// row-major when the column stride is 1, transposed when the row stride is 1. Single rows or
// columns take whichever stride is 1 and a leading dimension sgemm accepts.
bool as_sgemm(i64 rows, i64 cols, i64 rs, i64 cs, char& trans, i64& ld) {
    if (cs == 1 && (rows == 1 || rs >= cols)) {
        trans = 'N';
        ld = rows == 1 ? cols : rs;
        return true;
    }
    if (rs == 1 && (cols == 1 || cs >= rows)) {
        trans = 'T';
        ld = cols == 1 ? rows : cs;
        return true;
    }
    return false;
}

// Items per thread: enough for a slowed thread to hand work over, few enough that re-reading the
// operand every item shares stays cheap (measured: 2 is best quiet, 4 under a busy neighbour).
constexpr i64 kItemsPerThread = 3;
constexpr i64 kMinItem = 64;            // rows or columns per item, at least
constexpr double kSplitWork = 1 << 22;  // M·N·K below which one call is cheaper

}  // namespace

// c (M,N) = a (M,K) · b (K,N), or += when accumulate, or = bias[j] + … when bias (N) is given
bool gemm_fast(float* c, i64 ldc, const float* a, i64 rsa, i64 csa, const float* b, i64 rsb,
               i64 csb, i64 M, i64 N, i64 K, bool accumulate, const float* bias) {
    char ta, tb;
    i64 lda, ldb;
    if (M == 1 && ldc < N) ldc = N;  // one row: the leading dimension is never used
    if (ldc < N || !as_sgemm(M, K, rsa, csa, ta, lda) || !as_sgemm(K, N, rsb, csb, tb, ldb))
        return false;
    const float beta = accumulate || bias != nullptr ? 1.0f : 0.0f;

    // Items along the longer side of c, in multiples of 16 (a vector of columns, or of rows).
    const bool by_cols = N >= M;
    const i64 extent = by_cols ? N : M;
    const int nthreads = omp_in_parallel() ? 1 : omp_get_max_threads();
    const double work = static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
    i64 items = nthreads > 1 && work >= kSplitWork
                    ? std::clamp<i64>(extent / kMinItem, 1, nthreads * kItemsPerThread)
                    : 1;
    const i64 width = ((extent + items - 1) / items + 15) / 16 * 16;
    items = (extent + width - 1) / width;

    std::atomic<int> failed{dnnl_success};
    auto run_item = [&](i64 it) {
        const i64 x0 = it * width, n = std::min(width, extent - x0);
        if (bias != nullptr) {  // the item's block of c starts as the bias, then accumulates
            const i64 rows = by_cols ? M : n, cols = by_cols ? n : N, j0 = by_cols ? x0 : 0;
            float* const c0 = by_cols ? c + x0 : c + x0 * ldc;
            for (i64 i = 0; i < rows; i++) std::copy(bias + j0, bias + j0 + cols, c0 + i * ldc);
        }
        dnnl_status_t st;
        if (by_cols) {  // columns x0.. of b and c
            const float* bi = tb == 'N' ? b + x0 : b + x0 * ldb;
            st = dnnl_sgemm(ta, tb, M, n, K, 1.0f, a, lda, bi, ldb, beta, c + x0, ldc);
        } else {  // rows x0.. of a and c
            const float* ai = ta == 'N' ? a + x0 * lda : a + x0;
            st = dnnl_sgemm(ta, tb, n, N, K, 1.0f, ai, lda, b, ldb, beta, c + x0 * ldc, ldc);
        }
        if (st != dnnl_success) failed.store(st, std::memory_order_relaxed);
    };
    if (items == 1) {
        run_item(0);  // one call: oneDNN's own threads
    } else {
        const int team = static_cast<int>(std::min<i64>(nthreads, items));
#pragma omp parallel for schedule(dynamic, 1) num_threads(team)
        for (i64 it = 0; it < items; it++) run_item(it);
    }
    // The arguments were checked above, so a failure is oneDNN running out of memory; part of c
    // may already hold its sum, so there is no falling back to the canonical path.
    if (failed.load() != dnnl_success)
        throw Error("oneDNN sgemm failed (status " + std::to_string(failed.load()) + ") on a " +
                    std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K) +
                    " product; free memory or use numerics.mode = \"bitwise\"");
    return true;
}

}  // namespace px::cpu
