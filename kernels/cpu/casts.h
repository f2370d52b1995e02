// Bulk casts over OpenMP threads, on the ISA tables of convert.h. Not for use outside kernels/
// (kernels/ops.h: fake_quant, fake_quant_tiles).
//
// Index
//   convert_for                     the Convert table for an ISA (AVX2 CPUs: the scalar one)
//   widen_bf16, narrow_bf16, round_bf16   bf16 <-> fp32, threaded
//   fake_quant                      fp8 delayed scaling's cast of one tensor, in place
//   fake_quant_tiles                fp8 block-wise scaling's cast, tile by tile, in place
//
// Threads split elements (or tiles), never change a bit: each element's cast is independent, and
// the only reduction, an amax, is a max (exact in any order).
#pragma once
#include "core/base/dtype.h"
#include "core/base/numerics.h"
#include "kernels/cpu/convert.h"

namespace px::cpu {

const Convert& convert_for(Isa isa);

void widen_bf16(Isa isa, float* dst, const std::uint16_t* src, i64 n);
void narrow_bf16(Isa isa, std::uint16_t* dst, const float* src, i64 n);
void round_bf16(Isa isa, float* dst, const float* src, i64 n);  // dst may alias src

// x (n) = decode(t(x·scale))·inv in place, t = e4m3 or e5m2 (saturating). Returns max |x| of the
// values before the cast over those that are not NaN; *nan: whether x held a NaN.
float fake_quant(Isa isa, float* x, i64 n, DType t, float scale, float inv, bool* nan);

// x (R,K) row-major, in place, cut into tiles of `band` rows by b columns (the last ones may be
// short): each tile cast to e4m3 with its own scale s = 448 / amax(tile) and read back as
// e4m3(x·s)·(1/s); s = 1 for a tile whose amax is 0, or that holds an inf or a NaN, or whose s
// is not finite (core/model/fp8.h, block-wise current scaling).
void fake_quant_tiles(Isa isa, float* x, i64 R, i64 K, i64 band, i64 b);

}  // namespace px::cpu
