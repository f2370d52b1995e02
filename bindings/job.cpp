// parallax.Job: a training job driven from Python, a few steps at a time, on its layout's
// in-process ranks (core/train/stepped_run.h). While it steps the GIL is released and Ctrl-C is
// honoured after the step in progress; metrics come from the job's thread-safe view
// (core/train/job_view.h), state as numpy arrays (state.cpp).
#include "bindings/common.h"
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

namespace {

struct PyJob {
    Config cfg;
    JobView view;
    std::vector<py::object> observers;  // called after each step, the ranks paused
    bool failure_raised = false;        // the call that saw the job fail raised its error
    // The run, set up as every face sets one up (core/train/session.h): its outputs checked,
    // its folders locked, its run file and probe recorder.
    std::unique_ptr<RunSession> session;
    SteppedRun* run = nullptr;       // the session's
    ProbeRecorder* probes = nullptr;  // shared by every rank; null: no probes
};

// An ended job (finished or failed) lets go of its folders and its run file at once, not when
// Python collects it: h5py can open run.h5, and a new job can take the same out=.
void release(PyJob& j) {
    const SteppedRun::Status s = j.run->status();
    if (s == SteppedRun::Status::finished || s == SteppedRun::Status::failed) j.session->release();
}

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

// A job another thread is stepping takes no other call (a usage error, not a bug); a failed
// job raises its error: as it was thrown from the call that saw it fail, and from every later
// call as a sentence that says the job failed before that call, and why.
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

// Until the ranks pause (Ctrl-C: held at a step boundary, and KeyboardInterrupt raised); a run
// that failed raises its error.
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

std::string save_checkpoint(PyJob& j, const py::object& where) {
    raise_if_failed(j);
    const std::string dir = py::str(py::module_::import("os").attr("fspath")(where));
    Config c = j.cfg;
    c.checkpoint.dir = dir;
    c.checkpoint.every = 1;  // due after every step: RunCheckpoints saves now
    c.checkpoint.keep = INT64_MAX / 2;
    check_output_folder(dir, "save_checkpoint(dir)");
    const i64 step = j.run->steps_done();
    if (step == 0)
        throw ConfigError("save_checkpoint: nothing to save before the first step (a checkpoint "
                          "holds the state after a step)");
    {
        py::gil_scoped_release nogil;
        j.run->on_each_rank([&](Job& job, comm::Communicator& world) {
            RunCheckpoints(c, &world).after_step(job);
        });
    }
    return checkpoint_path(dir, step);
}

py::list memory_rows(PyJob& j) {
    py::list rows;
    for (int r = 0; r < j.run->world_size(); r++) {
        const MemoryStats m = j.run->job(r).memory();
        py::dict d;
        d["rank"] = r;
        d["params"] = m.params;
        d["grads"] = m.grads;
        d["optimizer"] = m.optimizer;
        d["activations"] = m.activations;
        d["comm"] = m.comm;
        d["peak_params"] = m.peak_params;
        d["peak_grads"] = m.peak_grads;
        d["total"] = m.total();
        rows.append(d);
    }
    return rows;
}

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

}  // namespace

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
    py::class_<PyJob>(m, "Job", R"doc(
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
)doc")
        .def(py::init([](const py::object& config, const py::object& out, const py::object& probes,
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
        .def(
            "metrics", [](PyJob& j) { return metrics_dict(j.view.snapshot().metrics); },
            "Per-step metrics of world rank 0 as numpy arrays: step (int64), loss, val_loss "
            "(-1: not evaluated), grad_norm, lr, tokens_per_s, step_ms, comm_bytes (float64).")
        .def(
            "events",
            [](PyJob& j) {
                py::list out;
                for (const RunEvent& e : j.view.snapshot().events) {
                    py::dict d;
                    d["step"] = e.step;
                    d["kind"] = event_kind_name(e.kind);
                    d["message"] = e.message;
                    py::dict ev;
                    for (const NamedValue& v : e.evidence) ev[py::str(v.name)] = v.value;
                    d["evidence"] = ev;
                    out.append(d);
                }
                return out;
            },
            "Events of the run (resume, rerun, checkpoint, fault, failure, spike, alert) as dicts: "
            "step, kind, message, evidence (a spike's per-layer values as its first run saw them).")
        .def(
            "values",
            [](PyJob& j) {
                // name -> (steps, values), each step once (a re-run step's latest values)
                std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<double>>> by;
                for (const StepValues& sv : j.view.snapshot().values)
                    for (const NamedValue& v : *sv.values) {
                        auto& [steps, vals] = by[v.name];
                        steps.push_back(sv.step);
                        vals.push_back(v.value);
                    }
                py::dict out;
                for (const auto& [name, rows] : by) {
                    py::array_t<std::int64_t> s(static_cast<py::ssize_t>(rows.first.size()));
                    py::array_t<double> x(static_cast<py::ssize_t>(rows.second.size()));
                    std::copy(rows.first.begin(), rows.first.end(), s.mutable_data());
                    std::copy(rows.second.begin(), rows.second.end(), x.mutable_data());
                    out[py::str(name)] = py::make_tuple(s, x);
                }
                return out;
            },
            "Named per-step values (with [spikes]: layer.<group>.grad_norm, .update_ratio, "
            ".adam_eps_ratio, layer.h.<l>.attn_logit_max, spike.loss_z, spike.grad_norm_z, "
            "spike.clip_norm) as {name: (steps int64 array, values float64 array)}.")
        .def(
            "batch",
            [](PyJob& j, i64 step, const std::string& split) {
                if (split != "train" && split != "val")
                    throw ConfigError("batch: split must be \"train\" or \"val\", got \"" +
                                      split + "\"");
                if (step < 1) throw ConfigError("batch: steps count from 1, got " + std::to_string(step));
                const i64 B = j.cfg.train.batch_size, T = j.cfg.model.seq_len;
                const std::unique_ptr<TokenSource> src = make_source(j.cfg);
                py::array_t<std::int32_t> out({B, T + 1});
                src->sample(out.mutable_data(), T, split == "val" ? Split::val : Split::train,
                            step - 1, 0, B);
                return out;
            },
            py::arg("step"), py::arg("split") = "train",
            "The global batch of a step (1-based; split \"val\": validation batch step - 1) as "
            "int32 windows (batch_size, seq_len + 1): inputs [:, :-1], targets [:, 1:]. Sampled "
            "from the job's source as the step draws it (a step of a run that skipped batches, "
            "spikes.action = \"rollback\", draws a later one).")
        .def(
            "router_stats",
            [](PyJob& j) {
                // moe.h.<l>.<field>[.<e>] -> per layer: steps, per-step fields, tokens (steps, E)
                struct Layer {
                    std::vector<std::int64_t> steps;
                    std::map<std::string, std::vector<double>> fields;
                    std::map<int, std::vector<double>> tokens;
                };
                std::map<int, Layer> layers;
                for (const StepValues& sv : j.view.snapshot().values)
                    for (const NamedValue& v : *sv.values) {
                        if (v.name.rfind("moe.h.", 0) != 0) continue;
                        const size_t dot = v.name.find('.', 6);
                        const int l = std::stoi(v.name.substr(6, dot - 6));
                        const std::string field = v.name.substr(dot + 1);
                        Layer& L = layers[l];
                        if (field.rfind("tokens.", 0) == 0) {
                            L.tokens[std::stoi(field.substr(7))].push_back(v.value);
                            continue;
                        }
                        if (field == "drop_fraction") L.steps.push_back(sv.step);
                        L.fields[field].push_back(v.value);
                    }
                py::dict out;
                for (const auto& [l, L] : layers) {
                    py::dict d;
                    d["steps"] = py::array_t<std::int64_t>(
                        static_cast<py::ssize_t>(L.steps.size()), L.steps.data());
                    for (const auto& [name, xs] : L.fields)
                        d[py::str(name)] =
                            py::array_t<double>(static_cast<py::ssize_t>(xs.size()), xs.data());
                    const py::ssize_t n = static_cast<py::ssize_t>(L.steps.size());
                    const py::ssize_t E = static_cast<py::ssize_t>(L.tokens.size());
                    py::array_t<std::int64_t> t({n, E});
                    auto w = t.mutable_unchecked<2>();
                    for (const auto& [e, xs] : L.tokens)
                        for (py::ssize_t i = 0; i < n && i < static_cast<py::ssize_t>(xs.size()); i++)
                            w(i, e) = static_cast<std::int64_t>(xs[static_cast<size_t>(i)]);
                    d["tokens"] = t;
                    out[py::int_(l)] = d;
                }
                return out;
            },
            "MoE router statistics per MoE layer and step (model.moe_experts > 0; {} for a dense "
            "model), from the job's named values moe.h.<l>.*: {layer: {'steps', 'tokens' (steps, "
            "E) slots each expert took, 'drop_fraction', 'balance' (E·Σ f_i·P_i, 1 when "
            "balanced), 'aux_loss', 'z_loss', 'router_entropy' (nats)}}.")
        .def(
            "fp8", [](PyJob& j) { return fp8_dict(j.view.snapshot().fp8); },
            R"doc(
The FP8 drift monitor's rows (fp8_monitor.every > 0; empty arrays otherwise), one per fp8-scaled
tensor, recipe and monitored step, as numpy columns: step, count, nonfinite, alerts (int64),
tensor ("h.1.attn.c_attn/x"), recipe ("delayed", "block", or a comparison: "current") (str),
amax, scale, scale_ratio, saturated, underflow, dynamic_range, mse, sqnr_db (float64). The same
on every layout, bit for bit; docs/precision.md says what each column measures.)doc")
        .def(
            "fp8_state",
            [](py::object self) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                return fp8_state_dict(j.run->job(0).fp8(), self);
            },
            R"doc(
The fp8 scaling state (None when precision.fp8 = "off"), the same on every rank: a dict with
recipe ("delayed" or "block"), gemms (the fp8 matmuls' names, "h.1.attn.c_attn" ... "lm_head", in
the order of the arrays), roles ("x", "w", "dy"), dtypes (per role: float8_e4m3fn, and
float8_e5m2 for a delayed "dy"), fp8_max (448 or 57344 per role), block_size, and for the delayed
recipe history_len, scale (gemms, 3) float32: the scales the next step casts with, and
amax_history (gemms, 3, history_len) float32, newest first. scale and amax_history are read-only
views of the job's memory (base: this job): they see every later step. The block recipe keeps no
state (scale and amax_history None): its scales are made per cast (fp8_cast).)doc")
        .def(
            "fp8_cast",
            [](py::object self, const std::string& name) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                const Fp8Scaling* f = j.run->job(0).fp8();
                if (!f)
                    throw ConfigError(
                        "fp8_cast: this job has no fp8 matmuls (precision.fp8 = \"off\"); give "
                        "precision={\"fp8\": \"delayed\"} or \"block\"");
                const ParamTable table = ParamTable::build(j.cfg.model);
                int g = 0;
                for (; g < f->gemms(); g++) {
                    const Fp8Gemm& gm = f->gemm(g);
                    if (gm.name == name ||
                        (gm.kind != Fp8Gemm::lm_head &&
                         table.entries[static_cast<size_t>(gm.weight_id)].name == name))
                        break;
                }
                if (g == f->gemms())
                    throw ConfigError("fp8_cast: \"" + name +
                                      "\" is not an fp8 matmul of this job or its weight; "
                                      "fp8_state()[\"gemms\"] lists them");
                const std::string weight =
                    table.entries[static_cast<size_t>(f->gemm(g).weight_id)].name;
                const py::dict all = logical_tensors(*j.run, What::weights, self);
                const auto w = py::array_t<float, py::array::c_style>::ensure(all[py::str(weight)]);
                const std::vector<i64> shape(w.shape(), w.shape() + w.ndim());
                py::dict d = fp8_cast_dict(w.data(), shape, f->delayed(), Fp8Scaling::w,
                                           f->delayed() ? f->scale(g, Fp8Scaling::w) : 1.0f,
                                           f->block_size());
                d["gemm"] = f->gemm(g).name;
                d["weight"] = weight;
                return d;
            },
            py::arg("name"), R"doc(
The fp8 cast the next step's forward makes of an fp8 matmul's weight ("h.1.mlp.c_fc" or its
weight's name "h.1.mlp.c_fc.weight"; "lm_head" casts wte): parallax.fp8_cast's dict (q as
float8_e4m3fn, scale, scale_inv, values) of the logical weight with the job's scale for it
(delayed) or its block_size x block_size blocks (block), plus gemm and weight. Every layout casts
these values (a tp rank its piece of them).)doc")
        .def(
            "memory",
            [](PyJob& j) {
                raise_if_failed(j);
                return memory_rows(j);
            },
            "Bytes each rank holds, by what they are for (params, grads, optimizer, activations, "
            "comm, peaks), one dict per world rank.")
        .def(
            "comm_stats",
            [](PyJob& j, bool reset) {
                raise_if_failed(j);
                py::list rows;
                for (int r = 0; r < j.run->world_size(); r++) {
                    comm::Communicator& world = j.run->world(r);
                    for (const comm::StatRow& s : world.stat_rows()) {
                        py::dict d;
                        d["rank"] = r;
                        d["group"] = s.group;
                        d["group_rank"] = s.rank;
                        d["op"] = s.op;
                        d["calls"] = s.calls;
                        d["bytes_sent"] = s.bytes_sent;
                        d["bytes_recv"] = s.bytes_recv;
                        d["seconds"] = s.seconds;
                        rows.append(d);
                    }
                    if (reset) world.stats_book()->reset();
                }
                return rows;
            },
            py::arg("reset") = false, R"doc(
What every rank's collectives moved since the start (or the last reset): one dict per (rank,
group, op) with rank, group ("dp", "tp", "pp", "world"), group_rank, op ("all_reduce",
"reduce_scatter", "all_gather", "send", ...), calls, bytes_sent, bytes_recv (by the algorithm's
actual traffic) and seconds. reset=True zeroes the counters after reading, so that the next call
reports the steps in between.)doc")
        .def(
            "describe",
            [](PyJob& j, bool collectives) {
                std::string s = j.run->mesh().describe();
                if (collectives) s += explored_words(explore(j.cfg));
                return s;
            },
            py::arg("collectives") = false, R"doc(
The layout in words: the mesh (every rank's coordinates and layers). collectives=True adds what
one traced step of the same config shows (parallax.explore_layout; the job's own ranks are not
touched): who holds which slice of every weight, every collective of each layer with its calls
and bytes, and memory per rank beside the admission estimate.)doc")
        .def(
            "explore", [](PyJob& j) { return explored(explore(j.cfg)); },
            "parallax.explore_layout(job.config): who holds what, the collectives per layer with "
            "their bytes (collectives, collectives_text, bytes_per_layer) and memory per rank, "
            "from one traced step of this job's config on ranks of its own.")
        .def(
            "weights",
            [](py::object self) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                return logical_tensors(*j.run, What::weights, self);
            },
            "{name: array} of the logical weights, GPT-2 names and shapes. On one device they "
            "view the job's memory (no copy: base is this job; they see later steps); under a "
            "parallel layout they are assembled from the ranks' pieces (copies).")
        .def(
            "grads",
            [](py::object self) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                return logical_tensors(*j.run, What::grads, self);
            },
            "{name: array} of the last step's reduced gradients (as weights()).")
        .def(
            "adam_m",
            [](py::object self) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                return logical_tensors(*j.run, What::adam_m, self);
            },
            "{name: array} of AdamW's first moments (as weights()).")
        .def(
            "adam_v",
            [](py::object self) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                return logical_tensors(*j.run, What::adam_v, self);
            },
            "{name: array} of AdamW's second moments (as weights()).")
        .def(
            "rank",
            [](py::object self, int r) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                if (r < 0 || r >= j.run->world_size())
                    throw IndexLookupError("rank(" + std::to_string(r) +
                                           "): not a rank of this layout (0 .. " +
                                           std::to_string(j.run->world_size() - 1) + ")");
                return rank_view(*j.run, r, self);
            },
            py::arg("rank"), R"doc(
World rank r's own memory, as views (no copy): a dict with rank, pp, dp, tp, cp, layers (its
chunks' layer ranges), for a MoE model experts (the [lo, hi) of every MoE layer's experts it holds:
all of them, or under expert parallelism its share), and for each of weights, grads, adam_m, adam_v a dict {name: array} of the
local tensors it holds whole (a tp shard's local shape), `<what>_flat` (everything it holds of
it, flat) and `<what>_range` (those floats' range in its local table: a ZeRO shard).)doc")
        .def(
            "shard_map",
            [](PyJob& j) {
                raise_if_failed(j);
                return shard_map(*j.run);
            },
            "One dict per (rank, tensor): its coordinates, the tensor, its logical and local "
            "shapes, the slice of the logical tensor it holds (\"h.0.mlp.c_fc.weight[0:128, :]\"), "
            "and how many of its elements the rank holds as weights and as Adam moments between "
            "steps (ZeRO shards) and writes to checkpoints.")
        .def(
            "probe_names",
            [](PyJob& j) {
                raise_if_failed(j);
                return j.probes ? j.probes->names() : std::vector<std::string>{};
            },
            "The probes recorded so far, in the order they were first captured.")
        .def(
            "probe",
            [](PyJob& j, const std::string& name) {
                raise_if_failed(j);
                if (!j.probes) throw ConfigError("probe: this job records no probes; give Job(..., probes=[patterns])");
                std::vector<i64> shape;
                std::vector<float> v = j.probes->unshard(name, &shape);
                const DType t = j.probes->dtype(name);
                if (t != DType::f32) return narrowed(v.data(), shape, t);
                return adopt(std::move(v), shape);
            },
            py::arg("name"), R"doc(
A probe's logical tensor, put together from every rank's pieces, in the dtype the library holds
it in: float32, or with precision.activations = "bf16" / "fp16" the activations and their
gradients as ml_dtypes.bfloat16 / float16 (their values exactly; .astype(np.float32) widens
them). An array that owns its data; ParallaxError naming the probe when pieces are missing or
replicas disagree.)doc")
        .def(
            "clear_probes",
            [](PyJob& j) {
                if (j.probes) j.probes->clear();
            },
            "Forgets the probes recorded so far (the patterns stay).")
        .def("save_checkpoint", &save_checkpoint, py::arg("dir"),
             "Writes a checkpoint of the state after the steps done to <dir>/ckpt-<step>.h5, "
             "every rank its own hyperslabs (as the run's checkpoints), and returns its path.")
        .def("__repr__", [](PyJob& j) {
            return "<parallax.Job " + j.cfg.source_name + ": " +
                   std::to_string(j.run->world_size()) + " rank(s), step " +
                   std::to_string(j.run->steps_done()) + "/" +
                   std::to_string(j.run->steps_total()) + ", " +
                   stepped_status_name(j.run->status()) + ">";
        });
}

}  // namespace px::py_bind
