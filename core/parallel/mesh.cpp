// The layout and its mesh: resolution of the [layout] keys, the validation sentences, token
// ranges in the canonical tree, and rank arithmetic.
#include "core/parallel/mesh.h"

#include "core/base/error.h"

#include <climits>
#include <cmath>
#include <cstdio>

namespace px {

namespace {

std::string str(i64 v) {
    return std::to_string(v);
}

std::string number(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    return buf;
}

void at_least(const std::string& key, i64 v, i64 min) {
    if (v < min)
        throw ConfigError(key + " = " + str(v) + " is out of range: must be >= " + str(min));
}

// dp × microbatches divides the batch: every dp rank runs the same number of equal microbatches.
void check_microbatches_divide_batch(const Layout& l) {
    const i64 dpm = static_cast<i64>(l.dp) * l.microbatches;
    if (l.batch_size % dpm != 0)
        throw ConfigError("layout.dp=" + str(l.dp) + " × " + l.microbatches_key + "=" +
                          str(l.microbatches) + " = " + str(dpm) +
                          " does not divide train.batch_size=" + str(l.batch_size) +
                          ": every dp rank runs the same number of equal microbatches "
                          "(batch_size = dp × microbatches × sequences per microbatch)");
}

}  // namespace

const char* recompute_name(Recompute r) {
    return r == Recompute::full ? "full" : "none";
}

const char* cp_method_name(CpMethod m) {
    return m == CpMethod::ulysses ? "ulysses" : "ring";
}

const char* dim_name(MeshDim d) {
    switch (d) {
        case MeshDim::pp:
            return "pp";
        case MeshDim::dp:
            return "dp";
        case MeshDim::cp:
            return "cp";
        case MeshDim::tp:
            return "tp";
    }
    return "?";
}

// ---- the layout ------------------------------------------------------------------------------

Layout make_layout(const LayoutConfig& lc, const ModelConfig& mc, const TrainConfig& tc,
                   const NumericsConfig& nc) {
    Layout l;
    l.dp = lc.dp;
    l.pp = lc.pp;
    l.tp = lc.tp;
    l.cp = lc.cp;
    l.ep = lc.ep;
    if (lc.cp_method == "ring")
        l.cp_method = CpMethod::ring;
    else if (lc.cp_method == "ulysses")
        l.cp_method = CpMethod::ulysses;
    else
        throw ConfigError("layout.cp_method must be \"ring\" or \"ulysses\", got \"" +
                          lc.cp_method + "\"");
    l.zero = lc.zero;
    if (lc.microbatches > 0) {
        l.microbatches = lc.microbatches;
        l.microbatches_key = "layout.microbatches";
    } else {
        if (tc.microbatches > INT_MAX)
            throw ConfigError("train.microbatches = " + str(tc.microbatches) +
                              " is out of range: must fit in 32 bits");
        l.microbatches = static_cast<int>(tc.microbatches);
        l.microbatches_key = "train.microbatches";
    }
    l.schedule = parse_schedule(lc.schedule);
    l.virtual_stages = lc.virtual_stages;
    // zbv's V runs two chunks per rank: layout.virtual_stages may stay at its default of 1.
    if (l.schedule == ScheduleKind::zbv && l.virtual_stages == 1 && lc.pp > 1) l.virtual_stages = 2;
    if (lc.recompute == "none")
        l.recompute = Recompute::none;
    else if (lc.recompute == "full")
        l.recompute = Recompute::full;
    else
        throw ConfigError("layout.recompute must be \"none\" or \"full\", got \"" + lc.recompute +
                          "\"");
    l.mode = nc.mode;
    if (lc.comm == "auto")
        l.algo = comm::algo_for(nc.mode);
    else if (lc.comm == "canonical")
        l.algo = comm::Algo::canonical;
    else if (lc.comm == "ring")
        l.algo = comm::Algo::ring;
    else
        throw ConfigError("layout.comm must be \"auto\", \"canonical\" or \"ring\", got \"" +
                          lc.comm + "\"");
    l.timeout_s = lc.timeout_s;
    l.layers = mc.layers;
    l.heads = mc.heads;
    l.hidden = mc.hidden;
    l.ffn = mc.ffn;
    l.experts = mc.moe_experts;
    l.expert_ffn = mc.is_moe() ? mc.expert_ffn() : 0;
    l.batch_size = tc.batch_size;
    l.seq_len = mc.seq_len;
    l.block = nc.block;
    l.sequence_parallel = lc.sequence_parallel && l.tp > 1;
    validate_layout(l);
    // A MoE layer's capacity and load-balancing loss are per sequence, in token order: a cp rank
    // holds only part of each sequence.
    if (l.cp > 1 && mc.moe_experts > 0)
        throw ConfigError("layout.cp=" + str(l.cp) + " with model.moe_experts=" +
                          str(mc.moe_experts) +
                          " is not implemented yet: a MoE layer drops tokens over capacity and "
                          "balances its load per whole sequence, which a context-parallel rank "
                          "does not hold; use layout.cp = 1 or model.moe_experts = 0");
    // Sequence parallelism: each tp rank holds a slice of every microbatch's tokens, cut at
    // multiples of numerics.block (tp::token_split), and the LayerNorm weight/bias gradients
    // reduce over those slices by the canonical token tree. In a pipeline the stages pass each tp
    // rank's slice of a microbatch's hidden state to the same tp rank (pipeline.h, 10.).
    if (lc.sequence_parallel && l.tp > 1) {
        const i64 tokens = l.microbatch_size() * l.local_seq_len();
        if (tokens % l.block != 0 || tokens / l.block < l.tp)
            throw ConfigError(
                "layout.sequence_parallel = true needs the " + str(tokens) +
                " tokens of a microbatch (model.seq_len=" + str(l.seq_len) +
                (l.cp > 1 ? " / layout.cp=" + str(l.cp) : std::string()) + " × " +
                str(l.microbatch_size()) + " sequences, from train.batch_size / (layout.dp × " +
                l.microbatches_key + ")) to be whole blocks of numerics.block=" + str(l.block) +
                ", at least one per rank of layout.tp=" + str(l.tp) +
                "; choose fewer microbatches, a smaller numerics.block or layout.tp, or "
                "layout.sequence_parallel = false");
    }
    return l;
}

Layout make_layout(const Config& cfg) {
    try {
        return make_layout(cfg.layout, cfg.model, cfg.train, cfg.numerics);
    } catch (const ConfigError& e) {
        throw ConfigError(cfg.source_name + ": " + e.what());
    }
}

void validate_layout(const Layout& l) {
    const std::string M = l.microbatches_key;  // "layout.microbatches" or "train.microbatches"

    // Ranges (a Config already checked most; a Layout may be built in code).
    at_least("layout.dp", l.dp, 1);
    at_least("layout.pp", l.pp, 1);
    at_least("layout.tp", l.tp, 1);
    at_least("layout.cp", l.cp, 1);
    at_least("layout.ep", l.ep, 1);
    if (l.zero < 0 || l.zero > 3)
        throw ConfigError("layout.zero = " + str(l.zero) + " is out of range: must be in 0..3");
    at_least(M, l.microbatches, 1);
    at_least("layout.virtual_stages", l.virtual_stages, 1);
    if (!std::isfinite(l.timeout_s) || !(l.timeout_s > 0))
        throw ConfigError("layout.timeout_s = " + number(l.timeout_s) +
                          " is out of range: must be > 0");
    at_least("model.layers", l.layers, 1);
    at_least("model.heads", l.heads, 1);
    at_least("model.hidden", l.hidden, 1);
    at_least("model.ffn", l.ffn, 1);
    at_least("train.batch_size", l.batch_size, 1);
    at_least("model.seq_len", l.seq_len, 1);
    at_least("numerics.block", l.block, 1);

    // Schedule and collectives.
    const bool interleaved = l.schedule == ScheduleKind::interleaved;
    const bool vee = l.schedule == ScheduleKind::zbv;
    if (vee && l.pp > 1 && l.virtual_stages != 2)
        throw ConfigError("layout.schedule = \"zbv\" runs two model chunks per rank (a V), got "
                          "layout.virtual_stages=" +
                          str(l.virtual_stages) + ": leave it out or set it to 2");
    if (splits_backward(l.schedule) && l.zero >= 2 && l.pp > 1)
        throw ConfigError("layout.schedule = \"" + std::string(schedule_name(l.schedule)) +
                          "\" defers weight gradients, which ZeRO-" + str(l.zero) +
                          " reduce-scatters as each layer's backward ends: use layout.zero = 0 "
                          "or 1 with it, or layout.schedule = \"1f1b\"");
    if (l.virtual_stages > 1 && !interleaved && !vee)
        throw ConfigError(
            "layout.virtual_stages=" + str(l.virtual_stages) +
            " needs layout.schedule = \"interleaved\", got \"" + schedule_name(l.schedule) +
            "\": only the interleaved schedule gives a pipeline rank several model chunks");
    if (interleaved && l.virtual_stages < 2)
        throw ConfigError(
            "layout.schedule = \"interleaved\" needs layout.virtual_stages >= 2, got " +
            str(l.virtual_stages) +
            ": with one model chunk per rank use layout.schedule = \"1f1b\"");
    if (l.algo == comm::Algo::ring && l.mode == Mode::bitwise)
        throw ConfigError(
            "layout.comm = \"ring\" breaks numerics.mode = \"bitwise\": a ring all-reduce sums "
            "in ring order, not the canonical tree; use layout.comm = \"auto\" or \"canonical\", "
            "or numerics.mode = \"fast\"");

    // Tensor parallelism: Megatron's column/row split needs whole heads and equal column shards.
    if (l.heads % l.tp != 0)
        throw ConfigError("layout.tp=" + str(l.tp) +
                          " does not divide model.heads=" + str(l.heads) +
                          ": each tensor-parallel rank must own whole attention heads; choose "
                          "layout.tp among the divisors of model.heads");
    if (l.hidden % l.tp != 0)  // qkv's 3·hidden columns then divide too
        throw ConfigError("layout.tp=" + str(l.tp) +
                          " does not divide model.hidden=" + str(l.hidden) +
                          ": the column-parallel qkv and the row-parallel attention projection "
                          "split hidden evenly");
    if (l.ffn % l.tp != 0)
        throw ConfigError("layout.tp=" + str(l.tp) + " does not divide model.ffn=" + str(l.ffn) +
                          ": the column-parallel fc and the row-parallel proj of the MLP split its "
                          "ffn columns evenly");
    // In bitwise mode a reduction block is one sequential fma chain: it cannot be cut between
    // ranks, so every rank's share of hidden and ffn must be whole blocks.
    if (l.tp > 1 && l.mode == Mode::bitwise &&
        ((l.hidden / l.tp) % l.block != 0 || (l.ffn / l.tp) % l.block != 0))
        throw ConfigError("layout.tp=" + str(l.tp) + " gives each rank " + str(l.hidden / l.tp) +
                          " of model.hidden=" + str(l.hidden) + " and " + str(l.ffn / l.tp) +
                          " of model.ffn=" + str(l.ffn) +
                          " channels, not whole blocks of numerics.block=" + str(l.block) +
                          "; a block of a canonical reduction cannot be split between ranks "
                          "(choose a smaller layout.tp or numerics.block)");

    // Context parallelism: zig-zag chunks of whole blocks, so a rank's tokens are whole blocks of
    // the token tree (its maximal nodes are the weight gradients' token nodes).
    if (l.cp > 1) {
        const i64 chunks = 2 * static_cast<i64>(l.cp);
        if (l.seq_len % chunks != 0 || (l.seq_len / chunks) % l.block != 0)
            throw ConfigError(
                "layout.cp=" + str(l.cp) + " cuts each sequence of model.seq_len=" +
                str(l.seq_len) + " into 2 × " + str(l.cp) + " = " + str(chunks) +
                " zig-zag chunks, which must be whole blocks of numerics.block=" + str(l.block) +
                " (a weight gradient reduces over tokens in blocks, and a block cannot be split "
                "between ranks); choose model.seq_len a multiple of 2 × layout.cp × "
                "numerics.block = " +
                str(chunks * l.block) + ", or a smaller numerics.block or layout.cp");
        if (l.cp_method == CpMethod::ulysses && (l.heads / l.tp) % l.cp != 0)
            throw ConfigError("layout.cp_method = \"ulysses\" gives each of layout.cp=" +
                              str(l.cp) + " ranks whole heads of the " + str(l.heads / l.tp) +
                              " heads of a tensor-parallel rank (model.heads=" + str(l.heads) +
                              " / layout.tp=" + str(l.tp) +
                              "), so layout.cp must divide that; choose another layout.cp or "
                              "layout.cp_method = \"ring\"");
        if (l.zero > 0)
            throw ConfigError("layout.zero=" + str(l.zero) + " with layout.cp=" + str(l.cp) +
                              " is not implemented yet: context-parallel ranks reduce their "
                              "gradients over dp × cp, which ZeRO does not shard over; use "
                              "layout.zero = 0");
    }

    // Expert parallelism: groups of ep consecutive dp ranks share out whole experts, each rank's
    // share of a stacked expert tensor whole blocks (its gradient norm's block sums are then one
    // rank's each).
    if (l.ep > 1) {
        if (l.experts == 0)
            throw ConfigError("layout.ep=" + str(l.ep) +
                              " shares out a MoE layer's experts, but model.moe_experts = 0; "
                              "use layout.ep = 1 or a MoE model");
        if (l.dp % l.ep != 0)
            throw ConfigError("layout.ep=" + str(l.ep) + " does not divide layout.dp=" + str(l.dp) +
                              ": expert parallelism shares the experts over groups of ep "
                              "consecutive data-parallel ranks; choose layout.ep among the "
                              "divisors of layout.dp");
        if (l.experts % l.ep != 0)
            throw ConfigError("layout.ep=" + str(l.ep) + " does not divide model.moe_experts=" +
                              str(l.experts) +
                              ": each expert-parallel rank holds whole experts, the same number; "
                              "choose layout.ep among the divisors of model.moe_experts");
        const i64 EL = l.experts / l.ep;
        if ((EL * l.expert_ffn) % l.block != 0 || (EL * l.hidden) % l.block != 0)
            throw ConfigError(
                "layout.ep=" + str(l.ep) + " gives each rank " + str(EL) +
                " experts, whose biases hold " + str(EL * l.expert_ffn) + " and " +
                str(EL * l.hidden) + " values (model.moe_ffn, model.hidden): not whole blocks of "
                "numerics.block=" + str(l.block) +
                ", which the gradient norm sums in; choose a smaller layout.ep or numerics.block");
        if (l.zero > 1)
            throw ConfigError("layout.zero=" + str(l.zero) + " with layout.ep=" + str(l.ep) +
                              " is not implemented yet: the ranks of a dp group hold different "
                              "experts, so ZeRO shards each rank's state over the dp/ep ranks "
                              "holding the same experts, which is built for the optimizer state "
                              "only; use layout.zero = 0 or 1");
    }

    // Pipeline stages.
    if (l.pp > l.layers)
        throw ConfigError("layout.pp=" + str(l.pp) + " is more than model.layers=" + str(l.layers) +
                          " (each pipeline stage needs at least one layer)");
    if (vee && l.pp > 1 && 2 * static_cast<i64>(l.pp) > l.layers)
        throw ConfigError("layout.schedule = \"zbv\" cuts the model into 2 × layout.pp = " +
                          str(2 * static_cast<i64>(l.pp)) + " chunks, more than model.layers=" +
                          str(l.layers) + " (each chunk needs at least one layer)");
    if (interleaved && l.layers % (static_cast<i64>(l.pp) * l.virtual_stages) != 0)
        throw ConfigError(
            "the interleaved schedule needs model.layers divisible by "
            "layout.pp × layout.virtual_stages = " +
            str(l.pp) + " × " + str(l.virtual_stages) + " = " +
            str(static_cast<i64>(l.pp) * l.virtual_stages) + ", got model.layers=" + str(l.layers) +
            " (every model chunk holds the same number of layers)");

    // Microbatches.
    check_microbatches_divide_batch(l);
    if (interleaved && l.microbatches % l.pp != 0)
        throw ConfigError("the interleaved schedule needs " + M + "=" + str(l.microbatches) +
                          " divisible by layout.pp=" + str(l.pp) +
                          " (it runs microbatches in groups of pp, as Megatron's does)");

    // Token ranges are nodes of the canonical tree.
    token_ranges(l);
}

// ---- token ranges ----------------------------------------------------------------------------

bool Layout::microbatch_pieces_are_nodes() const {
    const i64 dpm = static_cast<i64>(dp) * microbatches;
    if (dp < 1 || microbatches < 1 || block < 1 || batch_size % dpm != 0) return false;
    const i64 T = seq_len, N = batch_size * T, nb = token_blocks(), mbs = microbatch_size();
    auto node = [&](i64 s_lo, i64 s_hi) {  // sequences [s_lo, s_hi)
        const i64 lo = s_lo * T, hi = s_hi * T;
        if (lo % block != 0 || (hi != N && hi % block != 0)) return false;
        return is_tree_node(nb, lo / block, hi == N ? nb : hi / block);
    };
    for (i64 k = 0; k < microbatches; k++) {
        if (!node(k * dp * mbs, (k + 1) * dp * mbs)) return false;
        for (i64 d = 0; d < dp; d++)
            if (!node((k * dp + d) * mbs, (k * dp + d + 1) * mbs)) return false;
    }
    return true;
}

std::vector<TokenRange> token_ranges(const Layout& l) {
    const i64 T = l.seq_len, N = l.batch_size * T, nb = l.token_blocks();
    const i64 dp = l.dp, M = l.microbatches;
    at_least("layout.dp", dp, 1);
    at_least(l.microbatches_key, M, 1);
    at_least("numerics.block", l.block, 1);
    check_microbatches_divide_batch(l);
    const i64 mbs = l.batch_size / (dp * M);
    const std::string who = "layout.dp=" + str(dp) + " × " + l.microbatches_key + "=" + str(M) +
                            " with train.batch_size=" + str(l.batch_size) +
                            ", model.seq_len=" + str(T) + " and numerics.block=" + str(l.block);
    const std::string why =
        " (a weight gradient reduces over the batch's tokens in blocks of numerics.block, each "
        "block summed sequentially, so a block cannot be split between owners)";
    const std::string fix_block =
        "; choose fewer microbatches, or a numerics.block that divides the tokens of a "
        "microbatch (" +
        str(mbs) + " × " + str(T) + ")";
    // A range ends on a block boundary, or at the end of the batch.
    auto block_of = [&](i64 sample, const std::string& owner) {
        const i64 tok = sample * T;
        if (tok == N) return nb;
        if (tok % l.block != 0)
            throw ConfigError(who + ": " + owner + " starts or ends at token " + str(tok) +
                              ", inside a block of " + str(l.block) + " tokens" + why + fix_block);
        return tok / l.block;
    };

    std::vector<TokenRange> out;
    const bool mb_major = l.microbatch_major();  // its ranges and pieces are nodes
    for (int d = 0; d < l.dp; d++) {
        const std::string rank = "dp rank " + std::to_string(d);
        for (int k = 0; k < l.microbatches; k++) {
            TokenRange r;
            r.dp_rank = d;
            r.microbatch = k;
            r.sample_lo = mb_major ? (k * dp + d) * mbs : (d * M + k) * mbs;
            r.sample_hi = r.sample_lo + mbs;
            const std::string owner = rank + ", microbatch " + std::to_string(k);
            r.block_lo = block_of(r.sample_lo, owner);
            r.block_hi = block_of(r.sample_hi, owner);
            out.push_back(r);
        }
    }
    return out;
}

// ---- the mesh --------------------------------------------------------------------------------

Mesh::Mesh(Layout layout) : l_(std::move(layout)) {
    validate_layout(l_);
}

int Mesh::size(MeshDim d) const {
    return d == MeshDim::pp ? l_.pp : d == MeshDim::dp ? l_.dp : d == MeshDim::cp ? l_.cp : l_.tp;
}

int Mesh::rank_of(Coord c) const {
    PX_ASSERT(c.pp >= 0 && c.pp < l_.pp && c.dp >= 0 && c.dp < l_.dp && c.tp >= 0 &&
                  c.tp < l_.tp && c.cp >= 0 && c.cp < l_.cp,
              "mesh coordinates out of range");
    return ((c.pp * l_.dp + c.dp) * l_.cp + c.cp) * l_.tp + c.tp;
}

Coord Mesh::coord_of(int rank) const {
    PX_ASSERT(rank >= 0 && rank < world_size(),
              "rank " + std::to_string(rank) + " outside the mesh");
    Coord c;
    c.tp = rank % l_.tp;
    c.cp = (rank / l_.tp) % l_.cp;
    c.dp = (rank / (l_.tp * l_.cp)) % l_.dp;
    c.pp = rank / (l_.tp * l_.cp * l_.dp);
    return c;
}

std::vector<int> Mesh::group(MeshDim d, int rank) const {
    Coord c = coord_of(rank);
    std::vector<int> g;
    for (int i = 0; i < size(d); i++) {
        c[d] = i;
        g.push_back(rank_of(c));
    }
    return g;
}

// The index of the rank's group among the groups of d: the other coordinates, outermost first.
int Mesh::group_color(MeshDim d, int rank) const {
    const Coord c = coord_of(rank);
    switch (d) {
        case MeshDim::tp:
            return (c.pp * l_.dp + c.dp) * l_.cp + c.cp;
        case MeshDim::cp:
            return (c.pp * l_.dp + c.dp) * l_.tp + c.tp;
        case MeshDim::dp:
            return (c.pp * l_.cp + c.cp) * l_.tp + c.tp;
        case MeshDim::pp:
            return (c.dp * l_.cp + c.cp) * l_.tp + c.tp;
    }
    return 0;
}

std::vector<int> Mesh::data_group(int rank) const {
    Coord c = coord_of(rank);
    std::vector<int> g;
    for (int d = 0; d < l_.dp; d++)
        for (int k = 0; k < l_.cp; k++) {
            c.dp = d;
            c.cp = k;
            g.push_back(rank_of(c));
        }
    return g;
}

std::vector<int> Mesh::ep_group(int rank) const {
    Coord c = coord_of(rank);
    const int first = c.dp / l_.ep * l_.ep;
    std::vector<int> g;
    for (int d = first; d < first + l_.ep; d++) {
        c.dp = d;
        g.push_back(rank_of(c));
    }
    return g;
}

std::vector<int> Mesh::expert_data_group(int rank) const {
    Coord c = coord_of(rank);
    std::vector<int> g;
    for (int d = c.dp % l_.ep; d < l_.dp; d += l_.ep) {
        c.dp = d;
        g.push_back(rank_of(c));
    }
    return g;
}

int Mesh::data_color(int rank) const {
    const Coord c = coord_of(rank);
    return c.pp * l_.tp + c.tp;
}

int Mesh::data_index(int rank) const {
    const Coord c = coord_of(rank);
    return c.dp * l_.cp + c.cp;
}

std::vector<std::vector<int>> Mesh::groups(MeshDim d) const {
    std::vector<std::vector<int>> out(static_cast<size_t>(world_size() / size(d)));
    for (int r = 0; r < world_size(); r++)
        if (coord_of(r)[d] == 0) out[static_cast<size_t>(group_color(d, r))] = group(d, r);
    return out;
}

void Mesh::require_world_size(int ranks) const {
    if (ranks == world_size()) return;
    throw ConfigError("the layout needs layout.pp × layout.dp × layout.cp × layout.tp = " +
                      str(l_.pp) + " × " + str(l_.dp) + " × " + str(l_.cp) + " × " + str(l_.tp) +
                      " = " + str(world_size()) + " ranks, but " +
                      str(ranks) + " were started: start " + str(world_size()) +
                      " ranks or change the layout");
}

LayerRange Mesh::layers(int pp_rank, int chunk) const {
    PX_ASSERT(pp_rank >= 0 && pp_rank < l_.pp && chunk >= 0 && chunk < l_.virtual_stages,
              "stage out of range");
    const i64 S = l_.num_stages(), L = l_.layers,
              k = stage_of(pp_rank, chunk, l_.pp, placement_of(l_.schedule));
    auto boundary = [&](i64 j) { return static_cast<int>((j * L + S - 1) / S); };  // ceil(j·L/S)
    return {boundary(k), boundary(k + 1)};
}

Schedule Mesh::schedule() const {
    // One stage: the trivial schedule, forward then backward of each microbatch in turn (1F1B
    // with no warm-up), whatever the key says: one set of activations at a time.
    if (l_.pp == 1) return make_schedule(ScheduleKind::one_f_one_b, 1, l_.microbatches, 1);
    return make_schedule(l_.schedule, l_.pp, l_.microbatches, l_.virtual_stages);
}

int Mesh::pp_peer(int rank, int pp_rank) const {
    Coord c = coord_of(rank);
    c.pp = pp_rank;
    return rank_of(c);
}

std::string Mesh::describe() const {
    std::string s = str(world_size()) + " ranks = pp " + str(l_.pp) + " × dp " + str(l_.dp) +
                    (l_.cp > 1 ? " × cp " + str(l_.cp) + " (" + cp_method_name(l_.cp_method) + ")"
                               : std::string()) +
                    " × tp " + str(l_.tp) + " (tp innermost)" +
                    (l_.ep > 1 ? "; ep " + str(l_.ep) + " (groups of consecutive dp ranks share "
                                 "out the experts)"
                               : std::string()) +
                    "; ZeRO-" + str(l_.zero) + "; " +
                    str(l_.microbatches) + " microbatches of " + str(l_.microbatch_size()) +
                    " sequences per dp rank; schedule " + schedule_name(l_.schedule);
    if (l_.virtual_stages > 1) s += " with " + str(l_.virtual_stages) + " chunks per rank";
    s += "; recompute " + std::string(recompute_name(l_.recompute)) + "; " +
         (l_.algo == comm::Algo::canonical ? "canonical" : "ring") + " collectives\n";
    for (int r = 0; r < world_size(); r++) {
        const Coord c = coord_of(r);
        s += "rank " + str(r) + ": pp " + str(c.pp) + ", dp " + str(c.dp) +
             (l_.cp > 1 ? ", cp " + str(c.cp) : std::string()) + ", tp " + str(c.tp) +
             (l_.ep > 1 ? ", experts [" + str(c.dp % l_.ep * (l_.experts / l_.ep)) + "," +
                              str((c.dp % l_.ep + 1) * (l_.experts / l_.ep)) + ")"
                        : std::string()) +
             ", layers";
        for (int ch = 0; ch < l_.virtual_stages; ch++) {
            const LayerRange lr = layers(c.pp, ch);
            s += " [" + str(lr.lo) + "," + str(lr.hi) + ")";
        }
        s += "\n";
    }
    return s;
}

}  // namespace px
