// MPI backend: ranks as processes (`mpirun -np 8 parallax train`, or `srun`), one per slot, the
// same Communicator interface and the same bits as the in-process backend (core/comm/inproc.h).
//
// Index
//   launched_by_mpi     whether this process was started by mpirun / srun (environment only)
//   local_ranks         ranks of this job on this node (OMPI_COMM_WORLD_LOCAL_SIZE, ...), or 1
//   MpiEnvironment      MPI_Init_thread (MPI_THREAD_MULTIPLE) on construction, finalize at the end
//   MpiEnvironment::world  this process's "world" communicator over MPI_COMM_WORLD, with a timeout
//   native_comm         the MPI_Comm under a communicator of this backend, for libraries that
//                       take one (parallel HDF5); MPI_COMM_NULL for other backends
//
// How a collective runs. Every communicator holds two duplicates of its MPI communicator: one
// for collectives, one for the caller's send/recv, so that user tags never meet ours. The k-th
// collective (#k) starts with a header exchange: every rank sends every other rank a few
// integers (#k, op, dtype, algo, element count, root, a digest of per-rank counts, split color
// and name) with MPI_Isend, and receives theirs with MPI_Irecv, polled against the timeout. A
// rank whose header has not arrived by then is named as missing; headers that disagree are a
// mismatch named on every rank, before any data moves. Only when all headers agree does data
// move, so a collective that got that far always completes (as in the in-process backend).
//   Data moves point to point (MPI_Isend/MPI_Irecv, bytes, polled):
//   - canonical all_reduce / all_reduce_max / reduce_scatter: rank r receives chunk r of every
//     rank's contribution, forms the canonical tree over rank index locally (node [lo, hi)
//     splits at lo + ceil((hi-lo)/2)), then (all_reduce) sends its reduced chunk to every rank.
//     Never MPI_Allreduce, whose order is the library's.
//   - ring: the classic ring, chunk c summed x_{c+1} + x_{c+2} + ... + x_c left to right while it
//     travels from rank c+1 to rank c, then circulated; the in-process ring's bits exactly.
//   - gathers, broadcast, all-to-alls: direct sends; barrier: the header exchange itself.
//   - split: after the header exchange, MPI_Comm_split (ordered by key, then rank).
//
// Point to point. send is MPI_Issend (it completes when the receiver has matched it: no hidden
// buffering), recv MPI_Irecv, both polled against the timeout. A recv checks the size it got.
//
// Failures are never hangs. Every wait polls (sleeping briefly between polls, so oversubscribed
// ranks leave the CPU to their peers) against layout.timeout_s and against the job's failure
// channel: the first rank that fails (timeout, mismatch, abort(), an error in the caller reported
// through abort()) sends its message to every rank of MPI_COMM_WORLD on a private duplicate;
// every later or pending operation of any rank then throws CommError "... was abandoned because
// the job failed: <message>". MPI errors return (MPI_ERRORS_RETURN) and become CommErrors that
// name the MPI call, the file, the line and the rank.
//
// Threads. Async collectives run on a progress thread per communicator, in issue order, so MPI is
// initialised with MPI_THREAD_MULTIPLE; a library that does not provide it is an error at start.
#pragma once
#include "core/comm/comm.h"

// The MPI C API only: Open MPI's and MPICH's C++ bindings do not compile warning-free.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <memory>
#include <string>

namespace px::comm {

// True when the environment says mpirun (OMPI_COMM_WORLD_SIZE, PMIX_RANK), a PMI launcher
// (PMI_SIZE / PMI_RANK) or srun (SLURM_PROCID with SLURM_NTASKS) started this process.
bool launched_by_mpi();
// Ranks of this job on this node: OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS or
// SLURM_NTASKS_PER_NODE when set, else 1.
int local_ranks();

// The MPI communicator of c's ranks when c belongs to this backend (MpiEnvironment::world or a
// split of it), else MPI_COMM_NULL (in-process ranks). It is c's point-to-point duplicate: a
// library's MPI collectives on it (parallel HDF5, core/io/checkpoint.h) never meet the backend's
// own collective traffic. Valid while c lives; collectives on it must not overlap c's own.
MPI_Comm native_comm(const Communicator& c);

class MpiEnvironment {
public:
    // MPI_Init_thread asking for MPI_THREAD_MULTIPLE; throws CommError when MPI is already
    // initialised elsewhere or provides less.
    MpiEnvironment(int* argc, char*** argv);
    ~MpiEnvironment();  // MPI_Finalize
    MpiEnvironment(const MpiEnvironment&) = delete;
    MpiEnvironment& operator=(const MpiEnvironment&) = delete;

    int rank() const { return rank_; }  // in MPI_COMM_WORLD
    int size() const { return size_; }
    // A new "world" communicator over all processes (collective: every rank calls it); its
    // operations and those of its splits fail after timeout_s without their peers.
    std::unique_ptr<Communicator> world(double timeout_s) const;
    // Ends the whole MPI job at once (MPI_Abort); for the app layer only, after reporting.
    [[noreturn]] void abort_job(int code) const;

private:
    int rank_ = 0, size_ = 1;
};

}  // namespace px::comm
