#include "app/gui/comm_trace.h"

#include <cstdio>
#include <utility>

namespace px::gui {

// A group of one rank that records what passes through it.
class TracingGroup : public comm::Decorator {
public:
    TracingGroup(std::unique_ptr<comm::Communicator> inner, CommTrace& trace, MeshDim dim)
        : Decorator(std::move(inner)),
          trace_(trace),
          dim_(dim),
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
        e.op = req.op;
        e.async = async;
        e.bytes = t.sent + t.recv;
        return e;
    }
    CommTrace& trace_;
    MeshDim dim_;
    int world_rank_;
};

CommTrace::CommTrace(const Mesh& mesh)
    : mesh_(mesh), ranks_(static_cast<size_t>(mesh.world_size())) {}

RunHooks CommTrace::hooks() {
    RunHooks h;
    h.setup = [this](Job& job) {
        const int r = mesh_.rank_of(Coord{job.pp_rank(), job.dp_rank(), job.tp_rank()});
        StepHooks s;
        s.before = [this, r](i64 step) {
            std::lock_guard lk(mu_);
            Rank& k = ranks_[static_cast<size_t>(r)];
            k.start = Clock::now();
            k.step = step;
            k.current.clear();
        };
        s.updated = [this, r](i64 step) {
            std::lock_guard lk(mu_);
            Rank& k = ranks_[static_cast<size_t>(r)];
            k.last.step = step;
            k.last.seconds = std::chrono::duration<double>(Clock::now() - k.start).count();
            k.last.events.swap(k.current);
            k.current.clear();
        };
        job.add_step_hooks(std::move(s));
    };
    h.wrap_group =
        [this](MeshDim d,
               std::unique_ptr<comm::Communicator> g) -> std::unique_ptr<comm::Communicator> {
        {
            std::lock_guard lk(mu_);
            const std::shared_ptr<comm::StatsBook>& book = g->stats_book();
            auto& books = ranks_[static_cast<size_t>(book->world_rank())].books;
            bool known = false;
            for (const auto& b : books) known = known || b == book;
            if (!known) books.push_back(book);
        }
        return std::make_unique<TracingGroup>(std::move(g), *this, d);
    };
    return h;
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

}  // namespace px::gui

namespace px::gui {

Timeline measured_timeline(const Mesh& mesh, const std::vector<RankStep>& steps) {
    Timeline tl;
    const Layout& l = mesh.layout();
    if (l.pp < 2) {
        tl.problem = "pp = 1: one stage, no messages between stages to lay a timeline on";
        return tl;
    }
    const Schedule sched = mesh.schedule();
    double busy = 0;
    for (int p = 0; p < l.pp; p++) {
        const int w = mesh.rank_of(Coord{p, 0, 0});
        tl.lanes.push_back("pp" + std::to_string(p) + " (rank " + std::to_string(w) + ")");
        const RankStep& st = steps.at(static_cast<size_t>(w));
        if (st.step == 0) {
            tl.problem = "no step measured yet";
            tl.bars.clear();
            return tl;
        }
        if (p == 0 || st.step < tl.step || tl.step == 0) tl.step = st.step;
        std::vector<const CommEvent*> msgs, others;
        for (const CommEvent& e : st.events) {
            if (e.dim == MeshDim::pp && (e.op == comm::Op::send || e.op == comm::Op::recv))
                msgs.push_back(&e);
            else
                others.push_back(&e);
        }
        const std::vector<Action>& acts = sched.ranks[static_cast<size_t>(p)];
        size_t k = 0;
        double cursor = 0;
        for (size_t i = 0; i < acts.size(); i++) {
            const Action& a = acts[i];
            TimelineBar b;
            b.lane = p;
            b.microbatch = a.microbatch;
            if (a.is_send() || a.is_recv()) {
                if (k >= msgs.size()) {
                    tl.problem = "rank " + std::to_string(w) +
                                 " recorded fewer messages than its schedule has";
                    tl.bars.clear();
                    return tl;
                }
                const CommEvent& e = *msgs[k++];
                b.t0 = e.t0;
                b.t1 = e.t1;
                b.kind = a.is_recv() ? TimelineBar::recv_wait : TimelineBar::send;
                b.label = action_text(a);
                cursor = std::max(cursor, e.t1);
            } else {
                double end = st.seconds;
                if (k < msgs.size()) {
                    end = msgs[k]->t0;
                } else {
                    for (const CommEvent* e : others)
                        if (e->t0 >= cursor) {
                            end = e->t0;
                            break;
                        }
                }
                b.t0 = cursor;
                b.t1 = std::max(end, cursor);
                b.kind = a.kind == Action::forward ? TimelineBar::forward : TimelineBar::backward;
                char label[32];
                std::snprintf(label, sizeof label, "%c%d", a.kind == Action::forward ? 'F' : 'B',
                              a.microbatch);
                b.label = label;
                if (l.virtual_stages > 1) b.label += static_cast<char>('a' + a.chunk % 26);
                busy += b.t1 - b.t0;
                tl.makespan = std::max(tl.makespan, b.t1);
                cursor = b.t1;
            }
            tl.bars.push_back(b);
        }
        for (const CommEvent* e : others) {
            TimelineBar b;
            b.lane = p;
            b.t0 = e->t0;
            b.t1 = e->t1;
            b.kind = TimelineBar::collective;
            b.label = std::string(dim_name(e->dim)) + " " + comm::op_name(e->op);
            tl.bars.push_back(b);
        }
    }
    if (tl.makespan > 0) tl.bubble = 1.0 - busy / (l.pp * tl.makespan);
    return tl;
}

}  // namespace px::gui
