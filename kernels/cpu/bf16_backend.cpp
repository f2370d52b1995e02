// The CPU 16-bit backends, bf16 and fp16 activations computed by the fp32 kernels (one template,
// two instances). Each entry widens its 16-bit operands to fp32 (exact), rounds the weights a
// matmul reads to the activations' dtype (the cast point of a 16-bit matmul: both inputs in that
// dtype, products accumulated in fp32 in the canonical order), runs the fp32 kernel, and rounds
// each activation it writes once (nearest even; fp16 overflows to infinity, which the loss
// scaler of an fp16 run finds in the gradients and skips, core/train/loss_scaler.h). LayerNorm
// statistics, losses, softmax row statistics, weight gradients and the optimizer stay fp32
// (Operands below). Both numerics modes: the fp32 kernels choose their order from nx.mode.
//
// This is the reference 16-bit path, exact by construction and the same on every CPU. In fast
// mode bf16 runs bf16_fast_backend instead: the same entries but for the matmuls, which take
// oneDNN's bf16 primitive or sgemm (kernels/cpu/matmul_bf16.h).
#include "core/base/dtype.h"
#include "core/base/widened.h"
#include "kernels/backend.h"
#include "kernels/cpu/casts.h"
#include "kernels/cpu/matmul_bf16.h"

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace px::cpu {

namespace {

using ops::Backend;

// Per-thread fp32 buffers kept between calls: the LM head's logits are tens of MB, and fresh pages
// (zeroed and faulted in) on every call cost more than the conversion itself. A buffer is leased
// for the life of one Wide and handed back (the pool holds a few: the Wides of one entry).
thread_local std::vector<std::vector<float>> tl_pool;

class Lease {
public:
    explicit Lease(i64 n) {
        const size_t want = static_cast<size_t>(n);
        size_t pick = tl_pool.size();
        for (size_t i = 0; i < tl_pool.size(); i++)  // the smallest that fits, else the largest
            if (pick == tl_pool.size() ||
                (tl_pool[i].size() >= want
                     ? tl_pool[pick].size() < want || tl_pool[i].size() < tl_pool[pick].size()
                     : tl_pool[pick].size() < want && tl_pool[i].size() > tl_pool[pick].size()))
                pick = i;
        if (pick < tl_pool.size()) {
            v_ = std::move(tl_pool[pick]);
            tl_pool.erase(tl_pool.begin() + static_cast<std::ptrdiff_t>(pick));
        }
        if (v_.size() < want) v_.resize(want);
    }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { tl_pool.push_back(std::move(v_)); }
    float* data() { return v_.data(); }

private:
    std::vector<float> v_;
};

// Wide<D>(t): t's values in fp32; Wide<D>(t, true): a matmul's fp32 weights rounded to D; store()
// rounds the fp32 copy back into t once (core/base/widened.h). Contiguous bf16 goes through the
// vectorised casts of casts.h (the same bits as dtype.h's, which Widened uses for the rest: fp16,
// strided views); they are exact or nearest even on every path, so the best one runs.
template <DType D>
class Wide {
public:
    explicit Wide(const Tensor* t, bool matmul_weight = false) : from_(t) {
        if (t == nullptr) return;
        const bool vec = D == DType::bf16 && t->device == Device::cpu && t->contiguous() &&
                         (t->dtype == DType::bf16 || (t->dtype == DType::f32 && matmul_weight));
        if (!vec) {
            slow_.emplace(t, matmul_weight ? D : DType::f32);
            return;
        }
        n_ = t->numel();
        buf_.emplace(n_);
        if (t->dtype == DType::bf16)
            widen_bf16(isa(), buf_->data(), static_cast<const std::uint16_t*>(t->data), n_);
        else
            round_bf16(isa(), buf_->data(), t->f32(), n_);
        view_ = *t;
        view_.dtype = DType::f32;
        view_.data = buf_->data();
        i64 stride = 1;
        for (int d = view_.ndim - 1; d >= 0; d--) {
            view_.strides[d] = stride;
            stride *= view_.shape[d];
        }
    }
    const Tensor& operator*() const { return slow_ ? **slow_ : view_; }
    const Tensor* get() const { return from_ != nullptr ? &**this : nullptr; }
    void store() const {
        if (slow_) {
            slow_->store();
            return;
        }
        if (from_ != nullptr && from_->dtype == DType::bf16)  // weights are only read
            narrow_bf16(isa(), static_cast<std::uint16_t*>(from_->data), buf_->data(), n_);
    }

private:
    static Isa isa() {
        static const Isa best = detect_isa();
        return best;
    }
    const Tensor* from_;
    std::optional<Widened> slow_;
    mutable std::optional<Lease> buf_;  // store() writes from it
    i64 n_ = 0;
    Tensor view_;
};

// Wide<D> for an operand whose rows may be apart (a column slice: ops::row_stride over its first
// `lead` dimensions, the rest contiguous, as ops.cpp checked): a contiguous one is Wide<D>'s, a
// strided one is widened row by row into a contiguous fp32 copy of its shape and store() rounds
// it back row by row.
template <DType D>
class RowsWide {
public:
    RowsWide(const Tensor* t, int lead) : from_(t) {
        if (t->contiguous()) {
            wide_.emplace(t);
            return;
        }
        for (int d = lead; d < t->ndim; d++) inner_ *= t->shape[d];
        rows_ = inner_ > 0 ? t->numel() / inner_ : 0;
        ld_ = ops::row_stride(*t, lead);
        buf_.resize(static_cast<size_t>(t->numel()));
        for (i64 r = 0; r < rows_; r++)
            convert(buf_.data() + r * inner_, DType::f32, row(r), t->dtype,
                    static_cast<size_t>(inner_));
        view_ = *t;
        view_.dtype = DType::f32;
        view_.data = buf_.data();
        i64 stride = 1;
        for (int d = view_.ndim - 1; d >= 0; d--) {
            view_.strides[d] = stride;
            stride *= view_.shape[d];
        }
    }
    const Tensor& operator*() const { return wide_ ? **wide_ : view_; }
    void store() const {
        if (wide_) {
            wide_->store();
            return;
        }
        for (i64 r = 0; r < rows_; r++)
            convert(row(r), from_->dtype, buf_.data() + r * inner_, DType::f32,
                    static_cast<size_t>(inner_));
    }

private:
    std::byte* row(i64 r) const {
        return static_cast<std::byte*>(from_->data) + bytes_of(from_->dtype, r * ld_);
    }
    const Tensor* from_;
    std::optional<Wide<D>> wide_;
    i64 inner_ = 1, rows_ = 0, ld_ = 0;
    std::vector<float> buf_;
    Tensor view_;
};

const Backend& f32() {
    return f32_backend;
}

// The entries of a 16-bit backend, named after op_list.h's: Wide copies around the fp32 kernels.
template <DType D>
struct Narrow {
    static constexpr ops::Operands operands{.act = D};  // the other roles: fp32

    static void matmul_forward(const Numerics& nx, const Tensor& out, const Tensor& inp,
                               const Tensor& w, const Tensor* bias) {
        Wide<D> o(&out), i(&inp), ww(&w, true);
        f32().matmul_forward(nx, *o, *i, *ww, bias);
        o.store();
    }

    static void matmul_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                                const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                                const Tensor& w) {
        Wide<D> di(dinp), d(&dout), i(&inp), ww(&w, true);
        f32().matmul_backward(nx, di.get(), dweight, dbias, *d, *i, *ww);
        di.store();
    }

    static void gemm(const Numerics& nx, const Tensor& c, const Tensor& a, const Tensor& b,
                     bool accumulate) {
        Wide<D> aw(&a), bw(&b, true);
        f32().gemm(nx, c, *aw, *bw, accumulate);
    }

    static void layernorm_forward(const Numerics& nx, const Tensor& out, const Tensor& mean,
                                  const Tensor& rstd, const Tensor& inp, const Tensor& w,
                                  const Tensor& b) {
        Wide<D> o(&out), i(&inp);
        f32().layernorm_forward(nx, *o, mean, rstd, *i, w, b);
        o.store();
    }

    static void layernorm_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                                   const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                                   const Tensor& w, const Tensor& mean, const Tensor& rstd) {
        Wide<D> di(dinp), d(&dout), i(&inp);
        f32().layernorm_backward(nx, di.get(), dweight, dbias, *d, *i, w, mean, rstd);
        di.store();
    }

    static void rmsnorm_forward(const Numerics& nx, const Tensor& out, const Tensor& rstd,
                                const Tensor& inp, const Tensor& w, float eps) {
        Wide<D> o(&out), i(&inp);
        f32().rmsnorm_forward(nx, *o, rstd, *i, w, eps);
        o.store();
    }

    static void rmsnorm_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                                 const Tensor& dout, const Tensor& inp, const Tensor& w,
                                 const Tensor& rstd) {
        Wide<D> di(dinp), d(&dout), i(&inp);
        f32().rmsnorm_backward(nx, di.get(), dweight, *d, *i, w, rstd);
        di.store();
    }

    // SwiGLU and rope take column slices (RowsWide); out may alias an input: each is widened
    // apart, and out is rounded back once.
    static void swiglu_forward(const Numerics& nx, const Tensor& out, const Tensor& gate,
                               const Tensor& up) {
        RowsWide<D> o(&out, out.ndim - 1), g(&gate, gate.ndim - 1), u(&up, up.ndim - 1);
        f32().swiglu_forward(nx, *o, *g, *u);
        o.store();
    }

    static void swiglu_backward(const Numerics& nx, const Tensor& dgate, const Tensor& dup,
                                const Tensor& gate, const Tensor& up, const Tensor& dout) {
        RowsWide<D> dg(&dgate, dgate.ndim - 1), du(&dup, dup.ndim - 1), g(&gate, gate.ndim - 1),
            u(&up, up.ndim - 1), d(&dout, dout.ndim - 1);
        f32().swiglu_backward(nx, *dg, *du, *g, *u, *d);
        dg.store();
        du.store();
    }

    // The table is fp32 (role acc) whatever the activations.
    static void rope_table(const Numerics& nx, const Tensor& cos, const Tensor& sin, double theta,
                           const ops::RopeScaling& scaling) {
        f32().rope_table(nx, cos, sin, theta, scaling);
    }

    static void rope_forward(const Numerics& nx, const Tensor& out, const Tensor& inp,
                             const Tensor& cos, const Tensor& sin, const i64* pos) {
        RowsWide<D> o(&out, 2), i(&inp, 2);
        f32().rope_forward(nx, *o, *i, cos, sin, pos);
        o.store();
    }

    static void rope_backward(const Numerics& nx, const Tensor& dinp, const Tensor& dout,
                              const Tensor& cos, const Tensor& sin, const i64* pos) {
        RowsWide<D> di(&dinp, 2), d(&dout, 2);
        f32().rope_backward(nx, *di, *d, cos, sin, pos);
        di.store();
    }

    static void gelu_forward(const Numerics& nx, const Tensor& out, const Tensor& inp) {
        Wide<D> o(&out), i(&inp);
        f32().gelu_forward(nx, *o, *i);
        o.store();
    }

    static void gelu_backward(const Numerics& nx, const Tensor& dinp, const Tensor& inp,
                              const Tensor& dout) {
        Wide<D> di(&dinp), i(&inp), d(&dout);
        f32().gelu_backward(nx, *di, *i, *d);
        di.store();
    }

    // The attention's products (q·k and att·v) are matmuls of activations: both inputs are bf16
    // already, so they need no extra cast.
    static void attention_forward(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                                  const Tensor& att, const Tensor& qkv, i64 NH) {
        Wide<D> o(&out), p(&preatt), a(&att), q(&qkv);
        f32().attention_forward(nx, *o, *p, *a, *q, NH);
        o.store();
        p.store();
        a.store();
    }

    static void attention_backward(const Numerics& nx, const Tensor& dqkv, const Tensor& dpreatt,
                                   const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                                   const Tensor& att, i64 NH) {
        Wide<D> dq(&dqkv), dp(&dpreatt), da(&datt), d(&dout), q(&qkv), a(&att);
        f32().attention_backward(nx, *dq, *dp, *da, *d, *q, *a, NH);
        dq.store();
        dp.store();
        da.store();
    }

    static void residual_forward(const Numerics& nx, const Tensor& out, const Tensor& a,
                                 const Tensor& b) {
        Wide<D> o(&out), aw(&a), bw(&b);
        f32().residual_forward(nx, *o, *aw, *bw);
        o.store();
    }

    static void residual_backward(const Numerics& nx, const Tensor& da, const Tensor& db,
                                  const Tensor& dout) {
        Wide<D> a(&da), b(&db), d(&dout);
        f32().residual_backward(nx, *a, *b, *d);
        a.store();
        b.store();
    }

    static void embedding_forward(const Numerics& nx, const Tensor& out, const int* tokens,
                                  const Tensor& wte, const Tensor& wpe) {
        Wide<D> o(&out);
        f32().embedding_forward(nx, *o, tokens, wte, wpe);
        o.store();
    }

    static void embedding_backward(const Numerics& nx, const Tensor* dwte, const Tensor* dwpe,
                                   const Tensor& dout, const int* tokens, i64 row_lo, i64 row_hi) {
        Wide<D> d(&dout);
        f32().embedding_backward(nx, dwte, dwpe, *d, tokens, row_lo, row_hi);
    }

    static void crossentropy_forward(const Numerics& nx, const Tensor& losses, const Tensor& probs,
                                     const Tensor& logits, const int* targets) {
        Wide<D> p(&probs), l(&logits);
        const bool alias = probs.data == logits.data;
        f32().crossentropy_forward(nx, losses, alias ? *l : *p, *l, targets);
        (alias ? l : p).store();
    }

    static void crossentropy_backward(const Numerics& nx, const Tensor& dlogits,
                                      const Tensor& probs, const int* targets, float dloss) {
        Wide<D> p(&probs);
        const bool alias = probs.data == dlogits.data;
        Wide<D> d(alias ? nullptr : &dlogits);
        f32().crossentropy_backward(nx, alias ? *p : *d, *p, targets, dloss);
        (alias ? p : d).store();
    }

    static void row_max(const Numerics& nx, const Tensor& out, const Tensor& x) {
        Wide<D> w(&x);
        f32().row_max(nx, out, *w);
    }

    static void exp_sub(const Numerics& nx, const Tensor& out, const Tensor& x,
                        const Tensor& shift) {
        Wide<D> o(&out), w(&x);
        f32().exp_sub(nx, *o, *w, shift);
        o.store();
    }

    static void row_sum(const Numerics& nx, const Tensor& out, const Tensor& x) {
        Wide<D> w(&x);
        f32().row_sum(nx, out, *w);
    }

    static std::string matmul_path(const Numerics& nx) {
        return nx.mode == Mode::fast
                   ? "fp32 sgemm on 16-bit values"
                   : std::string("canonical GEMM on 16-bit values, ") + isa_name(nx.isa);
    }
};

// Fast bf16 matmuls (kernels/cpu/matmul_bf16.h) on the path this CPU takes.
const std::uint16_t* bf16_of(const Tensor& t) {
    return static_cast<const std::uint16_t*>(t.data);
}
std::uint16_t* bf16_out(const Tensor* t) {
    return t != nullptr ? static_cast<std::uint16_t*>(t->data) : nullptr;
}

// bf16 in fast mode: Narrow's entries but for the matmuls.
struct FastBf16 : Narrow<DType::bf16> {
    static void matmul_forward(const Numerics& nx, const Tensor& out, const Tensor& inp,
                               const Tensor& w, const Tensor* bias) {
        matmul_forward_bf16(nx, bf16_matmul_info().path, bf16_out(&out), bf16_of(inp), w.f32(),
                            bias != nullptr ? bias->f32() : nullptr, ops::rows(inp),
                            ops::last_dim(inp), w.shape[0]);
    }

    static void matmul_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                                const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                                const Tensor& w) {
        matmul_backward_bf16(nx, bf16_matmul_info().path, bf16_out(dinp),
                             dweight != nullptr ? dweight->f32() : nullptr,
                             dbias != nullptr ? dbias->f32() : nullptr, bf16_of(dout), bf16_of(inp),
                             w.f32(), ops::rows(inp), ops::last_dim(inp), w.shape[0]);
    }

    static std::string matmul_path(const Numerics&) { return bf16_matmul_info().text; }
};

}  // namespace

constinit const ops::Backend bf16_backend =
    ops::backend_from<Narrow<DType::bf16>>("cpu bf16 (fp32 compute)");
constinit const ops::Backend f16_backend =
    ops::backend_from<Narrow<DType::f16>>("cpu fp16 (fp32 compute)");
constinit const ops::Backend bf16_fast_backend =
    ops::backend_from<FastBf16>("cpu bf16 fast (oneDNN bf16 or sgemm)");

}  // namespace px::cpu
