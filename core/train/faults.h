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
// The replica check (validate.replica_check_every = N). Data-parallel replicas compute the same
// thing, so what one of them gets wrong shows as a difference from the others. After every step
// each rank hashes (position-keyed, as the checkpoint checksum of core/io/checkpoint.h: every
// flipped bit changes a hash), in the order the step makes them:
//   grads     the reduced gradient it updates from: as a replica (ZeRO-0/1), or its ZeRO-2/3
//             shard of it and the second copy of the next dp rank's shard it also reduces;
//   weights   the weights it holds as a replica (not under ZeRO-3, where it holds a shard), and
//             under ZeRO >= 1 its shard's weights and Adam moments, whose update only it
//             computes, and the second copy of the next dp rank's shard that it keeps and
//             updates from its own copy of that shard's gradient (DataParallel::check_updates,
//             core/parallel/data/zero.h): owner and second copy must agree bit for bit;
//   metrics   the step's loss, gradient norm and validation loss (the same on every rank).
// Every step is hashed because a fault does not stay where it struck: under ZeRO-1/2 a flipped
// weight is overwritten by its owner's shard at the next step, after it spread through that
// step's gradient to every replica, and a flipped gradient reaches the other stages and tensor-
// parallel ranks of its replica through the gradient norm.
// After every N-th step, and after any step a checkpoint is due (so a checkpoint only ever holds
// checked weights), and after the last step, the world all-gathers the hashes of the steps since
// the last check and finds the first step at which some ranks disagree, and at that step the
// first of the three kinds above that disagrees (where the fault entered). Replicas are the
// ranks of one dp group (same pp and tp coordinates): for a replicated hash, the value held by
// more than half is the majority, and the other ranks are named; for a shard, its owner and the
// rank that keeps its second copy are named (two copies: no majority).
//
// On a mismatch found at check step s, every rank rewinds to its snapshot of the last step that
// agreed (s0; a copy of its weights and moments taken then) and the job re-runs steps s0+1..s,
// checking after each. Megatron's rerun state machine does the same for a suspicious loss; here
// the evidence is the replicas:
//   - every re-run step agrees: the fault was transient. The ranks named are the first run's
//     majority's outliers, or (no majority) those whose hash at the first step that disagreed
//     differs from the re-run's; training goes on from the re-run, bit-identical to a run
//     without the fault;
//   - a re-run step disagrees again: the fault is persistent (it follows the hardware). Every
//     rank throws CorruptionError naming the ranks and the step; the app exits with the code
//     that tells a cluster script to take those nodes out (app/commands.h).
// Not with dp = 1 (the config refuses it: nothing to compare with). What it cannot see is listed
// in docs/faults.md ("Faults that cannot be detected").
#pragma once
#include "core/comm/comm.h"
#include "core/base/config.h"
#include "core/train/job.h"

#include <cstdint>
#include <string>
#include <vector>

namespace px {

// Floats hashed so that any flipped bit changes the hash (position-keyed 64-bit words summed
// mod 2^64, so it splits over threads exactly); the replica check's and the spike replay's.
std::uint64_t hash_floats(const float* w, i64 n);

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

    // Before the first step (after a resume): the second copies of ZeRO shards (a collective of
    // every dp group) and the snapshot to re-run from.
    void start(Job& job);
    // After each step, before checkpoints: hashes the step and checks when due. Returns true when
    // the job was rewound to re-run steps (the step's checkpoint is then skipped). Throws
    // CorruptionError on every rank when a re-run reproduces a mismatch.
    bool after_step(Job& job);

    i64 mismatches() const { return mismatches_; }  // detected so far (each re-run once)

    // What one rank reports for one step (hashes; 0 where it holds nothing of the kind). *_own
    // of a dp rank and *_checked of the previous dp rank are the two copies of one ZeRO shard.
    enum Word {
        grads, grads_own, grads_checked,         // the reduced gradient, before the update
        weights, shard_own, shard_checked,       // after the update
        metrics,                                 // loss, gradient norm, validation loss
        kWords
    };
    // Ranks found disagreeing at one step: each with the word that disagreed.
    struct Finding {
        i64 step = 0;  // 0: none
        std::vector<std::pair<int, Word>> suspects;
        bool no_majority = false;  // some of them cannot be told apart from their peers
        std::string what;          // a sentence naming them
        std::string again;         // the same, for a re-run that finds it again
        std::vector<int> ranks() const;
    };

private:
    bool due(i64 step) const;
    // Every rank's words of the `n` steps since the snapshot: all[(rank·n + k)·kWords + word].
    std::vector<std::uint64_t> gather(i64 n);
    Finding examine(const std::vector<std::uint64_t>& all, i64 n, i64 first_step) const;

    const Config& cfg_;
    comm::Communicator& world_;
    i64 every_ = 0;
    int zero_ = 0;            // the ZeRO stage over dp (0 when dp = 1)
    std::vector<int> group_;  // world rank -> dp group colour (replicas share one)
    std::vector<int> dp_;     // world rank -> its dp rank
    std::vector<int> by_dp_;  // (colour, dp rank) -> world rank: by_dp_[colour·dp + dp rank]
    int dp_size_ = 1;
    LocalSnapshot snap_;      // the state of the last step that agreed
    std::vector<std::uint64_t> window_;  // this rank's words of the steps since the snapshot
    std::uint64_t step_grads_[3] = {};   // the running step's gradient words (a StepHooks)
    // A re-run in progress: up to step rerun_to_, after a mismatch first found as first_, with
    // every rank's words of first_.step then (first_words_) and in the re-run (rerun_words_).
    i64 rerun_to_ = 0;
    Finding first_;
    std::vector<std::uint64_t> first_words_, rerun_words_;
    i64 mismatches_ = 0;
};

}  // namespace px
