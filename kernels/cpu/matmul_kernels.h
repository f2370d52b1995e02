// Internal interface between the matmul driver (matmul.cpp) and its per-ISA parts
// (matmul_avx2.cpp, matmul_avx512.cpp, matmul_fast.cpp). Not for use outside kernels/cpu.
//
// Index
//   TileFn, PackFn, StoreFn, GemmKernel   what one ISA path provides to the canonical GEMM driver
//   scalar/avx2/avx512::gemm_kernel          fp32 block sums
//   scalar/avx2/avx512::narrow_gemm_kernel   the narrow accumulator (Numerics::fp8_promote)
//   kNarrowKeep                  the bits of an fp32 sum the narrow accumulator keeps
//   gemm_fast                    oneDNN sgemm (Mode::fast)
//
// Packed layouts. The driver packs A into panels of MR rows and B into panels of NR columns,
// both k-major ("panel[k][lane]"), zero-padded past the matrix edge so a microkernel always
// computes a full MR×NR tile; padded lanes hold +0 sums that are never written out.
//
// This header includes nothing but core/base/shapes.h on purpose: the ISA translation units are
// compiled with -mavx2 / -mavx512f, and any inline function they instantiate from a shared header
// (std::min, std::vector, ...) could be picked by the linker for generic code too.
#pragma once
#include "core/base/shapes.h"

namespace px::cpu {

// One MR×NR output tile over one K chunk: klen consecutive elements that form a node of the
// canonical tree (matmul.cpp), cut into blocks of kb elements (only the last block of K may be
// short). ap: packed A panel (klen, MR); bp: packed B panel (klen, NR).
// For each block: acc = +0, then acc = fma(a, b, acc) in k order; then merges[blk] times
// acc = stack[top] + acc (node = left + right), popping; then acc is pushed. After the chunk's
// last block the chunk's own stack is empty, and acc instead merges omerges times with the
// outer stack `ostack` (height osp on entry) and is pushed there. Stacks hold levels of MR·NR
// floats; ostack may equal stack when there is a single chunk (osp = omerges = 0).
// seg: 0 for the fp32 kernels (gemm_kernel), which ignore it. The narrow kernels
// (narrow_gemm_kernel, seg >= 1) sum each block instead as core/base/numerics.h's narrow
// accumulation says: acc = +0; for each segment of seg products from the block's start,
// nacc = +0, then nacc = fma(a, b, nacc) with the low bits cleared (& kNarrowKeep) after every
// product, then acc = acc + nacc.
using TileFn = void (*)(const float* ap, const float* bp, i64 klen, i64 kb, i64 seg,
                        const unsigned char* merges, float* stack, float* ostack, int osp,
                        int omerges);

// The narrow accumulator keeps the sign, the exponent and 13 explicit mantissa bits of an fp32
// value: the low 10 mantissa bits are cleared, which rounds toward zero (truncation). A NaN stays
// NaN (fma's NaNs are quiet: bit 22 survives), an infinity stays infinite.
constexpr std::uint32_t kNarrowKeep = 0xFFFFFC00u;

// Pack one panel: dst[k·W + l] = src[l·ls + k·ks] for l < lanes and +0 for lanes <= l < W,
// for k < klen. ls is the stride between lanes, ks the stride along K.
using PackFn = void (*)(float* dst, const float* src, i64 ls, i64 ks, int lanes, int W, i64 klen);

// Write a finished tile s (rows of nr floats) to c (rows, cols), leading dimension ldc:
// c = s + bias[j] when bias is given, else c = c + s when accumulate, else c = s. One rounding
// per element, so every path gives the same bits.
using StoreFn = void (*)(float* c, i64 ldc, const float* s, int nr, int rows, int cols,
                         bool accumulate, const float* bias);

struct GemmKernel {
    int mr;         // rows of a tile (A panel width)
    int nr;         // columns of a tile (B panel width)
    TileFn tile;    // microkernel
    PackFn pack;    // panel packing (vectorised copy / transpose)
    StoreFn store;  // tile write-out
};

namespace scalar {
GemmKernel gemm_kernel();
GemmKernel narrow_gemm_kernel();
void store_tile(float* c, i64 ldc, const float* s, int nr, int rows, int cols, bool accumulate,
                const float* bias);
}  // namespace scalar
namespace avx2 {
GemmKernel gemm_kernel();
GemmKernel narrow_gemm_kernel();
}  // namespace avx2
namespace avx512 {
GemmKernel gemm_kernel();
GemmKernel narrow_gemm_kernel();
}  // namespace avx512

// c (M,N) = a·b (or +=, or bias[j] + … when bias (N) is given and accumulate is false) through
// oneDNN's sgemm, any summation order, cut into items that the OpenMP threads take dynamically
// (matmul_fast.cpp). Returns false when the strides cannot be expressed as a row-major sgemm
// (neither stride of an operand is 1); the caller then uses the canonical path. Throws px::Error
// when oneDNN fails on valid arguments (out of memory).
bool gemm_fast(float* c, i64 ldc, const float* a, i64 rsa, i64 csa, const float* b, i64 rsb,
               i64 csb, i64 M, i64 N, i64 K, bool accumulate, const float* bias = nullptr);

}  // namespace px::cpu
