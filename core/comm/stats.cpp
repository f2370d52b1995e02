// Communication accounting (core/comm/stats.h): the traffic each algorithm makes, and the books.
#include "core/comm/stats.h"

#include "core/base/error.h"  // PX_ASSERT

namespace px::comm {

// ---- traffic ---------------------------------------------------------------------------------

namespace {

i64 sum_except(const std::vector<i64>& v, int skip) {
    i64 s = 0;
    for (int k = 0; k < static_cast<int>(v.size()); k++)
        if (k != skip) s += v[k];
    return s;
}

}  // namespace

Traffic traffic(const Request& req, int rank, int size) {
    const i64 e = dtype_size(req.dtype);
    const int p = size, r = rank;
    const i64 n = req.n;
    auto len = [&](int c) {
        c = ((c % p) + p) % p;
        return chunk_lo(n, p, c + 1) - chunk_lo(n, p, c);
    };
    Traffic t;
    switch (req.op) {
        case Op::all_reduce:
        case Op::all_reduce_max:
            if (p == 1) break;
            if (req.algo == Algo::ring && req.op == Op::all_reduce) {
                // Ring: chunk c is summed along c+1 -> c+2 -> ... -> c (every rank but c sends it),
                // then circulates from its owner c along c -> c+1 -> ... -> c-1 (every rank but
                // c-1 forwards it). Rank r sends all chunks but r, then all chunks but r+1.
                t.sent = (n - len(r)) + (n - len(r + 1));
                t.recv = (n - len(r - 1)) + (n - len(r));
            } else {
                // Direct: rank r receives chunk r from the p-1 others and sends them its other
                // chunks; then it sends its reduced chunk to the p-1 others and receives theirs.
                t.sent = (n - len(r)) + (p - 1) * len(r);
                t.recv = (p - 1) * len(r) + (n - len(r));
            }
            break;
        case Op::reduce_scatter:
        case Op::all_gather:
        case Op::all_to_all:
            t.sent = t.recv = (p - 1) * n;
            break;
        case Op::all_gather_v:
            t.sent = (p - 1) * req.counts[r];
            t.recv = sum_except(req.counts, r);
            break;
        case Op::all_to_all_v:
            t.sent = sum_except(req.counts, r);
            t.recv = sum_except(req.out_counts, r);
            break;
        case Op::broadcast:
            if (r == req.peer)
                t.sent = (p - 1) * n;
            else
                t.recv = n;
            break;
        case Op::send:
            t.sent = n;
            break;
        case Op::recv:
            t.recv = n;
            break;
        case Op::barrier:
        case Op::split:
            break;
    }
    t.sent *= e;
    t.recv *= e;
    return t;
}

// ---- accounting ------------------------------------------------------------------------------

OpStats CommStats::total() const {
    OpStats t;
    for (const OpStats& o : ops) {
        t.calls += o.calls;
        t.bytes_sent += o.bytes_sent;
        t.bytes_recv += o.bytes_recv;
        t.seconds += o.seconds;
    }
    return t;
}

std::vector<StatRow> stat_rows(const CommStats& s, int world_rank) {
    std::vector<StatRow> rows;
    for (int i = 0; i < kNumOps; i++) {
        const OpStats& o = s.ops[i];
        if (o.calls == 0) continue;
        rows.push_back({world_rank, s.rank, s.group, kOpNames[i], o.calls, o.bytes_sent,
                        o.bytes_recv, o.seconds});
    }
    return rows;
}

void StatsBook::add_group(const std::string& group, int rank, int size) {
    std::lock_guard lk(mu_);
    for (const CommStats& g : groups_)
        if (g.group == group) return;
    CommStats s;
    s.group = group;
    s.rank = rank;
    s.size = size;
    groups_.push_back(s);
}

void StatsBook::record(const std::string& group, const Request& req, double seconds) {
    std::lock_guard lk(mu_);
    for (CommStats& g : groups_) {
        if (g.group != group) continue;
        const Traffic t = traffic(req, g.rank, g.size);
        OpStats& o = g.ops[static_cast<int>(req.op)];
        o.calls++;
        o.bytes_sent += t.sent;
        o.bytes_recv += t.recv;
        o.seconds += seconds;
        return;
    }
    PX_ASSERT(false, "StatsBook::record: group '" + group + "' was never added");
}

CommStats StatsBook::stats(const std::string& group) const {
    std::lock_guard lk(mu_);
    for (const CommStats& g : groups_)
        if (g.group == group) return g;
    CommStats s;
    s.group = group;
    return s;
}

std::vector<StatRow> StatsBook::rows() const {
    std::lock_guard lk(mu_);
    std::vector<StatRow> rows;
    for (const CommStats& g : groups_) {
        auto r = stat_rows(g, world_rank_);
        rows.insert(rows.end(), r.begin(), r.end());
    }
    return rows;
}

void StatsBook::reset() {
    std::lock_guard lk(mu_);
    for (CommStats& g : groups_) g.ops = {};
}

}  // namespace px::comm
