// Philox 4x32-10: known answers from Random123, the logical-position contract (a slice draws what
// the whole tensor draws), statistics sanity and stream separation.
#include "core/base/rng.h"

#include <catch2/catch.hpp>

#include <omp.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

using namespace px;

TEST_CASE("Philox 4x32-10 matches the Random123 known-answer vectors", "[rng]") {
    // Random123 tests/kat_vectors, "philox4x32 10": counter, key, output.
    using C = std::array<u32, 4>;
    using K = std::array<u32, 2>;
    CHECK(philox4x32_10(C{0, 0, 0, 0}, K{0, 0}) == C{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
    CHECK(philox4x32_10(C{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, K{0xffffffff, 0xffffffff}) ==
          C{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
    CHECK(philox4x32_10(C{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, K{0xa4093822, 0x299f31d0}) ==
          C{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("philox_at lays out key and counter as documented", "[rng]") {
    const u64 seed = 0x0123456789ABCDEFull;
    const u64 index = 0x00000005DEADBEEFull;  // above 2^32: the high word matters
    const auto a = philox_at(seed, 17, index, 3);
    const auto b = philox4x32_10({0xDEADBEEFu, 0x5u, 17u, 3u}, {0x89ABCDEFu, 0x01234567u});
    CHECK(a == b);
    CHECK(philox_at(seed, 17, index) == philox_at(seed, 17, index, 0));
}

TEST_CASE("uniform_at is (k + 0.5) / 2^52 from words x0, x1: strictly inside (0, 1)", "[rng]") {
    auto from_words = [](u32 hi, u32 lo) {
        const u64 k = (static_cast<u64>(hi) << 20) | (lo >> 12);
        return (static_cast<double>(k) + 0.5) * 0x1.0p-52;
    };
    // The extremes of the map are inside the open interval.
    CHECK(from_words(0, 0) > 0.0);
    CHECK(from_words(0xffffffffu, 0xffffffffu) < 1.0);
    CHECK(from_words(0, 0) == 1.0 - from_words(0xffffffffu, 0xffffffffu));
    double lo = 1.0, hi = 0.0;
    for (u64 i = 0; i < 200000; i++) {
        const auto x = philox_at(42, 5, i, 1);
        const double u = uniform_at(42, 5, i, 1);
        REQUIRE(u == from_words(x[0], x[1]));
        lo = std::min(lo, u);
        hi = std::max(hi, u);
    }
    CHECK(lo > 0.0);
    CHECK(hi < 1.0);
    CHECK(lo < 1e-4);
    CHECK(hi > 1.0 - 1e-4);
}

TEST_CASE("normal_at is Box-Muller on the two word pairs of one block", "[rng]") {
    for (u64 i = 0; i < 1000; i++) {
        const auto x = philox_at(9, 2, i, 0);
        const double u1 = ((static_cast<double>((static_cast<u64>(x[0]) << 20) | (x[1] >> 12))) + 0.5) * 0x1.0p-52;
        const double u2 = ((static_cast<double>((static_cast<u64>(x[2]) << 20) | (x[3] >> 12))) + 0.5) * 0x1.0p-52;
        const double want = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586476925286766559 * u2);
        REQUIRE(normal_at(9, 2, i) == want);
    }
}

namespace {

bool same_bits(const std::vector<float>& a, std::size_t offset, const std::vector<float>& b) {
    for (std::size_t i = 0; i < b.size(); i++)
        if (std::bit_cast<std::uint32_t>(a[offset + i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
    return true;
}

}  // namespace

TEST_CASE("a slice draws exactly what the whole tensor draws", "[rng]") {
    const i64 n = 100003;  // large enough for the parallel path
    const u64 seed = 1337;
    const u32 tid = 11;
    std::vector<float> full_n(n), full_u(n);
    fill_normal(full_n.data(), n, 0.5f, 0.02f, seed, tid, 0);
    fill_uniform(full_u.data(), n, -0.1f, 0.3f, seed, tid, 0);

    // Element i is the documented function of normal_at / uniform_at of logical index i.
    for (i64 i = 0; i < n; i += 997) {
        const double z = normal_at(seed, tid, static_cast<u64>(i));
        REQUIRE(full_n[i] == static_cast<float>(0.5 + static_cast<double>(0.02f) * z));
        const double u = uniform_at(seed, tid, static_cast<u64>(i));
        const double w = static_cast<double>(0.3f) - static_cast<double>(-0.1f);
        REQUIRE(full_u[i] == static_cast<float>(static_cast<double>(-0.1f) + w * u));
    }

    std::mt19937_64 rng(5);
    for (int trial = 0; trial < 25; trial++) {
        i64 a = static_cast<i64>(rng() % static_cast<u64>(n));
        i64 b = static_cast<i64>(rng() % static_cast<u64>(n + 1));
        if (a > b) std::swap(a, b);
        if (trial == 0) a = 0, b = n;
        if (trial == 1) a = n - 1, b = n;
        if (trial == 2) a = 3, b = 3;  // empty
        INFO("slice [" << a << ", " << b << ")");
        std::vector<float> part_n(static_cast<std::size_t>(b - a)), part_u(static_cast<std::size_t>(b - a));
        fill_normal(part_n.data(), b - a, 0.5f, 0.02f, seed, tid, static_cast<u64>(a));
        fill_uniform(part_u.data(), b - a, -0.1f, 0.3f, seed, tid, static_cast<u64>(a));
        CHECK(same_bits(full_n, static_cast<std::size_t>(a), part_n));
        CHECK(same_bits(full_u, static_cast<std::size_t>(a), part_u));
    }
}

TEST_CASE("fills do not depend on the thread count", "[rng]") {
    const i64 n = 1 << 17;
    std::vector<float> one(n), many(n);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    fill_normal(one.data(), n, 0.0f, 1.0f, 3, 4, 1000);
    omp_set_num_threads(std::max(2, saved));
    fill_normal(many.data(), n, 0.0f, 1.0f, 3, 4, 1000);
    omp_set_num_threads(saved);
    CHECK(same_bits(one, 0, many));
}

TEST_CASE("statistics: normals have mean 0 and variance 1, uniforms fill (0, 1) evenly", "[rng]") {
    const int n = 1000000;
    // 5 sigma of the sampling error of each statistic.
    const double tol_mean_n = 5.0 / std::sqrt(n);            // sd of the mean: 1/sqrt(n)
    const double tol_var_n = 5.0 * std::sqrt(2.0 / n);        // sd of the variance: sqrt(2/n)
    const double tol_mean_u = 5.0 * std::sqrt(1.0 / 12 / n);  // uniform: var 1/12
    const double tol_var_u = 5.0 * std::sqrt(1.0 / 180 / n);  // (mu4 - sigma^4)/n = (1/80 - 1/144)/n

    double s = 0, ss = 0, s4 = 0;
    int beyond2 = 0;
    double su = 0, ssu = 0;
    std::vector<int> bins(100, 0);
    for (int i = 0; i < n; i++) {
        const double z = normal_at(2024, 1, static_cast<u64>(i));
        REQUIRE(std::isfinite(z));
        s += z;
        ss += z * z;
        s4 += z * z * z * z;
        if (std::fabs(z) > 2.0) beyond2++;
        const double u = uniform_at(2024, 1, static_cast<u64>(i), 7);
        REQUIRE(u > 0.0);
        REQUIRE(u < 1.0);
        su += u;
        ssu += u * u;
        bins[static_cast<int>(u * 100)]++;
    }
    const double mean = s / n, var = ss / n - mean * mean;
    CHECK(std::fabs(mean) < tol_mean_n);
    CHECK(std::fabs(var - 1.0) < tol_var_n);
    // Fourth moment 3, with sd sqrt((105 - 9)/n).
    CHECK(std::fabs(s4 / n - 3.0) < 5.0 * std::sqrt(96.0 / n));
    // P(|z| > 2) = 0.0455003.
    const double p2 = 0.04550026389635842;
    CHECK(std::fabs(beyond2 - p2 * n) < 5.0 * std::sqrt(n * p2 * (1 - p2)));
    const double mean_u = su / n, var_u = ssu / n - mean_u * mean_u;
    CHECK(std::fabs(mean_u - 0.5) < tol_mean_u);
    CHECK(std::fabs(var_u - 1.0 / 12) < tol_var_u);
    // Chi-square over 100 equal bins: 99 degrees of freedom, mean 99, sd 14; 5 sd is 169.
    double chi2 = 0;
    for (const int c : bins) chi2 += (c - n / 100.0) * (c - n / 100.0) / (n / 100.0);
    CHECK(chi2 < 99 + 5 * std::sqrt(2.0 * 99));
}

TEST_CASE("different seeds, tensor ids, streams and indices give different numbers", "[rng]") {
    const u64 m = 4096;
    auto draw = [&](u64 seed, u32 tid, u32 stream, u64 first) {
        std::vector<double> v(m);
        for (u64 i = 0; i < m; i++) v[i] = uniform_at(seed, tid, first + i, stream);
        return v;
    };
    const auto base = draw(1, 1, 0, 0);
    const std::vector<std::vector<double>> others = {
        draw(2, 1, 0, 0),              // seed
        draw(1ull << 32 | 1, 1, 0, 0),  // seed high word
        draw(1, 2, 0, 0),              // tensor id
        draw(1, 1, 1, 0),              // stream
        draw(1, 1, 0, 1ull << 32),     // index high word
    };
    for (const auto& o : others) {
        int equal = 0;
        for (u64 i = 0; i < m; i++) equal += base[i] == o[i];
        CHECK(equal == 0);
    }
    // Within one stream, no repeats across many indices (52-bit values: a collision is ~1e-6 likely).
    std::set<double> seen(base.begin(), base.end());
    CHECK(seen.size() == base.size());
}
