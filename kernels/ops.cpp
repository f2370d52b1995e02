#include "kernels/ops.h"

#include "core/base/error.h"
#include "core/base/mathfun.h"
#include "kernels/backend.h"
#include "kernels/cpu/casts.h"
#include "kernels/cpu/cpu_kernels.h"

#include <cmath>
#include <initializer_list>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace px::ops {

namespace {

constexpr const char* kOpNames[] = {
#define PX_OP(op, acts) #op,
#include "kernels/op_list.h"
};
static_assert(sizeof(kOpNames) / sizeof(kOpNames[0]) == static_cast<size_t>(Op::kCount),
              "kOpNames must match Op");

// Each entry has the signature of the public function of its name (ops.h), so that a wrapper
// hands its arguments on unchanged. A static_cast to the entry's type picks that overload, and
// does not compile when there is none.
#define PX_ENTRY(op, entry, ret, params) \
    static_assert(std::is_same_v<decltype(static_cast<ret(*) params>(&ops::entry)), ret(*) params>);
#include "kernels/op_list.h"

enum class Layout : std::uint8_t {
    contiguous,  // every operand
    rows,        // operands' last dimension has stride 1; rows may be apart (a column slice)
    any,         // any strides (the gemm operands; the kernel reads strides)
};

const char* device_name(Device d) {
    return d == Device::cpu ? "cpu" : "cuda";
}

[[noreturn]] void no_backend(const Numerics& nx, Op op, const Tensor& key) {
    throw Error(std::string("op ") + op_name(op) + " has no kernel for " + dtype_name(key.dtype) +
                " activations (tensor '" + key.name + "') on " + device_name(key.device) +
                " in " + mode_name(nx.mode) +
                " mode; use precision fp32 or a backend that supports it");
}

[[noreturn]] void wrong_operand(Op op, const Backend& b, Role role, const Tensor& t) {
    throw Error(std::string("op ") + op_name(op) + ": tensor '" + t.name + "' (" +
                role_name(role) + ") is " + dtype_name(t.dtype) + " on " +
                device_name(t.device) + ", but backend '" + b.name + "' takes " +
                dtype_name(b.operands.of(role)) + " " + role_name(role) + "s on " +
                device_name(t.device) + "; allocate it as the backend's Operands say");
}

// One operand of an op and the part it plays (null: an optional output not computed).
struct Arg {
    Role role;
    const Tensor* t;
};
constexpr Role A = Role::act, W = Role::weight, G = Role::grad, S = Role::acc, M = Role::master;

// The backend for op: the one registered for the device and dtype of its first activation (of
// its first operand when it has none) in nx's mode. Every operand must have that device and the
// dtype the backend gives its role.
const Backend& dispatch(const Numerics& nx, Op op, std::initializer_list<Arg> operands,
                        Layout layout = Layout::contiguous) {
    const Tensor* key = nullptr;
    for (const Arg& a : operands)
        if (a.t != nullptr && (a.role == Role::act || key == nullptr)) {
            key = a.t;
            if (a.role == Role::act) break;
        }
    PX_ASSERT(key != nullptr, std::string("op ") + op_name(op) + " without operands");
    const Backend* b = find_backend(key->device, key->dtype, nx.mode);
    if (b == nullptr || !b->has(op)) no_backend(nx, op, *key);
    for (const Arg& a : operands) {
        const Tensor* t = a.t;
        if (t == nullptr) continue;
        if (t->device != key->device || t->dtype != b->operands.of(a.role))
            wrong_operand(op, *b, a.role, *t);
        if (layout == Layout::contiguous)
            PX_ASSERT(t->contiguous(), std::string("operand '") + t->name + "' must be contiguous");
        if (layout == Layout::rows)
            PX_ASSERT(t->ndim >= 1 && (last_dim(*t) <= 1 || t->strides[t->ndim - 1] == 1),
                      std::string("operand '") + t->name + "' must have contiguous rows");
    }
    return *b;
}

// t's rows, for an op whose operands may be column slices: its first `lead` dimensions make the
// rows, the others are contiguous within a row, and the rows are one stride apart (row_stride,
// backend.h) without overlapping.
void check_rows(Op op, const Tensor& t, int lead) {
    bool ok = t.ndim >= lead;
    i64 inner = 1;
    for (int d = t.ndim - 1; ok && d >= lead; d--) {
        ok = t.shape[d] <= 1 || t.strides[d] == inner;
        inner *= t.shape[d];
    }
    const i64 ld = row_stride(t, lead);
    i64 span = ld, n = 1;
    for (int d = lead - 1; ok && d >= 0; d--) {
        ok = t.shape[d] <= 1 || t.strides[d] == span;
        span *= t.shape[d];
        n *= t.shape[d];
    }
    PX_ASSERT(ok && (n <= 1 || ld >= inner),
              std::string("op ") + op_name(op) + ": operand '" + t.name +
                  "' must hold each row contiguous, the rows one stride apart");
}

// Entry `entry` of the backend for its op, once the operands are checked (dispatch). The wrapper
// checks its shapes, then calls it.
template <class Fn>
Fn kernel(const Numerics& nx, Fn Backend::*entry, std::initializer_list<Arg> operands,
          Layout layout = Layout::contiguous) {
    return dispatch(nx, op_of(entry), operands, layout).*entry;
}

}  // namespace

const char* op_name(Op op) { return kOpNames[static_cast<int>(op)]; }

bool supports(Op op, Device device, DType dtype, Mode mode) {
    const Backend* b = find_backend(device, dtype, mode);
    return b != nullptr && b->has(op);
}

void matmul_forward(const Numerics& nx, const Tensor& out, const Tensor& inp, const Tensor& weight,
                    const Tensor* bias) {
    const auto run =
        kernel(nx, &Backend::matmul_forward, {{A, &out}, {A, &inp}, {W, &weight}, {W, bias}});
    const i64 C = last_dim(inp), BT = rows(inp), OC = weight.shape[0];
    PX_ASSERT(weight.shape[1] == C && rows(out) == BT && last_dim(out) == OC, "matmul shapes");
    run(nx, out, inp, weight, bias);
}

void matmul_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                     const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                     const Tensor& weight) {
    const auto run = kernel(nx, &Backend::matmul_backward,
                            {{A, &dout}, {A, &inp}, {W, &weight}, {A, dinp}, {G, dweight},
                             {G, dbias}});
    const i64 BT = rows(inp), OC = weight.shape[0];
    PX_ASSERT(rows(dout) == BT && last_dim(dout) == OC, "matmul_backward shapes");
    run(nx, dinp, dweight, dbias, dout, inp, weight);
}

void gemm(const Numerics& nx, const Tensor& c, const Tensor& a, const Tensor& b, bool accumulate) {
    const auto run = kernel(nx, &Backend::gemm, {{S, &c}, {A, &a}, {W, &b}}, Layout::any);
    PX_ASSERT(a.ndim == 2 && b.ndim == 2 && c.ndim == 2 && a.shape[1] == b.shape[0] &&
                  c.shape[0] == a.shape[0] && c.shape[1] == b.shape[1],
              "gemm shapes");
    PX_ASSERT(c.shape[1] <= 1 || c.strides[1] == 1, "gemm: the rows of c must be contiguous");
    run(nx, c, a, b, accumulate);
}

void layernorm_forward(const Numerics& nx, const Tensor& out, const Tensor& mean,
                       const Tensor& rstd, const Tensor& inp, const Tensor& weight,
                       const Tensor& bias) {
    const auto run = kernel(nx, &Backend::layernorm_forward,
                            {{A, &out}, {S, &mean}, {S, &rstd}, {A, &inp}, {W, &weight},
                             {W, &bias}});
    const i64 C = last_dim(inp), BT = rows(inp);
    PX_ASSERT(weight.numel() == C && mean.numel() == BT, "layernorm shapes");
    run(nx, out, mean, rstd, inp, weight, bias);
}

void layernorm_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                        const Tensor* dbias, const Tensor& dout, const Tensor& inp,
                        const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
    kernel(nx, &Backend::layernorm_backward,
           {{A, &dout}, {A, &inp}, {W, &weight}, {S, &mean}, {S, &rstd}, {A, dinp}, {G, dweight},
            {G, dbias}})(nx, dinp, dweight, dbias, dout, inp, weight, mean, rstd);
}

void rmsnorm_forward(const Numerics& nx, const Tensor& out, const Tensor& rstd, const Tensor& inp,
                     const Tensor& weight, float eps) {
    const auto run =
        kernel(nx, &Backend::rmsnorm_forward, {{A, &out}, {S, &rstd}, {A, &inp}, {W, &weight}});
    const i64 C = last_dim(inp), BT = rows(inp);
    PX_ASSERT(weight.numel() == C && rstd.numel() == BT && out.numel() == inp.numel(),
              "rmsnorm shapes");
    PX_ASSERT(eps >= 0.0f && std::isfinite(eps), "rmsnorm: eps must be finite and not negative");
    run(nx, out, rstd, inp, weight, eps);
}

void rmsnorm_backward(const Numerics& nx, const Tensor* dinp, const Tensor* dweight,
                      const Tensor& dout, const Tensor& inp, const Tensor& weight,
                      const Tensor& rstd) {
    const auto run =
        kernel(nx, &Backend::rmsnorm_backward,
               {{A, &dout}, {A, &inp}, {W, &weight}, {S, &rstd}, {A, dinp}, {G, dweight}});
    const i64 C = last_dim(inp), BT = rows(inp);
    PX_ASSERT(weight.numel() == C && rstd.numel() == BT && dout.numel() == inp.numel() &&
                  (dinp == nullptr || dinp->numel() == inp.numel()) &&
                  (dweight == nullptr || dweight->numel() == C),
              "rmsnorm_backward shapes");
    run(nx, dinp, dweight, dout, inp, weight, rstd);
}

void gelu_forward(const Numerics& nx, const Tensor& out, const Tensor& inp) {
    const auto run = kernel(nx, &Backend::gelu_forward, {{A, &out}, {A, &inp}});
    PX_ASSERT(out.numel() == inp.numel(), "gelu shapes");
    run(nx, out, inp);
}

void gelu_backward(const Numerics& nx, const Tensor& dinp, const Tensor& inp, const Tensor& dout) {
    kernel(nx, &Backend::gelu_backward, {{A, &dinp}, {A, &inp}, {A, &dout}})(nx, dinp, inp, dout);
}

namespace {

// swiglu's operands: (BT,F) rows each, gate's and up's one stride apart (the halves of one
// (BT,2F) tensor, or two tensors of one shape).
void check_swiglu(const Tensor& gate, const Tensor& up, std::initializer_list<const Tensor*> same) {
    const i64 F = last_dim(gate), BT = rows(gate);
    for (const Tensor* t : {&gate, &up}) check_rows(Op::swiglu, *t, t->ndim - 1);
    for (const Tensor* t : same) {
        check_rows(Op::swiglu, *t, t->ndim - 1);
        PX_ASSERT(last_dim(*t) == F && rows(*t) == BT,
                  std::string("swiglu: operand '") + t->name + "' is not (BT,F) as gate");
    }
    PX_ASSERT(last_dim(up) == F && rows(up) == BT &&
                  row_stride(gate, gate.ndim - 1) == row_stride(up, up.ndim - 1),
              std::string("swiglu: gate '") + gate.name + "' and up '" + up.name +
                  "' must have one shape (BT,F) and one row stride");
}

}  // namespace

void swiglu_forward(const Numerics& nx, const Tensor& out, const Tensor& gate, const Tensor& up) {
    const auto run =
        kernel(nx, &Backend::swiglu_forward, {{A, &out}, {A, &gate}, {A, &up}}, Layout::rows);
    check_swiglu(gate, up, {&out});
    run(nx, out, gate, up);
}

void swiglu_backward(const Numerics& nx, const Tensor& dgate, const Tensor& dup, const Tensor& gate,
                     const Tensor& up, const Tensor& dout) {
    const auto run =
        kernel(nx, &Backend::swiglu_backward,
               {{A, &dgate}, {A, &dup}, {A, &gate}, {A, &up}, {A, &dout}}, Layout::rows);
    check_swiglu(gate, up, {&dout});
    check_swiglu(dgate, dup, {&gate});
    run(nx, dgate, dup, gate, up, dout);
}

std::vector<float> rope_inv_freq(i64 HS, double theta, const RopeScaling& scaling) {
    if (HS <= 0 || HS % 2 != 0)
        throw Error("rope: the head size " + std::to_string(HS) +
                    " is not even; rotary embeddings turn pairs of channels");
    if (!(theta > 0.0) || !std::isfinite(theta))
        throw Error("rope: theta " + std::to_string(theta) + " is not a positive finite number");
    const RopeScaling& s = scaling;
    if (s.factor != 0.0 &&
        !(s.factor > 0.0 && s.low_freq_factor > 0.0 && s.high_freq_factor > s.low_freq_factor &&
          s.original_max_position_embeddings > 0.0 && std::isfinite(s.factor) &&
          std::isfinite(s.high_freq_factor) && std::isfinite(s.original_max_position_embeddings)))
        throw Error(
            "rope: Llama 3.1 scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor "
            "and original_max_position_embeddings > 0 (factor 0: no scaling)");
    std::vector<float> inv(static_cast<size_t>(HS / 2));
    cpu::rope_inv_freq(inv.data(), HS, theta, s.factor, s.low_freq_factor, s.high_freq_factor,
                       s.original_max_position_embeddings);
    return inv;
}

void rope_table(const Numerics& nx, const Tensor& cos, const Tensor& sin, double theta,
                const RopeScaling& scaling) {
    const auto run = kernel(nx, &Backend::rope_table, {{S, &cos}, {S, &sin}});
    PX_ASSERT(cos.ndim == 2 && sin.ndim == 2 && cos.shape == sin.shape,
              "rope_table: cos and sin must both be (maxT, HS/2)");
    const i64 maxT = cos.shape[0];
    for (float f : rope_inv_freq(2 * cos.shape[1], theta, scaling))
        if (maxT > 0 && !(float(maxT - 1) * f <= mathfun::kTrigMax))
            throw Error("rope_table: position " + std::to_string(maxT - 1) + " × frequency " +
                        std::to_string(f) +
                        " leaves sin/cos's domain |x| <= 2^20; use fewer positions");
    run(nx, cos, sin, theta, scaling);
}

namespace {

// rope's operands: x (B,T,NH,HS) with each token's NH·HS channels contiguous, tokens one stride
// apart; the table's cos and sin (maxT, HS/2), contiguous.
void check_rope(const Tensor& x, const Tensor& other, const Tensor& cos, const Tensor& sin) {
    PX_ASSERT(x.ndim == 4 && other.ndim == 4 && x.shape == other.shape,
              std::string("rope: '") + x.name + "' and '" + other.name + "' must be (B,T,NH,HS)");
    check_rows(Op::rope, x, 2);
    check_rows(Op::rope, other, 2);
    const i64 HS = x.shape[3];
    if (HS % 2 != 0)
        throw Error("rope: the head size " + std::to_string(HS) +
                    " is not even; rotary embeddings turn pairs of channels");
    PX_ASSERT(cos.ndim == 2 && sin.ndim == 2 && cos.shape == sin.shape && cos.contiguous() &&
                  sin.contiguous() && cos.shape[1] == HS / 2,
              "rope: the table's cos and sin must be contiguous (maxT, HS/2)");
}

}  // namespace

void rope_forward(const Numerics& nx, const Tensor& out, const Tensor& inp, const Tensor& cos,
                  const Tensor& sin, const i64* pos) {
    const auto run = kernel(nx, &Backend::rope_forward,
                            {{A, &out}, {A, &inp}, {S, &cos}, {S, &sin}}, Layout::rows);
    check_rope(inp, out, cos, sin);
    run(nx, out, inp, cos, sin, pos);
}

void rope_backward(const Numerics& nx, const Tensor& dinp, const Tensor& dout, const Tensor& cos,
                   const Tensor& sin, const i64* pos) {
    const auto run = kernel(nx, &Backend::rope_backward,
                            {{A, &dinp}, {A, &dout}, {S, &cos}, {S, &sin}}, Layout::rows);
    check_rope(dout, dinp, cos, sin);
    run(nx, dinp, dout, cos, sin, pos);
}

void attention_forward(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                       const Tensor& att, const Tensor& qkv, i64 NH) {
    const auto run =
        kernel(nx, &Backend::attention_forward, {{A, &out}, {A, &preatt}, {A, &att}, {A, &qkv}});
    const i64 B = qkv.shape[0], T = qkv.shape[1];
    PX_ASSERT(att.numel() == B * NH * T * T && preatt.numel() >= att.numel(), "attention shapes");
    run(nx, out, preatt, att, qkv, NH);
}

void attention_backward(const Numerics& nx, const Tensor& dqkv, const Tensor& dpreatt,
                        const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                        const Tensor& att, i64 NH) {
    kernel(nx, &Backend::attention_backward,
           {{A, &dqkv}, {A, &dpreatt}, {A, &datt}, {A, &dout}, {A, &qkv}, {A, &att}})(
        nx, dqkv, dpreatt, datt, dout, qkv, att, NH);
}

void attention_queries_scores(const Numerics& nx, const Tensor& preatt, const Tensor& q,
                              const Tensor& kv, const i64* pos, i64 key_lo, i64 key_hi, i64 NH) {
    const auto run =
        kernel(nx, &Backend::attention_queries_scores, {{A, &preatt}, {A, &q}, {A, &kv}});
    const i64 B = q.shape[0], Tq = q.shape[1], T = kv.shape[1];
    PX_ASSERT(kv.shape[0] == B && kv.shape[2] == q.shape[2] && preatt.numel() >= B * NH * Tq * T &&
                  0 <= key_lo && key_lo <= key_hi && key_hi <= T,
              "attention_queries shapes");
    run(nx, preatt, q, kv, pos, key_lo, key_hi, NH);
}

void attention_queries_softmax(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                               const Tensor& att, const Tensor& kv, const i64* pos, i64 NH) {
    const auto run = kernel(nx, &Backend::attention_queries_softmax,
                            {{A, &out}, {A, &preatt}, {A, &att}, {A, &kv}});
    const i64 B = kv.shape[0], T = kv.shape[1], C = kv.shape[2] / 3;
    PX_ASSERT(B > 0 && C > 0 && out.numel() % (B * C) == 0 &&
                  att.numel() == B * NH * (out.numel() / (B * C)) * T &&
                  preatt.numel() >= att.numel(),
              "attention_queries shapes");
    run(nx, out, preatt, att, kv, pos, NH);
}

void attention_queries_backward(const Numerics& nx, const Tensor& dq, const Tensor& parts,
                                const Tensor& dpreatt, const Tensor& datt, const Tensor& dout,
                                const Tensor& q, const Tensor& kv, const Tensor& att,
                                const i64* pos, const i64* node_lo, const i64* node_hi, i64 K,
                                i64 NH) {
    const auto run = kernel(nx, &Backend::attention_queries_backward,
                            {{A, &dq}, {A, &parts}, {A, &dpreatt}, {A, &datt}, {A, &dout},
                             {A, &q}, {A, &kv}, {A, &att}});
    const i64 B = q.shape[0], T = kv.shape[1], C = q.shape[2] / 3;
    PX_ASSERT(dq.numel() == q.numel() && parts.numel() >= B * T * C * K * 2 &&
                  datt.numel() >= att.numel() && dpreatt.numel() >= att.numel(),
              "attention_queries shapes");
    run(nx, dq, parts, dpreatt, datt, dout, q, kv, att, pos, node_lo, node_hi, K, NH);
}

void residual_forward(const Numerics& nx, const Tensor& out, const Tensor& a, const Tensor& b) {
    const auto run = kernel(nx, &Backend::residual_forward, {{A, &out}, {A, &a}, {A, &b}});
    PX_ASSERT(a.numel() == b.numel() && out.numel() == a.numel(), "residual shapes");
    run(nx, out, a, b);
}

void residual_backward(const Numerics& nx, const Tensor& da, const Tensor& db, const Tensor& dout) {
    kernel(nx, &Backend::residual_backward, {{A, &da}, {A, &db}, {A, &dout}})(nx, da, db, dout);
}

void embedding_forward(const Numerics& nx, const Tensor& out, const int* tokens, const Tensor& wte,
                       const Tensor& wpe) {
    const auto run = kernel(nx, &Backend::embedding_forward, {{A, &out}, {W, &wte}, {W, &wpe}});
    const i64 T = out.shape[1], C = out.shape[2];
    PX_ASSERT((wpe.data == nullptr || wpe.shape[0] >= T) && wte.shape[1] == C, "embedding shapes");
    run(nx, out, tokens, wte, wpe);
}

void embedding_backward(const Numerics& nx, const Tensor* dwte, const Tensor* dwpe,
                        const Tensor& dout, const int* tokens, i64 row_lo, i64 row_hi) {
    const i64 BT = dout.ndim >= 2 ? dout.shape[0] * dout.shape[1] : 0;
    if (row_hi < 0) row_hi = BT;
    PX_ASSERT(0 <= row_lo && row_lo <= row_hi && row_hi <= BT,
              "embedding_backward: rows [" + std::to_string(row_lo) + ", " +
                  std::to_string(row_hi) + ") outside the " + std::to_string(BT) + " tokens");
    kernel(nx, &Backend::embedding_backward, {{A, &dout}, {G, dwte}, {G, dwpe}})(
        nx, dwte, dwpe, dout, tokens, row_lo, row_hi);
}

void crossentropy_forward(const Numerics& nx, const Tensor& losses, const Tensor& probs,
                          const Tensor& logits, const int* targets) {
    const auto run =
        kernel(nx, &Backend::crossentropy_forward, {{S, &losses}, {A, &probs}, {A, &logits}});
    PX_ASSERT(losses.numel() == rows(logits), "crossentropy shapes");
    run(nx, losses, probs, logits, targets);
}

void crossentropy_backward(const Numerics& nx, const Tensor& dlogits, const Tensor& probs,
                           const int* targets, float dloss) {
    kernel(nx, &Backend::crossentropy_backward, {{A, &dlogits}, {A, &probs}})(nx, dlogits, probs,
                                                                              targets, dloss);
}

void row_max(const Numerics& nx, const Tensor& out, const Tensor& x) {
    const auto run = kernel(nx, &Backend::row_max, {{S, &out}, {A, &x}});
    PX_ASSERT(x.ndim == 2 && out.numel() == x.shape[0], "row_max shapes");
    run(nx, out, x);
}

void exp_sub(const Numerics& nx, const Tensor& out, const Tensor& x, const Tensor& shift) {
    const auto run = kernel(nx, &Backend::exp_sub, {{A, &out}, {A, &x}, {S, &shift}});
    PX_ASSERT(x.ndim == 2 && out.numel() == x.numel() && shift.numel() == x.shape[0],
              "exp_sub shapes");
    run(nx, out, x, shift);
}

void row_sum(const Numerics& nx, const Tensor& out, const Tensor& x) {
    const auto run = kernel(nx, &Backend::row_sum, {{S, &out}, {A, &x}}, Layout::rows);
    PX_ASSERT(x.ndim == 2 && out.ndim == 1 && out.shape[0] == x.shape[0], "row_sum shapes");
    run(nx, out, x);
}

void adamw_update(const Numerics& nx, const Tensor& param, const Tensor& m, const Tensor& v,
                  const Tensor& grad, const AdamWStep& s) {
    const auto run =
        kernel(nx, &Backend::adamw_update, {{M, &param}, {M, &m}, {M, &v}, {G, &grad}});
    PX_ASSERT(
        m.numel() == param.numel() && v.numel() == param.numel() && grad.numel() == param.numel(),
        "adamw shapes");
    run(nx, param, m, v, grad, s);
}

float sum_squares(const Numerics& nx, const Tensor& x) {
    return kernel(nx, &Backend::sum_squares, {{G, &x}})(nx, x);
}

void sum_squares_blocks(const Numerics& nx, const Tensor& part, const Tensor& x) {
    const auto run = kernel(nx, &Backend::sum_squares_blocks, {{S, &part}, {G, &x}});
    PX_ASSERT(part.numel() == num_blocks(x.numel(), nx.block), "sum_squares_blocks shapes");
    run(nx, part, x);
}

void warm_up_matmul(const Numerics& nx) {
    if (nx.mode != Mode::fast) return;
    static std::once_flag done;
    std::call_once(done, [&] {
        const i64 M = 256, K = 768;  // a GPT-2 small linear's shape class
        std::vector<float> x(M * K, 0.5f), w(K * K, 0.25f), y(M * K), dx(M * K), dw(K * K), db(K);
        const Tensor inp = view_f32(x.data(), {M, K}), weight = view_f32(w.data(), {K, K});
        const Tensor out = view_f32(y.data(), {M, K}), dinp = view_f32(dx.data(), {M, K});
        const Tensor dweight = view_f32(dw.data(), {K, K}), dbias = view_f32(db.data(), {K});
        matmul_forward(nx, out, inp, weight, nullptr);
        matmul_backward(nx, &dinp, &dweight, &dbias, out, inp, weight);
    });
}

std::string matmul_path(const Numerics& nx, Device device, DType dtype) {
    const Backend* b = find_backend(device, dtype, nx.mode);
    return b != nullptr && b->matmul_path != nullptr ? b->matmul_path(nx) : std::string();
}

namespace {

// src's values as fp32 in dst (exact).
void widen_into(const Numerics& nx, float* dst, const Tensor& src) {
    PX_ASSERT(src.contiguous(), std::string("fp8 cast of a strided tensor '") + src.name + "'");
    PX_ASSERT(src.device == Device::cpu, std::string("fp8 cast of '") + src.name + "' off the CPU");
    const i64 n = src.numel();
    if (src.dtype == DType::bf16)
        cpu::widen_bf16(nx.isa, dst, static_cast<const std::uint16_t*>(src.data), n);
    else
        convert(dst, DType::f32, src.data, src.dtype, static_cast<size_t>(n));
}

}  // namespace

float fake_quant(const Numerics& nx, float* dst, const Tensor& src, DType t, float scale, float inv,
                 bool* nan) {
    widen_into(nx, dst, src);
    return cpu::fake_quant(nx.isa, dst, src.numel(), t, scale, inv, nan);
}

void fake_quant_tiles(const Numerics& nx, float* dst, const Tensor& src, i64 band, i64 b) {
    widen_into(nx, dst, src);
    const i64 n = src.numel(), K = src.ndim > 0 ? last_dim(src) : 0;
    cpu::fake_quant_tiles(nx.isa, dst, K > 0 ? n / K : 0, K, band, b);
}

}  // namespace px::ops
