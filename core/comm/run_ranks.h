// Running a job's ranks as threads of this process: one thread per rank, each with its "world"
// communicator of an in-process world (core/comm/inproc.h), all joined before returning; and
// which rank's error caused the others'. Every multi-rank test runs its ranks this way.
//
// Index
//   RankErrors          what each rank of a run threw, and which rank threw first
//   cause_of            which rank's error caused the others'
//   run_ranks           one thread per rank runs fn(comm), joins, rethrows the first error
//   run_ranks_collect   the same, returning every rank's error instead of throwing
#pragma once
#include "core/comm/comm.h"
#include "core/comm/inproc.h"  // InProcWorld

#include <exception>
#include <functional>
#include <string>
#include <vector>

namespace px::comm {

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
