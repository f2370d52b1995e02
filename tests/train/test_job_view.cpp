// The thread-safe view of a running job (core/job_view.h): a reader thread takes snapshots
// without pause while a real job runs on other threads. Every state it sees is one the job
// passed through, in order: versions and run states only go forward, the rows are the job's
// history as it stood at some moment (bit for bit, re-runs included), and the events are a
// prefix of the final ones. The last snapshot is what the job itself reports. The incremental
// update() and a full snapshot() agree whenever they read the same version. This suite also
// runs under ThreadSanitizer (scripts/test.sh, build-tsan), which checks the claim that no
// reader touches memory the job writes.
#include "core/io/checkpoint.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/train/job.h"
#include "core/train/job_view.h"
#include "core/train/checkpointing.h"
#include "core/parallel/pipeline/pipeline.h"
#include "core/train/runner.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

using namespace px;
using Catch::Matchers::Contains;

namespace {

Config base() {
    Config c = test::small_job();
    c.train.steps = 8;
    c.train.eval_every = 4;
    c.train.val_batches = 1;
    c.train.threads = 1;      // OpenMP's runtime is not instrumented: one thread per rank for TSan
    c.layout.timeout_s = 30;  // TSan slows the ranks down
    return c;
}

bool same_row(const StepMetrics& a, const StepMetrics& b) {
    return std::memcmp(&a, &b, sizeof a) == 0;
}

bool same_memory(const MemoryStats& a, const MemoryStats& b) {
    return a.params == b.params && a.grads == b.grads && a.optimizer == b.optimizer &&
           a.activations == b.activations && a.comm == b.comm && a.peak_params == b.peak_params &&
           a.peak_grads == b.peak_grads;
}

bool same_event(const RunEvent& a, const RunEvent& b) {
    return a.step == b.step && a.kind == b.kind && a.message == b.message;
}

// `a` is `b` or its beginning.
bool prefix_of(const std::vector<RunEvent>& a, const std::vector<RunEvent>& b) {
    return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin(), same_event);
}

// The rows of `s` are exactly `rows`, bit for bit.
bool rows_are(const RunSnapshot& s, const std::vector<StepMetrics>& rows) {
    if (s.metrics.size() != rows.size()) return false;
    for (size_t i = 0; i < rows.size(); i++)
        if (!same_row(s.metrics.row(i), rows[i])) return false;
    return true;
}

bool same_snapshot(const RunSnapshot& a, const RunSnapshot& b) {
    bool same = a.version == b.version && a.epoch == b.epoch && a.state == b.state &&
                a.error == b.error && a.config == b.config && a.config_toml == b.config_toml &&
                a.layout == b.layout && a.num_params == b.num_params &&
                a.steps_done == b.steps_done && a.steps_total == b.steps_total &&
                std::memcmp(&a.entropy_rate, &b.entropy_rate, sizeof(double)) == 0 &&
                std::memcmp(&a.loss_floor, &b.loss_floor, sizeof(double)) == 0 &&
                a.metrics.size() == b.metrics.size() && a.events.size() == b.events.size() &&
                prefix_of(a.events, b.events) && a.memory.size() == b.memory.size();
    for (size_t i = 0; same && i < a.metrics.size(); i++)
        same = same_row(a.metrics.row(i), b.metrics.row(i));
    for (size_t i = 0; same && i < a.memory.size(); i++)
        same = same_memory(a.memory[i], b.memory[i]);
    return same;
}

// Every on_step the job makes, on the job's thread (read after the run).
class StepLog : public Observer {
public:
    void on_step(const RunView&, const StepMetrics& m) override { steps.push_back(m); }
    // The history after each on_step, as the job's own history() stood then: a step reported
    // again replaces the rows from it on.
    std::vector<std::vector<StepMetrics>> histories() const {
        std::vector<std::vector<StepMetrics>> out;
        std::vector<StepMetrics> h;
        for (const StepMetrics& m : steps) {
            while (!h.empty() && h.back().step >= m.step) h.pop_back();
            h.push_back(m);
            out.push_back(h);
        }
        return out;
    }
    std::vector<StepMetrics> steps;
};

// Reads the view on its own thread for as long as the job runs, as a GUI would every frame,
// with update() (keeping every new state) and a full snapshot() each time round. Nothing is
// asserted on this thread; the test reads what it kept after stop().
class Reader {
public:
    explicit Reader(const JobView& view) : view_(view), thread_([this] { loop(); }) {}
    ~Reader() { stop(); }
    void stop() {
        done_ = true;
        if (thread_.joinable()) thread_.join();
    }

    std::vector<RunSnapshot> seen;         // update()'s state each time it returned true
    std::atomic<std::uint64_t> latest{0};  // the version of the last read
    int reads = 0;
    int disagreements = 0;  // update() and snapshot() at one version but with different content

private:
    void loop() {
        RunSnapshot s;
        for (bool last = false; !last;) {
            last = done_;  // one more read after the job has ended
            if (view_.update(s)) seen.push_back(s);
            latest = s.version;
            const RunSnapshot full = view_.snapshot();
            if (full.version == s.version && !same_snapshot(full, s)) disagreements++;
            reads++;
            std::this_thread::yield();
        }
    }

    const JobView& view_;
    std::atomic<bool> done_{false};
    std::thread thread_;
};

// Holds the job after step `at` (rank 0, after the view's on_step) until the reader has read
// what the view published by then, so that however the threads are scheduled the reader sees
// the run in the middle, not only its end. Gives up after 10 s (the checks then fail).
class Pause : public Observer {
public:
    Pause(const JobView& view, const Reader& reader, i64 at)
        : view_(view), reader_(reader), at_(at) {}
    void on_step(const RunView&, const StepMetrics& m) override {
        if (m.step != at_) return;
        const std::uint64_t v = view_.version();
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (reader_.latest < v && std::chrono::steady_clock::now() < deadline)
            std::this_thread::yield();
    }

private:
    const JobView& view_;
    const Reader& reader_;
    i64 at_;
};

// The reader saw the run running, with some of its rows and not all.
bool saw_mid_run(const Reader& r, i64 steps) {
    for (const RunSnapshot& s : r.seen)
        if (s.state == RunState::running && s.metrics.size() > 0 && s.metrics.step.back() < steps)
            return true;
    return false;
}

// What every read must satisfy, given the job's steps as they happened and its final events.
void check_reads(const Reader& r, const StepLog& log, const RunSnapshot& last) {
    INFO(r.reads << " reads, " << r.seen.size() << " states seen");
    CHECK(r.disagreements == 0);
    REQUIRE(!r.seen.empty());
    CHECK(same_snapshot(r.seen.back(), last));  // the reader's last read caught the end
    const std::vector<std::vector<StepMetrics>> hist = log.histories();
    size_t t = 0;  // the history the previous read matched: later reads match the same or later
    bool rows_in_order = true;
    int events_not_prefix = 0, state_backwards = 0, versions_backwards = 0, done_mismatch = 0;
    const RunSnapshot* prev = nullptr;
    for (const RunSnapshot& s : r.seen) {
        if (prev && s.version <= prev->version) versions_backwards++;
        if (prev && s.state < prev->state) state_backwards++;
        if (!prefix_of(s.events, last.events)) events_not_prefix++;
        if (s.metrics.size() > 0 && s.steps_done != s.metrics.step.back()) done_mismatch++;
        if (s.metrics.size() > 0) {
            while (t < hist.size() && !rows_are(s, hist[t])) t++;
            if (t == hist.size()) {
                rows_in_order = false;
                break;
            }
        }
        prev = &s;
    }
    CHECK(versions_backwards == 0);
    CHECK(state_backwards == 0);
    CHECK(events_not_prefix == 0);
    CHECK(done_mismatch == 0);
    CHECK(rows_in_order);
}

// The final snapshot against the job's own report.
void check_final(const RunSnapshot& s, const Job& job) {
    CHECK(s.state == RunState::finished);
    CHECK(s.error.empty());
    CHECK(s.config == job.config());
    CHECK(s.config_toml == config_to_toml(job.config()));
    CHECK(s.num_params == job.num_params());
    CHECK(s.steps_done == job.steps_done());
    CHECK(s.steps_total == job.config().train.steps);
    const double entropy_rate = job.entropy_rate(), loss_floor = job.loss_floor();
    CHECK(std::memcmp(&s.entropy_rate, &entropy_rate, sizeof(double)) == 0);
    CHECK(std::memcmp(&s.loss_floor, &loss_floor, sizeof(double)) == 0);
    CHECK(rows_are(s, job.history()));
    const LayoutConfig& l = job.config().layout;
    CHECK(s.layout.dp == l.dp);
    CHECK(s.layout.tp == l.tp);
    CHECK(s.layout.pp == l.pp);
    CHECK(s.layout.zero == l.zero);
    CHECK(s.layout.world_size == l.dp * l.tp * l.pp);
    REQUIRE(!s.memory.empty());
    CHECK(same_memory(s.memory[0], job.memory()));
}

}  // namespace

TEST_CASE("a reader thread sees a single-device job's states in order, and the job's own end") {
    const Config c = base();
    JobView view;
    CHECK(view.version() == 0);
    CHECK(view.snapshot().state == RunState::not_started);
    StepLog log;
    Job job(c);
    Reader reader(view);
    Pause pause(view, reader, 3);
    job.add_observer(&view);
    job.add_observer(&log);
    job.add_observer(&pause);
    job.run();
    reader.stop();
    CHECK(saw_mid_run(reader, 8));

    const RunSnapshot s = view.snapshot();
    check_reads(reader, log, s);
    check_final(s, job);
    CHECK(s.version == view.version());
    CHECK(s.metrics.size() == 8);
    CHECK(s.metrics.val_loss[3] >= 0);  // evaluated at step 4
    CHECK(s.entropy_rate > 0);          // the Markov source knows it
    CHECK(s.events.empty());
    CHECK(s.layout.microbatches == 1);
    // The reader saw the run before it ended, and every state on the way.
    CHECK(reader.seen.front().state == RunState::running);
    CHECK(reader.seen.back().state == RunState::finished);

    // Nothing changed: update() copies nothing and says so.
    RunSnapshot again = s;
    CHECK_FALSE(view.update(again));
    // A view follows one run.
    CHECK_THROWS_WITH(view.on_start(job), Contains("a view follows one run"));
}

TEST_CASE("dp2 with a re-run and checkpoints: rerun and checkpoint events, every rank's memory") {
    Config c = base();
    c.layout.dp = 2;
    const std::string dir = test::temp_dir("job_view");
    c.checkpoint.dir = dir;
    c.checkpoint.every = 3;
    // A transient flip of one replica's weights after step 5: the replica check (every step)
    // rewinds to step 4 and runs step 5 again.
    c.validate.replica_check_every = 1;
    c.fault.kind = "flip_weight";
    c.fault.rank = 1;
    c.fault.step = 5;
    c.fault.tensor = "wpe";
    c.fault.element = 9;

    JobView view;
    StepLog log;
    std::vector<StepMetrics> history;
    std::vector<MemoryStats> memory(2);
    {
        Reader reader(view);
        Pause pause(view, reader, 2);
        RunHooks hooks;
        hooks.inspect = [&](Job& job) {  // after the run, one rank at a time
            memory[static_cast<size_t>(job.dp_rank())] = job.memory();
            if (job.dp_rank() == 0) history = job.history();
        };
        hooks.each_step = [&](Job& job) {  // every rank after each step, its checkpoint saved
            view.set_memory(job.dp_rank(), job.memory());
            if (job.dp_rank() == 0 && checkpoint_due(job.config(), job.steps_done()))
                view.add_event(job.steps_done(), EventKind::checkpoint,
                               checkpoint_path(dir, job.steps_done()));
        };
        run_layout(c, {&view, &log, &pause}, hooks);
        reader.stop();
        check_reads(reader, log, view.snapshot());
        CHECK(saw_mid_run(reader, 8));
    }
    const RunSnapshot s = view.snapshot();
    CHECK(s.state == RunState::finished);
    REQUIRE(history.size() == 8);
    CHECK(rows_are(s, history));
    CHECK(s.layout.world_size == 2);
    REQUIRE(s.memory.size() == 2);
    CHECK(same_memory(s.memory[0], memory[0]));
    CHECK(same_memory(s.memory[1], memory[1]));
    CHECK(memory[1].total() > 0);

    // checkpoint 3, the re-run of step 5, checkpoint 6, checkpoint 8 (the last step)
    REQUIRE(s.events.size() == 4);
    CHECK(s.events[0].kind == EventKind::checkpoint);
    CHECK(s.events[0].step == 3);
    CHECK(s.events[1].kind == EventKind::rerun);
    CHECK(s.events[1].step == 5);
    CHECK_THAT(s.events[1].message, Contains("step 5 was run again after step 5"));
    CHECK(s.events[2].step == 6);
    CHECK(s.events[3].step == 8);
    for (const RunEvent& e : s.events)
        if (e.kind == EventKind::checkpoint) CHECK(std::filesystem::exists(e.message));
    CHECK(log.steps.size() == 9);  // step 5 twice

    // Resumed from step 3: a resume event, rows from step 4 on, the same losses bit for bit.
    Config r = c;
    r.fault = FaultConfig{};
    r.checkpoint.dir = "";
    r.checkpoint.resume = checkpoint_path(dir, 3);
    JobView resumed;
    StepLog resumed_log;
    std::vector<StepMetrics> resumed_history;
    {
        Reader reader(resumed);
        Pause pause(resumed, reader, 5);
        run_layout(r, {&resumed, &resumed_log, &pause}, test::inspecting([&](Job& job) {
                       if (job.dp_rank() == 0) resumed_history = job.history();
                   }));
        reader.stop();
        check_reads(reader, resumed_log, resumed.snapshot());
        CHECK(saw_mid_run(reader, 8));
        for (const RunSnapshot& seen : reader.seen) CHECK(seen.steps_done >= 3);
    }
    const RunSnapshot t = resumed.snapshot();
    REQUIRE(t.events.size() == 1);
    CHECK(t.events[0].kind == EventKind::resume);
    CHECK(t.events[0].step == 3);
    CHECK_THAT(t.events[0].message, Contains("resumed at step 3 from " + r.checkpoint.resume));
    REQUIRE(resumed_history.size() == 8);
    CHECK(
        rows_are(t, std::vector<StepMetrics>(resumed_history.begin() + 3, resumed_history.end())));
    REQUIRE(t.metrics.size() == 5);
    CHECK(t.metrics.step.front() == 4);
    CHECK(test::same_bits(t.metrics.loss,
                          std::vector<double>(s.metrics.loss.begin() + 3, s.metrics.loss.end())));
}

TEST_CASE("a pipeline (pp2, 2 microbatches) publishes world rank 0's stage") {
    Config c = base();
    c.layout.pp = 2;
    c.layout.microbatches = 2;
    JobView view;
    StepLog log;
    std::vector<StepMetrics> history;
    MemoryStats memory;
    i64 num_params = 0;
    {
        Reader reader(view);
        Pause pause(view, reader, 2);
        run_layout(c, {&view, &log, &pause}, test::inspecting([&](Job& stage) {
                       if (stage.pp_rank() != 0) return;
                       history = stage.history();
                       memory = stage.memory();
                       num_params = stage.num_params();
                   }));
        reader.stop();
        check_reads(reader, log, view.snapshot());
        CHECK(saw_mid_run(reader, 8));
    }
    const RunSnapshot s = view.snapshot();
    CHECK(s.state == RunState::finished);
    REQUIRE(history.size() == 8);
    CHECK(rows_are(s, history));
    CHECK(s.layout.pp == 2);
    CHECK(s.layout.microbatches == 2);
    CHECK(s.num_params == num_params);
    REQUIRE(s.memory.size() == 2);
    CHECK(same_memory(s.memory[0], memory));
}

TEST_CASE("a job that throws is marked failed with its error, after the states it ran through") {
    Config c = base();
    c.layout.dp = 2;
    c.validate.replica_check_every = 1;
    c.fault.kind = "flip_weight";  // persistent: the re-run disagrees again
    c.fault.rank = 1;
    c.fault.step = 3;
    c.fault.tensor = "wpe";
    c.fault.element = 9;
    c.fault.persistent = true;
    JobView view;
    StepLog log;
    std::string error;
    {
        Reader reader(view);
        Pause pause(view, reader, 1);
        try {
            run_layout(c, {&view, &log, &pause});
        } catch (const CorruptionError& e) {
            error = e.what();
            view.fail(error);
        }
        reader.stop();
        check_reads(reader, log, view.snapshot());
        CHECK(saw_mid_run(reader, 8));
    }
    REQUIRE_FALSE(error.empty());
    const RunSnapshot s = view.snapshot();
    CHECK(s.state == RunState::failed);
    CHECK(s.error == error);
    REQUIRE(!s.events.empty());
    CHECK(s.events.back().kind == EventKind::failure);
    CHECK(s.events.back().message == error);
    CHECK(s.metrics.size() >= 2);
    CHECK(std::string(run_state_name(s.state)) == "failed");
    CHECK(std::string(event_kind_name(s.events.back().kind)) == "failure");
}

TEST_CASE("spike evidence and a rollback: one value row per step, the spike event, rows replaced") {
    Config c = base();
    c.train.steps = 30;
    c.train.eval_every = 0;
    c.data.corrupt_step = 25;
    c.spikes.action = "rollback";
    c.spikes.window = 20;
    c.spikes.snapshot_every = 10;
    JobView view;
    std::vector<StepMetrics> history;
    {
        Reader reader(view);
        run_layout(c, {&view}, test::inspecting([&](Job& job) { history = job.history(); }));
        reader.stop();
    }
    const RunSnapshot s = view.snapshot();
    CHECK(rows_are(s, history));
    // Every step once, in order, with its evidence; the re-run steps' values replaced theirs.
    REQUIRE(s.values.size() == 30);
    for (size_t i = 0; i < s.values.size(); i++) {
        CHECK(s.values[i].step == static_cast<i64>(i) + 1);
        bool norm = false;
        for (const NamedValue& v : *s.values[i].values) norm = norm || v.name == "layer.h.0.grad_norm";
        CHECK(norm);
    }
    int spikes = 0, reruns = 0;
    for (const RunEvent& e : s.events) {
        spikes += e.kind == EventKind::spike;
        reruns += e.kind == EventKind::rerun;
        if (e.kind == EventKind::spike) {
            CHECK(e.step == 25);
            CHECK_THAT(e.message, Contains("rolled back to step 20"));
        }
    }
    CHECK(spikes == 1);
    CHECK(reruns >= 2);  // the replay from step 20 and the rollback
    // An incremental reader ends with the same values as a full snapshot.
    RunSnapshot inc;
    view.update(inc);
    REQUIRE(inc.values.size() == s.values.size());
    for (size_t i = 0; i < s.values.size(); i++) CHECK(inc.values[i].values == s.values[i].values);
}
