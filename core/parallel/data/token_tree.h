// The token tree's accumulation of microbatch gradients (docs/numerics.md): a weight gradient is
// the canonical tree over the batch's token blocks, and the owners of the batch's tokens (data
// parallel replicas, their microbatches, context-parallel ranks, the sources of an expert's
// rows) each compute the nodes their tokens form. A chunk's microbatch gradients combine into
// those nodes here, in any order of the microbatches, with the single device's additions.
//
// Index
//   TreeAccumulator    one chunk's microbatch gradients, combined in the token tree in any order
#pragma once
#include "core/base/arena.h"
#include "core/model/model.h"
#include "core/parallel/tree_exchange.h"

#include <vector>

namespace px {

// The microbatch gradients of one model chunk, combined in the canonical token tree
// (docs/numerics.md). Microbatch k covers one or several nodes of the batch's tree over `nb` token
// blocks (its leaves, ascending: the maximal nodes of its block range); the rank's microbatches
// together cover its targets (the maximal nodes of all their blocks: one node when the rank's range
// is one). A node below a target is left + right once both children are in. Microbatches may finish
// in any order (every schedule here runs a chunk's backwards in increasing microbatch order,
// which makes this a stack: about log2(m)+1 partials per target); the result is the same bits
// either way. Each target's value ends in the buffer of its leftmost leaf: `result` for target 0,
// a pooled buffer for the others (targets()). Only floats [span.lo, span.hi) are zeroed and
// combined: the chunk's part of a gradient buffer.
class TreeAccumulator {
public:
    // leaves[k]: microbatch k's nodes of the tree over nb blocks, ascending; the microbatches'
    // ranges disjoint and ascending. Throws px::Error when a leaf is not a node.
    TreeAccumulator(i64 nb, std::vector<std::vector<Range>> leaves, float* result, i64 floats,
                    GradSpan span);
    // Microbatch k owns blocks [k·b, (k+1)·b) of a tree over m·b blocks, one node each.
    TreeAccumulator(int microbatches, i64 blocks_per_microbatch, float* result, i64 floats,
                    GradSpan span);
    // Where microbatch k's backward accumulates, one buffer per leaf of it (spans zeroed).
    std::vector<float*> begin(int k);
    void end(int k);  // k is complete: combine every node whose children are complete
    // Between begin(k) and end(k): the buffer of microbatch k's first leaf.
    float* leaf_buffer(int k) const;
    bool complete() const;  // every target is in its buffer
    // The targets (ascending) and their buffers: complete() once every microbatch has ended.
    const std::vector<Range>& targets() const { return targets_; }
    float* target_buffer(size_t i) const;
    const std::vector<Range>& leaves(int k) const { return leaves_[static_cast<size_t>(k)]; }
    void reset();                                     // for the next step
    int buffers() const { return static_cast<int>(pool_.size()); }  // partial buffers made
    i64 bytes() const;                                              // of those buffers
    i64 resident_bytes() const;                                     // of those buffers, mapped now
    void release();  // their pages back to the system (they read as zero after)

private:
    struct Node {
        int left = -1, right = -1, parent = -1;
        int target = -1;  // a target's leftmost leaf: the target's index (its buffer)
        bool done = false;
        float* buf = nullptr;
    };
    int build(i64 nb, i64 lo, i64 hi, int parent, int leftmost_of);
    float* take();

    float* result_;
    i64 floats_;
    GradSpan span_;
    std::vector<std::vector<Range>> leaves_;  // per microbatch
    std::vector<Range> targets_;
    std::vector<Node> nodes_;             // the targets' subtrees
    std::vector<int> roots_;              // per target: its node
    std::vector<std::vector<int>> leaf_;  // per microbatch: its leaves' nodes
    std::vector<float*> target_bufs_;     // per target: where its value ends (0: result)
    std::vector<Arena> pool_;             // partial gradients made so far
    std::vector<float*> free_;
};

}  // namespace px
