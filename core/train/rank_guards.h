// Steps 5 and 6 of running a rank (runner.h): its checkpoints (resume, then save every N steps,
// checkpointing.h) and its faults (the injector and the replica check, faults.h), set up around
// the rank's Job.
#pragma once
#include "core/comm/comm.h"
#include "core/base/config.h"
#include "core/train/checkpointing.h"
#include "core/train/faults.h"

namespace px {

class RankGuards {
public:
    // Resumes `job` from the checkpoint config asks for (if any), attaches the fault injector
    // and starts the replica check, which runs before a checkpoint so that checkpoints hold
    // checked weights. Must outlive the job's run.
    RankGuards(const Config& cfg, comm::Communicator& world, Job& job)
        : checkpoints_(cfg, &world), faults_(cfg, &world), check_(cfg, world) {
        checkpoints_.resume(job);
        faults_.attach(job);
        check_.start(job);
    }
    RankGuards(const RankGuards&) = delete;
    RankGuards& operator=(const RankGuards&) = delete;

    // After each step: the replica check, then a checkpoint when one is due. False when the
    // check rewound the job: the step is re-run, and the caller skips its own per-step work.
    bool after_step(Job& job) {
        if (check_.after_step(job)) return false;
        checkpoints_.after_step(job);
        return true;
    }

private:
    RunCheckpoints checkpoints_;
    FaultInjector faults_;
    ReplicaCheck check_;
};

}  // namespace px
