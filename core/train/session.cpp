// One run of a job config, for every face (session.h).
#include "core/train/session.h"

#include "core/base/error.h"
#include "core/io/output_paths.h"
#include "core/train/memory.h"
#include "core/train/probe_recorder.h"
#include "core/train/run_file_observer.h"
#include "core/train/stepped_run.h"

#include <algorithm>
#include <filesystem>

namespace px {

RunSession::RunSession(const Config& cfg, SessionOptions opt) : cfg_(cfg), opt_(std::move(opt)) {
    validate_config(cfg_);
    if (!opt_.probes.empty() && opt_.probe_stride < 1)
        throw ConfigError("probe_stride = " + std::to_string(opt_.probe_stride) +
                          " must be at least 1");
    // 1. Every output path before step 1: a run never computes for nothing. Then whether the run
    //    fits in memory (a dump's copy of the state included), before anything is made.
    check_run_outputs(cfg_, opt_.dump);
    check_memory(cfg_, opt_.ranks_on_node > 0 ? MemoryScope::one_rank : MemoryScope::process,
                 std::max(opt_.ranks_on_node, 1), MemoryExtras{!opt_.dump.empty()});
    if (!opt_.writer) return;
    // 2. The folders it writes, once each.
    std::vector<std::filesystem::path> locked;
    auto lock = [&](const std::string& dir, const char* key) {
        const std::filesystem::path at = std::filesystem::weakly_canonical(dir.empty() ? "." : dir);
        if (std::find(locked.begin(), locked.end(), at) != locked.end()) return;
        locks_.push_back(std::make_unique<FolderLock>(dir, key, opt_.note));
        locked.push_back(at);
    };
    if (cfg_.output.run_file) lock(cfg_.output.dir, "output.dir");
    if (!cfg_.checkpoint.dir.empty()) lock(cfg_.checkpoint.dir, "checkpoint.dir");
    // 3. The run file.
    if (cfg_.output.run_file) run_file_ = std::make_unique<RunFileObserver>(run_file_path(cfg_), cfg_);
}

RunSession::~RunSession() = default;

std::vector<Observer*> RunSession::observers() const {
    std::vector<Observer*> all = opt_.observers;
    if (run_file_) all.push_back(run_file_.get());
    return all;
}

RunHooks RunSession::hooks() const {
    if (!probes_) return opt_.hooks;
    RunHooks h;
    h.setup = [rec = probes_.get()](Job& job) { job.set_probes(rec); };
    return chain(h, opt_.hooks);
}

void RunSession::run() {
    if (!opt_.probes.empty())
        probes_ = std::make_unique<ProbeRecorder>(opt_.probes, opt_.probe_stride);
    run_layout(cfg_, observers(), hooks());
    release();
}

void RunSession::run_rank(comm::Communicator& world) {
    if (!opt_.probes.empty())
        probes_ = std::make_unique<ProbeRecorder>(opt_.probes, opt_.probe_stride);
    // The cores of a node are shared out among its ranks.
    Config rank_cfg = cfg_;
    rank_cfg.train.threads = threads_per_rank(cfg_, std::max(opt_.ranks_on_node, 1));
    try {
        px::run_rank(rank_cfg, world, observers(), hooks());
    } catch (const CorruptionError&) {
        throw;  // a verdict every rank reaches from the same hashes: nobody is left waiting
    } catch (const std::exception& e) {
        world.abort("rank " + std::to_string(world.rank()) + " failed: " + e.what());
        throw;
    }
    release();
}

SteppedRun& RunSession::start() {
    PX_ASSERT(!stepped_, "a session runs once");
    if (!opt_.probes.empty())
        probes_ = std::make_unique<ProbeRecorder>(opt_.probes, opt_.probe_stride);
    stepped_ = std::make_unique<SteppedRun>(cfg_, observers(), hooks());
    return *stepped_;
}

// A finished run closed its run file at its end (RunFileObserver::on_end) and its ranks, still
// held, call no observer again; a failed one's ranks have left, so nothing writes to it any more.
void RunSession::release() {
    locks_.clear();
    if (!stepped_ || stepped_->status() == SteppedRun::Status::failed) run_file_.reset();
}

}  // namespace px
