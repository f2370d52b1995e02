// Communication accounting: what each operation costs one rank, in bytes by its algorithm's
// actual traffic and in wall time, per group, kept in one book per rank and read out as rows for
// metrics. Every Communicator records its operations in its rank's book (core/comm/comm.h,
// which includes this header).
//
// Index
//   Traffic, traffic      bytes one rank sends and receives for one operation, by its algorithm
//   OpStats, CommStats    accounting of one group on one rank: per Op calls, bytes, seconds
//   StatRow, StatsBook    one rank's accounting of all its groups, as rows for metrics
#pragma once
#include "core/base/shapes.h"  // i64
#include "core/comm/request.h"

#include <array>
#include <mutex>
#include <string>
#include <vector>

namespace px::comm {

// ---- traffic ---------------------------------------------------------------------------------

// Bytes this rank sends and receives for req in a group of `size`, by the algorithm's actual
// traffic (ring all_reduce: 2(p-1)/p·n·elem each way; broadcast: the root sends (p-1)·n·elem).
struct Traffic {
    i64 sent = 0;
    i64 recv = 0;
};
Traffic traffic(const Request& req, int rank, int size);

// ---- accounting ------------------------------------------------------------------------------

struct OpStats {
    i64 calls = 0;       // completed operations
    i64 bytes_sent = 0;  // by traffic()
    i64 bytes_recv = 0;
    double seconds = 0;  // wall time from start to completion on this rank (waiting included)
};

struct CommStats {
    std::string group;       // "world", "dp", "tp", ...
    int rank = 0, size = 0;  // this rank in the group
    std::array<OpStats, kNumOps> ops{};
    const OpStats& operator[](Op op) const { return ops[static_cast<int>(op)]; }
    OpStats total() const;  // over all operations
};

struct StatRow {
    int world_rank = 0;  // the rank (process, thread) whose book this is
    int rank = 0;        // in the group
    std::string group;
    std::string op;  // op_name
    i64 calls = 0, bytes_sent = 0, bytes_recv = 0;
    double seconds = 0;
};
std::vector<StatRow> stat_rows(const CommStats& s, int world_rank);  // one row per Op used

// One rank's accounting, shared by all communicators of that rank (world and its splits).
// Groups are keyed by name: two communicators of one rank with the same name share a record.
// Thread-safe (async operations complete on a progress thread).
class StatsBook {
public:
    explicit StatsBook(int world_rank) : world_rank_(world_rank) {}
    int world_rank() const { return world_rank_; }
    void add_group(const std::string& group, int rank, int size);  // no-op when known
    void record(const std::string& group, const Request& req, double seconds);
    CommStats stats(const std::string& group) const;  // zeros when unknown
    std::vector<StatRow> rows() const;                // every group, every Op used
    void reset();                                     // all counters to zero

private:
    int world_rank_;
    mutable std::mutex mu_;
    std::vector<CommStats> groups_;
};

}  // namespace px::comm
