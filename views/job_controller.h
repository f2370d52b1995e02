// The workbench's job: one run on its own threads (core/train/stepped_run.h), set up as every
// face sets one up (core/train/session.h: outputs checked, folders locked, the run file, the
// monitors the config asks for), which the job bar starts, pauses, steps, stops and restarts,
// and which the panels read only through its JobView's snapshots (core/train/job_view.h) and its
// CommTrace. Nothing here waits for a step, except a start while a stopped run still ends: a
// stopped run is ended and joined on a thread of its own, which a new start joins first, so that
// the new run can take the folders the old one held.
//
// Index
//   JobStatus      none, starting, running, paused, finished, failed, stopped
//   JobController  start / pause / resume / single_step / stop; poll each frame; update(snap)
#pragma once
#include "views/comm_trace.h"
#include "core/base/config.h"
#include "core/train/job_view.h"
#include "core/train/session.h"
#include "core/train/stepped_run.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace px::views {

enum class JobStatus { none, starting, running, paused, finished, failed, stopped };
const char* job_status_name(JobStatus s);  // "no job", "starting", ...

class JobController {
public:
    JobController() = default;
    ~JobController();  // ends the run and joins every thread it started
    JobController(const JobController&) = delete;
    JobController& operator=(const JobController&) = delete;

    // Starts cfg as a new run (the previous one, if any, is stopped first): validated here, so a
    // bad config (or an output it cannot write, a folder another run holds) throws ConfigError
    // naming the key before any thread starts. `run`: advance to the last step at once; else
    // wait before step 1 for resume() or single_step().
    void start(const Config& cfg, bool run, const RunHooks& hooks = {});
    void pause();           // the ranks stop after the step in progress
    void resume();          // on to the last step
    void single_step();     // one more step, then pause
    void run_to(i64 step);  // on to `step`, then pause (screenshots, measurements)
    void stop();            // ends the run after the step in progress; its snapshot stays readable
    // Until every stopped run has ended and let go of its folders (its thread joined).
    void wait_stopped();
    // Each frame: a run that did its last step is finished (observers' on_end), a failed one
    // marks its view failed. Cheap: a few short locks.
    void poll();

    JobStatus status() const { return status_; }
    const Config& config() const { return cfg_; }
    // The latest state into s (JobView::update); false when nothing changed. A new run resets s.
    bool update(RunSnapshot& s);
    const CommTrace* trace() const { return trace_.get(); }
    std::uint64_t run_id() const { return run_id_; }  // grows with every start

private:
    void retire();  // hands the current run to a thread that ends and joins it

    Config cfg_;
    JobStatus status_ = JobStatus::none;
    std::shared_ptr<JobView> view_;
    std::shared_ptr<CommTrace> trace_;
    std::unique_ptr<RunSession> session_;
    SteppedRun* run_ = nullptr;  // the session's
    std::vector<std::thread> reapers_;
    std::uint64_t run_id_ = 0, seen_run_ = 0;
    bool failure_reported_ = false;
    bool finishing_ = false;  // finish() was asked of the current run
};

}  // namespace px::views
