#include "core/parallel/checkpointing.h"

#include "core/checkpoint.h"
#include "core/error.h"
#include "core/parallel/pipeline.h"

#include <cstdio>
#include <filesystem>
#include <mutex>

namespace px {

std::string resume_source(const CheckpointConfig& ck, std::string* note) {
    if (ck.resume.empty()) return "";
    if (ck.resume != "auto") return ck.resume;
    if (ck.dir.empty())
        throw ConfigError("checkpoint.resume = \"auto\" needs checkpoint.dir: the folder to "
                          "resume from");
    const LatestCheckpoint latest = find_latest_valid(ck.dir, /*remove_temps=*/true);
    std::string msg;
    for (const SkippedCheckpoint& s : latest.skipped) {
        msg += "skipped checkpoint ";
        msg += s.path;
        msg += ": ";
        msg += s.reason;
        msg += "\n";
    }
    if (!latest.found()) {
        msg += "no valid checkpoint in ";
        msg += ck.dir;
        msg += "; starting from step 0\n";
    }
    if (note) *note = msg;
    return latest.path;
}

namespace {
// The step in a checkpoint's name (checkpoint_path's pattern).
i64 step_of(const std::string& path) {
    for (const CheckpointFile& f : list_checkpoints(std::filesystem::path(path).parent_path().string()))
        if (std::filesystem::equivalent(f.path, path)) return f.step;
    throw InternalError("a chosen checkpoint " + path + " is not in its folder's listing");
}
}  // namespace

RunCheckpoints::RunCheckpoints(const Config& cfg, comm::Communicator* world)
    : cfg_(cfg), world_(world), rank_(world ? world->rank() : 0) {}

bool RunCheckpoints::due(i64 step) const {
    if (!enabled()) return false;
    const i64 every = cfg_.checkpoint.every;
    return step == cfg_.train.steps || (every > 0 && step % every == 0);
}

std::string RunCheckpoints::choose_resume() {
    // Rank 0 verifies and picks; the others learn its choice as a step (the file's name follows
    // from it), so every rank reads the same file and only one verifies the folder.
    constexpr i64 kNone = -1, kFailed = -2;
    i64 choice = kNone;
    std::string path, error;
    if (rank_ == 0) {
        try {
            std::string note;
            path = resume_source(cfg_.checkpoint, &note);
            if (!note.empty()) std::fprintf(stderr, "parallax: %s", note.c_str());
            if (!path.empty()) choice = cfg_.checkpoint.resume == "auto" ? step_of(path) : 0;
        } catch (const Error& e) {
            error = e.what();
            choice = kFailed;
        }
    }
    if (world_ && world_->size() > 1) world_->broadcast(&choice, 1, 0);
    if (choice == kFailed) {
        if (rank_ == 0) throw CheckpointError(error);
        throw CheckpointError("rank 0 could not choose a checkpoint to resume from (its message "
                              "says why)");
    }
    if (rank_ == 0 || choice == kNone) return path;
    return cfg_.checkpoint.resume == "auto" ? checkpoint_path(cfg_.checkpoint.dir, choice)
                                            : cfg_.checkpoint.resume;
}

template <class J>
i64 RunCheckpoints::resume_into(J& job) {
    const std::string path = choose_resume();
    if (path.empty()) return 0;
    CheckpointMeta meta;
    LogicalState s;
    {
        // HDF5 is not thread-safe, and in-process ranks are threads: one reads at a time.
        static std::mutex hdf5;
        std::lock_guard<std::mutex> lock(hdf5);
        s = read_checkpoint(path, cfg_.model, &meta);
    }
    const std::string want = data_source_description(cfg_);
    if (meta.data_source != want)
        throw CheckpointError("checkpoint " + path + " was written by a run with another data "
                              "stream (" + meta.data_source + ") than this config's (" + want +
                              "); resume with the same data, seed and batch settings");
    if (static_cast<i64>(meta.history.size()) != meta.step)
        throw CheckpointError("checkpoint " + path + ": step " + std::to_string(meta.step) +
                              " but " + std::to_string(meta.history.size()) +
                              " steps of history; the file is inconsistent, use an older one");
    job.restore(s.params, s.m, s.v, meta.history);
    if (rank_ == 0)
        std::fprintf(stderr, "parallax: resumed from %s at step %lld\n", path.c_str(),
                     static_cast<long long>(meta.step));
    return meta.step;
}

template <class J>
void RunCheckpoints::save(J& job) {
    LogicalState s;
    job.gather_full(&s.params, &s.m, &s.v);  // a collective: every rank takes part
    if (rank_ != 0) return;
    s.table = ParamTable::build(cfg_.model);
    s.history = job.history();
    const i64 step = job.steps_done();
    const CheckpointMeta meta = make_checkpoint_meta(cfg_, step, s.history);
    save_checkpoint(cfg_.checkpoint.dir, s, meta, cfg_.model, cfg_.checkpoint.keep);
}

i64 RunCheckpoints::resume(Job& job) { return resume_into(job); }
i64 RunCheckpoints::resume(PipelineJob& stage) { return resume_into(stage); }

void RunCheckpoints::after_step(Job& job) {
    if (due(job.steps_done())) save(job);
}

void RunCheckpoints::after_step(PipelineJob& stage) {
    if (due(stage.steps_done())) save(stage);
}

}  // namespace px
