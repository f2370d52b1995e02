// The token tree's accumulation of a chunk's microbatch gradients (token_tree.h).
#include "core/parallel/data/token_tree.h"

#include "core/base/error.h"

#include <algorithm>
#include <string>

namespace px {

namespace {

std::vector<std::vector<Range>> equal_leaves(int microbatches, i64 bpm) {
    std::vector<std::vector<Range>> leaves(static_cast<size_t>(std::max(microbatches, 0)));
    for (int k = 0; k < microbatches; k++) leaves[static_cast<size_t>(k)] = {{k * bpm, (k + 1) * bpm}};
    return leaves;
}

}  // namespace

TreeAccumulator::TreeAccumulator(int microbatches, i64 blocks_per_microbatch, float* result,
                                 i64 floats, GradSpan span)
    : TreeAccumulator(blocks_per_microbatch * microbatches,
                      equal_leaves(microbatches, blocks_per_microbatch), result, floats, span) {}

TreeAccumulator::TreeAccumulator(i64 nb, std::vector<std::vector<Range>> leaves, float* result,
                                 i64 floats, GradSpan span)
    : result_(result), floats_(floats), span_(span), leaves_(std::move(leaves)) {
    PX_ASSERT(!leaves_.empty() && nb >= 1, "TreeAccumulator: empty tree");
    PX_ASSERT(0 <= span.lo && span.lo <= span.hi && span.hi <= floats, "TreeAccumulator: span");
    std::vector<Range> all;
    for (const auto& l : leaves_) {
        PX_ASSERT(!l.empty(), "TreeAccumulator: a microbatch without tokens");
        for (const Range& r : l) {
            if (!is_tree_node(nb, r.lo, r.hi))
                throw Error("TreeAccumulator: blocks [" + std::to_string(r.lo) + ", " +
                            std::to_string(r.hi) + ") are not one node of the tree over " +
                            std::to_string(nb) + " blocks");
            PX_ASSERT(all.empty() || all.back().hi <= r.lo,
                      "TreeAccumulator: leaves must be ascending and disjoint");
            all.push_back(r);
        }
    }
    targets_ = maximal_nodes(nb, all);
    leaf_.resize(leaves_.size());
    for (size_t k = 0; k < leaves_.size(); k++)
        leaf_[k].assign(leaves_[k].size(), -1);
    for (size_t t = 0; t < targets_.size(); t++)
        roots_.push_back(build(nb, targets_[t].lo, targets_[t].hi, -1, static_cast<int>(t)));
    for (const auto& l : leaf_)
        for (int id : l) PX_ASSERT(id >= 0, "TreeAccumulator: a leaf outside the targets");
    target_bufs_.assign(targets_.size(), nullptr);
    target_bufs_[0] = result_;
}

// Node [lo, hi) of token blocks; it splits at ceil(n/2) (docs/numerics.md) until it is a leaf.
// leftmost_of: the target whose leftmost path this node is on (else -1).
int TreeAccumulator::build(i64 nb, i64 lo, i64 hi, int parent, int leftmost_of) {
    const int id = static_cast<int>(nodes_.size());
    nodes_.push_back(Node{});
    nodes_[static_cast<size_t>(id)].parent = parent;
    for (size_t k = 0; k < leaves_.size(); k++)
        for (size_t i = 0; i < leaves_[k].size(); i++)
            if (leaves_[k][i] == Range{lo, hi}) {
                leaf_[k][i] = id;
                nodes_[static_cast<size_t>(id)].target = leftmost_of;
                return id;
            }
    PX_ASSERT(hi - lo > 1, "TreeAccumulator: the leaves do not cover the targets");
    const i64 mid = tree_mid(lo, hi);
    const int left = build(nb, lo, mid, id, leftmost_of);
    const int right = build(nb, mid, hi, id, -1);
    nodes_[static_cast<size_t>(id)].left = left;
    nodes_[static_cast<size_t>(id)].right = right;
    return id;
}

float* TreeAccumulator::take() {
    if (free_.empty()) {
        pool_.emplace_back(bytes_of(DType::f32, floats_));
        free_.push_back(pool_.back().f32());
    }
    float* b = free_.back();
    free_.pop_back();
    return b;
}

float* TreeAccumulator::leaf_buffer(int k) const {
    const Node& n = nodes_[static_cast<size_t>(leaf_[static_cast<size_t>(k)].front())];
    PX_ASSERT(n.buf != nullptr && !n.done, "TreeAccumulator: microbatch " + std::to_string(k) +
                                               " is not between begin and end");
    return n.buf;
}

std::vector<float*> TreeAccumulator::begin(int k) {
    std::vector<float*> bufs;
    for (int id : leaf_[static_cast<size_t>(k)]) {
        Node& n = nodes_[static_cast<size_t>(id)];
        PX_ASSERT(!n.done && n.buf == nullptr, "TreeAccumulator: microbatch " + std::to_string(k) +
                                                   " accumulated twice in one step");
        // A target's leftmost leaf's buffer becomes every ancestor's, up to the target.
        if (n.target >= 0) {
            float*& t = target_bufs_[static_cast<size_t>(n.target)];
            if (t == nullptr) {  // kept for the target: never on the free list
                pool_.emplace_back(bytes_of(DType::f32, floats_));
                t = pool_.back().f32();
            }
            n.buf = t;
        } else {
            n.buf = take();
        }
        zero_bytes(n.buf + span_.lo, bytes_of(DType::f32, span_.hi - span_.lo));
        bufs.push_back(n.buf);
    }
    return bufs;
}

void TreeAccumulator::end(int k) {
    for (int id : leaf_[static_cast<size_t>(k)]) {
        nodes_[static_cast<size_t>(id)].done = true;
        // Walk up while the sibling is complete too: parent = left + right, in left's buffer.
        for (int p = nodes_[static_cast<size_t>(id)].parent; p >= 0;
             p = nodes_[static_cast<size_t>(p)].parent) {
            Node& node = nodes_[static_cast<size_t>(p)];
            Node& l = nodes_[static_cast<size_t>(node.left)];
            Node& r = nodes_[static_cast<size_t>(node.right)];
            if (!l.done || !r.done) break;
            float* left = l.buf;
            const float* right = r.buf;
            const i64 lo = span_.lo, hi = span_.hi;
#pragma omp parallel for schedule(static)
            for (i64 i = lo; i < hi; i++) left[i] = left[i] + right[i];
            free_.push_back(r.buf);
            node.buf = l.buf;
            node.done = true;
            l.buf = r.buf = nullptr;
        }
    }
}

bool TreeAccumulator::complete() const {
    for (int r : roots_)
        if (!nodes_[static_cast<size_t>(r)].done) return false;
    return true;
}

float* TreeAccumulator::target_buffer(size_t i) const {
    PX_ASSERT(nodes_[static_cast<size_t>(roots_[i])].done, "TreeAccumulator: target incomplete");
    return target_bufs_[i];
}

i64 TreeAccumulator::bytes() const {
    i64 n = 0;
    for (const Arena& a : pool_) n += a.bytes();
    return n;
}

i64 TreeAccumulator::resident_bytes() const {
    i64 n = 0;
    for (const Arena& a : pool_) n += a.resident_bytes();
    return n;
}

void TreeAccumulator::release() {
    for (Arena& a : pool_) a.decommit(0, a.bytes());
}

void TreeAccumulator::reset() {
    for (Node& n : nodes_) {
        n.done = false;
        n.buf = nullptr;
    }
    free_.clear();
    for (Arena& a : pool_)
        if (std::find(target_bufs_.begin(), target_bufs_.end(), a.f32()) == target_bufs_.end())
            free_.push_back(a.f32());
}

}  // namespace px
