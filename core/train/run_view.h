// What a running job shows of itself, and the hooks around its steps: the interface observers
// read (RunView), what they are told (Observer: metrics, named values, events, the FP8 drift
// monitor's rows), and the hooks a tool or a test adds around each step (StepHooks). The trainer
// (core/train/job.h) is one RunView; the thread-safe view for other threads is job_view.h.
//
// Index
//   RunView       what observers may read of a running job, on the job's thread
//   UpdateChoice  what a StepHooks::judge decides about a step's update
//   StepHooks     hooks around each step and each microbatch gradient (faults, tests, tools)
//   NamedValue    a named per-step value beyond StepMetrics
//   EventKind, RunEvent  what an event says happened
//   Observer      receives metrics and events as they happen
#pragma once
#include "core/base/config.h"
#include "core/base/metrics.h"
#include "core/parallel/part.h"
#include "core/parallel/pipeline/schedule.h"

#include <functional>
#include <string>
#include <vector>

namespace px {

// What observers may read of a running job. Observers are called on the job's thread, between
// steps; nothing here may be read from another thread while the job runs (core/job_view.h is
// the thread-safe view). Observers see world rank 0.
class RunView {
public:
    virtual ~RunView() = default;
    virtual const Config& config() const = 0;
    virtual i64 num_params() const = 0;  // of the whole model
    virtual i64 steps_done() const = 0;
    virtual const std::vector<StepMetrics>& history() const = 0;  // the job's thread only
    virtual int dp_size() const = 0;
    virtual double entropy_rate() const = 0;  // of the source, nats/token, when known (else -1)
    virtual double loss_floor() const = 0;    // minimal loss on validation windows (else -1)
    virtual MemoryStats memory() const = 0;   // this rank's
    virtual CpStats cp_stats() const { return {}; }  // this rank's (layout.cp > 1)
    virtual EpStats ep_stats() const { return {}; }  // this rank's (layout.ep > 1)
};

// What a StepHooks::judge decides about a step's update.
struct UpdateChoice {
    bool apply = true;     // false: the step's update is skipped (its batch is not drawn again)
    double clip_norm = 0;  // > 0: clip the gradient to this global norm (with train.grad_clip)
};

// Hooks around each optimizer step, on every rank: the fault injector (core/train/faults.h),
// and tests and tools that wrap a job from outside (a planted bug, a tracer). Empty members do
// nothing. `step` is the 1-based step being run. A job runs every StepHooks added, in order.
struct StepHooks {
    std::function<void(i64 step)> before;  // before anything of the step happens
    // A microbatch's gradient as its backward leaves it, before it joins the other microbatches
    // and replicas: floats [lo, hi) of `grads` (a GradLayout buffer; a chunk's span, or under
    // ZeRO-2/3 one unit's) hold this rank's local microbatch `microbatch` of the step.
    std::function<void(i64 step, int microbatch, float* grads, i64 lo, i64 hi)> microbatch_grad;
    // The step's reduced gradient (a GradLayout buffer; ZeRO-2/3: this rank's shard of it, the
    // rest reads 0), before the norm and the update read it.
    std::function<void(i64 step, float* grads)> grads;
    // Once the step's loss and gradient norm are known (the same on every rank), before the
    // update: whether to apply it, and a clipping norm of its own (core/train/spikes.h). Every
    // rank must answer alike. The update runs when every judge says apply; the smallest clip
    // norm given (> 0) joins train.grad_clip.
    std::function<UpdateChoice(i64 step, const StepMetrics& m)> judge;
    std::function<void(i64 step)> updated;  // after the update: the weights of the step are final
    // Around each compute action of the rank's schedule (the forward or the backward, or under a
    // zero-bubble schedule the B or the W, of one microbatch and chunk, core/parallel/pipeline/schedule.h): done = false just before it, true
    // just after it. A tracer measures the stage's work with it (the workbench's pipeline
    // timeline).
    std::function<void(i64 step, const Action& a, bool done)> compute;
};


// A named per-step value beyond StepMetrics (a layer's gradient norm, core/train/spikes.h).
struct NamedValue {
    std::string name;  // the run file's metric, e.g. "layer.h.3.grad_norm" (no '/')
    double value = 0;
};

enum class EventKind {
    resume,      // the run started from a checkpoint (logged by the view at on_start)
    rerun,       // a step ran again and replaced the rows from it on (logged by the view)
    checkpoint,  // a checkpoint was saved (the job's side: add_event)
    fault,       // a fault was detected or injected (the job's side: add_event)
    failure,     // the run stopped with an error (fail)
    alert,       // a monitor's alert (the FP8 drift monitor: Job::report_event)
    spike,       // a loss spike, its evidence, verdict and action (core/train/spikes.h)
};
const char* event_kind_name(EventKind k);  // "resume", ..., as the run file's /events/kind
// The kind a run file's /events/kind names; false for a word that is none of them.
bool event_kind_from_name(const std::string& name, EventKind* k);

struct RunEvent {
    i64 step = 0;  // the step it happened at (after that step's update; 0: before any)
    EventKind kind = EventKind::fault;
    std::string message;  // a sentence for people
    // Values that go with it (a spike's per-layer values as its first run saw them), maybe none.
    std::vector<NamedValue> evidence = {};
};

class Observer {
public:
    virtual ~Observer() = default;
    virtual void on_start(const RunView&) {}
    // Named values of a step, before that step's on_step (Job::emit_values). A step that is run
    // again sends them again.
    virtual void on_values(const RunView&, i64 /*step*/, const std::vector<NamedValue>&) {}
    virtual void on_step(const RunView&, const StepMetrics&) {}
    virtual void on_end(const RunView&) {}
    // What a tool beside the job reports through it (Job::report_event, report_fp8): an event as
    // it happens (an alert, a spike), and the FP8 drift monitor's rows of one step (before that
    // step's on_step; a step run again reports its rows again).
    virtual void on_event(const RunView&, const RunEvent&) {}
    virtual void on_fp8(const RunView&, const std::vector<Fp8Stat>&) {}
};


}  // namespace px
