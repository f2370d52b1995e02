// Comparing a candidate tensor with its reference, element by element (docs/validation.md): bitwise
// equality, the distance in units in the last place (count, maximum, a histogram), the largest
// absolute and relative errors, and the first element that differs, with its index (flat and
// per dimension) and both values. The harness (parallax validate, golden traces, first-divergence
// search) reports through these.
//
// Index
//   ulp_distance      the number of fp32 values between two floats (0: the same value)
//   worse_ulp         the worse of two max-ULP figures (kNoUlp, a NaN mismatch, is the worst)
//   kUlpBuckets       the histogram's buckets: 0, 1, 2-3, 4-7, ..., 2^29-2^30-1, >= 2^30, NaN
//   ulp_bucket_label  a bucket's range as text ("4-7"), as text() and reports print it
//   Comparison        one tensor's comparison; equal(), text(), to_json()
//   compare           a candidate against a reference of the same logical shape
//   compare_states    every tensor of two LogicalStates (weights, Adam moments, loss, grad norm)
//
// ULP distance. Floats map monotonically onto integers (the sign-magnitude bit pattern turned
// into two's complement, so -0 and +0 are both 0 and the order of the reals is kept); the
// distance is the difference of the two integers. It is the count of representable fp32 values
// stepped over going from one to the other: 1 is a last-bit difference, 2^23 a factor of two
// near 1. A pair where exactly one side is NaN, or both are NaN with other bits, has no distance
// (kNoUlp, the last bucket). +0 against -0 is distance 0 but not bitwise equal: a bit differs,
// and the first-difference search reports it.
//
// Relative error: |c - r| / |r|, over elements with r != 0 (an element with r == 0 and c != 0 has
// only an absolute error). Errors are computed in double, over the elements whose bits differ and
// where neither side is NaN (a NaN shows as max_ulp == kNoUlp and in bucket 32 instead); an
// infinity against anything else gives max_abs = max_rel = inf.
#pragma once
#include "core/base/shapes.h"

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace px {

struct LogicalState;

inline constexpr std::int64_t kNoUlp = -1;  // a NaN against a number, or NaNs with other bits
std::int64_t ulp_distance(float a, float b);
std::int64_t ulp_distance(double a, double b);  // the same on doubles (distances >= 2^63: kNoUlp)
// The worse of two max-ULP figures: kNoUlp (a NaN mismatch) is worse than any distance.
inline std::int64_t worse_ulp(std::int64_t a, std::int64_t b) {
    return a == kNoUlp || b == kNoUlp ? kNoUlp : (a > b ? a : b);
}

// Bucket k (1 <= k <= 31) holds distances in [2^(k-1), 2^k); bucket 0 distance 0 with other bits
// (+0 / -0); bucket 31 also every distance >= 2^30; bucket 32: kNoUlp.
inline constexpr int kUlpBuckets = 33;
std::string ulp_bucket_label(int k);  // "0", "1", "2-3", ..., "536870912-1073741823", ">=2^30", "NaN"

struct Comparison {
    std::string name;            // what was compared: a probe ("3/bwd/2/attn.qkv/dweight"), "params/wte"
    int bits = 32;               // element width: 32 (fp32) or 64 (fp64), the unit of every ULP
    std::vector<i64> shape;      // the logical shape (empty: flat)
    i64 count = 0;               // elements compared
    i64 differing = 0;           // elements whose bits differ
    std::int64_t max_ulp = 0;    // the largest distance (kNoUlp when a NaN mismatch exists)
    std::array<i64, kUlpBuckets> ulp_histogram{};  // of the differing elements (sums to differing)
    double max_abs = 0;          // max |c - r|
    double max_rel = 0;          // max |c - r| / |r| over r != 0
    // The first element (in row-major order) whose bits differ; -1: none.
    i64 first = -1;
    std::vector<i64> first_index;  // the same per dimension of `shape` (empty for a flat shape)
    // Its two values, exact (an fp32 widens to double without rounding; `bits` says which it was).
    double first_reference = 0, first_candidate = 0;

    bool equal() const { return differing == 0; }  // bitwise
    // One line: "params/wte: 3 of 2048 differ, max 1 ulp (1: 3), max abs 9.31e-10, max rel
    // 7.57e-08, first at [1, 7] (flat 39): 0.0123 vs 0.0123000005" (values as the shortest
    // decimal that reads back as the same element), or "params/wte: bit-identical (2048)".
    std::string text() const;
    std::string to_json() const;   // one JSON object (schema: validators/README.md)
};

// candidate and reference hold `count` floats in row-major order of `shape` (its product is
// count; an empty shape means flat). Throws InternalError when the sizes disagree. One pass, no
// allocation per element; large tensors are split over OpenMP threads, with the same result.
Comparison compare(const std::string& name, std::span<const float> reference,
                   std::span<const float> candidate, const std::vector<i64>& shape = {});

// The same for doubles (the per-step loss and grad norm), with ULPs of double.
Comparison compare(const std::string& name, std::span<const double> reference,
                   std::span<const double> candidate, const std::vector<i64>& shape = {});

// Every tensor of a candidate state against a reference state (of the same model and steps:
// InternalError otherwise), in this order: for each parameter in table order "params/<name>",
// "adam/m/<name>", "adam/v/<name>" (params/wte, adam/m/wte, adam/v/wte, params/wpe, ...), each
// with its logical shape (vectors (cols), matrices (rows, cols)); then "steps/loss" and
// "steps/grad_norm" (fp64, shape (steps): index 0 is step 1).
std::vector<Comparison> compare_states(const LogicalState& reference, const LogicalState& candidate);

}  // namespace px
