// The run file of a training run as an observer of its job (core/io/runfile.h writes the file).
#include "core/train/run_file_observer.h"

#include "core/base/config.h"
#include "core/base/error.h"
#include "core/io/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <string>

namespace px {

namespace {

// The metrics written at every step; a run file continues from the last step all of them hold.
constexpr const char* kPerStep[] = {"loss",         "grad_norm", "lr",
                                    "tokens_per_s", "step_ms",   "comm_bytes"};

// Renames a damaged file to <path>.damaged, or .damaged-2, -3, ... when those are taken, and
// returns the new name. Throws px::Error naming both when the rename fails.
std::string move_aside(const std::string& path) {
    std::string to = path + ".damaged";
    for (int k = 2; std::filesystem::exists(to); k++) to = path + ".damaged-" + std::to_string(k);
    std::error_code ec;
    std::filesystem::rename(path, to, ec);
    if (ec)
        throw Error("run file " + path + " is damaged and cannot be moved aside to " + to + ": " +
                    ec.message() + "; move or delete it, or set output.run_file=false");
    return to;
}

// Where a run that starts after `step` restored steps was resumed from, for the event.
std::string resume_origin(const CheckpointConfig& ck, i64 step) {
    if (ck.resume == "auto" && !ck.dir.empty()) return checkpoint_path(ck.dir, step);
    return ck.resume == "auto" ? std::string() : ck.resume;
}

}  // namespace

RunFileObserver::RunFileObserver(const std::string& path, const Config& cfg)
    : path_(path), config_toml_(config_to_toml(cfg)), checkpoint_(cfg.checkpoint) {}

RunFileObserver::~RunFileObserver() = default;

void RunFileObserver::on_start(const RunView& run) {
    const std::filesystem::path p(path_);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    file_.reset();
    restored_.clear();
    if (run.steps_done() == 0) {  // a fresh run: a new file, replacing an old one
        file_ = std::make_unique<RunFile>(path_, config_toml_);
        last_step_ = 0;
        file_->flush();
        return;
    }
    // A resume. The file is opened at the first step instead: in-process ranks are threads, the
    // others may still be reading the checkpoint, and HDF5 is not thread-safe; once a step has
    // finished (collectives with every rank), only this thread speaks HDF5.
    restored_ = run.history();
    last_step_ = run.steps_done();
}

void RunFileObserver::resume() {
    const i64 k = last_step_;
    std::string note = "resumed at step ";
    note += std::to_string(k);
    if (const std::string from = resume_origin(checkpoint_, k); !from.empty()) {
        note += " from ";
        note += from;
    }
    std::string moved;  // where a damaged file went
    // A log, not the run's state: a damaged one is kept for whoever wants to look, and a new one
    // is written from the checkpoint's history, so that a restart after a crash is not stopped.
    auto set_aside = [&](const char* why) {
        file_.reset();
        moved = move_aside(path_);
        std::fprintf(stderr,
                     "parallax: %s; moved to %s, and a new run file starts with the "
                     "checkpoint's steps\n",
                     why, moved.c_str());
    };
    try {
        file_ = RunFile::reopen(path_);
    } catch (const RunFileDamaged& e) {
        set_aside(e.what());
    }
    i64 have = 0;  // rows the file holds that agree with the checkpoint's history
    const std::string note_before = note;
    if (file_) {
        // Reading and rewriting a reopened file can meet damage that opening it did not (an
        // attribute or a series HDF5 cannot write back): the file is set aside all the same. A
        // full or failing file system is not damage, and stops the run.
        try {
            file_->truncate(k);
            have = k;
            for (const char* name : kPerStep) have = std::min(have, file_->last_step(name));
            // The file must be this run's: its losses are the history's, bit for bit.
            std::vector<i64> steps;
            std::vector<double> loss;
            file_->read("loss", &steps, &loss);
            for (size_t i = 0; i < steps.size() && have > 0; i++) {
                const i64 s = steps[i];
                if (s < 1 || s > static_cast<i64>(restored_.size())) continue;  // nothing to compare
                const StepMetrics& h = restored_[static_cast<size_t>(s - 1)];
                const bool same = h.step == s && std::bit_cast<std::uint64_t>(h.loss) ==
                                                     std::bit_cast<std::uint64_t>(loss[i]);
                if (!same) {
                    have = 0;
                    note +=
                        "; the run file's rows disagreed with the checkpoint's history and were "
                        "rewritten from it";
                }
            }
            if (have > 0 && have < k) {
                note += "; steps after ";
                note += std::to_string(have);
                note += " were missing from the run file and were written from the checkpoint";
            }
            file_->truncate(have);
            file_->set_attr("config", config_toml_);  // the config that finishes the run
        } catch (const StorageError&) {
            throw;
        } catch (const Error& e) {
            note = note_before;
            have = 0;
            set_aside(e.what());
        }
    }
    if (!file_) {
        file_ = std::make_unique<RunFile>(path_, config_toml_);
        if (moved.empty()) {
            note +=
                "; the run file was missing (or not a run file) and was written anew, starting "
                "with the checkpoint's steps";
        } else {
            note += "; the run file was damaged, was moved to ";
            note += moved;
            note += " and was written anew, starting with the checkpoint's steps";
        }
    }
    for (const StepMetrics& m : restored_)
        if (m.step > have) write(m);
    file_->event(k, "resume", note);
    restored_.clear();
    restored_.shrink_to_fit();
}

void RunFileObserver::write(const StepMetrics& m) {
    file_->append("loss", m.step, m.loss);
    if (m.val_loss >= 0) file_->append("val_loss", m.step, m.val_loss);
    file_->append("grad_norm", m.step, m.grad_norm);
    file_->append("lr", m.step, m.lr);
    file_->append("tokens_per_s", m.step, m.tokens_per_s);
    file_->append("step_ms", m.step, m.step_ms);
    file_->append("comm_bytes", m.step, m.comm_bytes);
}

void RunFileObserver::begin_step(i64 step) {
    if (step <= last_step_) {  // a re-run: this step's rows and all after it are replaced
        file_->truncate(step - 1);
        std::string note = "step ";
        note += std::to_string(step);
        note += " was run again after step ";
        note += std::to_string(last_step_);
        note += "; the rows from it on were replaced";
        file_->event(step, "rerun", note);
        last_step_ = step - 1;
    }
}

void RunFileObserver::on_values(const RunView&, i64 step, const std::vector<NamedValue>& values) {
    if (!file_) resume();
    begin_step(step);
    for (const NamedValue& v : values) file_->append(v.name, step, v.value);
}

void RunFileObserver::on_step(const RunView&, const StepMetrics& m) {
    if (!file_) resume();
    begin_step(m.step);
    write(m);
    if (!fp8_.empty() && fp8_.front().step == m.step) file_->append_fp8(fp8_);
    fp8_.clear();
    last_step_ = m.step;
    file_->flush();  // a run killed later keeps a readable file up to here
}

void RunFileObserver::on_event(const RunView&, const RunEvent& e) {
    if (!file_) resume();
    std::string evidence;  // "name=value;..."
    for (const NamedValue& v : e.evidence) {
        char buf[48];
        std::snprintf(buf, sizeof buf, "%.17g", v.value);
        evidence += (evidence.empty() ? "" : ";") + v.name + "=" + buf;
    }
    file_->event(e.step, event_kind_name(e.kind), e.message, evidence);
    file_->flush();
}

// Written with the step's metrics, after a re-run's rows were dropped (on_step).
void RunFileObserver::on_fp8(const RunView&, const std::vector<Fp8Stat>& rows) {
    fp8_ = rows;
}

void RunFileObserver::on_end(const RunView& job) {
    if (!file_) resume();
    file_->set_attr("num_params", static_cast<double>(job.num_params()));
    const MemoryStats mem = job.memory();  // rank 0's
    file_->set_attr("memory_params_bytes", static_cast<double>(mem.params));
    file_->set_attr("memory_grads_bytes", static_cast<double>(mem.grads));
    file_->set_attr("memory_optimizer_bytes", static_cast<double>(mem.optimizer));
    file_->set_attr("memory_activations_bytes", static_cast<double>(mem.activations));
    file_->set_attr("memory_comm_bytes", static_cast<double>(mem.comm));
    if (const CpStats cp = job.cp_stats(); cp.cp > 1) {  // measured beside the formulas
        file_->set_attr("cp_comm_bytes_per_step", cp.comm_bytes_per_step);
        file_->set_attr("cp_comm_bytes_per_step_formula", cp.comm_bytes_formula);
        file_->set_attr("cp_attention_bytes", cp.attention_bytes);
        file_->set_attr("cp_attention_bytes_formula", cp.attention_bytes_formula);
    }
    if (const EpStats ep = job.ep_stats(); ep.ep > 1) {
        file_->set_attr("ep_comm_bytes_per_step", ep.comm_bytes_per_step);
        file_->set_attr("ep_comm_bytes_per_step_formula", ep.comm_bytes_formula);
    }
    if (job.entropy_rate() >= 0) file_->set_attr("entropy_rate", job.entropy_rate());
    if (job.loss_floor() >= 0) file_->set_attr("loss_floor", job.loss_floor());
    // Closed at the run's end, not when the observer goes: a finished parallax.Job lives on in
    // a notebook, and h5py (another copy of HDF5) cannot open a file this process holds open.
    file_.reset();
}

}  // namespace px
