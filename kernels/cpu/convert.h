// Bulk casts for the 16-bit and fp8 paths, one table per ISA (scalar, AVX-512). Not for use
// outside kernels/cpu (kernels/ops.h has the doors: fake_quant, fake_quant_tiles).
//
// Index
//   Convert               the table: bf16 widening, narrowing and rounding, fp8 fake quantisation
//   scalar::convert       core/base/dtype.h's functions, one element at a time (the reference)
//   avx512::convert       the same bits, 16 lanes at a time, by integer bit manipulation
//   convert_for           the table for an ISA (convert.cpp; AVX2 CPUs take the scalar table)
//   widen_bf16, ...       the table's routines over OpenMP threads (chunks of whole vectors)
//
// Every routine gives, element by element, the bits of core/base/dtype.h's scalar conversions
// (round to nearest even; bf16 overflows to infinity; fp8 saturates as the OCP spec says; NaNs
// as dtype.cpp makes them), so the fast paths and the bitwise paths cast alike
// (tests/layouts/test_precision.cpp checks the AVX-512 table against the scalar one on every exponent,
// the rounding boundaries and the specials).
//
// Like matmul_kernels.h this header includes nothing with inline std templates, because the
// AVX-512 translation unit includes it (see there).
#pragma once
#include "core/base/shapes.h"

#include <cstdint>

namespace px::cpu {

struct Convert {
    // dst (n) fp32 = src (n) bf16 (exact; a NaN comes back quiet)
    void (*widen_bf16)(float* dst, const std::uint16_t* src, i64 n);
    // dst (n) bf16 = src (n) fp32 rounded to nearest even
    void (*narrow_bf16)(std::uint16_t* dst, const float* src, i64 n);
    // dst (n) = round_to(bf16, src (n)): the fp32 value a bf16 cast keeps; dst may alias src
    void (*round_bf16)(float* dst, const float* src, i64 n);
    // max |x| over the elements of x (n) that are not NaN (+0 when there are none); *nan is set
    // to 1 when x holds a NaN (left alone otherwise)
    float (*absmax)(const float* x, i64 n, int* nan);
    // In place: x = decode(e4m3(x·scale))·inv (fp8 fake quantisation, saturating), resp. e5m2.
    // Returns absmax(x) of the values before the cast, with absmax's NaN rule.
    float (*quant_e4m3)(float* x, i64 n, float scale, float inv, int* nan);
    float (*quant_e5m2)(float* x, i64 n, float scale, float inv, int* nan);
};

namespace scalar {
extern const Convert convert;
}
namespace avx512 {
extern const Convert convert;
}

}  // namespace px::cpu
