// Philox 4x32-10 (Salmon, Moraes, Dror, Shaw: "Parallel random numbers: as easy as 1, 2, 3",
// SC'11), with the constants of the Random123 reference implementation.
#include "core/base/rng.h"

#include <cmath>

namespace px {

namespace {

constexpr u32 kM0 = 0xD2511F53u;  // round multipliers
constexpr u32 kM1 = 0xCD9E8D57u;
constexpr u32 kW0 = 0x9E3779B9u;  // key schedule increments (golden ratio, sqrt(3) - 1)
constexpr u32 kW1 = 0xBB67AE85u;

inline void mulhilo(u32 a, u32 b, u32& hi, u32& lo) {
    const u64 p = static_cast<u64>(a) * static_cast<u64>(b);
    hi = static_cast<u32>(p >> 32);
    lo = static_cast<u32>(p);
}

inline std::array<u32, 4> philox_round(const std::array<u32, 4>& c, const std::array<u32, 2>& k) {
    u32 hi0, lo0, hi1, lo1;
    mulhilo(kM0, c[0], hi0, lo0);
    mulhilo(kM1, c[2], hi1, lo1);
    return {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
}

// 52 bits from two words -> (k + 0.5) * 2^-52, exact (k + 0.5 has at most 53 significant bits).
inline double to_open_unit(u32 hi, u32 lo) {
    const u64 k = (static_cast<u64>(hi) << 20) | (lo >> 12);
    return (static_cast<double>(k) + 0.5) * 0x1.0p-52;
}

constexpr double kTwoPi = 6.283185307179586476925286766559;

inline double box_muller(const std::array<u32, 4>& x) {
    const double u1 = to_open_unit(x[0], x[1]);
    const double u2 = to_open_unit(x[2], x[3]);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

// Element-wise fills run in parallel only when there is enough work to pay for the threads; the
// result does not depend on it.
constexpr i64 kParallelMin = 1 << 14;

}  // namespace

std::array<u32, 4> philox4x32_10(std::array<u32, 4> counter, std::array<u32, 2> key) {
    for (int r = 0; r < 10; r++) {
        if (r > 0) {
            key[0] += kW0;
            key[1] += kW1;
        }
        counter = philox_round(counter, key);
    }
    return counter;
}

std::array<u32, 4> philox_at(u64 seed, u32 tensor_id, u64 index, u32 stream) {
    return philox4x32_10({static_cast<u32>(index), static_cast<u32>(index >> 32), tensor_id, stream},
                         {static_cast<u32>(seed), static_cast<u32>(seed >> 32)});
}

double uniform_at(u64 seed, u32 tensor_id, u64 index, u32 stream) {
    const auto x = philox_at(seed, tensor_id, index, stream);
    return to_open_unit(x[0], x[1]);
}

double normal_at(u64 seed, u32 tensor_id, u64 index, u32 stream) {
    return box_muller(philox_at(seed, tensor_id, index, stream));
}

void fill_normal(float* out, i64 n, float mean, float std, u64 seed, u32 tensor_id, u64 first_index,
                 u32 stream) {
    const double m = mean, s = std;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (i64 i = 0; i < n; i++) {
        const double z = box_muller(philox_at(seed, tensor_id, first_index + static_cast<u64>(i), stream));
        out[i] = static_cast<float>(m + s * z);
    }
}

void fill_uniform(float* out, i64 n, float lo, float hi, u64 seed, u32 tensor_id, u64 first_index,
                  u32 stream) {
    const double a = lo, w = static_cast<double>(hi) - static_cast<double>(lo);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (i64 i = 0; i < n; i++) {
        const auto x = philox_at(seed, tensor_id, first_index + static_cast<u64>(i), stream);
        out[i] = static_cast<float>(a + w * to_open_unit(x[0], x[1]));
    }
}

}  // namespace px
