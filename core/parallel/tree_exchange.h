// Tree exchange: the canonical reduction (docs/numerics.md) when its blocks are spread over ranks.
// A rank computes the maximal subtrees that lie in its shard; subtrees that cross shards combine
// after the exact partials are exchanged.
//
// Index
//   Range                  a half-open range [lo, hi) of blocks (or of elements)
//   maximal_nodes          the maximal nodes of the canonical tree inside owned block ranges
//   combine_nodes          the root of the tree from the values of some of its nodes (local)
//   NodePlan, make_plan    which nodes every rank of a group holds (from every rank's ranges)
//   gather_plan            the same from this rank's nodes only (a collective)
//   Path                   any (a plain all_reduce when it gives the same bits) or general
//   exchange_and_combine   every rank gets the root, bit-identical to the single-device tree
//   reduce_scatter_nodes   rank r gets elements [edges[r], edges[r+1]) of the root
//
// The tree. A reduction of nb blocks combines block values in the canonical binary tree of
// core/base/numerics.h: a node [lo, hi) splits at tree_mid(lo, hi) and its value is left + right;
// subtrees without any present block are skipped. A node's subtree has the shape of the tree over
// its own hi - lo blocks, so a rank that owns blocks [a, b) forming a node computes the node's
// value with any canonical kernel run on those blocks alone (a GEMM over that K range, a block
// sum over those logits). Values here are rows of w floats combined element by element.
//
// Why not all_reduce. comm's canonical all_reduce is the tree over RANK index. It equals the
// block tree only when every rank holds one node and the rank tree has the block tree's shape
// (tp = 4 over 12 blocks: [0,3) [3,6) [6,9) [9,12)). Otherwise (tp = 3 over 12 blocks: rank 0
// holds [0,3) [3,4), rank 1 [4,5) [5,6) [6,8), rank 2 [8,9) [9,12)) each rank sends its few node
// partials and the upper nodes are formed in the block tree's order. exchange_and_combine does
// that as a reduce-scatter (rank c combines element chunk c of every node, all_to_all_v) followed
// by an all-gather of the chunks: each element is combined by exactly one rank, so every rank gets
// the same bits, and each rank sends about (k-1)·w + w·(p-1)/p elements for k nodes of width w.
//
// Absent root. When no rank holds any node the root is absent: outputs are filled with -0, the
// additive identity (x + -0 == x for every x, including +0 and -0), so `dst += out` leaves dst's
// bits as if nothing had been added.
#pragma once
#include "core/comm/comm.h"
#include "core/base/numerics.h"

#include <cstdint>
#include <span>
#include <vector>

namespace px {

// ---- nodes -----------------------------------------------------------------------------------

struct Range {
    i64 lo = 0, hi = 0;  // half-open
    i64 size() const { return hi - lo; }
    bool operator==(const Range&) const = default;
};

// The maximal nodes [a, b) of the tree over nb blocks with lo <= a and b <= hi, left to right.
std::vector<Range> maximal_nodes(i64 nb, i64 lo, i64 hi);
// The same for several owned block ranges (any order; adjacent ones are merged first, so a rank
// owning [0,2) and [2,4) of a tree whose node is [0,4) computes one partial). Overlaps throw.
std::vector<Range> maximal_nodes(i64 nb, std::span<const Range> owned);

// values (k, w) holds the values of k disjoint nodes of the tree over nb blocks, ascending
// (nodes[i].hi <= nodes[i+1].lo). Blocks outside them are absent. The root's value, formed in the
// tree's order (a listed node is taken as is), is left in values[0..w). Returns false when k = 0.
// Throws px::Error when a listed range is not a node, or the list is not ascending and disjoint.
bool combine_nodes(i64 nb, std::span<const Range> nodes, float* values, i64 w);

// ---- plans -----------------------------------------------------------------------------------

// Which nodes every rank of a group holds. A rank's node values are passed as rows (k_r, w) in the
// order of nodes[r] (ascending).
struct NodePlan {
    i64 nb = 0;                             // blocks of the tree
    std::vector<std::vector<Range>> nodes;  // by rank: its maximal nodes, ascending
    bool rank_tree = false;  // one node per rank, and the rank tree has the block tree's shape
    int size() const { return static_cast<int>(nodes.size()); }
};

// From every rank's owned block ranges (no communication; every rank builds the same plan).
// Throws px::Error when two ranks own the same block.
NodePlan make_plan(i64 nb, const std::vector<std::vector<Range>>& owned_by_rank);
// From this rank's nodes (ascending tree nodes): a collective of `comm` (all_gather + all_gather_v
// of the node lists). Use make_plan when every rank knows the split, to save the two collectives.
NodePlan gather_plan(comm::Communicator& comm, i64 nb, std::span<const Range> my_nodes);

// ---- exchanges (collectives of the plan's group) -------------------------------------------

// any: use comm's canonical all_reduce / reduce_scatter where the plan allows it (same bits,
// fewer copies); general: always the node exchange (tests use it to check the two agree).
enum class Path : std::uint8_t { any, general };

// out (w) = the root, the same bits on every rank; values (k_rank, w) this rank's node values in
// plan order; out must not overlap values. Returns false (out = -0) when the root is absent.
bool exchange_and_combine(comm::Communicator& comm, const NodePlan& plan, const float* values,
                          i64 w, float* out, Path path = Path::any);
// The same, first gathering the plan from every rank's nodes (my_nodes ascending).
bool exchange_and_combine(comm::Communicator& comm, i64 nb, std::span<const Range> my_nodes,
                          const float* my_values, i64 w, float* out);

// out (edges[r+1] - edges[r]) = elements [edges[r], edges[r+1]) of the root on rank r = comm's
// rank: bit for bit that slice of exchange_and_combine. edges (p+1) ascending from 0 to w, equal
// on every rank. Absent root: out = -0, returns false.
bool reduce_scatter_nodes(comm::Communicator& comm, const NodePlan& plan, const float* values,
                          i64 w, std::span<const i64> edges, float* out, Path path = Path::any);

}  // namespace px
