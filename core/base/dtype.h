// Dtypes and conversions.
//
// Index
//   DType, dtype_name, dtype_size     the element types a tensor can hold
//   dtype_from_name                   the inverse of dtype_name
//   bf16 / fp16 / fp8 conversions     float -> narrow rounds to nearest even; narrow -> float exact
//   round_to                          float -> narrow -> float in one call (the value a cast keeps)
//   kE4M3Max, kE5M2Max, ...           the largest finite value of each narrow type
//
// Rules (part of the numerics contract, docs/numerics.md):
//   bf16, fp16: round to nearest even; overflow goes to infinity; NaN stays NaN (quiet).
//   fp8 e4m3 (OCP): no infinity; max finite 448; out-of-range values and infinities saturate to
//                   +-448; NaN maps to the NaN pattern S.1111.111.
//   fp8 e5m2 (OCP): IEEE-like with infinities; max finite 57344; in saturating mode (the default
//                   for training casts) finite overflow and infinities saturate to +-57344; NaN stays NaN.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace px {

enum class DType : std::uint8_t { f32, bf16, f16, e4m3, e5m2 };
inline constexpr int kNumDTypes = 5;

const char* dtype_name(DType t);  // "f32", "bf16", "f16", "e4m3", "e5m2"
std::size_t dtype_size(DType t);  // bytes per element
std::optional<DType> dtype_from_name(std::string_view name);  // inverse of dtype_name; nullopt if unknown

inline constexpr float kBF16Max = 3.38953139e38f;  // 0x7F7F
inline constexpr float kF16Max = 65504.0f;         // 0x7BFF
inline constexpr float kE4M3Max = 448.0f;          // 0x7E
inline constexpr float kE5M2Max = 57344.0f;        // 0x7B

std::uint16_t f32_to_bf16(float x);
float bf16_to_f32(std::uint16_t h);
std::uint16_t f32_to_f16(float x);
float f16_to_f32(std::uint16_t h);
std::uint8_t f32_to_e4m3(float x);              // saturating
float e4m3_to_f32(std::uint8_t q);
std::uint8_t f32_to_e5m2(float x, bool saturate = true);
float e5m2_to_f32(std::uint8_t q);

// The value x keeps after a cast to t and back (f32: x itself; e5m2 saturating).
float round_to(DType t, float x);

// Bulk conversions (the same rounding as the scalar functions above). Any pair of types goes
// through an exact f32 intermediate, so narrow -> narrow rounds once; e5m2 saturates. dst and src
// must not overlap unless they are the same pointer with the same type.
void convert(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n);

}  // namespace px
