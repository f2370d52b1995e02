#include "core/train/checkpointing.h"

#include "core/io/checkpoint.h"
#include "core/comm/mpi.h"
#include "core/base/error.h"
#include "core/io/hdf5_util.h"
#include "core/parallel/pipeline/pipeline.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

namespace px {

std::string resume_source(const CheckpointConfig& ck, std::string* note) {
    if (ck.resume.empty()) return "";
    if (ck.resume != "auto") return ck.resume;
    if (ck.dir.empty())
        throw ConfigError(
            "checkpoint.resume = \"auto\" needs checkpoint.dir: the folder to "
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
    for (const CheckpointFile& f :
         list_checkpoints(std::filesystem::path(path).parent_path().string()))
        if (std::filesystem::equivalent(f.path, path)) return f.step;
    throw InternalError("a chosen checkpoint " + path + " is not in its folder's listing");
}

// In-process saves: the writer world rank 0 created, shared with the other ranks' threads. It is
// used and destroyed only under hdf5_lock() (core/io/hdf5_util.h); null once committed or abandoned
// (destroying it uncommitted removes its temporary file).
struct SharedWriter {
    std::unique_ptr<CheckpointWriter> writer;
};

// The process-wide table of shared writers, by token (a save's token is broadcast as an i64).
struct WriterTable {
    std::mutex mu;
    std::map<i64, std::shared_ptr<SharedWriter>> slots;
    i64 next = 1;

    i64 add(std::shared_ptr<SharedWriter> w) {
        std::lock_guard<std::mutex> lock(mu);
        const i64 token = next++;
        slots.emplace(token, std::move(w));
        return token;
    }
    std::shared_ptr<SharedWriter> find(i64 token) {
        std::lock_guard<std::mutex> lock(mu);
        const auto it = slots.find(token);
        return it == slots.end() ? nullptr : it->second;
    }
    void remove(i64 token) {
        std::lock_guard<std::mutex> lock(mu);
        slots.erase(token);
    }
};

WriterTable& writer_table() {
    static WriterTable t;
    return t;
}

void make_folder(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
        std::string msg = "checkpoint folder ";
        msg.append(dir)
            .append(": cannot create it: ")
            .append(ec.message())
            .append("; check checkpoint.dir");
        throw CheckpointError(msg);
    }
}
}  // namespace

RunCheckpoints::RunCheckpoints(const Config& cfg, comm::Communicator* world)
    : cfg_(cfg), world_(world), rank_(world ? world->rank() : 0) {}

bool checkpoint_due(const Config& cfg, i64 step) {
    if (cfg.checkpoint.dir.empty()) return false;
    const i64 every = cfg.checkpoint.every;
    return step == cfg.train.steps || (every > 0 && step % every == 0);
}

std::string RunCheckpoints::choose_resume() {
    // Rank 0 verifies and picks; the others learn its choice as a step (the file's name follows
    // from it), so every rank reads the same file and only one verifies it.
    constexpr i64 kNone = -1, kFailed = -2;
    i64 choice = kNone;
    std::string path, error;
    if (rank_ == 0) {
        try {
            std::lock_guard<std::recursive_mutex> lock(hdf5_lock());
            std::string note;
            path = resume_source(cfg_.checkpoint, &note);
            if (!note.empty()) std::fprintf(stderr, "parallax: %s", note.c_str());
            // "auto" verified its choice; a named file is verified here, since the ranks then
            // read only their hyperslabs, which carry no checksums of their own.
            if (!path.empty() && cfg_.checkpoint.resume != "auto")
                CheckpointReader(path).verify_all();
            if (!path.empty()) choice = cfg_.checkpoint.resume == "auto" ? step_of(path) : 0;
        } catch (const Error& e) {
            // A file the config named: the key says where it came from.
            error = cfg_.checkpoint.resume == "auto"
                        ? std::string(e.what())
                        : "checkpoint.resume = \"" + cfg_.checkpoint.resume + "\": " + e.what();
            choice = kFailed;
        }
    }
    if (world_ && world_->size() > 1) world_->broadcast(&choice, 1, 0);
    if (choice == kFailed) {
        if (rank_ == 0) throw CheckpointError(error);
        throw CheckpointError(
            "rank 0 could not choose a checkpoint to resume from (its message "
            "says why)");
    }
    if (rank_ == 0 || choice == kNone) return path;
    return cfg_.checkpoint.resume == "auto" ? checkpoint_path(cfg_.checkpoint.dir, choice)
                                            : cfg_.checkpoint.resume;
}

i64 RunCheckpoints::resume(Job& job) {
    const std::string path = choose_resume();
    if (path.empty()) return 0;
    i64 step = 0;
    {
        // Every rank opens the file and reads the hyperslabs it holds, one thread at a time.
        std::lock_guard<std::recursive_mutex> lock(hdf5_lock());
        const CheckpointReader file(path);
        file.check_model(cfg_.model);
        const CheckpointMeta& meta = file.meta();
        check_same_data(meta, cfg_, path);
        if (static_cast<i64>(meta.history.size()) != meta.step)
            throw CheckpointError("checkpoint " + path + ": step " + std::to_string(meta.step) +
                                  " but " + std::to_string(meta.history.size()) +
                                  " steps of history; the file is inconsistent, use an older one");
        try {
            job.restore_local(file, meta.history);
        } catch (const std::exception& e) {
            // The others may already wait in a collective: fail the job so that they throw.
            if (world_ && world_->size() > 1) {
                std::string why = "reading checkpoint ";
                why.append(path).append(" failed: ").append(e.what());
                world_->abort(why);
            }
            throw;
        }
        step = meta.step;
    }
    if (rank_ == 0)
        std::fprintf(stderr, "parallax: resumed from %s at step %lld\n", path.c_str(),
                     static_cast<long long>(step));
    return step;
}

void RunCheckpoints::give_up(const std::exception_ptr& error, const std::string& path) {
    if (!error) return;
    if (world_ && world_->size() > 1) {
        std::string why = "saving checkpoint ";
        why.append(path).append(" failed: ");
        try {
            std::rethrow_exception(error);
        } catch (const std::exception& e) {
            why.append(e.what());
        } catch (...) {
            why.append("an exception that is not a std::exception");
        }
        world_->abort(why);
    }
    std::rethrow_exception(error);
}

void RunCheckpoints::sync() {
    if (world_ && world_->size() > 1) world_->barrier();
}

namespace {

// The size of the next checkpoint in dir: the latest one there (a run's checkpoints are alike),
// and at least the weights and both Adam moments in fp32, plus room for the metadata.
i64 checkpoint_bytes(const std::string& dir, i64 num_params) {
    namespace fs = std::filesystem;
    i64 bytes = 3 * 4 * num_params;
    std::error_code ec;
    std::string latest;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind("ckpt-", 0) == 0 && name.size() > 3 && name.ends_with(".h5") && name > latest)
            latest = name;
    }
    if (!latest.empty()) {
        const auto size = fs::file_size(fs::path(dir) / latest, ec);
        if (!ec) bytes = std::max(bytes, static_cast<i64>(size));
    }
    return bytes + (i64{256} << 10);
}

// A checkpoint that cannot fit is refused before any file is opened. (Parallel HDF5 cannot close
// a file cleanly once its ranks' writes failed at different points, so a full disk is found
// here, on every rank alike, rather than in the middle of a write.)
void check_room(const std::string& dir, const std::string& path, i64 need) {
    struct statvfs st{};
    if (::statvfs(dir.c_str(), &st) != 0) return;  // the write itself will say what is wrong
    const i64 free_bytes = static_cast<i64>(st.f_bavail) * static_cast<i64>(st.f_frsize);
    if (free_bytes >= need) return;
    throw StorageError("checkpoint " + path + ": the file system of checkpoint.dir = " + dir +
                       " has " + std::to_string(free_bytes >> 10) + " KiB free and the checkpoint "
                       "needs about " + std::to_string(need >> 10) +
                       " KiB; free space there, lower checkpoint.keep or choose another "
                       "checkpoint.dir (the checkpoints already written are kept)");
}

}  // namespace

void RunCheckpoints::save(Job& job) {
    const i64 step = job.steps_done();
    need_bytes_ = 0;
    if (rank_ == 0) need_bytes_ = checkpoint_bytes(cfg_.checkpoint.dir, job.num_params());
    const std::string path = checkpoint_path(cfg_.checkpoint.dir, step);
    // Rank 0's meta is the one stored (the ranks' histories differ only in their timings).
    CheckpointMeta meta = make_checkpoint_meta(cfg_, step, job.history());
    const LossScaler& scaler = job.loss_scaler();  // fp16: the scale of the next step
    meta.loss_scale = scaler.scale();
    meta.growth_tracker = scaler.state().growth_tracker;
    meta.loss_scale_dynamic = scaler.dynamic();
    meta.skipped_batches = job.skipped_batches();
    if (const Fp8Scaling* fp8 = job.fp8(); fp8 && fp8->delayed() && fp8->gemms() > 0) {  // the same on every rank
        const std::vector<float> st = fp8->state();
        const size_t ns = static_cast<size_t>(fp8->gemms()) * Fp8Scaling::kRoles;
        meta.fp8_gemms = fp8->gemms();
        meta.fp8_history_len = fp8->history_len();
        meta.fp8_scale.assign(st.begin(), st.begin() + static_cast<std::ptrdiff_t>(ns));
        meta.fp8_history.assign(st.begin() + static_cast<std::ptrdiff_t>(ns), st.end());
    }
    const RankState state = job.rank_state();
    const MPI_Comm mpi = world_ && world_->size() > 1 ? comm::native_comm(*world_) : MPI_COMM_NULL;
    last_save_ = SliceStats{};
    if (mpi != MPI_COMM_NULL)
        save_mpi(state, path, meta, mpi);
    else
        save_shared(state, path, meta);
}

// Ranks as processes: one parallel-HDF5 writer, opened by every rank. A rank that fails gives up
// (give_up: abort, rethrow); the others' next barrier throws, and every rank's writer closes
// (collectively) as the exceptions unwind, rank 0's removing the temporary file.
void RunCheckpoints::save_mpi(const RankState& state, const std::string& path,
                              const CheckpointMeta& meta, MPI_Comm comm) {
    std::exception_ptr error;
    // 1. Rank 0 makes the folder.
    if (rank_ == 0) {
        try {
            make_folder(cfg_.checkpoint.dir);
            check_room(cfg_.checkpoint.dir, path, need_bytes_);
        } catch (...) {
            error = std::current_exception();
        }
    }
    give_up(error, path);
    sync();
    // 2. Every rank opens the temporary file (a collective of parallel HDF5) and writes its
    //    pieces (independent I/O); all of them must have, before any commits.
    std::unique_ptr<CheckpointWriter> w;
    try {
        std::lock_guard<std::recursive_mutex> lock(hdf5_lock());
        w = std::make_unique<CheckpointWriter>(path, meta, cfg_.model, comm);
        last_save_ = write_rank_state(*w, state);
    } catch (...) {
        error = std::current_exception();
    }
    give_up(error, path);
    sync();
    // 3. Commit (collective: checksums and counts summed, rank 0 renames, all learn whether it
    //    worked), then rank 0 prunes; the others learn whether it could.
    try {
        std::lock_guard<std::recursive_mutex> lock(hdf5_lock());
        w->commit();
        w.reset();
        if (rank_ == 0) prune_checkpoints(cfg_.checkpoint.dir, cfg_.checkpoint.keep);
    } catch (...) {
        error = std::current_exception();
    }
    give_up(error, path);
    sync();
}

// Ranks as threads of this process: one serial writer, created by rank 0 and shared. A rank
// that fails gives up (abort, rethrow); the others' next collective throws.
void RunCheckpoints::save_shared(const RankState& state, const std::string& path,
                                 const CheckpointMeta& meta) {
    std::exception_ptr error;
    // 1. Rank 0 makes the folder and the writer and registers it; the others learn its token
    //    and its pid (in-process ranks share the process, hence the writer).
    std::shared_ptr<SharedWriter> slot;
    i64 token[2] = {0, static_cast<i64>(::getpid())};
    if (rank_ == 0) {
        try {
            make_folder(cfg_.checkpoint.dir);
            check_room(cfg_.checkpoint.dir, path, need_bytes_);
            auto made = std::make_shared<SharedWriter>();
            {
                std::lock_guard<std::recursive_mutex> lock(hdf5_lock());
                made->writer = std::make_unique<CheckpointWriter>(path, meta, cfg_.model);
            }
            slot = made;
            token[0] = writer_table().add(std::move(made));
        } catch (...) {
            error = std::current_exception();
        }
    }
    // Rank 0, whatever happens next: unregisters the writer and drops it; uncommitted, that
    // removes the temporary file, and a rank still to write finds the slot empty and throws.
    struct Release {
        std::shared_ptr<SharedWriter> slot;
        i64 token = 0;
        ~Release() {
            if (token == 0) return;
            writer_table().remove(token);
            std::lock_guard<std::recursive_mutex> lock(hdf5_lock());
            slot->writer.reset();
        }
    } release{slot, token[0]};
    give_up(error, path);
    if (world_ && world_->size() > 1) world_->broadcast(token, 2, 0);
    if (token[1] != static_cast<i64>(::getpid()))
        throw InternalError(std::string("checkpoint ")
                                .append(path)
                                .append(": the world's ranks are processes but its communicator "
                                        "is not MPI's; an in-process save needs ranks that share "
                                        "one process"));
    if (rank_ != 0) slot = writer_table().find(token[0]);
    // 2. Every rank writes its pieces, one thread at a time; all of them must have, before
    //    rank 0 commits.
    try {
        std::lock_guard<std::recursive_mutex> lock(hdf5_lock());
        if (!slot || !slot->writer)
            throw CheckpointError(std::string("checkpoint ")
                                      .append(path)
                                      .append(": rank 0 gave this save up before rank ")
                                      .append(std::to_string(rank_))
                                      .append(" wrote its pieces; see rank 0's error"));
        last_save_ = write_rank_state(*slot->writer, state);
    } catch (...) {
        error = std::current_exception();
    }
    give_up(error, path);
    sync();
    // 3. Rank 0 commits and prunes; the others learn whether it could.
    if (rank_ == 0) {
        try {
            {
                std::lock_guard<std::recursive_mutex> lock(hdf5_lock());
                slot->writer->commit();
                slot->writer.reset();
            }
            prune_checkpoints(cfg_.checkpoint.dir, cfg_.checkpoint.keep);
        } catch (...) {
            error = std::current_exception();
        }
    }
    give_up(error, path);
    sync();
}

void RunCheckpoints::after_step(Job& job) {
    if (checkpoint_due(cfg_, job.steps_done())) save(job);
}

}  // namespace px
