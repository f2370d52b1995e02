// A Llama-3 block (model.arch = "llama"), with Qwen3's switch (model.qk_norm):
//
//   h  = x + o_proj(attention(rope(norm_q(q_proj(n1))), rope(norm_k(k_proj(n1))), v_proj(n1)))
//   out = h + down_proj(silu(gate_proj(n2)) · up_proj(n2)),   n1 = rms_1(x), n2 = rms_2(h)
//
// RMSNorm (model.norm_eps) before attention and MLP, no biases, rotary positions (the model's
// table, at each row's logical position: context parallelism's zig-zag chunks keep theirs), and
// grouped-query attention: model.kv_heads KV heads, each serving heads / kv_heads query heads
// (norm_q and norm_k only with qk_norm: one head_dim weight for every head). The attention runs the
// multi-head kernel on qkv (B,T,3·NH·HS) with each KV head repeated for its query heads (a copy,
// exact); backward sums the repeated heads' dk and dv of a KV head in query-head order, inside
// the token, before RoPE's inverse: a per-token sum, so every split of the tokens gives the same
// bits. On a MoE layer (Qwen3-MoE's, DeepSeek's) the MLP is the shared experts' SwiGLU (if any)
// plus the routed experts (moe.h), SwiGLU MLPs without biases.
//
// Index
//   LlamaBlock   forward and backward of block l of the model
//   KvGroups, repeat_kv, sum_kv   the KV heads' repeat for the attention kernel and its backward
#pragma once
#include "core/model/block.h"

#include <span>

namespace px {

// The grouped-query attention's heads on this rank: NH query heads from q0 and KV KV heads from
// kv0 of the model's (tensor parallelism: a rank's share; its KV heads all of them where tp does
// not divide them); query head q0 + j reads KV head (q0 + j) / group.
struct KvGroups {
    i64 B, T, NH, KV, HS, group, q0 = 0, kv0 = 0;
    i64 rows() const { return B * T; }
    i64 kv_of(i64 j) const { return (q0 + j) / group - kv0; }
};
// qkv's k (or v) part, heads [0, NH) from column col0 of rows 3·NH·HS apart, each the copy of
// its KV head of src (B,T,KV·HS): a repeat, exact in any dtype.
void repeat_kv(const KvGroups& g, const Tensor& qkv, i64 col0, const Tensor& src);
// dst (B,T,KV·HS) = for each KV head, the sum of its query heads' gradients in dqkv's part from
// col0 (rows of dqkv's width apart), in head order, in fp32 and rounded once to dst's dtype. The
// KV heads' query heads must all be here (q0 = kv0·group).
void sum_kv(const KvGroups& g, const Tensor& dst, const Tensor& dqkv, i64 col0);

class LlamaBlock final : public Block {
public:
    LlamaBlock(const LayerOps& ops, const MoeLayer& moe, float* logit_max)
        : ops_(ops), moe_(moe), logit_max_(logit_max) {}

    void forward(Activations& a, int l, int i, bool probed = true) const override;
    void backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                  float dloss) const override;

private:
    // qkv of local layer i from its n1, and the attention's output projection into `proj`.
    void attention_forward(Activations& a, int l, int i, const Tensor& proj, bool probed) const;
    // dln1 (zeroed by the caller) += d(n1) for dout = d(proj).
    void attention_backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                            const Tensor& dout, const Tensor& dln1) const;
    // The SwiGLU MLP (a dense layer's, or a MoE layer's shared experts'): out from n2; backward:
    // dln2 += d(n2) for dout = d(out).
    void mlp_forward(Activations& a, int l, int i, const Tensor& out, bool probed) const;
    void mlp_backward(Activations& a, std::span<const TokenNode> nodes, int l, int i,
                      const Tensor& dout, const Tensor& dln2) const;

    const LayerOps& ops_;
    const MoeLayer& moe_;
    float* logit_max_;
};

}  // namespace px
