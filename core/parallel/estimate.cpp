// The memory estimate's model-level pieces (estimate.h).
#include "core/parallel/estimate.h"

#include "core/parallel/data/token_tree.h"
#include "core/parallel/mesh.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <mutex>

namespace px {

namespace {

// The partial gradient buffers of a replica's token-tree accumulator in a step (the microbatches'
// nodes combined in microbatch order, as DataParallel runs them): ceil(log2 M) when every range is
// a node; more when a replica's or a microbatch's tokens are several nodes (dp = 3, ...). The most
// over the replicas, every one up to 24 of them, else over the first 16 and 8 spread over the rest
// (ranges of the same shape make the same buffers, and a layout of thousands of replicas has a
// few shapes).
double tree_buffers(const Config& c, double M) {
    const double nodes_formula = M > 1 ? std::ceil(std::log2(M)) : 0;
    const i64 dp = c.layout.dp, m = static_cast<i64>(M), T = c.model.seq_len, blk = c.numerics.block;
    const i64 B = c.train.batch_size;
    if (c.layout.cp > 1 || dp < 1 || m < 1 || blk < 1 || B % (dp * m) != 0) return nodes_formula;
    const i64 mbs = B / (dp * m), N = B * T, nb = num_blocks(N, blk);
    if ((mbs * T) % blk != 0) return nodes_formula;  // make_layout refuses it
    // Too many microbatches to run the accumulator on (it walks each one's nodes): the formula,
    // which counts a node per level (the shape of every layout whose ranges are nodes).
    if (m > 4096) return nodes_formula;
    // Remembered per shape: the planner and check_memory's search ask again and again.
    static std::mutex mu;
    static std::map<std::array<i64, 5>, double> known;
    const std::array<i64, 5> key{B, T, blk, dp, m};
    {
        std::lock_guard lk(mu);
        if (const auto it = known.find(key); it != known.end()) return it->second;
    }
    std::vector<i64> ranks;
    for (i64 d = 0; d < dp; d++)
        if (dp <= 24 || d < 16 || (d - 16) % std::max<i64>(1, (dp - 16) / 8) == 0 || d == dp - 1)
            ranks.push_back(d);
    double most = 0;
    float result = 0;
    for (i64 d : ranks) {
        std::vector<std::vector<Range>> leaves;
        for (i64 k = 0; k < m; k++) {
            const i64 lo = (d * m + k) * mbs * T / blk, hi = (d * m + k + 1) * mbs * T / blk;
            leaves.push_back(maximal_nodes(nb, lo, std::min(hi, nb)));
        }
        TreeAccumulator acc(nb, std::move(leaves), &result, 1, GradSpan{0, 1});
        for (int k = 0; k < m; k++) {
            acc.begin(k);
            acc.end(k);
        }
        most = std::max(most, double(acc.buffers()));
    }
    std::lock_guard lk(mu);
    known[key] = most;
    return most;
}

}  // namespace

MemorySizes memory_sizes(const Config& c) {
    MemorySizes s{};
    const ModelConfig& m = c.model;
    s.V = double(m.vocab), s.T = double(m.seq_len), s.L = double(m.layers);
    s.NH = double(m.heads), s.C = double(m.hidden), s.F = double(m.ffn);
    s.E = double(resolve_dim(Dim::E, m)), s.K = double(resolve_dim(Dim::K, m));
    s.FE = double(resolve_dim(Dim::FE, m)), s.FS = double(resolve_dim(Dim::FS, m));
    s.FM = double(resolve_dim(Dim::FM, m));
    for (i64 l = 0; l < m.layers; l++) s.moe_layers += m.moe_layer(l) ? 1 : 0;
    s.CA = double(m.attn_channels()), s.KV = double(m.kv_channels());
    s.KVH = double(m.kv_head_count()), s.HS = double(m.head_size());
    s.kv_split = kv_split(m, c.layout.tp);
    s.model = m;
    s.tp = c.layout.tp, s.pp = c.layout.pp, s.v = c.layout.virtual_stages;
    if (c.layout.schedule == "zbv" && s.pp > 1) s.v = 2;  // its V, as make_layout sets it
    s.S = s.pp * s.v;
    s.dp = c.layout.dp;
    s.cp = c.layout.cp;
    s.ep = c.layout.ep;
    s.zero = c.layout.dp / std::max(c.layout.ep, 1) > 1 ? c.layout.zero : 0;
    s.M = double(c.layout.microbatches > 0 ? c.layout.microbatches : c.train.microbatches);
    s.tree_buffers = tree_buffers(c, s.M);
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
double memory_dim(Dim d, const MemorySizes& s, double B) {
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
            return 3 * s.CA / s.tp;
        case Dim::F:
            return s.F / s.tp;
        case Dim::NH:
            return s.NH / s.tp;
        case Dim::CA:
            return s.CA / s.tp;
        case Dim::KV:
            return s.KV / (s.kv_split ? s.tp : 1);
        case Dim::KVH:
            return s.KVH / (s.kv_split ? s.tp : 1);
        case Dim::HS:
            return s.HS;
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
namespace {

double param_floats(const ParamSpec& p, const MemorySizes& s) {
    return memory_dim(p.rows, s, 1) * memory_dim(p.cols, s, 1) + 16;
}

}  // namespace


StageParams stage_params(const MemorySizes& s) {
    StageParams p;
    const ModelConfig& m = s.model;
    p.wte = param_floats(kParams[0], s);
    p.wpe = arch_holds(m, 1) ? param_floats(kParams[1], s) : 0;
    p.head_wte = m.tied_head() ? p.wte : 0;
    // a layer's floats: the mean over the model's dense and MoE layers (a MoE layer's plain MLP
    // is its shared experts', FS wide, absent without them)
    double dense = 0, moe = 0;
    MemorySizes shared = s;
    shared.F = s.FS;
    for (int i = 0; i < kNumLayerParams; i++) {
        const ParamSpec& spec = kParams[kFirstLayerSpec + i];
        if (!arch_holds(m, kFirstLayerSpec + i)) continue;
        const bool routed = (i >= ROUTERW && i <= EPROJB) || i == EUPW;
        const bool plain = (i >= FCW && i <= FCPROJB) || i == UPW;
        if (!routed) dense += param_floats(spec, s);
        if (plain)
            moe += s.FS > 0 ? param_floats(spec, shared) : 0;
        else
            moe += !routed || s.E > 0 ? param_floats(spec, s) : 0;
    }
    p.layer = (dense * (s.L - s.moe_layers) + moe * s.moe_layers) / s.L;
    // the head's own: ln_f (and its bias), and an untied lm_head
    for (int i = kLnfWSpec; i < kNumParamSpecs; i++)
        if (arch_holds(m, i)) p.lnf += param_floats(kParams[i], s);
    return p;
}

// Activation bytes of one microbatch on `layers` layers in `chunks` model chunks, `heads` of
// which end in the LM head (kActs: a block's internals per layer, or per chunk when blocks
// are recomputed; the residual stream per layer; scratch per chunk; the head's tensors per head).
double activation_set_bytes(const MemorySizes& s, double layers, double chunks, double heads) {
    double total = 0;
    for (const ActSpec& a : kActs) {
        if (!arch_keeps(s.model, a)) continue;
        double n = memory_dim(a.d0, s, s.micro_B) * memory_dim(a.d1, s, s.micro_B) *
                   memory_dim(a.d2, s, s.micro_B) * memory_dim(a.d3, s, s.micro_B);
        if (&a == &kActs[ATT]) n *= s.T;
        const auto has = [&](Dim d) { return a.d0 == d || a.d1 == d || a.d2 == d || a.d3 == d; };
        if (a.head)
            n *= heads;
        else if (has(Dim::L))
            n *= layers;
        else if (has(Dim::LS))
            n *= s.recompute ? chunks : layers;
        else
            n *= chunks;
        total += n * (a.type == ActType::f32 ? kEstimateFloat : s.act_bytes) + 64 * chunks;
    }
    return total;
}

}  // namespace px
