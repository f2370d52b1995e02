// The activations of one microbatch on one chunk of layers: one arena carved by the activation
// table (core/base/arena.h ActTable), and a MoE model's routes beside it. A block reads and writes
// its saved tensors here through layer(); GPT (core/model/model.h) makes them per chunk.
//
// Index
//   Activations   a chunk's input, each block's saved tensors, the head's, the backward's scratch
#pragma once
#include "core/base/arena.h"
#include "core/base/config.h"
#include "core/base/tensor.h"

#include <cstdint>
#include <vector>

namespace px {

// The activations of one microbatch (B sequences of T tokens) on one chunk of layers: its input
// hidden state, each block's saved tensors, the head's when the chunk ends in it, and the
// backward's scratch (ActTable). Recompute: only the residual stream (each block's input and
// output) is kept; a block's internals live in one shared slot, refilled by recomputing the
// block's forward inside backward, which gives the same bits (same inputs, same kernels).
class Activations {
public:
    Activations() = default;
    Activations(const ModelConfig& mc, const ActShape& shape);

    const ActShape& shape() const { return shape_; }
    DType dtype() const { return shape_.dtype; }  // of the activations (ActType::act)
    Tensor tensor(int a) const;                   // the whole tensor, in its table's dtype
    Tensor layer(int a, int i) const;  // local layer i (0 .. layers-1) of a per-layer tensor
    Tensor input() const { return tensor(ENCODED); }        // (B,T,C) the chunk's input
    Tensor output() const;                                  // (B,T,C) its last block's output
    Tensor dresidual() const { return tensor(DRESIDUAL); }  // (B,T,C) see kActs
    Tensor losses() const { return tensor(LOSSES); }        // (B,T) fp32, head chunks only
    i64 bytes() const {  // the table's total, and the MoE routes
        return arena_.bytes() + static_cast<i64>(routes_.size() * sizeof(std::int32_t));
    }
    // A MoE layer's routes (local layer i, its slot under recompute): per token (B·T) and slot
    // (K), the expert it goes to, or -1 - e when expert e was chosen but full (moe.h).
    std::int32_t* routes(int i) const;

private:
    ModelConfig mc_;
    ActShape shape_;
    ActTable table_{};
    Arena arena_;
    mutable std::vector<std::int32_t> routes_;  // (LS, B·T, K) of MoE models, else empty
};

}  // namespace px
