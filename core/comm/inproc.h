// In-process backend: N ranks as threads of one process, sharing memory. Every multi-rank test
// runs on it, and an intern can run 8 ranks on a laptop with it (STYLE.md, Tests).
//
// Index
//   InProcWorld         N ranks and a timeout; comm(r) is rank r's "world" communicator
//   RankErrors          what each rank of a run threw, and which rank threw first
//   cause_of            which rank's error caused the others'
//   run_ranks           one thread per rank runs fn(comm), joins, rethrows the first error
//   run_ranks_collect   the same, returning every rank's error instead of throwing
//
// How a collective runs. Each group has two slots, used by its collectives alternately (#k uses
// slot k % 2: a rank can be at most one collective ahead of another, because every collective
// ends with a completion barrier). A rank posts a pointer to its Request in the slot and waits,
// up to the timeout, for the others. When all have arrived, the last one checks that they agree
// (collective, dtype, counts, root, algorithm); then every rank does its share of the work,
// reading the posted buffers directly: for a reduction, rank r computes chunk r of the result
// (the canonical tree or the ring order, per element) and writes it into the output of every
// rank that wants it. Each output element is computed exactly once, so every rank has the same
// bits. A completion barrier follows, so no rank returns (and reuses its buffers) while another
// may still read or write them. The share of work cannot block, so once all ranks have arrived
// the collective always completes; failures can only happen while ranks are missing.
//
// Point to point. A send or recv is posted in its group's queue; the second of a matching pair
// (same source, destination and tag, first posted first) copies the data, and both complete.
//
// Departures. A rank whose communicator is destroyed (under run_ranks: its function returned or
// threw) has left that group; a collective or recv that still waits for it fails at once
// instead of at the timeout, naming it.
#pragma once
#include "core/comm/comm.h"

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace px::comm {

namespace inproc {
struct World;
}

class InProcWorld {
public:
    // n ranks; an operation fails when a rank it needs has not arrived within timeout_s.
    InProcWorld(int n, double timeout_s);
    ~InProcWorld();
    InProcWorld(const InProcWorld&) = delete;
    InProcWorld& operator=(const InProcWorld&) = delete;

    int size() const;
    double timeout_s() const;
    std::unique_ptr<Communicator> comm(int rank);  // rank's "world" communicator, once per rank
    void abort(const std::string& reason);         // fail the job (every rank throws CommError)
    bool failed() const;
    std::string failure() const;             // the first failure's message ("" if none)
    std::vector<StatRow> stat_rows() const;  // every rank, every group ("world" and splits)
    std::shared_ptr<StatsBook> stats_book(int rank) const;  // one rank's accounting

private:
    std::shared_ptr<inproc::World> w_;
};

struct RankErrors {
    std::vector<std::exception_ptr> error;  // by rank; null where the rank returned normally
    std::vector<std::string> message;       // what() of each error ("" where none)
    int first = -1;                         // rank that failed first (the cause), -1 if none
    bool ok() const { return first < 0; }
    void rethrow_first() const;  // rethrows error[first] as thrown; no-op when ok()
};

// The rank whose error is the cause, not a consequence (-1: no error): a rank whose operation was
// abandoned because another failed, or whose peer left while unwinding its own error, may have
// thrown first. An error that is not a CommError (bad input, a bug) is always a cause (the lowest
// rank's); then `first` unless its error is a consequence; then any error that is not one.
int cause_of(const RankErrors& errors);

// One thread per rank runs fn(rank's world communicator). A rank that throws fails the job, so
// the others' operations throw CommError naming it. All threads are joined before returning.
RankErrors run_ranks_collect(InProcWorld& world, const std::function<void(Communicator&)>& fn);
RankErrors run_ranks_collect(int n, double timeout_s, const std::function<void(Communicator&)>& fn);
void run_ranks(InProcWorld& world, const std::function<void(Communicator&)>& fn);
void run_ranks(int n, double timeout_s, const std::function<void(Communicator&)>& fn);

}  // namespace px::comm
