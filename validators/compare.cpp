// Element-by-element comparison of a candidate with its reference; the definitions are in
// compare.h, the JSON schema in validators/README.md.
#include "validators/compare.h"

#include "core/base/error.h"
#include "core/io/state.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <fmt/format.h>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

namespace px {

namespace {

// The unsigned integer of the same width as a float type, and its sign bit.
template <class F> using Bits = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
template <class F> constexpr Bits<F> kSign = Bits<F>{1} << (8 * sizeof(F) - 1);

// |ordered(a) - ordered(b)| where ordered() maps sign-magnitude onto two's complement (-0 and +0
// both 0). Computed on magnitudes so that a double's distance cannot overflow: equal signs
// subtract, opposite signs add (each magnitude < 2^63, so the sum fits in 64 unsigned bits).
template <class F> std::uint64_t ordered_distance(Bits<F> a, Bits<F> b) {
    const std::uint64_t ma = a & ~kSign<F>, mb = b & ~kSign<F>;
    if ((a & kSign<F>) == (b & kSign<F>)) return ma > mb ? ma - mb : mb - ma;
    return ma + mb;
}

// compare.h's ulp_distance, on bit patterns already known to differ or not.
template <class F> std::int64_t ulp_of(F a, F b) {
    const Bits<F> ba = std::bit_cast<Bits<F>>(a), bb = std::bit_cast<Bits<F>>(b);
    if (std::isnan(a) || std::isnan(b)) return ba == bb ? 0 : kNoUlp;
    const std::uint64_t d = ordered_distance<F>(ba, bb);
    if (d > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return kNoUlp;
    return static_cast<std::int64_t>(d);
}

// The histogram bucket of a pair whose bits differ, at distance d (compare.h, kUlpBuckets).
int bucket_of(std::int64_t d) {
    if (d == kNoUlp) return kUlpBuckets - 1;
    const int k = static_cast<int>(std::bit_width(static_cast<std::uint64_t>(d)));  // 0 for d == 0
    return std::min(k, kUlpBuckets - 2);
}

// A contiguous range's part of a Comparison; partials combine in any order to the same result
// (sums, maxima, the smallest first index).
struct Partial {
    i64 differing = 0;
    std::int64_t max_ulp = 0;
    std::array<i64, kUlpBuckets> hist{};
    double max_abs = 0, max_rel = 0;
    i64 first = -1;

    void merge(const Partial& o) {
        differing += o.differing;
        max_ulp = (max_ulp == kNoUlp || o.max_ulp == kNoUlp) ? kNoUlp : std::max(max_ulp, o.max_ulp);
        for (int k = 0; k < kUlpBuckets; k++) hist[k] += o.hist[k];
        max_abs = std::max(max_abs, o.max_abs);
        max_rel = std::max(max_rel, o.max_rel);
        if (o.first >= 0 && (first < 0 || o.first < first)) first = o.first;
    }
};

// Elements [lo, hi). The common case, equal bits, costs one integer compare.
template <class F> Partial scan(const F* r, const F* c, i64 lo, i64 hi) {
    Partial p;
    for (i64 i = lo; i < hi; i++) {
        const Bits<F> br = std::bit_cast<Bits<F>>(r[i]), bc = std::bit_cast<Bits<F>>(c[i]);
        if (br == bc) continue;
        p.differing++;
        if (p.first < 0) p.first = i;
        const std::int64_t d = ulp_of(r[i], c[i]);
        p.hist[bucket_of(d)]++;
        if (d == kNoUlp || p.max_ulp == kNoUlp) {
            p.max_ulp = kNoUlp;
        } else {
            p.max_ulp = std::max(p.max_ulp, d);
        }
        if (std::isnan(r[i]) || std::isnan(c[i])) continue;  // no error to measure: kNoUlp says it
        const double rv = static_cast<double>(r[i]), cv = static_cast<double>(c[i]);
        const double e = std::fabs(cv - rv);
        p.max_abs = std::max(p.max_abs, e);
        // An infinite reference against another value is infinitely wrong relatively too (inf/inf
        // would be NaN).
        if (rv != 0) p.max_rel = std::max(p.max_rel, std::isinf(e) ? e : e / std::fabs(rv));
    }
    return p;
}

// Below this many elements a tensor is scanned by one thread; above, in chunks of this size.
constexpr i64 kChunk = i64{1} << 16;

template <class F>
Comparison compare_impl(const std::string& name, std::span<const F> reference,
                        std::span<const F> candidate, const std::vector<i64>& shape) {
    if (reference.size() != candidate.size()) {
        std::string msg = "compare ";
        msg += name;
        msg += fmt::format(": the candidate has {} elements and the reference {}; compare "
                           "tensors of the same logical shape (unshard the candidate first)",
                           candidate.size(), reference.size());
        throw InternalError(msg);
    }
    const i64 n = static_cast<i64>(reference.size());
    i64 prod = 1;
    bool bad_dim = false;
    for (i64 d : shape) {
        bad_dim = bad_dim || d < 0;
        prod *= d;
    }
    if (!shape.empty() && (bad_dim || prod != n)) {
        std::string msg = "compare ";
        msg += name;
        msg += fmt::format(": the shape ({}) does not hold the {} elements given; pass the "
                           "tensor's logical shape, or none for a flat comparison",
                           fmt::join(shape, ", "), n);
        throw InternalError(msg);
    }

    Partial total;
    const F* r = reference.data();
    const F* c = candidate.data();
    if (n <= kChunk) {
        total = scan(r, c, 0, n);
    } else {
        const i64 chunks = (n + kChunk - 1) / kChunk;
        std::vector<Partial> parts(static_cast<size_t>(chunks));
#pragma omp parallel for schedule(static)
        for (i64 k = 0; k < chunks; k++)
            parts[static_cast<size_t>(k)] = scan(r, c, k * kChunk, std::min(n, (k + 1) * kChunk));
        for (const Partial& p : parts) total.merge(p);
    }

    Comparison out;
    out.name = name;
    out.bits = 8 * static_cast<int>(sizeof(F));
    out.shape = shape;
    out.count = n;
    out.differing = total.differing;
    out.max_ulp = total.max_ulp;
    out.ulp_histogram = total.hist;
    out.max_abs = total.max_abs;
    out.max_rel = total.max_rel;
    out.first = total.first;
    if (out.first >= 0) {
        out.first_reference = static_cast<double>(r[out.first]);
        out.first_candidate = static_cast<double>(c[out.first]);
        out.first_index.assign(shape.size(), 0);
        i64 rest = out.first;
        for (size_t d = shape.size(); d-- > 0;) {
            out.first_index[d] = rest % shape[d];
            rest /= shape[d];
        }
    }
    return out;
}

// A value as text: the shortest decimal that reads back as the same element (fp32 or fp64).
std::string value_text(double v, int bits) {
    return bits == 32 ? fmt::format("{}", static_cast<float>(v)) : fmt::format("{}", v);
}

// A value as JSON: a number (the shortest decimal that reads back as the same element), or for
// values JSON cannot hold the string "nan", "inf" or "-inf".
nlohmann::ordered_json value_json(double v, int bits) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    // The shortest fp32 decimal, read as a double, rounds back to the same fp32 (and prints short).
    if (bits == 64) return v;
    const std::string t = value_text(v, 32);
    double d = 0;
    std::from_chars(t.data(), t.data() + t.size(), d);  // not strtod: no locale
    return d;
}

// A value's bit pattern as hex: "0x3f800000" (fp32), "0x3ff0000000000000" (fp64).
std::string bits_hex(double v, int bits) {
    if (bits == 32) return fmt::format("{:#010x}", std::bit_cast<std::uint32_t>(static_cast<float>(v)));
    return fmt::format("{:#018x}", std::bit_cast<std::uint64_t>(v));
}

}  // namespace

std::int64_t ulp_distance(float a, float b) { return ulp_of(a, b); }
std::int64_t ulp_distance(double a, double b) { return ulp_of(a, b); }

std::string ulp_bucket_label(int k) {
    if (k < 0 || k >= kUlpBuckets) {
        std::string msg = fmt::format("ulp_bucket_label: bucket {} does not exist; buckets are 0 to {}",
                                      k, kUlpBuckets - 1);
        throw InternalError(msg);
    }
    if (k == kUlpBuckets - 1) return "NaN";
    if (k == kUlpBuckets - 2) return ">=2^30";
    if (k <= 1) return fmt::format("{}", k);
    const std::uint64_t lo = std::uint64_t{1} << (k - 1);
    return fmt::format("{}-{}", lo, 2 * lo - 1);
}

Comparison compare(const std::string& name, std::span<const float> reference,
                   std::span<const float> candidate, const std::vector<i64>& shape) {
    return compare_impl(name, reference, candidate, shape);
}

Comparison compare(const std::string& name, std::span<const double> reference,
                   std::span<const double> candidate, const std::vector<i64>& shape) {
    return compare_impl(name, reference, candidate, shape);
}

std::string Comparison::text() const {
    std::string out = name;
    if (equal()) {
        out += fmt::format(": bit-identical ({})", count);
        return out;
    }
    out += fmt::format(": {} of {} differ, ", differing, count);
    if (max_ulp == kNoUlp) {
        out += "NaN mismatch";
    } else {
        out += fmt::format("max {} ulp", max_ulp);
    }
    if (bits != 32) out += fmt::format(" (fp{})", bits);
    out += " (";
    bool any = false;
    for (int k = 0; k < kUlpBuckets; k++) {
        if (ulp_histogram[static_cast<size_t>(k)] == 0) continue;
        if (any) out += ", ";
        out += ulp_bucket_label(k);
        out += fmt::format(": {}", ulp_histogram[static_cast<size_t>(k)]);
        any = true;
    }
    out += fmt::format("), max abs {:.3g}, max rel {:.3g}, first at ", max_abs, max_rel);
    if (!first_index.empty()) out += fmt::format("[{}] (flat {})", fmt::join(first_index, ", "), first);
    else out += fmt::format("{}", first);
    out += ": ";
    out += value_text(first_reference, bits);
    out += " vs ";
    out += value_text(first_candidate, bits);
    return out;
}

std::string Comparison::to_json() const {
    nlohmann::ordered_json j;  // fields in the order validators/README.md lists them
    j["name"] = name;
    j["dtype"] = bits == 32 ? "fp32" : "fp64";
    j["shape"] = shape;
    j["count"] = count;
    j["equal"] = equal();
    j["differing"] = differing;
    j["max_ulp"] = max_ulp;
    j["ulp_histogram"] = ulp_histogram;
    j["max_abs"] = value_json(max_abs, 64);
    j["max_rel"] = value_json(max_rel, 64);
    j["first"] = first;
    j["first_index"] = first_index;
    if (first >= 0) {
        j["first_reference"] = value_json(first_reference, bits);
        j["first_candidate"] = value_json(first_candidate, bits);
        j["first_reference_bits"] = bits_hex(first_reference, bits);
        j["first_candidate_bits"] = bits_hex(first_candidate, bits);
    } else {
        j["first_reference"] = nullptr;
        j["first_candidate"] = nullptr;
        j["first_reference_bits"] = nullptr;
        j["first_candidate_bits"] = nullptr;
    }
    return j.dump();
}

std::vector<Comparison> compare_states(const LogicalState& reference, const LogicalState& candidate) {
    const auto& re = reference.table.entries;
    const auto& ce = candidate.table.entries;
    bool same = re.size() == ce.size() && reference.params.size() == candidate.params.size() &&
                reference.m.size() == candidate.m.size() && reference.v.size() == candidate.v.size() &&
                reference.history.size() == candidate.history.size();
    for (size_t i = 0; same && i < re.size(); i++)
        same = re[i].name == ce[i].name && re[i].rows == ce[i].rows && re[i].cols == ce[i].cols &&
               re[i].offset == ce[i].offset;
    const size_t need = static_cast<size_t>(reference.table.total);
    same = same && reference.params.size() == need && reference.m.size() == need &&
           reference.v.size() == need;
    if (!same)
        throw InternalError(fmt::format(
            "compare_states: the candidate is not a state of the reference's model and steps "
            "({} vs {} tensors, {} vs {} weights, {} vs {} moments, {} vs {} steps); compare two "
            "complete, unsharded states of the same config",
            ce.size(), re.size(), candidate.params.size(), reference.params.size(),
            candidate.m.size(), reference.m.size(), candidate.history.size(),
            reference.history.size()));

    std::vector<Comparison> out;
    out.reserve(3 * re.size() + 2);
    const struct {
        const char* prefix;
        std::vector<float> LogicalState::*field;
    } arrays[] = {{"params/", &LogicalState::params},
                  {"adam/m/", &LogicalState::m},
                  {"adam/v/", &LogicalState::v}};
    for (const TableEntry& e : re) {
        // Vectors (rows = Dim::one in the parameter list) are 1-D; matrices (rows, cols).
        const std::vector<i64> shape = kParams[e.spec].rows == Dim::one
                                           ? std::vector<i64>{e.cols}
                                           : std::vector<i64>{e.rows, e.cols};
        const size_t off = static_cast<size_t>(e.offset), n = static_cast<size_t>(e.numel());
        for (const auto& a : arrays) {
            std::string name = a.prefix;
            name += e.name;
            out.push_back(compare(name, std::span<const float>((reference.*a.field).data() + off, n),
                                  std::span<const float>((candidate.*a.field).data() + off, n),
                                  shape));
        }
    }
    const struct {
        const char* name;
        double StepMetrics::*field;
    } metrics[] = {{"steps/loss", &StepMetrics::loss}, {"steps/grad_norm", &StepMetrics::grad_norm}};
    for (const auto& mt : metrics) {
        std::vector<double> r, c;
        for (const StepMetrics& s : reference.history) r.push_back(s.*mt.field);
        for (const StepMetrics& s : candidate.history) c.push_back(s.*mt.field);
        out.push_back(compare(mt.name, std::span<const double>(r), std::span<const double>(c),
                              {static_cast<i64>(r.size())}));
    }
    return out;
}

}  // namespace px
