// The MPI backend (core/comm/mpi.h) under `mpirun -np 4`: every collective gives the in-process
// backend's bits for the same inputs (both algorithms, groups of 4, 3 and 1, uneven counts); a
// training run with ranks as processes gives the single-device reference's bits and the
// in-process run's, for dp, dp×tp, tp×pp and pp×dp layouts with ZeRO; and a rank that skips a
// collective, calls another one, or aborts makes the others fail within the timeout, naming it;
// and a test's swap of two partials (tests/support/mutations.h) gives the in-process bits.
//
// Every rank runs every test case (Catch2 with MPI initialised in main). References that need
// no MPI (in-process runs, single device) are computed by rank 0 while the others wait in a
// barrier, which polls and sleeps, so oversubscribed ranks leave it the cores.
#include "core/comm/comm.h"
#include "core/comm/run_ranks.h"
#include "core/comm/mpi.h"
#include "core/base/config.h"
#include "core/train/job.h"
#include "tests/support/mutations.h"
#include "core/base/numerics.h"
#include "core/parallel/pipeline/pipeline.h"
#include "core/train/runner.h"
#include "core/io/state.h"
#include "tests/support/test_util.h"

#include "tests/mpi/catch_runner.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace px;
using namespace px::comm;

namespace {

const MpiEnvironment* g_mpi = nullptr;
constexpr int kRanks = 4;

using Blob = std::vector<char>;

template <class T>
Blob blob(const std::vector<T>& v) {
    Blob b(v.size() * sizeof(T));
    if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
    return b;
}

// Values of very different magnitudes, so that any other association gives other bits.
std::vector<float> awkward(i64 n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    return v;
}

// Every collective of the interface on communicator c, with inputs that depend only on the
// rank and `seed`; returns each output as bytes, in call order. Runs on either backend.
void exercise(Communicator& c, unsigned seed, std::vector<Blob>& out) {
    const int p = c.size(), r = c.rank();
    const unsigned s = seed * 100 + static_cast<unsigned>(r);
    for (Algo algo : {Algo::canonical, Algo::ring}) {
        std::vector<float> x = awkward(2501, s);  // uneven chunks at p = 3, 4
        c.all_reduce(x.data(), static_cast<i64>(x.size()), algo);
        out.push_back(blob(x));
        const i64 n = 301;
        const std::vector<float> in = awkward(n * p, s + 7);
        std::vector<float> rs(static_cast<size_t>(n));
        c.reduce_scatter(rs.data(), in.data(), n, algo);
        out.push_back(blob(rs));
    }
    {
        std::vector<float> x = awkward(777, s + 1);
        if (r == 0) x[5] = std::nanf("");
        c.all_reduce_max(x.data(), 777);
        out.push_back(blob(x));
        std::vector<double> d(100);
        for (size_t i = 0; i < d.size(); i++)
            d[i] = std::ldexp(1.0 + r * 0.1, static_cast<int>(i % 50) - 25);
        c.all_reduce(d.data(), 100);
        out.push_back(blob(d));
        std::vector<i64> k(33);
        for (size_t i = 0; i < k.size(); i++) k[i] = static_cast<i64>(i) * (r + 1) - 7;
        c.all_reduce(k.data(), 33);
        out.push_back(blob(k));
    }
    {
        const std::vector<float> in = awkward(50, s + 2);
        std::vector<float> g(static_cast<size_t>(50 * p));
        c.all_gather(g.data(), in.data(), 50);
        out.push_back(blob(g));
        std::vector<i64> counts(static_cast<size_t>(p));
        i64 total = 0;
        for (int k = 0; k < p; k++)
            total += counts[static_cast<size_t>(k)] = (k * 37) % 5 * 11;  // zeros too
        const std::vector<float> mine = awkward(counts[static_cast<size_t>(r)], s + 3);
        std::vector<float> gv(static_cast<size_t>(total));
        c.all_gather_v(gv.data(), mine.data(), counts);
        out.push_back(blob(gv));
        std::vector<float> b = awkward(64, s + 4);
        c.broadcast(b.data(), 64, p - 1);
        out.push_back(blob(b));
        const std::vector<float> a2 = awkward(9 * p, s + 5);
        std::vector<float> o2(a2.size());
        c.all_to_all(o2.data(), a2.data(), 9);
        out.push_back(blob(o2));
        std::vector<i64> inc(static_cast<size_t>(p)), outc(static_cast<size_t>(p));
        i64 ti = 0, to = 0;
        for (int k = 0; k < p; k++) {
            ti += inc[static_cast<size_t>(k)] = (r + 2 * k) % 4;
            to += outc[static_cast<size_t>(k)] = (k + 2 * r) % 4;
        }
        const std::vector<float> av = awkward(ti, s + 6);
        std::vector<float> ov(static_cast<size_t>(to));
        c.all_to_all_v(ov.data(), outc, av.data(), inc);
        out.push_back(blob(ov));
        // 16- and 8-bit floats move as their bits (a bf16 activation, an fp8 weight).
        std::vector<std::uint16_t> h16(static_cast<size_t>(21)), g16(static_cast<size_t>(21 * p));
        for (size_t i = 0; i < h16.size(); i++)
            h16[i] = static_cast<std::uint16_t>(0xFFC0 ^ (i * 977 + static_cast<size_t>(r) * 31));
        c.all_gather(g16.data(), h16.data(), 21);
        out.push_back(blob(g16));
        std::vector<std::uint8_t> s8(static_cast<size_t>(5 * p)), r8(s8.size());
        for (size_t i = 0; i < s8.size(); i++)
            s8[i] = static_cast<std::uint8_t>(i * 41 + static_cast<size_t>(r) * 7);
        c.all_to_all(r8.data(), s8.data(), 5);
        out.push_back(blob(r8));
    }
    {  // a ring of messages, and async collectives in issue order
        const std::vector<float> msg = awkward(40, s + 8);
        std::vector<float> got(40);
        Handle h = c.send_async(msg.data(), 40, (r + 1) % p, 3);
        c.recv(got.data(), 40, (r + p - 1) % p, 3);
        h.wait();
        out.push_back(blob(got));
        std::vector<float> x = awkward(1000, s + 9), g(static_cast<size_t>(10 * p));
        const std::vector<float> gi = awkward(10, s + 10);
        Handle h1 = c.all_reduce_async(x.data(), 1000);
        Handle h2 = c.all_gather_async(g.data(), gi.data(), 10);
        h2.wait();
        h1.wait();
        out.push_back(blob(x));
        out.push_back(blob(g));
        c.barrier();
    }
}

// exercise on the world and on its splits: {0, 1, 2} and {3} (non-power-of-two and one rank),
// and the world reordered by key.
void exercise_groups(Communicator& world, std::vector<Blob>& out) {
    exercise(world, 1, out);
    const int r = world.rank();
    auto part = world.split(r < 3 ? 0 : 1, r, r < 3 ? "three" : "one");
    exercise(*part, 2, out);
    auto rev = world.split(0, -r, "reversed");
    exercise(*rev, 3, out);
}

// The canonical all_reduce of `exercise` formed here from every rank's inputs.
std::vector<float> canonical_of_world(int p) {
    std::vector<std::vector<float>> x;
    for (int k = 0; k < p; k++) x.push_back(awkward(2501, 100 + static_cast<unsigned>(k)));
    std::vector<float> out(2501), col(static_cast<size_t>(p));
    for (size_t i = 0; i < out.size(); i++) {
        for (int k = 0; k < p; k++) col[static_cast<size_t>(k)] = x[static_cast<size_t>(k)][i];
        out[i] = tree_sum(col.data(), p);
    }
    return out;
}

}  // namespace

TEST_CASE("MPI collectives give the in-process backend's bits: every op, both algorithms, groups") {
    REQUIRE(g_mpi->size() == kRanks);
    const int me = g_mpi->rank();
    // In-process: the same calls on 4 threads; this rank keeps what its namesake thread got.
    std::vector<std::vector<Blob>> inproc(kRanks);
    run_ranks(kRanks, 30,
              [&](Communicator& c) { exercise_groups(c, inproc[static_cast<size_t>(c.rank())]); });
    std::vector<Blob> got;
    auto world = g_mpi->world(60);
    exercise_groups(*world, got);
    REQUIRE(got.size() == inproc[static_cast<size_t>(me)].size());
    for (size_t i = 0; i < got.size(); i++) {
        INFO("rank " << me << ", output " << i);
        CHECK(got[i] == inproc[static_cast<size_t>(me)][i]);
    }
    // The canonical all_reduce is the canonical tree over ranks (core/base/numerics.h), bit for bit.
    CHECK(got[0] == blob(canonical_of_world(kRanks)));
    // Accounting: every world collective recorded, by name.
    const CommStats st = world->stats();
    CHECK(st.group == "world");
    CHECK(st[Op::all_reduce].calls == 5);  // canonical, ring, f64, i64, async
    CHECK(st[Op::split].calls == 2);
    CHECK(st[Op::all_reduce].bytes_sent > 0);
    world->barrier();
}

TEST_CASE("a test's swap of two partials in one all_reduce gives the in-process bits") {
    // Rank k contributes x_k on every element; elements [3, 7) of 10 reduce with ranks 1 and 2
    // swapped: (x0 + x2) + (x1 + x3) instead of (x0 + x1) + (x2 + x3), which differ here.
    const float x[kRanks] = {1.0f, std::ldexp(1.0f, -24), -1.0f, std::ldexp(1.0f, -24)};
    auto run = [&](Communicator& c) {
        std::vector<float> v(10, x[c.rank()]);
        test::mutation::SwapPartials swap(c.split(0, c.rank(), c.group()), 1, 2);
        swap.arm(3, 7, 10);
        swap.all_reduce(v.data(), 10);
        return v;
    };
    std::vector<std::vector<float>> inproc(kRanks);
    run_ranks(kRanks, 30, [&](Communicator& c) { inproc[static_cast<size_t>(c.rank())] = run(c); });
    auto world = g_mpi->world(60);
    const std::vector<float> got = run(*world);
    CHECK(test::same_bits(got, inproc[static_cast<size_t>(g_mpi->rank())]));
    const float plain = (x[0] + x[1]) + (x[2] + x[3]), swapped = (x[0] + x[2]) + (x[1] + x[3]);
    REQUIRE(plain != swapped);
    for (size_t i = 0; i < got.size(); i++) CHECK(got[i] == (i >= 3 && i < 7 ? swapped : plain));
    world->barrier();
}

namespace {

// The tiny default job, 3 steps, one thread per rank; blocks of 32 so that tp = 2 cuts whole
// blocks.
Config small(const std::vector<std::string>& sets) {
    Config c = parse_config(default_config_toml(), "<embedded default>");
    apply_overrides(c, {"train.steps=3", "train.threads=1", "numerics.block=32",
                        "output.run_file=false", "output.progress=false"});
    apply_overrides(c, sets);
    c.layout.timeout_s = 120;
    return c;
}

LogicalState in_process(const Config& c) {
    LogicalState s;
    bool agree = true;
    run_layout(c, {}, test::inspecting([&](Job& j) { agree = absorb(s, j) && agree; }));
    CHECK(agree);
    return s;
}

// precision: keys of the run and of its single-device reference alike (fp16, fp8).
void check_layout(std::vector<std::string> sets, const std::vector<std::string>& precision = {}) {
    sets.insert(sets.begin(), precision.begin(), precision.end());
    const Config c = small(sets);
    auto world = g_mpi->world(c.layout.timeout_s);
    LogicalState s;
    bool agree = true;
    run_rank(c, *world, {}, test::inspecting([&](Job& j) { agree = absorb(s, j) && agree; }));
    agree = gather_state(s, *world, c.model) && agree;
    if (world->rank() == 0) {
        std::string what;
        for (const auto& kv : sets) what += kv + " ";
        INFO("layout " << what);
        CHECK(agree);
        CHECK(s.complete());
        CHECK(s.history.size() == 3);
        Config ref = small(precision);
        test::check_same_bits(test::single_device(ref), s);  // the single-device reference
        test::check_same_bits(in_process(c), s);             // the in-process run, same layout
    }
    world->barrier();  // the others wait (polling, sleeping) while rank 0 checks
}

}  // namespace

TEST_CASE("training under MPI equals the single device and the in-process run, bit for bit") {
    SECTION("dp4, ZeRO-1") {
        check_layout({"layout.dp=4", "layout.zero=1"});
    }
    SECTION("dp2 x tp2, ZeRO-3") {
        check_layout({"layout.dp=2", "layout.tp=2", "layout.zero=3"});
    }
    SECTION("tp2 x pp2") {
        check_layout({"layout.tp=2", "layout.pp=2", "layout.microbatches=2"});
    }
    SECTION("pp2 x dp2, ZeRO-1") {
        check_layout({"layout.pp=2", "layout.dp=2", "layout.zero=1", "layout.microbatches=2"});
    }
    SECTION("fp16 (loss scaling): dp2 x tp2, ZeRO-3") {
        check_layout({"layout.dp=2", "layout.tp=2", "layout.zero=3"},
                     {"precision.activations=fp16"});
    }
    SECTION("fp8 delayed: tp2 x pp2, and dp4 ZeRO-2") {
        const std::vector<std::string> fp8 = {"precision.activations=bf16", "precision.fp8=delayed",
                                              "precision.fp8_keep_ends_bf16=false",
                                              "precision.fp8_amax_history_len=4"};
        check_layout({"layout.tp=2", "layout.pp=2", "layout.microbatches=2"}, fp8);
        check_layout({"layout.dp=4", "layout.zero=2"}, fp8);
    }
    SECTION("bf16: dp2 x tp2 with SP, ZeRO-3, and pp2 x dp2") {
        const std::vector<std::string> bf16 = {"precision.activations=bf16"};
        check_layout({"layout.dp=2", "layout.tp=2", "layout.sequence_parallel=true", "layout.zero=3"}, bf16);
        check_layout({"layout.pp=2", "layout.dp=2", "layout.microbatches=2"}, bf16);
    }
    SECTION("context parallelism: cp4 ring, cp2 x dp2 Ulysses, cp2 x tp2 ring") {
        // zig-zag chunks of 16 tokens (T = 128 at cp4): whole blocks of 16
        const std::vector<std::string> blocks = {"numerics.block=16"};
        check_layout({"layout.cp=4"}, blocks);
        check_layout({"layout.cp=2", "layout.dp=2", "layout.cp_method=ulysses"}, blocks);
        check_layout({"layout.cp=2", "layout.tp=2"}, blocks);
    }
    SECTION("fp8 block: tp2 x pp2, and dp4 ZeRO-2") {
        // tiles of 16: tp2's halves of hidden and ffn are whole tiles
        const std::vector<std::string> fp8 = {"precision.activations=bf16", "precision.fp8=block",
                                              "precision.fp8_keep_ends_bf16=false",
                                              "precision.fp8_block_size=16"};
        check_layout({"layout.tp=2", "layout.pp=2", "layout.microbatches=2"}, fp8);
        check_layout({"layout.dp=4", "layout.zero=2"}, fp8);
    }
    SECTION("MoE: dp4 ZeRO-3, and pp2 x dp2") {
        // 4 experts, top-2, capacity 1 (drops), a shared expert
        const std::vector<std::string> moe = {"model.moe_experts=4", "model.moe_top_k=2",
                                              "model.moe_ffn=32", "model.moe_capacity_factor=1",
                                              "model.moe_shared_experts=1"};
        check_layout({"layout.dp=4", "layout.zero=3"}, moe);
        check_layout({"layout.pp=2", "layout.dp=2", "layout.microbatches=2"}, moe);
    }
    SECTION("expert parallelism: ep4, ep2 x dp2, ep2 x pp2 and ep2 x tp2") {
        // blocks of 16: an ep4 rank's one expert of 32 channels is whole blocks
        const std::vector<std::string> moe = {"model.moe_experts=4", "model.moe_top_k=2",
                                              "model.moe_ffn=32", "model.moe_capacity_factor=1",
                                              "model.moe_shared_experts=1", "numerics.block=16"};
        check_layout({"layout.dp=4", "layout.ep=4"}, moe);
        check_layout({"layout.dp=4", "layout.ep=2", "layout.microbatches=2"}, moe);
        check_layout({"layout.dp=2", "layout.ep=2", "layout.pp=2", "layout.microbatches=2"}, moe);
        check_layout({"layout.dp=2", "layout.ep=2", "layout.tp=2"}, moe);
    }
}

TEST_CASE("a world of the wrong size is a ConfigError naming both numbers") {
    const Config c = small({"layout.dp=2"});
    auto world = g_mpi->world(30);
    CHECK_THROWS_WITH(run_rank(c, *world, {}), Catch::Contains("the world has 4 ranks") &&
                                                   Catch::Contains("= 2") &&
                                                   Catch::Contains("mpirun -np 2"));
    world->barrier();
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("a rank that calls another collective: every rank names both sides at once") {
    auto world = g_mpi->world(30);
    const int r = world->rank();
    std::vector<float> x(16, 1.0f);
    std::string err;
    const auto t0 = std::chrono::steady_clock::now();
    try {
        if (r == 3)
            world->broadcast(x.data(), 16, 0);
        else
            world->all_reduce(x.data(), 16);
    } catch (const CommError& e) {
        err = e.what();
    }
    INFO(err);
    CHECK(seconds_since(t0) < 10);
    CHECK(has(err, "disagree on the collective"));
    CHECK(has(err, "ranks 0, 1, 2 called all_reduce #1"));
    CHECK(has(err, "rank 3 called broadcast #1"));
    // A failed job stays failed.
    CHECK_THROWS_WITH(world->barrier(), Catch::Contains("abandoned because the job failed"));
}

TEST_CASE("abort() on one rank fails the others' pending and later operations") {
    auto world = g_mpi->world(30);
    std::string err;
    try {
        if (world->rank() == 1) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            world->abort("rank 1 found a bad batch");
        }
        world->barrier();
    } catch (const CommError& e) {
        err = e.what();
    }
    INFO(err);
    CHECK(has(err, "rank 1 found a bad batch"));
}

TEST_CASE("a rank that skips a collective: the others fail within the timeout, naming it") {
    const double timeout = 2.0;
    auto world = g_mpi->world(timeout);
    const int r = world->rank();
    std::vector<float> x(16, 1.0f);
    world->all_reduce(x.data(), 16);  // #1: everyone
    std::string err;
    const auto t0 = std::chrono::steady_clock::now();
    try {
        if (r != 3) {
            world->all_reduce(x.data(), 16);  // #2: rank 3 never comes
        } else {
            // Rank 3 went elsewhere: it waits for a message nobody sends, and hears of the
            // failure instead of timing out itself (its wait started later).
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
            float y = 0;
            world->recv(&y, 1, 0, 99);
        }
    } catch (const CommError& e) {
        err = e.what();
    }
    const double secs = seconds_since(t0);
    INFO("rank " << r << ": " << err);
    CHECK(secs >= (r != 3 ? timeout * 0.9 : 0.0));
    CHECK(secs < timeout + 3);
    CHECK(has(err, "all_reduce #2 in group 'world' (size 4)"));
    CHECK(has(err, "rank 3 did not arrive within 2.00 s (ranks 0, 1, 2 did)"));
    if (r == 3) CHECK(has(err, "abandoned because the job failed"));
}

int main(int argc, char** argv) {
    std::unique_ptr<MpiEnvironment> mpi;
    try {
        mpi = std::make_unique<MpiEnvironment>(&argc, &argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "test_mpi: %s\n", e.what());
        return 1;
    }
    g_mpi = mpi.get();
    if (g_mpi->size() != kRanks) {
        if (g_mpi->rank() == 0)
            std::fprintf(stderr, "test_mpi: run it under `mpirun -np %d` (got %d ranks)\n", kRanks,
                         g_mpi->size());
        return 1;
    }
    const int rc = px::test::run_catch(argc, argv);
    return rc;
}
