// Inside parallax validate (validators/validate.h): the lockstep turns, and one layout's run with
// every rank's state compared with the reference after every step (validators/pieces.h). Not a
// public interface: validate.cpp and validate_steps.cpp share it.
//
// Index
//   Pacer, Turn    the runs' turns by step
//   Alternate      fast mode: a single-device run that sizes the reference's rounding error
//   Budgets        what a layout's step is judged against in fast mode
//   ReferenceRun   the reference's state after every step and its probes
//   lockstep       runs a layout, comparing every rank's pieces after every step
//   world_rank     the world rank of a rank's job
#pragma once
#include "core/base/config.h"
#include "core/io/state.h"
#include "core/train/runner.h"
#include "core/train/probe_recorder.h"
#include "validators/validate.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace px {

class Job;
class Mesh;

// Lockstep (validate.h): the runs take turns by step. Run k may begin step s once every run has
// finished step s - 1 and every run before it in the order has finished step s, so exactly one
// run computes at a time and step s of every run comes before step s + 1 of any.
class Pacer {
public:
    explicit Pacer(int runs);
    // Blocks until run k's turn at `step`. Ends by throwing when the turns were aborted, or when
    // `failed` (polled while waiting: the run's own job failed elsewhere, a rank that threw or
    // a collective that timed out) returns a message.
    void wait_turn(int k, i64 step, const std::function<std::string()>& failed = {});
    // Run k finished `step` (every rank of it): the time since the last turn ended is its.
    void finished(int k, i64 step);
    // Run k ended (its last step, or a failure): nobody waits for it any more.
    void retire(int k);
    void abort(const std::string& why);
    double seconds(int k) const;

private:
    using Clock = std::chrono::steady_clock;
    bool turn(int k, i64 step) const;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::vector<i64> done_;  // the last step each run finished; i64 max: ended
    std::vector<double> seconds_;
    Clock::time_point last_ = Clock::now();
    std::string aborted_;
};

// A run's place in the turns; a null pacer: the run goes alone.
struct Turn {
    Pacer* pacer = nullptr;
    int run = 0;
};

// Fast mode: a single-device run that sizes the reference's own rounding error (budget.h), taking
// its turns beside the layouts: after its step s, its state and reduced gradients of step s.
struct Alternate {
    Config cfg;
    LogicalState state;
    ProbeRecorder grads{std::vector<std::string>{"*/grad/**"}};
    std::exception_ptr error;
};

// What a layout's step is judged against in fast mode: the alternates and the finer run (budget.h
// error_budget's), each at the same step as the layout.
struct Budgets {
    std::vector<const Alternate*> alternates;
    const Alternate* finer = nullptr;
};

// The reference, as the layouts read it: its state after step s at states[s - 1] (the vector
// grows while the layouts run, never beyond its reserve), and the probes of every step that the
// layouts' ranks are compared on besides the state: the reduced gradients, fp8's scales and
// histories, the loss scale (kReferencePatterns).
struct ReferenceRun {
    std::vector<LogicalState> states;
    ProbeRecorder probes;
    ReferenceRun();
};
extern const std::vector<std::string> kReferencePatterns;

// Runs layout config c (its schedule of train.steps), stopping after `steps`. After every step
// each rank's pieces of the reduced gradients, weights, Adam moments and scaling state, and its
// metrics, are compared with the reference's (validators/pieces.h) into r, once every rank has
// finished the step, on the thread of the last one to finish. With a pacer, each step waits for
// its turn (the reference and the alternates have then finished that step). `cancel` is asked
// after every step. Returns, in fast mode, the logical state after the last step put together
// from the ranks' pieces (the final budget's); in bitwise mode an empty state.
LogicalState lockstep(const Config& c, const ReferenceRun& ref, LayoutResult& r, i64 steps,
                      const RunHooks& decorate, const Cancel& cancel,
                      const ValidateWatch* watch = nullptr, const Budgets* budgets = nullptr,
                      Turn turn = {});

int world_rank(const Mesh& mesh, const Job& job);

}  // namespace px
