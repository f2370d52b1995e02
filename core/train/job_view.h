// A thread-safe view of a running job (docs/watching.md): the job publishes
// what it does as it goes, and a GUI thread or a Python interpreter takes a snapshot at any
// moment, by value.
//
// The job never waits for a reader's copy. The job's side keeps the run's state and, after every
// change, publishes an immutable copy of it by swapping one pointer; a reader takes that pointer
// (a short lock around a pointer copy) and copies from it with no lock held. Metric rows and
// events live in blocks that the published copies share, so publishing a step costs one row and
// a pointer per block, not a copy of the whole history; rows below a published count are never
// written again (a re-run writes into a fresh copy of its block).
//
// Index
//   RunState       not started, running, finished, failed
//   (EventKind and RunEvent, what an event says happened, are in core/train/job.h)
//   MetricColumns  the per-step metrics (core/job.h StepMetrics) as columns
//   LayoutSummary  dp, tp, pp, ZeRO stage, microbatches, world size
//   RunSnapshot    everything a panel or a notebook reads of a run, copied out
//   JobView        the publisher: an Observer on the job's thread; snapshot() on any thread
//
// Usage: attach a JobView like any Observer (Job::add_observer, or the `observers` of
// run_layout / run_pipeline; they report rank 0), run the job on its own threads, and call
// view.update(snap) from the reader each frame: it returns false at once when nothing changed
// and otherwise copies only the rows and events `snap` lacks. A run that throws is marked with
// view.fail(e.what()) by whoever catches it.
#pragma once
#include "core/base/config.h"
#include "core/train/job.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace px {

// States only move forward, in this order (a failure may also come before the start).
enum class RunState { not_started, running, finished, failed };
const char* run_state_name(RunState s);  // "not started", "running", "finished", "failed"

// One row per step, in step order; a re-run step's rows replace the later ones.
struct MetricColumns {
    std::vector<i64> step;
    std::vector<double> loss, val_loss, grad_norm, lr, tokens_per_s, step_ms, comm_bytes;

    size_t size() const { return step.size(); }
    StepMetrics row(size_t i) const;       // row i back as the job reported it
    void push_back(const StepMetrics& m);  // appends one row to every column
    void resize(size_t n);                 // keeps the first n rows (n <= size())
};

// The named values of one step (Observer::on_values: spike evidence), shared, never changed.
struct StepValues {
    i64 step = 0;
    std::shared_ptr<const std::vector<NamedValue>> values;
};

struct LayoutSummary {
    int dp = 1, tp = 1, pp = 1;
    int zero = 0;          // ZeRO stage over the dp ranks
    int microbatches = 1;  // per dp rank and step (layout.microbatches, else train.microbatches)
    int world_size = 1;    // dp × pp × tp
    bool operator==(const LayoutSummary&) const = default;
};

struct RunSnapshot {
    std::uint64_t version = 0;  // grows with every change the job publishes; 0: none yet
    std::uint64_t epoch = 0;    // changes when rows were replaced (the start, a re-run)
    RunState state = RunState::not_started;
    std::string error;        // failed: what stopped the run
    Config config;            // the run's config (defaults until started)
    std::string config_toml;  // the same as TOML text, as run files store it
    LayoutSummary layout;
    i64 num_params = 0;        // of the whole model
    i64 steps_done = 0;        // steps the job has finished (a resumed run: from its checkpoint)
    i64 steps_total = 0;       // train.steps
    double entropy_rate = -1;  // of the data source, nats/token, when known (else -1)
    double loss_floor = -1;    // minimal loss on validation windows, when known (else -1)
    // Rows of the steps this run ran; a resumed run's begin after its checkpoint's step (the
    // earlier ones are in the checkpoint and the run file).
    MetricColumns metrics;
    std::vector<RunEvent> events;     // in the order they happened, never dropped
    std::vector<StepValues> values;   // steps with named values, in step order (as metrics)
    // The FP8 drift monitor's rows (core/train/fp8_monitor.h), step by step; empty when off.
    std::vector<Fp8Stat> fp8;
    std::vector<MemoryStats> memory;  // per world rank; zeros until that rank reports
};

class JobView : public Observer {
public:
    JobView();
    ~JobView() override;
    JobView(const JobView&) = delete;
    JobView& operator=(const JobView&) = delete;

    // ---- the job's side: any of the job's threads; never waits for a reader's copy ---------
    // A view follows one run: a second on_start is an Error (attach a new view to the next run).
    void on_start(const RunView& run) override;                       // running; config, layout
    void on_values(const RunView& run, i64 step, const std::vector<NamedValue>& values) override;
    void on_step(const RunView& run, const StepMetrics& m) override;  // one row, rank 0's memory
    void on_end(const RunView& run) override;                         // finished
    void add_event(i64 step, EventKind kind, const std::string& message);  // checkpoint, fault
    void on_event(const RunView& run, const RunEvent& e) override;  // an alert, a spike
    // The monitor's rows of a step; a step run again replaces its rows and the later ones.
    void on_fp8(const RunView& run, const std::vector<Fp8Stat>& rows) override;
    void fail(const std::string& error);  // failed, with a failure event; final
    // A world rank's memory (rank 0's comes from on_step; others report from a per-step hook).
    void set_memory(int rank, const MemoryStats& m);

    // ---- readers: any thread; they lock only to take the published state's pointer --------
    // Lock-free; when it equals a snapshot's version, update() has nothing to copy.
    std::uint64_t version() const { return version_.load(std::memory_order_acquire); }
    RunSnapshot snapshot() const;  // the whole state, copied
    // Brings `s` (a snapshot from this view, or empty) up to the latest state, copying only the
    // rows and events it lacks unless rows were replaced since. False: nothing changed.
    bool update(RunSnapshot& s) const;

private:
    struct State;    // the run's state as published: immutable once shared
    void publish();  // holding job_mutex_
    void begin_step(i64 step, bool values_too);  // holding job_mutex_

    std::mutex job_mutex_;           // orders the job's threads among themselves
    std::unique_ptr<State> work_;    // the job side's state, under job_mutex_
    mutable std::mutex swap_mutex_;  // held only to copy or replace `published_`
    std::shared_ptr<const State> published_;
    std::atomic<std::uint64_t> version_{0};
};

}  // namespace px
