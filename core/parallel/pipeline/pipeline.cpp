// Pipeline parallelism's pieces that its trainer part (part.h) uses: the part of the model a
// pipeline rank holds, and the messages between stages. See pipeline.h for the argument.
#include "core/parallel/pipeline/pipeline.h"

#include "core/base/error.h"

#include <algorithm>
#include <string>

namespace px {

ModelPart stage_part(const Mesh& mesh, int pp_rank, const ModelConfig& mc) {
    const Layout& l = mesh.layout();
    ModelPart part;
    part.tied = mc.tied_head();
    if (l.pp == 1) {  // one stage runs the trivial schedule on one chunk (Mesh::schedule)
        part.chunks.push_back({0, static_cast<int>(l.layers)});
        return part;
    }
    for (int c = 0; c < l.virtual_stages; c++) {
        const LayerRange r = mesh.layers(pp_rank, c);
        part.chunks.push_back({r.lo, r.hi});
    }
    const Placement pl = placement_of(l.schedule);
    part.embedding = pp_rank == rank_of_stage(0, l.pp, pl);
    part.head = pp_rank == rank_of_stage(l.num_stages() - 1, l.pp, pl);
    return part;
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
