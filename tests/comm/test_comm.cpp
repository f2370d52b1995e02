// core/comm on the in-process backend: canonical collectives against the canonical tree of
// core/base/numerics.h bit for bit (whatever the arrival order), the ring against its documented
// order, every collective's data movement, groups, async handles, failures (timeout, departure,
// a throwing rank, mismatches) and the accounting.
//
// Catch2 assertions are not thread-safe: rank threads only record what they saw (each into its
// own slot), and the test thread checks it after run_ranks has joined them.
#include "core/comm/comm.h"
#include "core/comm/inproc.h"
#include "core/comm/run_ranks.h"
#include "core/base/numerics.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

using namespace px;
using namespace px::comm;

namespace {

constexpr double kTimeout = 20.0;  // for tests that must not fail; a failure still ends in time

// Values of very different magnitudes, so that any other association gives other bits.
std::vector<float> awkward(i64 n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (i64 i = 0; i < n; i++) v[i] = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A few milliseconds, different per rank and repetition, so that arrival order varies.
void random_delay(unsigned seed) {
    std::mt19937 rng(seed);
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 4000));
}

// The canonical tree over ranks, element by element, via core/base/numerics.h's tree_sum.
std::vector<float> tree_over_ranks(const std::vector<std::vector<float>>& x, i64 lo, i64 hi) {
    const int p = static_cast<int>(x.size());
    std::vector<float> out(hi - lo), col(p);
    for (i64 i = lo; i < hi; i++) {
        for (int k = 0; k < p; k++) col[k] = x[k][i];
        out[i - lo] = tree_sum(col.data(), p);
    }
    return out;
}

// The ring order documented in comm.h: element i of chunk c is x_{c+1} + x_{c+2} + ... + x_c.
float ring_value(const std::vector<std::vector<float>>& x, i64 i, int c) {
    const int p = static_cast<int>(x.size());
    float acc = x[(c + 1) % p][i];
    for (int j = 2; j <= p; j++) acc = acc + x[(c + j) % p][i];
    return acc;
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

}  // namespace

// ---- reducing collectives --------------------------------------------------------------------

TEST_CASE("canonical all_reduce is the canonical tree over ranks, bit for bit, any arrival order") {
    const i64 n = 2500;  // several tiles per chunk at small p, uneven chunks at p = 3, 6, 7
    for (int p = 1; p <= 8; p++) {
        for (int rep = 0; rep < 3; rep++) {
            std::vector<std::vector<float>> x(p);
            for (int r = 0; r < p; r++) x[r] = awkward(n, 1000 * p + 10 * rep + r);
            const std::vector<float> expect = tree_over_ranks(x, 0, n);
            std::vector<std::vector<float>> got(p);
            run_ranks(p, kTimeout, [&](Communicator& c) {
                std::vector<float> buf = x[c.rank()];
                random_delay(7 * p + 3 * rep + c.rank() * 101);
                c.all_reduce(buf.data(), n, Algo::canonical);
                got[c.rank()] = buf;
            });
            INFO("p = " << p << ", repetition " << rep);
            for (int r = 0; r < p; r++) CHECK(same_bits(got[r], expect));
            if (p >= 4) {
                // The test can fail: a left-to-right (or arrival-order) sum gives other bits.
                i64 differ = 0;
                for (i64 i = 0; i < n; i++) {
                    float seq = 0.0f;
                    for (int k = 0; k < p; k++) seq += x[k][i];
                    differ += std::memcmp(&seq, &expect[i], sizeof seq) != 0;
                }
                CHECK(differ > 0);
            }
        }
    }
}

TEST_CASE("canonical all_reduce of one tree node per rank is the single-device canonical sum") {
    // K = 768 in blocks of 64 (12 blocks); at tp = 4 each rank owns one node of three blocks, and
    // the all-reduce adds the four nodes in the tree above them.
    const int block = 64, tp = 4;
    const auto v = awkward(768, 42);
    const float single = canonical_sum(v.data(), 768, block);
    std::vector<float> got(tp);
    run_ranks(tp, kTimeout, [&](Communicator& c) {
        float part = canonical_sum(v.data() + 192 * c.rank(), 192, block);
        c.all_reduce(&part, 1);
        got[c.rank()] = part;
    });
    for (int r = 0; r < tp; r++) CHECK(std::memcmp(&got[r], &single, sizeof single) == 0);
}

TEST_CASE("ring all_reduce: within fp32 rounding, the documented order, same bits everywhere") {
    const i64 n = 999;
    for (int p : {1, 2, 3, 5, 8}) {
        std::vector<std::vector<float>> x(p);
        for (int r = 0; r < p; r++) x[r] = awkward(n, 77 * p + r);
        std::vector<std::vector<float>> got(p);
        run_ranks(p, kTimeout, [&](Communicator& c) {
            std::vector<float> buf = x[c.rank()];
            random_delay(13 * p + c.rank());
            c.all_reduce(buf.data(), n, Algo::ring);
            got[c.rank()] = buf;
        });
        INFO("p = " << p);
        for (int r = 1; r < p; r++) CHECK(same_bits(got[r], got[0]));
        i64 bad_order = 0, bad_bound = 0;
        for (int c = 0; c < p; c++) {
            for (i64 i = chunk_lo(n, p, c); i < chunk_lo(n, p, c + 1); i++) {
                const float want = ring_value(x, i, c);
                bad_order += std::memcmp(&want, &got[0][i], sizeof want) != 0;
                double exact = 0, mag = 0;
                for (int k = 0; k < p; k++) {
                    exact += x[k][i];
                    mag += std::fabs(x[k][i]);
                }
                // A sequential sum of p terms errs by at most (p-1)·u·Σ|x| (u = 2^-24), to first
                // order; twice that covers the second-order term.
                bad_bound +=
                    std::fabs(got[0][i] - exact) > 2.0 * (p - 1) * std::ldexp(1.0, -24) * mag;
            }
        }
        CHECK(bad_order == 0);
        CHECK(bad_bound == 0);
    }
}

TEST_CASE("reduce_scatter: chunk r is the all_reduce's chunk r, both algorithms, and in place") {
    const int p = 6;
    const i64 m = 333;  // per rank
    std::vector<std::vector<float>> x(p);
    for (int r = 0; r < p; r++) x[r] = awkward(p * m, 500 + r);
    std::vector<std::vector<float>> canon(p), ring(p), inplace(p);
    run_ranks(p, kTimeout, [&](Communicator& c) {
        const int r = c.rank();
        std::vector<float> out(m);
        random_delay(r * 31);
        c.reduce_scatter(out.data(), x[r].data(), m, Algo::canonical);
        canon[r] = out;
        c.reduce_scatter(out.data(), x[r].data(), m, Algo::ring);
        ring[r] = out;
        std::vector<float> buf = x[r];
        c.reduce_scatter(buf.data() + r * m, buf.data(), m);  // out = in + rank·n: in place
        inplace[r].assign(buf.begin() + r * m, buf.begin() + (r + 1) * m);
    });
    for (int r = 0; r < p; r++) {
        INFO("rank " << r);
        CHECK(same_bits(canon[r], tree_over_ranks(x, r * m, (r + 1) * m)));
        CHECK(same_bits(inplace[r], canon[r]));
        std::vector<float> want(m);
        for (i64 i = 0; i < m; i++) want[i] = ring_value(x, r * m + i, r);
        CHECK(same_bits(ring[r], want));
    }
}

TEST_CASE("all_reduce_max and other element types") {
    const int p = 5;
    std::vector<std::vector<double>> sum_f64(p);
    std::vector<std::vector<i64>> sum_i64(p), max_i64(p);
    std::vector<std::vector<float>> max_f32(p);
    run_ranks(p, kTimeout, [&](Communicator& c) {
        const int r = c.rank();
        std::vector<double> d = {0.5 * r, 1e300 * (r == 3), -1.0};
        c.all_reduce(d.data(), 3);
        sum_f64[r] = d;
        std::vector<i64> a = {r, i64{1} << 40, -r * r};
        c.all_reduce(a.data(), 3);
        sum_i64[r] = a;
        std::vector<i64> b = {r, -r};
        c.all_reduce_max(b.data(), 2);
        max_i64[r] = b;
        std::vector<float> f = {static_cast<float>(r), r == 2 ? NAN : 0.0f, -1.0f * r};
        c.all_reduce_max(f.data(), 3);
        max_f32[r] = f;
    });
    for (int r = 0; r < p; r++) {
        CHECK(sum_f64[r] == std::vector<double>{5.0, 1e300, -5.0});
        CHECK(sum_i64[r] == std::vector<i64>{10, i64{5} << 40, -30});
        CHECK(max_i64[r] == std::vector<i64>{4, 0});
        CHECK(max_f32[r][0] == 4.0f);
        CHECK(std::isnan(max_f32[r][1]));  // NaN wins
        CHECK(max_f32[r][2] == 0.0f);
    }
}

// ---- data movement ---------------------------------------------------------------------------

TEST_CASE("all_gather, all_gather_v, broadcast, all_to_all, all_to_all_v") {
    const int p = 5;
    const i64 m = 7;
    const std::vector<i64> counts = {3, 0, 5, 1, 2};  // all_gather_v: rank k contributes counts[k]
    // all_to_all_v: rank r sends (r + k) % 3 elements to rank k, of value 100·r + k.
    auto a2a = [](int from, int to) { return static_cast<i64>((from + to) % 3); };
    std::vector<int> ok(p, 0);
    run_ranks(p, kTimeout, [&](Communicator& c) {
        const int r = c.rank();
        auto val = [](int k, i64 i) { return static_cast<float>(1000 * k + i); };
        bool good = true;

        std::vector<float> mine(m), all(p * m);
        for (i64 i = 0; i < m; i++) mine[i] = val(r, i);
        random_delay(r * 17);
        c.all_gather(all.data(), mine.data(), m);
        for (int k = 0; k < p; k++)
            for (i64 i = 0; i < m; i++) good = good && all[k * m + i] == val(k, i);

        std::vector<float> inplace(p * m, -1.0f);  // in = out + rank·n
        std::copy(mine.begin(), mine.end(), inplace.begin() + r * m);
        c.all_gather(inplace.data(), inplace.data() + r * m, m);
        good = good && inplace == all;

        std::vector<double> vin(counts[r]),
            vout(std::accumulate(counts.begin(), counts.end(), i64{0}));
        for (i64 i = 0; i < counts[r]; i++) vin[i] = 10.0 * r + i;
        c.all_gather_v(vout.data(), vin.data(), counts);
        i64 off = 0;
        for (int k = 0; k < p; k++)
            for (i64 i = 0; i < counts[k]; i++) good = good && vout[off++] == 10.0 * k + i;

        std::vector<i64> meta(3, r == 2 ? 42 : -1);
        c.broadcast(meta.data(), 3, 2);
        good = good && meta == std::vector<i64>(3, 42);

        std::vector<float> send(p * m), recv(p * m);
        for (int k = 0; k < p; k++)
            for (i64 i = 0; i < m; i++) send[k * m + i] = static_cast<float>(100 * r + 10 * k + i);
        c.all_to_all(recv.data(), send.data(), m);
        for (int k = 0; k < p; k++)
            for (i64 i = 0; i < m; i++) good = good && recv[k * m + i] == 100 * k + 10 * r + i;

        std::vector<i64> in_counts(p), out_counts(p);
        for (int k = 0; k < p; k++) {
            in_counts[k] = a2a(r, k);
            out_counts[k] = a2a(k, r);
        }
        std::vector<float> vsend,
            vrecv(std::accumulate(out_counts.begin(), out_counts.end(), i64{0}));
        for (int k = 0; k < p; k++)
            for (i64 i = 0; i < in_counts[k]; i++) vsend.push_back(static_cast<float>(100 * r + k));
        c.all_to_all_v(vrecv.data(), out_counts, vsend.data(), in_counts);
        off = 0;
        for (int k = 0; k < p; k++)
            for (i64 i = 0; i < out_counts[k]; i++) good = good && vrecv[off++] == 100 * k + r;
        ok[r] = good;
    });
    for (int r = 0; r < p; r++) CHECK(ok[r] == 1);
}

TEST_CASE("16- and 8-bit elements move bit for bit through every collective that moves data") {
    // bf16/fp16 and fp8 tensors travel as their bits (Dtype::b16, b8); NaN payloads and signed
    // zeros included, so nothing may pass them through a float.
    const int p = 3;
    const i64 m = 5;
    auto bits16 = [](int r, i64 i) { return static_cast<std::uint16_t>(0x7FC1 + 977 * r + 31 * i); };
    auto bits8 = [](int r, i64 i) { return static_cast<std::uint8_t>(0x80 + 37 * r + 5 * i); };
    std::vector<int> ok(p, 0);
    run_ranks(p, kTimeout, [&](Communicator& c) {
        const int r = c.rank();
        bool good = true;
        std::vector<std::uint16_t> mine(m), all(p * m), sent(p * m), got(p * m);
        for (i64 i = 0; i < m; i++) mine[i] = bits16(r, i);
        c.all_gather(all.data(), mine.data(), m);
        for (int k = 0; k < p; k++)
            for (i64 i = 0; i < m; i++) good = good && all[k * m + i] == bits16(k, i);
        for (int k = 0; k < p; k++)
            for (i64 i = 0; i < m; i++) sent[k * m + i] = bits16(r, 10 * k + i);
        c.all_to_all(got.data(), sent.data(), m);
        for (int k = 0; k < p; k++)
            for (i64 i = 0; i < m; i++) good = good && got[k * m + i] == bits16(k, 10 * r + i);
        std::vector<std::uint8_t> b(m);
        for (i64 i = 0; i < m; i++) b[i] = bits8(r, i);
        c.broadcast(b.data(), m, 1);
        for (i64 i = 0; i < m; i++) good = good && b[i] == bits8(1, i);
        // A ring of messages, as between pipeline stages.
        std::vector<std::uint16_t> in(m);
        Handle h = c.send_async(mine.data(), m, (r + 1) % p, 7);
        c.recv(in.data(), m, (r + p - 1) % p, 7);
        h.wait();
        for (i64 i = 0; i < m; i++) good = good && in[i] == bits16((r + p - 1) % p, i);
        ok[r] = good;
    });
    for (int r = 0; r < p; r++) CHECK(ok[r] == 1);
    CHECK(std::string(dtype_name(Dtype::b16)) == "b16");
    CHECK(dtype_size(Dtype::b16) == 2);
    CHECK(dtype_size(Dtype::b8) == 1);
    CHECK_FALSE(can_reduce(Dtype::b16));
    CHECK_FALSE(can_reduce(Dtype::b8));
    CHECK(can_reduce(Dtype::f32));
}

TEST_CASE("send/recv: a ring of messages, tags matched, same-tag messages in order") {
    const int p = 4;
    std::vector<int> ok(p, 0);
    run_ranks(p, kTimeout, [&](Communicator& c) {
        const int r = c.rank(), next = (r + 1) % p, prev = (r + p - 1) % p;
        bool good = true;
        // A send completes only when received: both directions at once need an async side.
        std::vector<float> out(100, static_cast<float>(r)), in(100);
        Handle h = c.send_async(out.data(), 100, next, 0);
        c.recv(in.data(), 100, prev, 0);
        h.wait();
        good = good && in == std::vector<float>(100, static_cast<float>(prev));

        // Tags: rank 0 sends tag 1 then tag 2; rank 1 receives tag 2 first.
        if (r == 0) {
            const double a = 1.0, b = 2.0, c1 = 3.0;
            Handle h1 = c.send_async(&a, 1, 1, 1);
            Handle h2 = c.send_async(&b, 1, 1, 2);
            Handle h3 = c.send_async(&c1, 1, 1, 1);  // same tag as h1: arrives after it
            h2.wait();
            h1.wait();
            h3.wait();
        } else if (r == 1) {
            double x = 0, y = 0, z = 0;
            c.recv(&y, 1, 0, 2);
            Handle hz = c.recv_async(&z, 1, 0, 1);  // posted first: gets the first tag-1 message
            c.recv(&x, 1, 0, 1);
            hz.wait();
            good = good && y == 2.0 && z == 1.0 && x == 3.0;
        }
        c.barrier();
        ok[r] = good;
    });
    for (int r = 0; r < p; r++) CHECK(ok[r] == 1);
}

TEST_CASE("barrier: nobody leaves before everybody arrived") {
    const int p = 6;
    std::atomic<int> arrived{0};
    std::vector<int> seen(p);
    run_ranks(p, kTimeout, [&](Communicator& c) {
        random_delay(c.rank() * 53);
        arrived++;
        c.barrier();
        seen[c.rank()] = arrived.load();
    });
    for (int r = 0; r < p; r++) CHECK(seen[r] == p);
}

// ---- groups ----------------------------------------------------------------------------------

TEST_CASE("split: an 8-rank world as a 2x4 mesh; dp and tp collectives don't interfere") {
    const int world = 8, tpn = 4, dpn = 2;
    const i64 n = 600;
    std::vector<std::vector<float>> x(world);
    for (int r = 0; r < world; r++) x[r] = awkward(n, 900 + r);
    struct Seen {
        int tp_rank = -1, tp_size = -1, dp_rank = -1, dp_size = -1;
        bool none_ok = false;
        std::vector<float> tp_sum, dp_sum, world_sum;
        std::string tp_name, dp_name;
    };
    std::vector<Seen> seen(world);
    run_ranks(world, kTimeout, [&](Communicator& c) {
        const int r = c.rank();
        Seen& s = seen[r];
        // tp innermost (docs/layouts.md): tp groups are {0..3} {4..7}, dp groups {0,4} {1,5} ...
        auto tp = c.split(r / tpn, r % tpn, "tp");
        auto dp = c.split(r % tpn, r / tpn, "dp");
        auto none = c.split(r == 5 ? 0 : -1, 0, "solo");
        s.none_ok = (r == 5) == (none != nullptr);
        s.tp_rank = tp->rank();
        s.tp_size = tp->size();
        s.dp_rank = dp->rank();
        s.dp_size = dp->size();
        s.tp_name = tp->group();
        s.dp_name = dp->group();
        // Interleave: tp async, dp from another thread, world sync, with delays.
        std::vector<float> a = x[r], b = x[r], w = x[r];
        Handle h = tp->all_reduce_async(a.data(), n);
        std::thread dp_thread([&] {
            random_delay(r * 7 + 1);
            dp->all_reduce(b.data(), n);
        });
        random_delay(r * 11 + 2);
        c.all_reduce(w.data(), n);
        h.wait();
        dp_thread.join();
        s.tp_sum = a;
        s.dp_sum = b;
        s.world_sum = w;
    });
    for (int r = 0; r < world; r++) {
        INFO("world rank " << r);
        const Seen& s = seen[r];
        CHECK(s.none_ok);
        CHECK(s.tp_name == "tp");
        CHECK(s.dp_name == "dp");
        CHECK(s.tp_size == tpn);
        CHECK(s.dp_size == dpn);
        CHECK(s.tp_rank == r % tpn);
        CHECK(s.dp_rank == r / tpn);
        std::vector<std::vector<float>> tpx, dpx;
        for (int k = 0; k < tpn; k++) tpx.push_back(x[(r / tpn) * tpn + k]);
        for (int k = 0; k < dpn; k++) dpx.push_back(x[k * tpn + r % tpn]);
        CHECK(same_bits(s.tp_sum, tree_over_ranks(tpx, 0, n)));
        CHECK(same_bits(s.dp_sum, tree_over_ranks(dpx, 0, n)));
        CHECK(same_bits(s.world_sum, tree_over_ranks(x, 0, n)));
    }
}

TEST_CASE("split orders a group by key, then by parent rank") {
    const int p = 4;
    std::vector<int> new_rank(p);
    run_ranks(p, kTimeout, [&](Communicator& c) {
        auto g = c.split(0, -c.rank() / 2, "rev");  // keys 0 0 -1 -1 -> order 2 3 0 1
        new_rank[c.rank()] = g->rank();
    });
    CHECK(new_rank == std::vector<int>{2, 3, 0, 1});
}

// ---- async -----------------------------------------------------------------------------------

TEST_CASE("async collectives run in issue order and complete at wait()") {
    const int p = 4;
    const i64 n = 3000;
    std::vector<std::vector<float>> x(p);
    for (int r = 0; r < p; r++) x[r] = awkward(p * n, 300 + r);
    std::vector<int> ok(p, 0);
    run_ranks(p, kTimeout, [&](Communicator& c) {
        const int r = c.rank();
        std::vector<float> a = x[r], b(n), g(p * n), bc(5, r == 1 ? 9.0f : 0.0f);
        std::vector<float> a2a(p * n);
        Handle ha = c.all_reduce_async(a.data(), p * n);
        Handle hb = c.reduce_scatter_async(b.data(), x[r].data(), n);
        Handle hg = c.all_gather_async(g.data(), x[r].data(), n);
        Handle hc = c.broadcast_async(bc.data(), 5, 1);
        Handle hd = c.all_to_all_async(a2a.data(), x[r].data(), n);
        std::vector<float> s = x[r];
        c.all_reduce(s.data(), p * n);  // a blocking call after async ones: comes after them
        hd.wait();
        hb.wait();
        ha.wait();
        hg.wait();
        hc.wait();
        const bool pending_after = ha.pending();
        ha.wait();  // waiting twice is harmless
        bool good = !pending_after && ha.test();
        good = good && same_bits(a, tree_over_ranks(x, 0, p * n)) && same_bits(s, a);
        good = good && same_bits(b, tree_over_ranks(x, r * n, (r + 1) * n));
        for (int k = 0; k < p; k++)
            good = good && std::equal(g.begin() + k * n, g.begin() + (k + 1) * n, x[k].begin());
        for (int k = 0; k < p; k++)
            good = good &&
                   std::equal(a2a.begin() + k * n, a2a.begin() + (k + 1) * n, x[k].begin() + r * n);
        good = good && bc == std::vector<float>(5, 9.0f);
        ok[r] = good;
    });
    for (int r = 0; r < p; r++) CHECK(ok[r] == 1);
}

// ---- failures --------------------------------------------------------------------------------

TEST_CASE("a rank that skips an all_reduce: the others throw CommError within the timeout") {
    const int p = 4;
    const double timeout = 0.5;
    std::vector<std::string> msg(p);
    std::vector<double> took(p, 0);
    InProcWorld world(p, timeout);
    RankErrors e = run_ranks_collect(world, [&](Communicator& c) {
        std::vector<float> buf(64, 1.0f);
        c.all_reduce(buf.data(), 64);  // #1 completes
        const auto t0 = std::chrono::steady_clock::now();
        try {
            if (c.rank() == 2)
                std::this_thread::sleep_for(std::chrono::duration<double>(2 * timeout));
            else
                c.all_reduce(buf.data(), 64);  // #2: rank 2 never comes
        } catch (const CommError& err) {
            msg[c.rank()] = err.what();
        }
        took[c.rank()] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        c.barrier();  // the job has failed: throws at once on every rank, rank 2 included
    });
    CHECK_FALSE(e.ok());
    for (int r = 0; r < p; r++) {
        INFO("rank " << r << ": " << msg[r] << " | " << e.message[r]);
        CHECK(e.error[r] != nullptr);
        CHECK(contains(e.message[r], "barrier"));  // the later call names itself and the cause
        CHECK(contains(e.message[r], "did not arrive"));
        if (r == 2) continue;
        CHECK(contains(msg[r], "all_reduce #2"));
        CHECK(contains(msg[r], "'world' (size 4)"));
        CHECK(contains(msg[r], "rank 2 did not arrive within 0.50 s"));
        CHECK(contains(msg[r], "ranks 0, 1, 3"));
        CHECK(took[r] >= 0.9 * timeout);
        CHECK(took[r] < timeout + 1.0);
    }
    CHECK(contains(world.failure(), "rank 2 did not arrive"));
}

TEST_CASE("a rank that returns early fails the others at once, naming it and the group") {
    // 8 ranks as 2x4; in the tp group of world ranks 4..7, tp rank 2 (world rank 6) returns.
    RankErrors e = run_ranks_collect(8, 30.0, [&](Communicator& c) {
        auto tp = c.split(c.rank() / 4, c.rank() % 4, "tp");
        float v = 1.0f;
        tp->all_reduce(&v, 1);
        if (c.rank() == 6) return;
        if (c.rank() >= 4) tp->all_reduce(&v, 1);
    });
    CHECK_FALSE(e.ok());
    const std::string& m = e.message[e.first];
    INFO(m);
    CHECK(e.first >= 4);
    CHECK(e.first != 6);
    CHECK(contains(m, "all_reduce #2 in group 'tp' (size 4, world ranks 4..7)"));
    CHECK(contains(m, "rank 2 (world rank 6) has left the group"));
}

TEST_CASE("a rank that throws: the others get CommError naming it; run_ranks rethrows it") {
    const int p = 4;
    auto fn = [](Communicator& c) {
        float v = 1.0f;
        c.all_reduce(&v, 1);
        if (c.rank() == 1) throw std::runtime_error("boom in the loss");
        c.all_reduce(&v, 1);
    };
    RankErrors e = run_ranks_collect(p, kTimeout, fn);
    CHECK(e.first == 1);
    CHECK(e.message[1] == "boom in the loss");
    for (int r : {0, 2, 3}) {
        INFO(e.message[r]);
        bool is_comm = false;
        try {
            std::rethrow_exception(e.error[r]);
        } catch (const CommError&) {
            is_comm = true;
        } catch (...) {
        }
        CHECK(is_comm);
        CHECK(contains(e.message[r], "rank 1 failed: boom in the loss"));
        CHECK(contains(e.message[r], "all_reduce #2"));
    }
    CHECK_THROWS_WITH(run_ranks(p, kTimeout, fn), "boom in the loss");
}

TEST_CASE("abort(reason) fails every rank's pending and later operations") {
    RankErrors e = run_ranks_collect(3, kTimeout, [](Communicator& c) {
        if (c.rank() == 0) c.abort("loss is NaN at step 12");
        c.barrier();
    });
    for (int r = 0; r < 3; r++) CHECK(contains(e.message[r], "loss is NaN at step 12"));
}

TEST_CASE("mismatched collectives, sizes, roots and counts are errors naming both sides") {
    auto first_message = [](int p, const std::function<void(Communicator&)>& fn) {
        RankErrors e = run_ranks_collect(p, kTimeout, fn);
        REQUIRE_FALSE(e.ok());
        for (int r = 0; r < p; r++) REQUIRE(e.error[r] != nullptr);  // every rank hears of it
        return e.message[e.first];
    };
    std::string m = first_message(4, [](Communicator& c) {
        std::vector<float> a(8, 1.0f), b(32);
        if (c.rank() == 1)
            c.all_gather(b.data(), a.data(), 8);
        else
            c.all_reduce(a.data(), 8);
    });
    CHECK(contains(m, "collective #1 in group 'world' (size 4)"));
    CHECK(contains(m, "ranks 0, 2, 3 called all_reduce, rank 1 called all_gather"));

    m = first_message(4, [](Communicator& c) {
        std::vector<float> a(10, 1.0f);
        c.all_reduce(a.data(), c.rank() == 3 ? 5 : 10);
    });
    CHECK(contains(m, "all_reduce #1"));
    CHECK(contains(m, "ranks 0, 1, 2 passed n = 10, rank 3 passed n = 5"));

    m = first_message(3, [](Communicator& c) {
        float v = 0;
        c.broadcast(&v, 1, c.rank() == 0 ? 1 : 0);
    });
    CHECK(contains(m, "rank 0 passed root 1, ranks 1, 2 passed root 0"));

    m = first_message(2, [](Communicator& c) {
        std::vector<float> in(4), out(4);
        // Both send 1 element to rank 0 and 2 to rank 1, so rank 0 must expect {1, 1}.
        const std::vector<i64> ic = {1, 2}, oc = {c.rank() == 0 ? 1 : 2, 2};  // rank 0: {1, 2}
        c.all_to_all_v(out.data(), oc, in.data(), ic);
    });
    CHECK(contains(m,
                   "rank 0 expects out_counts[1] = 2 elements from rank 1, but rank 1 sends "
                   "in_counts[0] = 1"));
    CHECK(contains(m, "all_to_all_v #1"));

    m = first_message(2, [](Communicator& c) {
        std::vector<float> a(4, 1.0f);
        c.all_reduce(a.data(), 4, c.rank() == 0 ? Algo::canonical : Algo::ring);
    });
    CHECK(contains(m, "rank 0 asked for canonical, rank 1 asked for ring"));

    m = first_message(2, [](Communicator& c) {
        std::vector<float> a(4, 1.0f);
        if (c.rank() == 0)
            c.send(a.data(), 4, 1, 3);
        else
            c.recv(a.data(), 2, 0, 3);
    });
    CHECK(contains(m, "rank 0 sends 4 f32 but rank 1 receives 2 f32"));
}

TEST_CASE("a recv whose send never comes fails within the timeout, naming peer and tag") {
    RankErrors e = run_ranks_collect(2, 0.3, [](Communicator& c) {
        float v = 0;
        if (c.rank() == 0)
            c.recv(&v, 1, 1, 9);
        else
            std::this_thread::sleep_for(std::chrono::milliseconds(600));
    });
    REQUIRE(e.first == 0);
    CHECK(contains(e.message[0], "recv from rank 1 (tag 9, 1 f32) on rank 0 of group 'world'"));
    CHECK(contains(e.message[0], "rank 1 did not post a matching send within 0.30 s"));
}

TEST_CASE("bad arguments are CommErrors on the calling rank") {
    InProcWorld world(2, kTimeout);
    auto c = world.comm(0);
    float v[4] = {};
    CHECK_THROWS_AS(c->all_reduce(v, -1), CommError);
    CHECK_THROWS_AS(c->broadcast(v, 1, 2), CommError);
    CHECK_THROWS_AS(c->send(v, 1, -1), CommError);
    CHECK_THROWS_AS(c->all_to_all(v, v, 2), CommError);      // out and in overlap
    CHECK_THROWS_AS(c->all_gather(v, v + 1, 1), CommError);  // overlap, not in place
    const std::vector<i64> one = {1};
    CHECK_THROWS_AS(c->all_gather_v(v, v + 2, one), CommError);  // one count for two ranks
    CHECK_THROWS_AS(world.comm(0), CommError);                   // once per rank
    CHECK_THROWS_AS(InProcWorld(0, 1.0), CommError);
    CHECK_FALSE(world.failed());  // a bad argument is the caller's error, not the job's
}

// ---- accounting ------------------------------------------------------------------------------

TEST_CASE("accounting: calls, bytes by each algorithm's traffic, seconds, rows per group") {
    const int p = 4;
    const i64 n = 1000;
    InProcWorld world(p, kTimeout);
    std::vector<CommStats> world_stats(p), tp_stats(p);
    run_ranks(world, [&](Communicator& c) {
        std::vector<float> buf(n, 1.0f), out(n / p);
        c.all_reduce(buf.data(), n, Algo::ring);
        c.all_reduce(buf.data(), n, Algo::ring);
        c.all_reduce(buf.data(), n, Algo::canonical);
        c.reduce_scatter(out.data(), buf.data(), n / p);
        c.broadcast(buf.data(), 10, 3);
        c.barrier();
        auto tp = c.split(c.rank() / 2, 0, "tp");
        double d = 1.0;
        tp->all_reduce(&d, 1);
        if (tp->rank() == 0)
            tp->send(&d, 1, 1, 0);
        else
            tp->recv(&d, 1, 0, 0);
        world_stats[c.rank()] = c.stats();
        tp_stats[c.rank()] = tp->stats();
    });
    for (int r = 0; r < p; r++) {
        INFO("rank " << r);
        const CommStats& s = world_stats[r];
        CHECK(s.group == "world");
        CHECK(s[Op::all_reduce].calls == 3);
        // ring and canonical both send 2(p-1)/p·n·4 bytes per rank (n divisible by p)
        CHECK(s[Op::all_reduce].bytes_sent == 3 * 2 * (p - 1) * n * 4 / p);
        CHECK(s[Op::all_reduce].bytes_recv == 3 * 2 * (p - 1) * n * 4 / p);
        CHECK(s[Op::all_reduce].seconds > 0);
        CHECK(s[Op::reduce_scatter].bytes_sent == (p - 1) * (n / p) * 4);
        CHECK(s[Op::broadcast].bytes_sent == (r == 3 ? (p - 1) * 10 * 4 : 0));
        CHECK(s[Op::broadcast].bytes_recv == (r == 3 ? 0 : 10 * 4));
        CHECK(s[Op::barrier].calls == 1);
        CHECK(s[Op::split].calls == 1);
        CHECK(s.total().calls == 7);
        const CommStats& t = tp_stats[r];
        CHECK(t.group == "tp");
        CHECK(t.size == 2);
        CHECK(t[Op::all_reduce].bytes_sent == 8);  // 2(p-1)/p·1·8 with p = 2
        CHECK(t[Op::send].bytes_sent == (r % 2 == 0 ? 8 : 0));
        CHECK(t[Op::recv].bytes_recv == (r % 2 == 1 ? 8 : 0));
    }
    // Uneven chunks: the ring's exact per-rank traffic (p = 3, n = 10: chunks 3, 3, 4).
    Request ring;
    ring.op = Op::all_reduce;
    ring.algo = Algo::ring;
    ring.n = 10;
    CHECK(traffic(ring, 0, 3).sent == ((10 - 3) + (10 - 3)) * 4);
    CHECK(traffic(ring, 1, 3).sent == ((10 - 3) + (10 - 4)) * 4);
    CHECK(traffic(ring, 2, 3).sent == ((10 - 4) + (10 - 3)) * 4);
    // Rows for metrics: every rank, every group, every operation used.
    const auto rows = world.stat_rows();
    int found = 0;
    for (const StatRow& row : rows) {
        if (row.group == "world" && row.op == "all_reduce") {
            found++;
            CHECK(row.calls == 3);
            CHECK(row.bytes_sent == 3 * 2 * (p - 1) * n * 4 / p);
        }
        if (row.group == "tp" && row.op == "send") CHECK(row.world_rank % 2 == 0);
    }
    CHECK(found == p);
}
