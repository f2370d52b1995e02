// A run that pauses between steps: a config trained on its layout's in-process ranks (threads),
// as run_layout does, but driven from outside a few steps at a time. The Python module's
// `parallax.Job` is one; a workbench can be another. While it is paused, the caller reads every
// rank's job (its weights, gradients and moments stay where they are: nothing is copied) and can
// run work on every rank at once, collectives included (gather the logical state, save a
// checkpoint); it can interrupt a long advance after the step in progress, and finish the run.
//
// Index
//   SteppedRun     start: ranks built and paused before their first step; advance_to, wait,
//                  hold, job, on_each_rank, finish
//
// How it pauses. Every rank runs run_rank (runner.h) on its thread, with RunHooks whose `setup`
// (before the first step, after a resume) and `each_step` (after each step and its checkpoint)
// are pause points, and whose `inspect` (after the run and Job::unshard) is the last one. At a
// pause point a rank waits while it has done as many steps as the budget allows; advance_to
// raises the budget. The ranks' collectives keep them in step with each other, so they all pause
// at the same step. hold() lowers the budget to the step in progress, so the ranks stop after it
// (Ctrl-C in a notebook): the run stays usable and continues bit for bit when advanced again,
// since a step is never cut in the middle. A pause is not a collective: nothing waits on a
// timeout while the ranks are paused, however long.
//
// Errors. A rank that throws (a failed collective, a checkpoint that cannot be read, an injected
// fault) ends the run: it fails the world's communicator (the others' collectives throw at once)
// and the other ranks are woken from their pauses and leave too; once all have left, every later
// call reports the error that caused the others (rethrow; comm::cause_of, as run_layout does). The ranks' jobs are kept (RankRun) until the SteppedRun is
// destroyed, so memory a caller still reads stays valid, finished or failed. Destroying a
// SteppedRun ends the ranks wherever they wait and joins them.
#pragma once
#include "core/base/config.h"
#include "core/comm/comm.h"
#include "core/comm/run_ranks.h"
#include "core/parallel/mesh.h"
#include "core/train/job.h"
#include "core/train/runner.h"

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace px {

class SteppedRun {
public:
    enum class Status {
        starting,  // ranks are building their jobs (and resuming)
        running,   // some rank is stepping, or working on an on_each_rank task
        paused,    // every rank waits after steps_done() steps
        finished,  // every rank ended its run (finish) and waits with its whole state
        failed,    // a rank threw: error() says what; the ranks are gone
    };

    // Validates cfg and its layout, and that the process can hold the ranks (threads and memory:
    // make_in_process_layout; ConfigError naming the keys), then starts one thread per
    // rank; they build their jobs (resuming when cfg says so) and pause before their first step.
    // `observers` see world rank 0 (as run_layout's); `hooks` run on every rank before this run's
    // pause points. cfg.train.threads is per rank: 0 shares the cores out (threads_per_rank).
    explicit SteppedRun(const Config& cfg, std::vector<Observer*> observers = {},
                        RunHooks hooks = {});
    ~SteppedRun();  // ends the ranks where they wait (or at their next pause) and joins them
    SteppedRun(const SteppedRun&) = delete;
    SteppedRun& operator=(const SteppedRun&) = delete;

    const Config& config() const { return cfg_; }  // as given (threads: as given)
    const Layout& layout() const { return layout_; }
    const Mesh& mesh() const { return mesh_; }
    int world_size() const { return layout_.world_size(); }
    i64 steps_total() const { return cfg_.train.steps; }

    // Lets the ranks run until they have done `step` steps (at most train.steps; a lower budget
    // than the steps done changes nothing). Returns at once: wait() for them.
    void advance_to(i64 step);
    // Until no rank is running (paused, finished or failed), at most timeout_s seconds; false
    // when they are still running.
    bool wait(double timeout_s);
    // The ranks stop after the step each is running (or pause where they are): wait() then sees
    // them paused at a step boundary.
    void hold();
    // Ends the run at the steps done: each rank finishes Job::run (ZeRO-3 gathers its weights,
    // the llm.c export is written, observers' on_end), unshards its state and waits as
    // finished. Returns at once: wait() for it. InternalError unless paused.
    void finish();

    Status status() const;
    i64 steps_done() const;     // steps every rank has done (at the last pause)
    std::string error() const;  // failed: the first rank's error ("" otherwise)
    void rethrow() const;       // failed: throws the first rank's error as it was thrown

    // Paused or finished: world rank r's job, to read (the caller keeps the ranks paused while
    // it reads: it advances nothing meanwhile). InternalError otherwise.
    Job& job(int rank);
    // The same rank's world communicator: its accounting (stat_rows, stats_book) to read.
    comm::Communicator& world(int rank);
    // Paused or finished: fn(job, world communicator) on every rank at once, on the rank's
    // thread, so collectives of the rank's groups and world are allowed; waits for every rank and
    // rethrows the first (lowest rank's) error. InternalError unless paused or finished.
    void on_each_rank(const std::function<void(Job&, comm::Communicator&)>& fn);

private:
    // left: its run ended (failed, or ended from outside) and its thread waits, keeping its job.
    enum class RankState { building, running, paused, working, finished, left };
    struct Rank {
        RankState state = RankState::building;
        Job* job = nullptr;
        comm::Communicator* world = nullptr;
        i64 done = 0;            // steps done at the last pause point
        std::uint64_t task = 0;  // the last task generation it ran
        std::exception_ptr task_error;
    };
    void run_ranks();                                // the driver thread
    void rank_main(comm::Communicator& world, const Config& cfg, const RunHooks& hooks);
    void pause(Job& job, bool finished);             // a pause point on a rank's thread
    bool settled() const;                            // holding mu_
    void require_settled(const char* what) const;    // holding mu_
    Status status_locked() const;                    // holding mu_

    Config cfg_;
    Layout layout_;
    Mesh mesh_;
    std::vector<Observer*> observers_;
    RunHooks hooks_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<Rank> ranks_;
    i64 budget_ = 0;
    bool finishing_ = false;
    bool cancel_ = false;      // the ranks leave their pauses (a failure, or the destructor)
    bool destroying_ = false;  // the ranks that left end their threads
    bool ended_ = false;       // every rank left its run
    comm::RankErrors errors_;  // what each rank threw, in the order they threw
    std::exception_ptr error_;  // once every rank left: the cause among them (comm::cause_of)
    std::string error_text_;
    const std::function<void(Job&, comm::Communicator&)>* task_ = nullptr;
    std::uint64_t task_gen_ = 0;
    std::thread driver_;
};

const char* stepped_status_name(SteppedRun::Status s);  // "starting", ..., "failed"

}  // namespace px
