#include "views/layout_explorer.h"

#include "core/base/arena.h"
#include "core/base/error.h"
#include "core/comm/comm.h"
#include "core/model/probe.h"
#include "core/parallel/state_slices.h"
#include "core/train/runner.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <tuple>

namespace px::views {

namespace {

struct Pending {
    const char* group;  // "dp", "tp", "pp", "cp", or "ep"
    comm::Op op;
    i64 bytes;
};

// What this rank's thread has issued since the last probe point.
thread_local std::vector<Pending> t_pending;
thread_local int t_rank = -1;

// Collects collectives by the op that follows them, over every rank.
struct Collector {
    std::mutex mu;
    // (order of first sight) -> use; keyed by phase, layer, op, group, collective, bytes
    std::map<std::tuple<std::string, int, std::string, std::string, std::string, i64>, size_t>
        index;
    std::vector<CollectiveUse> uses;
    std::map<std::pair<int, size_t>, int> calls;  // (rank, use) -> calls

    void flush(const char* phase, int layer, const char* op) {
        if (t_pending.empty()) return;
        std::lock_guard lk(mu);
        for (const Pending& p : t_pending) {
            auto key =
                std::make_tuple(std::string(phase), layer, std::string(op), std::string(p.group),
                                std::string(comm::op_name(p.op)), p.bytes);
            auto [it, fresh] = index.emplace(key, uses.size());
            if (fresh) {
                CollectiveUse u;
                u.phase = phase;
                u.layer = layer;
                u.op = op;
                u.group = p.group;
                u.collective = comm::op_name(p.op);
                u.bytes = p.bytes;
                uses.push_back(std::move(u));
            }
            CollectiveUse& u = uses[it->second];
            if (std::find(u.ranks.begin(), u.ranks.end(), t_rank) == u.ranks.end())
                u.ranks.push_back(t_rank);
            int& n = calls[{t_rank, it->second}];
            n++;
            u.calls = std::max(u.calls, n);
        }
        t_pending.clear();
    }
};

// A probe sink that captures nothing: it only learns which op runs next on this thread.
class OpNamer : public ProbeSink {
public:
    explicit OpNamer(Collector& c) : c_(c) {}
    bool wants(const ProbeKey& key) const override {
        c_.flush(key.phase, key.layer, key.op);
        return false;
    }
    void capture(const ProbeKey&, const float*, const ShardSpec&) override {}

private:
    Collector& c_;
};

class Recorder : public comm::Decorator {
public:
    Recorder(std::unique_ptr<comm::Communicator> inner, const char* group)
        : Decorator(std::move(inner)), group_(group) {}

protected:
    void run(comm::Request& req) override {
        note(req);
        Decorator::run(req);
    }
    comm::Handle start(comm::Request req) override {
        note(req);
        return Decorator::start(std::move(req));
    }

private:
    void note(const comm::Request& req) {
        if (req.op == comm::Op::split) return;
        const comm::Traffic t = comm::traffic(req, inner().rank(), inner().size());
        t_pending.push_back({group_, req.op, t.sent + t.recv});
    }
    const char* group_;
};

}  // namespace

ExplorerResult explore_layout(const Config& cfg) {
    ExplorerResult r;
    r.config = cfg;
    Config c = cfg;
    c.output.run_file = false;
    c.output.export_llmc.clear();
    c.checkpoint = CheckpointConfig{};
    c.fault = FaultConfig{};
    c.validate = ValidateConfig{};
    c.train.eval_every = 0;
    try {
        validate_config(c);
        r.layout = make_in_process_layout(c);
    } catch (const ConfigError& e) {
        r.error = e.what();
        r.ready = true;
        return r;
    }
    const Mesh mesh(r.layout, Mesh::Validated{});
    const int n = mesh.world_size();
    for (int k = 0; k < n; k++) {
        r.coords.push_back(mesh.coord_of(k));
        r.layers.push_back(mesh.layers(r.coords.back().pp, 0));
    }
    r.estimate = estimate_memory(c, MemoryScope::one_rank);
    r.heads = head_layout(c.model, r.layout.tp);
    const ParamTable whole = ParamTable::build(c.model);
    for (const TableEntry& e : whole.entries) {
        TensorHolding t;
        t.name = e.name;
        t.layer = e.layer;
        t.rows = e.is_vector() ? 1 : e.rows;
        t.cols = e.cols;
        r.tensors.push_back(std::move(t));
    }
    r.memory.resize(static_cast<size_t>(n));
    r.experts.resize(static_cast<size_t>(n));

    Collector collector;
    OpNamer namer(collector);
    std::mutex mu;
    RunHooks hooks;
    hooks.setup = [&](Job& job) {
        t_rank = mesh.rank_of(Coord{job.pp_rank(), job.dp_rank(), job.tp_rank(), job.cp_rank()});
        t_pending.clear();
        job.stop_after(1);
        job.set_probes(&namer);
    };
    hooks.each_step = [&](Job& job) {
        collector.flush("end", -1, "update");
        const int rank = t_rank;
        const RankState s = job.rank_state();
        const std::vector<StatePiece> w = state_pieces(*s.model, s.weights);
        const std::vector<StatePiece> m = state_pieces(*s.model, s.moments);
        std::lock_guard lk(mu);
        r.memory[static_cast<size_t>(rank)] = job.memory();
        const ModelPart& part = job.model().part();
        const int experts = static_cast<int>(c.model.moe_experts);
        r.experts[static_cast<size_t>(rank)] = part.all_experts()
                                                   ? ExpertRange{0, experts}
                                                   : ExpertRange{part.expert_lo, part.expert_hi};
        for (const StatePiece& p : w)
            r.tensors[static_cast<size_t>(p.id)].weights.push_back({rank, p.slab});
        for (const StatePiece& p : m)
            r.tensors[static_cast<size_t>(p.id)].moments.push_back({rank, p.slab});
        job.set_probes(nullptr);
    };
    hooks.wrap_group =
        [](MeshDim d,
           std::unique_ptr<comm::Communicator> g) -> std::unique_ptr<comm::Communicator> {
        return std::make_unique<Recorder>(std::move(g), dim_name(d));
    };
    hooks.wrap_ep_group =
        [](std::unique_ptr<comm::Communicator> g) -> std::unique_ptr<comm::Communicator> {
        return std::make_unique<Recorder>(std::move(g), "ep");
    };
    const auto t0 = std::chrono::steady_clock::now();
    try {
        run_layout(c, {}, hooks);
    } catch (const std::exception& e) {
        r.error = e.what();
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.collectives = std::move(collector.uses);
    for (CollectiveUse& u : r.collectives) std::sort(u.ranks.begin(), u.ranks.end());
    r.ready = true;
    return r;
}

const char* HeadLayout::kind() const {
    if (kv_heads == heads) return "multi-head";
    return kv_heads == 1 ? "multi-query" : "grouped-query";
}

namespace {

// "q head 3" or "q heads 0-1".
std::string heads_text(const char* what, HeadRange h) {
    std::string s =
        std::string(what) + (h.size() == 1 ? " head " : " heads ") + std::to_string(h.lo);
    if (h.size() > 1) s += "-" + std::to_string(h.hi - 1);
    return s;
}

}  // namespace

std::string HeadLayout::rank_text(int t) const {
    const RankHeads& h = ranks[static_cast<size_t>(t)];
    std::string s = "tp rank " + std::to_string(t) + ": " + heads_text("q", h.q) + ", " +
                    heads_text("kv", h.kv);
    if (tp == 1) return s + " (one rank holds every head)";
    if (split) return s + " (split)";
    return s + " (whole on every rank: tp=" + std::to_string(tp) + " does not divide kv_heads=" +
           std::to_string(kv_heads) + "), reads " + heads_text("kv", h.kv_read);
}

std::string HeadLayout::summary() const {
    std::string s = std::string(kind()) + " attention: " + std::to_string(heads) + " query heads";
    if (kv_heads == heads)
        s += ", each with its own KV head";
    else
        s += " share " + std::to_string(kv_heads) + (kv_heads == 1 ? " KV head" : " KV heads") +
             " (" + std::to_string(group) + " each)";
    s += ", " + std::to_string(head_dim) + " channels a head; ";
    if (tp == 1) return s + "one tp rank holds every head";
    s += "tp=" + std::to_string(tp);
    if (split)
        return s + " divides kv_heads=" + std::to_string(kv_heads) +
               ": each rank holds its own KV heads";
    return s + " does not divide kv_heads=" + std::to_string(kv_heads) +
           ": every rank holds all KV heads (k_proj and v_proj whole)";
}

HeadLayout head_layout(const ModelConfig& mc, int tp) {
    HeadLayout h;
    h.tp = tp;
    h.heads = static_cast<int>(mc.heads);
    h.kv_heads = static_cast<int>(mc.kv_head_count());
    h.head_dim = static_cast<int>(mc.head_size());
    PX_ASSERT(tp >= 1 && h.heads % tp == 0 && h.kv_heads >= 1 && h.heads % h.kv_heads == 0,
              "head_layout: tp must divide model.heads, and the KV heads model.heads");
    h.group = h.heads / h.kv_heads;
    h.split = kv_split(mc, tp);
    const int q = h.heads / tp;
    for (int t = 0; t < tp; t++) {
        RankHeads r;
        r.tp_rank = t;
        r.q = {t * q, (t + 1) * q};
        r.kv_read = {r.q.lo / h.group, (r.q.hi - 1) / h.group + 1};
        r.kv = h.split ? HeadRange{t * h.kv_heads / tp, (t + 1) * h.kv_heads / tp}
                       : HeadRange{0, h.kv_heads};
        h.ranks.push_back(r);
    }
    return h;
}

std::vector<HeldBlock> held_blocks(const TensorHolding& t, bool moments) {
    std::map<std::tuple<i64, i64, i64, i64>, HeldBlock> by;
    for (const HeldPiece& p : moments ? t.moments : t.weights) {
        HeldBlock& b = by[{p.slab.row0, p.slab.col0, p.slab.rows, p.slab.cols}];
        b.slab = p.slab;
        b.ranks.push_back(p.rank);
    }
    std::vector<HeldBlock> out;
    for (auto& [k, b] : by) {
        std::sort(b.ranks.begin(), b.ranks.end());
        b.ranks.erase(std::unique(b.ranks.begin(), b.ranks.end()), b.ranks.end());
        out.push_back(std::move(b));
    }
    return out;
}

namespace {

// The field's text as a whole number in [lo, hi], else nullopt (empty, half-typed, too big).
std::optional<int> field_int(const ConfigEditor& bar, const char* key, int lo, int hi) {
    const EditorField* f = bar.field(key);
    if (!f || f->text.empty() || f->text.size() > 6 ||
        !std::all_of(f->text.begin(), f->text.end(), [](char c) { return c >= '0' && c <= '9'; }))
        return std::nullopt;
    const int v = std::atoi(f->text.c_str());
    if (v < lo || v > hi) return std::nullopt;
    return v;
}

}  // namespace

bool follow_job_bar(ExplorerPicks& p, const ConfigEditor& bar) {
    if (!p.follow) return false;
    const ExplorerPicks before = p;
    const std::pair<const char*, int*> ints[] = {{"layout.dp", &p.dp}, {"layout.tp", &p.tp},
                                                 {"layout.pp", &p.pp}, {"layout.cp", &p.cp},
                                                 {"layout.ep", &p.ep}};
    for (const auto& [key, v] : ints)
        if (auto n = field_int(bar, key, 1, 64)) *v = *n;
    if (auto n = field_int(bar, "layout.zero", 0, 3)) p.zero = *n;
    if (auto n = field_int(bar, "numerics.block", 1, 1 << 16)) p.block = *n;
    if (const EditorField* f = bar.field("layout.cp_method"))
        if (f->text == "ring" || f->text == "ulysses") p.ulysses = f->text == "ulysses";
    if (const EditorField* f = bar.field("layout.sequence_parallel"))
        if (f->text == "true" || f->text == "false") p.sp = f->text == "true";
    return !(p == before);
}

Config explored_config(const ExplorerPicks& p, Config c) {
    c.layout.dp = p.dp;
    c.layout.tp = p.tp;
    c.layout.pp = p.pp;
    c.layout.cp = p.cp;
    c.layout.cp_method = p.ulysses ? "ulysses" : "ring";
    c.layout.ep = c.model.moe_experts > 0 ? p.ep : 1;  // dense: no experts to share
    c.layout.zero = p.zero;
    c.layout.sequence_parallel = p.sp;
    c.numerics.block = p.block;
    return c;
}

LayoutExplorer::~LayoutExplorer() {
    if (thread_.joinable()) thread_.join();
}

void LayoutExplorer::explore(const Config& cfg) {
    std::lock_guard lk(mu_);
    pending_ = cfg;
    if (busy_) return;                       // the running thread takes it next
    if (thread_.joinable()) thread_.join();  // finished: busy_ is false only once it has stored
    busy_ = true;
    thread_ = std::thread([this] {
        while (true) {
            Config c;
            {
                std::lock_guard lk(mu_);
                if (!pending_) {
                    busy_ = false;
                    return;
                }
                c = *pending_;
                pending_.reset();
            }
            ExplorerResult r = explore_layout(c);
            std::lock_guard lk(mu_);
            r_ = std::move(r);
            version_++;
        }
    });
}

ExplorerResult LayoutExplorer::result() const {
    std::lock_guard lk(mu_);
    return r_;
}

bool LayoutExplorer::wait(double timeout_s) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (busy_.load()) {
        if (std::chrono::steady_clock::now() > until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return true;
}

}  // namespace px::views
