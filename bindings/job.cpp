// parallax.Job: a training job driven from Python, a few steps at a time, on its layout's
// in-process ranks (core/train/stepped_run.h). While it steps the GIL is released and Ctrl-C is
// honoured after the step in progress; metrics come from the job's thread-safe view
// (core/train/job_view.h), state as numpy arrays (state.cpp).
#include "bindings/job.h"
#include "bindings/state.h"

#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/io/output_paths.h"
#include "core/model/data.h"
#include "core/train/checkpointing.h"
#include "core/train/probe_recorder.h"
#include "core/train/session.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

namespace px::py_bind {

void release(PyJob& j) {
    const SteppedRun::Status s = j.run->status();
    if (s == SteppedRun::Status::finished || s == SteppedRun::Status::failed) j.session->release();
}

namespace {

// The error e was thrown as, with another message.
[[noreturn]] void rethrow_as(const std::exception_ptr& e, const std::string& msg) {
    try {
        std::rethrow_exception(e);
    } catch (const comm::CommError&) {
        throw comm::CommError(msg);
    } catch (const CheckpointError&) {
        throw CheckpointError(msg);
    } catch (const ConfigError&) {
        throw ConfigError(msg);
    } catch (const DataError&) {
        throw DataError(msg);
    } catch (const CorruptionError&) {
        throw CorruptionError(msg);
    } catch (const StorageError&) {
        throw StorageError(msg);
    } catch (...) {
        throw Error(msg);
    }
}

}  // namespace

void raise_if_failed(PyJob& j) {
    const SteppedRun::Status s = j.run->status();
    if (s == SteppedRun::Status::running || s == SteppedRun::Status::starting)
        throw Error("parallax.Job: another thread is running this job's steps; one thread at a "
                    "time drives a job (step(), run(), finish()), and any other call waits until "
                    "that one returns");
    if (s != SteppedRun::Status::failed) return;
    release(j);
    if (j.view.snapshot().state != RunState::failed) j.view.fail(j.run->error());
    if (!j.failure_raised) {
        j.failure_raised = true;
        j.run->rethrow();
    }
    std::exception_ptr e;
    try {
        j.run->rethrow();
    } catch (...) {
        e = std::current_exception();
    }
    // What happened is the error's first sentence; the advice after it was for the call that
    // saw it (raise a timeout, look for a missing call), not for a job whose ranks are gone.
    std::string why = j.run->error();
    if (const size_t end = why.find(". "); end != std::string::npos) why.resize(end + 1);
    rethrow_as(e, "parallax.Job: this job failed after step " +
                      std::to_string(j.run->steps_done()) +
                      ", before this call, and its ranks have stopped: it takes no more steps "
                      "and its state cannot be read. It failed because " +
                      why +
                      " Start a new parallax.Job (with checkpoint.dir set, checkpoint={\"resume\": "
                      "\"auto\"} goes on from its last checkpoint).");
}

void wait(PyJob& j) {
    wait_interruptibly(*j.run);
    raise_if_failed(j);
}

void require_paused(PyJob& j, const char* what) {
    raise_if_failed(j);
    if (j.run->status() == SteppedRun::Status::finished)
        throw Error(std::string(what) + ": the job has finished (finish(), run() or close()); "
                                        "start a new parallax.Job to train again");
}

namespace {

py::dict last_row(PyJob& j) {
    const std::vector<StepMetrics>& h = j.run->job(0).history();
    return h.empty() ? py::dict() : metrics_row(h.back());
}

py::dict step(PyJob& j, i64 n) {
    if (n < 1) throw ConfigError("step(n): n = " + std::to_string(n) + " must be at least 1");
    require_paused(j, "step");
    const i64 done = j.run->steps_done(), total = j.run->steps_total();
    if (done >= total)
        throw Error("step: the job has done all its train.steps = " + std::to_string(total) +
                    " steps; give the config more steps (train={\"steps\": N}) to train longer");
    const i64 target = std::min(total, done + n);
    if (j.observers.empty()) {
        j.run->advance_to(target);
        wait(j);
    } else {
        // One step at a time, so that each observer sees the job paused right after its step.
        for (i64 s = done + 1; s <= target; s++) {
            j.run->advance_to(s);
            wait(j);
            const py::dict row = last_row(j);
            for (const py::object& obs : std::vector<py::object>(j.observers)) obs(row);
        }
    }
    return last_row(j);
}

void finish(PyJob& j) {
    raise_if_failed(j);
    if (j.run->status() != SteppedRun::Status::finished) {
        j.run->finish();
        wait(j);
    }
    release(j);
}

// close() and leaving a `with` block: finish() a paused job; an ended one lets go of its files.
void close(PyJob& j) {
    const SteppedRun::Status s = j.run->status();
    if (s == SteppedRun::Status::paused) finish(j);
    else if (s == SteppedRun::Status::finished || s == SteppedRun::Status::failed) release(j);
    else raise_if_failed(j);  // another thread steps it
}

}  // namespace

py::dict layout_dict(const SteppedRun& run) {
    const Layout& l = run.layout();
    py::dict d;
    d["dp"] = l.dp;
    d["tp"] = l.tp;
    d["pp"] = l.pp;
    d["zero"] = l.zero;
    d["microbatches"] = l.microbatches;
    d["schedule"] = schedule_name(l.schedule);
    d["virtual_stages"] = l.virtual_stages;
    d["recompute"] = recompute_name(l.recompute);
    d["sequence_parallel"] = run.config().layout.sequence_parallel;
    d["world_size"] = l.world_size();
    return d;
}

void wait_interruptibly(SteppedRun& run) {
    for (;;) {
        bool settled;
        {
            py::gil_scoped_release nogil;
            settled = run.wait(0.05);
        }
        if (settled) return;
        if (PyErr_CheckSignals() != 0) {
            // Stop after the step in progress, so that the run is left at a step boundary.
            run.hold();
            {
                py::gil_scoped_release nogil;
                while (!run.wait(0.05)) {
                }
            }
            throw py::error_already_set();
        }
    }
}

void run_interruptibly(const std::function<void(const Cancel&)>& work) {
    struct Shared {
        std::mutex mu;
        std::condition_variable cv;
        bool done = false;
        std::exception_ptr error;
        std::atomic<bool> stop{false};
    };
    auto sh = std::make_shared<Shared>();
    const Cancel cancel{[sh] { return sh->stop.load(); }};
    std::thread worker([&work, &cancel, sh] {
        std::exception_ptr error;
        try {
            work(cancel);
        } catch (...) {
            error = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(sh->mu);
        sh->error = error;
        sh->done = true;
        sh->cv.notify_all();
    });
    auto settled = [&] {
        py::gil_scoped_release nogil;
        std::unique_lock<std::mutex> lock(sh->mu);
        return sh->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return sh->done; });
    };
    while (!settled()) {
        if (PyErr_CheckSignals() != 0) {
            sh->stop = true;  // the work throws Cancelled after its step in progress
            {
                py::gil_scoped_release nogil;
                worker.join();
            }
            throw py::error_already_set();
        }
    }
    worker.join();
    if (sh->error) std::rethrow_exception(sh->error);
}

void bind_job(py::module_& m) {
    JobClass job(m, "Job", R"doc(
A training job, driven from Python a few steps at a time.

Job(config=None, *, out=None, **sections)
    config    None (the embedded default job), a TOML file's path, a dict of sections, or a
              parallax.Config; keyword sections are applied after it, e.g.
              Job("examples/tiny.toml", train={"lr": 1e-3}, layout={"tp": 2}).
    out       a folder for the run file (<out>/run.h5), as `parallax train --out`. Without it a
              job writes no run file (output.run_file is off), so that the many jobs of a
              notebook do not share one; checkpoints follow [checkpoint] as in the CLI.
    probes    glob patterns over probe names step/phase/layer/op/tensor, e.g.
              "*/fwd/*/attn.*/*" or ["*/grad/**"]: every rank offers its pieces of those op
              outputs, gradients and updates to one recorder (read with probe(name)), at steps
              1, 1 + probe_stride, ...; they change no bit of the computation.

Every layout runs on in-process ranks (threads): each rank builds its part of the model and
pauses before step 1. step(n) lets the ranks run n more steps and waits for them, with the GIL
released; Ctrl-C (KeyboardInterrupt) stops them after the step in progress and leaves the job
usable. The result of every step is bit-identical to `parallax train` of the same config.

Bad configs raise parallax.ConfigError before any rank starts; a rank that fails raises its
error (CommError, CheckpointError, ...) from the call that waits for it.

>>> job = parallax.Job(train={"steps": 20})
>>> job.step(5)["step"]
5
>>> job.metrics()["loss"].shape
(5,)
)doc");
    job.def(py::init([](const py::object& config, const py::object& out, const py::object& probes,
                         i64 probe_stride, const py::kwargs& sections) {
                 auto j = std::make_unique<PyJob>();
                 j->cfg = make_config(config, sections);
                 const std::vector<std::string> inputs{
                     j->cfg.model.init_from, j->cfg.data.train_path, j->cfg.data.val_path,
                     j->cfg.checkpoint.resume == "auto" ? "" : j->cfg.checkpoint.resume};
                 if (out.is_none()) {
                     j->cfg.output.run_file = false;
                 } else {
                     j->cfg.output.dir = py::str(py::module_::import("os").attr("fspath")(out));
                 }
                 SessionOptions so;
                 so.observers = {&j->view};
                 std::vector<std::string> notes;  // a dead process's lock taken over
                 so.note = [&](const std::string& n) { notes.push_back(n); };
                 if (!probes.is_none()) {
                     if (py::isinstance<py::str>(probes))
                         so.probes.push_back(probes.cast<std::string>());
                     else
                         so.probes = probes.cast<std::vector<std::string>>();
                     so.probe_stride = probe_stride;
                 }
                 // Outputs checked and folders locked before anything runs, as `parallax train`
                 // does; the monitors the config asks for are attached on every rank. A missing
                 // or unreadable input file is also an OSError (with_files).
                 j->session = std::make_unique<RunSession>(j->cfg, std::move(so));
                 for (const std::string& n : notes)
                     if (PyErr_WarnEx(PyExc_RuntimeWarning, n.c_str(), 1) != 0)
                         throw py::error_already_set();
                 with_files(inputs, [&] {
                     j->run = &j->session->start();
                     j->probes = j->session->probes();
                     wait(*j);  // every rank built (and resumed) and paused before its next step
                 });
                 return j;
             }),
             py::arg("config") = py::none(), py::kw_only(), py::arg("out") = py::none(),
             py::arg("probes") = py::none(), py::arg("probe_stride") = 1)
        .def_property_readonly(
            "config", [](const PyJob& j) { return PyConfig{j.cfg}; }, "The job's config.")
        .def_property_readonly(
            "layout", [](const PyJob& j) { return layout_dict(*j.run); },
            "The resolved layout: dp, tp, pp, zero, microbatches, schedule, virtual_stages, "
            "recompute, sequence_parallel, world_size.")
        .def_property_readonly(
            "world_size", [](const PyJob& j) { return j.run->world_size(); },
            "Ranks of the layout (dp × pp × tp), each a thread.")
        .def_property_readonly(
            "steps_done", [](const PyJob& j) { return j.run->steps_done(); },
            "Optimizer steps done (a resumed job counts the checkpoint's).")
        .def_property_readonly(
            "steps_total", [](const PyJob& j) { return j.run->steps_total(); }, "train.steps.")
        .def_property_readonly(
            "status", [](const PyJob& j) { return stepped_status_name(j.run->status()); },
            "\"paused\" between steps, \"finished\" after finish(), \"failed\" after an error.")
        .def_property_readonly(
            "num_params",
            [](PyJob& j) {
                raise_if_failed(j);
                return j.run->job(0).num_params();
            },
            "Parameters of the whole model.")
        .def_property_readonly(
            "loss_floor",
            [](PyJob& j) {
                raise_if_failed(j);
                return j.run->job(0).loss_floor();
            },
            "The least expected validation loss (nats per target) any model can reach on the "
            "job's synthetic source for windows of seq_len + 1 tokens; -1 for token files.")
        .def_property_readonly(
            "entropy_rate",
            [](PyJob& j) {
                raise_if_failed(j);
                return j.run->job(0).entropy_rate();
            },
            "Nats per token of the synthetic source's process; -1 where it has none (token "
            "files, the copy source).")
        .def("step", &step, py::arg("n") = 1, R"doc(
Runs n more steps (fewer if train.steps ends first) on every rank and returns the last step's
metrics as a dict (step, loss, val_loss, grad_norm, lr, tokens_per_s, step_ms, comm_bytes;
val_loss is -1 at steps without evaluation). With observers the ranks advance one step at a time
and every observer is called after each. KeyboardInterrupt stops the job after the step in
progress; the job stays usable.)doc")
        .def(
            "run",
            [](PyJob& j) {
                if (j.run->status() == SteppedRun::Status::paused &&
                    j.run->steps_done() < j.run->steps_total())
                    step(j, j.run->steps_total() - j.run->steps_done());
                finish(j);
                return metrics_dict(j.view.snapshot().metrics);
            },
            "Runs the remaining steps, then finish(); returns metrics().")
        .def("finish", &finish, R"doc(
Ends the run at the steps done, as the CLI's run ends: the llm.c export (output.export_llmc) is
written and observers see the end. Each rank then holds its whole state (ZeRO shards gathered);
the state stays readable, but the job takes no more steps.)doc")
        .def(
            "close", &close,
            "finish() if the job is paused; a finished or failed job lets go of its output "
            "folders and its run file (also done by finish() and run() themselves, and by the "
            "call that saw it fail). Its memory is freed when the last array that views it and "
            "the job itself are gone.")
        .def("__enter__", [](py::object self) { return self; })
        .def(
            "__exit__",
            [](PyJob& j, const py::object&, const py::object&, const py::object&) { close(j); },
            "close(), also when the block raised (a failed job stays failed).")
        .def(
            "add_observer",
            [](PyJob& j, const py::function& fn) { j.observers.push_back(fn); },
            py::arg("fn"),
            "fn(metrics) is called after every step with that step's metrics dict, while every "
            "rank is paused (it may read the job's state). An exception it raises propagates "
            "from step() and leaves the job paused after that step.")
        .def(
            "remove_observer",
            [](PyJob& j, const py::function& fn) {
                auto it = std::find_if(j.observers.begin(), j.observers.end(),
                                       [&](const py::object& o) { return o.is(fn); });
                if (it == j.observers.end()) throw ConfigError("remove_observer: not an observer of this job");
                j.observers.erase(it);
            },
            py::arg("fn"))
        .def("__repr__", [](PyJob& j) {
            return "<parallax.Job " + j.cfg.source_name + ": " +
                   std::to_string(j.run->world_size()) + " rank(s), step " +
                   std::to_string(j.run->steps_done()) + "/" +
                   std::to_string(j.run->steps_total()) + ", " +
                   stepped_status_name(j.run->status()) + ">";
        });
    bind_job_watch(job);
    bind_job_fp8(job);
    bind_job_state(job);
}

}  // namespace px::py_bind
