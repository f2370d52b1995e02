// Interface-level parts of core/comm: handles, argument checks, the typed wrappers that turn
// each call into a Request for the backend, and the progress queue. The names of an operation's
// vocabulary are core/comm/request.cpp, the accounting core/comm/stats.cpp.
#include "core/comm/comm.h"

#include <cstdint>
#include <exception>
#include <numeric>

namespace px::comm {

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

}  // namespace px::comm
