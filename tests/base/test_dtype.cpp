// Dtype conversions, tested exhaustively against plain references written here.
//
// Decoding: every 8-bit (e4m3, e5m2) and 16-bit (bf16, fp16) pattern against sign * 2^e * (1 + m/2^M)
// computed with ldexp. Encoding: round trip of every value, midpoints of every adjacent pair and
// their float neighbours, overflow / saturation, NaN, signed zero, and a sweep of ~1e6 float
// patterns per format against a nearest-value search over the decoded table (ties to even).
#include "core/base/dtype.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace px;

namespace {

// ---- format descriptions for the references ----

struct Format {
    const char* name;
    int ebits, mbits, bias;
    bool has_inf;        // exponent all ones is inf/NaN (bf16, f16, e5m2); e4m3: only S.1111.111 is NaN
    int bits;            // 8 or 16
    double max_finite;   // largest finite value
    bool saturate;       // overflow saturates to max_finite instead of going to infinity
};

const Format kBF16{"bf16", 8, 7, 127, true, 16, 3.38953138925153547590470800371487866880e38, false};
const Format kF16{"f16", 5, 10, 15, true, 16, 65504.0, false};
const Format kE4M3{"e4m3", 4, 3, 7, false, 8, 448.0, true};
const Format kE5M2{"e5m2", 5, 2, 15, true, 8, 57344.0, true};
const Format kE5M2NoSat{"e5m2 (no saturation)", 5, 2, 15, true, 8, 57344.0, false};

// Plain reference decoder: what the bit fields mean, computed in double with ldexp.
double ref_decode(const Format& f, std::uint32_t code) {
    const std::uint32_t sign = (code >> (f.ebits + f.mbits)) & 1u;
    const std::uint32_t exp = (code >> f.mbits) & ((1u << f.ebits) - 1u);
    const std::uint32_t man = code & ((1u << f.mbits) - 1u);
    const std::uint32_t emax_field = (1u << f.ebits) - 1u;
    const double s = sign ? -1.0 : 1.0;
    if (f.has_inf && exp == emax_field) {
        if (man == 0) return s * std::numeric_limits<double>::infinity();
        return std::numeric_limits<double>::quiet_NaN();
    }
    if (!f.has_inf && exp == emax_field && man == (1u << f.mbits) - 1u) return std::numeric_limits<double>::quiet_NaN();
    const double frac = static_cast<double>(man) / static_cast<double>(1u << f.mbits);
    if (exp == 0) return s * std::ldexp(frac, 1 - f.bias);
    return s * std::ldexp(1.0 + frac, static_cast<int>(exp) - f.bias);
}

float decode(const Format& f, std::uint32_t code) {
    const auto h = static_cast<std::uint16_t>(code);
    const auto q = static_cast<std::uint8_t>(code);
    if (f.bits == 16) return f.ebits == 8 ? bf16_to_f32(h) : f16_to_f32(h);
    return f.ebits == 4 ? e4m3_to_f32(q) : e5m2_to_f32(q);
}

std::uint32_t encode(const Format& f, float x) {
    if (f.bits == 16) return f.ebits == 8 ? f32_to_bf16(x) : f32_to_f16(x);
    if (f.ebits == 4) return f32_to_e4m3(x);
    return f32_to_e5m2(x, f.saturate);
}

std::uint32_t fbits(float x) { return std::bit_cast<std::uint32_t>(x); }

std::string hex(std::uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", v);
    return buf;
}

// The sorted non-negative finite values of a format with their codes (positive codes are
// monotonic in value, so this is codes 0 .. code of max_finite).
struct Entry {
    double value;
    std::uint32_t code;
};

std::vector<Entry> positive_table(const Format& f) {
    std::vector<Entry> t;
    const std::uint32_t n = 1u << (f.bits - 1);
    for (std::uint32_t c = 0; c < n; c++) {
        const double v = ref_decode(f, c);
        if (std::isfinite(v)) t.push_back({v, c});
    }
    for (std::size_t i = 1; i < t.size(); i++) REQUIRE(t[i - 1].value < t[i].value);
    REQUIRE(t.back().value == f.max_finite);
    return t;
}

std::uint32_t sign_bit(const Format& f) { return 1u << (f.bits - 1); }

// Plain reference encoder for a finite or infinite float: nearest entry of the table, ties to the
// even code, with the format's overflow rule. `linear` searches the whole table entry by entry.
std::uint32_t ref_encode(const Format& f, const std::vector<Entry>& table, float x, bool linear) {
    const std::uint32_t sgn = std::signbit(x) ? sign_bit(f) : 0u;
    const double a = std::fabs(static_cast<double>(x));
    const std::uint32_t inf_code = (((1u << f.ebits) - 1u) << f.mbits);
    // Overflow: above max_finite the next step would be max_finite + ulp(max); halfway to it and
    // beyond goes to infinity (ties go to the even, infinite, side because max has an odd mantissa).
    const double ulp_max = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(f.max_finite))) - f.mbits);
    if (f.saturate) {
        if (a > f.max_finite) return sgn | table.back().code;
    } else {
        if (a >= f.max_finite + ulp_max / 2) return sgn | inf_code;
    }
    std::size_t best = 0;
    if (linear) {
        double best_d = std::numeric_limits<double>::infinity();
        for (std::size_t i = 0; i < table.size(); i++) {
            const double d = std::fabs(a - table[i].value);
            if (d < best_d || (d == best_d && (table[i].code & 1u) == 0)) {
                best_d = d;
                best = i;
            }
        }
    } else {
        const auto it = std::lower_bound(table.begin(), table.end(), a,
                                         [](const Entry& e, double v) { return e.value < v; });
        const std::size_t hi = static_cast<std::size_t>(it - table.begin());
        if (hi == table.size()) {
            best = table.size() - 1;
        } else if (hi == 0 || table[hi].value == a) {
            best = hi;
        } else {
            const double dl = a - table[hi - 1].value, dh = table[hi].value - a;
            if (dl < dh) best = hi - 1;
            else if (dh < dl) best = hi;
            else best = (table[hi].code & 1u) == 0 ? hi : hi - 1;
        }
    }
    return sgn | table[best].code;
}

bool is_nan_code(const Format& f, std::uint32_t code) { return std::isnan(ref_decode(f, code)); }

// Counts mismatches and remembers the first few, so a failing sweep reports a handful of cases.
struct Mismatches {
    int count = 0;
    std::string first;
    void add(const std::string& what) {
        if (count++ < 5) first += what + "\n";
    }
};

const Format* const kAllFormats[] = {&kBF16, &kF16, &kE4M3, &kE5M2, &kE5M2NoSat};

}  // namespace

TEST_CASE("dtype names, sizes and limits", "[dtype]") {
    CHECK(std::string(dtype_name(DType::f32)) == "f32");
    CHECK(std::string(dtype_name(DType::bf16)) == "bf16");
    CHECK(std::string(dtype_name(DType::f16)) == "f16");
    CHECK(std::string(dtype_name(DType::e4m3)) == "e4m3");
    CHECK(std::string(dtype_name(DType::e5m2)) == "e5m2");
    CHECK(dtype_size(DType::f32) == 4);
    CHECK(dtype_size(DType::bf16) == 2);
    CHECK(dtype_size(DType::f16) == 2);
    CHECK(dtype_size(DType::e4m3) == 1);
    CHECK(dtype_size(DType::e5m2) == 1);
    for (int i = 0; i < kNumDTypes; i++) {
        const auto t = static_cast<DType>(i);
        REQUIRE(dtype_from_name(dtype_name(t)).has_value());
        CHECK(*dtype_from_name(dtype_name(t)) == t);
    }
    CHECK_FALSE(dtype_from_name("fp8").has_value());
    CHECK(fbits(kBF16Max) == 0x7F7F0000u);
    CHECK(kF16Max == f16_to_f32(0x7BFF));
    CHECK(kE4M3Max == e4m3_to_f32(0x7E));
    CHECK(kE5M2Max == e5m2_to_f32(0x7B));
}

TEST_CASE("decode every pattern against the reference decoder", "[dtype]") {
    for (const Format* f : kAllFormats) {
        Mismatches bad;
        const std::uint32_t n = 1u << f->bits;
        for (std::uint32_t c = 0; c < n; c++) {
            const double want = ref_decode(*f, c);
            const float got = decode(*f, c);
            if (std::isnan(want)) {
                if (!std::isnan(got)) bad.add(hex(c) + " should decode to NaN");
                // A NaN keeps its sign.
                if (std::signbit(got) != bool(c & sign_bit(*f))) bad.add(hex(c) + " NaN lost its sign");
                continue;
            }
            // want is exactly representable as float (every narrow value is); compare bits so the
            // sign of zero counts.
            if (fbits(static_cast<float>(want)) != fbits(got))
                bad.add(std::string(f->name) + " " + hex(c) + " decodes to " + std::to_string(got));
        }
        INFO(f->name << ":\n" << bad.first);
        CHECK(bad.count == 0);
    }
    // A few hand-checked values, as a check on the reference itself.
    CHECK(e4m3_to_f32(0x7E) == 448.0f);
    CHECK(e4m3_to_f32(0x01) == std::ldexp(1.0f, -9));
    CHECK(e4m3_to_f32(0x08) == std::ldexp(1.0f, -6));
    CHECK(std::isnan(e4m3_to_f32(0x7F)));
    CHECK(std::isnan(e4m3_to_f32(0xFF)));
    CHECK(e4m3_to_f32(0x78) == 256.0f);  // S.1111.000 is a normal number in e4m3
    CHECK(e5m2_to_f32(0x7B) == 57344.0f);
    CHECK(std::isinf(e5m2_to_f32(0x7C)));
    CHECK(e5m2_to_f32(0x01) == std::ldexp(1.0f, -16));
    CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
    CHECK(f16_to_f32(0x3C00) == 1.0f);
    CHECK(f16_to_f32(0xC000) == -2.0f);
    CHECK(bf16_to_f32(0x3F80) == 1.0f);
    CHECK(bf16_to_f32(0x0001) == std::ldexp(1.0f, -133));
}

TEST_CASE("every representable value round-trips", "[dtype]") {
    for (const Format* f : kAllFormats) {
        Mismatches bad;
        const std::uint32_t n = 1u << f->bits;
        for (std::uint32_t c = 0; c < n; c++) {
            if (is_nan_code(*f, c)) continue;
            const float v = decode(*f, c);
            std::uint32_t want = c;
            if (std::isinf(v) && f->saturate) want = (c & sign_bit(*f)) | 0x7Bu;  // e5m2 saturating
            const std::uint32_t got = encode(*f, v);
            if (got != want) bad.add(hex(c) + " -> " + hex(got));
        }
        INFO(f->name << ":\n" << bad.first);
        CHECK(bad.count == 0);
    }
}

TEST_CASE("midpoints of adjacent values round to even; their neighbours round to the nearer", "[dtype]") {
    for (const Format* f : kAllFormats) {
        const auto table = positive_table(*f);
        Mismatches bad;
        for (std::size_t i = 0; i + 1 < table.size(); i++) {
            const double lo = table[i].value, hi = table[i + 1].value;
            const float mid = static_cast<float>((lo + hi) / 2);
            REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);  // one more bit always fits in f32
            const std::uint32_t even = (table[i].code & 1u) == 0 ? table[i].code : table[i + 1].code;
            const float below = std::nextafter(mid, 0.0f), above = std::nextafter(mid, INFINITY);
            for (const std::uint32_t s : {0u, sign_bit(*f)}) {
                const float m = s ? -mid : mid, b = s ? -below : below, a = s ? -above : above;
                if (encode(*f, m) != (s | even)) bad.add("midpoint " + std::to_string(m) + " -> " + hex(encode(*f, m)));
                if (encode(*f, b) != (s | table[i].code)) bad.add("below midpoint " + std::to_string(b));
                if (encode(*f, a) != (s | table[i + 1].code)) bad.add("above midpoint " + std::to_string(a));
                // The values themselves and their immediate float neighbours stay put.
                const float vl = static_cast<float>(lo), vh = static_cast<float>(hi);
                const float up = std::nextafter(vl, INFINITY), down = std::nextafter(vh, 0.0f);
                if (encode(*f, s ? -up : up) != (s | table[i].code)) bad.add("just above " + std::to_string(vl));
                if (encode(*f, s ? -down : down) != (s | table[i + 1].code)) bad.add("just below " + std::to_string(vh));
            }
        }
        INFO(f->name << ":\n" << bad.first);
        CHECK(bad.count == 0);
    }
}

TEST_CASE("overflow and saturation", "[dtype]") {
    const float inf = std::numeric_limits<float>::infinity();
    const float fmax = std::numeric_limits<float>::max();
    SECTION("bf16 overflows to infinity past max + ulp/2 (tie goes to infinity)") {
        const float max = bf16_to_f32(0x7F7F);
        const float half_ulp_above = std::ldexp(1.0f, 127) * (2.0f - std::ldexp(1.0f, -8));  // max + ulp/2
        CHECK(f32_to_bf16(max) == 0x7F7F);
        CHECK(f32_to_bf16(std::nextafter(half_ulp_above, 0.0f)) == 0x7F7F);
        CHECK(f32_to_bf16(half_ulp_above) == 0x7F80);
        CHECK(f32_to_bf16(fmax) == 0x7F80);
        CHECK(f32_to_bf16(-fmax) == 0xFF80);
        CHECK(f32_to_bf16(inf) == 0x7F80);
        CHECK(f32_to_bf16(-inf) == 0xFF80);
    }
    SECTION("fp16 overflows to infinity from 65520") {
        CHECK(f32_to_f16(65504.0f) == 0x7BFF);
        CHECK(f32_to_f16(65519.996f) == 0x7BFF);
        CHECK(f32_to_f16(65520.0f) == 0x7C00);
        CHECK(f32_to_f16(-65520.0f) == 0xFC00);
        CHECK(f32_to_f16(1e10f) == 0x7C00);
        CHECK(f32_to_f16(fmax) == 0x7C00);
        CHECK(f32_to_f16(inf) == 0x7C00);
        CHECK(f32_to_f16(-inf) == 0xFC00);
    }
    SECTION("e4m3 saturates to +-448, infinities included") {
        CHECK(f32_to_e4m3(448.0f) == 0x7E);
        CHECK(f32_to_e4m3(464.0f) == 0x7E);  // would round to the NaN code's 480
        CHECK(f32_to_e4m3(480.0f) == 0x7E);
        CHECK(f32_to_e4m3(1e6f) == 0x7E);
        CHECK(f32_to_e4m3(fmax) == 0x7E);
        CHECK(f32_to_e4m3(-1e6f) == 0xFE);
        CHECK(f32_to_e4m3(inf) == 0x7E);
        CHECK(f32_to_e4m3(-inf) == 0xFE);
    }
    SECTION("e5m2 saturating and not") {
        CHECK(f32_to_e5m2(57344.0f) == 0x7B);
        CHECK(f32_to_e5m2(61440.0f) == 0x7B);
        CHECK(f32_to_e5m2(1e9f) == 0x7B);
        CHECK(f32_to_e5m2(-1e9f) == 0xFB);
        CHECK(f32_to_e5m2(inf) == 0x7B);
        CHECK(f32_to_e5m2(-inf) == 0xFB);
        CHECK(f32_to_e5m2(57344.0f, false) == 0x7B);
        CHECK(f32_to_e5m2(std::nextafter(61440.0f, 0.0f), false) == 0x7B);
        CHECK(f32_to_e5m2(61440.0f, false) == 0x7C);
        CHECK(f32_to_e5m2(-61440.0f, false) == 0xFC);
        CHECK(f32_to_e5m2(inf, false) == 0x7C);
        CHECK(f32_to_e5m2(-inf, false) == 0xFC);
    }
}

TEST_CASE("NaN and signed zero", "[dtype]") {
    const float qnan = std::numeric_limits<float>::quiet_NaN();
    const float snan = std::numeric_limits<float>::signaling_NaN();
    const float nans[] = {qnan, -qnan, snan, -snan, std::bit_cast<float>(0x7F800001u),
                          std::bit_cast<float>(0xFFFFFFFFu), std::bit_cast<float>(0x7FBFFFFFu)};
    for (const float x : nans) {
        INFO(hex(fbits(x)));
        const bool neg = std::signbit(x);
        CHECK(std::isnan(bf16_to_f32(f32_to_bf16(x))));
        CHECK(std::isnan(f16_to_f32(f32_to_f16(x))));
        CHECK(f32_to_e4m3(x) == (neg ? 0xFF : 0x7F));
        CHECK(std::isnan(e5m2_to_f32(f32_to_e5m2(x))));
        CHECK(std::isnan(e5m2_to_f32(f32_to_e5m2(x, false))));
        // Quiet NaN out: the quiet bit of the f32 result is set.
        CHECK((fbits(bf16_to_f32(f32_to_bf16(x))) & 0x00400000u) != 0);
        CHECK((fbits(f16_to_f32(f32_to_f16(x))) & 0x00400000u) != 0);
        CHECK(std::signbit(bf16_to_f32(f32_to_bf16(x))) == neg);
        CHECK(std::signbit(f16_to_f32(f32_to_f16(x))) == neg);
    }
    CHECK(f32_to_bf16(0.0f) == 0x0000);
    CHECK(f32_to_bf16(-0.0f) == 0x8000);
    CHECK(f32_to_f16(0.0f) == 0x0000);
    CHECK(f32_to_f16(-0.0f) == 0x8000);
    CHECK(f32_to_e4m3(0.0f) == 0x00);
    CHECK(f32_to_e4m3(-0.0f) == 0x80);
    CHECK(f32_to_e5m2(0.0f) == 0x00);
    CHECK(f32_to_e5m2(-0.0f) == 0x80);
    CHECK(fbits(e4m3_to_f32(0x80)) == 0x80000000u);
    CHECK(fbits(e5m2_to_f32(0x80)) == 0x80000000u);
    CHECK(fbits(f16_to_f32(0x8000)) == 0x80000000u);
    CHECK(fbits(bf16_to_f32(0x8000)) == 0x80000000u);
    // Underflow keeps the sign: tiny negatives become -0.
    CHECK(f32_to_e4m3(-1e-30f) == 0x80);
    CHECK(f32_to_f16(-1e-30f) == 0x8000);
    CHECK(f32_to_bf16(-std::numeric_limits<float>::denorm_min()) == 0x8000);
    // Half the smallest subnormal ties to 0; just above it rounds up.
    CHECK(f32_to_e4m3(std::ldexp(1.0f, -10)) == 0x00);
    CHECK(f32_to_e4m3(std::nextafter(std::ldexp(1.0f, -10), 1.0f)) == 0x01);
    CHECK(f32_to_f16(std::ldexp(1.0f, -25)) == 0x0000);
    CHECK(f32_to_f16(std::ldexp(3.0f, -26)) == 0x0001);
}

TEST_CASE("random sweep against the reference encoder", "[dtype]") {
    std::mt19937_64 rng(20240601);
    for (const Format* f : kAllFormats) {
        const auto table = positive_table(*f);
        // Exhaustive scan of the table for fp8; binary search for the 16-bit tables (checked
        // against the exhaustive scan on the first few thousand samples).
        const bool linear = f->bits == 8;
        const int n = 1000000;
        const int emin = 1 - f->bias - f->mbits, emax = static_cast<int>(std::log2(f->max_finite));
        Mismatches bad;
        for (int i = 0; i < n; i++) {
            float x;
            if (i % 2 == 0) {
                x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));  // any pattern
            } else {
                // A pattern whose magnitude is within the format's range (and a little beyond).
                const std::uint64_t r = rng();
                const int e = emin - 3 + static_cast<int>(r % static_cast<std::uint64_t>(emax - emin + 6));
                const std::uint32_t man = static_cast<std::uint32_t>(r >> 32) & 0x007FFFFFu;
                const std::uint32_t sign = static_cast<std::uint32_t>(r >> 63) << 31;
                x = std::ldexp(std::bit_cast<float>(0x3F800000u | man), e);  // may land in f32 subnormals
                x = std::bit_cast<float>(fbits(x) | sign);
            }
            const std::uint32_t got = encode(*f, x);
            if (std::isnan(x)) {
                if (!is_nan_code(*f, got)) bad.add("NaN " + hex(fbits(x)) + " -> " + hex(got));
                continue;
            }
            const std::uint32_t want = ref_encode(*f, table, x, linear);
            if (got != want) bad.add(hex(fbits(x)) + " -> " + hex(got) + ", reference " + hex(want));
            // The binary search of the 16-bit reference agrees with the exhaustive scan.
            if (!linear && i < 4000 && ref_encode(*f, table, x, true) != want)
                bad.add("reference search " + hex(fbits(x)));
        }
        INFO(f->name << ":\n" << bad.first);
        CHECK(bad.count == 0);
    }
}

#ifdef __FLT16_MAX__
TEST_CASE("fp16 agrees with the compiler's _Float16 conversion", "[dtype]") {
    // An independent implementation (libgcc / the CPU), for every fp16 value's neighbourhood and
    // random floats. NaNs are left out (payloads may differ legitimately).
    std::mt19937 rng(7);
    Mismatches bad;
    for (int i = 0; i < 2000000; i++) {
        const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
        if (std::isnan(x)) continue;
        const auto want = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
        if (f32_to_f16(x) != want) bad.add(hex(fbits(x)));
        if (x == 0.0f || std::isinf(x)) continue;
        const float y = std::ldexp(x, -std::ilogb(x) + static_cast<int>(rng() % 48) - 30);  // near fp16 range
        const auto want_y = std::bit_cast<std::uint16_t>(static_cast<_Float16>(y));
        if (f32_to_f16(y) != want_y) bad.add(hex(fbits(y)));
    }
    INFO(bad.first);
    CHECK(bad.count == 0);
}
#endif

TEST_CASE("bulk convert matches the scalar functions for every pair of types", "[dtype]") {
    // Source data: every 16-bit pattern as bf16/f16, every byte as fp8, and floats covering all.
    const std::size_t n = 1u << 16;
    std::vector<float> f32(n);
    std::mt19937 rng(3);
    for (std::size_t i = 0; i < n; i++) f32[i] = std::bit_cast<float>(static_cast<std::uint32_t>(rng()) >> (i % 5));
    std::vector<std::uint16_t> h(n);
    for (std::size_t i = 0; i < n; i++) h[i] = static_cast<std::uint16_t>(i);
    std::vector<std::uint8_t> q(n);
    for (std::size_t i = 0; i < n; i++) q[i] = static_cast<std::uint8_t>(i);
    auto src_of = [&](DType t) -> const void* {
        switch (t) {
        case DType::f32: return f32.data();
        case DType::bf16:
        case DType::f16: return h.data();
        default: return q.data();
        }
    };
    auto scalar_to_f32 = [&](DType t, std::size_t i) -> float {
        switch (t) {
        case DType::f32: return f32[i];
        case DType::bf16: return bf16_to_f32(h[i]);
        case DType::f16: return f16_to_f32(h[i]);
        case DType::e4m3: return e4m3_to_f32(q[i]);
        case DType::e5m2: return e5m2_to_f32(q[i]);
        }
        return 0;
    };
    for (int s = 0; s < kNumDTypes; s++) {
        for (int d = 0; d < kNumDTypes; d++) {
            const auto st = static_cast<DType>(s), dt = static_cast<DType>(d);
            std::vector<unsigned char> out(n * dtype_size(dt));
            convert(out.data(), dt, src_of(st), st, n);
            Mismatches bad;
            for (std::size_t i = 0; i < n; i++) {
                const float x = scalar_to_f32(st, i);
                std::uint32_t got = 0, want = 0;
                switch (dt) {
                case DType::f32:
                    got = reinterpret_cast<const std::uint32_t*>(out.data())[i];
                    want = fbits(x);
                    if (std::isnan(x)) {  // NaN in, NaN out (payloads are not compared)
                        got = std::isnan(std::bit_cast<float>(got)) ? 1 : 0;
                        want = 1;
                    }
                    break;
                case DType::bf16:
                    got = reinterpret_cast<const std::uint16_t*>(out.data())[i];
                    want = st == DType::bf16 ? h[i] : f32_to_bf16(x);
                    break;
                case DType::f16:
                    got = reinterpret_cast<const std::uint16_t*>(out.data())[i];
                    want = st == DType::f16 ? h[i] : f32_to_f16(x);
                    break;
                case DType::e4m3:
                    got = out[i];
                    want = st == DType::e4m3 ? q[i] : f32_to_e4m3(x);
                    break;
                case DType::e5m2:
                    got = out[i];
                    want = st == DType::e5m2 ? q[i] : f32_to_e5m2(x);
                    break;
                }
                if (got != want) bad.add(std::to_string(i));
            }
            INFO(dtype_name(st) << " -> " << dtype_name(dt) << ": " << bad.first);
            CHECK(bad.count == 0);
        }
    }
    // round_to is the cast and back.
    for (std::size_t i = 0; i < 1000; i++) {
        const float x = f32[i];
        if (std::isnan(x)) continue;
        CHECK(fbits(round_to(DType::bf16, x)) == fbits(bf16_to_f32(f32_to_bf16(x))));
        CHECK(fbits(round_to(DType::e4m3, x)) == fbits(e4m3_to_f32(f32_to_e4m3(x))));
        CHECK(fbits(round_to(DType::f32, x)) == fbits(x));
    }
}

TEST_CASE("structured sweep: every fp32 exponent, ties and their neighbours, both signs", "[dtype]") {
    // For every fp32 exponent field (subnormals, every normal binade, infinity and NaN) and both
    // signs: mantissas whose bits below each format's rounding position are exactly half an ulp
    // (a tie, with an even and an odd kept part), one below and one above it, all zeros and all
    // ones, plus a stride through the rest. Checked against the fp64 reference encoder.
    std::vector<std::uint32_t> mantissas;
    for (int drop : {16, 13, 20, 21}) {  // bf16, f16, e4m3, e5m2 mantissa bits dropped (normal range)
        for (int shift = drop; shift <= 23 && shift <= drop + 10; shift++) {  // deeper in subnormals
            const std::uint32_t half = 1u << (shift - 1);
            for (std::uint32_t kept : {0u, 1u, 2u, 3u, 0x2Au, 0x55u}) {
                const std::uint32_t base = (kept << shift) & 0x007FFFFFu;
                for (std::uint32_t m : {base, base | half, (base | half) - 1u, base | half | 1u,
                                        base | (half - 1u), base | ((1u << shift) - 1u)})
                    mantissas.push_back(m & 0x007FFFFFu);
            }
        }
    }
    for (std::uint32_t m = 0; m < 0x00800000u; m += 0x1235u) mantissas.push_back(m);
    std::sort(mantissas.begin(), mantissas.end());
    mantissas.erase(std::unique(mantissas.begin(), mantissas.end()), mantissas.end());
    for (const Format* f : kAllFormats) {
        const auto table = positive_table(*f);
        Mismatches bad;
        for (std::uint32_t e = 0; e < 256; e++) {
            for (std::uint32_t m : mantissas) {
                for (std::uint32_t s : {0u, 0x80000000u}) {
                    const float x = std::bit_cast<float>(s | e << 23 | m);
                    const std::uint32_t got = encode(*f, x);
                    if (std::isnan(x)) {
                        if (!is_nan_code(*f, got)) bad.add("NaN " + hex(fbits(x)) + " -> " + hex(got));
                        continue;
                    }
                    const std::uint32_t want = ref_encode(*f, table, x, false);
                    if (got != want) bad.add(hex(fbits(x)) + " -> " + hex(got) + ", reference " + hex(want));
                    // And back: the decoded value is the reference's value (exact in fp32).
                    const double back = ref_decode(*f, want);
                    if (std::isfinite(back) && fbits(decode(*f, got)) != fbits(static_cast<float>(back)))
                        bad.add("decode " + hex(got));
                }
            }
        }
        INFO(f->name << " (" << mantissas.size() << " mantissas x 256 exponents x 2 signs):\n" << bad.first);
        CHECK(bad.count == 0);
    }
}
