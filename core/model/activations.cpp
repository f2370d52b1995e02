// The activations of one microbatch on one chunk (activations.h): views into their arena.
#include "core/model/activations.h"

#include "core/base/error.h"

namespace px {

Activations::Activations(const ModelConfig& mc, const ActShape& shape)
    // (a step writes nearly all of its activations: mapped now, not in the first step)
    : mc_(mc),
      shape_(shape),
      table_(ActTable::build(mc, shape)),
      arena_(table_.total, Arena::Pages::now) {
    if (mc.is_moe())
        routes_.assign(static_cast<size_t>(resolve_dim(Dim::LS, mc, shape) * shape.B * shape.T *
                                           mc.moe_top_k),
                       0);
}

Tensor Activations::tensor(int a) const {
    const ActSpec& s = kActs[a];
    PX_ASSERT(!s.head || shape_.head, std::string("activation ") + s.name +
                                          " belongs to the head, which this chunk does not run");
    i64 dims[5];
    int nd = 0;
    for (Dim d : {s.d0, s.d1, s.d2, s.d3})
        if (d != Dim::one) dims[nd++] = resolve_dim(d, mc_, shape_);
    if (a == ATT) dims[nd++] = shape_.key_len();
    if (a == DPREATT || a == DATT) dims[nd - 1] = shape_.key_len();
    if (!arch_keeps(mc_, s)) dims[0] = 0;  // another architecture's: empty
    if (nd > kMaxDims) {  // (L,B,NH,T,T): fold L into B for the whole-tensor view
        dims[1] *= dims[0];
        for (int i = 0; i < nd - 1; i++) dims[i] = dims[i + 1];
        nd--;
    }
    return arena_.view(table_.dtype[a], table_.offset[a], dims, nd, s.name);
}

Tensor Activations::layer(int a, int i) const {
    const ActSpec& s = kActs[a];
    PX_ASSERT(s.d0 == Dim::L || s.d0 == Dim::LS,
              "Activations::layer on a tensor without a layer dimension");
    PX_ASSERT(i >= 0 && i < shape_.layers, "Activations::layer: layer out of range");
    // Under recompute a block's internals have one slot, shared by all layers of the chunk.
    const int slot = s.d0 == Dim::LS && shape_.recompute ? 0 : i;
    i64 dims[4];
    int nd = 0;
    for (Dim d : {s.d1, s.d2, s.d3})
        if (d != Dim::one) dims[nd++] = resolve_dim(d, mc_, shape_);
    if (a == ATT) dims[nd++] = shape_.key_len();
    if (!arch_keeps(mc_, s)) dims[0] = 0;  // another architecture's: empty
    i64 per_layer = 1;
    for (int j = 0; j < nd; j++) per_layer *= dims[j];
    return arena_.view(table_.dtype[a],
                       table_.offset[a] + bytes_of(table_.dtype[a], slot * per_layer), dims, nd,
                       s.name);
}

Tensor Activations::output() const {
    return shape_.layers > 0 ? layer(RESIDUAL3, shape_.layers - 1) : input();
}

std::int32_t* Activations::routes(int i) const {
    PX_ASSERT(!routes_.empty(), "MoE routes of a model without MoE layers");
    PX_ASSERT(i >= 0 && i < shape_.layers, "Activations::routes: layer out of range");
    const i64 per_layer = shape_.B * shape_.T * mc_.moe_top_k;
    return routes_.data() + (shape_.recompute ? 0 : i) * per_layer;
}

}  // namespace px
