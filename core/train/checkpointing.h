// Checkpoints during a run of any layout, and resuming from one (docs/files.md,
// core/io/checkpoint.h for the file). A checkpoint holds the logical state, so a run may resume
// under another layout: dp, tp, pp or ZeRO stage changed (resharding), and in bitwise mode it
// continues bit for bit as an uninterrupted run of the new layout would, because every layout
// computes the single device's bits from the same state.
//
// Index
//   RunCheckpoints        one rank's view: resume at the start, save after the steps that are due
//   resume_source         which file `checkpoint.resume` names ("auto": the newest valid in dir)
//   checkpoint_due        whether a checkpoint is written after a step
//
// Saving is a collective of the whole world in which every rank writes its own hyperslabs
// (core/parallel/state_slices.h: each logical element of /model and /optim by exactly one rank;
// no rank gathers the model). Under MPI (the world is core/comm/mpi.h's) every rank opens the
// file through parallel HDF5 (comm::native_comm), writes its pieces (independent I/O) and commits
// (collective: checksums and element counts summed). With in-process ranks (threads; serial HDF5
// is not thread-safe) world rank 0 creates one writer and registers it in a process-wide table
// under a token it broadcasts (an i64, with its pid as a check); every rank writes its pieces
// into it under one process-wide HDF5 mutex, and rank 0 commits. Either way a barrier of the
// world follows the writes, before anything is committed. A rank that fails (folder, file,
// pieces, commit, prune) aborts the world's communicator with its message and rethrows; the
// others' next collective throws CommError naming it, so nobody waits for a rank that left, and
// the temporary file is dropped (atomic temp file, fsync, rename: a failed save never leaves a
// final file). After commit world rank 0 prunes to the newest checkpoint.keep.
// Limitation: a failure inside parallel HDF5's own collectives (creating the file, committing)
// on some ranks only is HDF5's and MPI's to report; those calls have no timeout.
// Resuming: world rank 0 chooses the file (verifying every checksum; newer files that fail are
// reported and skipped; a file named by checkpoint.resume is verified the same way), broadcasts
// its step, and every rank opens it, checks the model's shapes, the data stream and the history,
// and reads only the hyperslabs it holds (Job::restore_local), under
// the same HDF5 mutex; a rank whose reads fail aborts the world likewise. The data and the random
// numbers are functions of (seed, step, position), so the step is all the data loader needs; the
// checkpoint's data source description must match the config's.
#pragma once
#include "core/comm/comm.h"
#include "core/base/config.h"
#include "core/train/job.h"
#include "core/parallel/state_slices.h"

#include <exception>
#include <string>

namespace px {

// The file to resume from: "" when checkpoint.resume is "" (or "auto" finds none: then `note`
// says so), the path itself when it names one. Reports skipped files through `note`.
std::string resume_source(const CheckpointConfig& ck, std::string* note);

// Whether a checkpoint is written after `step`: checkpoint.dir is set, and checkpoint.every
// divides the step or it is the last one.
bool checkpoint_due(const Config& cfg, i64 step);

class RunCheckpoints {
public:
    // world: this rank's world communicator; null for a single process without one.
    RunCheckpoints(const Config& cfg, comm::Communicator* world);

    // Loads the checkpoint checkpoint.resume names into the job, if any. Returns its step (0:
    // started fresh). Throws CheckpointError / ConfigError naming the file and the mismatch.
    i64 resume(Job& job);
    // After each step: saves when checkpoint.every divides the step, and after the last step.
    void after_step(Job& job);
    bool enabled() const { return !cfg_.checkpoint.dir.empty(); }
    // What this rank wrote in its last save (pieces, floats, its largest staging buffer).
    const SliceStats& last_save() const { return last_save_; }

private:
    std::string choose_resume();  // world rank 0 decides, every rank learns the path
    void save(Job& job);

    void save_mpi(const RankState& state, const std::string& path, const CheckpointMeta& meta,
                  MPI_Comm comm);
    void save_shared(const RankState& state, const std::string& path, const CheckpointMeta& meta);
    // A rank that failed (error non-null) fails the job first, so that the others' next
    // collective throws CommError naming the reason, then rethrows its error.
    void give_up(const std::exception_ptr& error, const std::string& path);
    void sync();  // a barrier of the world (none for one rank)

    const Config& cfg_;
    comm::Communicator* world_;
    int rank_ = 0;
    SliceStats last_save_;
    i64 need_bytes_ = 0;  // the next checkpoint's size, estimated before it is written
};

}  // namespace px
