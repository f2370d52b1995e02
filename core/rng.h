// Counter-based random numbers: Philox 4x32-10 (Salmon et al., SC'11).
//
// Every random number is a pure function of (seed, tensor id, logical element index, stream), so a
// shard of a tensor draws exactly the numbers the whole tensor would (DESIGN.md §2.3).
//
// Index
//   philox4x32_10      the raw block function
//   uniform_at         one uniform in (0, 1) for a logical position
//   normal_at          one standard normal for a logical position
//   fill_normal        a slice [first, first+n) of a tensor's normal initialisation
//   fill_uniform       a slice [first, first+n) of a tensor's uniform draws
#pragma once
#include "core/shapes.h"

#include <array>
#include <cstdint>

namespace px {

using u32 = std::uint32_t;
using u64 = std::uint64_t;

std::array<u32, 4> philox4x32_10(std::array<u32, 4> counter, std::array<u32, 2> key);

double uniform_at(u64 seed, u32 tensor_id, u64 index, u32 stream = 0);  // in (0, 1)
double normal_at(u64 seed, u32 tensor_id, u64 index, u32 stream = 0);   // N(0, 1)

void fill_normal(float* out, i64 n, float mean, float std, u64 seed, u32 tensor_id, u64 first_index);
void fill_uniform(float* out, i64 n, float lo, float hi, u64 seed, u32 tensor_id, u64 first_index);

}  // namespace px
