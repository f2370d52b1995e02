// MPI backend (see core/comm/mpi.h for how a collective runs and how failures spread): MPI
// errors, the failure channel, polled waits, the communicator and the environment; what each
// collective agrees on and moves is core/comm/mpi_collectives.cpp.
//
// All data moves as bytes with nonblocking point-to-point calls that are polled, never waited
// on, so that every wait is bounded by the timeout and by the job's failure channel.
#include "core/comm/mpi.h"

#include "core/comm/backend.h"
#include "core/comm/mpi_internal.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
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

constexpr int kTagHeader = 1;  // collectives' header exchange (their data: kTagData, 2)
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

void Pending::add(MPI_Request r, int p, bool recv, i64 len) {
    reqs.push_back(r);
    peer.push_back(p);
    is_recv.push_back(recv ? 1 : 0);
    bytes.push_back(len);
}

void Pending::post_send(const void* buf, i64 bytes, int p, int tag, MPI_Comm c, int me, bool sync) {
    const char* b = static_cast<const char*>(buf);
    i64 off = 0;
    do {
        const i64 len = std::min(kPiece, bytes - off);
        MPI_Request r;
        if (sync)
            PX_MPI(MPI_Issend(b + off, static_cast<int>(len), MPI_BYTE, p, tag, c, &r), me);
        else
            PX_MPI(MPI_Isend(b + off, static_cast<int>(len), MPI_BYTE, p, tag, c, &r), me);
        add(r, p, false, len);
        off += len;
    } while (off < bytes);
}

void Pending::post_recv(void* buf, i64 bytes, int p, int tag, MPI_Comm c, int me) {
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

std::vector<int> Pending::missing() const {
    std::vector<int> m;
    for (size_t i = 0; i < reqs.size(); i++)
        if (reqs[i] != MPI_REQUEST_NULL) m.push_back(peer[i]);
    std::sort(m.begin(), m.end());
    m.erase(std::unique(m.begin(), m.end()), m.end());
    return m;
}

void Pending::cancel() {
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
        if (q.op == Op::send)  // synchronous: no hidden buffering
            p.post_send(q.in, bytes, q.peer, q.tag, p2p_, sh_->world_rank, true);
        else
            p.post_recv(q.out, bytes, q.peer, q.tag, p2p_, sh_->world_rank);
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
            const std::string mismatch = check_match(in, req, r, group(), what);
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
        } else {
            move_data({p, r, me, coll_, [&](Pending& pd) { wait_for(pd, what, "data"); }}, req);
        }
        record(req, since(t0));
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
