// MPI backend (see core/comm/mpi.h for how a collective runs and how failures spread).
//
// All data moves as bytes with nonblocking point-to-point calls that are polled, never waited
// on, so that every wait is bounded by the timeout and by the job's failure channel. The
// arithmetic of the reducing collectives is the in-process backend's (core/comm/backend.h).
#include "core/comm/mpi.h"

#include "core/comm/backend.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

namespace px::comm {
namespace mpi {

using namespace backend;

// ---- MPI errors ------------------------------------------------------------------------------

// Every MPI call goes through PX_MPI: a failing call becomes a CommError naming the call, where
// it was made and the rank (MPI_ERRORS_RETURN is set on every communicator we use).
void check_mpi(int rc, const char* call, const char* file, int line, int rank) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int len = 0;
    MPI_Error_string(rc, text, &len);
    std::string msg = call;
    msg += " failed on rank " + std::to_string(rank) + " (" + file + ":" + std::to_string(line) +
           "): " + std::string(text, static_cast<size_t>(len)) +
           ". Check that every rank runs the same program and the same config.";
    throw CommError(msg);
}
#define PX_MPI(call, rank) ::px::comm::mpi::check_mpi((call), #call, __FILE__, __LINE__, (rank))

constexpr int kTagHeader = 1;  // collectives' header exchange
constexpr int kTagData = 2;    // collectives' data
constexpr int kTagFail = 3;    // the failure channel (a message text)
constexpr int kMaxNotice = 4000;
constexpr i64 kPiece = i64{1} << 30;  // bytes per MPI message: counts are ints

// Buffers of sends that were still in flight when an operation was abandoned: MPI may read them
// later, so they are kept (a few bytes per failure) until the process ends.
std::mutex g_keep_mu;
std::deque<std::shared_ptr<void>> g_keep;
void keep_alive(std::shared_ptr<void> p) {
    std::lock_guard lk(g_keep_mu);
    g_keep.push_back(std::move(p));
}

// ---- the failure channel, shared by a world communicator and its splits ----------------------

struct Shared {
    MPI_Comm control = MPI_COMM_NULL;  // a duplicate of MPI_COMM_WORLD: failure notices only
    int world_rank = 0, world_size = 1;
    double timeout_s = 60;
    std::shared_ptr<StatsBook> book;

    std::mutex mu;
    bool failed = false;
    std::string failure;
    MPI_Request notice = MPI_REQUEST_NULL;  // the posted receive of a notice from any rank
    std::vector<char> notice_buf = std::vector<char>(kMaxNotice);

    // The control communicator is never freed: a notice still in flight would otherwise be
    // matched by a later communicator that MPI gives the same context id.
    ~Shared() {
        if (notice != MPI_REQUEST_NULL) {
            MPI_Cancel(&notice);
            MPI_Wait(&notice, MPI_STATUS_IGNORE);
        }
    }

    Clock::time_point deadline() const {
        return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(timeout_s));
    }

    // The job's failure, "" while it has none; checks for a notice from another rank.
    std::string poll() {
        std::lock_guard lk(mu);
        if (!failed && notice != MPI_REQUEST_NULL) {
            int done = 0;
            MPI_Status st;
            if (MPI_Test(&notice, &done, &st) == MPI_SUCCESS && done) {
                int len = 0;
                MPI_Get_count(&st, MPI_CHAR, &len);
                failed = true;
                failure = std::string(notice_buf.data(), static_cast<size_t>(std::max(len, 0)));
            }
        }
        return failed ? failure : std::string();
    }

    // The first failure wins; every other rank hears of it at its next poll.
    void fail(const std::string& why) {
        std::lock_guard lk(mu);
        if (failed) return;
        failed = true;
        failure = why;
        auto text = std::make_shared<std::string>(why.substr(0, kMaxNotice));
        keep_alive(text);
        for (int k = 0; k < world_size; k++) {
            if (k == world_rank) continue;
            MPI_Request r = MPI_REQUEST_NULL;
            if (MPI_Isend(text->data(), static_cast<int>(text->size()), MPI_CHAR, k, kTagFail,
                          control, &r) == MPI_SUCCESS)
                MPI_Request_free(&r);
        }
    }
};

CommError abandoned(int rank, const std::string& what, const std::string& failure) {
    return CommError("rank " + std::to_string(rank) + ": " + what +
                     " was abandoned because the job failed: " + failure);
}

// ---- polling ---------------------------------------------------------------------------------

// Requests in flight, with what each one is (a send or a recv, and the peer), so that a wait that
// gives up can name who is missing and cancel what it posted.
struct Pending {
    std::vector<MPI_Request> reqs;
    std::vector<int> peer;
    std::vector<char> is_recv;
    std::vector<i64> bytes;      // posted length of each piece
    std::shared_ptr<void> keep;  // buffers of the sends (headers) to keep if abandoned

    void add(MPI_Request r, int p, bool recv, i64 len) {
        reqs.push_back(r);
        peer.push_back(p);
        is_recv.push_back(recv ? 1 : 0);
        bytes.push_back(len);
    }
    void post_send(const void* buf, i64 bytes, int p, int tag, MPI_Comm c, int me) {
        const char* b = static_cast<const char*>(buf);
        i64 off = 0;
        do {
            const i64 len = std::min(kPiece, bytes - off);
            MPI_Request r;
            PX_MPI(MPI_Isend(b + off, static_cast<int>(len), MPI_BYTE, p, tag, c, &r), me);
            add(r, p, false, len);
            off += len;
        } while (off < bytes);
    }
    void post_recv(void* buf, i64 bytes, int p, int tag, MPI_Comm c, int me) {
        char* b = static_cast<char*>(buf);
        i64 off = 0;
        do {
            const i64 len = std::min(kPiece, bytes - off);
            MPI_Request r;
            PX_MPI(MPI_Irecv(b + off, static_cast<int>(len), MPI_BYTE, p, tag, c, &r), me);
            add(r, p, true, len);
            off += len;
        } while (off < bytes);
    }
    // Peers of the requests not yet complete, each once, sorted.
    std::vector<int> missing() const {
        std::vector<int> m;
        for (size_t i = 0; i < reqs.size(); i++)
            if (reqs[i] != MPI_REQUEST_NULL) m.push_back(peer[i]);
        std::sort(m.begin(), m.end());
        m.erase(std::unique(m.begin(), m.end()), m.end());
        return m;
    }
    // Gives up: receives are cancelled (so nothing writes into the caller's buffers later),
    // sends released to complete on their own.
    void cancel() {
        for (size_t i = 0; i < reqs.size(); i++) {
            if (reqs[i] == MPI_REQUEST_NULL) continue;
            if (is_recv[i]) {
                MPI_Cancel(&reqs[i]);
                MPI_Wait(&reqs[i], MPI_STATUS_IGNORE);
            } else {
                MPI_Request_free(&reqs[i]);
            }
        }
        if (keep) keep_alive(std::move(keep));
        reqs.clear();
        peer.clear();
        is_recv.clear();
        bytes.clear();
    }
};

enum class Outcome { done, timeout, failed };

// Polls until every request completes, the deadline passes or the job fails (then the failure
// is in *failure). Sleeps a little between polls: ranks may share cores (--oversubscribe).
// A completed receive whose byte count differs from what was posted is reported by name.
Outcome poll(Shared& sh, Pending& p, Clock::time_point deadline, std::string* failure, int me,
             const char* what_short) {
    int idle = 0;
    for (;;) {
        bool all = true;
        for (size_t i = 0; i < p.reqs.size(); i++) {
            if (p.reqs[i] == MPI_REQUEST_NULL) continue;
            int done = 0;
            MPI_Status st;
            const int rc = MPI_Test(&p.reqs[i], &done, &st);
            if (rc != MPI_SUCCESS) {
                p.reqs[i] = MPI_REQUEST_NULL;
                char text[MPI_MAX_ERROR_STRING] = {};
                int len = 0;
                MPI_Error_string(rc, text, &len);
                throw CommError(
                    std::string(what_short) + ": MPI_Test failed on rank " + std::to_string(me) +
                    " for the message " + (p.is_recv[i] ? "from" : "to") + " rank " +
                    std::to_string(p.peer[i]) + ": " + std::string(text, static_cast<size_t>(len)) +
                    " (a message longer than expected means the ranks disagree on "
                    "its size)");
            }
            if (!done) {
                all = false;
                continue;
            }
            if (p.is_recv[i]) {  // a shorter message than posted completes too: check its size
                int got = 0;
                MPI_Get_count(&st, MPI_BYTE, &got);
                if (got != p.bytes[i])
                    throw CommError(std::string(what_short) + ": rank " + std::to_string(me) +
                                    " received " + std::to_string(got) + " bytes from rank " +
                                    std::to_string(p.peer[i]) + " where it expected " +
                                    std::to_string(p.bytes[i]) +
                                    " (the ranks disagree on the message's size)");
            }
        }
        if (all) return Outcome::done;
        const std::string f = sh.poll();
        if (!f.empty()) {
            *failure = f;
            return Outcome::failed;
        }
        if (Clock::now() >= deadline) return Outcome::timeout;
        if (++idle < 64)
            std::this_thread::yield();
        else
            std::this_thread::sleep_for(std::chrono::microseconds(idle < 1000 ? 20 : 200));
    }
}

// ---- the arithmetic (the in-process backend's orders, element by element) --------------------

// ---- headers ---------------------------------------------------------------------------------

// What a rank tells each peer about its #k. Fields 7 and 8 are per destination (all_to_all_v).
enum Field {
    kSeq,
    kOp,
    kDtype,
    kAlgo,
    kN,
    kRoot,
    kCounts,
    kPairIn,
    kPairOut,
    kColor,
    kName,
    kFields
};
using Header = std::array<i64, kFields>;

i64 digest(const std::vector<i64>& v) {
    std::uint64_t h = 1469598103934665603ull;
    for (i64 x : v) h = (h ^ static_cast<std::uint64_t>(x)) * 1099511628211ull;
    return static_cast<i64>(h >> 1);
}

i64 digest(const std::string& s) {
    std::uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return static_cast<i64>(h >> 1);
}

Header header_for(const Request& q, i64 seq, int dst) {
    Header h{};
    h[kSeq] = seq;
    h[kOp] = static_cast<i64>(q.op);
    h[kDtype] = static_cast<i64>(q.dtype);
    h[kAlgo] = static_cast<i64>(q.algo);
    h[kN] = q.n;
    h[kRoot] = q.peer;
    h[kCounts] = digest(q.counts);
    if (q.op == Op::all_to_all_v) {
        h[kPairIn] = q.counts[static_cast<size_t>(dst)];
        h[kPairOut] = q.out_counts[static_cast<size_t>(dst)];
    }
    h[kColor] = q.color;
    h[kName] = q.color >= 0 ? digest(q.name) : 0;
    return h;
}

// ---- the communicator ------------------------------------------------------------------------

class MpiComm;

// An async send or recv: posted at start, polled at wait.
struct MessageState final : Handle::State {
    MpiComm* comm = nullptr;
    Request req;
    Pending pending;
    Clock::time_point t0;
    void wait() override;
    bool test() override {
        for (MPI_Request& r : pending.reqs) {
            if (r == MPI_REQUEST_NULL) continue;
            int done = 0;
            if (MPI_Test(&r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) return true;
            if (!done) return false;
        }
        return true;
    }
};

class MpiComm final : public Communicator {
public:
    // Takes ownership of `base` (a communicator of this group's ranks) and duplicates it twice.
    MpiComm(std::shared_ptr<Shared> sh, MPI_Comm base, const std::string& name)
        : Communicator(comm_rank(base), comm_size(base), name, sh->book), sh_(std::move(sh)) {
        const int me = sh_->world_rank;
        PX_MPI(MPI_Comm_set_errhandler(base, MPI_ERRORS_RETURN), me);
        PX_MPI(MPI_Comm_dup(base, &coll_), me);
        PX_MPI(MPI_Comm_dup(base, &p2p_), me);
        PX_MPI(MPI_Comm_set_errhandler(coll_, MPI_ERRORS_RETURN), me);
        PX_MPI(MPI_Comm_set_errhandler(p2p_, MPI_ERRORS_RETURN), me);
        // World ranks of the group, for messages.
        MPI_Group g, wg;
        PX_MPI(MPI_Comm_group(base, &g), me);
        PX_MPI(MPI_Comm_group(MPI_COMM_WORLD, &wg), me);
        std::vector<int> mine(static_cast<size_t>(size()));
        for (int k = 0; k < size(); k++) mine[static_cast<size_t>(k)] = k;
        world_ranks_.resize(mine.size());
        PX_MPI(MPI_Group_translate_ranks(g, size(), mine.data(), wg, world_ranks_.data()), me);
        MPI_Group_free(&g);
        MPI_Group_free(&wg);
        MPI_Comm_free(&base);
    }

    ~MpiComm() override {
        queue_.close();
        // After a failure, messages of abandoned operations may still be queued on these
        // communicators; freed, their context ids could be reused by a later world and match
        // them. So a failed job's communicators stay allocated until MPI_Finalize.
        if (!sh_->poll().empty()) return;
        MPI_Comm_free(&coll_);
        MPI_Comm_free(&p2p_);
    }

    std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
        Request req;
        req.op = Op::split;
        req.color = color;
        req.key = key;
        req.name = std::move(name);
        if (req.color >= 0 && req.name.empty())
            throw CommError("split on rank " + std::to_string(rank()) + " of " + describe() +
                            ": the new group needs a name (\"dp\", \"tp\", ...)");
        queue_.drain();
        MPI_Comm out = MPI_COMM_NULL;
        collective(req, &out);
        if (out == MPI_COMM_NULL) return nullptr;
        return std::make_unique<MpiComm>(sh_, out, req.name);
    }

    void abort(const std::string& reason) override {
        sh_->fail("rank " + std::to_string(rank()) + " of " + describe() +
                  " called abort: " + reason);
    }

    std::string failure() override { return sh_->poll(); }
    bool ranks_are_processes() const override { return true; }

    // "group 'tp' (size 2, world ranks 2, 3)"; the world needs no mapping.
    std::string describe() const {
        std::string s = "group '" + group() + "' (size " + std::to_string(size());
        bool identity = true;
        for (int k = 0; k < size(); k++) identity = identity && world_ranks_[k] == k;
        if (!identity || size() != sh_->world_size) {
            s += size() == 1 ? ", world rank " : ", world ranks ";
            for (int k = 0; k < size(); k++) {
                if (k) s += ", ";
                s += std::to_string(world_ranks_[k]);
            }
        }
        return s + ")";
    }

    // rank_list plus world ranks when they differ: "rank 2 (world rank 6)".
    std::string who(const std::vector<int>& r) const {
        std::string s = rank_list(r);
        bool same = true;
        for (int k : r) same = same && world_ranks_[k] == k;
        if (same) return s;
        s += r.size() == 1 ? " (world rank " : " (world ranks ";
        for (size_t i = 0; i < r.size(); i++) {
            if (i) s += ", ";
            s += std::to_string(world_ranks_[r[i]]);
        }
        return s + ")";
    }

    Shared& shared() { return *sh_; }
    MPI_Comm p2p() const { return p2p_; }

    std::string p2p_what(const Request& q) const {
        const bool send = q.op == Op::send;
        return std::string(send ? "send to rank " : "recv from rank ") + std::to_string(q.peer) +
               " (tag " + std::to_string(q.tag) + ", " + std::to_string(q.n) + " " +
               dtype_name(q.dtype) + ") on rank " + std::to_string(rank()) + " of " + describe();
    }

    void post_p2p(const Request& q, Pending& p) {
        const std::string f = sh_->poll();
        if (!f.empty()) throw abandoned(rank(), p2p_what(q), f);
        const i64 bytes = q.n * dtype_size(q.dtype);
        if (q.op == Op::send) {
            const char* b = static_cast<const char*>(q.in);
            i64 off = 0;
            do {  // synchronous sends: complete when the receiver has matched them
                const i64 len = std::min(kPiece, bytes - off);
                MPI_Request r;
                PX_MPI(
                    MPI_Issend(b + off, static_cast<int>(len), MPI_BYTE, q.peer, q.tag, p2p_, &r),
                    sh_->world_rank);
                p.add(r, q.peer, false, len);
                off += len;
            } while (off < bytes);
        } else {
            p.post_recv(q.out, bytes, q.peer, q.tag, p2p_, sh_->world_rank);
        }
    }

    void wait_p2p(const Request& q, Pending& p, Clock::time_point t0) {
        std::string f;
        const std::string what = p2p_what(q);
        Outcome o;
        try {
            o = poll(*sh_, p, sh_->deadline(), &f, sh_->world_rank, what.c_str());
        } catch (const CommError& e) {
            p.cancel();
            const std::string msg = std::string(e.what()) +
                                    ". A recv must expect exactly what its matching send sends.";
            sh_->fail(msg);
            throw CommError(msg);
        }
        if (o == Outcome::failed) {
            p.cancel();
            throw abandoned(rank(), what, f);
        }
        if (o == Outcome::timeout) {
            p.cancel();
            const char* partner = q.op == Op::send ? "recv" : "send";
            const std::string msg =
                what + ": " + who({q.peer}) + " did not post a matching " + partner + " within " +
                seconds_str(sh_->timeout_s) +
                ". Sends and recvs pair up by (source, destination, tag), in order; look for a "
                "missing " +
                partner + " or a wrong tag, or raise layout.timeout_s if rank " +
                std::to_string(q.peer) + " is only slow.";
            sh_->fail(msg);
            throw CommError(msg);
        }
        record(q, since(t0));
    }

protected:
    void run(Request& req) override {
        if (is_p2p(req.op)) {
            const auto t0 = Clock::now();
            Pending p;
            post_p2p(req, p);
            wait_p2p(req, p, t0);
            return;
        }
        queue_.drain();  // earlier async collectives hold earlier sequence numbers
        collective(req, nullptr);
    }

    Handle start(Request req) override {
        if (is_p2p(req.op)) {
            auto st = std::make_shared<MessageState>();
            st->comm = this;
            st->t0 = Clock::now();
            st->req = std::move(req);
            post_p2p(st->req, st->pending);
            return Handle(st);
        }
        return queue_.push(std::move(req));
    }

private:
    friend struct MessageState;

    static int comm_rank(MPI_Comm c) {
        int r = 0;
        PX_MPI(MPI_Comm_rank(c, &r), -1);
        return r;
    }
    static int comm_size(MPI_Comm c) {
        int s = 0;
        PX_MPI(MPI_Comm_size(c, &s), -1);
        return s;
    }

    // Waits for p, or fails the job naming the collective and whoever did not deliver.
    void wait_for(Pending& p, const std::string& what, const char* phase) {
        std::string f;
        Outcome o;
        try {
            o = poll(*sh_, p, sh_->deadline(), &f, sh_->world_rank, what.c_str());
        } catch (const CommError& e) {
            p.cancel();
            sh_->fail(e.what());
            throw;
        }
        if (o == Outcome::done) return;
        const std::vector<int> missing = p.missing();
        p.cancel();
        if (o == Outcome::failed) throw abandoned(rank(), what, f);
        std::vector<int> here;
        for (int k = 0; k < size(); k++)
            if (std::find(missing.begin(), missing.end(), k) == missing.end()) here.push_back(k);
        std::string msg = what + ": " + who(missing);
        if (std::string(phase) == "header") {
            msg += " did not arrive within " + seconds_str(sh_->timeout_s) + " (" +
                   rank_list(here) + " did). Every rank of '" + group() +
                   "' must call the same collectives in the same order: look for a rank that "
                   "skipped this call, returned early or took another branch; if " +
                   rank_list(missing) + (missing.size() == 1 ? " is" : " are") +
                   " only slow, raise layout.timeout_s.";
        } else {
            msg += ": the data of " + rank_list(missing) + " did not arrive within " +
                   seconds_str(sh_->timeout_s) +
                   " although every rank had arrived; a process may have died or stalled.";
        }
        sh_->fail(msg);
        throw CommError(msg);
    }

    // The header exchange's verdict on what the ranks passed: "" when they agree.
    std::string check_match(const std::vector<Header>& h, const Request& me,
                            const std::string& what) const {
        const int p = size();
        const std::string advice = " Every rank of '" + group() +
                                   "' must make the same call at the same point; look for a rank "
                                   "that took another branch or skipped a call.";
        auto disagree = [&](const std::string& about, auto text_of) -> std::string {
            std::vector<std::pair<std::string, std::vector<int>>> by;
            for (int k = 0; k < p; k++) {
                const std::string v = text_of(h[static_cast<size_t>(k)]);
                auto it =
                    std::find_if(by.begin(), by.end(), [&](const auto& b) { return b.first == v; });
                if (it == by.end())
                    by.push_back({v, {k}});
                else
                    it->second.push_back(k);
            }
            if (by.size() == 1) return "";
            std::string m = what + ": the ranks disagree on " + about + ": ";
            for (size_t i = 0; i < by.size(); i++) {
                if (i) m += ", ";
                m += rank_list(by[i].second) + " " + by[i].first;
            }
            return m + "." + advice;
        };
        std::string m = disagree("the collective", [](const Header& x) {
            return std::string("called ") + op_name(static_cast<Op>(x[kOp])) + " #" +
                   std::to_string(x[kSeq]);
        });
        if (!m.empty()) return m;
        m = disagree("the element type", [](const Header& x) {
            return std::string("passed ") + dtype_name(static_cast<Dtype>(x[kDtype]));
        });
        if (!m.empty()) return m;
        if (me.op == Op::all_reduce || me.op == Op::reduce_scatter) {
            m = disagree("the algorithm", [](const Header& x) {
                return std::string("asked for ") + algo_name(static_cast<Algo>(x[kAlgo]));
            });
            if (!m.empty()) return m;
        }
        switch (me.op) {
            case Op::all_reduce:
            case Op::all_reduce_max:
            case Op::reduce_scatter:
            case Op::all_gather:
            case Op::broadcast:
            case Op::all_to_all:
                m = disagree("the element count",
                             [](const Header& x) { return "passed n = " + std::to_string(x[kN]); });
                if (!m.empty() || me.op != Op::broadcast) return m;
                return disagree("the root", [](const Header& x) {
                    return "passed root " + std::to_string(x[kRoot]);
                });
            case Op::all_gather_v: {
                const i64 mine = digest(me.counts);
                std::vector<int> other;
                for (int k = 0; k < p; k++)
                    if (h[static_cast<size_t>(k)][kCounts] != mine) other.push_back(k);
                if (other.empty()) return "";
                return what + ": the ranks disagree on the counts: rank " + std::to_string(rank()) +
                       " passed counts " + counts_str(me.counts) + ", " + rank_list(other) +
                       " passed others." + advice;
            }
            case Op::all_to_all_v:
                for (int k = 0; k < p; k++)
                    if (h[static_cast<size_t>(k)][kPairIn] != me.out_counts[static_cast<size_t>(k)])
                        return what + ": rank " + std::to_string(rank()) + " expects out_counts[" +
                               std::to_string(k) +
                               "] = " + std::to_string(me.out_counts[static_cast<size_t>(k)]) +
                               " elements from rank " + std::to_string(k) + ", but rank " +
                               std::to_string(k) + " sends in_counts[" + std::to_string(rank()) +
                               "] = " + std::to_string(h[static_cast<size_t>(k)][kPairIn]) + "." +
                               advice;
                return "";
            case Op::split:
                for (int k = 0; k < p; k++) {
                    const Header& x = h[static_cast<size_t>(k)];
                    if (me.color >= 0 && x[kColor] == me.color && x[kName] != digest(me.name))
                        return what + ": ranks " + std::to_string(rank()) + " and " +
                               std::to_string(k) + " join color " + std::to_string(me.color) +
                               " under different names (this rank: '" + me.name + "')." + advice;
                }
                return "";
            case Op::send:
            case Op::recv:
            case Op::barrier:
                return "";
        }
        return "";
    }

    // One collective on the calling thread: header exchange, then the data, then accounting.
    void collective(const Request& req, MPI_Comm* split_out) {
        const int p = size(), r = rank(), me = sh_->world_rank;
        const i64 seq = ++seq_;
        const auto t0 = Clock::now();
        const std::string what =
            std::string(op_name(req.op)) + " #" + std::to_string(seq) + " in " + describe();
        {
            const std::string f = sh_->poll();
            if (!f.empty()) throw abandoned(r, what, f);
        }
        // 1. Headers: every rank tells every other what it called.
        if (p > 1) {
            auto out = std::make_shared<std::vector<Header>>(static_cast<size_t>(p));
            std::vector<Header> in(static_cast<size_t>(p));
            Pending hp;
            hp.keep = out;
            for (int k = 0; k < p; k++) {
                if (k == r) continue;
                (*out)[static_cast<size_t>(k)] = header_for(req, seq, k);
                hp.post_recv(&in[static_cast<size_t>(k)], sizeof(Header), k, kTagHeader, coll_, me);
                hp.post_send(&(*out)[static_cast<size_t>(k)], sizeof(Header), k, kTagHeader, coll_,
                             me);
            }
            wait_for(hp, what, "header");
            // What peer k sent us describes its own call; our own entry, as it would read to k.
            in[static_cast<size_t>(r)] = header_for(req, seq, r);
            const std::string mismatch = check_match(in, req, what);
            if (!mismatch.empty()) {
                sh_->fail(mismatch);
                throw CommError(mismatch);
            }
        }
        // 2. Data.
        if (req.op == Op::split) {
            MPI_Comm nc = MPI_COMM_NULL;
            PX_MPI(MPI_Comm_split(coll_, req.color < 0 ? MPI_UNDEFINED : req.color, req.key, &nc),
                   me);
            *split_out = nc;
        } else if (p > 1) {
            switch (req.dtype) {
                case Dtype::f32:
                    data<float>(req, what);
                    break;
                case Dtype::f64:
                    data<double>(req, what);
                    break;
                case Dtype::i64:
                    data<i64>(req, what);
                    break;
            }
        } else {
            local(req);
        }
        record(req, since(t0));
    }

    // A group of one: the output is the input.
    static void local(const Request& q) {
        const i64 e = dtype_size(q.dtype);
        i64 n = q.n;
        if (q.op == Op::all_gather_v || q.op == Op::all_to_all_v)
            n = q.counts.empty() ? 0 : q.counts[0];
        if (q.op == Op::barrier || q.op == Op::broadcast || q.op == Op::all_reduce ||
            q.op == Op::all_reduce_max)
            return;
        if (n > 0 && q.out != q.in) std::memmove(q.out, q.in, static_cast<size_t>(n * e));
    }

    template <class T>
    void data(const Request& q, const std::string& what) {
        const int p = size(), r = rank(), me = sh_->world_rank;
        const i64 e = sizeof(T);
        const T* in = static_cast<const T*>(q.in);
        T* out = static_cast<T*>(q.out);
        const i64 n = q.n;
        auto lo = [&](int c) { return chunk_lo(n, p, c); };
        auto wrap = [&](int c) { return ((c % p) + p) % p; };
        switch (q.op) {
            case Op::all_reduce:
            case Op::all_reduce_max: {
                if (q.op == Op::all_reduce && q.algo == Algo::ring) {
                    ring_reduce_scatter<T>(
                        out, [&](int c) { return lo(c); }, what);
                    // All-gather: at step s rank r forwards chunk r-s to r+1.
                    for (int s = 0; s < p - 1; s++) {
                        const int cs = wrap(r - s), cr = wrap(r - 1 - s);
                        Pending pd;
                        pd.post_recv(out + lo(cr), (lo(cr + 1) - lo(cr)) * e, wrap(r - 1), kTagData,
                                     coll_, me);
                        pd.post_send(out + lo(cs), (lo(cs + 1) - lo(cs)) * e, wrap(r + 1), kTagData,
                                     coll_, me);
                        wait_for(pd, what, "data");
                    }
                    return;
                }
                // Canonical: chunk r of every rank, the tree here, then to every rank.
                const i64 len = lo(r + 1) - lo(r);
                std::vector<T> rows(static_cast<size_t>(p * len));
                {
                    Pending pd;
                    for (int k = 0; k < p; k++) {
                        if (k == r) continue;
                        pd.post_recv(rows.data() + k * len, len * e, k, kTagData, coll_, me);
                        pd.post_send(in + lo(k), (lo(k + 1) - lo(k)) * e, k, kTagData, coll_, me);
                    }
                    std::copy(in + lo(r), in + lo(r + 1), rows.data() + r * len);
                    wait_for(pd, what, "data");
                }
                if (q.op == Op::all_reduce_max)
                    tree_rows<T, true>(rows.data(), 0, p, len);
                else
                    tree_rows<T, false>(rows.data(), 0, p, len);
                std::copy(rows.data(), rows.data() + len, out + lo(r));
                Pending pd;
                for (int k = 0; k < p; k++) {
                    if (k == r) continue;
                    pd.post_recv(out + lo(k), (lo(k + 1) - lo(k)) * e, k, kTagData, coll_, me);
                    pd.post_send(out + lo(r), len * e, k, kTagData, coll_, me);
                }
                wait_for(pd, what, "data");
                return;
            }
            case Op::reduce_scatter: {
                if (q.algo == Algo::ring) {
                    std::vector<T> work(in, in + p * n);
                    ring_reduce_scatter<T>(
                        work.data(), [&](int c) { return c * n; }, what);
                    std::copy(work.data() + r * n, work.data() + (r + 1) * n, out);
                    return;
                }
                std::vector<T> rows(static_cast<size_t>(p * n));
                Pending pd;
                for (int k = 0; k < p; k++) {
                    if (k == r) continue;
                    pd.post_recv(rows.data() + k * n, n * e, k, kTagData, coll_, me);
                    pd.post_send(in + k * n, n * e, k, kTagData, coll_, me);
                }
                std::copy(in + r * n, in + (r + 1) * n, rows.data() + r * n);
                wait_for(pd, what, "data");
                tree_rows<T, false>(rows.data(), 0, p, n);
                std::copy(rows.data(), rows.data() + n, out);
                return;
            }
            case Op::all_gather: {
                Pending pd;
                for (int k = 0; k < p; k++) {
                    if (k == r) continue;
                    pd.post_recv(out + k * n, n * e, k, kTagData, coll_, me);
                    pd.post_send(in, n * e, k, kTagData, coll_, me);
                }
                if (in != out + r * n) std::copy(in, in + n, out + r * n);
                wait_for(pd, what, "data");
                return;
            }
            case Op::all_gather_v: {
                Pending pd;
                i64 off = 0, mine = 0;
                for (int k = 0; k < p; k++) {
                    const i64 c = q.counts[static_cast<size_t>(k)];
                    if (k == r)
                        mine = off;
                    else {
                        pd.post_recv(out + off, c * e, k, kTagData, coll_, me);
                        pd.post_send(in, q.counts[static_cast<size_t>(r)] * e, k, kTagData, coll_,
                                     me);
                    }
                    off += c;
                }
                if (in != out + mine)
                    std::copy(in, in + q.counts[static_cast<size_t>(r)], out + mine);
                wait_for(pd, what, "data");
                return;
            }
            case Op::broadcast: {
                Pending pd;
                if (r == q.peer) {
                    for (int k = 0; k < p; k++)
                        if (k != r) pd.post_send(out, n * e, k, kTagData, coll_, me);
                } else {
                    pd.post_recv(out, n * e, q.peer, kTagData, coll_, me);
                }
                wait_for(pd, what, "data");
                return;
            }
            case Op::all_to_all: {
                Pending pd;
                for (int k = 0; k < p; k++) {
                    if (k == r) continue;
                    pd.post_recv(out + k * n, n * e, k, kTagData, coll_, me);
                    pd.post_send(in + k * n, n * e, k, kTagData, coll_, me);
                }
                std::copy(in + r * n, in + (r + 1) * n, out + r * n);
                wait_for(pd, what, "data");
                return;
            }
            case Op::all_to_all_v: {
                Pending pd;
                i64 in_off = 0, out_off = 0, my_in = 0, my_out = 0;
                for (int k = 0; k < p; k++) {
                    const i64 ci = q.counts[static_cast<size_t>(k)];
                    const i64 co = q.out_counts[static_cast<size_t>(k)];
                    if (k == r) {
                        my_in = in_off;
                        my_out = out_off;
                    } else {
                        pd.post_recv(out + out_off, co * e, k, kTagData, coll_, me);
                        pd.post_send(in + in_off, ci * e, k, kTagData, coll_, me);
                    }
                    in_off += ci;
                    out_off += co;
                }
                std::copy(in + my_in, in + my_in + q.counts[static_cast<size_t>(r)], out + my_out);
                wait_for(pd, what, "data");
                return;
            }
            case Op::barrier:  // the header exchange was the barrier
            case Op::send:
            case Op::recv:
            case Op::split:
                return;
        }
    }

    // The ring's reduce-scatter phase on buf (chunk c at [at(c), at(c+1))): chunk c is summed
    // x_{c+1} + x_{c+2} + ... + x_c, left to right, as it travels from rank c+1 to rank c; at
    // step s rank r sends chunk r-1-s to r+1 and adds its own part to chunk r-2-s from r-1.
    // Afterwards buf's chunk r holds the sum.
    template <class T, class At>
    void ring_reduce_scatter(T* buf, At at, const std::string& what) {
        const int p = size(), r = rank(), me = sh_->world_rank;
        const i64 e = sizeof(T);
        auto wrap = [&](int c) { return ((c % p) + p) % p; };
        std::vector<T> tmp;
        for (int s = 0; s < p - 1; s++) {
            const int cs = wrap(r - 1 - s), cr = wrap(r - 2 - s);
            const i64 rlen = at(cr + 1) - at(cr);
            tmp.resize(static_cast<size_t>(rlen));
            Pending pd;
            pd.post_recv(tmp.data(), rlen * e, wrap(r - 1), kTagData, coll_, me);
            pd.post_send(buf + at(cs), (at(cs + 1) - at(cs)) * e, wrap(r + 1), kTagData, coll_, me);
            wait_for(pd, what, "data");
            T* x = buf + at(cr);
            for (i64 i = 0; i < rlen; i++) x[i] = tmp[static_cast<size_t>(i)] + x[i];
        }
    }

    std::shared_ptr<Shared> sh_;
    MPI_Comm coll_ = MPI_COMM_NULL, p2p_ = MPI_COMM_NULL;
    std::vector<int> world_ranks_;
    i64 seq_ = 0;

    ProgressQueue queue_{
        [this](const Request& r) { collective(r, nullptr); }};  // async collectives
};

void MessageState::wait() {
    comm->wait_p2p(req, pending, t0);
}

}  // namespace mpi

MPI_Comm native_comm(const Communicator& c) {
    const auto* m = dynamic_cast<const mpi::MpiComm*>(&c);
    return m ? m->p2p() : MPI_COMM_NULL;
}

// ---- the environment -------------------------------------------------------------------------

namespace {

const char* env(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? v : nullptr;
}

}  // namespace

bool launched_by_mpi() {
    return env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") ||
           (env("PMI_SIZE") && env("PMI_RANK")) ||
           (env("SLURM_PROCID") && env("SLURM_NTASKS") && env("SLURM_STEP_ID"));
}

int local_ranks() {
    for (const char* name :
         {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
        if (const char* v = env(name)) {
            const int n = std::atoi(v);
            if (n > 0) return n;
        }
    }
    return 1;
}

MpiEnvironment::MpiEnvironment(int* argc, char*** argv) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited)
        throw CommError(
            "MpiEnvironment: MPI is already initialised; create one MpiEnvironment "
            "per process, before any other MPI call");
    int provided = 0;
    PX_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided), -1);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    if (provided < MPI_THREAD_MULTIPLE) {
        MPI_Finalize();
        throw CommError("MPI provides thread level " + std::to_string(provided) +
                        " but Parallax needs MPI_THREAD_MULTIPLE (" +
                        std::to_string(MPI_THREAD_MULTIPLE) +
                        "): async collectives run on a progress thread. Use an MPI built with "
                        "thread support (Debian's Open MPI is).");
    }
}

MpiEnvironment::~MpiEnvironment() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> MpiEnvironment::world(double timeout_s) const {
    if (!(timeout_s > 0))
        throw CommError("MpiEnvironment::world: timeout " + std::to_string(timeout_s) +
                        " s; it must be positive (layout.timeout_s)");
    auto sh = std::make_shared<mpi::Shared>();
    sh->world_rank = rank_;
    sh->world_size = size_;
    sh->timeout_s = timeout_s;
    sh->book = std::make_shared<StatsBook>(rank_);
    PX_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &sh->control), rank_);
    PX_MPI(MPI_Comm_set_errhandler(sh->control, MPI_ERRORS_RETURN), rank_);
    PX_MPI(MPI_Irecv(sh->notice_buf.data(), mpi::kMaxNotice, MPI_CHAR, MPI_ANY_SOURCE,
                     mpi::kTagFail, sh->control, &sh->notice),
           rank_);
    MPI_Comm base = MPI_COMM_NULL;
    PX_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &base), rank_);
    return std::make_unique<mpi::MpiComm>(sh, base, "world");
}

void MpiEnvironment::abort_job(int code) const {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; this satisfies [[noreturn]]
}

}  // namespace px::comm
