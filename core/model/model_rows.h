// Views of a microbatch's activations and gradient buffers that the model's files share
// (core/model/model.cpp, layer_ops.cpp, gpt2_block.cpp, moe.cpp): token rows, a token node's
// buffer, an MLP's width.
#pragma once
#include "core/model/model.h"

#include <cstring>
#include <span>

namespace px {

inline void zero(const Tensor& t) {
    std::memset(t.data, 0, static_cast<size_t>(bytes_of(t.dtype, t.numel())));
}

// Rows [r.lo, r.hi) of t seen as (rows, last dim); a vector (B,T) gives (hi - lo).
inline Tensor token_view(const Tensor& t, TokenRows r, i64 BT) {
    const i64 w = t.numel() / BT;
    return w == 1 ? subview(t, r.lo, {r.hi - r.lo}) : subview(t, r.lo * w, {r.hi - r.lo, w});
}

// Rows [lo, hi) of a (B,T,w) tensor t whose B·T rows are `BT`, as (hi - lo, w) (even for w = 1);
// of a (B,T) one (a LayerNorm's mean or rstd) as (hi - lo).
inline Tensor node_rows(const Tensor& t, i64 lo, i64 hi, i64 BT) {
    const i64 w = t.numel() / BT;
    const bool per_token = t.ndim == 2 && t.shape[0] * t.shape[1] == BT;
    return per_token ? subview(t, lo, {hi - lo}) : subview(t, lo * w, {hi - lo, w});
}

// The tensor g (in nodes[0]'s gradient buffer) in node n's buffer.
inline Tensor in_node(const Tensor& g, std::span<const TokenNode> nodes, size_t n) {
    Tensor t = g;
    t.data = nodes[n].grads + (g.f32() - nodes[0].grads);
    return t;
}

// The first F channels of an MLP activation (B,T,FM) (core/base/arena.h Dim::FM), as (B,T,F).
inline Tensor mlp_act(const Tensor& t, i64 F) {
    return subview(t, 0, {t.shape[0], t.shape[1], F});
}

}  // namespace px
