// Data sources: the Markov chain's closed forms against brute force, the mixture's floor against
// its Bayes predictor, the sampler's determinism
// (the microbatch / data-parallel property), and llm.c token files, good and malformed.
#include "core/model/data.h"
#include "core/base/error.h"

#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace px;
using namespace px::test;
using Catch::Matchers::Contains;

namespace {

std::string temp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() /
            ("px_test_data_" + std::to_string(getpid()) + "_" + name))
        .string();
}

// Writes an llm.c-like file byte by byte, so malformed headers can be made.
void write_raw(const std::string& path, std::vector<std::int32_t> header,
               const std::vector<std::uint16_t>& tokens) {
    header.resize(256, 0);
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(header.data()), 256 * 4);
    f.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 2));
}

std::vector<int> draw(const TokenSource& src, i64 T, Split split, i64 step, i64 first, i64 count) {
    std::vector<int> out(size_t(count * (T + 1)), -1);
    src.sample(out.data(), T, split, step, first, count);
    return out;
}

// -log P(x_j | previous k) summed over positions j >= k of a window, and how many there were.
std::pair<double, i64> window_nll(const MarkovSource& src, const int* row, i64 T) {
    const i64 V = src.vocab(), k = src.order();
    i64 s = 0;
    for (i64 j = 0; j < k; j++) s = s * V + row[j];
    double nll = 0;
    for (i64 j = k; j <= T; j++) {
        nll -= std::log(src.row(s)[row[j]]);
        s = (s % (src.states() / V)) * V + row[j];
    }
    return {nll, T + 1 - k};
}

}  // namespace

TEST_CASE("markov entropy rate matches a sampled estimate", "[data][markov]") {
    for (i64 k : {1, 2}) {
        const MarkovSource src(32, k, 0.25, 7, 1337);
        // ~2e5 transitions; window means are i.i.d., so their spread gives an honest standard
        // error even though positions inside a window are correlated.
        const i64 T = 63, windows = 200000 / (T + 1 - k) + 1;
        const std::vector<int> tok = draw(src, T, Split::train, 0, 0, windows);
        double sum = 0, sumsq = 0;
        i64 n = 0;
        for (i64 w = 0; w < windows; w++) {
            const auto [nll, cnt] = window_nll(src, &tok[w * (T + 1)], T);
            const double m = nll / double(cnt);
            sum += m;
            sumsq += m * m;
            n += cnt;
        }
        const double mean = sum / double(windows);
        const double var =
            (sumsq / double(windows) - mean * mean) * double(windows) / double(windows - 1);
        const double se = std::sqrt(var / double(windows));
        INFO("k = " << k << ", rate " << src.entropy_rate() << ", estimate " << mean << " +- " << se
                    << " over " << n << " transitions");
        CHECK(n >= 200000);
        CHECK(src.entropy_rate() > 0);
        CHECK(src.entropy_rate() < std::log(32.0));
        CHECK(std::abs(mean - src.entropy_rate()) < 4 * se);
    }
}

TEST_CASE("markov stationary distribution is stationary", "[data][markov]") {
    for (i64 k : {1, 2, 3}) {
        const MarkovSource src(k == 3 ? 8 : 32, k, 0.25, 7, 1);
        const i64 V = src.vocab(), S = src.states();
        const std::vector<double>& pi = src.stationary();
        REQUIRE(i64(pi.size()) == S);
        // pi P, with the k-gram shift written out here rather than taken from the source.
        std::vector<double> next(size_t(S), 0.0);
        double total = 0;
        for (i64 s = 0; s < S; s++) {
            total += pi[s];
            CHECK(pi[s] >= 0);
            for (i64 x = 0; x < V; x++) next[(s % (S / V)) * V + x] += pi[s] * src.row(s)[x];
        }
        double worst = 0;
        for (i64 s = 0; s < S; s++) worst = std::max(worst, std::abs(next[s] - pi[s]));
        INFO("k = " << k << ", max |pi P - pi| = " << worst);
        CHECK(worst <= 1e-12);
        CHECK(std::abs(total - 1.0) <= 1e-12);
        for (i64 s = 0; s < S; s++) {
            double row = 0;
            for (i64 x = 0; x < V; x++) row += src.row(s)[x];
            CHECK(std::abs(row - 1.0) <= 1e-12);
        }
    }
}

TEST_CASE("markov first symbols follow the stationary distribution", "[data][markov]") {
    const MarkovSource src(8, 1, 0.5, 3, 99);
    const i64 n = 40000;
    const std::vector<int> tok = draw(src, 1, Split::train, 4, 0, n);
    std::vector<double> count(8, 0.0);
    for (i64 i = 0; i < n; i++) count[tok[2 * i]] += 1;
    for (i64 v = 0; v < 8; v++) {
        const double p = src.stationary()[v];
        INFO("symbol " << v << ": pi " << p << ", frequency " << count[v] / n);
        CHECK(std::abs(count[v] / n - p) <= 5 * std::sqrt(p * (1 - p) / n) + 1e-9);
    }
}

TEST_CASE("markov window floor", "[data][markov]") {
    SECTION("order 1: every target sees its whole state") {
        const MarkovSource src(32, 1, 0.25, 7, 1337);
        for (i64 T : {1, 2, 128})
            CHECK(src.window_floor(T) == Approx(src.entropy_rate()).epsilon(1e-14));
    }
    SECTION("order 2: the first target pays for its partial context, less as T grows") {
        const MarkovSource src(32, 2, 0.25, 7, 1337);
        const double h = src.entropy_rate();
        double prev = src.window_floor(1);
        CHECK(prev > h);
        for (i64 T : {2, 4, 16, 128, 1024, 1 << 20}) {
            const double f = src.window_floor(T);
            CHECK(f >= h);
            CHECK(f < prev);
            prev = f;
        }
        CHECK(src.window_floor(1 << 20) - h < 1e-5);
        // Exactly one target (the first) is short of context: floor(T) - h = (floor(1) - h) / T.
        CHECK(src.window_floor(128) - h == Approx((src.window_floor(1) - h) / 128).epsilon(1e-9));
    }
    SECTION("equals brute-force enumeration for V=3, k=2, T=4") {
        for (double alpha : {0.25, 1.0, 3.0}) {
            const MarkovSource src(3, 2, alpha, 11, 0);
            const i64 V = 3, T = 4, n = 243;  // 3^5 windows
            // Joint probability of every window x_0..x_4: pi(x_0 x_1) prod P(x_j | x_{j-2}
            // x_{j-1}).
            std::vector<double> p(n);
            std::vector<std::array<int, 5>> w(n);
            for (i64 i = 0; i < n; i++) {
                i64 r = i;
                for (int j = 4; j >= 0; j--, r /= V) w[i][j] = int(r % V);
                double q = src.stationary()[w[i][0] * V + w[i][1]];
                for (int j = 2; j <= 4; j++) q *= src.row(w[i][j - 2] * V + w[i][j - 1])[w[i][j]];
                p[i] = q;
            }
            // Expected -log p(x_m | x_0..x_{m-1}) for targets m = 1..T, from prefix marginals.
            double total = 0;
            for (int m = 1; m <= T; m++) {
                std::vector<double> prefix(size_t(n), 0.0), longer(size_t(n), 0.0);
                auto code = [&](i64 i, int len) {
                    i64 c = 0;
                    for (int j = 0; j < len; j++) c = c * V + w[i][j];
                    return c;
                };
                for (i64 i = 0; i < n; i++) {
                    prefix[code(i, m)] += p[i];
                    longer[code(i, m + 1)] += p[i];
                }
                for (i64 i = 0; i < n; i++)
                    total -= p[i] * std::log(longer[code(i, m + 1)] / prefix[code(i, m)]);
            }
            const double brute = total / T;
            INFO("alpha " << alpha << ": brute force " << brute << ", window_floor "
                          << src.window_floor(T));
            CHECK(std::abs(brute - src.window_floor(T)) <= 1e-12);
            CHECK(brute > src.entropy_rate());
        }
    }
}

TEST_CASE("markov sampling is a pure function of (seed, split, step, sample)", "[data][markov]") {
    for (i64 k : {1, 3}) {
        const MarkovSource src(16, k, 0.25, 7, 1337);
        const i64 T = 40;
        const std::vector<int> whole = draw(src, T, Split::train, 5, 0, 8);
        // Microbatches / ranks taking [0,3) and [3,8), drawn in reverse order, by another object.
        const MarkovSource again(16, k, 0.25, 7, 1337);
        std::vector<int> pieces = draw(again, T, Split::train, 5, 3, 5);
        const std::vector<int> head = draw(again, T, Split::train, 5, 0, 3);
        pieces.insert(pieces.begin(), head.begin(), head.end());
        CHECK(pieces == whole);
        // A shorter window is a prefix of the longer one.
        const std::vector<int> shorter = draw(src, 10, Split::train, 5, 2, 1);
        CHECK(std::equal(shorter.begin(), shorter.end(), whole.begin() + 2 * (T + 1)));
        CHECK(draw(src, T, Split::train, 6, 0, 8) != whole);
        CHECK(draw(src, T, Split::val, 5, 0, 8) != whole);
        CHECK(draw(MarkovSource(16, k, 0.25, 7, 1338), T, Split::train, 5, 0, 8) != whole);
        // Rows within a step differ from each other.
        CHECK(!std::equal(whole.begin(), whole.begin() + T + 1, whole.begin() + T + 1));
        for (int t : whole) {
            CHECK(t >= 0);
            CHECK(t < 16);
        }
    }
}

TEST_CASE("markov source rejects bad settings", "[data][markov]") {
    CHECK_THAT(error_of<ConfigError>([] { MarkovSource(32, 0, 0.25, 7, 1); }),
               Contains("data.markov_order"));
    CHECK_THAT(error_of<ConfigError>([] { MarkovSource(32, 1, 0.0, 7, 1); }),
               Contains("data.markov_alpha"));
    CHECK_THAT(error_of<ConfigError>([] { MarkovSource(1, 1, 0.25, 7, 1); }),
               Contains("model.vocab"));
    CHECK_THAT(error_of<ConfigError>([] { MarkovSource(50257, 1, 0.25, 7, 1); }),
               Contains("2^24") && Contains("data.source"));
}

TEST_CASE("mixture: one chain's symbols per sequence, chains drawn uniformly, floor reached",
          "[data][mixture]") {
    // 66 symbols, 4 chains of 16 (symbols 64, 65 unused), order 1 and 2.
    for (i64 k : {1, 2}) {
        const MixtureSource src(66, 4, k, 0.25, 7, 1337);
        REQUIRE(src.symbols_per_chain() == 16);
        const i64 T = 31, windows = 12000;
        const std::vector<int> tok = draw(src, T, Split::train, 3, 0, windows);
        std::array<i64, 4> count{};
        double sum = 0, sumsq = 0;
        for (i64 w = 0; w < windows; w++) {
            const int* row = &tok[w * (T + 1)];
            const i64 c = row[0] / 16;
            REQUIRE(c == src.chain_of(Split::train, 3, w));
            count[size_t(c)]++;
            bool own = true;
            std::vector<int> local(size_t(T + 1));
            for (i64 j = 0; j <= T; j++) {
                own = own && row[j] >= c * 16 && row[j] < (c + 1) * 16;
                local[size_t(j)] = row[j] - int(c * 16);
            }
            REQUIRE(own);
            // The window as the chain's own: the chain's window for the same sample.
            REQUIRE(local == draw(src.chain(c), T, Split::train, 3, w, 1));
            // The Bayes predictor that sees x_0 knows the chain; targets j = 1..T. For j < k it
            // needs the chain's stationary marginals, so only order 1 is scored exactly here.
            if (k == 1) {
                const auto [nll, n] = window_nll(src.chain(c), local.data(), T);
                REQUIRE(n == T);
                const double m = nll / double(T);
                sum += m;
                sumsq += m * m;
            }
        }
        const double p = 0.25, sd = std::sqrt(double(windows) * p * (1 - p));
        for (i64 c = 0; c < 4; c++) {
            INFO("k " << k << ", chain " << c << ": " << count[size_t(c)] << " of " << windows);
            CHECK(std::abs(double(count[size_t(c)]) - p * double(windows)) < 5 * sd);
        }
        // The chains differ (each its own table), and the floor is theirs on average.
        CHECK(src.chain(0).entropy_rate() != src.chain(1).entropy_rate());
        double mean_floor = 0;
        for (i64 c = 0; c < 4; c++) mean_floor += src.chain(c).window_floor(T) / 4;
        CHECK(src.window_floor(T) == Approx(mean_floor).epsilon(1e-15));
        CHECK(src.window_floor(T) < std::log(16.0));
        if (k == 1) {
            const double mean = sum / double(windows);
            const double se =
                std::sqrt((sumsq / double(windows) - mean * mean) / double(windows - 1));
            INFO("floor " << src.window_floor(T) << ", Bayes predictor " << mean << " +- " << se);
            CHECK(std::abs(mean - src.window_floor(T)) < 4 * se);
            CHECK(src.entropy_rate() == Approx(src.window_floor(T)).epsilon(1e-12));  // order 1
        }
    }
}

TEST_CASE("mixture sampling is a pure function of (seed, split, step, sample)", "[data][mixture]") {
    const MixtureSource src(32, 2, 1, 0.25, 7, 1337);
    const i64 T = 24;
    const std::vector<int> whole = draw(src, T, Split::train, 5, 0, 16);
    const MixtureSource again(32, 2, 1, 0.25, 7, 1337);
    std::vector<int> pieces = draw(again, T, Split::train, 5, 5, 11);
    const std::vector<int> head = draw(again, T, Split::train, 5, 0, 5);
    pieces.insert(pieces.begin(), head.begin(), head.end());
    CHECK(pieces == whole);
    CHECK(draw(src, T, Split::val, 5, 0, 16) != whole);
    CHECK(draw(src, T, Split::train, 6, 0, 16) != whole);
    // Another table seed gives other chains, none equal to a plain chain of a nearby seed.
    CHECK(draw(MixtureSource(32, 2, 1, 0.25, 8, 1337), T, Split::train, 5, 0, 16) != whole);
    CHECK(mixture_table_seed(7, 0) != mixture_table_seed(7, 1));
    CHECK(mixture_table_seed(7, 0) != 7);
    CHECK(mixture_table_seed(7, 0) < (u64(1) << 63));
    CHECK_THAT(error_of<ConfigError>([] { MixtureSource(6, 4, 1, 0.25, 7, 1); }),
               Contains("data.mixture_chains = 4") && Contains("6 symbols"));
}

TEST_CASE("copy: windows repeat their first D tokens, and both floors are exact", "[data][copy]") {
    const i64 V = 16, D = 12, T = 40;
    const CopySource src(V, D, 1337);
    const i64 windows = 4000;
    const std::vector<int> tok = draw(src, T, Split::train, 2, 0, windows);
    std::vector<i64> count(size_t(V), 0);
    for (i64 w = 0; w < windows; w++) {
        const int* row = &tok[w * (T + 1)];
        for (i64 j = 0; j <= T; j++) {
            REQUIRE(row[j] >= 0);
            REQUIRE(row[j] < V);
            if (j >= D)
                REQUIRE(row[j] == row[j - D]);
            else
                count[size_t(row[j])]++;
        }
    }
    // The first D tokens are uniform (chi-square, 15 degrees of freedom, far tail 50).
    double chi2 = 0;
    const double expect = double(windows * D) / double(V);
    for (i64 v = 0; v < V; v++)
        chi2 += (double(count[size_t(v)]) - expect) * (double(count[size_t(v)]) - expect) / expect;
    CHECK(chi2 < 50);
    // Targets 1..T: 11 new ones (ln 16 each) and 29 copies, free with the whole window.
    const double ln = std::log(16.0);
    CHECK(src.window_floor(T) == Approx(11 * ln / 40).epsilon(1e-15));
    CHECK(CopySource::context_floor(V, D, T, D) == src.window_floor(T));
    CHECK(CopySource::context_floor(V, D, T, D - 1) == Approx(ln).epsilon(1e-15));  // no copy seen
    // A window shorter than D holds no copy: its floor is ln V whatever the context.
    CHECK(CopySource::context_floor(V, D, D - 1, D - 1) == Approx(ln).epsilon(1e-15));
    // Determinism and the sample-range property, as every source has them.
    std::vector<int> pieces = draw(src, T, Split::train, 2, 7, 9);
    const std::vector<int> head = draw(CopySource(V, D, 1337), T, Split::train, 2, 0, 7);
    pieces.insert(pieces.begin(), head.begin(), head.end());
    CHECK(std::equal(pieces.begin(), pieces.end(), tok.begin()));
    CHECK(draw(src, T, Split::val, 2, 0, 16) != draw(src, T, Split::train, 2, 0, 16));
    CHECK_THAT(error_of<ConfigError>([] { CopySource(16, 0, 1); }), Contains("data.copy_distance"));
}

TEST_CASE("bin token files round trip", "[data][bin]") {
    const std::string train = temp_path("train.bin"), val = temp_path("val.bin");
    std::vector<std::uint16_t> a(5000), b(300);
    for (size_t i = 0; i < a.size(); i++) a[i] = std::uint16_t((i * 7919) % 50);
    for (size_t i = 0; i < b.size(); i++) b[i] = std::uint16_t((i * 13) % 50);
    write_llmc_tokens(train, a);
    write_llmc_tokens(val, b);
    CHECK(std::filesystem::file_size(train) == 1024 + 2 * a.size());

    const BinTokenSource src(train, val, 50, 32, 1337);
    CHECK(src.vocab() == 50);
    CHECK(src.num_tokens(Split::train) == 5000);
    CHECK(src.num_tokens(Split::val) == 300);
    const i64 T = 32, count = 64;
    for (Split split : {Split::train, Split::val}) {
        const std::vector<std::uint16_t>& ref = split == Split::train ? a : b;
        const std::vector<int> tok = draw(src, T, split, 3, 10, count);
        std::vector<i64> starts;
        for (i64 i = 0; i < count; i++) {
            const i64 s = src.window_start(T, split, 3, 10 + i);
            starts.push_back(s);
            REQUIRE(s >= 0);
            REQUIRE(s + T < i64(ref.size()));
            for (i64 j = 0; j <= T; j++) CHECK(tok[i * (T + 1) + j] == int(ref[s + j]));
        }
        std::sort(starts.begin(), starts.end());
        CHECK(std::unique(starts.begin(), starts.end()) - starts.begin() > count / 2);
    }
    // The microbatch property, and different steps differ.
    const std::vector<int> whole = draw(src, T, Split::train, 9, 0, 6);
    std::vector<int> pieces = draw(src, T, Split::train, 9, 0, 2);
    const std::vector<int> rest = draw(src, T, Split::train, 9, 2, 4);
    pieces.insert(pieces.end(), rest.begin(), rest.end());
    CHECK(pieces == whole);
    CHECK(draw(src, T, Split::train, 10, 0, 6) != whole);

    // Without a val file, the val split is an error that says what to set.
    const BinTokenSource no_val(train, "", 50, 32, 1337);
    CHECK_THAT(error_of<DataError>([&] { draw(no_val, T, Split::val, 0, 0, 1); }),
               Contains("data.val_path") && Contains("train.eval_every = 0"));
    std::remove(train.c_str());
    std::remove(val.c_str());
}

TEST_CASE("malformed bin token files get their intended errors", "[data][bin]") {
    const std::string path = temp_path("bad.bin");
    std::vector<std::uint16_t> tok(100, 3);
    auto open = [&] { return error_of<DataError>([&] { BinTokenSource(path, "", 50, 16, 1); }); };

    SECTION("missing") {
        std::remove(path.c_str());
        CHECK_THAT(open(),
                   Contains(path) && Contains("cannot open") && Contains("data.train_path"));
    }
    SECTION("shorter than the header") {
        std::ofstream(path, std::ios::binary) << "tiny";
        CHECK_THAT(open(), Contains(path) && Contains("4 bytes") && Contains("1024-byte"));
    }
    SECTION("truncated") {
        write_raw(path, {kLlmcTokenMagic, 1, 100}, std::vector<std::uint16_t>(60, 3));
        CHECK_THAT(open(), Contains("truncated") && Contains("100 tokens") &&
                               Contains("1224 bytes") && Contains("1144 bytes"));
    }
    SECTION("trailing bytes") {
        write_raw(path, {kLlmcTokenMagic, 1, 50}, tok);
        CHECK_THAT(open(), Contains("1224 bytes") && Contains("50 tokens") && Contains("corrupt"));
    }
    SECTION("wrong magic") {
        write_raw(path, {12345, 1, 100}, tok);
        CHECK_THAT(open(), Contains("magic number 12345") && Contains("20240520"));
    }
    SECTION("checkpoint magic") {
        write_raw(path, {kLlmcCheckpointMagic, 3, 100}, tok);
        CHECK_THAT(open(),
                   Contains("20240326") && Contains("checkpoint") && Contains("model.init_from"));
    }
    SECTION("wrong version") {
        write_raw(path, {kLlmcTokenMagic, 2, 100}, tok);
        CHECK_THAT(open(), Contains("version 2") && Contains("version 1"));
    }
    SECTION("token >= vocab") {
        tok[17] = 60;
        write_raw(path, {kLlmcTokenMagic, 1, 100}, tok);
        CHECK_THAT(open(), Contains("token 60 at position 17") && Contains("model.vocab = 50"));
    }
    SECTION("too few tokens for one window") {
        write_raw(path, {kLlmcTokenMagic, 1, 16}, std::vector<std::uint16_t>(16, 3));
        CHECK_THAT(open(), Contains("16 tokens") && Contains("too few") && Contains("17"));
        // Exactly seq_len + 1 tokens is enough: one window, starting at 0.
        write_raw(path, {kLlmcTokenMagic, 1, 17}, std::vector<std::uint16_t>(17, 3));
        const BinTokenSource ok(path, "", 50, 16, 1);
        CHECK(ok.window_start(16, Split::train, 7, 3) == 0);
    }
    std::remove(path.c_str());
}

TEST_CASE("make_source follows the config", "[data]") {
    Config cfg;
    cfg.model.vocab = 20;
    auto markov = make_source(cfg);
    CHECK(markov->vocab() == 20);
    CHECK(dynamic_cast<MarkovSource*>(markov.get()) != nullptr);
    CHECK(markov->entropy_rate() > 0);

    cfg.data.source = "mixture";
    cfg.data.mixture_chains = 3;
    auto mixture = make_source(cfg);
    const auto* mix = dynamic_cast<MixtureSource*>(mixture.get());
    REQUIRE(mix != nullptr);
    CHECK(mix->chains() == 3);
    CHECK(mix->symbols_per_chain() == 6);
    CHECK(mixture->window_floor(cfg.model.seq_len) > 0);

    cfg.data.source = "copy";
    auto copy = make_source(cfg);
    const auto* cp = dynamic_cast<CopySource*>(copy.get());
    REQUIRE(cp != nullptr);
    CHECK(cp->distance() == cfg.model.seq_len / 2);  // copy_distance = 0
    CHECK(copy->entropy_rate() == -1);               // windows, not a stationary process
    cfg.data.copy_distance = 5;
    CHECK(dynamic_cast<CopySource*>(make_source(cfg).get())->distance() == 5);

    cfg.data.source = "csv";
    CHECK_THAT(error_of<ConfigError>([&] { make_source(cfg); }),
               Contains("data.source") && Contains("csv"));

    cfg.data.source = "bin";
    CHECK_THAT(error_of<ConfigError>([&] { make_source(cfg); }), Contains("data.val_path"));
    cfg.train.eval_every = 0;
    CHECK_THAT(error_of<ConfigError>([&] { make_source(cfg); }), Contains("data.train_path"));

    const std::string train = temp_path("cfg_train.bin");
    write_llmc_tokens(train, std::vector<std::uint16_t>(cfg.model.seq_len + 10, 19));
    cfg.data.train_path = train;
    auto bin = make_source(cfg);
    CHECK(dynamic_cast<BinTokenSource*>(bin.get()) != nullptr);
    std::remove(train.c_str());
}
