#include "core/train/stepped_run.h"

#include "core/base/error.h"

#include <algorithm>
#include <chrono>
#include <memory>

namespace px {

namespace {

// Thrown at a pause point when the run is ended from outside (or by another rank's failure):
// the rank leaves run_rank as from any error, and the driver does not report it.
struct Ended : Error {
    Ended() : Error("the run was ended while this rank waited") {}
};

}  // namespace

const char* stepped_status_name(SteppedRun::Status s) {
    switch (s) {
        case SteppedRun::Status::starting: return "starting";
        case SteppedRun::Status::running: return "running";
        case SteppedRun::Status::paused: return "paused";
        case SteppedRun::Status::finished: return "finished";
        case SteppedRun::Status::failed: return "failed";
    }
    return "?";
}

SteppedRun::SteppedRun(const Config& cfg, std::vector<Observer*> observers, RunHooks hooks)
    : cfg_(cfg),
      layout_(make_in_process_layout(cfg)),  // threads, memory, the layout: before any thread
      mesh_(layout_, Mesh::Validated{}),
      observers_(std::move(observers)),
      hooks_(std::move(hooks)),
      ranks_(static_cast<size_t>(layout_.world_size())) {
    errors_.error.resize(ranks_.size());
    errors_.message.resize(ranks_.size());
    driver_ = std::thread([this] { run_ranks(); });
}

SteppedRun::~SteppedRun() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        cancel_ = true;
        destroying_ = true;
    }
    cv_.notify_all();
    if (driver_.joinable()) driver_.join();
}

void SteppedRun::run_ranks() {
    // 1. Ranks: threads, the cores shared out among them (as run_layout).
    Config rank_cfg = cfg_;
    rank_cfg.train.threads = threads_per_rank(cfg_, world_size());
    RunHooks hooks = hooks_;
    auto pause_after = [this](std::function<void(Job&)> first, bool finished) {
        return [this, first = std::move(first), finished](Job& job) {
            if (first) first(job);
            pause(job, finished);
        };
    };
    hooks.setup = pause_after(hooks_.setup, false);
    hooks.each_step = pause_after(hooks_.each_step, false);
    hooks.inspect = pause_after(hooks_.inspect, true);
    // The ranks' errors are kept by rank_main (the run fails as soon as one throws, long before
    // the threads end); what run_ranks_collect returns at the end adds nothing.
    comm::run_ranks_collect(world_size(), cfg_.layout.timeout_s, [&](comm::Communicator& world) {
        rank_main(world, rank_cfg, hooks);
    });
}

void SteppedRun::rank_main(comm::Communicator& world, const Config& cfg, const RunHooks& hooks) {
    Rank& me = ranks_[static_cast<size_t>(world.rank())];
    {
        std::lock_guard<std::mutex> lock(mu_);
        me.world = &world;
    }
    std::unique_ptr<RankRun> rank;
    std::exception_ptr error;
    try {
        rank = std::make_unique<RankRun>(cfg, world, observers_, hooks);
        rank->run();
    } catch (const Ended&) {
    } catch (const std::exception& e) {
        error = std::current_exception();
        {
            std::lock_guard<std::mutex> lock(mu_);
            errors_.error[static_cast<size_t>(world.rank())] = error;
            errors_.message[static_cast<size_t>(world.rank())] = e.what();
            if (errors_.first < 0) errors_.first = world.rank();
            cancel_ = true;  // the others leave their pauses
        }
        cv_.notify_all();
        // The others' collectives throw at once instead of waiting for this rank (when the error
        // is itself the job's failure, this changes nothing).
        world.abort("rank " + std::to_string(world.rank()) + " failed: " + e.what());
    }
    // Left: wait with the job kept until the run is destroyed (a caller may read its memory).
    std::unique_lock<std::mutex> lock(mu_);
    me.state = RankState::left;
    ended_ = std::all_of(ranks_.begin(), ranks_.end(),
                         [](const Rank& r) { return r.state == RankState::left; });
    if (ended_) {
        const int cause = comm::cause_of(errors_);
        if (cause >= 0) {
            error_ = errors_.error[static_cast<size_t>(cause)];
            error_text_ = errors_.message[static_cast<size_t>(cause)];
        }
    }
    cv_.notify_all();
    cv_.wait(lock, [this] { return destroying_; });
    lock.unlock();
    rank.reset();
    if (error) std::rethrow_exception(error);
}

void SteppedRun::pause(Job& job, bool finished) {
    const int r =
        mesh_.rank_of(Coord{job.pp_rank(), job.dp_rank(), job.tp_rank(), job.cp_rank()});
    Rank& me = ranks_[static_cast<size_t>(r)];
    std::unique_lock<std::mutex> lock(mu_);
    me.job = &job;
    me.done = job.steps_done();
    me.state = finished ? RankState::finished : RankState::paused;
    cv_.notify_all();
    for (;;) {
        if (cancel_) throw Ended();
        if (me.task != task_gen_) {
            me.task = task_gen_;
            const auto* task = task_;
            const RankState was = me.state;
            me.state = RankState::working;
            lock.unlock();
            std::exception_ptr error;
            try {
                (*task)(job, *me.world);
            } catch (...) {
                error = std::current_exception();
            }
            lock.lock();
            me.task_error = error;
            me.state = was;
            cv_.notify_all();
            continue;
        }
        if (!finished && (finishing_ || me.done < budget_)) {
            me.state = RankState::running;
            return;
        }
        cv_.wait(lock);
    }
}

bool SteppedRun::settled() const {
    if (ended_) return true;
    for (const Rank& r : ranks_) {
        if (r.state == RankState::finished && r.task == task_gen_) continue;
        if (r.state == RankState::paused && r.task == task_gen_ && !finishing_ &&
            r.done >= budget_)
            continue;
        return false;
    }
    return true;
}

void SteppedRun::require_settled(const char* what) const {
    if (ended_ || !settled())
        throw InternalError(std::string(what) + " needs the run paused or finished, and it is " +
                            stepped_status_name(status_locked()));
}

void SteppedRun::advance_to(i64 step) {
    {
        std::lock_guard<std::mutex> lock(mu_);
        budget_ = std::max(budget_, std::min(step, cfg_.train.steps));
    }
    cv_.notify_all();
}

bool SteppedRun::wait(double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return settled(); });
}

void SteppedRun::hold() {
    std::lock_guard<std::mutex> lock(mu_);
    i64 in_flight = 0;
    for (const Rank& r : ranks_)
        in_flight = std::max(in_flight, r.state == RankState::running ? r.done + 1 : r.done);
    budget_ = std::min(budget_, in_flight);
}

void SteppedRun::finish() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        if (!ended_ && settled() &&
            std::all_of(ranks_.begin(), ranks_.end(),
                        [](const Rank& r) { return r.state == RankState::finished; }))
            return;
    }
    // Job::run stops at the steps done; the learning-rate schedule stays train.steps'.
    on_each_rank([](Job& job, comm::Communicator&) { job.stop_after(job.steps_done()); });
    {
        std::lock_guard<std::mutex> lock(mu_);
        finishing_ = true;
    }
    cv_.notify_all();
}

SteppedRun::Status SteppedRun::status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return status_locked();
}

SteppedRun::Status SteppedRun::status_locked() const {
    if (error_) return ended_ ? Status::failed : Status::running;
    if (ended_) return Status::failed;
    bool all_finished = true, building = false;
    for (const Rank& r : ranks_) {
        all_finished = all_finished && r.state == RankState::finished;
        building = building || r.state == RankState::building;
    }
    if (!settled()) return building ? Status::starting : Status::running;
    return all_finished ? Status::finished : Status::paused;
}

i64 SteppedRun::steps_done() const {
    std::lock_guard<std::mutex> lock(mu_);
    i64 done = INT64_MAX;
    for (const Rank& r : ranks_) done = std::min(done, r.done);
    return ranks_.empty() ? 0 : done;
}

std::string SteppedRun::error() const {
    std::lock_guard<std::mutex> lock(mu_);
    return error_text_;
}

void SteppedRun::rethrow() const {
    std::exception_ptr e;
    {
        std::lock_guard<std::mutex> lock(mu_);
        e = error_;
    }
    if (e) std::rethrow_exception(e);
}

Job& SteppedRun::job(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    require_settled("reading a rank's job");
    if (rank < 0 || rank >= world_size())
        throw ConfigError("rank " + std::to_string(rank) + " is not a rank of this layout (0 .. " +
                          std::to_string(world_size() - 1) + ")");
    return *ranks_[static_cast<size_t>(rank)].job;
}

comm::Communicator& SteppedRun::world(int rank) {
    job(rank);  // the same checks
    std::lock_guard<std::mutex> lock(mu_);
    return *ranks_[static_cast<size_t>(rank)].world;
}

void SteppedRun::on_each_rank(const std::function<void(Job&, comm::Communicator&)>& fn) {
    std::unique_lock<std::mutex> lock(mu_);
    require_settled("running work on every rank");
    task_ = &fn;
    const std::uint64_t gen = ++task_gen_;
    for (Rank& r : ranks_) r.task_error = nullptr;
    cv_.notify_all();
    cv_.wait(lock, [&] {
        if (ended_) return true;
        for (const Rank& r : ranks_)
            if (r.task != gen || r.state == RankState::working) return false;
        return true;
    });
    task_ = nullptr;
    if (error_) std::rethrow_exception(error_);
    for (const Rank& r : ranks_)
        if (r.task_error) std::rethrow_exception(r.task_error);
}

}  // namespace px
