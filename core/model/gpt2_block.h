// A GPT-2 block, forward and backward, written out as llm.c does:
//
//   residual2 = x + attn_proj(attention(qkv(ln_1(x))))
//   residual3 = residual2 + mlp(ln_2(residual2))
//
// mlp: c_fc, GELU-tanh, c_proj; on a MoE layer (moe.h) the shared experts' MLP (if any), then
// the routed experts (MoeLayer) added to its output. The block runs on LayerOps, so the same code
// serves every layout; its activations are local layer i of a chunk's Activations.
//
// Index
//   Gpt2Block   forward and backward of block l of the model
#pragma once
#include "core/model/block.h"

#include <span>

namespace px {

class Gpt2Block final : public Block {
public:
    // logit_max: per layer of the whole model (null: none), see GPT::set_logit_max.
    Gpt2Block(const LayerOps& ops, const MoeLayer& moe, float* logit_max)
        : ops_(ops), moe_(moe), logit_max_(logit_max) {}

    // Block l of the model, local layer i of the chunk's activations. probed: false when
    // backward recomputes the block, whose forward was probed already and its fp8 casts recorded.
    void forward(Activations& a, int l, int i, bool probed = true) const override;
    // a.dresidual() holds d(residual3) on entry and d(x) on return; weight gradients go to the
    // nodes' buffers (dloss: d(mean loss)/d(token loss), for a MoE layer's auxiliary losses).
    void backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                  float dloss) const override;

private:
    // The plain MLP of layer l (a dense layer's, or a MoE layer's shared experts'): out = its
    // output on ln2; backward: dln2 += d(ln2) for dout = d(out).
    void mlp_forward(Activations& a, int l, int i, const Tensor& out, bool probed) const;
    void mlp_backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                      const Tensor& dout, const Tensor& dln2) const;

    const LayerOps& ops_;
    const MoeLayer& moe_;
    float* logit_max_;
};

}  // namespace px
