// Mode::fast GEMM through oneDNN's sgemm (row-major, any summation order, its own OpenMP threads).
#include "kernels/cpu/matmul_kernels.h"

#include <oneapi/dnnl/dnnl.h>

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

}  // namespace

// c (M,N) = a (M,K) · b (K,N), or += when accumulate
bool gemm_fast(float* c, i64 ldc, const float* a, i64 rsa, i64 csa, const float* b, i64 rsb,
               i64 csb, i64 M, i64 N, i64 K, bool accumulate) {
    char ta, tb;
    i64 lda, ldb;
    if (M == 1 && ldc < N) ldc = N;  // one row: the leading dimension is never used
    if (ldc < N || !as_sgemm(M, K, rsa, csa, ta, lda) || !as_sgemm(K, N, rsb, csb, tb, ldb))
        return false;
    const dnnl_status_t st =
        dnnl_sgemm(ta, tb, M, N, K, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
    return st == dnnl_success;
}

}  // namespace px::cpu
