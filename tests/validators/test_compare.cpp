// validators/compare.h: ULP distances against a brute-force walk with std::nextafter, the
// histogram's bucket boundaries, the first difference, the JSON schema of validators/README.md,
// and compare_states on a trained job with one weight moved by one ulp.
#include "core/base/error.h"
#include "validators/compare.h"

#include "tests/support/test_util.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <fmt/format.h>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

using namespace px;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kMax = std::numeric_limits<float>::max();
constexpr float kDenorm = std::numeric_limits<float>::denorm_min();
constexpr float kMinNormal = std::numeric_limits<float>::min();

float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }

// b reached from a by `steps` calls of nextafter towards `to`; the brute-force distance is `steps`
// as long as b != to was never reached early.
template <class F> F walk(F a, F to, int steps) {
    for (int i = 0; i < steps; i++) a = std::nextafter(a, to);
    return a;
}

// Counts nextafter steps from lo up to hi (lo <= hi): the definition of the distance. -0 and +0
// are one value (they compare equal): up from the negative subnormals nextafter goes -0, then
// the smallest positive subnormal.
template <class F> std::int64_t count_steps(F lo, F hi) {
    std::int64_t n = 0;
    while (lo != hi) {
        lo = std::nextafter(lo, hi);
        n++;
    }
    return n;
}

std::vector<float> filled(size_t n, float v) { return std::vector<float>(n, v); }

}  // namespace

TEST_CASE("ulp_distance of floats equals the count of nextafter steps", "[compare]") {
    std::mt19937 gen(1234);
    std::uniform_int_distribution<int> steps(0, 300);
    std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
    // Starting points in every regime: near 1, around zero (so walks cross it), subnormals, the
    // smallest normals, the largest finite values (walks up reach inf).
    const float starts[] = {1.0f,  -1.0f,        0.0f,         -0.0f,     kDenorm, -kDenorm,
                            kMinNormal, -kMinNormal, 100 * kDenorm, kMax, -kMax, 3.5e-3f};
    for (float s : starts) {
        for (int trial = 0; trial < 40; trial++) {
            // Half the walks start at s, half near it (kMax·(1 + x) may overflow to inf: a
            // start there walks down from inf).
            const float a = trial < 20 ? s : s == 0 ? unit(gen) * 50 * kDenorm : s * (1 + 0.01f * unit(gen));
            const float to = trial % 2 ? kInf : -kInf;
            const int k = steps(gen);
            const float b = walk(a, to, k);
            const std::int64_t brute = a <= b ? count_steps(a, b) : count_steps(b, a);
            INFO("a = " << a << ", b = " << b << ", steps " << k);
            CHECK(ulp_distance(a, b) == brute);
            CHECK(ulp_distance(b, a) == brute);  // symmetric
            // Every step moves one value (across zero too: -denorm, -0, +denorm), except once
            // stuck at an infinity.
            if (!std::isinf(b)) CHECK(brute == k);
        }
    }
}

TEST_CASE("ulp_distance: fixed points across zero, subnormals, max and inf", "[compare]") {
    CHECK(ulp_distance(0.0f, -0.0f) == 0);
    CHECK(ulp_distance(kDenorm, -kDenorm) == 2);
    CHECK(ulp_distance(0.0f, kDenorm) == 1);
    CHECK(ulp_distance(-0.0f, kDenorm) == 1);
    CHECK(ulp_distance(kMinNormal, 0.0f) == 0x00800000);  // all subnormals lie between
    CHECK(ulp_distance(kMax, kInf) == 1);
    CHECK(ulp_distance(-kInf, kInf) == 2 * std::int64_t{0x7f800000});
    CHECK(ulp_distance(1.0f, 2.0f) == (std::int64_t{1} << 23));
    CHECK(ulp_distance(-1.0f, 1.0f) == 2 * std::int64_t{0x3f800000});
    CHECK(ulp_distance(1.0f, 1.0f) == 0);
}

TEST_CASE("ulp_distance: NaN rules", "[compare]") {
    const float qnan = std::numeric_limits<float>::quiet_NaN();
    const float payload = from_bits(0x7fc00001);
    const float neg_nan = from_bits(0xffc00000);
    CHECK(ulp_distance(qnan, 1.0f) == kNoUlp);
    CHECK(ulp_distance(1.0f, qnan) == kNoUlp);
    CHECK(ulp_distance(qnan, kInf) == kNoUlp);
    CHECK(ulp_distance(qnan, qnan) == 0);  // the same bits
    CHECK(ulp_distance(qnan, payload) == kNoUlp);
    CHECK(ulp_distance(qnan, neg_nan) == kNoUlp);
    const double dnan = std::numeric_limits<double>::quiet_NaN();
    CHECK(ulp_distance(dnan, dnan) == 0);
    CHECK(ulp_distance(dnan, 0.0) == kNoUlp);
    CHECK(ulp_distance(dnan, std::bit_cast<double>(std::bit_cast<std::uint64_t>(dnan) | 1)) == kNoUlp);
}

TEST_CASE("ulp_distance of doubles equals the count of nextafter steps", "[compare]") {
    constexpr double dinf = std::numeric_limits<double>::infinity();
    constexpr double dmax = std::numeric_limits<double>::max();
    constexpr double ddenorm = std::numeric_limits<double>::denorm_min();
    std::mt19937 gen(99);
    std::uniform_int_distribution<int> steps(0, 200);
    for (double s : {1.0, -2.5, 0.0, -0.0, ddenorm, -ddenorm, dmax, -dmax, 1e-300}) {
        for (int trial = 0; trial < 20; trial++) {
            const double to = trial % 2 ? dinf : -dinf;
            const double b = walk(s, to, steps(gen));
            const std::int64_t brute = s <= b ? count_steps(s, b) : count_steps(b, s);
            CHECK(ulp_distance(s, b) == brute);
            CHECK(ulp_distance(b, s) == brute);
        }
    }
    CHECK(ulp_distance(0.0, -0.0) == 0);
    CHECK(ulp_distance(ddenorm, -ddenorm) == 2);
    CHECK(ulp_distance(1.0, 2.0) == (std::int64_t{1} << 52));
    CHECK(ulp_distance(-1.0, 1.0) == 2 * std::int64_t{0x3ff0000000000000});
    CHECK(ulp_distance(dmax, dinf) == 1);
    // Distances of 2^63 and more do not fit: kNoUlp.
    CHECK(ulp_distance(-dmax, dmax) == kNoUlp);
    CHECK(ulp_distance(-dinf, dinf) == kNoUlp);
}

TEST_CASE("compare: histogram buckets at their boundaries", "[compare]") {
    const std::uint32_t base = 0x01000000;  // a small normal: base + 2^30 stays finite (8.0)
    const std::int64_t ds[] = {1, 2, 3, 4, 7, 8, (1 << 29) - 1, 1 << 29, (1 << 30) - 1, 1 << 30};
    const int want_bucket[] = {1, 2, 2, 3, 3, 4, 29, 30, 30, 31};
    for (size_t i = 0; i < std::size(ds); i++) {
        const std::vector<float> r = {from_bits(base)};
        const std::vector<float> c = {from_bits(base + static_cast<std::uint32_t>(ds[i]))};
        const Comparison cmp = compare("b", r, c);
        INFO("distance " << ds[i]);
        CHECK(cmp.max_ulp == ds[i]);
        for (int k = 0; k < kUlpBuckets; k++)
            CHECK(cmp.ulp_histogram[static_cast<size_t>(k)] == (k == want_bucket[i] ? 1 : 0));
    }
    // Beyond 2^31 (across zero): still bucket 31; and all together in one tensor.
    std::vector<float> r, c;
    for (std::int64_t d : ds) {
        r.push_back(from_bits(base));
        c.push_back(from_bits(base + static_cast<std::uint32_t>(d)));
    }
    r.push_back(2.0f);
    c.push_back(-2.0f);
    const Comparison all = compare("all", r, c);
    CHECK(all.differing == 11);
    CHECK(all.max_ulp == 2 * std::int64_t{0x40000000});
    CHECK(all.ulp_histogram[1] == 1);
    CHECK(all.ulp_histogram[2] == 2);
    CHECK(all.ulp_histogram[3] == 2);
    CHECK(all.ulp_histogram[4] == 1);
    CHECK(all.ulp_histogram[29] == 1);
    CHECK(all.ulp_histogram[30] == 2);
    CHECK(all.ulp_histogram[31] == 2);
    CHECK(ulp_bucket_label(0) == "0");
    CHECK(ulp_bucket_label(1) == "1");
    CHECK(ulp_bucket_label(2) == "2-3");
    CHECK(ulp_bucket_label(3) == "4-7");
    CHECK(ulp_bucket_label(30) == "536870912-1073741823");
    CHECK(ulp_bucket_label(31) == ">=2^30");
    CHECK(ulp_bucket_label(32) == "NaN");
    CHECK_THROWS_AS(ulp_bucket_label(33), InternalError);
}

TEST_CASE("compare: -0 against +0, and NaNs", "[compare]") {
    const Comparison z = compare("z", std::vector<float>{1.0f, 0.0f}, std::vector<float>{1.0f, -0.0f});
    CHECK(!z.equal());
    CHECK(z.differing == 1);
    CHECK(z.max_ulp == 0);
    CHECK(z.ulp_histogram[0] == 1);
    CHECK(z.max_abs == 0);
    CHECK(z.first == 1);
    CHECK(!std::signbit(z.first_reference));
    CHECK(std::signbit(z.first_candidate));

    const float qnan = std::numeric_limits<float>::quiet_NaN();
    const Comparison same_nan = compare("n", std::vector<float>{qnan, 1.0f}, std::vector<float>{qnan, 1.0f});
    CHECK(same_nan.equal());
    CHECK(same_nan.text() == "n: bit-identical (2)");

    const Comparison mism = compare("n", std::vector<float>{1.0f, 2.0f, 3.0f},
                                    std::vector<float>{qnan, 2.0f, std::nextafter(3.0f, 4.0f)});
    CHECK(mism.differing == 2);
    CHECK(mism.max_ulp == kNoUlp);  // sticky, though a later element has distance 1
    CHECK(mism.ulp_histogram[32] == 1);
    CHECK(mism.ulp_histogram[1] == 1);
    CHECK(mism.first == 0);
    CHECK(std::isnan(mism.first_candidate));
    CHECK(mism.max_abs == static_cast<double>(std::nextafter(3.0f, 4.0f)) - 3.0);  // NaN: no error
    CHECK(mism.text().find("NaN mismatch") != std::string::npos);
}

TEST_CASE("compare: the first difference per dimension of a 3-D shape", "[compare]") {
    const std::vector<i64> shape = {2, 3, 4};
    std::vector<float> r(24), c;
    for (size_t i = 0; i < r.size(); i++) r[i] = 0.5f + static_cast<float>(i);
    c = r;
    c[23] = walk(c[23], kInf, 5);
    c[17] = walk(c[17], -kInf, 2);  // 17 = 1·12 + 1·4 + 1
    const Comparison cmp = compare("t", r, c, shape);
    CHECK(cmp.shape == shape);
    CHECK(cmp.count == 24);
    CHECK(cmp.differing == 2);
    CHECK(cmp.first == 17);
    CHECK(cmp.first_index == std::vector<i64>{1, 1, 1});
    CHECK(cmp.first_reference == 17.5);
    CHECK(cmp.first_candidate == static_cast<double>(c[17]));
    CHECK(cmp.max_ulp == 5);
    CHECK(cmp.ulp_histogram[2] == 1);
    CHECK(cmp.ulp_histogram[3] == 1);

    c = r;
    c[11] = -c[11];  // [0, 2, 3]
    const Comparison last = compare("t", r, c, shape);
    CHECK(last.first_index == std::vector<i64>{0, 2, 3});
    // A flat comparison has no per-dimension index.
    CHECK(compare("flat", r, c).first_index.empty());
    CHECK(compare("flat", r, c).first == 11);
}

TEST_CASE("compare: max_rel skips a zero reference; errors in double", "[compare]") {
    const Comparison cmp = compare("r", std::vector<float>{0.0f, 2.0f}, std::vector<float>{1.0f, 2.5f});
    CHECK(cmp.max_abs == 1.0);
    CHECK(cmp.max_rel == 0.25);
    const Comparison inf = compare("i", std::vector<float>{1.0f, kInf}, std::vector<float>{1.0f, kMax});
    CHECK(std::isinf(inf.max_abs));
    CHECK(std::isinf(inf.max_rel));
    CHECK(inf.max_ulp == 1);
    // Doubles: |c - r| of two floats is exact in double (no fp32 rounding of the error).
    const float a = 1.0f, b = std::nextafter(1.0f, 2.0f);
    const Comparison one = compare("o", std::vector<float>{a}, std::vector<float>{b});
    CHECK(one.max_abs == std::ldexp(1.0, -23));
}

TEST_CASE("compare: the double overload", "[compare]") {
    const double b = std::nextafter(2.0, 3.0);
    const Comparison cmp = compare("steps/loss", std::vector<double>{1.0, 2.0, 3.0},
                                   std::vector<double>{1.0, b, 3.0}, {3});
    CHECK(cmp.bits == 64);
    CHECK(cmp.differing == 1);
    CHECK(cmp.max_ulp == 1);
    CHECK(cmp.first == 1);
    CHECK(cmp.first_index == std::vector<i64>{1});
    CHECK(cmp.first_candidate == b);  // exact, not narrowed to fp32
    CHECK(cmp.max_abs == std::ldexp(1.0, -51));
    const auto j = nlohmann::json::parse(cmp.to_json());
    CHECK(j["dtype"] == "fp64");
    CHECK(j["first_candidate_bits"] == "0x4000000000000001");
    CHECK(j["first_reference_bits"] == "0x4000000000000000");
    CHECK(j["first_candidate"].get<double>() == b);
}

TEST_CASE("compare: sizes and shapes that disagree throw InternalError", "[compare]") {
    CHECK_THROWS_AS(compare("x", filled(4, 1), filled(5, 1)), InternalError);
    CHECK_THROWS_AS(compare("x", filled(6, 1), filled(6, 1), {2, 2}), InternalError);
    CHECK_THROWS_AS(compare("x", std::vector<double>(2), std::vector<double>(3)), InternalError);
    try {
        compare("params/wte", filled(4, 1), filled(5, 1));
    } catch (const InternalError& e) {
        CHECK(std::string(e.what()).find("params/wte") != std::string::npos);
    }
    CHECK(compare("empty", std::vector<float>{}, std::vector<float>{}).equal());
}

TEST_CASE("compare: a large tensor (threaded chunks) matches an element-by-element reckoning",
          "[compare]") {
    const size_t n = (size_t{1} << 20) + 12345;
    std::mt19937 gen(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::uniform_int_distribution<int> pick(0, 999), steps(1, 40);
    std::vector<float> r(n), c(n);
    for (size_t i = 0; i < n; i++) {
        r[i] = nd(gen);
        c[i] = pick(gen) == 0 ? walk(r[i], pick(gen) % 2 ? kInf : -kInf, steps(gen)) : r[i];
    }
    c[n - 1] = std::numeric_limits<float>::quiet_NaN();
    // The reckoning, one element at a time.
    i64 differing = 0, first = -1;
    std::int64_t max_ulp = 0;
    std::array<i64, kUlpBuckets> hist{};
    double max_abs = 0, max_rel = 0;
    for (size_t i = 0; i < n; i++) {
        if (std::bit_cast<std::uint32_t>(r[i]) == std::bit_cast<std::uint32_t>(c[i])) continue;
        differing++;
        if (first < 0) first = static_cast<i64>(i);
        const std::int64_t d = ulp_distance(r[i], c[i]);
        if (d == kNoUlp) {
            max_ulp = kNoUlp;
            hist[32]++;
            continue;
        }
        if (max_ulp != kNoUlp) max_ulp = std::max(max_ulp, d);
        hist[static_cast<size_t>(std::min(31, static_cast<int>(std::bit_width(static_cast<std::uint64_t>(d)))))]++;
        const double e = std::fabs(static_cast<double>(c[i]) - static_cast<double>(r[i]));
        max_abs = std::max(max_abs, e);
        if (r[i] != 0) max_rel = std::max(max_rel, e / std::fabs(static_cast<double>(r[i])));
    }
    const Comparison cmp = compare("big", r, c);
    CHECK(cmp.count == static_cast<i64>(n));
    CHECK(cmp.differing == differing);
    CHECK(differing > 1000);
    CHECK(cmp.first == first);
    CHECK(cmp.max_ulp == kNoUlp);
    CHECK(cmp.ulp_histogram == hist);
    CHECK(cmp.max_abs == max_abs);
    CHECK(cmp.max_rel == max_rel);
    // Without the NaN, max_ulp is the largest distance.
    c[n - 1] = r[n - 1];
    const Comparison no_nan = compare("big", r, c);
    CHECK(no_nan.max_ulp > 0);
    CHECK(no_nan.max_ulp <= 40);
}

TEST_CASE("Comparison::text: one line", "[compare]") {
    std::vector<float> r = filled(8, 0.0123f), c = r;
    c[5] = std::nextafter(0.0123f, 1.0f);
    const Comparison cmp = compare("params/wte", r, c, {2, 4});
    const double abs = static_cast<double>(c[5]) - static_cast<double>(r[5]);
    const std::string want = fmt::format(
        "params/wte: 1 of 8 differ, max 1 ulp (1: 1), max abs {:.3g}, max rel {:.3g}, first at "
        "[1, 1] (flat 5): 0.0123 vs 0.0123000005",
        abs, abs / static_cast<double>(r[5]));
    CHECK(cmp.text() == want);
    CHECK(compare("params/wte", r, r, {2, 4}).text() == "params/wte: bit-identical (8)");
    CHECK(compare("flat", r, c).text().find("first at 5: ") != std::string::npos);
}

TEST_CASE("Comparison::to_json: every documented field, values exact, NaN and inf valid",
          "[compare]") {
    const float qnan = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> r = {1.0f, 0.1f, 2.0f, 5.0f};
    const std::vector<float> c = {1.0f, qnan, kInf, std::nextafter(5.0f, 0.0f)};
    const Comparison cmp = compare("adam/m/wte", r, c, {2, 2});
    const auto j = nlohmann::json::parse(cmp.to_json());  // throws on invalid JSON
    const char* fields[] = {"name", "dtype", "shape", "count", "equal", "differing", "max_ulp",
                            "ulp_histogram", "max_abs", "max_rel", "first", "first_index",
                            "first_reference", "first_candidate", "first_reference_bits",
                            "first_candidate_bits"};
    CHECK(j.size() == std::size(fields));
    for (const char* f : fields) {
        INFO(f);
        CHECK(j.contains(f));
    }
    // Written in the documented order.
    const auto ordered = nlohmann::ordered_json::parse(cmp.to_json());
    size_t k = 0;
    for (auto it = ordered.begin(); it != ordered.end(); ++it, ++k)
        if (k < std::size(fields)) CHECK(it.key() == fields[k]);
    CHECK(j["name"] == "adam/m/wte");
    CHECK(j["dtype"] == "fp32");
    CHECK(j["shape"] == std::vector<i64>{2, 2});
    CHECK(j["count"] == 4);
    CHECK(j["equal"] == false);
    CHECK(j["differing"] == 3);
    CHECK(j["max_ulp"] == kNoUlp);
    CHECK(j["ulp_histogram"].size() == static_cast<size_t>(kUlpBuckets));
    CHECK(j["ulp_histogram"][32] == 1);
    CHECK(j["ulp_histogram"][1] == 1);
    CHECK(j["ulp_histogram"][30] == 1);  // 2 → inf: 0x7f800000 − 0x40000000 < 2^30 steps
    CHECK(j["max_abs"] == "inf");
    CHECK(j["max_rel"] == "inf");
    CHECK(j["first"] == 1);
    CHECK(j["first_index"] == std::vector<i64>{0, 1});
    CHECK(j["first_reference"].get<double>() == 0.1);  // the shortest decimal of the fp32 0.1f
    CHECK(static_cast<float>(j["first_reference"].get<double>()) == 0.1f);
    CHECK(j["first_candidate"] == "nan");
    CHECK(j["first_reference_bits"] == "0x3dcccccd");
    CHECK(j["first_candidate_bits"] == "0x7fc00000");

    const auto eq = nlohmann::json::parse(compare("e", r, r).to_json());
    CHECK(eq["equal"] == true);
    CHECK(eq["first"] == -1);
    CHECK(eq["first_index"].empty());
    CHECK(eq["shape"].empty());
    CHECK(eq["max_abs"] == 0.0);
    CHECK(eq["first_reference"].is_null());
    CHECK(eq["first_candidate_bits"].is_null());
}

TEST_CASE("compare_states: one weight one ulp off is the only difference, named exactly",
          "[compare]") {
    const LogicalState ref = test::single_device(test::small_job());
    LogicalState cand = ref;
    const int idx = ref.table.find("h.1.attn.c_attn.weight");
    REQUIRE(idx >= 0);
    const TableEntry& e = ref.table.entries[static_cast<size_t>(idx)];
    const i64 row = 5, col = 7;
    const size_t at = static_cast<size_t>(e.offset + row * e.cols + col);
    cand.params[at] = std::nextafter(cand.params[at], kInf);

    const std::vector<Comparison> all = compare_states(ref, cand);
    REQUIRE(all.size() == 3 * ref.table.entries.size() + 2);
    // The order: per parameter params/, adam/m/, adam/v/; then the two step series.
    CHECK(all[0].name == "params/wte");
    CHECK(all[1].name == "adam/m/wte");
    CHECK(all[2].name == "adam/v/wte");
    CHECK(all[3].name == "params/wpe");
    CHECK(all[all.size() - 2].name == "steps/loss");
    CHECK(all.back().name == "steps/grad_norm");
    CHECK(all.back().bits == 64);
    CHECK(all.back().shape == std::vector<i64>{5});
    int unequal = 0;
    for (const Comparison& c : all) {
        if (c.equal()) continue;
        unequal++;
        CHECK(c.name == "params/h.1.attn.c_attn.weight");
        CHECK(c.shape == std::vector<i64>{e.rows, e.cols});
        CHECK(c.differing == 1);
        CHECK(c.max_ulp == 1);
        CHECK(c.first_index == std::vector<i64>{row, col});
        CHECK(c.first == row * e.cols + col);
        CHECK(c.first_reference == static_cast<double>(ref.params[at]));
        CHECK(c.first_candidate == static_cast<double>(cand.params[at]));
    }
    CHECK(unequal == 1);
    // Shapes: vectors 1-D, matrices (rows, cols).
    for (const Comparison& c : all) {
        if (c.name == "params/h.0.ln_1.weight") CHECK(c.shape == std::vector<i64>{32});
        if (c.name == "adam/v/wte") CHECK(c.shape == std::vector<i64>{32, 32});
        if (c.name == "params/h.0.mlp.c_fc.weight") CHECK(c.shape == std::vector<i64>{80, 32});
    }
    for (const Comparison& c : compare_states(ref, ref)) CHECK(c.equal());

    LogicalState shorter = ref;
    shorter.history.pop_back();
    CHECK_THROWS_AS(compare_states(ref, shorter), InternalError);
    LogicalState other = ref;
    other.table.entries.pop_back();
    CHECK_THROWS_AS(compare_states(ref, other), InternalError);
}
