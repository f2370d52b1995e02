// Faults: a fault injector that strikes one rank in one step, and a replica check that catches
// silent data corruption across data-parallel replicas and re-runs steps to classify it.
//
// Index
//   FaultInjector   fault.* of the config on one rank: kill, stall, flip a bit of the gradient
//                   or of the weights (StepHooks on a Job)
//   ReplicaCheck    validate.replica_check_every: replicas compare weight checksums; a mismatch
//                   is re-run from the last state that agreed and judged transient or persistent
//
// What each fault looks like to the rest of the job:
//   kill   the rank stops for good before the step. As a process (MPI) it kills itself with
//          SIGKILL, and the launcher ends the job (mpirun: "process rank r ... exited on signal
//          9", exit status 137). As a thread (in-process ranks) it goes silent: the other ranks'
//          next collective with it fails after layout.timeout_s with a CommError naming it ("rank
//          r did not arrive"), and the silent thread then ends too.
//   stall  the rank sleeps fault.stall_s before the step (0: until the job gives up on it). A
//          stall shorter than layout.timeout_s only delays the step; a longer one fails the
//          others' collectives naming the rank, and the stalled rank leaves as soon as it sees
//          the failure (Communicator::failure), as a hung process killed by a watchdog would.
//   flip_grad / flip_weight   bit fault.bit of element fault.element of fault.tensor (this
//          rank's piece of it: its tp shard, its pipeline stage) flips in the step's reduced
//          gradient before the update, or in the weights after the update. Nothing else notices;
//          the replica check is what catches it. fault.persistent: the flip repeats whenever the
//          step is run again (a faulty unit), else only the first time (a transient upset).
//
// The replica check (validate.replica_check_every = N). After every N-th step, and after any
// step a checkpoint is due (so a checkpoint only ever holds checked weights), every rank hashes
// the weights it holds as a replica (position-keyed, as the checkpoint checksum of
// core/io/checkpoint.h: every flipped bit changes it) and the world all-gathers the hashes. A fault
// in a replica's gradient or Adam moments shows in its weights after the update. Replicas are the ranks of one dp group (same pp and tp
// coordinates): in each group the hash held by more than half is the majority, and the other
// ranks are named. On a mismatch at step s, every rank rewinds to its snapshot of the last step
// that agreed (s0; a copy of its weights and moments taken then) and the job re-runs steps
// s0+1..s, checking after each. Megatron's rerun state machine does the same for a suspicious
// loss; here the evidence is the replicas:
//   - every re-run step agrees: the fault was transient. The ranks whose first hash differed from
//     the re-run's agreed one are named, and training goes on from the re-run;
//   - a re-run step disagrees again: the fault is persistent (it follows the hardware). Every
//     rank throws CorruptionError naming the ranks and the step; the app exits with the code
//     that tells a cluster script to take those nodes out (app/commands.h).
// Not under ZeRO-3 (each rank holds its own shard: nothing to compare) nor with dp = 1: the
// config refuses both. Under ZeRO-1/2 each rank updates only its shard of the weights and
// all-gathers it, so a fault in a rank's gradient shard lands in every replica's weights and is
// not seen, and a fault in a replica's weights is overwritten at the next all-gather (check every
// step to see it): what has no replica cannot be checked by replicas.
#pragma once
#include "core/comm/comm.h"
#include "core/base/config.h"
#include "core/train/job.h"

#include <cstdint>
#include <string>
#include <vector>

namespace px {

class FaultInjector {
public:
    // `world`: this rank's world communicator (a stalled or silent rank polls it for the job's
    // failure); null for a single process without one.
    FaultInjector(const Config& cfg, comm::Communicator* world);
    bool armed() const { return armed_; }  // this rank has a fault to inject

    // Adds its StepHooks to the job; checks that fault.tensor and fault.element exist on this rank
    // (ConfigError naming the keys otherwise).
    void attach(Job& job);

private:
    bool strikes(i64 step);  // this step, and (persistent or not yet struck)
    void before(i64 step);
    void flip(i64 step, float* base, const char* what);
    // Sleeps `seconds` (<= 0: forever), leaving with a CommError as soon as the job has failed.
    void wait(i64 step, double seconds);
    void stall(i64 step);

    FaultConfig f_;
    comm::Communicator* world_;
    bool armed_ = false;
    int struck_ = 0;
    i64 offset_ = 0;  // of the element in the rank's parameter table (and gradient buffer)
};

class ReplicaCheck {
public:
    ReplicaCheck(const Config& cfg, comm::Communicator& world);
    bool enabled() const { return every_ > 0; }

    // Before the first step: the snapshot to re-run from.
    void start(Job& job);
    // After each step, before checkpoints: checks when due. Returns true when the job was
    // rewound to re-run steps (the step's checkpoint is then skipped). Throws CorruptionError
    // on every rank when a re-run reproduces a mismatch.
    bool after_step(Job& job);

    i64 mismatches() const { return mismatches_; }  // detected so far (each re-run once)

private:
    bool due(i64 step) const;
    std::vector<std::uint64_t> hashes(std::uint64_t mine);  // world all-gather
    // Ranks that disagree with their replicas' majority (a group without one: all its ranks).
    std::vector<int> outliers(const std::vector<std::uint64_t>& h, bool* no_majority) const;

    const Config& cfg_;
    comm::Communicator& world_;
    i64 every_ = 0;
    std::vector<int> group_;  // world rank -> dp group colour (replicas share one)
    LocalSnapshot snap_;      // the state of the last step that agreed
    // A re-run in progress: up to step rerun_to_, after a mismatch whose hashes were first_.
    i64 rerun_to_ = 0;
    std::vector<std::uint64_t> first_;
    std::vector<int> first_outliers_;
    bool first_no_majority_ = false;
    i64 mismatches_ = 0;
};

}  // namespace px
