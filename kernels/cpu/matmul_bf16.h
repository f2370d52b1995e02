// Fast-mode bf16 matmuls (the backend of precision.activations = "bf16" with numerics.mode =
// "fast"). Not for use outside kernels/ (kernels/ops.h: matmul_path says which path runs).
//
// Index
//   Bf16Path, bf16_path_name   oneDNN's bf16 matmul primitive, or fp32 sgemm on bf16 values
//   Bf16MatmulInfo             which path this CPU takes and why (cpuid, oneDNN's ISA and kernel)
//   bf16_matmul_info           detected once per process
//   matmul_*_bf16              the matmul of cpu_kernels.h on bf16 activations, on a given path
//
// The bf16 contract (kernels/cpu/bf16_backend.cpp) holds on both paths: a matmul's inputs are
// bf16 (the activations are; the fp32 weights are rounded to bf16, nearest even), the products
// are summed in fp32 (any order: fast mode), and each bf16 output is rounded once, nearest even:
//   out  = bf16(Σ inp·bf16(w) + bias)        dinp = bf16(dinp + Σ dout·bf16(w))
//   dweight (fp32) += Σ doutᵀ·inp            dbias (fp32) += Σ dout (canonical column sums)
// When every sum is exact in fp32 (small integers, as tests/layouts/test_precision.cpp uses), both paths
// therefore give exactly the bits of the reference backend.
//
// Which path (bf16_matmul_info): oneDNN's primitive when its ISA has bf16 instructions, AMX-BF16
// (avx512_core_amx) or AVX512_BF16 (avx512_core_bf16); otherwise sgemm. Measured on an Ice Lake
// Xeon without either (2 threads, GPT-2 124M shapes, bench/bench_matmul.cpp): oneDNN 2.6 then
// runs bf16 as "gemm:jit", emulating the bf16 products, at 58–65 GFLOP/s, while widening the
// bf16 operands to fp32 and calling sgemm runs at 130–230 GFLOP/s; so without bf16 instructions
// the sgemm path is taken. Primitives are made once per shape and kept (a process-wide cache).
#pragma once
#include "core/base/numerics.h"

#include <cstdint>
#include <string>

namespace px::cpu {

enum class Bf16Path : std::uint8_t { onednn, sgemm };
const char* bf16_path_name(Bf16Path p);  // "oneDNN bf16", "fp32 sgemm"

struct Bf16MatmulInfo {
    Bf16Path path = Bf16Path::sgemm;  // what fast-mode bf16 matmuls run on this CPU
    bool amx_bf16 = false;            // cpuid: AMX-BF16 (and AMX-TILE)
    bool avx512_bf16 = false;         // cpuid: AVX512_BF16
    std::string onednn_isa;           // dnnl_get_effective_cpu_isa, e.g. "avx512_core_amx"
    std::string onednn_impl;          // oneDNN's kernel for a GPT-2-sized bf16 matmul here
    std::string text;                 // one line for start-up output and benchmarks
};
const Bf16MatmulInfo& bf16_matmul_info();

// out (BT,OC) bf16, inp (BT,C) bf16, weight (OC,C) fp32, bias (OC) fp32 or null
void matmul_forward_bf16(const Numerics& nx, Bf16Path path, std::uint16_t* out,
                         const std::uint16_t* inp, const float* weight, const float* bias, i64 BT,
                         i64 C, i64 OC);
// dinp (BT,C) bf16, dweight (OC,C) fp32, dbias (OC) fp32 (each null: not computed);
// dout (BT,OC) bf16, inp (BT,C) bf16, weight (OC,C) fp32
void matmul_backward_bf16(const Numerics& nx, Bf16Path path, std::uint16_t* dinp, float* dweight,
                          float* dbias, const std::uint16_t* dout, const std::uint16_t* inp,
                          const float* weight, i64 BT, i64 C, i64 OC);

}  // namespace px::cpu
