// Interface-level parts of core/comm: names, argument checks, traffic, accounting, handles,
// and the typed wrappers that turn each call into a Request for the backend.
#include "core/comm/comm.h"

#include "core/comm/backend.h"

#include <chrono>
#include <cstdio>
#include <cstdint>
#include <numeric>

namespace px::comm {

const char* algo_name(Algo algo) {
    return algo == Algo::canonical ? "canonical" : "ring";
}

const char* dtype_name(Dtype dt) {
    switch (dt) {
        case Dtype::f32:
            return "f32";
        case Dtype::f64:
            return "f64";
        case Dtype::i64:
            return "i64";
        case Dtype::b16:
            return "b16";
        case Dtype::b8:
            return "b8";
    }
    return "?";
}

i64 dtype_size(Dtype dt) {
    switch (dt) {
        case Dtype::f32:
            return 4;
        case Dtype::f64:
            return 8;
        case Dtype::i64:
            return 8;
        case Dtype::b16:
            return 2;
        case Dtype::b8:
            return 1;
    }
    return 0;
}

bool can_reduce(Dtype dt) {
    return dt == Dtype::f32 || dt == Dtype::f64 || dt == Dtype::i64;
}

bool is_reducing(Op op) {
    return op == Op::all_reduce || op == Op::all_reduce_max || op == Op::reduce_scatter;
}

bool is_p2p(Op op) {
    return op == Op::send || op == Op::recv;
}

// ---- traffic ---------------------------------------------------------------------------------

namespace {

i64 sum_except(const std::vector<i64>& v, int skip) {
    i64 s = 0;
    for (int k = 0; k < static_cast<int>(v.size()); k++)
        if (k != skip) s += v[k];
    return s;
}

}  // namespace

Traffic traffic(const Request& req, int rank, int size) {
    const i64 e = dtype_size(req.dtype);
    const int p = size, r = rank;
    const i64 n = req.n;
    auto len = [&](int c) {
        c = ((c % p) + p) % p;
        return chunk_lo(n, p, c + 1) - chunk_lo(n, p, c);
    };
    Traffic t;
    switch (req.op) {
        case Op::all_reduce:
        case Op::all_reduce_max:
            if (p == 1) break;
            if (req.algo == Algo::ring && req.op == Op::all_reduce) {
                // Ring: chunk c is summed along c+1 -> c+2 -> ... -> c (every rank but c sends it),
                // then circulates from its owner c along c -> c+1 -> ... -> c-1 (every rank but
                // c-1 forwards it). Rank r sends all chunks but r, then all chunks but r+1.
                t.sent = (n - len(r)) + (n - len(r + 1));
                t.recv = (n - len(r - 1)) + (n - len(r));
            } else {
                // Direct: rank r receives chunk r from the p-1 others and sends them its other
                // chunks; then it sends its reduced chunk to the p-1 others and receives theirs.
                t.sent = (n - len(r)) + (p - 1) * len(r);
                t.recv = (p - 1) * len(r) + (n - len(r));
            }
            break;
        case Op::reduce_scatter:
        case Op::all_gather:
        case Op::all_to_all:
            t.sent = t.recv = (p - 1) * n;
            break;
        case Op::all_gather_v:
            t.sent = (p - 1) * req.counts[r];
            t.recv = sum_except(req.counts, r);
            break;
        case Op::all_to_all_v:
            t.sent = sum_except(req.counts, r);
            t.recv = sum_except(req.out_counts, r);
            break;
        case Op::broadcast:
            if (r == req.peer)
                t.sent = (p - 1) * n;
            else
                t.recv = n;
            break;
        case Op::send:
            t.sent = n;
            break;
        case Op::recv:
            t.recv = n;
            break;
        case Op::barrier:
        case Op::split:
            break;
    }
    t.sent *= e;
    t.recv *= e;
    return t;
}

// ---- accounting ------------------------------------------------------------------------------

OpStats CommStats::total() const {
    OpStats t;
    for (const OpStats& o : ops) {
        t.calls += o.calls;
        t.bytes_sent += o.bytes_sent;
        t.bytes_recv += o.bytes_recv;
        t.seconds += o.seconds;
    }
    return t;
}

std::vector<StatRow> stat_rows(const CommStats& s, int world_rank) {
    std::vector<StatRow> rows;
    for (int i = 0; i < kNumOps; i++) {
        const OpStats& o = s.ops[i];
        if (o.calls == 0) continue;
        rows.push_back({world_rank, s.rank, s.group, kOpNames[i], o.calls, o.bytes_sent,
                        o.bytes_recv, o.seconds});
    }
    return rows;
}

void StatsBook::add_group(const std::string& group, int rank, int size) {
    std::lock_guard lk(mu_);
    for (const CommStats& g : groups_)
        if (g.group == group) return;
    CommStats s;
    s.group = group;
    s.rank = rank;
    s.size = size;
    groups_.push_back(s);
}

void StatsBook::record(const std::string& group, const Request& req, double seconds) {
    std::lock_guard lk(mu_);
    for (CommStats& g : groups_) {
        if (g.group != group) continue;
        const Traffic t = traffic(req, g.rank, g.size);
        OpStats& o = g.ops[static_cast<int>(req.op)];
        o.calls++;
        o.bytes_sent += t.sent;
        o.bytes_recv += t.recv;
        o.seconds += seconds;
        return;
    }
    PX_ASSERT(false, "StatsBook::record: group '" + group + "' was never added");
}

CommStats StatsBook::stats(const std::string& group) const {
    std::lock_guard lk(mu_);
    for (const CommStats& g : groups_)
        if (g.group == group) return g;
    CommStats s;
    s.group = group;
    return s;
}

std::vector<StatRow> StatsBook::rows() const {
    std::lock_guard lk(mu_);
    std::vector<StatRow> rows;
    for (const CommStats& g : groups_) {
        auto r = stat_rows(g, world_rank_);
        rows.insert(rows.end(), r.begin(), r.end());
    }
    return rows;
}

void StatsBook::reset() {
    std::lock_guard lk(mu_);
    for (CommStats& g : groups_) g.ops = {};
}

// ---- handles ---------------------------------------------------------------------------------

Handle& Handle::operator=(Handle&& o) noexcept {
    if (this != &o) {
        wait_quietly();
        state_ = std::move(o.state_);
    }
    return *this;
}

Handle::~Handle() {
    wait_quietly();
}

void Handle::wait() {
    if (!state_) return;
    auto s = std::move(state_);  // empty even when wait() throws: the error is reported once
    s->wait();
}

void Handle::wait_quietly() noexcept {
    if (!state_) return;
    try {
        wait();
    } catch (...) {
        // The failure has failed the job; the next operation on any rank reports it.
    }
}

// ---- argument checks -------------------------------------------------------------------------

Communicator::Communicator(int rank, int size, std::string group, std::shared_ptr<StatsBook> book)
    : rank_(rank), size_(size), group_(std::move(group)), book_(std::move(book)) {
    PX_ASSERT(book_ != nullptr, "communicator without a stats book");
    book_->add_group(group_, rank_, size_);
}

Decorator::Decorator(std::unique_ptr<Communicator> inner)
    : Communicator(inner->rank(), inner->size(), inner->group(), inner->stats_book()),
      inner_(std::move(inner)) {}

namespace {

bool overlap(const void* a, i64 a_bytes, const void* b, i64 b_bytes) {
    const auto pa = reinterpret_cast<std::uintptr_t>(a), pb = reinterpret_cast<std::uintptr_t>(b);
    return a_bytes > 0 && b_bytes > 0 && pa < pb + static_cast<std::uintptr_t>(b_bytes) &&
           pb < pa + static_cast<std::uintptr_t>(a_bytes);
}

}  // namespace

void Communicator::check(const Request& req) const {
    const std::string where = std::string(op_name(req.op)) + " on rank " + std::to_string(rank_) +
                              " of group '" + group_ + "' (size " + std::to_string(size_) + "): ";
    auto fail = [&](const std::string& what) { throw CommError(where + what); };
    const i64 e = dtype_size(req.dtype);
    const int p = size_;
    if (req.n < 0) fail("element count " + std::to_string(req.n) + " is negative");
    if (is_reducing(req.op) && !can_reduce(req.dtype))
        fail(std::string(dtype_name(req.dtype)) +
             " elements are moved, never summed (the numerics contract adds in fp32): reduce the "
             "partials as f32 and round the result");

    auto check_counts = [&](const std::vector<i64>& c, const char* what) -> i64 {
        if (static_cast<int>(c.size()) != p)
            fail(std::string(what) + " has " + std::to_string(c.size()) +
                 " entries; it needs one per rank (" + std::to_string(p) + ")");
        i64 total = 0;
        for (int k = 0; k < p; k++) {
            if (c[k] < 0) fail(std::string(what) + "[" + std::to_string(k) + "] is negative");
            total += c[k];
        }
        return total;
    };
    auto need = [&](const void* ptr, i64 count, const char* what) {
        if (count > 0 && ptr == nullptr)
            fail(std::string(what) + " is null but holds " + std::to_string(count) + " elements");
    };
    // in and out may coincide exactly where the header allows in-place; any other overlap
    // would let one rank overwrite what another is still reading.
    auto no_overlap = [&](i64 out_n, i64 in_n, const void* in_place_at) {
        if (req.in == in_place_at) return;
        if (overlap(req.out, out_n * e, req.in, in_n * e))
            fail(
                "out and in overlap (only the in-place form documented in core/comm/comm.h is "
                "allowed); use separate buffers");
    };
    auto rank_arg = [&](int r, const char* what) {
        if (r < 0 || r >= p)
            fail(std::string(what) + " " + std::to_string(r) + " is not a rank of the group (0.." +
                 std::to_string(p - 1) + ")");
    };

    const char* out_b = static_cast<const char*>(req.out);
    switch (req.op) {
        case Op::all_reduce:
        case Op::all_reduce_max:
        case Op::broadcast:
            need(req.out, req.n, "buf");
            if (req.op == Op::broadcast) rank_arg(req.peer, "root");
            break;
        case Op::reduce_scatter:
            need(req.out, req.n, "out");
            need(req.in, p * req.n, "in");
            if (req.out != static_cast<const char*>(req.in) + rank_ * req.n * e &&
                overlap(req.out, req.n * e, req.in, p * req.n * e))
                fail(
                    "out and in overlap (only out = in + rank·n_per_rank is allowed); use separate "
                    "buffers");
            break;
        case Op::all_gather:
            need(req.out, p * req.n, "out");
            need(req.in, req.n, "in");
            no_overlap(p * req.n, req.n, out_b ? out_b + rank_ * req.n * e : nullptr);
            break;
        case Op::all_gather_v: {
            const i64 total = check_counts(req.counts, "counts");
            const i64 before =
                std::accumulate(req.counts.begin(), req.counts.begin() + rank_, i64{0});
            need(req.out, total, "out");
            need(req.in, req.counts[rank_], "in");
            no_overlap(total, req.counts[rank_], out_b ? out_b + before * e : nullptr);
            break;
        }
        case Op::all_to_all:
            need(req.out, p * req.n, "out");
            need(req.in, p * req.n, "in");
            no_overlap(p * req.n, p * req.n, nullptr);
            break;
        case Op::all_to_all_v: {
            const i64 in_total = check_counts(req.counts, "in_counts");
            const i64 out_total = check_counts(req.out_counts, "out_counts");
            need(req.out, out_total, "out");
            need(req.in, in_total, "in");
            if (overlap(req.out, out_total * e, req.in, in_total * e))
                fail("out and in overlap; use separate buffers");
            break;
        }
        case Op::send:
            need(req.in, req.n, "buf");
            rank_arg(req.peer, "destination");
            break;
        case Op::recv:
            need(req.out, req.n, "buf");
            rank_arg(req.peer, "source");
            break;
        case Op::barrier:
            break;
        case Op::split:
            if (req.color >= 0 && req.name.empty()) fail("the new group needs a name");
            break;
    }
}

// ---- typed wrappers --------------------------------------------------------------------------

namespace {

template <class T>
Request make(Op op, T* out, const T* in, i64 n, Algo algo = Algo::canonical) {
    Request r;
    r.op = op;
    r.dtype = dtype_of<T>();
    r.algo = algo;
    r.out = out;
    r.in = in;
    r.n = n;
    return r;
}

}  // namespace

template <class T>
void Communicator::all_reduce(T* buf, i64 n, Algo algo) {
    Request r = make(Op::all_reduce, buf, buf, n, algo);
    check(r);
    run(r);
}

template <class T>
void Communicator::all_reduce_max(T* buf, i64 n) {
    Request r = make(Op::all_reduce_max, buf, buf, n);
    check(r);
    run(r);
}

template <class T>
void Communicator::reduce_scatter(T* out, const T* in, i64 n_per_rank, Algo algo) {
    Request r = make(Op::reduce_scatter, out, in, n_per_rank, algo);
    check(r);
    run(r);
}

template <class T>
void Communicator::all_gather(T* out, const T* in, i64 n_per_rank) {
    Request r = make(Op::all_gather, out, in, n_per_rank);
    check(r);
    run(r);
}

template <class T>
void Communicator::all_gather_v(T* out, const T* in, std::span<const i64> counts) {
    Request r = make(Op::all_gather_v, out, in, 0);
    r.counts.assign(counts.begin(), counts.end());
    check(r);
    run(r);
}

template <class T>
void Communicator::broadcast(T* buf, i64 n, int root) {
    Request r = make(Op::broadcast, buf, buf, n);
    r.peer = root;
    check(r);
    run(r);
}

template <class T>
void Communicator::all_to_all(T* out, const T* in, i64 n_per_rank) {
    Request r = make(Op::all_to_all, out, in, n_per_rank);
    check(r);
    run(r);
}

template <class T>
void Communicator::all_to_all_v(T* out, std::span<const i64> out_counts, const T* in,
                                std::span<const i64> in_counts) {
    Request r = make(Op::all_to_all_v, out, in, 0);
    r.counts.assign(in_counts.begin(), in_counts.end());
    r.out_counts.assign(out_counts.begin(), out_counts.end());
    check(r);
    run(r);
}

void Communicator::barrier() {
    Request r;
    r.op = Op::barrier;
    check(r);
    run(r);
}

template <class T>
void Communicator::send(const T* buf, i64 n, int dst, int tag) {
    Request r = make<T>(Op::send, nullptr, buf, n);
    r.peer = dst;
    r.tag = tag;
    check(r);
    run(r);
}

template <class T>
void Communicator::recv(T* buf, i64 n, int src, int tag) {
    Request r = make<T>(Op::recv, buf, nullptr, n);
    r.peer = src;
    r.tag = tag;
    check(r);
    run(r);
}

template <class T>
Handle Communicator::all_reduce_async(T* buf, i64 n, Algo algo) {
    Request r = make(Op::all_reduce, buf, buf, n, algo);
    check(r);
    return start(std::move(r));
}

template <class T>
Handle Communicator::reduce_scatter_async(T* out, const T* in, i64 n_per_rank, Algo algo) {
    Request r = make(Op::reduce_scatter, out, in, n_per_rank, algo);
    check(r);
    return start(std::move(r));
}

template <class T>
Handle Communicator::all_gather_async(T* out, const T* in, i64 n_per_rank) {
    Request r = make(Op::all_gather, out, in, n_per_rank);
    check(r);
    return start(std::move(r));
}

template <class T>
Handle Communicator::broadcast_async(T* buf, i64 n, int root) {
    Request r = make(Op::broadcast, buf, buf, n);
    r.peer = root;
    check(r);
    return start(std::move(r));
}

template <class T>
Handle Communicator::all_to_all_async(T* out, const T* in, i64 n_per_rank) {
    Request r = make(Op::all_to_all, out, in, n_per_rank);
    check(r);
    return start(std::move(r));
}

template <class T>
Handle Communicator::send_async(const T* buf, i64 n, int dst, int tag) {
    Request r = make<T>(Op::send, nullptr, buf, n);
    r.peer = dst;
    r.tag = tag;
    check(r);
    return start(std::move(r));
}

template <class T>
Handle Communicator::recv_async(T* buf, i64 n, int src, int tag) {
    Request r = make<T>(Op::recv, buf, nullptr, n);
    r.peer = src;
    r.tag = tag;
    check(r);
    return start(std::move(r));
}

// Every typed entry point, for every element type (adding a Dtype adds a line here). Types that
// cannot be summed have no reducing entry points: calling one does not link.
#define PX_COMM_MOVE(T)                                                              \
    template void Communicator::all_gather<T>(T*, const T*, i64);                    \
    template void Communicator::all_gather_v<T>(T*, const T*, std::span<const i64>); \
    template void Communicator::broadcast<T>(T*, i64, int);                          \
    template void Communicator::all_to_all<T>(T*, const T*, i64);                    \
    template void Communicator::all_to_all_v<T>(T*, std::span<const i64>, const T*,  \
                                                std::span<const i64>);               \
    template void Communicator::send<T>(const T*, i64, int, int);                    \
    template void Communicator::recv<T>(T*, i64, int, int);                          \
    template Handle Communicator::all_gather_async<T>(T*, const T*, i64);            \
    template Handle Communicator::broadcast_async<T>(T*, i64, int);                  \
    template Handle Communicator::all_to_all_async<T>(T*, const T*, i64);            \
    template Handle Communicator::send_async<T>(const T*, i64, int, int);            \
    template Handle Communicator::recv_async<T>(T*, i64, int, int);
#define PX_COMM_REDUCE(T)                                                            \
    template void Communicator::all_reduce<T>(T*, i64, Algo);                        \
    template void Communicator::all_reduce_max<T>(T*, i64);                          \
    template void Communicator::reduce_scatter<T>(T*, const T*, i64, Algo);          \
    template Handle Communicator::all_reduce_async<T>(T*, i64, Algo);                \
    template Handle Communicator::reduce_scatter_async<T>(T*, const T*, i64, Algo);

PX_COMM_MOVE(float)
PX_COMM_MOVE(double)
PX_COMM_MOVE(i64)
PX_COMM_MOVE(std::uint16_t)
PX_COMM_MOVE(std::uint8_t)
PX_COMM_REDUCE(float)
PX_COMM_REDUCE(double)
PX_COMM_REDUCE(i64)

#undef PX_COMM_MOVE
#undef PX_COMM_REDUCE

// ---- the progress queue ----------------------------------------------------------------------

namespace {

// An async collective: done when the progress thread has run it.
struct TaskState final : Handle::State {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::exception_ptr error;
    void finish(std::exception_ptr e) {
        std::lock_guard lk(mu);
        done = true;
        error = std::move(e);
        cv.notify_all();
    }
    void wait() override {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return done; });
        if (error) std::rethrow_exception(error);
    }
    bool test() override {
        std::lock_guard lk(mu);
        return done;
    }
};

}  // namespace

struct ProgressQueue::Task {
    Request req;
    std::shared_ptr<TaskState> state;
};

ProgressQueue::ProgressQueue(std::function<void(const Request&)> run) : run_(std::move(run)) {}

ProgressQueue::~ProgressQueue() { close(); }

Handle ProgressQueue::push(Request req) {
    auto st = std::make_shared<TaskState>();
    {
        std::lock_guard lk(mu_);
        queue_.push_back(std::make_unique<Task>(Task{std::move(req), st}));
        if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
    }
    cv_.notify_all();
    return Handle(st);
}

void ProgressQueue::work() {
    std::unique_lock lk(mu_);
    for (;;) {
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        std::unique_ptr<Task> t = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
        lk.unlock();
        std::exception_ptr e;
        try {
            run_(t->req);
        } catch (...) {
            e = std::current_exception();
        }
        t->state->finish(e);
        lk.lock();
        busy_ = false;
        cv_.notify_all();
    }
}

void ProgressQueue::drain() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

void ProgressQueue::close() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
}

// ---- what the backends share (backend.h) -------------------------------------------------------

namespace backend {

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string seconds_str(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f s", s);
    return buf;
}

std::string rank_list(const std::vector<int>& r) {
    if (r.empty()) return "no rank";
    std::string s = r.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < r.size(); i++) {
        if (i) s += ", ";
        s += std::to_string(r[i]);
    }
    return s;
}

std::string counts_str(const std::vector<i64>& c) {
    std::string s = "[";
    for (size_t i = 0; i < c.size(); i++) {
        if (i) s += ", ";
        s += std::to_string(c[i]);
    }
    return s + "]";
}

std::string what_of(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        return x.what();
    } catch (...) {
        return "unknown exception";
    }
}

}  // namespace backend

}  // namespace px::comm
