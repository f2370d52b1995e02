// The collectives of the MPI backend (core/comm/mpi_internal.h): what the ranks' headers must
// agree on, and the data each collective moves once they agree. The arithmetic of the reducing
// collectives is the in-process backend's, element by element (core/comm/backend.h).
#include "core/comm/mpi_internal.h"

#include "core/comm/backend.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

namespace px::comm::mpi {

using namespace backend;

// ---- headers ---------------------------------------------------------------------------------

// FNV-1a over the elements, each as its unsigned bit pattern.
template <class Seq>
i64 digest(const Seq& v) {
    std::uint64_t h = 1469598103934665603ull;
    for (auto x : v) h = (h ^ static_cast<std::make_unsigned_t<decltype(x)>>(x)) * 1099511628211ull;
    return static_cast<i64>(h >> 1);
}

Header header_for(const Request& q, i64 seq, int dst) {
    Header h{};
    h[kSeq] = seq;
    h[kOp] = static_cast<i64>(q.op);
    h[kDtype] = static_cast<i64>(q.dtype);
    h[kAlgo] = static_cast<i64>(q.algo);
    h[kN] = q.n;
    h[kRoot] = q.peer;
    h[kCounts] = digest(q.counts);
    if (q.op == Op::all_to_all_v) {
        h[kPairIn] = q.counts[static_cast<size_t>(dst)];
        h[kPairOut] = q.out_counts[static_cast<size_t>(dst)];
    }
    h[kColor] = q.color;
    h[kName] = q.color >= 0 ? digest(q.name) : 0;
    return h;
}

std::string check_match(const std::vector<Header>& h, const Request& me, int rank,
                        const std::string& group, const std::string& what) {
    const int p = static_cast<int>(h.size());
    const std::string advice = " Every rank of '" + group +
                               "' must make the same call at the same point; look for a rank "
                               "that took another branch or skipped a call.";
    auto disagree = [&](const std::string& about, auto text_of) -> std::string {
        std::vector<std::pair<std::string, std::vector<int>>> by;
        for (int k = 0; k < p; k++) {
            const std::string v = text_of(h[static_cast<size_t>(k)]);
            auto it =
                std::find_if(by.begin(), by.end(), [&](const auto& b) { return b.first == v; });
            if (it == by.end())
                by.push_back({v, {k}});
            else
                it->second.push_back(k);
        }
        if (by.size() == 1) return "";
        std::string m = what + ": the ranks disagree on " + about + ": ";
        for (size_t i = 0; i < by.size(); i++) {
            if (i) m += ", ";
            m += rank_list(by[i].second) + " " + by[i].first;
        }
        return m + "." + advice;
    };
    std::string m = disagree("the collective", [](const Header& x) {
        return std::string("called ") + op_name(static_cast<Op>(x[kOp])) + " #" +
               std::to_string(x[kSeq]);
    });
    if (!m.empty()) return m;
    m = disagree("the element type", [](const Header& x) {
        return std::string("passed ") + dtype_name(static_cast<Dtype>(x[kDtype]));
    });
    if (!m.empty()) return m;
    if (me.op == Op::all_reduce || me.op == Op::reduce_scatter) {
        m = disagree("the algorithm", [](const Header& x) {
            return std::string("asked for ") + algo_name(static_cast<Algo>(x[kAlgo]));
        });
        if (!m.empty()) return m;
    }
    switch (me.op) {
        case Op::all_reduce:
        case Op::all_reduce_max:
        case Op::reduce_scatter:
        case Op::all_gather:
        case Op::broadcast:
        case Op::all_to_all:
            m = disagree("the element count",
                         [](const Header& x) { return "passed n = " + std::to_string(x[kN]); });
            if (!m.empty() || me.op != Op::broadcast) return m;
            return disagree("the root", [](const Header& x) {
                return "passed root " + std::to_string(x[kRoot]);
            });
        case Op::all_gather_v: {
            const i64 mine = digest(me.counts);
            std::vector<int> other;
            for (int k = 0; k < p; k++)
                if (h[static_cast<size_t>(k)][kCounts] != mine) other.push_back(k);
            if (other.empty()) return "";
            return what + ": the ranks disagree on the counts: rank " + std::to_string(rank) +
                   " passed counts " + counts_str(me.counts) + ", " + rank_list(other) +
                   " passed others." + advice;
        }
        case Op::all_to_all_v:
            for (int k = 0; k < p; k++)
                if (h[static_cast<size_t>(k)][kPairIn] != me.out_counts[static_cast<size_t>(k)])
                    return what + ": rank " + std::to_string(rank) + " expects out_counts[" +
                           std::to_string(k) +
                           "] = " + std::to_string(me.out_counts[static_cast<size_t>(k)]) +
                           " elements from rank " + std::to_string(k) + ", but rank " +
                           std::to_string(k) + " sends in_counts[" + std::to_string(rank) +
                           "] = " + std::to_string(h[static_cast<size_t>(k)][kPairIn]) + "." +
                           advice;
            return "";
        case Op::split:
            for (int k = 0; k < p; k++) {
                const Header& x = h[static_cast<size_t>(k)];
                if (me.color >= 0 && x[kColor] == me.color && x[kName] != digest(me.name))
                    return what + ": ranks " + std::to_string(rank) + " and " + std::to_string(k) +
                           " join color " + std::to_string(me.color) +
                           " under different names (this rank: '" + me.name + "')." + advice;
            }
            return "";
        case Op::send:
        case Op::recv:
        case Op::barrier:
            return "";
    }
    return "";
}

// ---- the data phase --------------------------------------------------------------------------

namespace {

int wrap(int c, int p) {
    return ((c % p) + p) % p;
}

// This rank sends send(k) to every other rank k and receives recv(k) from it, each a (pointer,
// element count) pair, posted in rank order, receive first; its own piece, send(rank), is copied
// to recv(rank) while the messages travel.
template <class Recv, class Send>
void exchange(const Group& g, Recv recv, Send send) {
    Pending pd;
    for (int k = 0; k < g.size; k++) {
        if (k == g.rank) continue;
        const auto [to, nr] = recv(k);
        pd.post_recv(to, nr * i64{sizeof *to}, k, kTagData, g.comm, g.world_rank);
        const auto [from, ns] = send(k);
        pd.post_send(from, ns * i64{sizeof *from}, k, kTagData, g.comm, g.world_rank);
    }
    const auto to = recv(g.rank).first;
    const auto [from, ns] = send(g.rank);
    if (from != to) std::copy(from, from + ns, to);
    g.wait(pd);
}

// One step of a ring: n_to elements into `to` from the rank before, n_from elements of `from` to
// the rank after.
template <class T>
void ring_step(const Group& g, T* to, i64 n_to, const T* from, i64 n_from) {
    const i64 e = sizeof(T);
    Pending pd;
    pd.post_recv(to, n_to * e, wrap(g.rank - 1, g.size), kTagData, g.comm, g.world_rank);
    pd.post_send(from, n_from * e, wrap(g.rank + 1, g.size), kTagData, g.comm, g.world_rank);
    g.wait(pd);
}

// The ring's reduce-scatter phase on buf (chunk c at [at(c), at(c+1))): chunk c is summed
// x_{c+1} + x_{c+2} + ... + x_c, left to right, as it travels from rank c+1 to rank c; at
// step s rank r sends chunk r-1-s to r+1 and adds its own part to chunk r-2-s from r-1.
// Afterwards buf's chunk r holds the sum.
template <class T, class At>
void ring_reduce(const Group& g, T* buf, At at) {
    const int p = g.size, r = g.rank;
    std::vector<T> tmp;
    for (int s = 0; s < p - 1; s++) {
        const int cs = wrap(r - 1 - s, p), cr = wrap(r - 2 - s, p);
        const i64 rlen = at(cr + 1) - at(cr);
        tmp.resize(static_cast<size_t>(rlen));
        ring_step(g, tmp.data(), rlen, buf + at(cs), at(cs + 1) - at(cs));
        T* x = buf + at(cr);
        for (i64 i = 0; i < rlen; i++) x[i] = tmp[static_cast<size_t>(i)] + x[i];
    }
}

// In place on out: the ring's reduce-scatter, then its all-gather.
template <class T>
void ring_all_reduce(const Group& g, const Request& q, T* out) {
    const int p = g.size, r = g.rank;
    auto lo = [&](int c) { return chunk_lo(q.n, p, c); };
    ring_reduce(g, out, lo);
    // All-gather: at step s rank r forwards chunk r-s to r+1.
    for (int s = 0; s < p - 1; s++) {
        const int cs = wrap(r - s, p), cr = wrap(r - 1 - s, p);
        ring_step(g, out + lo(cr), lo(cr + 1) - lo(cr), out + lo(cs), lo(cs + 1) - lo(cs));
    }
}

// Canonical all_reduce and all_reduce_max: chunk r of every rank, the tree here, then to every
// rank.
template <class T>
void tree_all_reduce(const Group& g, const Request& q, const T* in, T* out) {
    const int p = g.size, r = g.rank;
    auto lo = [&](int c) { return chunk_lo(q.n, p, c); };
    const i64 len = lo(r + 1) - lo(r);
    std::vector<T> rows(static_cast<size_t>(p * len));
    exchange(
        g, [&](int k) { return std::pair(rows.data() + k * len, len); },
        [&](int k) { return std::pair(in + lo(k), lo(k + 1) - lo(k)); });
    if (q.op == Op::all_reduce_max)
        tree_rows<T, true>(rows.data(), 0, p, len);
    else
        tree_rows<T, false>(rows.data(), 0, p, len);
    std::copy(rows.data(), rows.data() + len, out + lo(r));
    exchange(
        g, [&](int k) { return std::pair(out + lo(k), lo(k + 1) - lo(k)); },
        [&](int) { return std::pair(out + lo(r), len); });
}

template <class T>
void ring_reduce_scatter(const Group& g, const Request& q, const T* in, T* out) {
    const i64 n = q.n, r = g.rank;
    std::vector<T> work(in, in + g.size * n);
    ring_reduce(g, work.data(), [&](int c) { return c * n; });
    std::copy(work.data() + r * n, work.data() + (r + 1) * n, out);
}

template <class T>
void tree_reduce_scatter(const Group& g, const Request& q, const T* in, T* out) {
    const i64 n = q.n;
    std::vector<T> rows(static_cast<size_t>(g.size * n));
    exchange(
        g, [&](int k) { return std::pair(rows.data() + k * n, n); },
        [&](int k) { return std::pair(in + k * n, n); });
    tree_rows<T, false>(rows.data(), 0, g.size, n);
    std::copy(rows.data(), rows.data() + n, out);
}

template <class T>
void all_gather(const Group& g, const Request& q, const T* in, T* out) {
    const i64 n = q.n;
    exchange(
        g, [&](int k) { return std::pair(out + k * n, n); }, [&](int) { return std::pair(in, n); });
}

// Where each rank's piece starts: the running sum of counts.
std::vector<i64> starts(const std::vector<i64>& counts) {
    std::vector<i64> at(counts.size());
    for (size_t k = 1; k < counts.size(); k++) at[k] = at[k - 1] + counts[k - 1];
    return at;
}

template <class T>
void all_gather_v(const Group& g, const Request& q, const T* in, T* out) {
    const std::vector<i64>& c = q.counts;
    const std::vector<i64> at = starts(c);
    exchange(
        g, [&](int k) { return std::pair(out + at[size_t(k)], c[size_t(k)]); },
        [&](int) { return std::pair(in, c[size_t(g.rank)]); });
}

template <class T>
void broadcast(const Group& g, const Request& q, T* out) {
    const i64 bytes = q.n * i64{sizeof(T)};
    Pending pd;
    if (g.rank == q.peer) {
        for (int k = 0; k < g.size; k++)
            if (k != g.rank) pd.post_send(out, bytes, k, kTagData, g.comm, g.world_rank);
    } else {
        pd.post_recv(out, bytes, q.peer, kTagData, g.comm, g.world_rank);
    }
    g.wait(pd);
}

template <class T>
void all_to_all(const Group& g, const Request& q, const T* in, T* out) {
    const i64 n = q.n;
    exchange(
        g, [&](int k) { return std::pair(out + k * n, n); },
        [&](int k) { return std::pair(in + k * n, n); });
}

template <class T>
void all_to_all_v(const Group& g, const Request& q, const T* in, T* out) {
    const std::vector<i64>&ci = q.counts, &co = q.out_counts;
    const std::vector<i64> in_at = starts(ci), out_at = starts(co);
    exchange(
        g, [&](int k) { return std::pair(out + out_at[size_t(k)], co[size_t(k)]); },
        [&](int k) { return std::pair(in + in_at[size_t(k)], ci[size_t(k)]); });
}

// A group of one: the output is the input.
void local(const Request& q) {
    const i64 e = dtype_size(q.dtype);
    i64 n = q.n;
    if (q.op == Op::all_gather_v || q.op == Op::all_to_all_v)
        n = q.counts.empty() ? 0 : q.counts[0];
    if (q.op == Op::barrier || q.op == Op::broadcast || q.op == Op::all_reduce ||
        q.op == Op::all_reduce_max)
        return;
    if (n > 0 && q.out != q.in) std::memmove(q.out, q.in, static_cast<size_t>(n * e));
}

template <class T>
void data(const Group& g, const Request& q) {
    const T* in = static_cast<const T*>(q.in);
    T* out = static_cast<T*>(q.out);
    const bool ring = q.algo == Algo::ring;
    switch (q.op) {
        case Op::all_reduce:
            return ring ? ring_all_reduce(g, q, out) : tree_all_reduce(g, q, in, out);
        case Op::all_reduce_max:
            return tree_all_reduce(g, q, in, out);
        case Op::reduce_scatter:
            return ring ? ring_reduce_scatter(g, q, in, out) : tree_reduce_scatter(g, q, in, out);
        case Op::all_gather:
            return all_gather(g, q, in, out);
        case Op::all_gather_v:
            return all_gather_v(g, q, in, out);
        case Op::broadcast:
            return broadcast(g, q, out);
        case Op::all_to_all:
            return all_to_all(g, q, in, out);
        case Op::all_to_all_v:
            return all_to_all_v(g, q, in, out);
        case Op::barrier:  // the header exchange was the barrier
        case Op::send:
        case Op::recv:
        case Op::split:
            return;
    }
}

}  // namespace

void move_data(const Group& g, const Request& q) {
    if (g.size == 1) return local(q);
    switch (q.dtype) {
        case Dtype::f32:
            return data<float>(g, q);
        case Dtype::f64:
            return data<double>(g, q);
        case Dtype::i64:
            return data<i64>(g, q);
        case Dtype::b16:
            return data<std::uint16_t>(g, q);
        case Dtype::b8:
            return data<std::uint8_t>(g, q);
    }
}

}  // namespace px::comm::mpi
