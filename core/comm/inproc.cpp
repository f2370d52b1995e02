// In-process backend (see core/comm/inproc.h for how a collective runs); running ranks on it as
// threads is core/comm/run_ranks.cpp.
//
// All shared state of a world (every group's slots and message queues, the failure) is guarded
// by one mutex with one condition variable; data is copied and reduced outside it. Every wait
// for another rank has a deadline, except the completion barrier, which only waits for shares
// of work that are already running and cannot block.
#include "core/comm/inproc.h"

#include "core/comm/backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <optional>
#include <utility>

namespace px::comm {
namespace inproc {

using namespace backend;

struct Group;

// One collective's meeting point (see inproc.h: slots alternate by sequence number).
struct Slot {
    i64 seq = 0;                        // the collective using it; 0: never used
    int arrived = 0, finished = 0;      // ranks posted / ranks done with their share
    std::vector<const Request*> posts;  // by rank in the group; null until arrived
    std::string mismatch;               // set by the last arriver when the ranks disagree
    std::vector<std::pair<std::shared_ptr<Group>, int>> split;  // split: (group, rank) per rank

    void reset(i64 s, int p) {
        seq = s;
        arrived = finished = 0;
        posts.assign(p, nullptr);
        mismatch.clear();
        split.clear();
    }
};

// A posted send or recv.
struct Message {
    Request req;           // a copy: an async handle outlives the caller's Request
    int src = 0, dst = 0;  // ranks in the group
    int state = 0;         // 0 posted (in the group's queue), 1 matched (copying), 2 done
    std::string error;     // the pair did not match
    Clock::time_point t0;
    bool is_send() const { return req.op == Op::send; }
};

struct Group {
    int id = 0;
    std::string name;
    std::vector<int> world_ranks;  // by rank in the group
    std::vector<char> alive;       // 0 once that rank's communicator is destroyed
    Slot slots[2];
    std::deque<std::shared_ptr<Message>> posted;  // unmatched sends and recvs, in post order
    int size() const { return static_cast<int>(world_ranks.size()); }
};

// A rank blocked in a collective or a message, waiting for other ranks (world ranks).
struct Wait {
    int rank = 0;
    std::function<std::string()> what;
    std::vector<int> waits_for;
};

struct World {
    int n = 0;
    double timeout_s = 0;
    std::mutex mu;
    std::condition_variable cv;
    bool failed = false;
    std::string failure;  // the first failure; later ones are consequences
    std::list<Wait> waits;  // every rank blocked now (a rank and its progress thread: two)
    int next_group_id = 0;
    std::shared_ptr<Group> world;
    std::vector<char> handed_out;
    std::vector<std::shared_ptr<StatsBook>> books;

    // Caller holds mu. The first failure wins and every waiter wakes up to see it.
    void fail(const std::string& why) {
        if (!failed) {
            failed = true;
            failure = why;
        }
        cv.notify_all();
    }
    Clock::time_point deadline() const {
        return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(timeout_s));
    }

    // Caller holds mu. Why `missing` (world ranks) did not arrive, when they are themselves
    // blocked: the chain of waits down to a rank blocked in nothing (dead, stalled or busy), so
    // that a timeout names the rank at its root and not one that waits for it; "" otherwise.
    std::string why_missing(const std::vector<int>& missing) const {
        std::string s;
        std::vector<int> seen;
        for (int x = missing.empty() ? -1 : missing.front(); x >= 0;) {
            seen.push_back(x);
            const auto it = std::find_if(waits.begin(), waits.end(),
                                         [&](const Wait& wt) { return wt.rank == x; });
            if (it == waits.end()) {
                if (!s.empty())
                    s += ", which waits in no collective or message of this job (it died, "
                         "stalled or is busy)";
                break;
            }
            s += s.empty() ? ", because world rank " : ", and world rank ";
            s += std::to_string(x) + " waits in " + it->what() + " for world rank" +
                 (it->waits_for.size() == 1 ? " " : "s ");
            for (size_t i = 0; i < it->waits_for.size(); i++)
                s += (i ? ", " : "") + std::to_string(it->waits_for[i]);
            x = it->waits_for.empty() ? -1 : it->waits_for.front();
            if (std::find(seen.begin(), seen.end(), x) != seen.end()) {
                s += " (a cycle: these ranks wait for each other)";
                break;
            }
        }
        return s;
    }
};

// Registers a rank's wait while it lasts (the caller holds mu when it starts and ends).
class Waiting {
public:
    Waiting(World& w, int rank, std::function<std::string()> what) : w_(w) {
        it_ = w_.waits.insert(w_.waits.end(), Wait{rank, std::move(what), {}});
    }
    ~Waiting() { w_.waits.erase(it_); }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;
    std::vector<int>& waits_for() { return it_->waits_for; }

private:
    World& w_;
    std::list<Wait>::iterator it_;
};

// ---- messages --------------------------------------------------------------------------------

namespace {

// "group 'tp' (size 4, world ranks 4..7)"; the world group needs no mapping.
std::string describe(const Group& g) {
    std::string s = "group '" + g.name + "' (size " + std::to_string(g.size());
    if (g.id != 0) {
        bool contiguous = true;
        for (int k = 1; k < g.size(); k++)
            contiguous = contiguous && g.world_ranks[k] == g.world_ranks[k - 1] + 1;
        s += g.size() == 1 ? ", world rank " : ", world ranks ";
        if (contiguous && g.size() > 2) {
            s +=
                std::to_string(g.world_ranks.front()) + ".." + std::to_string(g.world_ranks.back());
        } else {
            for (int k = 0; k < g.size(); k++)
                s += (k ? ", " : "") + std::to_string(g.world_ranks[k]);
        }
    }
    return s + ")";
}

// rank_list, plus the world ranks when the group is not the world: "rank 2 (world rank 6)".
std::string who(const Group& g, const std::vector<int>& r) {
    std::string s = rank_list(r);
    if (g.id == 0 || r.empty()) return s;
    s += r.size() == 1 ? " (world rank " : " (world ranks ";
    for (size_t i = 0; i < r.size(); i++)
        s += (i ? ", " : "") + std::to_string(g.world_ranks[r[i]]);
    return s + ")";
}

CommError aborted(int rank, const std::string& what, const std::string& failure) {
    return CommError("rank " + std::to_string(rank) + ": " + what +
                     " was abandoned because the job failed: " + failure);
}

// The last arriver's check that all ranks make the same call; "" when they do.
std::string check_match(const Slot& s, const Group& g, i64 seq) {
    const int p = g.size();
    const std::string advice = " Every rank of '" + g.name +
                               "' must make the same call at the same point; look for a rank "
                               "that took another branch or skipped a call.";
    // Groups ranks by what they passed; a message when there is more than one answer.
    auto disagree = [&](const std::string& what, const std::string& about,
                        auto value_of) -> std::string {
        std::vector<std::pair<std::string, std::vector<int>>> by;
        for (int k = 0; k < p; k++) {
            const std::string v = value_of(*s.posts[k]);
            auto it =
                std::find_if(by.begin(), by.end(), [&](const auto& b) { return b.first == v; });
            if (it == by.end())
                by.push_back({v, {k}});
            else
                it->second.push_back(k);
        }
        if (by.size() == 1) return "";
        std::string m = what + ": the ranks disagree on " + about + ": ";
        for (size_t i = 0; i < by.size(); i++)
            m += (i ? ", " : "") + rank_list(by[i].second) + " " + by[i].first;
        return m + "." + advice;
    };
    const std::string at = " #" + std::to_string(seq) + " in " + describe(g);
    std::string m = disagree("collective" + at, "the collective", [](const Request& q) {
        return std::string("called ") + op_name(q.op);
    });
    if (!m.empty()) return m;
    const Request& q0 = *s.posts[0];
    const std::string what = op_name(q0.op) + at;
    m = disagree(what, "the element type",
                 [](const Request& q) { return std::string("passed ") + dtype_name(q.dtype); });
    if (!m.empty()) return m;
    if (q0.op == Op::all_reduce || q0.op == Op::reduce_scatter) {
        m = disagree(what, "the algorithm", [](const Request& q) {
            return std::string("asked for ") + algo_name(q.algo);
        });
        if (!m.empty()) return m;
    }
    switch (q0.op) {
        case Op::all_reduce:
        case Op::all_reduce_max:
        case Op::reduce_scatter:
        case Op::all_gather:
        case Op::broadcast:
        case Op::all_to_all:
            m = disagree(what, "the element count",
                         [](const Request& q) { return "passed n = " + std::to_string(q.n); });
            if (!m.empty() || q0.op != Op::broadcast) return m;
            return disagree(what, "the root", [](const Request& q) {
                return "passed root " + std::to_string(q.peer);
            });
        case Op::all_gather_v:
            return disagree(what, "the counts", [](const Request& q) {
                return "passed counts " + counts_str(q.counts);
            });
        case Op::all_to_all_v:
            for (int r = 0; r < p; r++)
                for (int k = 0; k < p; k++)
                    if (s.posts[r]->out_counts[k] != s.posts[k]->counts[r])
                        return what + ": rank " + std::to_string(r) + " expects out_counts[" +
                               std::to_string(k) +
                               "] = " + std::to_string(s.posts[r]->out_counts[k]) +
                               " elements from rank " + std::to_string(k) + ", but rank " +
                               std::to_string(k) + " sends in_counts[" + std::to_string(r) +
                               "] = " + std::to_string(s.posts[k]->counts[r]) + "." + advice;
            return "";
        case Op::split:
            for (int a = 0; a < p; a++)
                for (int b = a + 1; b < p; b++) {
                    const Request &qa = *s.posts[a], &qb = *s.posts[b];
                    if (qa.color >= 0 && qa.color == qb.color && qa.name != qb.name)
                        return what + ": ranks " + std::to_string(a) + " and " + std::to_string(b) +
                               " join color " + std::to_string(qa.color) +
                               " under different names ('" + qa.name + "' and '" + qb.name + "')." +
                               advice;
                }
            return "";
        case Op::send:
        case Op::recv:
        case Op::barrier:
            return "";
    }
    return "";
}

// The new groups of a split, made once by the last arriver (caller holds the world's mutex).
void make_split_groups(World& w, const Group& parent, Slot& s) {
    const int p = parent.size();
    s.split.assign(p, {nullptr, -1});
    for (int k = 0; k < p; k++) {
        const Request& q = *s.posts[k];
        if (q.color < 0 || s.split[k].first) continue;
        std::vector<int> members;  // ranks in the parent with this color, by (key, parent rank)
        for (int j = 0; j < p; j++)
            if (s.posts[j]->color == q.color) members.push_back(j);
        std::stable_sort(members.begin(), members.end(),
                         [&](int a, int b) { return s.posts[a]->key < s.posts[b]->key; });
        auto g = std::make_shared<Group>();
        g->id = ++w.next_group_id;
        g->name = q.name;
        for (int j : members) g->world_ranks.push_back(parent.world_ranks[j]);
        g->alive.assign(members.size(), 1);
        for (int i = 0; i < static_cast<int>(members.size()); i++) s.split[members[i]] = {g, i};
    }
}

// ---- the arithmetic --------------------------------------------------------------------------

constexpr i64 kTile = 1024;  // elements per rank combined at a time (p rows of scratch)

// Reduces src[0..p)[0..len) element-wise and hands the result to emit(offset, values, count),
// tile by tile. Canonical: the tree over ranks. Ring: the order the ring gives chunk `owner`,
// x_{owner+1} + x_{owner+2} + ... + x_{owner} (indices mod p), left to right.
template <class T, class Emit>
void reduce_chunk(const std::vector<const T*>& src, i64 len, Op op, Algo algo, int owner,
                  Emit emit) {
    const int p = static_cast<int>(src.size());
    if (len == 0) return;
    std::vector<T> scratch(static_cast<size_t>(p) * std::min(len, kTile));
    for (i64 off = 0; off < len; off += kTile) {
        const i64 w = std::min(kTile, len - off);
        T* acc = scratch.data();
        if (op == Op::all_reduce_max || algo == Algo::canonical) {
            for (int k = 0; k < p; k++) std::copy(src[k] + off, src[k] + off + w, acc + k * w);
            if (op == Op::all_reduce_max)
                tree_rows<T, true>(acc, 0, p, w);
            else
                tree_rows<T, false>(acc, 0, p, w);
        } else {
            const T* first = src[(owner + 1) % p] + off;
            std::copy(first, first + w, acc);
            for (int j = 2; j <= p; j++) {
                const T* x = src[(owner + j) % p] + off;
                for (i64 i = 0; i < w; i++) acc[i] = acc[i] + x[i];
            }
        }
        emit(off, static_cast<const T*>(acc), w);
    }
}

template <class T>
void copy_n(const T* from, i64 n, T* to) {
    if (n > 0 && from != to) std::copy(from, from + n, to);
}

// This rank's share of a collective whose ranks have all arrived and agree.
template <class T>
void do_share(const Slot& s, int r, int p) {
    const Request& me = *s.posts[r];
    auto in = [&](int k) { return static_cast<const T*>(s.posts[k]->in); };
    auto out = [&](int k) { return static_cast<T*>(s.posts[k]->out); };
    const i64 n = me.n;
    std::vector<const T*> src(p);
    switch (me.op) {
        case Op::all_reduce:
        case Op::all_reduce_max: {
            // Chunk r of the reduce-scatter phase, then written into every rank's buffer (the
            // all-gather phase). Only this rank reads or writes chunk r of any buffer.
            const i64 lo = chunk_lo(n, p, r), hi = chunk_lo(n, p, r + 1);
            if (hi == lo) break;
            for (int k = 0; k < p; k++) src[k] = in(k) + lo;
            reduce_chunk<T>(src, hi - lo, me.op, me.algo, r, [&](i64 off, const T* v, i64 w) {
                for (int k = 0; k < p; k++) std::copy(v, v + w, out(k) + lo + off);
            });
            break;
        }
        case Op::reduce_scatter:
            if (n == 0) break;
            for (int k = 0; k < p; k++) src[k] = in(k) + r * n;
            reduce_chunk<T>(src, n, me.op, me.algo, r,
                            [&](i64 off, const T* v, i64 w) { std::copy(v, v + w, out(r) + off); });
            break;
        case Op::all_gather:
            for (int k = 0; k < p; k++) copy_n(in(k), n, out(r) + k * n);
            break;
        case Op::all_gather_v: {
            i64 off = 0;
            for (int k = 0; k < p; k++) {
                copy_n(in(k), me.counts[k], out(r) + off);
                off += me.counts[k];
            }
            break;
        }
        case Op::broadcast:
            if (r != me.peer) copy_n(static_cast<const T*>(out(me.peer)), n, out(r));
            break;
        case Op::all_to_all:
            for (int k = 0; k < p; k++) copy_n(in(k) + r * n, n, out(r) + k * n);
            break;
        case Op::all_to_all_v: {
            i64 out_off = 0;
            for (int k = 0; k < p; k++) {
                const std::vector<i64>& kc = s.posts[k]->counts;  // rank k's in_counts
                i64 in_off = 0;
                for (int j = 0; j < r; j++) in_off += kc[j];
                copy_n(in(k) + in_off, kc[r], out(r) + out_off);
                out_off += me.out_counts[k];
            }
            break;
        }
        case Op::send:
        case Op::recv:
        case Op::barrier:
        case Op::split:
            break;
    }
}

void share(const Slot& s, int r, int p) {
    switch (s.posts[r]->dtype) {
        case Dtype::f32:
            do_share<float>(s, r, p);
            break;
        case Dtype::f64:
            do_share<double>(s, r, p);
            break;
        case Dtype::i64:
            do_share<i64>(s, r, p);
            break;
        case Dtype::b16:
            do_share<std::uint16_t>(s, r, p);
            break;
        case Dtype::b8:
            do_share<std::uint8_t>(s, r, p);
            break;
    }
}

// ---- point to point --------------------------------------------------------------------------

std::string p2p_what(const Message& m, int rank, const Group& g) {
    const bool send = m.is_send();
    return std::string(send ? "send to rank " : "recv from rank ") +
           std::to_string(send ? m.dst : m.src) + " (tag " + std::to_string(m.req.tag) + ", " +
           std::to_string(m.req.n) + " " + dtype_name(m.req.dtype) + ") on rank " +
           std::to_string(rank) + " of " + describe(g);
}

// Caller holds the world's mutex.
void unpost(Group& g, const std::shared_ptr<Message>& m) {
    auto it = std::find(g.posted.begin(), g.posted.end(), m);
    if (it != g.posted.end()) g.posted.erase(it);
}

// Posts a send or recv; when its partner is already posted, copies and completes both.
std::shared_ptr<Message> p2p_post(World& w, Group& g, int rank, const Request& req) {
    auto m = std::make_shared<Message>();
    m->req = req;
    m->src = req.op == Op::send ? rank : req.peer;
    m->dst = req.op == Op::send ? req.peer : rank;
    m->t0 = Clock::now();
    std::unique_lock lk(w.mu);
    if (w.failed) throw aborted(rank, p2p_what(*m, rank, g), w.failure);
    auto it = std::find_if(g.posted.begin(), g.posted.end(), [&](const auto& o) {
        return o->is_send() != m->is_send() && o->src == m->src && o->dst == m->dst &&
               o->req.tag == m->req.tag;
    });
    if (it == g.posted.end()) {
        g.posted.push_back(m);
        return m;
    }
    std::shared_ptr<Message> other = *it;
    g.posted.erase(it);
    Message& snd = m->is_send() ? *m : *other;
    Message& rcv = m->is_send() ? *other : *m;
    if (snd.req.n != rcv.req.n || snd.req.dtype != rcv.req.dtype) {
        const std::string msg =
            "send from rank " + std::to_string(snd.src) + " to rank " + std::to_string(snd.dst) +
            " (tag " + std::to_string(snd.req.tag) + ") in " + describe(g) + ": rank " +
            std::to_string(snd.src) + " sends " + std::to_string(snd.req.n) + " " +
            dtype_name(snd.req.dtype) + " but rank " + std::to_string(rcv.dst) + " receives " +
            std::to_string(rcv.req.n) + " " + dtype_name(rcv.req.dtype) +
            ". A recv must expect exactly what its matching send sends.";
        m->state = other->state = 2;
        m->error = other->error = msg;
        w.fail(msg);
        throw CommError(msg);
    }
    m->state = other->state = 1;
    lk.unlock();
    const i64 bytes = snd.req.n * dtype_size(snd.req.dtype);
    if (bytes > 0 && rcv.req.out != snd.req.in) std::memcpy(rcv.req.out, snd.req.in, bytes);
    lk.lock();
    m->state = other->state = 2;
    w.cv.notify_all();
    return m;
}

// Waits until the message is done; its partner must be posted within the timeout.
void p2p_wait(World& w, Group& g, int rank, const std::shared_ptr<Message>& m, StatsBook& book) {
    std::unique_lock lk(w.mu);
    const auto deadline = w.deadline();
    const int peer = m->is_send() ? m->dst : m->src;
    std::optional<Waiting> waiting;  // ends before the lock is given up
    waiting.emplace(w, g.world_ranks[rank], [m, rank, &g] { return p2p_what(*m, rank, g); });
    waiting->waits_for() = {g.world_ranks[peer]};
    for (;;) {
        if (m->state == 2) break;
        if (m->state == 1) {  // the partner is copying; that cannot block
            w.cv.wait(lk);
            continue;
        }
        const std::string what = p2p_what(*m, rank, g);
        const char* partner = m->is_send() ? "recv" : "send";
        if (w.failed) {
            unpost(g, m);
            throw aborted(rank, what, w.failure);
        }
        if (!g.alive[peer]) {
            unpost(g, m);
            const std::string msg = what + ": rank " + std::to_string(peer) +
                                    " left the group (its communicator was destroyed) without "
                                    "posting the matching " +
                                    partner +
                                    ". Every send needs its recv before either side leaves.";
            w.fail(msg);
            throw CommError(msg);
        }
        if (Clock::now() >= deadline) {
            unpost(g, m);
            const std::string msg =
                what + ": " + who(g, {peer}) + " did not post a matching " + partner + " within " +
                seconds_str(w.timeout_s) + w.why_missing({g.world_ranks[peer]}) +
                ". Sends and recvs pair up by (source, destination, tag), in order; look for a "
                "missing " +
                partner + " or a wrong tag, or raise the timeout if rank " + std::to_string(peer) +
                " is only slow.";
            w.fail(msg);
            throw CommError(msg);
        }
        w.cv.wait_until(lk, deadline);
    }
    waiting.reset();
    if (!m->error.empty()) throw CommError(m->error);
    lk.unlock();
    book.record(g.name, m->req, since(m->t0));
}

struct MessageState final : Handle::State {
    std::shared_ptr<World> w;
    std::shared_ptr<Group> g;
    std::shared_ptr<StatsBook> book;
    std::shared_ptr<Message> m;
    int rank = 0;
    void wait() override { p2p_wait(*w, *g, rank, m, *book); }
    bool test() override {
        std::lock_guard lk(w->mu);
        return m->state == 2 || (m->state == 0 && w->failed);
    }
};

}  // namespace

// ---- the communicator ------------------------------------------------------------------------

class InProcComm final : public Communicator {
public:
    InProcComm(std::shared_ptr<World> w, std::shared_ptr<Group> g, int rank,
               std::shared_ptr<StatsBook> book)
        : Communicator(rank, g->size(), g->name, std::move(book)),
          w_(std::move(w)),
          g_(std::move(g)) {}

    ~InProcComm() override {
        queue_.close();  // runs what is queued first (fails fast if failed)
        std::lock_guard lk(w_->mu);
        g_->alive[rank()] = 0;
        w_->cv.notify_all();
    }

    std::unique_ptr<Communicator> split(int color, int key, std::string name) override {
        Request req;
        req.op = Op::split;
        req.color = color;
        req.key = key;
        req.name = std::move(name);
        if (req.color >= 0 && req.name.empty())
            throw CommError("split on rank " + std::to_string(rank()) + " of " + describe(*g_) +
                            ": the new group needs a name (\"dp\", \"tp\", ...)");
        queue_.drain();
        std::pair<std::shared_ptr<Group>, int> mine;
        collective(req, &mine);
        if (!mine.first) return nullptr;
        return std::make_unique<InProcComm>(w_, mine.first, mine.second, stats_book());
    }

    void abort(const std::string& reason) override {
        std::lock_guard lk(w_->mu);
        w_->fail("rank " + std::to_string(rank()) + " of " + describe(*g_) +
                 " called abort: " + reason);
    }

    std::string failure() override {
        std::lock_guard lk(w_->mu);
        return w_->failed ? w_->failure : std::string();
    }
    bool ranks_are_processes() const override { return false; }

protected:
    void run(Request& req) override {
        if (is_p2p(req.op)) {
            auto m = p2p_post(*w_, *g_, rank(), req);
            p2p_wait(*w_, *g_, rank(), m, *stats_book());
            return;
        }
        queue_.drain();  // earlier async collectives come first: they hold earlier sequence numbers
        collective(req, nullptr);
    }

    Handle start(Request req) override {
        if (is_p2p(req.op)) {
            auto st = std::make_shared<MessageState>();
            st->m = p2p_post(*w_, *g_, rank(), req);
            st->w = w_;
            st->g = g_;
            st->book = stats_book();
            st->rank = rank();
            return Handle(st);
        }
        return queue_.push(std::move(req));
    }

private:
    // One collective on the calling thread: arrive, agree, share the work, complete.
    void collective(const Request& req, std::pair<std::shared_ptr<Group>, int>* split_out) {
        World& w = *w_;
        Group& g = *g_;
        const int p = size(), r = rank();
        const i64 seq = ++seq_;
        Slot& s = g.slots[seq % 2];
        const auto t0 = Clock::now();
        // Named only when something fails: a collective of one float should stay cheap.
        auto what = [&] {
            return std::string(op_name(req.op)) + " #" + std::to_string(seq) + " in " + describe(g);
        };
        {
            std::unique_lock lk(w.mu);
            if (w.failed) throw aborted(r, what(), w.failure);
            if (s.seq != seq) s.reset(seq, p);  // slot of #seq-2, which every rank has left
            s.posts[r] = &req;
            if (++s.arrived == p) {
                s.mismatch = check_match(s, g, seq);
                if (!s.mismatch.empty())
                    w.fail(s.mismatch);
                else if (req.op == Op::split)
                    make_split_groups(w, g, s);
                w.cv.notify_all();
            }
            const auto deadline = w.deadline();
            Waiting waiting(w, g.world_ranks[r], what);
            // Once all ranks have arrived the collective is committed: others may already be
            // reading this rank's buffers, so only a mismatch (found before any work) may stop it.
            while (s.arrived < p) {
                if (w.failed) throw aborted(r, what(), w.failure);
                std::vector<int> here, missing, gone;
                waiting.waits_for().clear();
                for (int k = 0; k < p; k++) {
                    (s.posts[k] ? here : missing).push_back(k);
                    if (!s.posts[k]) waiting.waits_for().push_back(g.world_ranks[k]);
                    if (!s.posts[k] && !g.alive[k]) gone.push_back(k);
                }
                auto advice = [&] {
                    return "Every rank of '" + g.name +
                           "' must call the same collectives in the same order: look for a rank "
                           "that skipped this call, returned early or took another branch";
                };
                if (!gone.empty()) {
                    const std::string msg =
                        what() + ": " + who(g, gone) + (gone.size() == 1 ? " has" : " have") +
                        " left the group (its communicator was destroyed) "
                        "without calling it, while " +
                        rank_list(here) + (here.size() == 1 ? " waits" : " wait") + " in it. " +
                        advice() + ".";
                    w.fail(msg);
                    throw CommError(msg);
                }
                if (Clock::now() >= deadline) {
                    const std::string msg =
                        what() + ": " + who(g, missing) + " did not arrive within " +
                        seconds_str(w.timeout_s) + " (" + rank_list(here) + " did" +
                        w.why_missing(waiting.waits_for()) + "). " + advice() +
                        "; if " + rank_list(missing) + (missing.size() == 1 ? " is" : " are") +
                        " only slow, raise the timeout.";
                    w.fail(msg);
                    throw CommError(msg);
                }
                w.cv.wait_until(lk, deadline);
            }
            if (!s.mismatch.empty()) throw CommError(s.mismatch);
            if (split_out) *split_out = s.split[r];
        }

        std::string err;
        try {
            share(s, r, p);
        } catch (...) {
            err = what_of(std::current_exception());
        }
        {
            std::unique_lock lk(w.mu);
            if (!err.empty()) {
                w.fail(what() + ": rank " + std::to_string(r) + " failed in its share: " + err);
                err = w.failure;
            }
            if (++s.finished == p)
                w.cv.notify_all();
            else
                w.cv.wait(lk, [&] { return s.finished == p; });  // shares cannot block
        }
        if (!err.empty()) throw CommError(err);
        record(req, since(t0));
    }

    std::shared_ptr<World> w_;
    std::shared_ptr<Group> g_;
    i64 seq_ = 0;  // collectives this rank has started in this group

    ProgressQueue queue_{
        [this](const Request& r) { collective(r, nullptr); }};  // async collectives
};

}  // namespace inproc

// ---- the world -------------------------------------------------------------------------------

InProcWorld::InProcWorld(int n, double timeout_s) : w_(std::make_shared<inproc::World>()) {
    if (n < 1)
        throw CommError("InProcWorld: " + std::to_string(n) +
                        " ranks; an in-process world needs at least 1");
    if (!(timeout_s > 0))
        throw CommError("InProcWorld: timeout " + std::to_string(timeout_s) +
                        " s; it must be positive (a few seconds for tests, more for real runs)");
    w_->n = n;
    w_->timeout_s = timeout_s;
    auto g = std::make_shared<inproc::Group>();
    g->id = 0;
    g->name = "world";
    for (int r = 0; r < n; r++) g->world_ranks.push_back(r);
    g->alive.assign(n, 1);
    w_->world = g;
    w_->handed_out.assign(n, 0);
    for (int r = 0; r < n; r++) w_->books.push_back(std::make_shared<StatsBook>(r));
}

InProcWorld::~InProcWorld() = default;

int InProcWorld::size() const {
    return w_->n;
}
double InProcWorld::timeout_s() const {
    return w_->timeout_s;
}

std::unique_ptr<Communicator> InProcWorld::comm(int rank) {
    if (rank < 0 || rank >= w_->n)
        throw CommError("InProcWorld::comm: rank " + std::to_string(rank) +
                        " is not in this world of " + std::to_string(w_->n) + " ranks");
    {
        std::lock_guard lk(w_->mu);
        if (w_->handed_out[rank])
            throw CommError("InProcWorld::comm: rank " + std::to_string(rank) +
                            "'s world communicator already exists; create it once per rank and "
                            "split it for groups");
        w_->handed_out[rank] = 1;
    }
    return std::make_unique<inproc::InProcComm>(w_, w_->world, rank, w_->books[rank]);
}

void InProcWorld::abort(const std::string& reason) {
    std::lock_guard lk(w_->mu);
    w_->fail(reason);
}

bool InProcWorld::failed() const {
    std::lock_guard lk(w_->mu);
    return w_->failed;
}

std::string InProcWorld::failure() const {
    std::lock_guard lk(w_->mu);
    return w_->failure;
}

std::vector<StatRow> InProcWorld::stat_rows() const {
    std::vector<StatRow> rows;
    for (const auto& b : w_->books) {
        auto r = b->rows();
        rows.insert(rows.end(), r.begin(), r.end());
    }
    return rows;
}

std::shared_ptr<StatsBook> InProcWorld::stats_book(int rank) const {
    if (rank < 0 || rank >= w_->n)
        throw CommError("InProcWorld::stats_book: rank " + std::to_string(rank) +
                        " is not in this world of " + std::to_string(w_->n) + " ranks");
    return w_->books[rank];
}

}  // namespace px::comm
