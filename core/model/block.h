// The block interface: one transformer block's forward and backward on the layout's ops
// (layer_ops.h), whatever its architecture. Each kind lives in its own file (gpt2_block.h,
// llama_block.h) and make_block is the one place a model's architecture (model.arch) picks it;
// the model, the trainer, the tensor-parallel layers, the probes and the checkpoint tables see
// only this interface and the parameter table (core/base/arena.h kParams).
//
// Index
//   Block        forward and backward of block l of the model, local layer i of a chunk
//   make_block   the block of a config's architecture
#pragma once
#include "core/model/layer_ops.h"
#include "core/model/moe.h"

#include <memory>
#include <span>

namespace px {

class Block {
public:
    virtual ~Block() = default;
    // Block l of the model, local layer i of the chunk's activations: residual3 of layer i from
    // its input (encoded, or residual3 of layer i - 1). probed: false when backward recomputes the
    // block, whose forward was probed already and its fp8 casts recorded.
    virtual void forward(Activations& a, int l, int i, bool probed = true) const = 0;
    // a.dresidual() holds d(residual3) on entry and d(input) on return; weight gradients go to the
    // nodes' buffers (dloss: d(mean loss)/d(token loss), for a MoE layer's auxiliary losses).
    virtual void backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                          float dloss) const = 0;
};

// The block of ops.config()'s architecture. logit_max: per layer of the whole model (null: none),
// see GPT::set_logit_max. Not owned; they outlive the block.
std::unique_ptr<Block> make_block(const LayerOps& ops, const MoeLayer& moe, float* logit_max);

}  // namespace px
