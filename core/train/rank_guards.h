// Steps 5 and 6 of running a rank (runner.h): the run-time monitors a config asks for, attached
// to every rank's Job whatever face started the run (core/train/session.h): its checkpoints
// (resume, then save every N steps, checkpointing.h), its faults (the injector and the replica
// check, faults.h), its loss spikes (spikes.h) and the FP8 drift monitor (fp8_monitor.h).
#pragma once
#include "core/comm/comm.h"
#include "core/base/config.h"
#include "core/train/checkpointing.h"
#include "core/train/faults.h"
#include "core/train/fp8_monitor.h"
#include "core/train/spikes.h"

namespace px {

class RankGuards {
public:
    // Resumes `job` from the checkpoint config asks for (if any), attaches the fault injector,
    // starts the replica check, which runs before a checkpoint so that checkpoints hold checked
    // weights, the spike guard and the FP8 drift monitor (fp8_monitor.every > 0; its step hooks
    // hold it). Must outlive the job's run.
    RankGuards(const Config& cfg, comm::Communicator& world, Job& job)
        : checkpoints_(cfg, &world), faults_(cfg, &world), check_(cfg, world), spikes_(cfg, world) {
        checkpoints_.resume(job);
        faults_.attach(job);
        check_.start(job);
        spikes_.attach(job);  // after the injector: its hooks see a flipped gradient
        if (cfg.fp8_monitor.every > 0) Fp8Monitor::attach(job, cfg.fp8_monitor);
    }
    RankGuards(const RankGuards&) = delete;
    RankGuards& operator=(const RankGuards&) = delete;

    // After each step: the replica check, the spike guard, then a checkpoint when one is due.
    // False when either rewound the job: steps are re-run, and the caller skips its own per-step
    // work.
    bool after_step(Job& job) {
        if (check_.after_step(job)) return false;
        if (!spikes_.after_step(job)) return false;
        checkpoints_.after_step(job);
        return true;
    }

private:
    RunCheckpoints checkpoints_;
    FaultInjector faults_;
    ReplicaCheck check_;
    SpikeGuard spikes_;
};

}  // namespace px
