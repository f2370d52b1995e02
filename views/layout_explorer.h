// The layout explorer's model (a teaching view): for a config's layout, who holds what and who
// says what to whom. Nothing is re-implemented: it runs one step of the layout on in-process
// ranks with the runtime itself (run_layout) and reads the answers off the real ranks —
//   which rank holds which block of every weight matrix and of its Adam moments (under ep, its
//     experts' rows of each stacked expert tensor): each rank's checkpoint pieces
//     (core/parallel/state_slices.h state_pieces over Job::rank_state), the same slabs a
//     checkpoint writes;
//   which collective each layer issues, in forward and backward, with its bytes: a decorator
//     around every mesh group and the ep group records each collective (RunHooks wraps no other:
//     the data group of cp > 1 and the expert-data group of dp > ep go unrecorded), and a probe
//     sink that captures nothing names the op that runs next (a collective belongs to the op
//     whose probe follows it);
//   memory per rank: Job::memory() after the step, beside the estimate (core/train/memory.h)
//     that the job was admitted by;
//   how attention's heads sit on the tp ranks (head_layout): the tensor-parallel model's cut as
//     a formula, which the gui_views suite checks against the rows of q_proj, k_proj and v_proj
//     the explored ranks hold.
//
// Index
//   HeldPiece, TensorHolding   one rank's slab of one tensor; every rank's slabs of one tensor
//   ExpertRange                the experts of every MoE layer that one rank holds
//   CollectiveUse              one collective of one op: group, op, bytes, calls, ranks
//   HeadRange, RankHeads, HeadLayout, head_layout   the attention heads each tp rank holds:
//                              its query heads, its KV heads, split or whole on every rank
//   ExplorerResult             everything the panel draws
//   HeldBlock, held_blocks     a tensor's distinct blocks, each with every rank holding it whole
//   ExplorerPicks              the layout the person explores: the job bar's until they pick
//   follow_job_bar, explored_config   the picks from the job bar's fields; a config with them
//   LayoutExplorer             explore(cfg) on a thread; busy(); result()
#pragma once
#include "views/config_editor.h"
#include "core/base/config.h"
#include "core/io/checkpoint.h"
#include "core/parallel/mesh.h"
#include "core/train/job.h"
#include "core/train/memory.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace px::views {

struct HeldPiece {
    int rank = 0;  // world rank
    Slab slab;     // rows and columns of the logical tensor, seen as (rows, cols)
};

struct TensorHolding {
    std::string name;  // "h.0.attn.c_attn.weight"; llama: "model.layers.0.self_attn.q_proj.weight"
    int layer = -1;
    i64 rows = 1, cols = 1;          // logical shape as (rows, cols); a vector is one row
    std::vector<HeldPiece> weights;  // the weights each rank holds between steps
    std::vector<HeldPiece> moments;  // the Adam moments each rank holds
};

// Experts [lo, hi) of every MoE layer: an expert-parallel rank's share (Mesh::ep_group), or all
// of them without ep; empty (0, 0) for a dense model.
struct ExpertRange {
    int lo = 0, hi = 0;
    int size() const { return hi - lo; }
    bool operator==(const ExpertRange&) const = default;
};

struct CollectiveUse {
    std::string phase;       // "fwd", "bwd", "mgrad", "grad", "optim", or "end" (after the update)
    int layer = -1;          // -1: the embedding, the head, or the whole model
    std::string op;          // the op whose probe follows it: "attn.c_proj", "param"
    std::string group;       // "dp", "tp", "pp", "cp", "ep"
    std::string collective;  // "all_reduce", "send", ...
    i64 bytes = 0;           // per call, this rank's sent + received
    int calls = 0;           // in the step, on one rank (microbatches repeat it)
    std::vector<int> ranks;  // world ranks that issue it
};

// Heads [lo, hi) of a model's attention.
struct HeadRange {
    int lo = 0, hi = 0;
    int size() const { return hi - lo; }
    bool operator==(const HeadRange&) const = default;
};

// One tensor-parallel rank's attention heads.
struct RankHeads {
    int tp_rank = 0;
    HeadRange q;        // query heads it computes: its rows of q_proj (its columns of o_proj)
    HeadRange kv;       // KV heads it holds: its rows of k_proj and v_proj (all when not split)
    HeadRange kv_read;  // the KV heads its query heads read (query head h reads h / group)
    bool operator==(const RankHeads&) const = default;
};

// How attention's heads sit on the tp ranks, as the tensor-parallel model cuts them
// (core/parallel/tensor/tp_model.cpp): q_proj by query heads, k_proj and v_proj by KV heads where
// tp divides them (kv_split), else whole on every rank. GPT-2's c_attn is multi-head: as many KV
// heads as query heads, split with them.
struct HeadLayout {
    int tp = 1;
    int heads = 0, kv_heads = 0, head_dim = 0;
    int group = 1;                 // query heads per KV head: heads / kv_heads
    bool split = true;             // tp divides kv_heads: each rank holds only its own KV heads
    std::vector<RankHeads> ranks;  // per tp rank
    const char* kind() const;      // "multi-head", "grouped-query" or "multi-query"
    // "tp rank 0: q heads 0-1, kv head 0 (split)"; whole: "..., kv heads 0-1 (whole on every
    // rank: tp=4 does not divide kv_heads=2), reads kv head 1"
    std::string rank_text(int tp_rank) const;
    // "grouped-query attention: 4 query heads share 2 KV heads (2 each), 16 channels a head;
    // tp=2 divides kv_heads=2: each rank holds its own KV heads"
    std::string summary() const;
    bool operator==(const HeadLayout&) const = default;
};
// The heads of mc's attention on tp ranks; tp must divide model.heads (the layout checks it).
HeadLayout head_layout(const ModelConfig& mc, int tp);

struct ExplorerResult {
    bool ready = false;
    std::string error;  // the layout cannot run: the library's message
    Config config;
    Layout layout;
    std::vector<Coord> coords;               // per world rank
    std::vector<LayerRange> layers;          // per world rank: its stage's layers (chunk 0)
    std::vector<ExpertRange> experts;        // per world rank, as its job's model part holds
    std::vector<TensorHolding> tensors;      // the whole model's table order
    std::vector<CollectiveUse> collectives;  // in the order the ops run
    std::vector<MemoryStats> memory;         // per world rank, after the step
    MemoryEstimate estimate;                 // one rank's, as the job was admitted by
    HeadLayout heads;                        // the attention heads on the tp ranks
    double seconds = 0;                      // the traced step, wall time
};

// One block of a tensor and the ranks that hold it: one rank is a shard of it; several ranks
// each hold the whole block (replicas: the dp ranks without ZeRO, the tp ranks of a weight that tp
// does not cut), which is drawn as shared, never as split between them.
struct HeldBlock {
    Slab slab;
    std::vector<int> ranks;  // ascending
    bool replicated() const { return ranks.size() > 1; }
};
// The tensor's weights' (or Adam moments') blocks, in row-then-column order.
std::vector<HeldBlock> held_blocks(const TensorHolding& t, bool moments);

// The layout the explorer runs. It follows the job bar's fields as they are typed (no Start
// needed) until the person picks a value of their own; then it keeps its picks, through a Start
// too, until they follow the job bar again.
struct ExplorerPicks {
    int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1, zero = 0;
    int block = 16;        // numerics.block
    bool ulysses = false;  // layout.cp_method: "ulysses", else "ring"
    bool sp = false;       // layout.sequence_parallel
    bool follow = true;    // take the job bar's values
    bool operator==(const ExplorerPicks&) const = default;
};
// When p.follow: p takes each field's value that reads as one (a half-typed field keeps the
// last); returns whether p changed.
bool follow_job_bar(ExplorerPicks& p, const ConfigEditor& bar);
// base with p's layout and numerics.block (ep stays 1 for a dense model).
Config explored_config(const ExplorerPicks& p, Config base);

class LayoutExplorer {
public:
    LayoutExplorer() = default;
    ~LayoutExplorer();  // joins
    LayoutExplorer(const LayoutExplorer&) = delete;
    LayoutExplorer& operator=(const LayoutExplorer&) = delete;

    // Explores cfg's layout on a thread. Returns at once: while an exploration runs, cfg waits
    // for it (a later call replaces a waiting one). The model, batch and numerics are cfg's; no
    // run file, checkpoint, fault or evaluation.
    void explore(const Config& cfg);
    bool busy() const { return busy_.load(); }
    std::uint64_t version() const { return version_.load(); }
    ExplorerResult result() const;
    bool wait(double timeout_s) const;

private:
    mutable std::mutex mu_;
    ExplorerResult r_;
    std::optional<Config> pending_;  // the next config to explore, under mu_
    std::thread thread_;
    std::atomic<bool> busy_{false};
    std::atomic<std::uint64_t> version_{0};
};

// The synchronous part, for tests: explores cfg on the calling thread.
ExplorerResult explore_layout(const Config& cfg);

}  // namespace px::views
