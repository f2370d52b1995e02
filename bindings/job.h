// parallax.Job's pieces, shared by its files: the job as the module holds it, the calls every
// method starts with, and each topic's methods.
//
// Index
//   PyJob               a job: its config, its view, its session and stepped run, its probes
//   release             an ended job lets go of its folders and its run file
//   raise_if_failed, require_paused, wait   what a method checks and waits for
//   layout_dict         the resolved layout as a dict
//   bind_job_watch      metrics, events, named values, batches, router statistics, memory,
//                       communication, the layout in words (job_watch.cpp)
//   bind_job_fp8        the FP8 drift monitor's rows, the fp8 scaling state, fp8 casts
//                       (job_fp8.cpp)
//   bind_job_state      weights, gradients, moments, a rank's memory, the shard map, probes,
//                       checkpoints (job_state.cpp)
#pragma once
#include "bindings/common.h"

#include "core/train/job_view.h"
#include "core/train/probe_recorder.h"
#include "core/train/session.h"
#include "core/train/stepped_run.h"

#include <memory>
#include <vector>

namespace px::py_bind {

struct PyJob {
    Config cfg;
    JobView view;
    std::vector<py::object> observers;  // called after each step, the ranks paused
    bool failure_raised = false;        // the call that saw the job fail raised its error
    // The run, set up as every face sets one up (core/train/session.h): its outputs checked,
    // its folders locked, its run file and probe recorder.
    std::unique_ptr<RunSession> session;
    SteppedRun* run = nullptr;        // the session's
    ProbeRecorder* probes = nullptr;  // shared by every rank; null: no probes
};

// An ended job (finished or failed) lets go of its folders and its run file at once, not when
// Python collects it: h5py can open run.h5, and a new job can take the same out=.
void release(PyJob& j);
// A job another thread is stepping takes no other call (a usage error, not a bug); a failed
// job raises its error: as it was thrown from the call that saw it fail, and from every later
// call as a sentence that says the job failed before that call, and why.
void raise_if_failed(PyJob& j);
void require_paused(PyJob& j, const char* what);  // and not finished: `what` names the call
// Until the ranks pause (Ctrl-C: held at a step boundary, and KeyboardInterrupt raised); a run
// that failed raises its error.
void wait(PyJob& j);
py::dict layout_dict(const SteppedRun& run);

using JobClass = py::class_<PyJob>;
void bind_job_watch(JobClass& job);
void bind_job_fp8(JobClass& job);
void bind_job_state(JobClass& job);

}  // namespace px::py_bind
