// Gradient checks in fp64 (docs/validation.md): every CPU op's fp32 backward against central finite
// differences of an fp64 forward of the same op, within a bound derived from fp32 rounding, and
// the whole model's loss gradient against central differences of a plain fp64 GPT-2. Used by
// `parallax gradcheck`, tests/kernels/test_ops.cpp, tests/model/test_model.cpp and tests/validators/test_validators.cpp.
// The kernels under test are reached through kernels/ops.h.
//
// Files: gradcheck_math.h (EB arithmetic, the fp64 references), gradcheck_ops.cpp (the op table:
// adding an op is a struct there and a line in op_table()), gradcheck.cpp (data, finite
// differences, checks), gradcheck_report.cpp (rows and tables), gradcheck_model.cpp (the model).
//
// Index
//   Rng                    splitmix64 generator of test inputs (full fp32 mantissas)
//   EB, kU, kMathUlp       error-bound arithmetic: a double value with a bound on the fp32 error
//   Order                  the summation order a bound covers: canonical (bitwise) or any (fast)
//   OpShape, OpProblem     one op on one shape: inputs, kernels, EB reference, fp64 loss
//   OpDef, op_table        every op: its test shapes, its small gradcheck shape, its generator
//   op_names, find_op      the op names; one op's entry (ConfigError naming the known ones)
//   make_numerics_for      Numerics of a problem in a mode on an ISA
//   find_output            one named output of a run
//   FdSample, fd_samples   per sampled element: kernel gradient, finite difference, bounds
//   GradcheckRow, GradcheckReport  per op and tensor: elements, error, bound, verdict, where
//   check_problem          one problem's gradients (or values, ops without a backward)
//   gradcheck_op           a named op on its small shape (or a given one)
//   RefGPT                 a plain fp64 GPT-2 over a model's parameter table
//   ModelFdOptions         batch, samples, step, init of the whole-model check
//   model_fd_samples       the whole model: fp32 loss and gradient vs fp64 loss and differences
//   gradcheck_model        the same as report rows, one per parameter tensor (and the loss)
//   scaled_model           a large ModelConfig shrunk to a size the fp64 model checks in seconds
//
// How the op bounds are derived (none is tuned to make a test pass):
//   * EB runs the reference with the standard model of fp32 arithmetic: every +, -, ·, /, sqrt
//     and fma adds u·|result| (u = 2^-24) to the propagated first-order bound of its operands;
//     exp, log and tanh add kMathUlp ulp (the contract of core/base/mathfun.h, tested in test_ops);
//     a sum of n terms in the canonical tree (depth d = min(n, block) + ceil(log2(blocks))) adds
//     γ_d·Σ|terms|, γ_d = d·u/(1 - d·u) (Higham, Accuracy and Stability, §4.2). Under Order::any
//     (Mode::fast) the order is unknown, so d = n (a bound for any summation order).
//   * Finite differences are central, with Richardson extrapolation over steps h and h/2 (h =
//     2^-12, exact in fp64); their error is estimated as |D_R - D_{h/2}| (larger than D_R's own
//     truncation error, which is O(h^4)) plus the fp64 rounding of the two loss evaluations,
//     64·2^-53·Σ|loss terms|/h (64: generous depth of one loss evaluation).
//   * The loss of an op is Σ out·R for a fixed random R (the d-output its backward is given), so
//     its finite difference is the gradient the backward adds to what the output held.
//   * A kernel gradient must match the finite difference within its EB bound plus the FD error,
//     and the analytic fp64 backward must match it within the FD error (plus its own rounding):
//     otherwise the reference itself is wrong and the bound means nothing.
// The whole-model bound is tests/model/test_model.cpp's: each gradient passes through ~100 fp32 ops
// (relative error <= ~100·eps32 = 6e-6 of the magnitudes involved), judged against the tensor's
// gradient scale: |g - fd| <= 1e-4·max|fd| + 1e-3·|fd| + 1e-9; the loss within 60·6e-8·|loss|
// + 1e-6 (~60 dependent fp32 ops per value). Differences: h = 1e-5 (truncation ~1e-12, rounding
// ~1e-11, far below the fp32 gradient's own error).
#pragma once
#include "core/base/config.h"
#include "core/model/model.h"
#include "core/base/numerics.h"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace px::gradcheck {

// ---- data ---------------------------------------------------------------------------------------

using Vec = std::vector<float>;

struct Rng {
    std::uint64_t s;
    explicit Rng(std::uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
    std::uint64_t next();               // splitmix64
    float uniform(float lo, float hi);  // in double, then rounded: full fp32 mantissas
    int below(i64 n) { return int(next() % std::uint64_t(n)); }
};
Vec randv(Rng& r, i64 n, float lo = -1.0f, float hi = 1.0f);  // n uniform values

// ---- error-bound arithmetic ---------------------------------------------------------------------

inline constexpr double kU = 0x1p-24;    // fp32 unit roundoff
inline constexpr double kMathUlp = 2.0;  // core/base/mathfun.h's accuracy contract, in ulp

// A double value and a bound on the error of the same expression evaluated in fp32.
struct EB {
    double v = 0.0, e = 0.0;
    EB() = default;
    EB(double x) : v(x) {}  // NOLINT: constants and inputs are exact fp32 values
    EB(double x, double err) : v(x), e(err) {}
};

enum class Order : std::uint8_t {
    canonical,  // the canonical tree of Mode::bitwise
    any,        // any summation order (Mode::fast)
};

// ---- op problems --------------------------------------------------------------------------------

// The kernels' fp32 constants (kernels/cpu: layernorm.cpp, gelu.cpp), shared by the references.
inline constexpr float kLnEps = 1e-5f;
inline constexpr float kGeluS = 0.7978845608028654f;  // float(sqrt(2/pi))
inline constexpr float kGeluA = 0.044715f;
inline constexpr float kGeluA3 = float(3.0 * 0.044715);
// The RMSNorm problem's eps (Llama 3's norm_eps) and the rope problem's theta.
inline constexpr float kRmsEps = 1e-5f;
inline constexpr double kRopeTheta = 10000.0;
// The AdamW problem's hyperparameters (its step is the shape's T).
struct AdamWArgs {
    float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
};

using Named = std::vector<std::pair<std::string, Vec>>;
using NamedEB = std::vector<std::pair<std::string, std::vector<EB>>>;
using Inputs64 = std::vector<std::vector<double>>;

// Sizes of one op instance (each op reads the letters it uses; adamw's T is its step).
struct OpShape {
    i64 B = 1, T = 1, C = 1, NH = 1, V = 1, N = 1;
    int block = 64;
};
OpShape op_shape(i64 B, i64 T, i64 C, i64 NH, i64 V, i64 N, int block);
std::string describe(const std::string& op, const OpShape& s);  // "layernorm B=2 T=5 ..."

// One op on one shape, with its generated data.
struct OpProblem {
    std::string op;     // "layernorm"
    std::string label;  // describe(op, shape)
    OpShape shape;
    int block = 64;
    std::vector<Vec> in;                 // float inputs (the last is R, the d-output, if any)
    std::vector<int> ids;                // token ids, targets (crossentropy) or positions (rope)
    std::vector<int> diff;               // inputs the backward differentiates ...
    std::vector<std::string> grad_name;  // ... and the outputs holding their gradients
    std::vector<Vec> grad_init;          // what those outputs held before (gradients accumulate)
    std::function<Named(const Numerics&)> run;  // the kernels: forward, then backward if any
    std::function<NamedEB(Order)> ref;          // EB reference of every output of run
    // fp64 loss of the forward as a function of the inputs, with Σ|terms| (null: no backward)
    std::function<std::pair<double, double>(const Inputs64&)> loss;
};

struct OpDef {
    const char* name;
    std::vector<OpShape> shapes;  // the shapes tests/kernels/test_ops.cpp checks (odd sizes, deep trees)
    OpShape small;                // the gradcheck shape: every element checked in milliseconds
    std::function<OpProblem(const OpShape&)> make;
};
const std::vector<OpDef>& op_table();  // every op of gradcheck_ops.cpp
std::vector<std::string> op_names();
const OpDef& find_op(const std::string& name);  // ConfigError naming the known ops

Numerics make_numerics_for(const OpProblem& p, Mode mode, Isa isa);
const Vec* find_output(const Named& n, const std::string& name);  // null: no such output

// ---- finite differences of one op ---------------------------------------------------------------

struct FdSample {
    i64 index = 0;         // element of the gradient tensor
    double kernel = 0;     // the kernel's fp32 gradient (what the output holds after backward)
    double expect = 0;     // what it held before + the Richardson central difference
    double fd_err = 0;     // the difference's error estimate
    double ref = 0;        // the analytic fp64 backward (EB value) ...
    double ref_bound = 0;  // ... and its fp32 error bound
    double error() const;  // |kernel - expect|
    double bound() const;  // ref_bound + fd_err
    bool kernel_ok() const { return error() <= bound(); }
    bool ref_ok() const;  // the fp64 backward agrees with the difference
};

// The gradient p.grad_name[k] of `got` (a run of p) against differences of p.loss, at elements
// 0, n-1 and `random_samples` random ones (seeded by n), or at every element when n <=
// every_up_to. `ref`: p.ref(Order::canonical) (or any, for a fast-mode run).
std::vector<FdSample> fd_samples(const OpProblem& p, size_t k, const Named& got, const NamedEB& ref,
                                 int random_samples = 30, i64 every_up_to = 0);

// ---- reports ------------------------------------------------------------------------------------

struct GradcheckRow {
    std::string op;      // "layernorm", "model"
    std::string tensor;  // "dinp", "h.0.attn.c_attn.weight", "loss"
    std::string kind;    // "gradient" (vs differences), "value" (vs the fp64 forward), "loss"
    i64 size = 0;        // elements in the tensor
    i64 checked = 0;     // elements checked
    i64 failing = 0;     // of those, outside their bound
    i64 reference_failing = 0;   // elements where the fp64 backward disagrees with the difference
    double ratio = 0;            // the largest error / bound over the checked elements
    i64 worst = -1;              // the element with that ratio
    double max_error = 0;        // its error ...
    double bound = 0;            // ... and its bound
    double got = 0, expect = 0;  // its kernel value and the fp64 value it should be near
    bool pass() const { return failing == 0 && reference_failing == 0; }
    // Folds one checked element in: its error and bound, its value and the fp64 value.
    void add(i64 index, double err, double err_bound, double value, double fp64);
    // One line: "layernorm dweight (gradient): 19 of 19 elements, worst error ... at [4] ...".
    std::string text() const;
    std::string to_json() const;  // one JSON object
};

struct GradcheckReport {
    std::vector<GradcheckRow> rows;
    std::vector<std::string> notes;  // e.g. that the model was scaled down
    bool pass() const;
    std::string table() const;    // op, tensor, kind, elements, error, bound, ratio, at, verdict
    std::string to_json() const;  // {"pass":..., "notes":[...], "rows":[...]}
};

// Rows of one problem: a gradient row per differentiated input (every element when n <=
// every_up_to), or, for an op without a backward, a value row per output against the EB
// reference. `nx` decides the mode (Mode::fast: bounds for any order).
std::vector<GradcheckRow> check_problem(const OpProblem& p, const Numerics& nx,
                                        i64 every_up_to = 4096);

// A named op (ConfigError naming the known ones) on its small shape, or on `shape`; nx.block
// is the shape's. mode / isa: nx's.
std::vector<GradcheckRow> gradcheck_op(const std::string& name, const Numerics& nx);
std::vector<GradcheckRow> gradcheck_op(const std::string& name, const OpShape& shape,
                                       const Numerics& nx);

// ---- the whole model ----------------------------------------------------------------------------

// A plain fp64 GPT-2 over the same parameter table (llm.c's math, no tricks).
struct RefGPT {
    ModelConfig mc;
    ParamTable table;
    std::vector<double> p;  // laid out like the fp32 arena

    const double* P(int i) const { return p.data() + table.entries[i].offset; }
    // The mean loss of tokens / targets (B,T).
    // With MoE layers (core/model/moe.h), their auxiliary losses are added, as the fp32
    // model's backward differentiates them.
    double loss(const std::vector<int>& tok, const std::vector<int>& tgt, int B, int T) const;
    // The same for model.arch = "llama" (gradcheck_llama.cpp): RMSNorm, RoPE at the fp32 table's
    // angles, grouped-query attention, Qwen3's qk_norm, SwiGLU, a tied or separate head, and
    // MoE layers of SwiGLU experts (moe64, ffn64).
    double llama_loss(const std::vector<int>& tok, const std::vector<int>& tgt, int B,
                      int T) const;
    // A MoE layer: out (B·T,C) from ln (B·T,C); returns its auxiliary losses.
    double moe64(std::vector<double>& out, const std::vector<double>& ln, int l, int B,
                 int T) const;
    // Layer l's feed-forward on one token's x (C): routed expert e's (e >= 0), or the plain MLP
    // (e < 0: a dense layer's, or a MoE layer's shared experts'), of the architecture's kind:
    // GPT-2's GELU MLP with biases, Llama's SwiGLU without.
    void ffn64(double* out, const double* x, int l, int e) const;
};

struct ModelFdOptions {
    int B = 2;                // sequences
    int T = 0;                // tokens per sequence; 0: the model's seq_len
    int samples = 6;          // elements per tensor: (s·7919) mod n, s < samples
    double h = 1e-5;          // central-difference step
    float init_std = 0.4f;    // random weights N(0, std) (larger than GPT-2's: nonlinear)
    std::uint64_t seed = 99;  // their seed
};

struct ModelSample {
    int tensor = 0;       // index in the model's ParamTable
    i64 element = 0;      // within the tensor
    double analytic = 0;  // the fp32 backward's gradient
    double fd = 0;        // central difference of the fp64 model
    double bound = 0;     // 1e-4·scale + 1e-3·|fd| + 1e-9 (scale: the tensor's max |fd|)
    bool ok() const;
};

struct ModelProbe {
    std::vector<std::string> names;    // tensor names, table order
    std::vector<i64> sizes;            // their elements
    double loss32 = 0, loss64 = 0;     // the fp32 model's mean loss; the fp64 model's
    double loss_bound = 0;             // 60·6e-8·|loss64| + 1e-6
    std::vector<ModelSample> samples;  // tensor by tensor, in table order
};

// Tokens (i·7+3) mod V, targets (i·5+1) mod V; weights random; one fp32 forward and backward
// (tied head combined) and the fp64 model's differences.
ModelProbe model_fd_samples(const ModelConfig& mc, const Numerics& nx,
                            const ModelFdOptions& o = {});
std::vector<GradcheckRow> gradcheck_model(const ModelConfig& mc, const Numerics& nx,
                                          const ModelFdOptions& o = {});

// mc when it is small enough for the fp64 model (L <= 2, C <= 32, F <= 128, V <= 64, T <= 16;
// MoE: at most 8 experts, 2 shared, an expert's MLP at most 4·C), else a copy cut to those
// limits (heads: the largest divisor of the new C not above the old heads; top-k at most the
// experts); `note` then says what changed.
ModelConfig scaled_model(const ModelConfig& mc, std::string* note);

}  // namespace px::gradcheck
