#include "views/job_controller.h"

#include <utility>

namespace px::views {

const char* job_status_name(JobStatus s) {
    switch (s) {
        case JobStatus::none:
            return "no job";
        case JobStatus::starting:
            return "starting";
        case JobStatus::running:
            return "running";
        case JobStatus::paused:
            return "paused";
        case JobStatus::finished:
            return "finished";
        case JobStatus::failed:
            return "failed";
        case JobStatus::stopped:
            return "stopped";
    }
    return "?";
}

JobController::~JobController() {
    retire();
    for (std::thread& t : reapers_) t.join();
}

void JobController::retire() {
    if (!run_) return;
    run_->hold();
    run_ = nullptr;
    // The destructor ends the ranks after the step in progress and joins them, then lets go of
    // the session's folders: not on the UI's thread. The view and the trace outlive the ranks
    // that write to them.
    reapers_.emplace_back([session = std::shared_ptr<RunSession>(std::move(session_)), view = view_,
                           trace = trace_]() mutable { session.reset(); });
}

void JobController::start(const Config& cfg, bool run, const RunHooks& hooks) {
    Config c = cfg;
    validate_config(c);
    const Layout layout = make_in_process_layout(c);  // threads and memory: before any thread
    retire();
    wait_stopped();  // the old run's folders are free again
    auto view = std::make_shared<JobView>();
    auto trace = std::make_shared<CommTrace>(Mesh(layout, Mesh::Validated{}));
    RunHooks mine = trace->hooks();
    JobView* v = view.get();
    mine.each_step = [v](Job& job) {  // other ranks' memory; rank 0's comes with on_step
        const int r = job.groups().world->rank();  // cp and ep ranks too: the world rank
        if (r != 0) v->set_memory(r, job.memory());
    };
    SessionOptions so;
    so.observers = {v};
    so.hooks = chain(hooks, mine);
    session_ = std::make_unique<RunSession>(c, std::move(so));
    run_ = &session_->start();
    view_ = std::move(view);
    trace_ = std::move(trace);
    cfg_ = c;
    run_id_++;
    failure_reported_ = false;
    finishing_ = false;
    status_ = JobStatus::starting;
    if (run) run_->advance_to(c.train.steps);
}

void JobController::wait_stopped() {
    for (std::thread& t : reapers_) t.join();
    reapers_.clear();
}

void JobController::pause() {
    if (run_) run_->hold();
}

void JobController::resume() {
    if (run_) run_->advance_to(run_->steps_total());
}

void JobController::run_to(i64 step) {
    if (run_) run_->advance_to(step);
}

void JobController::single_step() {
    if (!run_) return;
    run_->hold();
    run_->advance_to(run_->steps_done() + 1);
}

void JobController::stop() {
    if (!run_) return;
    retire();
    if (status_ != JobStatus::finished && status_ != JobStatus::failed)
        status_ = JobStatus::stopped;
}

void JobController::poll() {
    if (!run_) return;
    switch (run_->status()) {
        case SteppedRun::Status::starting:
            status_ = JobStatus::starting;
            break;
        case SteppedRun::Status::running:
            status_ = JobStatus::running;
            break;
        case SteppedRun::Status::paused:
            if (run_->steps_done() >= run_->steps_total()) {
                if (!finishing_) run_->finish();  // observers' on_end: the view says finished
                finishing_ = true;
                status_ = JobStatus::running;
            } else {
                status_ = JobStatus::paused;
            }
            break;
        case SteppedRun::Status::finished:
            status_ = JobStatus::finished;
            session_->release();  // its folders and its run file, for the next run or reader
            break;
        case SteppedRun::Status::failed:
            status_ = JobStatus::failed;
            if (!failure_reported_) {
                view_->fail(run_->error());
                failure_reported_ = true;
                session_->release();
            }
            break;
    }
}

bool JobController::update(RunSnapshot& s) {
    if (!view_) return false;
    if (seen_run_ != run_id_) {
        s = RunSnapshot{};
        seen_run_ = run_id_;
        view_->update(s);
        return true;
    }
    return view_->update(s);
}

}  // namespace px::views
