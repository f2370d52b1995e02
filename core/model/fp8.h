// FP8 matmuls with per-tensor delayed scaling (precision.fp8 = "delayed"), as Transformer Engine
// defines it (DelayedScaling, the HYBRID format): every matmul that runs in fp8 has three scaled
// tensors, its input X and weight W (e4m3, max 448) and, in backward, its output gradient dY
// (e5m2, max 57344). A tensor is cast as q = fp8(x · scale) (nearest even, saturating: OCP) and
// read back as q · scale_inv, scale_inv = 1 / scale in fp32; the matmul then runs on those values
// with fp32 products summed in the canonical order (the fp32 kernels). This "fake quantisation"
// is an fp8 GEMM with fp32 accumulation bit for bit when the scales are powers of two (the
// products of two read-back values are then exact); otherwise each read-back value carries one
// fp32 rounding, the same on every layout. Hopper's narrower accumulator, promoted to fp32 every
// N products, is emulated when precision.fp8_accumulator_promote = N > 0: the fp8 matmuls (forward,
// dinp, dweight; not dbias) then run with Numerics::fp8_promote = N, whose narrow sums are
// defined inside the canonical blocks (core/base/numerics.h), so every layout stays exact;
// otherwise every sum is fp32 from its first product.
// The activations between matmuls stay bf16 (precision.activations = "bf16").
//
// Delayed scaling: a step casts with the scales made before it. Each cast records max |x| of its
// tensor (the step's amax: over every microbatch; X and W in forward, dY in backward); after the
// step's backward the trainer takes the max over the tensor-, data- and pipeline-parallel groups
// (exact in any order), so every rank holds the same amaxes and makes the same scales:
//   history: the step's amax enters at the front, the oldest of amax_history_len leaves;
//   amax    = max of the history ("max") or its front ("most_recent");
//   scale   = fp8_max / amax / 2^margin, in fp32; the previous scale is kept when amax is 0 (a
//             tensor of zeros), not finite (an inf or NaN was cast), or the quotient overflows.
// The first step casts with scale 1 (an empty history), as Transformer Engine does.
//
// Block-wise current scaling (precision.fp8 = "block"), as DeepSeek-V3 does it: no state; each
// cast scales every 1 x b tile of an activation or output gradient (b consecutive elements of a
// row along its last dimension, b = fp8_block_size, 128 by default) and every b x b block of a
// weight by its own scale 448 / amax(tile) (1 for a tile of zeros or one holding an inf or a
// NaN), all in e4m3. The backward casts X and W with the forward's tiles (the same values give
// the same casts). Tiles are cut on logical indices; under tensor parallelism each rank's share
// of hidden and ffn must be whole tiles (checked when the job is made), so that no tile spans two
// ranks and every rank casts what the single device casts.
//
// Which matmuls: the linears of the blocks precision.fp8_layers names (by default, with
// fp8_keep_ends_bf16, every block but the first and the last), and with fp8_lm_head the LM head
// (x = ln_f's output, w = wte, dy = the logits' gradient; tied to wte, which the embedding, a
// lookup, reads unquantised). The fp8 matmuls are numbered in the whole model's table order, the
// LM head last.
//
// Index
//   Fp8Gemm         one fp8 matmul: its weight, block, kind and name ("h.3.attn.c_attn")
//   Fp8CastObserver told of every first cast of a step's tensor (the drift monitor)
//   Fp8Scaling      the scales, histories and step amaxes of every fp8 matmul of the whole model
//   fp8_encode, fp8_encode_tiles   the fp8 codes behind a cast (delayed, block), with its scales
//   Fp8Linears      the model's linears that run on fp8 casts, and its fp8 LM head
//
// No fp8 byte is kept anywhere: a cast is read back to fp32 at once. fp8_encode gives the codes a
// cast reads back, for tools that show them (the Python module's fp8_cast).
#pragma once
#include "core/base/config.h"
#include "core/base/numerics.h"
#include "core/base/tensor.h"

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace px {

// Of core/model/model.h, which includes this header (Fp8Linears takes them).
class ParallelLayers;
struct TokenNode;
enum class Linear : std::uint8_t;

// One fp8 matmul of the whole model.
struct Fp8Gemm {
    enum Kind : int { qkv, attn_proj, fc, fc_proj, lm_head };
    int weight_id = -1;  // its weight's id in the whole model's table (wte for the LM head)
    int layer = -1;      // its block; -1: the LM head
    Kind kind = qkv;
    std::string name;  // GPT-2's name of the layer: "h.3.attn.c_attn", "h.3.mlp.c_proj", "lm_head"
    // Megatron's split of the layer under tensor parallelism: a column-parallel layer (qkv, fc,
    // the LM head over the vocabulary) has its input whole on every tp rank and its weight and
    // output gradient cut; a row-parallel one (attn_proj, fc_proj) its input and weight cut and
    // its output gradient whole.
    bool column_parallel() const { return kind == qkv || kind == fc || kind == lm_head; }
};

class Fp8CastObserver;

class Fp8Scaling {
public:
    enum Role : int { x = 0, w = 1, dy = 2 };  // input, weight (e4m3), output gradient (e5m2)
    static constexpr int kRoles = 3;
    static constexpr const char* kRoleNames[kRoles] = {"x", "w", "dy"};

    // tp: the tensor-parallel degree, for the block recipe's check (a ConfigError naming the
    // keys when a rank's share of hidden or ffn is not whole tiles). nx: the casts' vector path.
    Fp8Scaling(const ModelConfig& mc, const PrecisionConfig& pc, int tp = 1,
               const Numerics& nx = Numerics{});

    bool delayed() const { return delayed_; }  // else block-wise current scaling
    i64 block_size() const { return block_; }

    int gemms() const { return n_gemms_; }
    // precision.fp8_accumulator_promote: N > 0 sums the fp8 matmuls' products in the narrow
    // accumulator promoted to fp32 every N products (Numerics::fp8_promote); 0: fp32 throughout.
    int accumulator_promote() const { return promote_; }
    const Fp8Gemm& gemm(int g) const { return gemm_[static_cast<size_t>(g)]; }
    i64 history_len() const { return history_len_; }
    // The fp8 matmul whose weight is tensor `weight_id` of the whole model's table; -1: that
    // matmul runs in bf16. The LM head is not found here (its weight, wte, is the embedding's).
    int gemm_of(int weight_id) const;
    int head_gemm() const { return head_gemm_; }  // the LM head's fp8 matmul; -1: bf16
    float scale(int gemm, Role r) const { return scale_[slot(gemm, r)]; }  // delayed only
    // Delayed: the newest amax of (gemm, r)'s history; 0 before the first update (the scale is
    // then the initial 1, made from no amax).
    float newest_amax(int gemm, Role r) const { return history_[slot(gemm, r) * history_len_]; }
    // The fp8 dtype's largest finite value for role r: 448 (e4m3) or, delayed dy, 57344 (e5m2).
    float fp8_max(Role r) const;
    // The block recipe's scale of a tile of largest magnitude amax (finite: no inf or NaN in
    // it): 448 / amax, or 1 for a tile of zeros or one holding an inf or a NaN.
    static float block_scale(float amax, bool finite);

    // Told of every cast made with record = true (null: none; not owned).
    void set_cast_observer(Fp8CastObserver* o) { observer_ = o; }

    // dst (src.numel() floats) = src's values cast to role r's fp8 dtype with its scale and read
    // back (see above). record: max |src| joins the step's amax of (gemm, r), and the cast
    // observer is told. The model records the first cast of each tensor of a step (X and W in
    // forward, dY in backward), not the backward's casts of X and W again nor a recomputed
    // forward's (the same values).
    void cast(int gemm, Role r, const Tensor& src, float* dst, bool record);
    // Block recipe: dst = src cast tile by tile (weights: b x b blocks of its (rows, cols)).
    void cast_blocks(Role r, const Tensor& src, float* dst) const;

    // The step's amaxes, (gemms, kRoles) row-major: zero at begin_step; the trainer reduces them
    // (max over ranks) in place between the step's backward and update().
    void begin_step();
    std::vector<float>& step_amax() { return amax_now_; }
    void update();

    // What checkpoints and snapshots keep: scales (gemms, kRoles), then histories (gemms ·
    // kRoles, history_len), newest first. Empty for the block recipe (it keeps nothing).
    std::vector<float> state() const;
    void restore(const std::vector<float>& s);  // a state() of the same shapes
    i64 state_size() const;
    // The same, in place (delayed; empty for block): they stay where they are for the scaling's
    // life, updated by update() and restore().
    const std::vector<float>& scales() const { return scale_; }       // (gemms, kRoles)
    const std::vector<float>& histories() const { return history_; }  // (gemms·kRoles, history_len)

private:
    size_t slot(int gemm, Role r) const { return static_cast<size_t>(gemm) * kRoles + r; }

    Numerics nx_;
    bool delayed_ = true;
    i64 block_ = 128;
    int promote_ = 0;
    int n_gemms_ = 0;
    std::vector<Fp8Gemm> gemm_;
    std::vector<int> gemm_of_id_;  // per whole-model tensor id
    int head_gemm_ = -1;
    Fp8CastObserver* observer_ = nullptr;
    i64 history_len_ = 1;
    bool most_recent_ = false;
    int margin_ = 0;
    std::vector<float> scale_, amax_now_, history_;  // history_: (slot, history_len)
};

// The codes behind a delayed cast: q[i] = t(x[i]·scale), t = e4m3 or e5m2, nearest even and
// saturating (core/base/dtype.h), which Fp8Scaling::cast reads back as decode(q)·(1/scale), bit
// for bit. Returns max |x| over the values that are not NaN.
// x (n), q (n)
float fp8_encode(std::uint8_t* q, const float* x, i64 n, DType t, float scale);
// The codes behind a block-wise cast: x (R,K) row-major cut into tiles of `band` rows by b columns
// (the last ones may be short), each tile's e4m3 codes with its own scale (Fp8Scaling::block_scale
// of the tile's amax) in `scales`, which ops::fake_quant_tiles reads back as decode(q)·(1/scale).
// x (R,K), q (R,K), scales (ceil(R/band), ceil(K/b))
void fp8_encode_tiles(std::uint8_t* q, float* scales, const float* x, i64 R, i64 K, i64 band,
                      i64 b);

// Told of each recorded cast as it happens, on the thread that casts: src the tensor cast (its
// dtype, this rank's piece of it), dst its read-back values. A delayed cast used scale(gemm, r);
// a block cast, block_scale of each tile. An observer must not change either.
class Fp8CastObserver {
public:
    virtual ~Fp8CastObserver() = default;
    virtual void on_cast(const Fp8Scaling& fp8, int gemm, Fp8Scaling::Role r, const Tensor& src,
                         const float* dst) = 0;
};

// The linears of the model whose matmul runs in fp8 (Fp8Scaling::gemm_of), on the fp8 casts of
// their operands read back as fp32 tensors: the matmul then runs on the fp32 kernels (or the
// tensor-parallel layers), in the model's numerics with the narrow accumulator when asked for
// (accumulator_promote), and its output (or dinp) is rounded once into its dtype (bf16): the
// bf16 backend's rule with fp8 cast points. The model's LayerOps hands them every linear whose
// weight is an fp8 matmul's.
class Fp8Linears {
public:
    // layers: null for the plain kernels. Not owned; they outlive the Fp8Linears.
    Fp8Linears(Fp8Scaling& fp8, const Numerics& nx, const ParallelLayers* layers)
        : fp8_(fp8), nx_(nx), layers_(layers) {}

    // out = cast(inp) · cast(weight)ᵀ + bias, as ParallelLayers::linear_forward. record: the
    // casts' amaxes join the step's (false when backward recomputes a block: the same values).
    void forward(int gemm, Linear l, const Tensor& out, const Tensor& inp, const Tensor& weight,
                 const Tensor* bias, bool record) const;
    // Backward: dY cast to e5m2 (recorded), X and W cast again with the forward's scales; each
    // cast once over all rows, then linear_backward_rows (core/model/layer_ops.h) on the casts.
    void backward(int gemm, std::span<const TokenNode> nodes, Linear l, const Tensor& dinp,
                  const Tensor& dweight, const Tensor* dbias, const Tensor& dout,
                  const Tensor& inp, const Tensor& weight) const;
    // The LM head (tied to wte), when precision.fp8_lm_head: the logits into probs; in
    // backward, dlogits, lnf and wte become fp32 views of their casts (held in buf), on which
    // the head's backward then runs as on any operands.
    void head_logits(const Tensor& probs, const Tensor& lnf, const Tensor& wte) const;
    void head_casts(std::vector<float> (&buf)[3], Tensor& dlogits, Tensor& lnf,
                    Tensor& wte) const;

private:
    Fp8Scaling& fp8_;
    const Numerics& nx_;
    const ParallelLayers* layers_;
};

}  // namespace px
