// Counter-based random numbers: Philox 4x32-10 (Salmon et al., SC'11).
//
// Every random number is a pure function of (seed, tensor id, logical element index, stream), so a
// shard of a tensor draws exactly the numbers the whole tensor would (docs/numerics.md).
//
// Index
//   philox4x32_10      the raw block function
//   philox_at          the block for (seed, tensor id, index, stream)
//   uniform_at         one uniform in (0, 1) for a logical position
//   normal_at          one standard normal for a logical position
//   fill_normal        a slice [first, first+n) of a tensor's normal initialisation
//   fill_uniform       a slice [first, first+n) of a tensor's uniform draws
#pragma once
#include "core/base/shapes.h"

#include <array>
#include <cstdint>

namespace px {

using u32 = std::uint32_t;
using u64 = std::uint64_t;

std::array<u32, 4> philox4x32_10(std::array<u32, 4> counter, std::array<u32, 2> key);

// The block for a logical position: key = (seed lo32, seed hi32),
// counter = (index lo32, index hi32, tensor_id, stream).
std::array<u32, 4> philox_at(u64 seed, u32 tensor_id, u64 index, u32 stream = 0);

// Words (x0, x1) of the block: 52 random bits k, value (k + 0.5) / 2^52, so never 0 or 1, and
// symmetric about 1/2 (53 significant bits, every value exact).
double uniform_at(u64 seed, u32 tensor_id, u64 index, u32 stream = 0);  // in (0, 1)
// Box-Muller in double: u1 from words (x0, x1), u2 from (x2, x3) of the same block;
// sqrt(-2 ln u1) * cos(2 pi u2). One normal per logical element.
double normal_at(u64 seed, u32 tensor_id, u64 index, u32 stream = 0);   // N(0, 1)

// out[i] = float(mean + std * normal_at(seed, tensor_id, first_index + i, stream)), computed in
// double and rounded once; element by element, so any slice equals the same part of the whole.
void fill_normal(float* out, i64 n, float mean, float std, u64 seed, u32 tensor_id, u64 first_index,
                 u32 stream = 0);
// out[i] = float(lo + (hi - lo) * uniform_at(...)), in double, rounded once (the float rounding can
// reach lo or hi themselves).
void fill_uniform(float* out, i64 n, float lo, float hi, u64 seed, u32 tensor_id, u64 first_index,
                  u32 stream = 0);

}  // namespace px
