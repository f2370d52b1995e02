// The op table of the gradient check: every op, once. An op is a struct with
//   op         the op of kernels/ops.h it checks, whose name (op_name) the table and reports use
//   draw       its inputs, R, output buffers and gradients' prior contents for one shape
//   forward    the fp64 / EB reference forward (gradcheck_math.h) on an Io
//   backward   the reference backward (absent: the op has no backward and is checked by value)
//   kernel     the kernel under test, through kernels/ops.h, on views of an Io's fp32 buffers
// and a line in op_table() with its test shapes. make_problem turns it into an OpProblem: the
// kernel run, the EB reference and the fp64 loss of the finite differences.
#include "core/base/error.h"
#include "kernels/ops.h"
#include "validators/gradcheck.h"
#include "validators/gradcheck_math.h"

#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace px::gradcheck {

namespace {

// What an op draws for one shape.
struct Draw {
    std::vector<Vec> in;   // the inputs
    Vec dout;              // R, the d-output the backward is given (empty: no backward)
    Named out;             // the forward's outputs, sized; the loss is Σ out[0]·R
    Named grad;            // the backward's gradients of in[0], in[1], ... as they were before
    Named scratch;         // other outputs of the backward (assigned), after the gradients
    std::vector<int> ids;  // token ids (embedding) or targets (crossentropy)
};

// The buffers of one run, in fp32 (the kernel), double (the loss) or EB (the reference).
template <class T>
struct Io {
    const OpShape& s;
    const std::vector<int>& ids;
    std::vector<std::vector<T>> in;    // Draw::in
    std::vector<T> dout;               // Draw::dout
    std::vector<std::vector<T>> out;   // Draw::out
    std::vector<std::vector<T>> grad;  // Draw::grad, then Draw::scratch
};

template <class T>
Io<T> start(const Draw& d, const OpShape& s) {
    Io<T> io{s, d.ids, {}, lift<T>(d.dout), {}, {}};
    for (const Vec& v : d.in) io.in.push_back(lift<T>(v));
    for (const auto& [name, v] : d.out) io.out.push_back(lift<T>(v));
    for (const Named* n : {&d.grad, &d.scratch})
        for (const auto& [name, v] : *n) io.grad.push_back(lift<T>(v));
    return io;
}

// The outputs of a run under their names: the forward's, then the backward's.
template <class T>
std::vector<std::pair<std::string, std::vector<T>>> named(const Draw& d, Io<T>& io) {
    std::vector<std::pair<std::string, std::vector<T>>> r;
    for (size_t k = 0; k < d.out.size(); k++) r.emplace_back(d.out[k].first, std::move(io.out[k]));
    size_t k = 0;
    for (const Named* n : {&d.grad, &d.scratch})
        for (const auto& [name, v] : *n) r.emplace_back(name, std::move(io.grad[k++]));
    return r;
}

// Σ out·R, and Σ|out·R|.
std::pair<double, double> weighted(const std::vector<double>& out, const Vec& R) {
    double s = 0, a = 0;
    for (size_t i = 0; i < out.size(); i++) {
        s += out[i] * R[i];
        a += std::fabs(out[i] * R[i]);
    }
    return {s, a};
}

template <class Op>
constexpr bool kHasBackward = requires(Io<EB>& io) {
    Op::backward(io);
};

template <class Op>
OpProblem make_problem(const OpShape& s) {
    Draw d = Op::draw(s);
    OpProblem p;
    p.op = ops::op_name(Op::op);
    p.label = describe(p.op, s);
    p.shape = s;
    p.block = s.block;
    p.in = d.in;
    if (!d.dout.empty()) p.in.push_back(d.dout);
    p.ids = d.ids;
    for (size_t k = 0; k < d.grad.size(); k++) {
        p.diff.push_back(static_cast<int>(k));
        p.grad_name.push_back(d.grad[k].first);
        p.grad_init.push_back(d.grad[k].second);
    }
    const auto data = std::make_shared<const Draw>(std::move(d));  // shared by the closures
    p.run = [data, s](const Numerics& nx) {
        Io<float> io = start<float>(*data, s);
        Op::kernel(nx, io);
        return named(*data, io);
    };
    p.ref = [data, s](Order o) {
        const OrderScope scope(o);
        Io<EB> io = start<EB>(*data, s);
        Op::forward(io);
        if constexpr (kHasBackward<Op>) Op::backward(io);
        return named(*data, io);
    };
    if constexpr (kHasBackward<Op>)
        p.loss = [data, s](const Inputs64& x) {
            const auto n = static_cast<std::ptrdiff_t>(data->in.size());
            Io<double> io{s, data->ids, {x.begin(), x.begin() + n}, {}, {}, {}};
            io.out.resize(data->out.size());  // the references size their outputs
            Op::forward(io);
            return weighted(io.out[0], data->dout);
        };
    return p;
}

// A tensor over one of a run's buffers, for ops::.
Tensor view(std::vector<float>& v, std::initializer_list<i64> shape) {
    Tensor t = view_f32(v.data(), shape);
    PX_ASSERT(t.numel() == static_cast<i64>(v.size()),
              "gradcheck: a view's shape is not its buffer's");
    return t;
}

// ---- the ops -----------------------------------------------------------------------------------

// out (BT,C), mean (BT), rstd (BT) = layernorm(inp (BT,C), weight (C), bias (C))
struct Layernorm {
    static constexpr ops::Op op = ops::Op::layernorm;
    static Draw draw(const OpShape& s) {
        const i64 BT = s.B * s.T, C = s.C;
        Rng r(11 + BT * 7 + C);
        Vec x = randv(r, BT * C, -2.0f, 2.0f);
        for (i64 t = 0; t < BT; t++)  // offsets per row, so the mean matters
            for (i64 i = 0; i < C; i++) x[t * C + i] += float(t % 5) - 2.0f;
        Draw d;
        d.in = {x, randv(r, C, 0.5f, 1.5f), randv(r, C)};
        d.dout = randv(r, BT * C);
        d.out = {{"out", Vec(BT * C)}, {"mean", Vec(BT)}, {"rstd", Vec(BT)}};
        d.grad = {{"dinp", randv(r, BT * C)}, {"dweight", randv(r, C)}, {"dbias", randv(r, C)}};
        return d;
    }
    template <class T>
    static void forward(Io<T>& io) {
        layernorm_fwd_ref(io.out[0], io.out[1], io.out[2], io.in[0], io.in[1], io.in[2],
                          io.s.B * io.s.T, io.s.C, io.s.block);
    }
    template <class T>
    static void backward(Io<T>& io) {
        layernorm_bwd_ref(io.grad[0], io.grad[1], io.grad[2], io.dout, io.in[0], io.in[1],
                          io.out[1], io.out[2], io.s.B * io.s.T, io.s.C, io.s.block);
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        const i64 BT = io.s.B * io.s.T, C = io.s.C;
        const Tensor inp = view(io.in[0], {BT, C}), weight = view(io.in[1], {C}),
                     mean = view(io.out[1], {BT}), rstd = view(io.out[2], {BT});
        ops::layernorm_forward(nx, view(io.out[0], {BT, C}), mean, rstd, inp, weight,
                               view(io.in[2], {C}));
        ops::layernorm_backward(nx, view(io.grad[0], {BT, C}), view(io.grad[1], {C}),
                                view(io.grad[2], {C}), view(io.dout, {BT, C}), inp, weight, mean,
                                rstd);
    }
};

// out (BT,C), rstd (BT) = rmsnorm(inp (BT,C), weight (C)), eps kRmsEps
struct Rmsnorm {
    static constexpr ops::Op op = ops::Op::rmsnorm;
    static Draw draw(const OpShape& s) {
        const i64 BT = s.B * s.T, C = s.C;
        Rng r(13 + BT * 7 + C);
        Vec x = randv(r, BT * C, -2.0f, 2.0f);
        for (i64 t = 0; t < BT; t++)  // rows of different scales, so rstd matters
            for (i64 i = 0; i < C; i++) x[t * C + i] *= 0.25f + float(t % 5);
        Draw d;
        d.in = {x, randv(r, C, 0.5f, 1.5f)};
        d.dout = randv(r, BT * C);
        d.out = {{"out", Vec(BT * C)}, {"rstd", Vec(BT)}};
        d.grad = {{"dinp", randv(r, BT * C)}, {"dweight", randv(r, C)}};
        return d;
    }
    template <class T>
    static void forward(Io<T>& io) {
        rmsnorm_fwd_ref(io.out[0], io.out[1], io.in[0], io.in[1], io.s.B * io.s.T, io.s.C, kRmsEps,
                        io.s.block);
    }
    template <class T>
    static void backward(Io<T>& io) {
        rmsnorm_bwd_ref(io.grad[0], io.grad[1], io.dout, io.in[0], io.in[1], io.out[1],
                        io.s.B * io.s.T, io.s.C, io.s.block);
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        const i64 BT = io.s.B * io.s.T, C = io.s.C;
        const Tensor inp = view(io.in[0], {BT, C}), weight = view(io.in[1], {C}),
                     rstd = view(io.out[1], {BT});
        ops::rmsnorm_forward(nx, view(io.out[0], {BT, C}), rstd, inp, weight, kRmsEps);
        ops::rmsnorm_backward(nx, view(io.grad[0], {BT, C}), view(io.grad[1], {C}),
                              view(io.dout, {BT, C}), inp, weight, rstd);
    }
};

// out (BT,F) = silu(gate (BT,F))·up (BT,F); the shape's C is F
struct Swiglu {
    static constexpr ops::Op op = ops::Op::swiglu;
    static Draw draw(const OpShape& s) {
        const i64 N = s.B * s.T * s.C;
        Rng r(29 + N);
        Vec g = randv(r, N, -8.0f, 8.0f);
        if (N > 8) {  // zero, tiny, and both tails of the sigmoid
            g[0] = 0.0f;
            g[1] = -1e-30f;
            g[2] = 30.0f;
            g[3] = -30.0f;
        }
        Draw d;
        d.in = {g, randv(r, N, -2.0f, 2.0f)};
        d.dout = randv(r, N);
        d.out = {{"out", Vec(N)}};
        d.grad = {{"dgate", randv(r, N)}, {"dup", randv(r, N)}};
        return d;
    }
    template <class T>
    static void forward(Io<T>& io) {
        swiglu_fwd_ref(io.out[0], io.in[0], io.in[1]);
    }
    template <class T>
    static void backward(Io<T>& io) {
        swiglu_bwd_ref(io.grad[0], io.grad[1], io.in[0], io.in[1], io.dout);
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        const i64 BT = io.s.B * io.s.T, F = io.s.C;
        const Tensor gate = view(io.in[0], {BT, F}), up = view(io.in[1], {BT, F});
        ops::swiglu_forward(nx, view(io.out[0], {BT, F}), gate, up);
        ops::swiglu_backward(nx, view(io.grad[0], {BT, F}), view(io.grad[1], {BT, F}), gate, up,
                             view(io.dout, {BT, F}));
    }
};

// out (B,T,NH,HS) = rope(inp), HS = C/NH, at positions ids (T, ascending, not 0..T-1: a
// context-parallel rank's) of a table of V rows from ops::rope_table (theta kRopeTheta), whose
// cos and sin are inputs in[1], in[2] (not differentiated).
struct Rope {
    static constexpr ops::Op op = ops::Op::rope;
    static Draw draw(const OpShape& s) {
        const i64 B = s.B, Tn = s.T, NH = s.NH, HS = s.C / s.NH, h = HS / 2, V = s.V;
        PX_ASSERT(HS % 2 == 0 && V >= Tn, "gradcheck: rope needs an even HS and V >= T");
        Rng r(43 + B * 5 + Tn * 3 + s.C + V);
        Draw d;
        for (i64 p = 0, left = Tn; left > 0; p++)  // Tn of the V positions, in order
            if (i64(r.below(V - p)) < left) {
                d.ids.push_back(int(p));
                left--;
            }
        Vec cos(V * h), sin(V * h);
        ops::rope_table(Numerics{}, view_f32(cos.data(), {V, h}), view_f32(sin.data(), {V, h}),
                        kRopeTheta);
        d.in = {randv(r, B * Tn * NH * HS, -2.0f, 2.0f), cos, sin};
        d.dout = randv(r, B * Tn * NH * HS);
        d.out = {{"out", Vec(B * Tn * NH * HS)}};
        d.grad = {{"dinp", randv(r, B * Tn * NH * HS)}};
        return d;
    }
    template <class T>
    static void forward(Io<T>& io) {
        rope_fwd_ref(io.out[0], io.in[0], io.in[1], io.in[2], io.ids, io.s.B, io.s.T, io.s.NH,
                     io.s.C / io.s.NH);
    }
    template <class T>
    static void backward(Io<T>& io) {
        rope_bwd_ref(io.grad[0], io.dout, io.in[1], io.in[2], io.ids, io.s.B, io.s.T, io.s.NH,
                     io.s.C / io.s.NH);
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        const i64 B = io.s.B, Tn = io.s.T, NH = io.s.NH, HS = io.s.C / NH, V = io.s.V;
        const std::vector<i64> pos(io.ids.begin(), io.ids.end());
        const Tensor cos = view(io.in[1], {V, HS / 2}), sin = view(io.in[2], {V, HS / 2});
        ops::rope_forward(nx, view(io.out[0], {B, Tn, NH, HS}), view(io.in[0], {B, Tn, NH, HS}),
                          cos, sin, pos.data());
        ops::rope_backward(nx, view(io.grad[0], {B, Tn, NH, HS}), view(io.dout, {B, Tn, NH, HS}),
                           cos, sin, pos.data());
    }
};

// out (N) = gelu(inp (N))
struct Gelu {
    static constexpr ops::Op op = ops::Op::gelu;
    static Draw draw(const OpShape& s) {
        const i64 N = s.N;
        Rng r(23 + N);
        Vec x = randv(r, N, -6.0f, 6.0f);
        if (N > 8) {  // the tanh polynomial/exp switch and tiny inputs
            x[0] = 0.0f;
            x[1] = 1e-30f;
            x[2] = -0.9f / kGeluS;
            x[3] = 12.0f;
        }
        Draw d;
        d.in = {x};
        d.dout = randv(r, N);
        d.out = {{"out", Vec(N)}};
        d.grad = {{"dinp", randv(r, N)}};
        return d;
    }
    template <class T>
    static void forward(Io<T>& io) {
        gelu_fwd_ref(io.out[0], io.in[0]);
    }
    template <class T>
    static void backward(Io<T>& io) {
        gelu_bwd_ref(io.grad[0], io.in[0], io.dout);
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        const i64 N = io.s.N;
        ops::gelu_forward(nx, view(io.out[0], {N}), view(io.in[0], {N}));
        ops::gelu_backward(nx, view(io.grad[0], {N}), view(io.in[0], {N}), view(io.dout, {N}));
    }
};

// out (B,T,C), preatt, att (B,NH,T,T) = causal attention(qkv (B,T,3C))
struct Attention {
    static constexpr ops::Op op = ops::Op::attention;
    static Draw draw(const OpShape& s) {
        const i64 B = s.B, Tn = s.T, C = s.C, C3 = 3 * C, TT = B * s.NH * Tn * Tn;
        Rng r(37 + B * 131 + Tn * 17 + C);
        Draw d;
        d.in = {randv(r, B * Tn * C3, -1.5f, 1.5f)};
        d.dout = randv(r, B * Tn * C);
        d.out = {{"out", Vec(B * Tn * C)}, {"preatt", Vec(TT)}, {"att", Vec(TT)}};
        d.grad = {{"dqkv", randv(r, B * Tn * C3)}};
        // Scratch is assigned: what it held before must not show.
        d.scratch = {{"dpreatt", Vec(TT, 7.0f)}, {"datt", Vec(TT, 7.0f)}};
        return d;
    }
    static AttnShape shape(const OpShape& s) { return {s.B, s.T, s.C, s.NH}; }
    template <class T>
    static void forward(Io<T>& io) {
        attention_fwd_ref(io.out[0], io.out[1], io.out[2], io.in[0], shape(io.s), io.s.block);
    }
    template <class T>
    static void backward(Io<T>& io) {
        attention_bwd_ref(io.grad[0], io.grad[1], io.grad[2], io.dout, io.in[0], io.out[2],
                          shape(io.s), io.s.block);
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        const i64 B = io.s.B, Tn = io.s.T, C = io.s.C, NH = io.s.NH;
        const Tensor qkv = view(io.in[0], {B, Tn, 3 * C}), att = view(io.out[2], {B, NH, Tn, Tn});
        ops::attention_forward(nx, view(io.out[0], {B, Tn, C}), view(io.out[1], {B, NH, Tn, Tn}),
                               att, qkv, NH);
        ops::attention_backward(
            nx, view(io.grad[0], {B, Tn, 3 * C}), view(io.grad[1], {B, NH, Tn, Tn}),
            view(io.grad[2], {B, NH, Tn, Tn}), view(io.dout, {B, Tn, C}), qkv, att, NH);
    }
};

// out (N) = inp1 (N) + inp2 (N)
struct Residual {
    static constexpr ops::Op op = ops::Op::residual;
    static Draw draw(const OpShape& s) {
        const i64 N = s.N;
        Rng r(41 + N);
        Draw d;
        d.in = {randv(r, N), randv(r, N)};
        d.dout = randv(r, N);
        d.out = {{"out", Vec(N)}};
        d.grad = {{"dinp1", randv(r, N)}, {"dinp2", randv(r, N)}};
        return d;
    }
    template <class T>
    static void forward(Io<T>& io) {
        residual_fwd_ref(io.out[0], io.in[0], io.in[1]);
    }
    template <class T>
    static void backward(Io<T>& io) {
        residual_bwd_ref(io.grad[0], io.grad[1], io.dout);
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        const i64 N = io.s.N;
        ops::residual_forward(nx, view(io.out[0], {N}), view(io.in[0], {N}), view(io.in[1], {N}));
        ops::residual_backward(nx, view(io.grad[0], {N}), view(io.grad[1], {N}),
                               view(io.dout, {N}));
    }
};

// out (B,T,C) = wte (V,C)[tokens (B,T)] + wpe (T,C)
struct Embedding {
    static constexpr ops::Op op = ops::Op::embedding;
    static Draw draw(const OpShape& s) {
        const i64 B = s.B, Tn = s.T, C = s.C, V = s.V;
        Rng r(53 + B * 7 + Tn + V);
        Draw d;
        d.ids.resize(B * Tn);
        for (auto& t : d.ids)
            t = r.below(V - 1);        // the last id never occurs: its row must not change
        d.ids[0] = d.ids[B * Tn - 1];  // one id at both ends: a tree over far-apart blocks
        d.in = {randv(r, V * C), randv(r, Tn * C)};
        d.dout = randv(r, B * Tn * C);
        d.out = {{"out", Vec(B * Tn * C)}};
        d.grad = {{"dwte", randv(r, V * C)}, {"dwpe", randv(r, Tn * C)}};
        return d;
    }
    template <class T>
    static void forward(Io<T>& io) {
        embedding_fwd_ref(io.out[0], io.ids, io.in[0], io.in[1], io.s.B, io.s.T, io.s.C);
    }
    template <class T>
    static void backward(Io<T>& io) {
        embedding_bwd_ref(io.grad[0], io.grad[1], io.dout, io.ids, io.s.B, io.s.T, io.s.C, io.s.V,
                          io.s.block);
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        const i64 B = io.s.B, Tn = io.s.T, C = io.s.C, V = io.s.V;
        ops::embedding_forward(nx, view(io.out[0], {B, Tn, C}), io.ids.data(),
                               view(io.in[0], {V, C}), view(io.in[1], {Tn, C}));
        ops::embedding_backward(nx, view(io.grad[0], {V, C}), view(io.grad[1], {Tn, C}),
                                view(io.dout, {B, Tn, C}), io.ids.data());
    }
};

// losses (BT), probs (BT,V) = softmax cross-entropy(logits (BT,V), targets (BT)); the loss is
// their mean, so R is 1/BT everywhere and the backward assigns dlogits.
struct Crossentropy {
    static constexpr ops::Op op = ops::Op::crossentropy;
    static float dloss(const OpShape& s) { return 1.0f / float(s.B * s.T); }
    static Draw draw(const OpShape& s) {
        const i64 BT = s.B * s.T, V = s.V;
        Rng r(67 + BT + V);
        Draw d;
        d.ids.resize(BT);
        for (auto& t : d.ids) t = r.below(V);
        d.in = {randv(r, BT * V, -4.0f, 4.0f)};
        d.dout = Vec(BT, dloss(s));
        d.out = {{"losses", Vec(BT)}, {"probs", Vec(BT * V)}};
        d.grad = {{"dlogits", Vec(BT * V, 0.0f)}};
        return d;
    }
    template <class T>
    static void forward(Io<T>& io) {
        crossentropy_fwd_ref(io.out[0], io.out[1], io.in[0], io.ids, io.s.B * io.s.T, io.s.V,
                             io.s.block);
    }
    template <class T>
    static void backward(Io<T>& io) {
        crossentropy_bwd_ref(io.grad[0], io.out[1], io.ids, dloss(io.s), io.s.B * io.s.T, io.s.V);
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        const i64 BT = io.s.B * io.s.T, V = io.s.V;
        const Tensor probs = view(io.out[1], {BT, V});
        ops::crossentropy_forward(nx, view(io.out[0], {BT}), probs, view(io.in[0], {BT, V}),
                                  io.ids.data());
        ops::crossentropy_backward(nx, view(io.grad[0], {BT, V}), probs, io.ids.data(),
                                   dloss(io.s));
    }
};

// out (BT,OC) = inp (BT,C)·weight (OC,C)ᵀ + bias (OC). The shape's C is the input width, V the
// output width OC.
struct Matmul {
    static constexpr ops::Op op = ops::Op::matmul;
    static Draw draw(const OpShape& s) {
        const i64 BT = s.B * s.T, C = s.C, OC = s.V;
        Rng r(83 + BT * 13 + C * 3 + OC);
        Draw d;
        d.in = {randv(r, BT * C), randv(r, OC * C), randv(r, OC)};
        d.dout = randv(r, BT * OC);
        d.out = {{"out", Vec(BT * OC)}};
        d.grad = {
            {"dinp", randv(r, BT * C)}, {"dweight", randv(r, OC * C)}, {"dbias", randv(r, OC)}};
        return d;
    }
    template <class T>
    static void forward(Io<T>& io) {
        matmul_fwd_ref(io.out[0], io.in[0], io.in[1], io.in[2], io.s.B * io.s.T, io.s.C, io.s.V,
                       io.s.block);
    }
    template <class T>
    static void backward(Io<T>& io) {
        matmul_bwd_ref(io.grad[0], io.grad[1], io.grad[2], io.dout, io.in[0], io.in[1],
                       io.s.B * io.s.T, io.s.C, io.s.V, io.s.block);
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        const i64 BT = io.s.B * io.s.T, C = io.s.C, OC = io.s.V;
        const Tensor inp = view(io.in[0], {BT, C}), weight = view(io.in[1], {OC, C}),
                     bias = view(io.in[2], {OC}), dinp = view(io.grad[0], {BT, C}),
                     dweight = view(io.grad[1], {OC, C}), dbias = view(io.grad[2], {OC});
        ops::matmul_forward(nx, view(io.out[0], {BT, OC}), inp, weight, &bias);
        ops::matmul_backward(nx, &dinp, &dweight, &dbias, view(io.dout, {BT, OC}), inp, weight);
    }
};

// param, m, v (N) after one AdamW step from grad (N); the shape's T is the step. No backward.
struct Adamw {
    static constexpr ops::Op op = ops::Op::adamw;
    static Draw draw(const OpShape& s) {
        const i64 N = s.N;
        Rng r(71 + N + s.T);
        Draw d;
        d.in = {randv(r, N), randv(r, N, -0.1f, 0.1f), randv(r, N, 0.0f, 0.01f), randv(r, N)};
        d.out = {{"param", d.in[0]}, {"m", d.in[1]}, {"v", d.in[2]}};  // updated in place
        return d;
    }
    template <class T>
    static void forward(Io<T>& io) {
        adamw_ref(io.out[0], io.out[1], io.out[2], io.in[0], io.in[1], io.in[2], io.in[3],
                  AdamWArgs{}, int(io.s.T));
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        const i64 N = io.s.N;
        const AdamWArgs a;
        ops::adamw_update(nx, view(io.out[0], {N}), view(io.out[1], {N}), view(io.out[2], {N}),
                          view(io.in[3], {N}),
                          {a.lr, a.beta1, a.beta2, a.eps, a.wd, a.gs, int(io.s.T)});
    }
};

// sumsq (1) = Σ x² over x (N). No backward.
struct SumSquares {
    static constexpr ops::Op op = ops::Op::sum_squares;
    static Draw draw(const OpShape& s) {
        Rng r(79 + s.N);
        Draw d;
        d.in = {randv(r, s.N, -3.0f, 3.0f)};
        d.out = {{"sumsq", Vec(1)}};
        return d;
    }
    template <class T>
    static void forward(Io<T>& io) {
        io.out[0] = sum_squares_ref(io.in[0], io.s.block);
    }
    static void kernel(const Numerics& nx, Io<float>& io) {
        io.out[0][0] = ops::sum_squares(nx, view(io.in[0], {io.s.N}));
    }
};

template <class Op>
OpDef entry(std::vector<OpShape> shapes, OpShape small) {
    return {ops::op_name(Op::op), std::move(shapes), small, make_problem<Op>};
}

}  // namespace

// Test shapes: odd sizes throughout: C not a multiple of 16, T not a multiple of the block, T >
// block so the key tree has several blocks, a small block (8) so short rows have trees too.
// Gradcheck shapes: the same traits, small enough to difference every element.
const std::vector<OpDef>& op_table() {
    const auto shp = op_shape;
    static const std::vector<OpDef> table = {
        entry<Layernorm>(
            {shp(2, 75, 37, 1, 1, 1, 64), shp(1, 19, 70, 1, 1, 1, 8), shp(3, 5, 16, 1, 1, 1, 64)},
            shp(2, 5, 19, 1, 1, 1, 8)),
        entry<Rmsnorm>(
            {shp(2, 75, 37, 1, 1, 1, 64), shp(1, 19, 70, 1, 1, 1, 8), shp(3, 5, 16, 1, 1, 1, 64)},
            shp(2, 5, 19, 1, 1, 1, 8)),
        entry<Gelu>({shp(1, 1, 1, 1, 1, 1037, 64), shp(1, 1, 1, 1, 1, 5, 8)},
                    shp(1, 1, 1, 1, 1, 37, 8)),
        entry<Swiglu>({shp(1, 1, 1037, 1, 1, 1, 64), shp(3, 5, 37, 1, 1, 1, 8)},
                      shp(2, 3, 13, 1, 1, 1, 8)),
        // HS 22 (pairs of 11: vector tails), 64 (Llama's), 4; more table rows than positions
        entry<Rope>(
            {shp(2, 13, 66, 3, 40, 1, 64), shp(1, 7, 128, 2, 300, 1, 64), shp(3, 5, 4, 1, 5, 1, 8)},
            shp(2, 5, 12, 2, 16, 1, 8)),
        entry<Attention>({shp(1, 150, 16, 2, 1, 1, 64), shp(2, 13, 24, 3, 1, 1, 8),
                          shp(1, 40, 40, 2, 1, 1, 8), shp(1, 1, 8, 1, 1, 1, 64)},
                         shp(2, 11, 12, 2, 1, 1, 4)),
        entry<Residual>({shp(1, 1, 1, 1, 1, 1037, 64)}, shp(1, 1, 1, 1, 1, 37, 8)),
        entry<Embedding>(
            {shp(3, 50, 19, 1, 23, 1, 8), shp(2, 150, 17, 1, 40, 1, 64), shp(4, 3, 5, 1, 3, 1, 64)},
            shp(3, 7, 5, 1, 11, 1, 4)),
        entry<Crossentropy>(
            {shp(2, 3, 1, 1, 150, 1, 64), shp(1, 5, 1, 1, 1001, 1, 8), shp(1, 2, 1, 1, 7, 1, 64)},
            shp(2, 3, 1, 1, 37, 1, 8)),
        entry<Matmul>({shp(2, 13, 37, 1, 19, 1, 8), shp(1, 5, 70, 1, 3, 1, 64)},
                      shp(2, 5, 19, 1, 13, 1, 8)),
        entry<Adamw>({shp(1, 1, 1, 1, 1, 1037, 64), shp(1, 7, 1, 1, 1, 50, 8)},
                     shp(1, 3, 1, 1, 1, 37, 8)),
        entry<SumSquares>({shp(1, 1, 1, 1, 1, 1037, 64), shp(1, 1, 1, 1, 1, 100003, 64),
                           shp(1, 1, 1, 1, 1, 13, 8)},
                          shp(1, 1, 1, 1, 1, 37, 8)),
    };
    return table;
}

std::vector<std::string> op_names() {
    std::vector<std::string> v;
    for (const OpDef& d : op_table()) v.emplace_back(d.name);
    return v;
}

const OpDef& find_op(const std::string& name) {
    for (const OpDef& d : op_table())
        if (name == d.name) return d;
    std::string msg = "unknown op '";
    msg += name;
    msg += "'; the ops are:";
    for (const std::string& n : op_names()) {
        msg += " ";
        msg += n;
    }
    msg += " (or 'all')";
    throw ConfigError(msg);
}

}  // namespace px::gradcheck
