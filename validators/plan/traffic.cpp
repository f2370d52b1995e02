// A rank's step of communication (traffic.h), seam by seam in the order the trainer runs them.
#include "validators/plan/traffic.h"

#include "core/base/arena.h"
#include "core/base/error.h"
#include "core/parallel/context/context_parallel.h"
#include "core/parallel/data/zero.h"
#include "core/parallel/expert/expert_parallel.h"
#include "core/parallel/pipeline/pipeline.h"
#include "core/parallel/tensor/tensor_parallel.h"
#include "core/parallel/tree_exchange.h"

#include <algorithm>
#include <array>
#include <map>
#include <mutex>

namespace px::plan {

const char* phase_name(Phase p) {
    switch (p) {
        case Phase::forward: return "forward";
        case Phase::backward: return "backward";
        case Phase::boundary: return "boundary";
        case Phase::gradients: return "gradients";
        case Phase::gather: return "gather";
        case Phase::update: return "update";
    }
    return "?";
}

namespace {

i64 align16(i64 n) { return (n + 15) / 16 * 16; }

// A rank's stage: its table (tp-local shapes, as the GPT of that rank builds it), gradient
// buffer, and the sizes the parts read.
struct Stage {
    ModelPart part;
    ParamTable table;
    i64 grad_total = 0, head_offset = 0;
};

Stage make_stage(const Mesh& mesh, const ModelConfig& mc, const Coord& at,
                 const tp::TpShards* shards) {
    Stage s;
    s.part = stage_part(mesh, at.pp, mc);
    const Layout& l = mesh.layout();
    TpDims tp;
    if (shards) tp = TpDims{l.tp, shards->vocabulary.local(at.tp)};
    const TpDims dims = s.part.expert_dims(tp);
    s.table = ParamTable::build(mc, s.part, dims);
    s.head_offset = s.table.total;
    s.grad_total = s.table.total +
                   (s.part.head_region() ? align16(resolve_dim(Dim::V, mc, dims) * mc.hidden) : 0);
    return s;
}

struct Builder {
    std::vector<PlannedOp> ops;
    void add(const std::string& group, int size, int rank, comm::Request req, double calls,
             Phase phase, const std::string& what) {
        if (size <= 1 || calls <= 0) return;  // a group of one is not made
        ops.push_back({group, size, rank, std::move(req), calls, phase, what});
    }
};

comm::Request request(comm::Op op, i64 n, comm::Dtype dt = comm::Dtype::f32,
                      comm::Algo algo = comm::Algo::canonical) {
    comm::Request r;
    r.op = op;
    r.n = n;
    r.dtype = dt;
    r.algo = algo;
    return r;
}

comm::Request with_counts(comm::Op op, std::vector<i64> counts, comm::Dtype dt = comm::Dtype::f32) {
    comm::Request r = request(op, 0, dt);
    r.counts = std::move(counts);
    return r;
}

// exchange_and_combine (tree_exchange.cpp): the plain canonical all_reduce where the plan is the
// rank tree, else reduce_scatter_nodes' all_to_all_v of every node's chunks and an all_gather_v.
void add_exchange(Builder& b, const std::string& group, int rank, const NodePlan& plan, i64 w,
                  double calls, Phase phase, const std::string& what) {
    const int p = plan.size();
    if (p <= 1 || w <= 0) return;
    bool any = false;
    for (const auto& n : plan.nodes) any = any || !n.empty();
    if (!any) return;
    if (plan.rank_tree) {
        b.add(group, p, rank, request(comm::Op::all_reduce, w), calls, phase, what);
        return;
    }
    std::vector<i64> edges(static_cast<size_t>(p) + 1), counts(static_cast<size_t>(p));
    for (int c = 0; c <= p; c++) edges[static_cast<size_t>(c)] = comm::chunk_lo(w, p, c);
    for (int c = 0; c < p; c++) counts[static_cast<size_t>(c)] = edges[c + 1] - edges[c];
    const i64 k = static_cast<i64>(plan.nodes[static_cast<size_t>(rank)].size());
    const i64 len = counts[static_cast<size_t>(rank)];
    comm::Request a2a = request(comm::Op::all_to_all_v, 0);
    for (int c = 0; c < p; c++) {
        a2a.counts.push_back(k * counts[static_cast<size_t>(c)]);
        a2a.out_counts.push_back(static_cast<i64>(plan.nodes[static_cast<size_t>(c)].size()) * len);
    }
    b.add(group, p, rank, a2a, calls, phase, what);
    b.add(group, p, rank, with_counts(comm::Op::all_gather_v, counts), calls, phase, what);
}

// tensor_parallel.cpp reduce_partials: the tree exchange in bitwise mode, a ring all-reduce in
// fast mode.
void add_reduce_partials(Builder& b, const Layout& l, int rank, const tp::DimSplit& s, i64 w,
                         double calls, Phase phase, const std::string& what) {
    if (l.mode == Mode::fast)
        b.add("tp", l.tp, rank, request(comm::Op::all_reduce, w, comm::Dtype::f32, comm::Algo::ring),
              calls, phase, what);
    else
        add_exchange(b, "tp", rank, s.plan, w, calls, phase, what);
}

// reduce_scatter_cut (zero.cpp): each rank's piece of a segment cut at `cuts`, by all_to_all_v
// (nothing when the segment is empty).
void add_cut(Builder& b, const std::string& group, int rank, const std::vector<i64>& cuts,
             double calls, Phase phase, const std::string& what) {
    const int p = static_cast<int>(cuts.size()) - 1;
    if (cuts[static_cast<size_t>(p)] == cuts[0]) return;
    comm::Request r = request(comm::Op::all_to_all_v, 0);
    const i64 mine = cuts[rank + 1] - cuts[rank];
    for (int c = 0; c < p; c++) {
        r.counts.push_back(cuts[c + 1] - cuts[c]);
        r.out_counts.push_back(mine);
    }
    b.add(group, p, rank, r, calls, phase, what);
}

std::vector<i64> shard_counts(const std::vector<i64>& edges) {
    std::vector<i64> c;
    for (size_t r = 0; r + 1 < edges.size(); r++) c.push_back(edges[r + 1] - edges[r]);
    return c;
}

// ZeroShards::sum_squares: every shard's blocks of the owned tensors, gathered.
std::vector<i64> shard_block_counts(const Stage& st, const std::vector<i64>& edges, int block,
                                    const std::vector<char>& owned) {
    const int p = static_cast<int>(edges.size()) - 1;
    std::vector<i64> counts(static_cast<size_t>(p), 0);
    for (int r = 0; r < p; r++)
        for (size_t i = 0; i < st.table.entries.size(); i++) {
            if (!owned[i]) continue;
            const TableEntry& e = st.table.entries[i];
            const i64 a = std::max(e.offset, edges[r]), bnd = std::min(e.offset + e.numel(), edges[r + 1]);
            if (a >= bnd) continue;
            counts[static_cast<size_t>(r)] += num_blocks(bnd - e.offset, block) - (a - e.offset) / block;
        }
    return counts;
}

// The sends and receives of a pp rank's list in the layout's schedule; remembered per schedule
// (the planner asks for every rank and layout of the same shape).
std::pair<double, double> schedule_messages(const Layout& l, int pp_rank) {
    static std::mutex mu;
    static std::map<std::array<int, 4>, std::vector<std::pair<double, double>>> known;
    const std::array<int, 4> key{static_cast<int>(l.schedule), l.pp, l.microbatches,
                                 l.virtual_stages};
    {
        std::lock_guard lk(mu);
        if (const auto it = known.find(key); it != known.end()) return it->second[pp_rank];
    }
    const Schedule s = make_schedule(l.schedule, l.pp, l.microbatches, l.virtual_stages);
    std::vector<std::pair<double, double>> counts;
    for (const auto& list : s.ranks) {
        double sends = 0, recvs = 0;
        for (const Action& a : list) {
            sends += a.is_send() ? 1 : 0;
            recvs += a.is_recv() ? 1 : 0;
        }
        counts.push_back({sends, recvs});
    }
    std::lock_guard lk(mu);
    known[key] = counts;
    return counts[static_cast<size_t>(pp_rank)];
}

}  // namespace

std::vector<PlannedOp> step_traffic(const Config& cfg, const Coord& at) {
    const Layout l = make_layout(cfg);
    const Mesh mesh(l, Mesh::Validated{});
    const ModelConfig& mc = cfg.model;
    const Numerics nx{l.mode, cfg.numerics.block};
    Builder b;
    const int M = l.microbatches, pp = l.pp;
    const i64 micro_B = l.microbatch_size(), Tl = l.local_seq_len(), BT = micro_B * Tl;
    const i64 C = mc.hidden;
    const bool recompute = l.recompute == Recompute::full;

    std::unique_ptr<tp::TpShards> shards;
    if (l.tp > 1)
        shards = std::make_unique<tp::TpShards>(tp::make_tp_shards(
            nx, mc.hidden, mc.heads, mc.ffn, mc.vocab, l.tp, mc.head_size(), mc.kv_head_count()));
    const Stage st = make_stage(mesh, mc, at, shards.get());
    const bool last = at.pp == l.last_stage_rank();  // zbv's V: rank 0
    int layers = 0;
    for (const LayerSpan& c : st.part.chunks) layers += c.size();
    const int zero_ranks = l.dp / l.ep;
    const int zero = zero_ranks > 1 ? l.zero : 0;
    const bool units = l.microbatch_major();
    const comm::Algo algo = l.algo;
    const comm::Dtype act = dtype_size(activation_dtype(cfg.precision)) == 2 ? comm::Dtype::b16
                                                                              : comm::Dtype::f32;

    // ---- the schedule: tensor parallelism inside each microbatch's forward and backward ----
    if (l.tp > 1) {
        const tp::TpShards& sh = *shards;
        const double fwd = double(M) * (recompute ? 2 : 1), bwd = double(M);
        const int r = at.tp;
        const bool llama = mc.llama();
        if (!l.sequence_parallel) {
            add_reduce_partials(b, l, r, sh.channels, BT * C, fwd * layers, Phase::forward,
                                "attention projection (row parallel) forward");
            add_reduce_partials(b, l, r, sh.ffn, BT * C, fwd * layers, Phase::forward,
                                "MLP projection (row parallel) forward");
            if (llama) {
                add_reduce_partials(b, l, r, sh.channels, BT * C, bwd * layers, Phase::backward,
                                    "q (column parallel) backward");
                if (sh.kv_split)
                    add_reduce_partials(b, l, r, sh.kv, BT * C, 2 * bwd * layers, Phase::backward,
                                        "k, v (column parallel) backward");
                add_reduce_partials(b, l, r, sh.ffn, BT * C, 2 * bwd * layers, Phase::backward,
                                    "gate, up (column parallel) backward");
            } else {
                add_reduce_partials(b, l, r, sh.qkv, BT * C, bwd * layers, Phase::backward,
                                    "qkv (column parallel) backward");
                add_reduce_partials(b, l, r, sh.ffn, BT * C, bwd * layers, Phase::backward,
                                    "fc (column parallel) backward");
            }
            if (st.part.embedding || pp == 1)
                b.add("tp", l.tp, r, request(comm::Op::all_reduce, BT * C, comm::Dtype::f32, algo),
                      double(M), Phase::forward, "vocabulary-parallel embedding forward");
            if (st.part.head || pp == 1) {
                b.add("tp", l.tp, r, request(comm::Op::all_reduce_max, BT), double(M),
                      Phase::forward, "cross-entropy: max logit");
                b.add("tp", l.tp, r, request(comm::Op::all_reduce, BT, comm::Dtype::f32, algo),
                      double(M), Phase::forward, "cross-entropy: target logit");
                add_reduce_partials(b, l, r, sh.vocabulary, BT, double(M), Phase::forward,
                                    "cross-entropy: sum of exponentials");
                add_reduce_partials(b, l, r, sh.vocabulary, BT * C, double(M), Phase::backward,
                                    "LM head (column parallel) backward");
            }
        }
    }

    // ---- the schedule: pipeline messages ----
    if (pp > 1) {
        i64 msg = BT * C;
        if (l.tp > 1 && l.sequence_parallel) {
            const tp::DimSplit tokens = tp::token_split(nx, BT, l.tp);
            msg = tokens.local(at.tp) * C;
        }
        const auto [sends, recvs] = schedule_messages(l, at.pp);
        b.add("pp", pp, at.pp, request(comm::Op::send, msg, act), sends, Phase::boundary,
              "activations and their gradients to the neighbouring stages");
        b.add("pp", pp, at.pp, request(comm::Op::recv, msg, act), recvs, Phase::boundary,
              "activations and their gradients from the neighbouring stages");
    }

    // ---- ZeRO-3 gathers ----
    const std::vector<i64> edges =
        zero >= 1 ? zero_shard_edges(st.table, zero_ranks, cfg.numerics.block) : std::vector<i64>{};
    const int zrank = zero >= 1 ? at.dp / l.ep : 0;
    const std::string zgroup = l.ep > 1 ? "edp" : "dp";
    if (zero == 3 && !units)
        b.add("dp", l.dp, at.dp, with_counts(comm::Op::all_gather_v, shard_counts(edges)), 1,
              Phase::gather, "ZeRO-3 weights gathered for the step");

    // ---- ZeroUnits: gathers and reduce-scatters unit by unit ----
    if (units) {
        // The units: the embedding, each layer, the head; their parameter and gradient spans.
        std::vector<std::pair<std::vector<Range>, std::vector<Range>>> spans;  // params, grads
        const auto span = [&](int a, int z) {
            const TableEntry& e = st.table.entries[static_cast<size_t>(z)];
            return Range{st.table.entries[static_cast<size_t>(a)].offset, e.offset + align16(e.numel())};
        };
        spans.push_back({{span(st.table.wte, st.table.embedding_last())},
                         {span(st.table.wte, st.table.embedding_last())}});
        for (int ly = 0; ly < mc.layers; ly++)
            if (st.table.has_layer(ly)) {
                const Range r = span(st.table.layer_first[ly], st.table.layer_last[ly]);
                spans.push_back({{r}, {r}});
            }
        if (st.part.tied)
            spans.push_back({{span(st.table.wte, st.table.wte), span(st.table.lnfw, st.table.head_last())},
                             {span(st.table.lnfw, st.table.head_last()), {st.head_offset, st.grad_total}}});
        else
            spans.push_back({{span(st.table.lnfw, st.table.head_last())},
                             {span(st.table.lnfw, st.table.head_last())}});
        const int p = zero_ranks;
        std::vector<i64> head_edges(edges.size(), 0);
        if (st.part.head_region()) {
            const TableEntry& wte = st.table.entries[static_cast<size_t>(st.table.wte)];
            for (size_t r = 0; r < edges.size(); r++)
                head_edges[r] = std::clamp<i64>(edges[r] - wte.offset, 0, wte.numel());
        }
        const double fwd = double(M) * (recompute ? 2 : 1);
        for (size_t u = 0; u < spans.size(); u++) {
            const bool embedding = u == 0;
            if (zero == 3)
                for (const Range& s : spans[u].first) {
                    std::vector<i64> counts(static_cast<size_t>(p));
                    for (int r = 0; r < p; r++)
                        counts[static_cast<size_t>(r)] =
                            std::max<i64>(0, std::min(s.hi, edges[r + 1]) - std::max(s.lo, edges[r]));
                    b.add("dp", l.dp, at.dp, with_counts(comm::Op::all_gather_v, counts),
                          fwd + (embedding ? 0 : double(M)), Phase::gather,
                          "ZeRO-3 weights of a unit gathered");
                }
            for (const Range& s : spans[u].second) {
                const bool in_head = s.lo >= st.head_offset && st.table.wte >= 0 &&
                                     st.head_offset < st.grad_total;
                std::vector<i64> cuts(edges.size());
                for (size_t r = 0; r < cuts.size(); r++)
                    cuts[r] = std::clamp(in_head ? st.head_offset + head_edges[r] : edges[r], s.lo, s.hi);
                add_cut(b, "dp", at.dp, cuts, double(M), Phase::gradients,
                        "ZeRO-2/3 gradients of a unit reduce-scattered");
            }
        }
    }

    // ---- reduce_grads: data, then pipeline's tied embedding ----
    if (!units) {
        std::vector<std::vector<Range>> owned(static_cast<size_t>(l.dp));
        for (const TokenRange& r : token_ranges(l))
            owned[static_cast<size_t>(r.dp_rank)].push_back({r.block_lo, r.block_hi});
        const NodePlan plan = l.cp == 1 ? make_plan(l.token_blocks(), owned) : NodePlan{};
        const int data_size = l.dp * l.cp, data_rank = at.dp * l.cp + at.cp;
        const std::string data_group = l.cp > 1 ? "data" : "dp";
        const bool rank_tree = l.cp > 1 ? true : plan.rank_tree;  // cp: not modelled exactly
        if (data_size > 1) {
            if (!rank_tree && l.mode == Mode::bitwise) {
                add_exchange(b, data_group, data_rank, plan, st.grad_total, 1, Phase::gradients,
                             "gradients combined in the token tree (tree exchange)");
            } else if (!rank_tree || zero < 2) {
                b.add(data_group, data_size, data_rank,
                      request(comm::Op::all_reduce, st.grad_total, comm::Dtype::f32, algo), 1,
                      Phase::gradients, "gradient all-reduce");
            } else {
                i64 from = 0;
                if (st.part.holds_wte()) {
                    const i64 n = st.table.entries[static_cast<size_t>(st.table.wte)].numel();
                    b.add("dp", l.dp, at.dp, request(comm::Op::all_reduce, n, comm::Dtype::f32, algo),
                          st.part.head_region() ? 2 : 1, Phase::gradients,
                          "ZeRO-2/3 embedding gradients all-reduced");
                    from = n;
                }
                std::vector<i64> cuts(edges.size());
                for (size_t r = 0; r < cuts.size(); r++)
                    cuts[r] = std::clamp(edges[r], from, st.table.total) - from;
                add_cut(b, "dp", at.dp, cuts, 1, Phase::gradients,
                        "ZeRO-2/3 gradients reduce-scattered");
            }
        }
    }
    if (pp > 1 && st.part.head_region() && l.last_stage_rank() != 0) {  // zbv adds them locally
        const i64 n = st.table.entries[static_cast<size_t>(st.table.wte)].numel();
        b.add("pp", pp, at.pp, request(comm::Op::send, n), 1, Phase::update,
              "tied embedding gradient to the other end of the pipeline");
        b.add("pp", pp, at.pp, request(comm::Op::recv, n), 1, Phase::update,
              "tied embedding gradient from the other end of the pipeline");
    }

    // ---- the gradient norm ----
    const bool zero_sharded = zero >= 2;
    std::vector<char> owned(st.table.entries.size(), 1);
    if (pp > 1 && zero_sharded && l.tp == 1) {  // a tensor's owner: the first stage holding it
        std::vector<int> owner(static_cast<size_t>(ParamTable::num_tensors(mc)), -1);
        for (int r = 0; r < pp; r++) {
            const ParamTable t = ParamTable::build(mc, stage_part(mesh, r, mc));
            for (const TableEntry& e : t.entries)
                if (owner[static_cast<size_t>(e.id)] < 0) owner[static_cast<size_t>(e.id)] = r;
        }
        for (size_t i = 0; i < owned.size(); i++)
            owned[i] = owner[static_cast<size_t>(st.table.entries[i].id)] == at.pp;
    }
    if (l.tp > 1) {
        // tp_sum_squares: the tp-sharded tensors' logical blocks summed over tp; under ZeRO-2/3
        // every tensor's over dp too.
        const ParamTable full = ParamTable::build(mc, st.part);
        i64 n_sharded = 0, total = 0;
        for (int pass = 0; pass < 2; pass++)
            for (size_t i = 0; i < st.table.entries.size(); i++) {
                const bool sharded = st.table.entries[i].numel() != full.entries[i].numel();
                if (pass == 0 ? !sharded : (sharded || !zero_sharded)) continue;
                const i64 nb = num_blocks(full.entries[i].numel(), cfg.numerics.block);
                total += nb;
                if (pass == 0) n_sharded += nb;
            }
        if (zero_sharded)
            b.add("dp", l.dp, at.dp, request(comm::Op::all_reduce, total), 1, Phase::update,
                  "gradient norm: ZeRO shards' block sums");
        b.add("tp", l.tp, at.tp, request(comm::Op::all_reduce, n_sharded), 1, Phase::update,
              "gradient norm: tp shards' block sums");
    } else if (zero_sharded) {
        b.add("dp", l.dp, at.dp,
              with_counts(comm::Op::all_gather_v,
                          shard_block_counts(st, edges, cfg.numerics.block, owned)),
              1, Phase::update, "gradient norm: ZeRO shards' block sums");
    }
    if (pp > 1)
        b.add("pp", pp, at.pp, request(comm::Op::all_gather, ParamTable::num_tensors(mc)), 1,
              Phase::update, "gradient norm: each stage's tensors");

    // ---- the loss: every token's, gathered on the last stage; then to every stage ----
    if (last) {
        if (l.cp > 1)
            b.add("data", l.dp * l.cp, at.dp * l.cp + at.cp,
                  request(comm::Op::all_gather, l.microbatch_size() * M * Tl), 1, Phase::update,
                  "per-token losses");
        else
            b.add("dp", l.dp, at.dp, request(comm::Op::all_gather, l.microbatch_size() * M * Tl),
                  1, Phase::update, "per-token losses");
    }
    if (pp > 1) {
        comm::Request r = request(comm::Op::broadcast, 1, comm::Dtype::f64);
        r.peer = l.last_stage_rank();  // the root: the last stage
        b.add("pp", pp, at.pp, r, 1, Phase::update, "the step's loss from the last stage");
    }

    // ---- after the update: ZeRO-1/2 gather the updated weights ----
    if (zero == 1 || zero == 2)
        b.add(zgroup, zero_ranks, zrank, with_counts(comm::Op::all_gather_v, shard_counts(edges)), 1,
              Phase::update, "ZeRO-1/2 updated weights gathered");

    // ---- context and expert parallelism: their parts' formulas ----
    if (l.cp > 1) {
        const CpCosts c = cp_costs(l, layers, micro_B);
        b.add("cp", l.cp, at.cp, request(comm::Op::send, static_cast<i64>(c.comm_bytes_per_step / 4)),
              1, Phase::forward, "context-parallel attention (formula)");
    }
    if (l.ep > 1 && mc.is_moe()) {
        i64 moe_layers = 0;
        for (const LayerSpan& c : st.part.chunks)
            for (int ly = c.lo; ly < c.hi; ly++) moe_layers += mc.moe_layer(ly) ? 1 : 0;
        const double bytes = ep_comm_bytes(mc, l.ep, moe_layers, micro_B, M, recompute);
        b.add("ep", l.ep, at.dp % l.ep, request(comm::Op::send, static_cast<i64>(bytes / 4)), 1,
              Phase::forward, "expert dispatch and combine (formula)");
    }
    return b.ops;
}

std::vector<GroupOpBytes> by_group_op(const std::vector<PlannedOp>& ops) {
    std::map<std::pair<std::string, std::string>, GroupOpBytes> m;
    for (const PlannedOp& o : ops) {
        GroupOpBytes& g = m[{o.group, comm::op_name(o.req.op)}];
        g.group = o.group;
        g.op = comm::op_name(o.req.op);
        const comm::Traffic t = o.bytes();
        g.calls += o.calls;
        g.sent += o.calls * double(t.sent);
        g.recv += o.calls * double(t.recv);
    }
    std::vector<GroupOpBytes> out;
    for (auto& [k, v] : m) out.push_back(v);
    return out;
}

}  // namespace px::plan
