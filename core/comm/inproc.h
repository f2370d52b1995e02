// In-process backend: N ranks as threads of one process, sharing memory. Every multi-rank test
// runs on it, and an intern can run 8 ranks on a laptop with it (STYLE.md, Tests). Starting the
// ranks' threads and sorting out their errors is core/comm/run_ranks.h (run_ranks).
//
// Index
//   InProcWorld         N ranks and a timeout; comm(r) is rank r's "world" communicator
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

}  // namespace px::comm
