// The memory estimate of a job (memory.h): per rank from the config's keys, in doubles.
#include "core/train/memory.h"

#include "core/base/arena.h"
#include "core/base/error.h"
#include "core/parallel/mesh.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace px {

namespace {

constexpr double kFloat = 4;  // bytes: weights, gradients, moments and losses are fp32

// The sizes of a config that the estimate reads, as doubles (none of them overflows).
struct Sizes {
    double V, T, L, NH, C, F;  // model
    double tp, pp, v, S, dp;   // layout: S = pp · v virtual stages
    double cp;                 // context-parallel ranks: replicas of the weights, each with T/cp
                               // tokens of a sequence (estimated as whole sequences: an upper
                               // bound)
    double ep;                 // expert-parallel ranks: E/ep experts each, rows from ep ranks
    int zero;                  // effective ZeRO stage (0 with one replica)
    double M;                  // microbatches per replica and step
    double B, micro_B, local_B, VB;
    bool recompute, microbatch_major, eval;
    std::string schedule;
    double act_bytes;  // bytes of an activation in the run's dtype
    double markov;     // bytes of one Markov source's tables (0 for token files)
    bool init_from, export_llmc;
    double fp8_state;  // floats of fp8 delayed scaling's scales and histories (every rank's)
    double E, K, FE, FS, FM;  // MoE (core/base/arena.h Dim): 0 without, FM = F
    double moe_layers;        // layers that are MoE
};

Sizes sizes_of(const Config& c) {
    Sizes s{};
    const ModelConfig& m = c.model;
    s.V = double(m.vocab), s.T = double(m.seq_len), s.L = double(m.layers);
    s.NH = double(m.heads), s.C = double(m.hidden), s.F = double(m.ffn);
    s.E = double(resolve_dim(Dim::E, m)), s.K = double(resolve_dim(Dim::K, m));
    s.FE = double(resolve_dim(Dim::FE, m)), s.FS = double(resolve_dim(Dim::FS, m));
    s.FM = double(resolve_dim(Dim::FM, m));
    for (i64 l = 0; l < m.layers; l++) s.moe_layers += m.moe_layer(l) ? 1 : 0;
    s.tp = c.layout.tp, s.pp = c.layout.pp, s.v = c.layout.virtual_stages, s.S = s.pp * s.v;
    s.dp = c.layout.dp;
    s.cp = c.layout.cp;
    s.ep = c.layout.ep;
    s.zero = c.layout.dp / std::max(c.layout.ep, 1) > 1 ? c.layout.zero : 0;
    s.M = double(c.layout.microbatches > 0 ? c.layout.microbatches : c.train.microbatches);
    s.B = double(c.train.batch_size);
    s.local_B = s.B / s.dp;
    s.micro_B = s.local_B / s.M;
    s.VB = double(c.train.val_batches);
    s.eval = c.train.eval_every > 0;
    s.recompute = c.layout.recompute == "full";
    {  // as Layout::microbatch_major decides it (ZeroUnits when every piece is a tree node)
        Layout l;
        l.dp = c.layout.dp, l.pp = c.layout.pp, l.zero = s.zero;
        l.microbatches = static_cast<int>(s.M);
        l.batch_size = c.train.batch_size, l.seq_len = m.seq_len, l.block = c.numerics.block;
        s.microbatch_major = l.microbatch_major();
    }
    s.schedule = c.layout.schedule;
    s.act_bytes = double(dtype_size(activation_dtype(c.precision)));
    if (c.precision.fp8 == "delayed")  // (scale + history) per role of at most 4 linears per
                                       // layer (precision.fp8_layers) and the LM head
        s.fp8_state = (4 * s.L + (c.precision.fp8_lm_head ? 1 : 0)) * 3 *
                      (1 + double(c.precision.fp8_amax_history_len));
    if (c.data.source == "markov" || c.data.source == "mixture") {
        const bool mix = c.data.source == "mixture";
        const double all = double(c.data.markov_vocab > 0 ? c.data.markov_vocab : m.vocab);
        const double n = mix ? double(c.data.mixture_chains) : 1.0;
        const double V = mix ? std::floor(all / n) : all;  // each chain's symbols
        const double states = std::pow(V, double(c.data.markov_order));
        s.markov = n * (16 * states * V + 24 * states);  // rows and their cdf; pi, its cdf, scratch
    }
    s.init_from = !m.init_from.empty();
    s.export_llmc = !c.output.export_llmc.empty();
    return s;
}

// A dimension on one tensor-parallel rank (core/base/arena.h TpDims; the vocabulary is cut in
// rows, the first ranks taking the extra ones).
double dim(Dim d, const Sizes& s, double B) {
    switch (d) {
        case Dim::one:
            return 1;
        case Dim::V:
            return std::ceil(s.V / s.tp);
        case Dim::T:
            return s.T;
        case Dim::C:
            return s.C;
        case Dim::C3:
            return 3 * s.C / s.tp;
        case Dim::F:
            return s.F / s.tp;
        case Dim::NH:
            return s.NH / s.tp;
        case Dim::CA:
            return s.C / s.tp;
        case Dim::E:
            return s.E;
        case Dim::FE:
            return s.FE;
        case Dim::EL:
            return s.E / s.ep;
        case Dim::EFE:
            return s.E / s.ep * s.FE;
        case Dim::EC:
            return s.E / s.ep * s.C;
        case Dim::RFE:
            return s.ep * s.K * s.FE;
        case Dim::RC:
            return s.ep * s.K * s.C;
        case Dim::FS:
            return s.FS;
        case Dim::K:
            return s.K;
        case Dim::KFE:
            return s.K * s.FE;
        case Dim::KC:
            return s.K * s.C;
        case Dim::FM:  // a dense layer's ffn shard, or the shared experts held whole
            return std::max(s.moe_layers < s.L ? s.F / s.tp : 0.0, s.FS);
        case Dim::B:
            return B;
        case Dim::L:
        case Dim::LS:
            return 1;  // counted by the caller
    }
    return 1;
}

// Floats of one parameter spec on a tp rank, with the table's alignment.
double param_floats(const ParamSpec& p, const Sizes& s) {
    return dim(p.rows, s, 1) * dim(p.cols, s, 1) + 16;
}

struct Params {
    double wte = 0, wpe = 0, layer = 0, lnf = 0;
};

Params params_of(const Sizes& s) {
    Params p;
    p.wte = param_floats(kGpt2Params[0], s);
    p.wpe = param_floats(kGpt2Params[1], s);
    // a layer's floats: the mean over the model's dense and MoE layers (a MoE layer's plain MLP
    // is its shared experts', FS wide, absent without them)
    double dense = 0, moe = 0;
    Sizes shared = s;
    shared.F = s.FS;
    for (int i = 0; i < kNumLayerParams; i++) {
        const ParamSpec& spec = kGpt2Params[kFirstLayerSpec + i];
        if (i < kNumDenseLayerParams) dense += param_floats(spec, s);
        if (i < FCW || i > FCPROJB)
            moe += i < kNumDenseLayerParams || s.E > 0 ? param_floats(spec, s) : 0;
        else if (s.FS > 0)
            moe += param_floats(spec, shared);
    }
    p.layer = (dense * (s.L - s.moe_layers) + moe * s.moe_layers) / s.L;
    for (int i = kFirstLayerSpec + kNumLayerParams; i < kNumParamSpecs; i++)
        p.lnf += param_floats(kGpt2Params[i], s);
    return p;
}

// Activation bytes of one microbatch on `layers` layers in `chunks` model chunks, `heads` of
// which end in the LM head (kGpt2Acts: a block's internals per layer, or per chunk when blocks
// are recomputed; the residual stream per layer; scratch per chunk; the head's tensors per head).
double activation_bytes(const Sizes& s, double layers, double chunks, double heads) {
    double total = 0;
    for (const ActSpec& a : kGpt2Acts) {
        double n = dim(a.d0, s, s.micro_B) * dim(a.d1, s, s.micro_B) * dim(a.d2, s, s.micro_B) *
                   dim(a.d3, s, s.micro_B);
        if (&a == &kGpt2Acts[ATT]) n *= s.T;
        const auto has = [&](Dim d) { return a.d0 == d || a.d1 == d || a.d2 == d || a.d3 == d; };
        if (a.head)
            n *= heads;
        else if (has(Dim::L))
            n *= layers;
        else if (has(Dim::LS))
            n *= s.recompute ? chunks : layers;
        else
            n *= chunks;
        total += n * (a.type == ActType::f32 ? kFloat : s.act_bytes) + 64 * chunks;
    }
    return total;
}

// Activation sets a chunk keeps at once: the trivial schedule one, GPipe every microbatch,
// 1F1B at most the pipeline's depth (interleaved: about twice that, over its chunks).
double slots(const Sizes& s) {
    if (s.pp == 1) return 1;
    if (s.schedule == "gpipe") return s.M;
    if (s.schedule == "interleaved") return std::min(s.M, 2 * s.pp);
    return std::min(s.M, s.pp);
}

// The parts of the estimate, in the order they are listed.
enum Item : size_t {
    kWeights,
    kGradients,
    kMoments,
    kActivations,
    kBatch,
    kValidation,
    kData,
    kBookkeeping,
    kCopies,
    kItems
};
constexpr const char* kItemNames[] = {"weights",
                                      "gradients",
                                      "AdamW moments",
                                      "activations",
                                      "token and loss buffers",
                                      "validation losses",
                                      "data tables",
                                      "bookkeeping",
                                      "whole-model copies"};
static_assert(sizeof(kItemNames) / sizeof(kItemNames[0]) == kItems, "a name per Item");

// A group of `ranks` stage ranks (a whole pipeline, or one rank) holding P parameter floats,
// `layers` layers in `chunks` chunks, `heads` LM heads and `lasts` last stages, times `copies`
// (replicas × tp ranks).
struct Group {
    double P, layers, chunks, heads, ranks, lasts, copies;
};

void add_group(std::vector<MemoryItem>& items, const Sizes& s, const Params& p, const Group& g) {
    auto add = [&](size_t i, double bytes) { items[i].bytes += bytes * g.copies; };
    const double unit = std::max({p.layer, p.wte + p.wpe, p.wte + p.lnf});  // a ZeRO unit
    const double P = g.P;
    // weights
    if (s.zero == 3 && s.microbatch_major)
        add(kWeights, kFloat * (P / s.dp + 2 * unit * g.ranks));
    else
        add(kWeights, kFloat * P);
    // gradients: the buffer, and the microbatch tree's partial buffers; under ep also one buffer
    // (and tree) per rank of the ep group for its token nodes of this rank's experts
    if (s.zero >= 2 && s.microbatch_major)
        add(kGradients, kFloat * (P / s.dp + 2 * unit * g.ranks));
    else
        add(kGradients, kFloat * P * (1 + (s.M > 1 ? std::ceil(std::log2(s.M)) : 0)) *
                            (1 + (s.ep > 1 ? s.ep : 0)));
    // AdamW moments
    add(kMoments, 2 * kFloat * P / (s.zero >= 1 ? s.dp / s.ep : 1));  // ep: over dp/ep replicas
    // activations
    add(kActivations, slots(s) * activation_bytes(s, g.layers, g.chunks, g.heads));
    // the batch: windows, inputs, targets, losses, every token's loss, the replicas' gathered
    const double BT = s.B * s.T;
    add(kBatch, g.ranks * kFloat *
                    (s.local_B * (s.T + 1) + 3 * s.local_B * s.T + BT + (s.dp > 1 ? BT : 0)));
    // validation losses, on the last stages
    if (s.eval)
        add(kValidation, g.lasts * kFloat * s.VB * (s.local_B * s.T + (s.dp > 1 ? 2 * BT : 0)));
    // data tables
    add(kData, g.ranks * s.markov);
    // bookkeeping: the schedule's actions, token ranges, the token tree, tensor tables, fp8 state
    add(kBookkeeping,
        g.ranks * (6 * s.M * s.S * 32 + s.dp * s.M * 48 + 2 * s.M * 32 + 3 * (4 + 12 * s.L) * 96 +
                   kFloat * s.fp8_state));
    // whole-model copies: weights read whole for a tp shard, the final weights for llm.c
    const double full = (p.wte + p.wpe + s.L * p.layer + p.lnf) * s.tp;
    add(kCopies,
        g.ranks * kFloat * full * ((s.init_from && s.tp > 1 ? 1 : 0) + (s.export_llmc ? 2 : 0)));
}

// ---- the budget ----

// A number of bytes from a file holding one (cgroup files); < 0 when absent or "max".
double read_bytes(const std::string& path) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text == "max") return -1;
    try {
        return std::stod(text);
    } catch (const std::exception&) {
        return -1;
    }
}

// The room left under this process's cgroup limits, or < 0 when there are none.
double cgroup_room(std::string& source) {
    double room = -1;
    std::ifstream cg("/proc/self/cgroup");
    std::string line;
    while (std::getline(cg, line)) {
        if (line.rfind("0::", 0) == 0) {  // cgroup v2: this group and its ancestors
            std::string path = line.substr(3);
            for (;;) {
                const std::string dir = "/sys/fs/cgroup" + (path == "/" ? "" : path);
                const double max = read_bytes(dir + "/memory.max");
                const double cur = read_bytes(dir + "/memory.current");
                if (max >= 0 && cur >= 0 && (room < 0 || max - cur < room)) {
                    room = std::max(0.0, max - cur);
                    source = "the cgroup limit " + dir + "/memory.max";
                }
                const size_t slash = path.find_last_of('/');
                if (slash == std::string::npos || slash == 0) {
                    if (path == "/" || path.empty()) break;
                    path = "/";
                } else {
                    path.resize(slash);
                }
            }
        }
    }
    // cgroup v1: a limit near 2^63 means none.
    const double max = read_bytes("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    const double cur = read_bytes("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    if (max >= 0 && cur >= 0 && max < 1e18 && (room < 0 || max - cur < room)) {
        room = std::max(0.0, max - cur);
        source = "the cgroup limit /sys/fs/cgroup/memory/memory.limit_in_bytes";
    }
    return room;
}

std::string number(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    return buf;
}

// The size keys the estimate grows with, and their smallest values.
struct Knob {
    const char* key;
    i64 min;
    i64 (*get)(const Config&);
    void (*set)(Config&, i64);
};

#define PX_KNOB(sec, key, min, type)                                                              \
    Knob {                                                                                        \
#sec "." #key, min,                                                                       \
            [](const Config&                                                                      \
                   c) { return i64(c.sec.key); }, [](Config & c,                                  \
                                                     i64 v) { c.sec.key = static_cast<type>(v); } \
    }
constexpr Knob kKnobs[] = {
    PX_KNOB(train, batch_size, 1, i64),   PX_KNOB(model, seq_len, 1, i64),
    PX_KNOB(model, layers, 1, i64),       PX_KNOB(model, hidden, 1, i64),
    PX_KNOB(model, ffn, 1, i64),          PX_KNOB(model, vocab, 2, i64),
    PX_KNOB(model, heads, 1, i64),        PX_KNOB(train, val_batches, 1, i64),
    PX_KNOB(data, markov_order, 1, i64),  PX_KNOB(layout, dp, 1, int),
    PX_KNOB(layout, pp, 1, int),          PX_KNOB(layout, tp, 1, int),
    PX_KNOB(train, microbatches, 1, i64), PX_KNOB(layout, microbatches, 1, int),
};
#undef PX_KNOB

}  // namespace

MemoryEstimate estimate_memory(const Config& cfg, MemoryScope scope, const MemoryExtras& extras) {
    const Sizes s = sizes_of(cfg);
    const Params p = params_of(s);
    MemoryEstimate e;
    e.items.resize(kItems);
    for (size_t i = 0; i < kItems; i++) e.items[i].what = kItemNames[i];
    const double chunk_layers = std::ceil(s.L / s.S);  // the longest chunk
    if (scope == MemoryScope::process) {
        // Every stage of the pipeline once (the wte of the LM head again on the last one when
        // the pipeline has several), times the replicas and tp ranks.
        const double P = p.wte + p.wpe + s.L * p.layer + p.lnf + (s.pp > 1 ? p.wte : 0);
        add_group(e.items, s, p, {P, s.L, s.S, 1, s.pp, 1, s.dp * s.cp * s.tp});
        e.ranks = static_cast<i64>(s.dp * s.cp * s.tp * s.pp);  // < 2^31 (validate_config)
    } else {
        // The larger of the first and the last stage (each with the longest chunks).
        const double layers = s.v * chunk_layers;
        const bool one = s.pp == 1;
        std::vector<MemoryItem> first(kItems), last(kItems);
        add_group(first, s, p,
                  {p.wte + p.wpe + layers * p.layer + (one ? p.lnf : 0), layers, s.v,
                   one ? 1.0 : 0.0, 1, one ? 1.0 : 0.0, 1});
        add_group(last, s, p, {p.wte + p.lnf + layers * p.layer, layers, s.v, 1, 1, 1, 1});
        double a = 0, b = 0;
        for (size_t i = 0; i < kItems; i++) a += first[i].bytes, b += last[i].bytes;
        for (size_t i = 0; i < kItems; i++) e.items[i].bytes = (a >= b ? first : last)[i].bytes;
    }
    if (extras.dump)  // the logical state: weights and both moments of the whole model
        e.items[kCopies].bytes += 3 * kFloat * (p.wte + p.wpe + s.L * p.layer + p.lnf) * s.tp;
    for (const MemoryItem& i : e.items) e.total += i.bytes;
    return e;
}

MemoryBudget memory_budget(const Config& cfg, int processes_on_node) {
    MemoryBudget b;
    if (cfg.train.max_memory_gib > 0) {
        b.bytes = cfg.train.max_memory_gib * 1024 * 1024 * 1024;
        b.source = "train.max_memory_gib = " + number(cfg.train.max_memory_gib);
        return b;
    }
    b.bytes = -1;
    std::ifstream mi("/proc/meminfo");
    std::string line;
    while (std::getline(mi, line)) {
        if (line.rfind("MemAvailable:", 0) != 0) continue;
        std::istringstream in(line.substr(13));
        double kb = 0;
        if (in >> kb) {
            b.bytes = kb * 1024;
            b.source = "MemAvailable in /proc/meminfo";
        }
    }
    std::string cg_source;
    const double room = cgroup_room(cg_source);
    if (room >= 0 && (b.bytes < 0 || room < b.bytes)) {
        b.bytes = room;
        b.source = cg_source;
    }
    if (b.bytes < 0) {  // nothing to read (not Linux?): no check but the limits of the config
        b.bytes = 1e300;
        b.source = "no limit found";
    }
    if (processes_on_node > 1) {
        b.bytes /= processes_on_node;
        b.source += ", shared by the " + std::to_string(processes_on_node) +
                    " processes of this job on the node";
    }
    return b;
}

std::string format_bytes(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (bytes >= 1024 && u < 6) bytes /= 1024, u++;
    char buf[48];
    if (u == 0)
        std::snprintf(buf, sizeof buf, "%.0f B", bytes);
    else
        std::snprintf(buf, sizeof buf, "%.3g %s", bytes, units[u]);
    return buf;
}

void check_memory(const Config& cfg, MemoryScope scope, int processes_on_node,
                  const MemoryExtras& extras) {
    const MemoryEstimate e = estimate_memory(cfg, scope, extras);
    const MemoryBudget b = memory_budget(cfg, processes_on_node);
    if (e.total <= b.bytes) return;

    // The key to lower: of those that alone can make the job fit, the one that needs the least
    // change (the largest fraction of its value that fits); if none can, the one whose halving
    // saves the most.
    const Knob* best = nullptr;
    i64 best_fit = -1;
    double best_score = -1;
    for (const Knob& k : kKnobs) {
        const i64 now = k.get(cfg);
        if (now <= k.min) continue;
        Config c = cfg;
        k.set(c, k.min);
        if (estimate_memory(c, scope, extras).total <= b.bytes) {
            i64 lo = k.min, hi = now;  // lo fits, hi does not
            while (hi - lo > 1) {
                const i64 mid = lo + (hi - lo) / 2;
                k.set(c, mid);
                (estimate_memory(c, scope, extras).total <= b.bytes ? lo : hi) = mid;
            }
            const double score = 2 + double(lo) / double(now);  // above any saving's score
            if (score > best_score) best_score = score, best = &k, best_fit = lo;
        } else if (best_fit < 0) {
            k.set(c, std::max(k.min, now / 2));
            const double score = (e.total - estimate_memory(c, scope, extras).total) / e.total;
            if (score > best_score) best_score = score, best = &k;
        }
    }
    std::vector<MemoryItem> parts = e.items;
    std::sort(parts.begin(), parts.end(),
              [](const MemoryItem& a, const MemoryItem& b) { return a.bytes > b.bytes; });
    std::string list;
    for (const MemoryItem& i : parts)
        if (i.bytes > 0.001 * e.total)
            list += (list.empty() ? "" : ", ") + i.what + " " + format_bytes(i.bytes);
    std::string msg = cfg.source_name + ": the job needs about " + format_bytes(e.total) +
                      " of memory in this process (" +
                      (scope == MemoryScope::process
                           ? std::to_string(e.ranks) + " rank" + (e.ranks == 1 ? "" : "s")
                           : std::string("one rank")) +
                      ": " + list + "), more than the " + format_bytes(b.bytes) + " available (" +
                      b.source + ") by " + format_bytes(e.total - b.bytes);
    if (b.bytes > 0) {
        char ratio[32];
        const double r = e.total / b.bytes;
        std::snprintf(ratio, sizeof ratio, r < 10 ? " (%.1fx)" : " (%.0fx)", r);
        msg += ratio;
    }
    if (best) {
        msg += std::string("; ") + best->key + " = " + std::to_string(best->get(cfg)) +
               " makes it too big";
        if (best_fit >= 0)
            msg += ": with " + std::string(best->key) + " <= " + std::to_string(best_fit) +
                   " it would fit";
        else
            msg += ", but even " + std::string(best->key) + " = " + std::to_string(best->min) +
                   " would not fit: lower the model's sizes or the batch";
    }
    msg += b.source.rfind("train.max_memory_gib", 0) == 0
               ? " (or raise train.max_memory_gib)"
               : " (set train.max_memory_gib to allow more, if the machine has it)";
    throw ConfigError(msg);
}

}  // namespace px
