// The parallel layout and its rank mesh (docs/layouts.md): dp × pp × cp × tp ranks (ep comes
// later), the ZeRO stage, microbatches, the pipeline schedule and recomputation. A Layout is the
// [layout] section resolved against the model, the batch and the numerics; it validates itself at
// construction, throwing ConfigError with a sentence that names the keys and the product or
// divisibility that fails ("layout.tp=3 does not divide model.heads=4 ...").
//
// Index
//   Recompute, recompute_name   none | full (each block's forward again in its backward)
//   Layout                      the resolved layout, and the model/batch facts it is checked
//   against make_layout                 from a Config (or its sections): resolves and validates
//   validate_layout             every rule below; throws ConfigError naming the keys
//   TokenRange, token_ranges    the sequences and token blocks of each (dp rank, microbatch)
//   CpMethod, cp_method_name    context-parallel attention: ring or ulysses
//   MeshDim, dim_name, Coord        mesh dimensions (pp, dp, cp, tp) and a rank's coordinates
//   LayerRange                  the contiguous layers of one virtual pipeline stage
//   Mesh                        world size, rank <-> coordinates, groups, stages, schedule
//
// Rank order (Megatron's): tp innermost, then cp, then dp, then pp outermost,
//     rank = ((pp_rank · dp + dp_rank) · cp + cp_rank) · tp + tp_rank,
// so the ranks of a tp group are neighbours (one node, the fastest links: tp talks every layer),
// a cp group strides by tp (it talks every layer too: the attention's keys and values), a dp
// group by cp · tp, and a pipeline stage is one contiguous block of dp · cp · tp ranks. The dp
// and cp ranks of a stage and tp shard together own the batch's tokens (data_group): weight
// gradients reduce over them. Expert parallelism reuses the dp ranks (as Megatron and TorchTitan
// do): ep divides dp, and each ep consecutive dp ranks share out the experts, so an ep group's
// token ranges are consecutive in the batch (ep_group, expert_data_group).
//
// Rules (validate_layout, in this order):
//   ranges        dp, pp, tp, microbatches, virtual_stages >= 1; zero in 0..3; timeout_s > 0
//   schedule      virtual_stages >= 2 exactly when the schedule is interleaved; ring collectives
//                 only in fast numerics (ring order is not the canonical tree)
//   tp            divides model.heads (a rank owns whole heads), model.hidden (so also the
//                 3·hidden columns of qkv) and model.ffn (column-parallel fc, row-parallel proj)
//   pp            pp <= model.layers (each stage needs a layer); layers need not divide evenly:
//                 earlier stages take the extra layers (the last stage also holds the LM head and
//                 the loss). Interleaved: model.layers divisible by pp × virtual_stages.
//   microbatches  dp × microbatches divides train.batch_size; GPipe and 1F1B run any count >= 1
//                 (1F1B simply has a longer bubble below pp); interleaved needs a multiple of pp
//                 (as Megatron: it runs microbatches in groups of pp).
//   cp            with cp > 1: model.seq_len cuts into 2·cp chunks of whole numerics.block blocks
//                 (zig-zag: a rank's tokens are whole blocks of the token tree); "ulysses" needs
//                 cp to divide model.heads / layout.tp; no ZeRO yet
//   ep            with ep > 1: divides dp and model.moe_experts; a rank's EL = E/ep experts hold
//                 whole blocks of numerics.block in each stacked tensor (EL·FE and EL·C are
//                 multiples of it: the gradient norm's blocks lie whole on one rank); ZeRO-1 at
//                 most (sharded over the dp/ep ranks holding the same experts)
//   tokens        every (dp rank, microbatch) and every dp rank (microbatch-major: every
//                 microbatch range) owns whole token blocks forming one node of the canonical
//                 tree over the batch's blocks (token_ranges)
//   zero          any stage with any dp: with dp = 1 a ZeRO shard is the whole state (trivial).
#pragma once
#include "core/comm/comm.h"
#include "core/base/config.h"
#include "core/parallel/pipeline/schedule.h"

#include <cstdint>
#include <string>
#include <vector>

namespace px {

// ---- the layout ------------------------------------------------------------------------------

enum class Recompute : std::uint8_t { none, full };
const char* recompute_name(Recompute r);  // "none", "full"

// Context-parallel attention (core/parallel/context/context_parallel.h): keys and values around the
// ring to every rank's queries, or an all-to-all from token rows to whole heads and back (Ulysses).
enum class CpMethod : std::uint8_t { ring, ulysses };
const char* cp_method_name(CpMethod m);  // "ring", "ulysses"

struct Layout {
    int dp = 1;            // data-parallel replicas
    int pp = 1;            // pipeline ranks
    int tp = 1;            // tensor-parallel ranks
    bool sequence_parallel = false;  // layout.sequence_parallel with tp > 1
    int cp = 1;            // context-parallel ranks (zig-zag chunks of every sequence)
    CpMethod cp_method = CpMethod::ring;  // layout.cp_method
    int ep = 1;            // expert parallel: groups of ep consecutive dp ranks share the experts
    int zero = 0;          // ZeRO stage over the dp group: 1 optimizer state, 2 + grads, 3 + params
    int microbatches = 1;  // per dp rank and step (resolved)
    std::string microbatches_key = "train.microbatches";  // the key it came from, for messages
    ScheduleKind schedule = ScheduleKind::one_f_one_b;
    int virtual_stages = 1;  // v, model chunks per pp rank
    Recompute recompute = Recompute::none;
    Mode mode = Mode::bitwise;                // numerics.mode
    comm::Algo algo = comm::Algo::canonical;  // reducing collectives (layout.comm resolved)
    double timeout_s = 60.0;                  // collective timeout

    // What the layout is checked against (model, train, numerics).
    i64 layers = 2, heads = 4, hidden = 64, ffn = 256;  // L, NH, C, F
    i64 experts = 0, expert_ffn = 0;                    // model.moe_experts, an expert's FE
    i64 batch_size = 8;                                 // sequences per step (global batch)
    i64 seq_len = 128;                                  // T, tokens per sequence
    int block = 64;                                     // numerics.block

    int world_size() const { return dp * pp * cp * tp; }
    i64 local_seq_len() const { return seq_len / cp; }  // a cp rank's tokens of a sequence
    int num_stages() const { return pp * virtual_stages; }  // virtual stages S
    // The pp rank of virtual stage k (the schedule's placement: looped, or zbv's V).
    int stage_rank(int k) const { return rank_of_stage(k, pp, placement_of(schedule)); }
    int last_stage_rank() const { return stage_rank(num_stages() - 1); }  // holds the loss
    // Sequences per microbatch, and the leaves of the batch's token tree.
    i64 microbatch_size() const { return batch_size / (static_cast<i64>(dp) * microbatches); }
    i64 token_blocks() const { return num_blocks(batch_size * seq_len, block); }
    // ZeRO-2/3 with dp > 1 on one stage cuts the batch into microbatch ranges first and gives
    // every replica a piece of each (core/parallel/data/zero.h ZeroUnits): dp rank d's microbatch k
    // is piece d of range k. It reduces each unit's gradient as soon as it is complete, which
    // needs every range and piece to be one node of the token tree (pieces_are_nodes); otherwise
    // (and with pp > 1) each replica owns one range, cut into its microbatches (dp-major), and
    // the step's gradients reduce after the last microbatch.
    bool microbatch_major() const {
        return zero >= 2 && dp > 1 && pp == 1 && microbatch_pieces_are_nodes();
    }
    // Whether every microbatch range of the batch, and each replica's piece of it, is one node
    // of the token tree (blocks of numerics.block tokens).
    bool microbatch_pieces_are_nodes() const;
};

// Resolves the [layout] keys (layout.microbatches = 0 takes train.microbatches; layout.comm
// "auto" is canonical in bitwise mode, ring in fast) and validates. From a Config, messages begin
// with "<cfg.source_name>: ".
Layout make_layout(const LayoutConfig& lc, const ModelConfig& mc, const TrainConfig& tc,
                   const NumericsConfig& nc);
Layout make_layout(const Config& cfg);
void validate_layout(const Layout& l);  // throws ConfigError: one sentence naming the keys

// ---- token ranges ----------------------------------------------------------------------------

// The weight gradient reduces over the tokens of the global batch in the canonical tree over
// blocks of numerics.block tokens (docs/numerics.md); DP ranks and microbatches are owners of token
// ranges. dp rank d owns sequences [d·B/dp, (d+1)·B/dp) and its microbatch k the k-th equal part
// of that (dp-major), so a rank's microbatches combine locally (a subtree) and the dp all-reduce
// adds one node per rank; when every rank's range is a node the canonical tree over rank indices
// (comm::Algo::canonical) is exactly the block tree. Microbatch-major layouts
// (Layout::microbatch_major) cut the batch into microbatch ranges first, each one node whose dp
// pieces are its nodes below, reduced (reduce-scattered) over rank indices.
// A range that is not one node of the tree is still exact: its maximal nodes are computed apart
// and combine with the other ranks' in the tree (GPT::backward over TokenNodes, TreeAccumulator,
// exchange_and_combine), as the tensor-parallel shards' channel blocks do.
struct TokenRange {
    int dp_rank = 0;
    int microbatch = 0;
    i64 sample_lo = 0, sample_hi = 0;  // sequences [lo, hi) of the global batch
    i64 block_lo = 0, block_hi = 0;    // token blocks [lo, hi) of the batch's tree

    bool operator==(const TokenRange&) const = default;
};
// One per (dp rank, microbatch), dp-major (also for a microbatch-major layout, whose ranges
// then interleave). block_lo/hi is then the range's blocks, one node or several. Throws
// ConfigError naming layout.dp, the microbatches key, train.batch_size, model.seq_len and
// numerics.block when a range does not end on a block boundary (a block's sum is sequential).
std::vector<TokenRange> token_ranges(const Layout& l);

// ---- the mesh --------------------------------------------------------------------------------

enum class MeshDim : std::uint8_t { pp, dp, cp, tp };  // outermost to innermost
const char* dim_name(MeshDim d);  // "pp", "dp", "cp", "tp": group names for Communicator::split

struct Coord {
    int pp = 0, dp = 0, tp = 0, cp = 0;
    int operator[](MeshDim d) const {
        return d == MeshDim::pp ? pp : d == MeshDim::dp ? dp : d == MeshDim::cp ? cp : tp;
    }
    int& operator[](MeshDim d) {
        return d == MeshDim::pp ? pp : d == MeshDim::dp ? dp : d == MeshDim::cp ? cp : tp;
    }
    bool operator==(const Coord&) const = default;
};

struct LayerRange {
    int lo = 0, hi = 0;  // layers [lo, hi)
    int size() const { return hi - lo; }
    bool operator==(const LayerRange&) const = default;
};

class Mesh {
public:
    explicit Mesh(Layout layout);  // validates: ConfigError naming the keys
    // A layout that make_layout made (validated once, then only read: the trainer's).
    struct Validated {};
    Mesh(Layout layout, Validated) : l_(std::move(layout)) {}

    const Layout& layout() const { return l_; }
    int world_size() const { return l_.world_size(); }
    int size(MeshDim d) const;  // dp, pp, cp or tp

    int rank_of(Coord c) const;  // ((pp·dp + dp)·cp + cp)·tp + tp
    Coord coord_of(int rank) const;

    // The world ranks that share every coordinate but d with `rank`, ordered along d; a rank's
    // index in it is coord_of(rank)[d]. For Communicator::split: color = group_color, key = the
    // coordinate along d.
    std::vector<int> group(MeshDim d, int rank) const;
    int group_color(MeshDim d, int rank) const;  // 0 .. world/size(d)-1, the index in groups(d)
    std::vector<std::vector<int>> groups(MeshDim d) const;  // every group of d, by color
    std::vector<int> dp_group(int rank) const { return group(MeshDim::dp, rank); }
    std::vector<int> tp_group(int rank) const { return group(MeshDim::tp, rank); }
    std::vector<int> pp_group(int rank) const { return group(MeshDim::pp, rank); }
    std::vector<int> cp_group(int rank) const { return group(MeshDim::cp, rank); }
    // The dp × cp ranks of rank's stage and tp shard, ordered by (dp, cp): the owners of the
    // batch's tokens, over which weight gradients reduce. Split with color data_color, key
    // data_index (dp · cp + cp).
    std::vector<int> data_group(int rank) const;
    int data_color(int rank) const;  // pp · tp + tp
    int data_index(int rank) const;  // its index in data_group
    // Expert parallelism: rank's ep group, the ep consecutive dp ranks d with the same d / ep (and
    // the same pp, cp, tp), which share out the experts (index d % ep holds experts
    // [(d % ep)·E/ep, (d % ep + 1)·E/ep)); and its expert-data group, the dp ranks with the same
    // d % ep, which hold the same experts and reduce their gradients. Colors for split: the
    // world rank of the group's first member.
    std::vector<int> ep_group(int rank) const;
    std::vector<int> expert_data_group(int rank) const;
    int ep_color(int rank) const { return ep_group(rank).front(); }
    int expert_data_color(int rank) const { return expert_data_group(rank).front(); }
    // ConfigError when `ranks` processes or threads were started for a layout of another size.
    void require_world_size(int ranks) const;

    // Pipeline. Virtual stage k = chunk · pp + pp_rank holds layers [ceil(k·L/S), ceil((k+1)·L/S))
    // with S = pp · v: contiguous, earlier stages take the extras (interleaved: L/S each). Stage 0
    // also holds the embedding, stage S-1 the final norm, the LM head and the loss (tied wte: its
    // gradient adds the two halves across the first and the last stage).
    LayerRange layers(int pp_rank, int chunk = 0) const;
    Schedule schedule() const;  // the layout's schedule over pp ranks
    // The world rank with rank's dp and tp coordinates at pipeline rank pp_rank: maps a
    // schedule's Action::peer (a pp rank) to the rank to send to.
    int pp_peer(int rank, int pp_rank) const;

    std::vector<TokenRange> token_ranges() const { return px::token_ranges(l_); }
    std::string describe() const;  // a summary line, then per rank its coordinates and layers

private:
    Layout l_;
};

}  // namespace px
