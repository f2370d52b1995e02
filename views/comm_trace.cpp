#include "views/comm_trace.h"

#include <cstdio>
#include <utility>

namespace px::views {

// A group of one rank that records what passes through it.
class TracingGroup : public comm::Decorator {
public:
    TracingGroup(std::unique_ptr<comm::Communicator> inner, CommTrace& trace, MeshDim dim,
                 const char* name)
        : Decorator(std::move(inner)),
          trace_(trace),
          dim_(dim),
          name_(name),
          world_rank_(this->inner().stats_book()->world_rank()) {}

protected:
    void run(comm::Request& req) override {
        const auto t0 = CommTrace::Clock::now();
        Decorator::run(req);
        trace_.record(world_rank_, event(req, false), t0, CommTrace::Clock::now());
    }
    comm::Handle start(comm::Request req) override {
        const auto t0 = CommTrace::Clock::now();
        const CommEvent e = event(req, true);
        comm::Handle h = Decorator::start(std::move(req));
        trace_.record(world_rank_, e, t0, CommTrace::Clock::now());
        return h;
    }

private:
    CommEvent event(const comm::Request& req, bool async) {
        const comm::Traffic t = comm::traffic(req, inner().rank(), inner().size());
        CommEvent e;
        e.dim = dim_;
        e.group = name_;
        e.op = req.op;
        e.async = async;
        e.bytes = t.sent + t.recv;
        return e;
    }
    CommTrace& trace_;
    MeshDim dim_;
    const char* name_;
    int world_rank_;
};

CommTrace::CommTrace(const Mesh& mesh)
    : mesh_(mesh), ranks_(static_cast<size_t>(mesh.world_size())) {}

RunHooks CommTrace::hooks() {
    RunHooks h;
    h.setup = [this](Job& job) {
        // The world rank, not coordinates: a layout's every dimension (cp too) is in it.
        const int r = job.groups().world->rank();
        StepHooks s;
        s.before = [this, r](i64 step) {
            std::lock_guard lk(mu_);
            Rank& k = ranks_[static_cast<size_t>(r)];
            k.start = Clock::now();
            k.step = step;
            k.current.clear();
            k.spans.clear();
        };
        s.compute = [this, r](i64, const Action& a, bool done) {
            const auto now = Clock::now();
            std::lock_guard lk(mu_);
            Rank& k = ranks_[static_cast<size_t>(r)];
            const double t = std::chrono::duration<double>(now - k.start).count();
            if (!done) {
                k.spans.push_back({a.kind == Action::forward, a.kind == Action::backward_weight,
                                   a.microbatch, a.chunk, t, t});
            } else if (!k.spans.empty()) {
                k.spans.back().t1 = t;
            }
        };
        s.updated = [this, r, j = &job](i64 step) {
            const MemoryStats mem = j->memory();
            std::lock_guard lk(mu_);
            Rank& k = ranks_[static_cast<size_t>(r)];
            k.last.step = step;
            k.last.start = std::chrono::duration<double>(k.start - made_).count();
            k.last.seconds = std::chrono::duration<double>(Clock::now() - k.start).count();
            k.last.events.swap(k.current);
            k.last.compute.swap(k.spans);
            k.last.memory = mem;
            k.current.clear();
            k.spans.clear();
        };
        job.add_step_hooks(std::move(s));
    };
    h.wrap_group =
        [this](MeshDim d,
               std::unique_ptr<comm::Communicator> g) -> std::unique_ptr<comm::Communicator> {
        return wrap(std::move(g), d, dim_name(d));
    };
    h.wrap_ep_group =
        [this](std::unique_ptr<comm::Communicator> g) -> std::unique_ptr<comm::Communicator> {
        return wrap(std::move(g), MeshDim::dp, "ep");  // ep groups are dp ranks
    };
    return h;
}

std::unique_ptr<comm::Communicator> CommTrace::wrap(std::unique_ptr<comm::Communicator> g,
                                                    MeshDim d, const char* name) {
    {
        std::lock_guard lk(mu_);
        const std::shared_ptr<comm::StatsBook>& book = g->stats_book();
        auto& books = ranks_[static_cast<size_t>(book->world_rank())].books;
        bool known = false;
        for (const auto& b : books) known = known || b == book;
        if (!known) books.push_back(book);
    }
    return std::make_unique<TracingGroup>(std::move(g), *this, d, name);
}

void CommTrace::record(int world_rank, const CommEvent& e, Clock::time_point t0,
                       Clock::time_point t1) {
    std::lock_guard lk(mu_);
    Rank& k = ranks_[static_cast<size_t>(world_rank)];
    CommEvent c = e;
    c.t0 = std::chrono::duration<double>(t0 - k.start).count();
    c.t1 = std::chrono::duration<double>(t1 - k.start).count();
    k.current.push_back(c);
}

std::vector<RankStep> CommTrace::last_steps() const {
    std::lock_guard lk(mu_);
    std::vector<RankStep> out;
    for (const Rank& k : ranks_) out.push_back(k.last);
    return out;
}

std::vector<MemoryStats> CommTrace::memory() const {
    std::lock_guard lk(mu_);
    std::vector<MemoryStats> out;
    for (const Rank& k : ranks_) {
        if (k.last.step == 0) return {};
        out.push_back(k.last.memory);
    }
    return out;
}

std::vector<comm::StatRow> CommTrace::stat_rows() const {
    std::vector<std::shared_ptr<comm::StatsBook>> books;
    {
        std::lock_guard lk(mu_);
        for (const Rank& k : ranks_)
            for (const auto& b : k.books) books.push_back(b);
    }
    std::vector<comm::StatRow> rows;
    for (const auto& b : books)
        for (comm::StatRow& r : b->rows())
            if (r.group != "world") rows.push_back(std::move(r));
    return rows;
}

}  // namespace px::views

namespace px::views {

Timeline measured_timeline(const Mesh& mesh, const std::vector<RankStep>& steps,
                           TimelineRanks which) {
    Timeline tl;
    const Layout& l = mesh.layout();
    std::vector<int> ranks;
    for (int w = 0; w < mesh.world_size(); w++) {
        const Coord c = mesh.coord_of(w);
        if (which == TimelineRanks::all || (c.dp == 0 && c.tp == 0)) ranks.push_back(w);
    }
    // One clock for every lane when the ranks' last steps are the same step.
    bool same = true;
    double t_first = 0;
    for (size_t i = 0; i < ranks.size(); i++) {
        const RankStep& st = steps.at(static_cast<size_t>(ranks[i]));
        if (st.step == 0) {
            tl.problem = "no step measured yet";
            return tl;
        }
        same = same && st.step == steps.at(static_cast<size_t>(ranks[0])).step;
        t_first = i == 0 ? st.start : std::min(t_first, st.start);
        tl.step = i == 0 ? st.step : std::min(tl.step, st.step);
    }
    double busy = 0;
    for (size_t lane = 0; lane < ranks.size(); lane++) {
        const int w = ranks[lane];
        const Coord c = mesh.coord_of(w);
        const RankStep& st = steps.at(static_cast<size_t>(w));
        const double off = same ? st.start - t_first : 0.0;
        tl.lanes.push_back("rank " + std::to_string(w) + ": pp" + std::to_string(c.pp) + " dp" +
                           std::to_string(c.dp) +
                           (l.cp > 1 ? " cp" + std::to_string(c.cp) : std::string()) + " tp" +
                           std::to_string(c.tp));
        tl.lane_pp.push_back(c.pp);
        if (st.compute.empty()) {
            tl.problem = "rank " + std::to_string(w) + " measured no forward or backward";
            tl.bars.clear();
            return tl;
        }
        for (const ComputeSpan& sp : st.compute) {
            TimelineBar b;
            b.lane = static_cast<int>(lane);
            b.t0 = off + sp.t0;
            b.t1 = off + std::max(sp.t1, sp.t0);
            b.kind = sp.forward  ? TimelineBar::forward
                     : sp.weight ? TimelineBar::weight
                                 : TimelineBar::backward;
            b.microbatch = sp.microbatch;
            char label[32];
            std::snprintf(label, sizeof label, "%c%d", sp.forward ? 'F' : sp.weight ? 'W' : 'B',
                          sp.microbatch);
            b.label = label;
            if (l.virtual_stages > 1) b.label += static_cast<char>('a' + sp.chunk % 26);
            busy += b.t1 - b.t0;
            tl.makespan = std::max(tl.makespan, b.t1);
            tl.bars.push_back(b);
        }
        for (const CommEvent& e : st.events) {
            TimelineBar b;
            b.lane = static_cast<int>(lane);
            b.t0 = off + e.t0;
            b.t1 = off + e.t1;
            const bool message =
                e.dim == MeshDim::pp && (e.op == comm::Op::send || e.op == comm::Op::recv);
            if (message) {
                b.kind = e.op == comm::Op::recv ? TimelineBar::recv_wait : TimelineBar::send;
                b.label = e.op == comm::Op::recv ? "recv" : "send";
            } else {
                b.kind = TimelineBar::collective;
                b.label = std::string(e.group) + " " + comm::op_name(e.op);
            }
            tl.bars.push_back(b);
        }
    }
    if (tl.makespan > 0) tl.bubble = 1.0 - busy / (static_cast<double>(ranks.size()) * tl.makespan);
    return tl;
}

}  // namespace px::views
