// Communication: the Communicator interface that every backend implements (in-process threads,
// core/comm/inproc.h; MPI processes, core/comm/mpi.h; NCCL later), its errors and its handles.
// It includes the vocabulary of an operation (core/comm/request.h) and the accounting
// (core/comm/stats.h), which every user of a communicator speaks.
//
// Index
//   Algo, Dtype, Op       an operation's algorithm, element type and kind (core/comm/request.h)
//   Request               one operation as plain data: what a backend receives (request.h)
//   Traffic, CommStats    what operations cost one rank, per group (core/comm/stats.h)
//   StatRow, StatsBook    one rank's accounting of all its groups, as rows (stats.h)
//   CommError             a collective or message that failed: names it, its group and the ranks
//   Handle                an asynchronous operation: wait() completes it or throws its error
//   Communicator          rank, size, group; collectives, send/recv, async variants, split, abort
//   Decorator             a communicator around another, handing it every operation
//   ProgressQueue         for backends: async collectives in issue order on a thread of their own
//
// Collectives. Every rank of a group calls the same collectives in the same order; the k-th
// collective of a group on one rank meets the k-th on every other rank (its sequence number #k,
// counted from 1 per group). Calling a different collective, a different element count, dtype,
// algorithm or root at the same #k is an error on every rank that names both sides. Collectives
// are blocking: they return when this rank's output is complete and its input may be reused.
//
// Reducing collectives (all_reduce, reduce_scatter) sum element by element over ranks.
//   Algo::canonical: element i of the result is the canonical tree (core/base/numerics.h) over RANK
//     index of the contributions x_0[i] .. x_{p-1}[i]: a node of ranks [lo, hi) splits at
//     mid = lo + ceil((hi-lo)/2) and its value is node[lo, mid) + node[mid, hi). It does not
//     depend on arrival order, timing or chunking, and every rank gets the same bits. When each
//     rank contributes one node of a bigger block tree (the usual case: tp = 4 over 12 K-blocks
//     owns [0,3) [3,6) [6,9) [9,12)), this is exactly the single-device sum. Several partials
//     per rank (tp = 3 over 12 blocks) are combined above this with all_gather_v + the tree.
//     reduce_scatter's chunk r is bit for bit chunk r of the canonical all_reduce.
//     Algorithm: direct reduce-scatter (rank r gathers chunk r of every contribution and forms
//     its tree) then all-gather of the reduced chunks; 2(p-1)/p·n elements sent per rank.
//   Algo::ring: the classic ring (reduce-scatter then all-gather over p chunks, 2(p-1) steps).
//     Chunk c is summed sequentially starting at rank c+1 and ending at rank c (its owner), so
//     results may differ from canonical in the last bits; every rank still gets the same bits.
//     2(p-1)/p·n elements sent per rank. For fast mode only.
//   all_reduce_max: the same canonical tree with max (NaN wins); exact, order is irrelevant.
//
// Failures are never hangs. A rank that throws (under run_ranks) or calls abort(), a rank that
// does not arrive within the backend's timeout, or a mismatch, fails the job: every pending and
// every later operation on every rank throws CommError, whose message names the collective
// ("all_reduce #12"), the group ("'tp' (size 4)"), which ranks arrived and which are missing,
// and what to do. A failed job stays failed.
//
// Threads. One communicator is used by one thread at a time (async operations run on a progress
// thread of the backend, in issue order). Different communicators (dp, tp, pp of one rank) may
// be used from different threads.
#pragma once
#include "core/base/error.h"
#include "core/base/shapes.h"
#include "core/comm/request.h"
#include "core/comm/stats.h"

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace px::comm {

// ---- errors ----------------------------------------------------------------------------------

struct CommError : Error {
    using Error::Error;
};

// ---- asynchronous operations -----------------------------------------------------------------

// An operation in flight. wait() blocks until it completes (bounded by the backend's timeout)
// and throws CommError if it failed; afterwards the handle is empty. A handle destroyed while
// pending waits first (so a peer never touches a dead buffer); its error then surfaces at the
// next operation, because a failure fails the whole job.
class Handle {
public:
    struct State {
        virtual ~State() = default;
        virtual void wait() = 0;  // completes or throws; called at most once
        virtual bool test() = 0;  // true when wait() would not block
    };

    Handle() = default;
    explicit Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}
    Handle(Handle&& o) noexcept = default;
    Handle& operator=(Handle&& o) noexcept;  // waits on the pending operation it replaces
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle();

    void wait();                                        // complete; throw its error; then empty
    bool test() { return !state_ || state_->test(); }   // would wait() return at once?
    bool pending() const { return state_ != nullptr; }  // not yet waited

private:
    void wait_quietly() noexcept;
    std::shared_ptr<State> state_;
};

// ---- the communicator ------------------------------------------------------------------------

class Communicator {
public:
    virtual ~Communicator() = default;
    Communicator(const Communicator&) = delete;
    Communicator& operator=(const Communicator&) = delete;

    int rank() const { return rank_; }  // 0 .. size()-1 within the group
    int size() const { return size_; }
    const std::string& group() const { return group_; }  // "world", "dp", "tp", "pp", ...

    // Collectives. T is float, double or px::i64, and for those that do not add also std::uint16_t
    // or std::uint8_t (16- and 8-bit floats as bits: Dtype). Counts are elements.
    template <class T>
    void all_reduce(T* buf, i64 n, Algo algo = Algo::canonical);  // sum
    template <class T>
    void all_reduce_max(T* buf, i64 n);  // max
    // in (p·n_per_rank) -> out (n_per_rank) = chunk rank() of the sum; out may be in + rank()·n.
    template <class T>
    void reduce_scatter(T* out, const T* in, i64 n_per_rank, Algo algo = Algo::canonical);
    // in (n_per_rank) -> out (p·n_per_rank), rank order; in may be out + rank()·n_per_rank.
    template <class T>
    void all_gather(T* out, const T* in, i64 n_per_rank);
    // in (counts[rank()]) -> out (sum counts), rank order; counts equal on every rank.
    template <class T>
    void all_gather_v(T* out, const T* in, std::span<const i64> counts);
    template <class T>
    void broadcast(T* buf, i64 n, int root);  // buf (n) = root's buf
    // in (p·n_per_rank, chunk k for rank k) -> out (p·n_per_rank, chunk k from rank k).
    template <class T>
    void all_to_all(T* out, const T* in, i64 n_per_rank);
    // in: in_counts[k] elements for rank k, concatenated; out: out_counts[k] from rank k;
    // this rank's out_counts[k] must equal rank k's in_counts[rank()].
    template <class T>
    void all_to_all_v(T* out, std::span<const i64> out_counts, const T* in,
                      std::span<const i64> in_counts);
    void barrier();

    // Point to point. A send completes when the receiver has its data (no hidden buffering, as
    // with NCCL: a blocking send with no matching recv posted is an error at the timeout).
    // Messages between one (source, destination, tag) arrive in the order they were sent.
    template <class T>
    void send(const T* buf, i64 n, int dst, int tag = 0);
    template <class T>
    void recv(T* buf, i64 n, int src, int tag = 0);

    // Asynchronous variants: start now, complete at Handle::wait(); same rules, same order.
    template <class T>
    [[nodiscard]] Handle all_reduce_async(T* buf, i64 n, Algo algo = Algo::canonical);
    template <class T>
    [[nodiscard]] Handle reduce_scatter_async(T* out, const T* in, i64 n_per_rank,
                                              Algo algo = Algo::canonical);
    template <class T>
    [[nodiscard]] Handle all_gather_async(T* out, const T* in, i64 n_per_rank);
    template <class T>
    [[nodiscard]] Handle broadcast_async(T* buf, i64 n, int root);
    template <class T>
    [[nodiscard]] Handle all_to_all_async(T* out, const T* in, i64 n_per_rank);
    template <class T>
    [[nodiscard]] Handle send_async(const T* buf, i64 n, int dst, int tag = 0);
    template <class T>
    [[nodiscard]] Handle recv_async(T* buf, i64 n, int src, int tag = 0);

    // Like MPI_Comm_split: a collective of this group; ranks with the same color form a new
    // group named `name`, ordered by (key, rank in this group). color < 0: nullptr, no group.
    virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;
    // Fail the job: every pending and later operation on every rank throws CommError(reason).
    virtual void abort(const std::string& reason) = 0;
    // The job's failure message once it has failed (any rank's abort, a timeout, a mismatch),
    // else "". Never blocks: a rank that is not communicating (stalled, core/train/faults.h)
    // polls it to learn that the others gave up on it.
    virtual std::string failure() = 0;
    // Whether each rank is a process of its own (MPI), so that one can die alone; false for
    // ranks that are threads of one process (in-process).
    virtual bool ranks_are_processes() const = 0;

    CommStats stats() const { return book_->stats(group_); }          // this group, this rank
    std::vector<StatRow> stat_rows() const { return book_->rows(); }  // all groups, this rank
    const std::shared_ptr<StatsBook>& stats_book() const { return book_; }

protected:
    Communicator(int rank, int size, std::string group, std::shared_ptr<StatsBook> book);

    // What a backend implements. Requests reaching them are checked for this rank's own
    // consistency (counts, ranges, overlaps); matching across ranks is the backend's job.
    virtual void run(Request& req) = 0;     // blocking
    virtual Handle start(Request req) = 0;  // returns at once
    // Another communicator's backend, for decorators (Decorator).
    static void run_on(Communicator& c, Request& req) { c.run(req); }
    static Handle start_on(Communicator& c, Request req) { return c.start(std::move(req)); }
    void record(const Request& req, double seconds) { book_->record(group_, req, seconds); }

private:
    void check(const Request& req) const;  // throws CommError naming the argument

    int rank_, size_;
    std::string group_;
    std::shared_ptr<StatsBook> book_;
};

// ---- decorators ------------------------------------------------------------------------------

// A communicator around another that hands it every operation: the base of wrappers that act on
// some requests and pass the rest on (a tracer; a test's planted bug; the
// runner's RunHooks::wrap_group puts one around a rank's group). Rank, size, group name and the
// accounting are the wrapped one's.
class Decorator : public Communicator {
public:
    explicit Decorator(std::unique_ptr<Communicator> inner);
    Communicator& inner() { return *inner_; }

    std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
        return inner_->split(color, key, std::move(name));
    }
    void abort(const std::string& reason) override { inner_->abort(reason); }
    std::string failure() override { return inner_->failure(); }
    bool ranks_are_processes() const override { return inner_->ranks_are_processes(); }

protected:
    void run(Request& req) override { run_on(*inner_, req); }
    Handle start(Request req) override { return start_on(*inner_, std::move(req)); }

private:
    std::unique_ptr<Communicator> inner_;
};

// ---- for backends ----------------------------------------------------------------------------

// The progress thread of one communicator: its async collectives run one at a time, in issue
// order, on a thread of their own (started at the first push), so that a Handle completes while
// the caller computes. A blocking collective calls drain() first: the earlier async ones hold the
// earlier sequence numbers.
class ProgressQueue {
public:
    explicit ProgressQueue(std::function<void(const Request&)> run);
    ~ProgressQueue();  // close()
    ProgressQueue(const ProgressQueue&) = delete;
    ProgressQueue& operator=(const ProgressQueue&) = delete;

    Handle push(Request req);  // returns at once; the Handle completes when run(req) has
    void drain();              // returns when everything pushed has run
    void close();              // runs what is queued, then joins the thread (idempotent)

private:
    struct Task;
    void work();

    std::function<void(const Request&)> run_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::unique_ptr<Task>> queue_;
    bool busy_ = false, stop_ = false;
    std::thread worker_;
};

}  // namespace px::comm
