// Checkpoints during a run of any layout, and resuming from one (DESIGN.md §6, core/checkpoint.h
// for the file). A checkpoint holds the logical state, so a run may resume under another layout:
// dp, tp, pp or ZeRO stage changed (resharding), and in bitwise mode it continues bit for bit as
// an uninterrupted run of the new layout would, because every layout computes the single
// device's bits from the same state.
//
// Index
//   RunCheckpoints        one rank's view: resume at the start, save after the steps that are due
//   resume_source         which file `checkpoint.resume` names ("auto": the newest valid in dir)
//
// Saving is a collective of the whole world: every rank gathers the logical weights and Adam
// moments (Job::gather_full / PipelineJob::gather_full: over dp for the ZeRO shards, over tp
// for the shards' logical places, over pp for the stages), then world rank 0 writes the file
// atomically (temporary file, fsync, rename) and prunes to the newest checkpoint.keep.
// Resuming: world rank 0 chooses the file (verifying every checksum; newer files that fail are
// reported and skipped), broadcasts its step, and every rank reads it and takes its slices
// (Job::restore / PipelineJob::restore). The data and the random numbers are functions of
// (seed, step, position), so the step is all the data loader needs; the checkpoint's data
// source description must match the config's.
#pragma once
#include "core/comm/comm.h"
#include "core/config.h"
#include "core/job.h"

#include <string>

namespace px {

class PipelineJob;

// The file to resume from: "" when checkpoint.resume is "" (or "auto" finds none: then `note`
// says so), the path itself when it names one. Reports skipped files through `note`.
std::string resume_source(const CheckpointConfig& ck, std::string* note);

class RunCheckpoints {
public:
    // world: this rank's world communicator; null for a single process without one.
    RunCheckpoints(const Config& cfg, comm::Communicator* world);

    // Loads the checkpoint checkpoint.resume names into the job, if any. Returns its step (0:
    // started fresh). Throws CheckpointError / ConfigError naming the file and the mismatch.
    i64 resume(Job& job);
    i64 resume(PipelineJob& stage);
    // After each step: saves when checkpoint.every divides the step, and after the last step.
    void after_step(Job& job);
    void after_step(PipelineJob& stage);
    bool enabled() const { return !cfg_.checkpoint.dir.empty(); }

private:
    bool due(i64 step) const;
    std::string choose_resume();  // world rank 0 decides, every rank learns the path
    template <class J>
    i64 resume_into(J& job);
    template <class J>
    void save(J& job);

    const Config& cfg_;
    comm::Communicator* world_;
    int rank_ = 0;
};

}  // namespace px
