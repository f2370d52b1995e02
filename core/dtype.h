// Dtypes and conversions.
//
// Index
//   DType, dtype_name, dtype_size     the element types a tensor can hold
//   bf16 / fp16 / fp8 conversions     float -> narrow rounds to nearest even; narrow -> float exact
//
// Rules (DESIGN.md §2.6):
//   bf16, fp16: round to nearest even; overflow goes to infinity; NaN stays NaN (quiet).
//   fp8 e4m3 (OCP): no infinity; max finite 448; out-of-range values and infinities saturate to
//                   +-448; NaN maps to the NaN pattern S.1111.111.
//   fp8 e5m2 (OCP): IEEE-like with infinities; max finite 57344; in saturating mode (the default
//                   for training casts) finite overflow and infinities saturate to +-57344; NaN stays NaN.
#pragma once
#include <cstddef>
#include <cstdint>

namespace px {

enum class DType : std::uint8_t { f32, bf16, f16, e4m3, e5m2 };
inline constexpr int kNumDTypes = 5;

const char* dtype_name(DType t);  // "f32", "bf16", "f16", "e4m3", "e5m2"
std::size_t dtype_size(DType t);  // bytes per element

std::uint16_t f32_to_bf16(float x);
float bf16_to_f32(std::uint16_t h);
std::uint16_t f32_to_f16(float x);
float f16_to_f32(std::uint16_t h);
std::uint8_t f32_to_e4m3(float x);              // saturating
float e4m3_to_f32(std::uint8_t q);
std::uint8_t f32_to_e5m2(float x, bool saturate = true);
float e5m2_to_f32(std::uint8_t q);

// Bulk conversions (the same rounding as the scalar functions above).
void convert(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n);

}  // namespace px
