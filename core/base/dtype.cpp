// Dtype conversions with integer bit manipulation only, so every CPU (with or without F16C) and
// every compiler produce the same bits.
//
// Encoding (f32 -> narrow) in one place: `round_magnitude` takes the bits of |x| (finite, nonzero)
// and returns the code of the nearest value in a format with `mbits` mantissa bits and exponent
// bias `bias`, rounding to nearest even, with an unbounded exponent at the top (the caller decides
// what overflow means) and exact gradual underflow at the bottom. A carry out of the mantissa
// moves into the exponent field, which is the right answer in both the normal and the subnormal
// range (the largest subnormal rounds up to the smallest normal).
#include "core/base/dtype.h"

#include "core/base/error.h"

#include <array>
#include <bit>
#include <cstring>
#include <utility>

namespace px {

namespace {

constexpr std::uint32_t kSignF32 = 0x80000000u;
constexpr std::uint32_t kAbsF32 = 0x7FFFFFFFu;
constexpr std::uint32_t kInfF32 = 0x7F800000u;
constexpr std::uint32_t kQuietF32 = 0x00400000u;

inline std::uint32_t bits_of(float x) { return std::bit_cast<std::uint32_t>(x); }
inline float float_of(std::uint32_t b) { return std::bit_cast<float>(b); }

// Shift v right by s (s >= 1) rounding to nearest, ties to even.
inline std::uint32_t shift_round_even(std::uint32_t v, int s) {
    if (s >= 32) return 0;  // callers only pass v < 2^24, so v < half an ulp at s >= 25 anyway
    const std::uint32_t q = v >> s;
    const std::uint32_t rem = v & ((1u << s) - 1u);
    const std::uint32_t half = 1u << (s - 1);
    return q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
}

// a: bits of |x|, finite and nonzero. Returns exponent/mantissa bits of the rounded magnitude in
// the target format; may exceed the format's largest finite code (overflow is the caller's).
inline std::uint32_t round_magnitude(std::uint32_t a, int mbits, int bias) {
    int e = static_cast<int>(a >> 23);  // biased f32 exponent
    std::uint32_t sig = a & 0x007FFFFFu;
    if (e == 0) {
        e = 1;  // f32 subnormal: value = sig * 2^(1-127-23)
    } else {
        sig |= 0x00800000u;  // value = sig * 2^(e-127-23)
    }
    const int et = e - 127 + bias;  // target biased exponent if the result is normal
    const int drop = 23 - mbits;    // mantissa bits removed in the normal range
    if (et >= 1) {
        // Normal: code = et << mbits | mantissa, rounding on the dropped bits. sig carries the
        // hidden bit at position 23, which after the shift lands at bit mbits and is absorbed by
        // subtracting it from the exponent field (so a carry rolls into the exponent).
        const std::uint32_t m = shift_round_even(sig, drop);  // in [2^mbits, 2^(mbits+1)]
        return (static_cast<std::uint32_t>(et - 1) << mbits) + m;
    }
    // Subnormal in the target: code = sig * 2^(e-127-23) / 2^(1-bias-mbits), exponent field 0.
    return shift_round_even(sig, drop + (1 - et));
}

inline std::uint32_t sign_of(std::uint32_t b, int to_bits) { return (b & kSignF32) >> (32 - to_bits); }

// Decode a narrow format with `ebits` exponent bits and `mbits` mantissa bits whose code is not a
// special (infinity / NaN): exact, by building the f32 bits.
inline float decode_finite(std::uint32_t sign, std::uint32_t exp, std::uint32_t man, int mbits, int bias) {
    const std::uint32_t s = sign << 31;
    if (exp == 0) {
        if (man == 0) return float_of(s);
        int e = 1 - bias;  // subnormal: man * 2^(1-bias-mbits); normalise the mantissa
        while ((man & (1u << mbits)) == 0) {
            man <<= 1;
            e--;
        }
        man &= (1u << mbits) - 1u;
        return float_of(s | static_cast<std::uint32_t>(e + 127) << 23 | man << (23 - mbits));
    }
    const int e = static_cast<int>(exp) - bias;
    return float_of(s | static_cast<std::uint32_t>(e + 127) << 23 | man << (23 - mbits));
}

}  // namespace

const char* dtype_name(DType t) {
    switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
    }
    return "?";
}

std::size_t dtype_size(DType t) {
    switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::e4m3: return 1;
    case DType::e5m2: return 1;
    }
    return 0;
}

std::optional<DType> dtype_from_name(std::string_view name) {
    for (int i = 0; i < kNumDTypes; i++) {
        const auto t = static_cast<DType>(i);
        if (name == dtype_name(t)) return t;
    }
    return std::nullopt;
}

// ---- bf16: 1.8.7, bias 127 ----

std::uint16_t f32_to_bf16(float x) {
    const std::uint32_t b = bits_of(x);
    const std::uint32_t a = b & kAbsF32;
    const std::uint32_t s = sign_of(b, 16);
    if (a > kInfF32) return static_cast<std::uint16_t>(s | 0x7FC0u | (a >> 16));  // quiet NaN
    if (a == kInfF32) return static_cast<std::uint16_t>(s | 0x7F80u);
    if (a == 0) return static_cast<std::uint16_t>(s);
    // Same exponent range as f32: rounding the low 16 bits is all; a carry into the exponent
    // field past 0x7F7F gives 0x7F80, infinity, which is the IEEE overflow result.
    return static_cast<std::uint16_t>(s | round_magnitude(a, 7, 127));
}

float bf16_to_f32(std::uint16_t h) {
    const std::uint32_t b = static_cast<std::uint32_t>(h) << 16;
    if ((b & kAbsF32) > kInfF32) return float_of(b | kQuietF32);
    return float_of(b);
}

// ---- fp16: 1.5.10, bias 15, max 65504 ----

std::uint16_t f32_to_f16(float x) {
    const std::uint32_t b = bits_of(x);
    const std::uint32_t a = b & kAbsF32;
    const std::uint32_t s = sign_of(b, 16);
    if (a > kInfF32) return static_cast<std::uint16_t>(s | 0x7E00u | ((a >> 13) & 0x03FFu));
    if (a == kInfF32) return static_cast<std::uint16_t>(s | 0x7C00u);
    if (a == 0) return static_cast<std::uint16_t>(s);
    std::uint32_t r = round_magnitude(a, 10, 15);
    if (r >= 0x7C00u) r = 0x7C00u;  // overflow to infinity
    return static_cast<std::uint16_t>(s | r);
}

float f16_to_f32(std::uint16_t h) {
    const std::uint32_t sign = h >> 15;
    const std::uint32_t exp = (h >> 10) & 0x1Fu;
    const std::uint32_t man = h & 0x03FFu;
    if (exp == 0x1Fu) {
        if (man == 0) return float_of(sign << 31 | kInfF32);
        return float_of(sign << 31 | kInfF32 | kQuietF32 | man << 13);
    }
    return decode_finite(sign, exp, man, 10, 15);
}

// ---- fp8 e4m3 (OCP): 1.4.3, bias 7, no infinity, max 448 = S.1111.110, NaN = S.1111.111 ----

std::uint8_t f32_to_e4m3(float x) {
    const std::uint32_t b = bits_of(x);
    const std::uint32_t a = b & kAbsF32;
    const std::uint32_t s = sign_of(b, 8);
    if (a > kInfF32) return static_cast<std::uint8_t>(s | 0x7Fu);
    if (a == 0) return static_cast<std::uint8_t>(s);
    if (a == kInfF32) return static_cast<std::uint8_t>(s | 0x7Eu);
    std::uint32_t r = round_magnitude(a, 3, 7);
    if (r > 0x7Eu) r = 0x7Eu;  // saturate: anything that rounds past 448 (or onto the NaN code)
    return static_cast<std::uint8_t>(s | r);
}

float e4m3_to_f32(std::uint8_t q) {
    const std::uint32_t sign = q >> 7;
    const std::uint32_t exp = (q >> 3) & 0x0Fu;
    const std::uint32_t man = q & 0x07u;
    if (exp == 0x0Fu && man == 0x07u) return float_of(sign << 31 | kInfF32 | kQuietF32);
    return decode_finite(sign, exp, man, 3, 7);
}

// ---- fp8 e5m2 (OCP): 1.5.2, bias 15, max 57344 = S.11110.11, inf S.11111.00, NaN S.11111.{01,10,11} ----

std::uint8_t f32_to_e5m2(float x, bool saturate) {
    const std::uint32_t b = bits_of(x);
    const std::uint32_t a = b & kAbsF32;
    const std::uint32_t s = sign_of(b, 8);
    if (a > kInfF32) return static_cast<std::uint8_t>(s | 0x7Eu);
    if (a == 0) return static_cast<std::uint8_t>(s);
    if (a == kInfF32) return static_cast<std::uint8_t>(s | (saturate ? 0x7Bu : 0x7Cu));
    std::uint32_t r = round_magnitude(a, 2, 15);
    if (r > 0x7Bu) r = saturate ? 0x7Bu : 0x7Cu;
    return static_cast<std::uint8_t>(s | r);
}

float e5m2_to_f32(std::uint8_t q) {
    const std::uint32_t sign = q >> 7;
    const std::uint32_t exp = (q >> 2) & 0x1Fu;
    const std::uint32_t man = q & 0x03u;
    if (exp == 0x1Fu) {
        if (man == 0) return float_of(sign << 31 | kInfF32);
        return float_of(sign << 31 | kInfF32 | kQuietF32 | man << 21);
    }
    return decode_finite(sign, exp, man, 2, 15);
}

float round_to(DType t, float x) {
    switch (t) {
    case DType::f32: return x;
    case DType::bf16: return bf16_to_f32(f32_to_bf16(x));
    case DType::f16: return f16_to_f32(f32_to_f16(x));
    case DType::e4m3: return e4m3_to_f32(f32_to_e4m3(x));
    case DType::e5m2: return e5m2_to_f32(f32_to_e5m2(x));
    }
    return x;
}

// ---- bulk ----

namespace {

inline float load_as_f32(const void* src, DType t, std::size_t i) {
    switch (t) {
    case DType::f32: return static_cast<const float*>(src)[i];
    case DType::bf16: return bf16_to_f32(static_cast<const std::uint16_t*>(src)[i]);
    case DType::f16: return f16_to_f32(static_cast<const std::uint16_t*>(src)[i]);
    case DType::e4m3: return e4m3_to_f32(static_cast<const std::uint8_t*>(src)[i]);
    case DType::e5m2: return e5m2_to_f32(static_cast<const std::uint8_t*>(src)[i]);
    }
    return 0.0f;
}

inline void store_from_f32(void* dst, DType t, std::size_t i, float x) {
    switch (t) {
    case DType::f32: static_cast<float*>(dst)[i] = x; return;
    case DType::bf16: static_cast<std::uint16_t*>(dst)[i] = f32_to_bf16(x); return;
    case DType::f16: static_cast<std::uint16_t*>(dst)[i] = f32_to_f16(x); return;
    case DType::e4m3: static_cast<std::uint8_t*>(dst)[i] = f32_to_e4m3(x); return;
    case DType::e5m2: static_cast<std::uint8_t*>(dst)[i] = f32_to_e5m2(x); return;
    }
}

template <DType D, DType S>
void convert_typed(void* dst, const void* src, std::size_t n) {
    const auto count = static_cast<std::int64_t>(n);
#pragma omp parallel for schedule(static) if (count > (1 << 16))
    for (std::int64_t i = 0; i < count; i++) {
        store_from_f32(dst, D, static_cast<std::size_t>(i), load_as_f32(src, S, static_cast<std::size_t>(i)));
    }
}

// bf16 <-> f32, the bulk conversions the 16-bit paths use most: f32_to_bf16 and bf16_to_f32
// written without branches (rounding on the bits, NaN chosen by a select), so that the compiler
// vectorises them; the same bits, NaN payloads included (tests/layouts/test_precision_fast.cpp).
template <>
void convert_typed<DType::bf16, DType::f32>(void* dst, const void* src, std::size_t n) {
    const auto count = static_cast<std::int64_t>(n);
    const auto* in = static_cast<const std::uint32_t*>(src);
    auto* out = static_cast<std::uint16_t*>(dst);
#pragma omp parallel for schedule(static) if (count > (1 << 16))
    for (std::int64_t i = 0; i < count; i++) {
        const std::uint32_t b = in[i];
        const std::uint32_t r = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
        const std::uint32_t q = (b >> 16) | 0x0040u;  // NaN: quiet, sign and payload kept
        out[i] = static_cast<std::uint16_t>((b & kAbsF32) > kInfF32 ? q : r);
    }
}

template <>
void convert_typed<DType::f32, DType::bf16>(void* dst, const void* src, std::size_t n) {
    const auto count = static_cast<std::int64_t>(n);
    const auto* in = static_cast<const std::uint16_t*>(src);
    auto* out = static_cast<std::uint32_t*>(dst);
#pragma omp parallel for schedule(static) if (count > (1 << 16))
    for (std::int64_t i = 0; i < count; i++) {
        const std::uint32_t b = static_cast<std::uint32_t>(in[i]) << 16;
        out[i] = (b & kAbsF32) > kInfF32 ? b | kQuietF32 : b;
    }
}

using ConvertFn = void (*)(void*, const void*, std::size_t);

template <DType D, std::size_t... S>
constexpr std::array<ConvertFn, kNumDTypes> row(std::index_sequence<S...>) {
    return {&convert_typed<D, static_cast<DType>(S)>...};
}

template <std::size_t... D>
constexpr std::array<std::array<ConvertFn, kNumDTypes>, kNumDTypes> table(std::index_sequence<D...>) {
    return {row<static_cast<DType>(D)>(std::make_index_sequence<kNumDTypes>{})...};
}

// kConvert[dst][src], each entry with the type switch resolved at compile time.
constexpr auto kConvert = table(std::make_index_sequence<kNumDTypes>{});

}  // namespace

void convert(void* dst, DType dst_type, const void* src, DType src_type, std::size_t n) {
    if (n == 0) return;
    PX_ASSERT(dst != nullptr && src != nullptr, "convert with a null pointer");
    const auto d = static_cast<std::size_t>(dst_type);
    const auto s = static_cast<std::size_t>(src_type);
    PX_ASSERT(d < kNumDTypes && s < kNumDTypes, "convert with an invalid dtype");
    if (dst_type == src_type) {
        if (dst != src) std::memmove(dst, src, n * dtype_size(dst_type));
        return;
    }
    kConvert[d][s](dst, src, n);
}

}  // namespace px
