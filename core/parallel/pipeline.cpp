// Pipeline parallelism's pieces that the trainer (core/train/job.h) executes: the part of the model a
// pipeline rank holds, and the token-tree accumulation of a chunk's microbatch gradients. See
// pipeline.h for the argument.
#include "core/parallel/pipeline.h"

#include "core/base/error.h"

#include <cstring>

namespace px {

ModelPart stage_part(const Mesh& mesh, int pp_rank) {
    const Layout& l = mesh.layout();
    ModelPart part;
    if (l.pp == 1) {  // one stage runs the trivial schedule on one chunk (Mesh::schedule)
        part.chunks.push_back({0, static_cast<int>(l.layers)});
        return part;
    }
    for (int c = 0; c < l.virtual_stages; c++) {
        const LayerRange r = mesh.layers(pp_rank, c);
        part.chunks.push_back({r.lo, r.hi});
    }
    part.embedding = pp_rank == rank_of_stage(0, l.pp);
    part.head = pp_rank == rank_of_stage(l.num_stages() - 1, l.pp);
    return part;
}

// ---- TreeAccumulator -------------------------------------------------------------------------

TreeAccumulator::TreeAccumulator(int microbatches, i64 blocks_per_microbatch, float* result,
                                 i64 floats, GradSpan span)
    : result_(result), floats_(floats), span_(span) {
    PX_ASSERT(microbatches >= 1 && blocks_per_microbatch >= 1, "TreeAccumulator: empty tree");
    PX_ASSERT(0 <= span.lo && span.lo <= span.hi && span.hi <= floats, "TreeAccumulator: span");
    leaf_.assign(static_cast<size_t>(microbatches), -1);
    build(0, blocks_per_microbatch * microbatches, blocks_per_microbatch, -1);
    for (int k = 0; k < microbatches; k++)
        PX_ASSERT(leaf_[static_cast<size_t>(k)] >= 0, "TreeAccumulator: a microbatch is no node");
}

// Node [lo, hi) of token blocks; it splits at ceil(n/2) (DESIGN.md §2.1) until one microbatch's.
int TreeAccumulator::build(i64 lo, i64 hi, i64 bpm, int parent) {
    const int id = static_cast<int>(nodes_.size());
    nodes_.push_back(Node{});
    nodes_[static_cast<size_t>(id)].parent = parent;
    if (hi - lo == bpm) {
        PX_ASSERT(lo % bpm == 0, "TreeAccumulator: a microbatch's blocks are not one node");
        leaf_[static_cast<size_t>(lo / bpm)] = id;
        return id;
    }
    PX_ASSERT(hi - lo > bpm, "TreeAccumulator: a microbatch's blocks are not one node");
    const i64 mid = tree_mid(lo, hi);
    const int left = build(lo, mid, bpm, id);
    const int right = build(mid, hi, bpm, id);
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

float* TreeAccumulator::begin(int k) {
    Node& n = nodes_[static_cast<size_t>(leaf_[static_cast<size_t>(k)])];
    PX_ASSERT(!n.done && n.buf == nullptr, "TreeAccumulator: microbatch " + std::to_string(k) +
                                               " accumulated twice in one step");
    // The leftmost leaf's buffer becomes every ancestor's, up to the root: the result.
    n.buf = k == 0 ? result_ : take();
    std::memset(n.buf + span_.lo, 0, static_cast<size_t>(span_.hi - span_.lo) * sizeof(float));
    return n.buf;
}

void TreeAccumulator::end(int k) {
    int id = leaf_[static_cast<size_t>(k)];
    nodes_[static_cast<size_t>(id)].done = true;
    // Walk up while the sibling is complete too: parent = left + right, in left's buffer.
    for (int p = nodes_[static_cast<size_t>(id)].parent; p >= 0;
         p = nodes_[static_cast<size_t>(p)].parent) {
        Node& node = nodes_[static_cast<size_t>(p)];
        Node& l = nodes_[static_cast<size_t>(node.left)];
        Node& r = nodes_[static_cast<size_t>(node.right)];
        if (!l.done || !r.done) return;
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
    for (Arena& a : pool_) free_.push_back(a.f32());
}

// A message moves its elements as bits: fp32 as floats, a 16-bit or 8-bit activation as
// uint16_t or uint8_t (core/comm/comm.h: the communicators move, never add, those).
comm::Handle send_message(comm::Communicator& pp, const Tensor& msg, int peer, int tag) {
    PX_ASSERT(msg.contiguous(), std::string("pipeline message '") + msg.name + "' must be contiguous");
    switch (dtype_size(msg.dtype)) {
        case 4:
            return pp.send_async(static_cast<const float*>(msg.f32()), msg.numel(), peer, tag);
        case 2:
            return pp.send_async(static_cast<const std::uint16_t*>(msg.data), msg.numel(), peer, tag);
        default:
            return pp.send_async(static_cast<const std::uint8_t*>(msg.data), msg.numel(), peer, tag);
    }
}

void recv_message(comm::Communicator& pp, const Tensor& msg, int peer, int tag) {
    PX_ASSERT(msg.contiguous(), std::string("pipeline message '") + msg.name + "' must be contiguous");
    switch (dtype_size(msg.dtype)) {
        case 4:
            return pp.recv(msg.f32(), msg.numel(), peer, tag);
        case 2:
            return pp.recv(static_cast<std::uint16_t*>(msg.data), msg.numel(), peer, tag);
        default:
            return pp.recv(static_cast<std::uint8_t*>(msg.data), msg.numel(), peer, tag);
    }
}

}  // namespace px
