// Tensor parallelism applied to the GPT model (docs/layouts.md): the model's ParallelLayers over
// a tp group, built from the bit-exact layers of core/parallel/tensor/tensor_parallel.h, and what
// the trainer and the logical state need around them (the exact gradient norm, logical positions).
//
// Index
//   TpLayers            ParallelLayers over a tp group: the local shapes, the slice initialisation,
//                       the Megatron layers for each linear, the embedding and the LM head
//   make_tp_model       applies tensor parallelism to a model, in fixed, commented steps
//   tp_grad_norm        the global gradient norm of a tp shard, bit-identical to the single device
//   logical_indices     where each local element of a parameter sits in the logical tensor
//   load_logical        a shard's slices of the logical parameters (checkpoints in)
//   gather_logical      the logical parameters from every tp rank's shard (checkpoints out)
//
// What each rank holds (tp ranks, rank r; splits from tp::make_tp_shards):
//   wte              (V_r, C)     vocabulary rows: the embedding and the tied LM head
//   wpe, ln_*        replicated
//   attn.c_attn      (3C/tp, C)   rows of q, k and v of the rank's heads; its bias likewise
//   attn.c_proj      (C, C/tp)    the columns of those heads; bias replicated (row parallel)
//   mlp.c_fc         (F/tp, C)    ffn rows; its bias likewise
//   mlp.c_proj       (C, F/tp)    ffn columns; bias replicated (row parallel)
//   a MoE layer's router, experts and shared experts (mlp.*): whole, replicated; every tp rank
//   runs the layer on the whole ln2 (no sequence parallelism) and gets the same bits
// Sequence parallelism (layout.sequence_parallel): between a row-parallel output and the next
// column-parallel input rank r holds only tokens tp::token_split(BT)[r] of each microbatch
// (residual stream, LayerNorms); row-parallel outputs are reduce-scattered by tokens, LayerNorm
// outputs all-gathered before the column-parallel linears (and the LM head), and in backward
// d(residual) is all-gathered before the row-parallel linears and the column-parallel dX
// reduce-scattered. The LayerNorm weight/bias gradients reduce over every token of the
// microbatch by the canonical token tree across ranks (tp::sp_layernorm_backward), so they stay
// replicated and bit-identical.
// Replicated tensors get the same gradient bits on every rank (the layers compute them
// identically), so gradients are never summed over tp; AdamW is elementwise on local shards.
#pragma once
#include "core/comm/comm.h"
#include "core/model/model.h"
#include "core/parallel/tensor/tensor_parallel.h"

#include <memory>
#include <vector>

namespace px {

class TpLayers : public ParallelLayers {
public:
    // tp: the group (outlives this object). Throws ConfigError when the shapes do not split.
    // sequence_parallel (layout.sequence_parallel): the residual stream and the LayerNorms are
    // sharded by tokens (tp::token_split of each microbatch) between the tp linears.
    TpLayers(comm::Communicator& tp, const Numerics& nx, const ModelConfig& mc,
             bool sequence_parallel = false);

    const tp::TpShards& shards() const { return shards_; }
    int rank() const override { return rank_; }
    // The tp:: routines (core/parallel/tensor/tensor_parallel.h) compute in fp32. Activations of a
    // narrower dtype are widened for them (exactly), a matmul's weights rounded to that dtype (its
    // cast point) and each activation they write rounded once: the ops' own rule for a 16-bit
    // backend (kernels/cpu/bf16_backend.cpp), so a layout matches the single device bit for bit.
    // fp8 needs scales, which a plain cast does not give.
    bool carries(DType t) const override {
        return t == DType::f32 || t == DType::bf16 || t == DType::f16;
    }
    int size() const { return shards_.tp; }
    comm::Communicator& comm() const { return comm_; }
    // The splits of a parameter's rows and columns (null: not split, replicated along it).
    const tp::DimSplit* row_split(const TableEntry& e) const;
    // The output columns a column-parallel linear's rank holds (qkv, q, kv, fc).
    const tp::DimSplit& out_split(Linear l) const;
    const tp::DimSplit* col_split(const TableEntry& e) const;
    bool sharded(const TableEntry& e) const { return row_split(e) || col_split(e); }
    bool whole_moe(const TableEntry& e) const;  // a MoE layer's MLP tensor: held whole

    TpDims dims() const override;
    bool sequence_parallel() const override { return sp_ && shards_.tp > 1; }
    TokenRows token_rows(i64 BT) const override;
    void sp_gather(const Tensor& t) const override;
    void gather_heads(const Tensor& full, const Tensor& local) const override;
    void layernorm_backward(const Tensor* dinp, const Tensor* dweight, const Tensor* dbias,
                            const Tensor& dout, const Tensor& inp, const Tensor& weight,
                            const Tensor& mean, const Tensor& rstd, i64 row_lo,
                            i64 row_hi) const override;
    void fill_normal(float* p, const TableEntry& e, float std, std::uint64_t seed) const override;
    void linear_forward(const Numerics& nx, Linear l, const Tensor& out, const Tensor& inp,
                        const Tensor& weight, const Tensor* bias) const override;
    void linear_backward(const Numerics& nx, Linear l, const Tensor* dinp, const Tensor* dweight,
                         const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                         const Tensor& weight) const override;
    void embedding_forward(const Tensor& out, const int* tokens, const Tensor& wte,
                           const Tensor& wpe) const override;
    void embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                            const int* tokens, i64 row_lo, i64 row_hi) const override;
    void head_logits(const Tensor& probs, const Tensor& lnf, const Tensor& wte) const override;
    void head_loss(const Tensor& losses, const Tensor& probs, const int* targets) const override;
    void head_dlogits(const Tensor& probs, const int* targets, float dloss) const override;
    void head_dinp(const Tensor* dlnf, const Tensor* dwte_head, const Tensor& probs,
                   const Tensor& lnf, const Tensor& wte) const override;
    ColumnShard probe_columns(ProbeSplit s) const override;
    ShardSpec param_shard(const TableEntry& e) const override;

private:
    comm::Communicator& comm_;
    Numerics nx_;
    ModelConfig mc_;
    int rank_ = 0;
    tp::TpShards shards_;
    bool sp_ = false;
};

// The whole model as tp rank tp.rank()'s shard. Steps:
//   1. splits: qkv rows by heads, attention channels, ffn, vocabulary (whole blocks,
//   make_tp_shards);
//   2. the layers: TpLayers replaces each linear with its column- or row-parallel form, the
//      embedding and the LM head with their vocabulary-parallel forms;
//   3. the model: GPT over those layers, whose table gives every parameter its local shape (with
//      the whole model's names and ids, so initialisation draws each shard's slice);
//   4. with sequence_parallel, the layers also shard the residual stream and the LayerNorms by
//      tokens: LayerNorm on the rank's tokens, all-gather before each column-parallel linear,
//      reduce-scatter after each row-parallel one, and the mirror image in backward.
std::unique_ptr<GPT> make_tp_model(comm::Communicator& tp, const Numerics& nx,
                                   const ModelConfig& mc, bool sequence_parallel = false);

// sqrt of the canonical tree over tensors (whole-model order) of each tensor's canonical sum of
// squares. A sharded tensor's logical blocks each lie whole on one rank, whose block partials are
// exchanged (an all-reduce of the block vectors, every other rank contributing +0, which is exact),
// then every rank forms the tensor's tree; replicated tensors are summed locally. A collective of
// the tp group. With ZeRO-2/3 (dp non-null), only the floats [lo, hi) of the local table hold
// gradients on this rank: block partials are exchanged over dp too (zero.h's shard edges fall on
// local block boundaries, which are logical block boundaries), and replicated tensors likewise.
float tp_grad_norm(const TpLayers& tp, const GPT& model, const float* grads,
                   comm::Communicator* dp = nullptr, i64 lo = 0, i64 hi = -1);

// Per entry of model's table (a whole model or a pipeline stage's part): the canonical Σg² of
// the logical tensor, as tp_grad_norm forms it before its tree over tensors; the same bits on
// every rank of the tp group (and of dp under ZeRO-2/3). A collective, with tp_grad_norm's
// arguments.
std::vector<float> tp_sum_squares(const TpLayers& tp, const GPT& model, const float* grads,
                                  comm::Communicator* dp = nullptr, i64 lo = 0, i64 hi = -1);

// For each local element of parameter e (an entry of tp rank `rank`'s table; default this rank's),
// its flat index in the logical tensor.
std::vector<i64> logical_indices(const TpLayers& tp, const TableEntry& e, const ModelConfig& mc,
                                 int rank = -1);

// The same for any model: a tp shard's (above), an expert-parallel part's stacked expert tensors
// (their rows start at GPT::expert_row_offset), identity for a tensor held whole.
std::vector<i64> logical_indices(const GPT& model, const TableEntry& e);

// model's parameters = its slices of the logical parameters `full` (laid out as `table`, the whole
// model's): loading a checkpoint into a shard. No communication.
// `local` (an array laid out as the model's table, e.g. Adam moments): the same for it instead.
void load_logical(const TpLayers& tp, GPT& model, const ParamTable& table, const float* full,
                  float* local = nullptr);
// full (laid out as the whole model's `table`) = every tp rank's parameters put together: an
// all_gather_v of the local parameter arenas over the tp group (a collective), then the slices
// placed by logical_indices. For writing checkpoints.
// `local` (an array laid out as the model's table, e.g. Adam moments): that array instead.
void gather_logical(const TpLayers& tp, const GPT& model, const ParamTable& table, float* full,
                    const float* local = nullptr);

}  // namespace px
