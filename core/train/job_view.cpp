#include "core/train/job_view.h"

#include "core/base/error.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace px {

namespace {

constexpr const char* kRunStateNames[] = {"not started", "running", "finished", "failed"};
static_assert(std::size(kRunStateNames) == static_cast<size_t>(RunState::failed) + 1);

constexpr const char* kEventKindNames[] = {"resume", "rerun", "checkpoint", "fault",
                                           "failure", "alert", "spike"};
static_assert(std::size(kEventKindNames) == static_cast<size_t>(EventKind::spike) + 1);

// The double columns and the StepMetrics fields they hold; `step` is the one i64 column.
struct Column {
    std::vector<double> MetricColumns::*column;
    double StepMetrics::*field;
};
constexpr Column kColumns[] = {
    {&MetricColumns::loss, &StepMetrics::loss},
    {&MetricColumns::val_loss, &StepMetrics::val_loss},
    {&MetricColumns::grad_norm, &StepMetrics::grad_norm},
    {&MetricColumns::lr, &StepMetrics::lr},
    {&MetricColumns::tokens_per_s, &StepMetrics::tokens_per_s},
    {&MetricColumns::step_ms, &StepMetrics::step_ms},
    {&MetricColumns::comm_bytes, &StepMetrics::comm_bytes},
};
// A field added to StepMetrics needs its column here.
static_assert(sizeof(StepMetrics) == sizeof(i64) + std::size(kColumns) * sizeof(double));

// An append-only log kept in blocks of N that published states share. The job writes only past
// the count a published state holds, and a truncation copies its partial block first, so a
// reader of any published state reads memory that nobody writes any more.
template <class T, size_t N>
struct BlockLog {
    std::vector<std::shared_ptr<std::array<T, N>>> blocks;
    size_t size = 0;

    const T& operator[](size_t i) const { return (*blocks[i / N])[i % N]; }
    void push_back(const T& x) {
        if (size % N == 0) blocks.push_back(std::make_shared<std::array<T, N>>());
        (*blocks.back())[size % N] = x;
        size++;
    }
    void truncate(size_t n) {  // n <= size
        blocks.resize((n + N - 1) / N);
        if (n % N != 0) blocks.back() = std::make_shared<std::array<T, N>>(*blocks.back());
        size = n;
    }
};

// What does not change during a run, shared by every state published after the start.
struct Head {
    Config config;
    std::string config_toml;
    LayoutSummary layout;
    i64 num_params = 0;
    i64 steps_total = 0;
    double entropy_rate = -1, loss_floor = -1;
};

LayoutSummary summarize(const LayoutConfig& l, const TrainConfig& t) {
    LayoutSummary s;
    s.dp = l.dp;
    s.tp = l.tp;
    s.pp = l.pp;
    s.zero = l.zero;
    s.microbatches = l.microbatches > 0 ? l.microbatches : static_cast<int>(t.microbatches);
    s.world_size = l.dp * l.pp * l.tp;
    return s;
}

std::string resume_note(const CheckpointConfig& ck, i64 step) {
    std::string note = "resumed at step " + std::to_string(step);
    if (ck.resume == "auto")
        note += " from the newest checkpoint in " + ck.dir;
    else if (!ck.resume.empty())
        note += " from " + ck.resume;
    return note;
}

}  // namespace

const char* run_state_name(RunState s) {
    return kRunStateNames[static_cast<size_t>(s)];
}
const char* event_kind_name(EventKind k) {
    return kEventKindNames[static_cast<size_t>(k)];
}
bool event_kind_from_name(const std::string& name, EventKind* k) {
    for (size_t i = 0; i < std::size(kEventKindNames); i++)
        if (name == kEventKindNames[i]) {
            *k = static_cast<EventKind>(i);
            return true;
        }
    return false;
}

StepMetrics MetricColumns::row(size_t i) const {
    StepMetrics m;
    m.step = step[i];
    for (const Column& c : kColumns) m.*c.field = (this->*c.column)[i];
    return m;
}

void MetricColumns::push_back(const StepMetrics& m) {
    step.push_back(m.step);
    for (const Column& c : kColumns) (this->*c.column).push_back(m.*c.field);
}

void MetricColumns::resize(size_t n) {
    step.resize(n);
    for (const Column& c : kColumns) (this->*c.column).resize(n);
}

struct JobView::State {
    std::uint64_t version = 0, epoch = 0;
    RunState state = RunState::not_started;
    std::string error;
    std::shared_ptr<const Head> head;  // null until the start
    i64 steps_done = 0;
    BlockLog<StepMetrics, 256> rows;
    BlockLog<RunEvent, 32> events;
    BlockLog<StepValues, 64> values;
    BlockLog<Fp8Stat, 256> fp8;
    std::vector<MemoryStats> memory;
};

JobView::JobView() : work_(std::make_unique<State>()), published_(std::make_shared<State>()) {}

JobView::~JobView() = default;

void JobView::publish() {
    work_->version++;
    std::shared_ptr<const State> next = std::make_shared<const State>(*work_);
    {
        std::lock_guard<std::mutex> lock(swap_mutex_);
        published_.swap(next);
    }
    version_.store(work_->version, std::memory_order_release);
    // `next` holds the previous state now; a reader may still hold it too.
}

void JobView::on_start(const RunView& run) {
    auto head = std::make_shared<Head>();
    head->config = run.config();
    head->config_toml = config_to_toml(head->config);
    head->layout = summarize(head->config.layout, head->config.train);
    head->num_params = run.num_params();
    head->steps_total = head->config.train.steps;
    head->entropy_rate = run.entropy_rate();
    head->loss_floor = run.loss_floor();
    const MemoryStats mem = run.memory();
    const i64 done = run.steps_done();

    std::lock_guard<std::mutex> lock(job_mutex_);
    if (work_->head)
        throw Error(
            "JobView::on_start: this view has already followed a run; a view follows one run, "
            "so attach a new JobView to the next one");
    State& w = *work_;
    w.head = std::move(head);
    w.epoch++;
    w.state = std::max(w.state, RunState::running);
    w.steps_done = done;
    w.memory.resize(std::max(w.memory.size(), static_cast<size_t>(w.head->layout.world_size)));
    w.memory[0] = mem;
    if (done > 0)
        w.events.push_back({done, EventKind::resume, resume_note(w.head->config.checkpoint, done), {}});
    publish();
}

// A step at or before the last one reported (the replica check or a spike replay rewound the
// job): the rows from it on are dropped, with a rerun event, and the values after it (from it
// on when values_too: its new values are coming). Holding job_mutex_.
void JobView::begin_step(i64 step, bool values_too) {
    State& w = *work_;
    size_t keep = w.rows.size;
    while (keep > 0 && w.rows[keep - 1].step >= step) keep--;
    size_t keep_values = w.values.size;  // a step's values come before its row
    const i64 first_dropped = values_too ? step : step + 1;
    while (keep_values > 0 && w.values[keep_values - 1].step >= first_dropped) keep_values--;
    const bool cut = keep < w.rows.size || keep_values < w.values.size;
    if (keep < w.rows.size) {
        const i64 last = w.rows[w.rows.size - 1].step;
        w.rows.truncate(keep);
        w.events.push_back({step, EventKind::rerun,
                            "step " + std::to_string(step) + " was run again after step " +
                                std::to_string(last) + "; the rows from it on were replaced",
                            {}});
    }
    size_t keep_fp8 = w.fp8.size;  // a step's FP8 rows come before its row too (on_fp8 drops
    while (keep_fp8 > 0 && w.fp8[keep_fp8 - 1].step > step) keep_fp8--;  // its own step's)
    if (cut || keep_fp8 < w.fp8.size) w.epoch++;
    w.values.truncate(keep_values);
    w.fp8.truncate(keep_fp8);
}

void JobView::on_values(const RunView&, i64 step, const std::vector<NamedValue>& values) {
    auto shared = std::make_shared<const std::vector<NamedValue>>(values);
    std::lock_guard<std::mutex> lock(job_mutex_);
    begin_step(step, true);
    work_->values.push_back({step, std::move(shared)});
    publish();
}

void JobView::on_step(const RunView& run, const StepMetrics& m) {
    const MemoryStats mem = run.memory();
    const i64 done = run.steps_done();

    std::lock_guard<std::mutex> lock(job_mutex_);
    State& w = *work_;
    begin_step(m.step, false);
    w.rows.push_back(m);
    w.steps_done = done;
    if (w.memory.empty()) w.memory.resize(1);
    w.memory[0] = mem;
    publish();
}

void JobView::on_end(const RunView& run) {
    const MemoryStats mem = run.memory();
    const i64 done = run.steps_done();

    std::lock_guard<std::mutex> lock(job_mutex_);
    State& w = *work_;
    w.state = std::max(w.state, RunState::finished);
    w.steps_done = done;
    if (w.memory.empty()) w.memory.resize(1);
    w.memory[0] = mem;
    publish();
}

void JobView::add_event(i64 step, EventKind kind, const std::string& message) {
    std::lock_guard<std::mutex> lock(job_mutex_);
    work_->events.push_back({step, kind, message, {}});
    publish();
}

void JobView::on_event(const RunView&, const RunEvent& e) {
    std::lock_guard<std::mutex> lock(job_mutex_);
    work_->events.push_back(e);
    publish();
}

void JobView::on_fp8(const RunView&, const std::vector<Fp8Stat>& rows) {
    if (rows.empty()) return;
    std::lock_guard<std::mutex> lock(job_mutex_);
    State& w = *work_;
    size_t keep = w.fp8.size;  // a step run again: its rows and the later ones are replaced
    while (keep > 0 && w.fp8[keep - 1].step >= rows.front().step) keep--;
    if (keep < w.fp8.size) {
        w.fp8.truncate(keep);
        w.epoch++;
    }
    for (const Fp8Stat& r : rows) w.fp8.push_back(r);
    publish();
}

void JobView::fail(const std::string& error) {
    std::lock_guard<std::mutex> lock(job_mutex_);
    State& w = *work_;
    w.state = RunState::failed;
    w.error = error;
    w.events.push_back({w.steps_done, EventKind::failure, error, {}});
    publish();
}

void JobView::set_memory(int rank, const MemoryStats& m) {
    if (rank < 0)
        throw Error("JobView::set_memory: rank " + std::to_string(rank) +
                    " is not a world rank (they count from 0)");
    std::lock_guard<std::mutex> lock(job_mutex_);
    State& w = *work_;
    const size_t r = static_cast<size_t>(rank);
    if (r >= w.memory.size()) w.memory.resize(r + 1);
    w.memory[r] = m;
    publish();
}

RunSnapshot JobView::snapshot() const {
    RunSnapshot s;
    update(s);
    return s;
}

bool JobView::update(RunSnapshot& s) const {
    std::shared_ptr<const State> p;
    {
        std::lock_guard<std::mutex> lock(swap_mutex_);
        p = published_;
    }
    // From here on `p` is immutable: nothing below holds a lock.
    const State& st = *p;
    if (st.version == s.version) return false;
    if (st.epoch != s.epoch) {  // rows were replaced, or the run started: copy everything
        static const Head kNotStarted;
        const Head& h = st.head ? *st.head : kNotStarted;
        s.metrics.resize(0);
        s.events.clear();
        s.values.clear();
        s.fp8.clear();
        s.config = h.config;
        s.config_toml = h.config_toml;
        s.layout = h.layout;
        s.num_params = h.num_params;
        s.steps_total = h.steps_total;
        s.entropy_rate = h.entropy_rate;
        s.loss_floor = h.loss_floor;
        s.epoch = st.epoch;
    }
    for (size_t i = s.metrics.size(); i < st.rows.size; i++) s.metrics.push_back(st.rows[i]);
    for (size_t i = s.events.size(); i < st.events.size; i++) s.events.push_back(st.events[i]);
    for (size_t i = s.values.size(); i < st.values.size; i++) s.values.push_back(st.values[i]);
    for (size_t i = s.fp8.size(); i < st.fp8.size; i++) s.fp8.push_back(st.fp8[i]);
    s.version = st.version;
    s.state = st.state;
    s.error = st.error;
    s.steps_done = st.steps_done;
    s.memory = st.memory;
    return true;
}

}  // namespace px
