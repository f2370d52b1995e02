// One layout's predicted memory, step time and MFU (plan.h): the memory estimate, the step's
// operations (traffic.h) timed on the cluster's links, and the layout's schedule simulated.
#include "validators/plan/plan.h"

#include "core/base/arena.h"
#include "core/base/error.h"
#include "core/parallel/mesh.h"
#include "validators/plan/traffic.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>

namespace px::plan {

namespace {

// The mesh distance between neighbours of a group (mesh.h's rank order: tp innermost, then cp,
// dp, pp), which decides whether the group stays inside a node.
int group_stride(const std::string& group, const Layout& l) {
    if (group == "tp") return 1;
    if (group == "cp" || group == "ep" || group == "data") return l.tp;
    if (group == "dp") return l.cp * l.tp;
    if (group == "edp") return l.ep * l.cp * l.tp;
    return l.dp * l.cp * l.tp;  // pp
}

// A group whose ranks lie in one node talks over NVLink; one that spans nodes is held to IB.
const Link& group_link(const PlannedOp& op, const Layout& l, const ClusterSpec& c) {
    const double span = double(group_stride(op.group, l)) * op.size;
    return span <= c.gpus_per_node ? c.nvlink : c.ib;
}

double log2_ceil(int p) { return std::ceil(std::log2(std::max(1, p))); }

// The layout's schedule, made once per shape (the planner simulates it for many layouts).
std::shared_ptr<const Schedule> schedule_of(const Layout& l) {
    static std::mutex mu;
    static std::map<std::array<int, 4>, std::shared_ptr<const Schedule>> known;
    const std::array<int, 4> key{static_cast<int>(l.schedule), l.pp, l.microbatches,
                                 l.virtual_stages};
    std::lock_guard lk(mu);
    auto& s = known[key];
    if (!s)
        s = std::make_shared<const Schedule>(
            make_schedule(l.schedule, l.pp, l.microbatches, l.virtual_stages));
    return s;
}

// One call's time: a latency term (the algorithm's sequential steps) and a bandwidth term (the
// larger of the bytes this rank sends and receives, as the runtime's algorithm moves them).
// All-reduce takes the faster of a ring and a tree (NCCL picks so): a tree moves the whole
// buffer twice in 2·log2(p) steps, a ring 2(p-1)/p of it in 2(p-1) steps.
double op_seconds(const PlannedOp& op, const Layout& l, const ClusterSpec& c) {
    const Link& link = group_link(op, l, c);
    const double a = link.latency_us * 1e-6, bw = link.bytes_per_s();
    const comm::Traffic t = op.bytes();
    const double moved = double(std::max(t.sent, t.recv));
    const int p = op.size;
    switch (op.req.op) {
        case comm::Op::all_reduce:
        case comm::Op::all_reduce_max: {
            const double ring = 2.0 * (p - 1) * a + moved / bw;
            const double whole = double(op.req.n) * double(comm::dtype_size(op.req.dtype));
            const double tree = 2.0 * log2_ceil(p) * a + 2.0 * whole / bw;
            return std::min(ring, tree);
        }
        case comm::Op::broadcast:
            return log2_ceil(p) * a + double(op.req.n) * double(comm::dtype_size(op.req.dtype)) / bw;
        case comm::Op::send:
        case comm::Op::recv:
            return a + moved / bw;
        default:  // reduce_scatter, all_gather(_v), all_to_all(_v): a ring of p-1 steps
            return (p - 1) * a + moved / bw;
    }
}

}  // namespace

ModelFlops model_flops(const ModelConfig& mc) {
    ModelFlops f;
    const ParamTable t = ParamTable::build(mc);
    const double E = double(resolve_dim(Dim::E, mc)), K = double(resolve_dim(Dim::K, mc));
    double layers = 0, head = 0;
    for (const TableEntry& e : t.entries) {
        if (e.is_vector()) continue;
        const double n = double(e.numel());
        if (e.layer < 0) {
            // wte: the tied LM head's matmul (the embedding is a lookup); lm_head: the untied one
            if ((e.spec == 0 && mc.tied_head()) || e.spec == kLmHeadSpec) head += n;
            continue;
        }
        const int i = e.spec - kFirstLayerSpec;
        const bool routed = (i >= EFCW && i <= EPROJB) || i == EUPW;
        layers += routed && E > 0 ? n * K / E : n;
    }
    const double L = double(mc.layers), T = double(mc.seq_len), CA = double(mc.attn_channels());
    const double attention = L * 4 * T * CA;  // QKᵀ and AV, every key (the MFU convention)
    f.matmul_params = layers + head;
    f.per_token_forward = 2 * (layers + head) + attention;
    f.layer_forward = (2 * layers + attention) / L;
    f.head_forward = 2 * head;
    return f;
}

SimOptions sim_options(double forward_s, double backward_s, double weight_s, int scale) {
    SimOptions o;
    const double slot = forward_s > 0 ? forward_s / scale : 1;
    const auto slots = [&](double s, int least) {
        return std::max(least, static_cast<int>(std::lround(s / slot)));
    };
    o.forward_slots = slots(forward_s, 1);
    // B and W apart (weight_slots): a schedule that splits the backward runs W as its own
    // action, the others run both in each backward.
    o.backward_slots = slots(backward_s, 1);
    o.weight_slots = weight_s > 0 ? slots(weight_s, 1) : 0;
    return o;
}

Candidate predict(const Config& cfg, const ClusterSpec& cl) {
    return predict(cfg, cl, model_flops(cfg.model));
}

Candidate predict(const Config& cfg, const ClusterSpec& cl, const ModelFlops& f) {
    const Layout l = make_layout(cfg);
    Candidate c;
    c.dp = l.dp, c.tp = l.tp, c.pp = l.pp, c.cp = l.cp, c.ep = l.ep;
    c.zero = l.dp / l.ep > 1 ? l.zero : 0;
    c.microbatches = l.microbatches, c.virtual_stages = l.virtual_stages;
    c.schedule = schedule_name(l.schedule), c.recompute = recompute_name(l.recompute);

    const MemoryEstimate e = estimate_memory(cfg, MemoryScope::one_rank);
    c.memory = e.items;
    c.memory_bytes = e.total;
    // Compute: the rate of one rank, and the FLOPs of a chunk's forward for one microbatch.
    const int N = l.world_size();
    const int sharing = cl.ranks_share_node ? std::min(N, cl.gpus_per_node) : 1;
    c.fits = e.total * sharing <= cl.usable_bytes();
    // Ranks sharing `cores` cores: each runs on a core of its own while they suffice; beyond,
    // the ranks' work takes crowd = N / cores times as long, but a stage idle in the bubble
    // hands its core to the others (the pipeline's time is at least the work, not work + bubble).
    const int cores = cl.ranks_share_node && cl.cores > 0 ? cl.cores : 0;
    const double crowd = cores > 0 && N > cores ? double(N) / cores : 1;
    const std::string dtype = cfg.precision.fp8 != "off" ? "fp8" : cfg.precision.activations;
    const double peak = peak_tflops(cl, dtype) * 1e12 / (cores > 0 ? std::min(N, cores) : sharing);
    const double rate = peak * cl.achievable;
    const double tokens = double(l.microbatch_size()) * double(l.seq_len) / (l.tp * l.cp);
    const int S = l.num_stages(), v = l.virtual_stages, M = l.microbatches;
    const double chunk_layers = std::ceil(double(l.layers) / S);
    const double last_layers = double(l.layers) - std::ceil(double(l.layers) * (S - 1) / S);
    const double fwd_chunk = chunk_layers * f.layer_forward * tokens / rate;
    const double fwd_last = (last_layers * f.layer_forward + f.head_forward) * tokens / rate;
    const double F = std::max(fwd_chunk, fwd_last);
    const double recompute_f = l.recompute == Recompute::full ? chunk_layers * f.layer_forward * tokens / rate : 0;
    const double B = 2 * F + recompute_f;

    // Communication of the first and the last stage's rank (dp, tp, cp coordinate 0).
    struct Rank {
        double fwd = 0, bwd = 0, boundary = 0, grads = 0, gather = 0, update = 0, other = 0;
        double sent = 0;
        int messages = 0;
    };
    const auto rank_comm = [&](int pp_rank) {
        Rank r;
        Coord at;
        at.pp = pp_rank;
        for (const PlannedOp& op : step_traffic(cfg, at)) {
            const double s = op.calls * op_seconds(op, l, cl);
            r.sent += op.calls * double(op.bytes().sent);
            const bool formula = op.what.find("(formula)") != std::string::npos;
            if (formula) {
                r.other += s;
                continue;
            }
            switch (op.phase) {
                case Phase::forward: r.fwd += s; break;
                case Phase::backward: r.bwd += s; break;
                case Phase::boundary: r.boundary += s, r.messages += int(op.calls); break;
                case Phase::gradients: r.grads += s; break;
                case Phase::gather: r.gather += s; break;
                case Phase::update: r.update += s; break;
            }
        }
        return r;
    };
    const Rank first = rank_comm(0), last = l.pp > 1 ? rank_comm(l.pp - 1) : first;
    const Rank& worst = first.fwd + first.bwd + first.grads + first.gather + first.update >=
                                last.fwd + last.bwd + last.grads + last.gather + last.update
                            ? first
                            : last;
    const double chunks = double(M) * v;
    const double tp_f = std::max(first.fwd, last.fwd) / chunks;
    const double tp_b = std::max(first.bwd, last.bwd) / chunks;
    // A stage's messages: one per chunk forward and backward, on the schedule's path.
    const double msg = std::max(first.boundary, last.boundary) /
                       std::max(1, std::max(first.messages, last.messages)) * 2;
    const double Fs = F + tp_f + (l.pp > 1 ? msg / 2 : 0);
    const double Bs = B + tp_b + (l.pp > 1 ? msg / 2 : 0);

    double pipeline = chunks * (Fs + Bs);
    if (l.pp > 1) {
        // W, the weight gradients, is half a backward's matmul FLOPs (no recompute in it).
        const double Ws = (B - recompute_f) / 2;
        const SimOptions so = sim_options(Fs, Bs - Ws, Ws);
        const SimResult r = check_schedule(*schedule_of(l), so);
        if (!r.ok()) throw Error("the planner's schedule simulation failed: " + r.problem);
        pipeline = double(r.makespan) * Fs / so.forward_slots;
        c.schedule_bubble = r.bubble;
    }
    const double busy = chunks * (Fs + Bs) * crowd;
    if (crowd > 1) pipeline = std::max(pipeline, busy);
    TimeTerms& t = c.time;
    t.compute = chunks * (F + B) * crowd;
    t.tp_comm = chunks * (tp_f + tp_b) * crowd;
    t.pp_comm = l.pp > 1 ? chunks * msg * crowd : 0;
    t.bubble = std::max(0.0, pipeline - busy);
    // The gradient reduction overlaps the last microbatch's backward, all but its last bucket
    // (a layer's gradients); under ZeroUnits each microbatch's units reduce under the next ones.
    const double stage_layers = std::max(1.0, chunk_layers * v);
    const bool units = l.microbatch_major();
    const double window = (units ? double(M) : 1.0) * v * B;
    t.dp_comm = worst.grads;
    t.dp_exposed = t.dp_comm > 0 ? std::max(t.dp_comm / (stage_layers * (units ? M : 1)),
                                            t.dp_comm - window)
                                 : 0;
    t.gather = worst.gather;
    t.gather_exposed = t.gather > 0 ? std::max(t.gather / (stage_layers * (units ? 2 * M : 1)),
                                               t.gather - chunks * (F + B))
                                    : 0;
    t.update = worst.update;
    t.other = std::max(first.other, last.other);
    t.step = pipeline + t.dp_exposed + t.gather_exposed + t.update + t.other;

    const double step_tokens = double(l.batch_size) * double(l.seq_len);
    c.model_flops = 3 * f.per_token_forward * step_tokens;
    c.mfu = c.model_flops / (t.step * N * peak);
    c.tokens_per_s = step_tokens / t.step;
    c.comm_bytes = std::max(first.sent, last.sent);
    return c;
}

}  // namespace px::plan
