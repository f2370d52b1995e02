#include "core/model/fp8.h"

#include "core/base/arena.h"
#include "core/base/error.h"
#include "core/base/widened.h"
#include "core/model/layer_ops.h"
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>

namespace px {

Fp8Scaling::Fp8Scaling(const ModelConfig& mc, const PrecisionConfig& pc, int tp, const Numerics& nx)
    : nx_(nx),
      delayed_(pc.fp8 != "block"),
      block_(pc.fp8_block_size),
      promote_(static_cast<int>(pc.fp8_accumulator_promote)),
      history_len_(pc.fp8_amax_history_len),
      most_recent_(pc.fp8_amax_compute_algo == "most_recent"),
      margin_(static_cast<int>(pc.fp8_margin)) {
    const ParamTable table = ParamTable::build(mc);
    const std::vector<bool> in_fp8 = fp8_block_mask(pc, mc.layers);
    gemm_of_id_.assign(table.entries.size(), -1);
    for (const TableEntry& e : table.entries) {
        if (e.layer < 0 || !in_fp8[static_cast<size_t>(e.layer)]) continue;
        Fp8Gemm g;
        switch (e.spec - kFirstLayerSpec) {
            case QKVW:
            case QW:  // Llama's q, k and v: three gemms of the qkv kind
            case KW:
            case VW:
                g.kind = Fp8Gemm::qkv;
                break;
            case ATTPROJW:
                g.kind = Fp8Gemm::attn_proj;
                break;
            case FCW:
            case UPW:  // Llama's gate and up
                g.kind = Fp8Gemm::fc;
                break;
            case FCPROJW:
                g.kind = Fp8Gemm::fc_proj;
                break;
            default:
                continue;
        }
        g.weight_id = e.id;
        g.layer = e.layer;
        g.name = e.name.substr(0, e.name.size() - std::string(".weight").size());
        gemm_of_id_[static_cast<size_t>(e.id)] = n_gemms_++;
        gemm_.push_back(std::move(g));
    }
    if (pc.fp8_lm_head) {
        Fp8Gemm g;
        g.kind = Fp8Gemm::lm_head;
        g.weight_id = mc.tied_head() ? table.wte : table.lm_head;
        g.name = "lm_head";
        head_gemm_ = n_gemms_++;
        gemm_.push_back(std::move(g));
    }
    if (!delayed_) {
        // Llama: the query heads' channels, and the KV heads' where tp splits them, too.
        const i64 kv = kv_split(mc, tp) ? mc.kv_channels() / tp : block_;
        if (tp > 1 && mc.llama() &&
            ((mc.attn_channels() / tp) % block_ != 0 || kv % block_ != 0))
            throw ConfigError(
                "precision.fp8 = \"block\" under layout.tp = " + std::to_string(tp) +
                ": each rank's " + std::to_string(mc.attn_channels() / tp) +
                " query channels and " + std::to_string(kv) +
                " key/value channels (model.heads, model.kv_heads, model.head_dim) must be whole "
                "tiles of precision.fp8_block_size = " + std::to_string(block_) +
                " (a tile may not span two ranks); choose a block size that divides them, or "
                "another layout.tp");
        if (tp > 1 && ((mc.hidden / tp) % block_ != 0 || (mc.ffn / tp) % block_ != 0))
            throw ConfigError(
                "precision.fp8 = \"block\" under layout.tp = " + std::to_string(tp) +
                ": each rank's share of model.hidden = " + std::to_string(mc.hidden) +
                " and model.ffn = " + std::to_string(mc.ffn) +
                " must be whole tiles of precision.fp8_block_size = " + std::to_string(block_) +
                " (a tile may not span two ranks); choose a block size that divides " +
                std::to_string(mc.hidden / tp) + " and " + std::to_string(mc.ffn / tp) +
                ", or another layout.tp");
        if (tp > 1 && head_gemm_ >= 0)
            throw ConfigError(
                "precision.fp8_lm_head = true with precision.fp8 = \"block\" under layout.tp = " +
                std::to_string(tp) +
                ": the tp ranks share the vocabulary in pieces of numerics.block, which fp8 "
                "tiles may span; use precision.fp8 = \"delayed\", precision.fp8_lm_head = false, "
                "or layout.tp = 1");
        return;  // current scaling keeps no state
    }
    const size_t slots = static_cast<size_t>(n_gemms_) * kRoles;
    scale_.assign(slots, 1.0f);
    amax_now_.assign(slots, 0.0f);
    history_.assign(slots * static_cast<size_t>(history_len_), 0.0f);
}

float Fp8Scaling::fp8_max(Role r) const {
    return delayed_ && r == dy ? kE5M2Max : kE4M3Max;
}

float Fp8Scaling::block_scale(float amax, bool finite) {
    const float s = kE4M3Max / amax;
    return !(amax > 0.0f) || !finite || !std::isfinite(s) ? 1.0f : s;
}

int Fp8Scaling::gemm_of(int weight_id) const {
    if (weight_id < 0 || weight_id >= static_cast<int>(gemm_of_id_.size())) return -1;
    return gemm_of_id_[static_cast<size_t>(weight_id)];
}

void Fp8Scaling::cast_blocks(Role r, const Tensor& src, float* dst) const {
    ops::fake_quant_tiles(nx_, dst, src, r == w ? block_ : 1, block_);
}

void Fp8Scaling::cast(int gemm, Role r, const Tensor& src, float* dst, bool record) {
    PX_ASSERT(gemm >= 0 && gemm < n_gemms_, "an fp8 cast of a matmul that runs in bf16");
    if (!delayed_) {
        cast_blocks(r, src, dst);
        if (record && observer_) observer_->on_cast(*this, gemm, r, src, dst);
        return;
    }
    const float s = scale_[slot(gemm, r)];
    bool nan = false;
    float amax =
        ops::fake_quant(nx_, dst, src, r == dy ? DType::e5m2 : DType::e4m3, s, 1.0f / s, &nan);
    if (!record) return;
    if (nan) amax = INFINITY;  // a NaN cast: the scale is kept (not finite)
    float& a = amax_now_[slot(gemm, r)];
    a = std::max(a, amax);
    if (observer_) observer_->on_cast(*this, gemm, r, src, dst);
}

float fp8_encode(std::uint8_t* q, const float* x, i64 n, DType t, float scale) {
    PX_ASSERT(t == DType::e4m3 || t == DType::e5m2, "fp8_encode to a type that is not fp8");
    float amax = 0.0f;
    for (i64 i = 0; i < n; i++) {
        amax = std::max(amax, std::fabs(x[i]));  // keeps amax when |x| is NaN
        const float v = x[i] * scale;
        q[i] = t == DType::e4m3 ? f32_to_e4m3(v) : f32_to_e5m2(v);
    }
    return amax;
}

void fp8_encode_tiles(std::uint8_t* q, float* scales, const float* x, i64 R, i64 K, i64 band,
                      i64 b) {
    PX_ASSERT(band >= 1 && b >= 1, "fp8_encode_tiles with an empty tile");
    const i64 tiles = K > 0 ? (K + b - 1) / b : 0;
    for (i64 r0 = 0; r0 < R; r0 += band)
        for (i64 c0 = 0; c0 < K; c0 += b) {
            const i64 r1 = std::min(R, r0 + band), c1 = std::min(K, c0 + b);
            float amax = 0.0f;
            bool finite = true;
            for (i64 i = r0; i < r1; i++)
                for (i64 j = c0; j < c1; j++) {
                    const float a = std::fabs(x[i * K + j]);
                    finite = finite && std::isfinite(a);
                    amax = std::max(amax, a);
                }
            const float s = Fp8Scaling::block_scale(amax, finite);
            scales[(r0 / band) * tiles + c0 / b] = s;
            for (i64 i = r0; i < r1; i++)
                for (i64 j = c0; j < c1; j++) q[i * K + j] = f32_to_e4m3(x[i * K + j] * s);
        }
}

void Fp8Scaling::begin_step() {
    std::fill(amax_now_.begin(), amax_now_.end(), 0.0f);
}

void Fp8Scaling::update() {
    const size_t H = static_cast<size_t>(history_len_);
    const float two_margin = std::ldexp(1.0f, margin_);
    for (size_t k = 0; k < amax_now_.size(); k++) {
        float* h = history_.data() + k * H;
        std::copy_backward(h, h + H - 1, h + H);  // the oldest leaves
        h[0] = amax_now_[k];
        float amax = h[0];
        if (!most_recent_)
            for (size_t i = 1; i < H; i++) amax = std::max(amax, h[i]);
        const float fp8_max = k % kRoles == dy ? kE5M2Max : kE4M3Max;
        const float sf = fp8_max / amax / two_margin;
        if (amax > 0.0f && std::isfinite(amax) && std::isfinite(sf) && sf > 0.0f) scale_[k] = sf;
    }
}

i64 Fp8Scaling::state_size() const {
    return static_cast<i64>(scale_.size() + history_.size());
}

std::vector<float> Fp8Scaling::state() const {
    std::vector<float> s(scale_);
    s.insert(s.end(), history_.begin(), history_.end());
    return s;
}

void Fp8Scaling::restore(const std::vector<float>& s) {
    PX_ASSERT(static_cast<i64>(s.size()) == state_size(), "an fp8 state of another shape");
    std::copy(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(scale_.size()), scale_.begin());
    std::copy(s.begin() + static_cast<std::ptrdiff_t>(scale_.size()), s.end(), history_.begin());
}

}  // namespace px

// ---- Fp8Linears -----------------------------------------------------------------------------

namespace px {

namespace {

// An fp32 tensor over `data` with t's shape, name and id.
Tensor f32_like(const Tensor& t, float* data) {
    Tensor v = t;
    v.dtype = DType::f32;
    v.data = data;
    return v;
}

// Per-thread buffers for the casts (k: which of a linear's operands), kept between calls: a fresh
// zeroed allocation for every cast, and its unmapping, cost about as much as the cast.
float* cast_buffer(int k, i64 n) {
    thread_local std::vector<float> buf[3];
    std::vector<float>& b = buf[k];
    if (static_cast<i64>(b.size()) < n) b.resize(static_cast<size_t>(n));
    return b.data();
}

// The fp8 linears' numerics: the model's, with the narrow accumulator when asked for.
Numerics fp8_numerics(const Numerics& nx, const Fp8Scaling& fp8) {
    Numerics fx = nx;
    fx.fp8_promote = fp8.accumulator_promote();
    return fx;
}

}  // namespace

// out = cast(inp) · cast(weight)ᵀ + bias on the fp32 kernels (or the tensor-parallel layers),
// out rounded once into its dtype (bf16): the bf16 backend's rule with fp8 cast points.
void Fp8Linears::forward(int gemm, Linear l, const Tensor& out, const Tensor& inp,
                         const Tensor& weight, const Tensor* bias, bool record) const {
    float* const xq = cast_buffer(0, inp.numel());
    float* const wq = cast_buffer(1, weight.numel());
    fp8_.cast(gemm, Fp8Scaling::x, inp, xq, record);
    fp8_.cast(gemm, Fp8Scaling::w, weight, wq, record);
    const Tensor x = f32_like(inp, xq), w = f32_like(weight, wq);
    const Numerics fx = fp8_numerics(nx_, fp8_);
    const Widened o(&out);
    if (layers_)
        layers_->linear_forward(fx, l, *o, x, w, bias);
    else
        ops::matmul_forward(fx, *o, x, w, bias);
    o.store();
}

// Backward: dY cast to e5m2 (recorded), X and W cast again with the forward's scales (their
// amaxes were recorded in forward); dinp accumulates in fp32 and is rounded once.
void Fp8Linears::backward(int gemm, std::span<const TokenNode> nodes, Linear l,
                          const Tensor& dinp, const Tensor& dweight, const Tensor* dbias,
                          const Tensor& dout, const Tensor& inp, const Tensor& weight) const {
    float* const dq = cast_buffer(2, dout.numel());
    float* const xq = cast_buffer(0, inp.numel());
    float* const wq = cast_buffer(1, weight.numel());
    fp8_.cast(gemm, Fp8Scaling::dy, dout, dq, true);
    fp8_.cast(gemm, Fp8Scaling::x, inp, xq, false);
    fp8_.cast(gemm, Fp8Scaling::w, weight, wq, false);
    const Tensor d = f32_like(dout, dq), x = f32_like(inp, xq), w = f32_like(weight, wq);
    const Widened di(&dinp);
    linear_backward_rows(layers_, fp8_numerics(nx_, fp8_), nodes, l, di.get(), dweight, dbias, d,
                         x, w);
    di.store();
}

// The LM head: logits = cast(lnf) · cast(wte)ᵀ on the fp32 kernels (or the vocabulary-parallel
// layers), rounded once into probs.
void Fp8Linears::head_logits(const Tensor& probs, const Tensor& lnf, const Tensor& wte) const {
    const int g = fp8_.head_gemm();
    std::vector<float> xq(static_cast<size_t>(lnf.numel())), wq(static_cast<size_t>(wte.numel()));
    fp8_.cast(g, Fp8Scaling::x, lnf, xq.data(), true);
    fp8_.cast(g, Fp8Scaling::w, wte, wq.data(), true);
    const Tensor x = f32_like(lnf, xq.data()), w = f32_like(wte, wq.data());
    const Widened o(&probs);
    if (layers_)
        layers_->head_logits(*o, x, w);
    else
        ops::matmul_forward(nx_, *o, x, w, nullptr);
    o.store();
}

void Fp8Linears::head_casts(std::vector<float> (&buf)[3], Tensor& dlogits, Tensor& lnf,
                            Tensor& wte) const {
    const int g = fp8_.head_gemm();
    Tensor* t[3] = {&dlogits, &lnf, &wte};
    const Fp8Scaling::Role role[3] = {Fp8Scaling::dy, Fp8Scaling::x, Fp8Scaling::w};
    for (int k = 0; k < 3; k++) {
        buf[k].resize(static_cast<size_t>(t[k]->numel()));
        fp8_.cast(g, role[k], *t[k], buf[k].data(), k == 0);
        *t[k] = f32_like(*t[k], buf[k].data());
    }
}

}  // namespace px
