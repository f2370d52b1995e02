// bench_llama_step: one fp32 training step (forward, backward, clip + AdamW) of the Llama-3-shaped
// 124M model of examples/llama-124m.toml, in fast and in bitwise mode, beside the machine's fp32
// FMA peak measured in the same run; and where the fast step's time goes among its ops.
//
//   build/bench/bench_llama_step [--config FILE] [--batch B] [--seq T] [--steps N]
//                                [--threads N] [--tokens FILE] [--save-init FILE] [--no-shares]
//                                [--serve]
//
// The shape, B (train.batch_size), T (model.seq_len) and the optimizer (train.lr held constant,
// weight_decay, beta1, beta2, eps, grad_clip) come from the config (default
// examples/llama-124m.toml: run from the repository root). The step is bench_step's: one batch
// of tokens (random, or B·(T+1) little-endian int32 from --tokens), one model per mode from the
// same initial weights, the modes taking turns step by step after a warm-up step each; best and
// median of N steps, split into forward / backward / clip+AdamW. --save-init writes those initial
// weights as safetensors under Hugging Face's LlamaForCausalLM names (bench/llama_vs_torch.py
// loads them into PyTorch, which then trains on the same tokens). --serve: after the warm-up steps
// it prints "ready" and runs one step per line of input, "fast" or "bitwise", printing its ms and
// loss, until another line or the end of the input (a driver alternating it with another program
// step by step); the results and checks follow as without it.
//
// The ops' share (unless --no-shares): there are no per-op timers inside a step, so each op runs
// alone on the step's exact shapes (the best of a few repetitions, each mode) and is counted as
// often as a step calls it: RMSNorm, RoPE, SwiGLU and the KV heads' repeat and sum (the Llama
// ops), the linears (matmul forward, input and weight gradients) and attention. Their sum beside
// the measured step leaves the rest: embedding, cross-entropy over V, residuals, zeroing.
//
// Checks its results: a bitwise forward repeated gives the same bits; fast's initial loss agrees
// with bitwise's within fp32 rounding (1e-5 of the loss) and lies within 0.5 of ln V; every loss is
// finite and each mode's loss falls over the steps (the same batch every step); a second bitwise
// model trained from the same weights gives the same bits (its losses, and every parameter after
// two steps).
#include "bench/peak.h"
#include "core/base/config.h"
#include "core/base/rng.h"
#include "core/base/wait_policy.h"
#include "core/io/safetensors.h"
#include "core/model/llama_block.h"
#include "core/model/model.h"
#include "core/model/optimizer.h"
#include "kernels/ops.h"

#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

using namespace px;

namespace {

using clock_type = std::chrono::steady_clock;

double ms_between(clock_type::time_point a, clock_type::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

// This process's CPU time (all its threads), in ms: what the other programs of a busy host take
// is not in it, so shares of it hold up there better than shares of wall time.
double cpu_ms() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// A 64-bit digest of a buffer (FNV-1a over 8-byte words): equal bits give equal digests.
std::uint64_t digest(const void* data, i64 bytes) {
    std::uint64_t h = 1469598103934665603ull;
    const auto* p = static_cast<const unsigned char*>(data);
    const i64 words = bytes / 8;
    for (i64 i = 0; i < words; i++) {
        std::uint64_t w;
        std::memcpy(&w, p + 8 * i, 8);
        h = (h ^ w) * 1099511628211ull;
    }
    for (i64 i = 8 * words; i < bytes; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

// One model in one numerics mode, its optimizer, gradients and the step's tokens.
struct StepRunner {
    GPT model;
    AdamW opt;
    Arena grads;
    const std::vector<int>& tokens;
    const std::vector<int>& targets;
    TrainConfig tc;
    i64 B, T;
    int t = 0;                   // optimizer steps taken
    std::vector<double> losses;  // the mean loss of each step's forward
    struct Phases {
        double forward = 0, backward = 0, optimizer = 0, total = 1e300;
    } best;  // of the fastest step
    struct Cpu {
        double optimizer = 0, total = 1e300;
    } least_cpu;  // CPU ms of the step that took the least

    StepRunner(const ModelConfig& mc, const Numerics& nx, const TrainConfig& tc_,
               const std::vector<int>& tok, const std::vector<int>& tgt, i64 B_, i64 T_)
        : model(mc, nx, ModelPart::whole(mc), nullptr, DType::f32),
          opt(model),
          grads(bytes_of(DType::f32, model.grad_layout().total), Arena::Pages::now),
          tokens(tok),
          targets(tgt),
          tc(tc_),
          B(B_),
          T(T_) {
        model.init_random(tc.seed, mc.init_std);
        model.prepare(B, T);
    }

    double mean_loss() const {
        return canonical_sum(model.losses(), B * T, 64) / static_cast<double>(B * T);
    }
    // A forward only (no update); the mean loss.
    double loss() {
        model.forward(tokens.data(), targets.data(), B, T);
        return mean_loss();
    }
    // One optimizer step; its milliseconds.
    double step() {
        const double c0 = cpu_ms();
        const auto t0 = clock_type::now();
        model.forward(tokens.data(), targets.data(), B, T);
        const auto t1 = clock_type::now();
        grads.zero();
        model.backward(grads.f32(), tokens.data(), targets.data(),
                       1.0f / static_cast<float>(B * T));
        model.combine_tied_grads(grads.f32());
        const auto t2 = clock_type::now();
        const double c2 = cpu_ms();
        const float norm = global_grad_norm(model.numerics(), model, grads.f32());
        opt.step(model, grads.f32(), norm, static_cast<float>(tc.lr), ++t, tc);
        const auto t3 = clock_type::now();
        const double c3 = cpu_ms();
        losses.push_back(mean_loss());
        if (c3 - c0 < least_cpu.total) least_cpu = {c3 - c2, c3 - c0};
        const double total = ms_between(t0, t3);
        if (total < best.total)
            best = {ms_between(t0, t1), ms_between(t1, t2), ms_between(t2, t3), total};
        return total;
    }
    std::uint64_t params_digest() const {
        return digest(model.params(), bytes_of(DType::f32, model.table().total));
    }
};

std::vector<int> read_tokens(const std::string& path, i64 n) {
    std::ifstream f(path, std::ios::binary);
    std::vector<int> v(static_cast<size_t>(n));
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
    if (!f) throw Error(path + ": could not read " + std::to_string(n) + " int32 tokens");
    return v;
}

// The initial weights under their Hugging Face names (the table's Llama names).
void save_init(const GPT& model, const std::string& path) {
    std::vector<SafetensorsData> ts;
    for (const TableEntry& e : model.table().entries)
        ts.push_back({e.name, SafeDType::F32, e.shape(), model.params() + e.offset,
                      static_cast<u64>(e.numel()) * 4});
    write_safetensors(path, ts);
}

// ---- the ops' share: each op alone on the step's shapes ---------------------------------------

using Vec = std::vector<float>;

Vec filled(i64 n, float lo, float hi, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    Vec v(static_cast<size_t>(n));
    for (float& x : v) x = u(rng);
    return v;
}

// (B,T,H,HS) heads of a (B,T,W) buffer from column col0: rows W apart (the fused qkv's parts).
Tensor heads(float* data, i64 B, i64 T, i64 W, i64 col0, i64 H, i64 HS) {
    Tensor t = view_f32(data + col0, {B, T, H, HS});
    t.strides[0] = T * W, t.strides[1] = W;
    return t;
}

// The least wall and the least CPU ms of reps calls (after a warm-up call).
std::pair<double, double> best_ms(int reps, const std::function<void()>& fn) {
    fn();
    double wall = 1e300, cpu = 1e300;
    for (int r = 0; r < reps; r++) {
        const double c0 = cpu_ms();
        const auto t0 = clock_type::now();
        fn();
        wall = std::min(wall, ms_between(t0, clock_type::now()));
        cpu = std::min(cpu, cpu_ms() - c0);
    }
    return {wall, cpu};
}

struct Share {
    const char* group;  // "llama ops", "linears", "attention"
    const char* name;
    double wall[2] = {0, 0};  // ms per step: bitwise, fast
    double cpu[2] = {0, 0};   // CPU ms per step
};

// Every op of a step, alone, on its shapes; ms per step (one call's best times its calls).
std::vector<Share> op_shares(const ModelConfig& mc, i64 B, i64 T, int reps) {
    const i64 L = mc.layers, C = mc.hidden, NH = mc.heads, KV = mc.kv_head_count(),
              HS = mc.head_size(), F = mc.ffn, V = mc.vocab, BT = B * T, CA = NH * HS, CK = KV * HS,
              W = 3 * CA, h = HS / 2;
    const double l = static_cast<double>(L);
    const float eps = static_cast<float>(mc.norm_eps);
    // buffers: the largest shape each role takes
    Vec x = filled(BT * std::max(C, F), -1, 1, 1),
        y = Vec(static_cast<size_t>(BT * std::max(V, F)));
    Vec dy = filled(BT * std::max(V, F), -1, 1, 2), dx = Vec(static_cast<size_t>(BT * F));
    Vec w = filled(V * C, -0.05f, 0.05f, 3), dw = Vec(static_cast<size_t>(V * C));
    Vec nw = filled(C, 0.5f, 1.5f, 4), ndw = Vec(static_cast<size_t>(C)),
        rstd = Vec(static_cast<size_t>(BT));
    Vec g = filled(BT * F, -6, 6, 5), u = filled(BT * F, -1, 1, 6), dg = Vec(g.size()),
        du = Vec(g.size());
    Vec qkv = filled(BT * W, -1, 1, 7), dqkv = filled(BT * W, -1, 1, 8),
        kin = filled(BT * CK, -1, 1, 9), kout = Vec(static_cast<size_t>(BT * CK));
    Vec cos = Vec(static_cast<size_t>(mc.seq_len * h)), sin = Vec(cos.size());
    Vec att = Vec(static_cast<size_t>(B * NH * T * T)), pre = Vec(att.size()),
        datt = Vec(att.size()), dpre = Vec(att.size());
    Vec atty = filled(BT * CA, -1, 1, 10), datty = filled(BT * CA, -1, 1, 11);
    const KvGroups kg{B, T, NH, KV, HS, NH / KV};

    std::vector<Share> out;
    for (const Mode m : {Mode::bitwise, Mode::fast}) {
        Numerics nx;
        nx.mode = m;
        const int k = m == Mode::fast ? 1 : 0;
        ops::rope_table(nx, view_f32(cos.data(), {mc.seq_len, h}),
                        view_f32(sin.data(), {mc.seq_len, h}), mc.rope_theta);
        const Tensor tc = view_f32(cos.data(), {mc.seq_len, h}),
                     ts = view_f32(sin.data(), {mc.seq_len, h});
        std::vector<Share> s;
        auto add = [&](const char* group, const char* name, double calls,
                       const std::function<void()>& fn) {
            Share sh{group, name, {0, 0}, {0, 0}};
            const auto [wall, cpu] = best_ms(reps, fn);
            sh.wall[k] = calls * wall;
            sh.cpu[k] = calls * cpu;
            s.push_back(sh);
        };
        const Tensor xc = view_f32(x.data(), {BT, C}), yc = view_f32(y.data(), {BT, C});
        add("llama ops", "rmsnorm fwd", 2 * l + 1, [&] {
            ops::rmsnorm_forward(nx, yc, view_f32(rstd.data(), {BT}), xc, view_f32(nw.data(), {C}),
                                 eps);
        });
        add("llama ops", "rmsnorm bwd", 2 * l + 1, [&] {
            ops::rmsnorm_backward(nx, view_f32(dx.data(), {BT, C}), view_f32(ndw.data(), {C}),
                                  view_f32(dy.data(), {BT, C}), xc, view_f32(nw.data(), {C}),
                                  view_f32(rstd.data(), {BT}));
        });
        add("llama ops", "rope fwd (q, k)", l, [&] {
            ops::rope_forward(nx, heads(qkv.data(), B, T, W, 0, NH, HS),
                              view_f32(x.data(), {B, T, NH, HS}), tc, ts, nullptr);
            ops::rope_forward(nx, view_f32(kout.data(), {B, T, KV, HS}),
                              view_f32(kin.data(), {B, T, KV, HS}), tc, ts, nullptr);
        });
        add("llama ops", "rope bwd (q, k)", l, [&] {
            ops::rope_backward(nx, view_f32(dx.data(), {B, T, NH, HS}),
                               heads(dqkv.data(), B, T, W, 0, NH, HS), tc, ts, nullptr);
            ops::rope_backward(nx, view_f32(kout.data(), {B, T, KV, HS}),
                               view_f32(kin.data(), {B, T, KV, HS}), tc, ts, nullptr);
        });
        add("llama ops", "swiglu fwd", l, [&] {
            ops::swiglu_forward(nx, view_f32(y.data(), {BT, F}), view_f32(g.data(), {BT, F}),
                                view_f32(u.data(), {BT, F}));
        });
        add("llama ops", "swiglu bwd", l, [&] {
            ops::swiglu_backward(nx, view_f32(dg.data(), {BT, F}), view_f32(du.data(), {BT, F}),
                                 view_f32(g.data(), {BT, F}), view_f32(u.data(), {BT, F}),
                                 view_f32(dy.data(), {BT, F}));
        });
        const Tensor q3 = view_f32(qkv.data(), {B, T, W}), dq3 = view_f32(dqkv.data(), {B, T, W});
        add("llama ops", "repeat kv (k, v)", l, [&] {
            repeat_kv(kg, q3, CA, view_f32(kin.data(), {B, T, CK}));
            repeat_kv(kg, q3, 2 * CA, view_f32(kin.data(), {B, T, CK}));
        });
        add("llama ops", "sum kv (dk, dv)", l, [&] {
            sum_kv(kg, view_f32(kout.data(), {B, T, CK}), dq3, CA);
            sum_kv(kg, view_f32(kout.data(), {B, T, CK}), dq3, 2 * CA);
        });
        // The linears: (OC, IC) and calls per step.
        struct Lin {
            const char* fwd;
            const char* bwd;
            i64 oc, ic;
            double calls;
        };
        const Lin lins[] = {{"q, o proj fwd", "q, o proj bwd", CA, C, 2 * l},
                            {"k, v proj fwd", "k, v proj bwd", CK, C, 2 * l},
                            {"gate, up fwd", "gate, up bwd", F, C, 2 * l},
                            {"down fwd", "down bwd", C, F, l},
                            {"lm_head fwd", "lm_head bwd", V, C, 1}};
        for (const Lin& ln : lins) {
            const Tensor in = view_f32(x.data(), {BT, ln.ic}),
                         wt = view_f32(w.data(), {ln.oc, ln.ic});
            add("linears", ln.fwd, ln.calls, [&] {
                ops::matmul_forward(nx, view_f32(y.data(), {BT, ln.oc}), in, wt, nullptr);
            });
            const Tensor din = view_f32(dx.data(), {BT, ln.ic}),
                         dwt = view_f32(dw.data(), {ln.oc, ln.ic}),
                         dout = view_f32(dy.data(), {BT, ln.oc});
            add("linears", ln.bwd, ln.calls,
                [&] { ops::matmul_backward(nx, &din, &dwt, nullptr, dout, in, wt); });
        }
        const Tensor ta = view_f32(att.data(), {B, NH, T, T});
        add("attention", "attention fwd", l, [&] {
            ops::attention_forward(nx, view_f32(atty.data(), {B, T, CA}),
                                   view_f32(pre.data(), {B, NH, T, T}), ta, q3, NH);
        });
        add("attention", "attention bwd", l, [&] {
            ops::attention_backward(nx, dq3, view_f32(dpre.data(), {B, NH, T, T}),
                                    view_f32(datt.data(), {B, NH, T, T}),
                                    view_f32(datty.data(), {B, T, CA}), q3, ta, NH);
        });
        if (out.empty()) {
            out = s;
        } else {
            for (size_t i = 0; i < s.size(); i++) {
                out[i].wall[k] = s[i].wall[k];
                out[i].cpu[k] = s[i].cpu[k];
            }
        }
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    px::openmp_passive_by_default(argv);  // idle OpenMP threads sleep (core/base/wait_policy.h)
    std::string config_path = "examples/llama-124m.toml", tokens_path, init_path;
    i64 B = 0, T = 0;
    int steps = 5;
    bool shares = true, serve = false;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        const bool more = i + 1 < argc;
        if (a == "--config" && more)
            config_path = argv[++i];
        else if (a == "--batch" && more)
            B = std::atoll(argv[++i]);
        else if (a == "--seq" && more)
            T = std::atoll(argv[++i]);
        else if (a == "--steps" && more)
            steps = std::max(2, std::atoi(argv[++i]));
        else if (a == "--threads" && more)
            omp_set_num_threads(std::atoi(argv[++i]));
        else if (a == "--tokens" && more)
            tokens_path = argv[++i];
        else if (a == "--save-init" && more)
            init_path = argv[++i];
        else if (a == "--no-shares")
            shares = false;
        else if (a == "--serve")
            serve = true;
        else {
            std::fprintf(stderr,
                         "usage: bench_llama_step [--config FILE] [--batch B] [--seq T] "
                         "[--steps N] [--threads N] [--tokens FILE] [--save-init FILE] "
                         "[--no-shares] [--serve]\n");
            return 2;
        }
    }
    Config cfg;
    try {
        cfg = load_config(config_path);
    } catch (const std::exception& e) {
        std::fprintf(stderr,
                     "bench_llama_step: %s\n(run it from the repository root, or name the config "
                     "with --config)\n",
                     e.what());
        return 2;
    }
    ModelConfig mc = cfg.model;
    if (!mc.llama()) {
        std::fprintf(stderr, "bench_llama_step: %s is not model.arch = \"llama\"\n",
                     config_path.c_str());
        return 2;
    }
    if (B <= 0) B = cfg.train.batch_size;
    if (T <= 0) T = mc.seq_len;
    mc.seq_len = std::max(mc.seq_len, T);  // it sizes the RoPE table only: no parameter
    const int threads = omp_get_max_threads();
    const Isa isa = detect_isa();

    std::vector<int> tokens, targets;
    const i64 n = B * (T + 1);
    std::vector<int> raw;
    if (!tokens_path.empty()) {
        raw = read_tokens(tokens_path, n);
    } else {
        for (i64 i = 0; i < n; i++)
            raw.push_back(static_cast<int>(uniform_at(42, 7, static_cast<u64>(i)) *
                                           static_cast<double>(mc.vocab)));
    }
    for (i64 i = 0; i < n; i++) {
        if (raw[static_cast<size_t>(i)] < 0 || raw[static_cast<size_t>(i)] >= mc.vocab) {
            std::fprintf(stderr, "bench_llama_step: token %lld out of range\n",
                         static_cast<long long>(i));
            return 2;
        }
        if (i % (T + 1) != T) tokens.push_back(raw[static_cast<size_t>(i)]);
        if (i % (T + 1) != 0) targets.push_back(raw[static_cast<size_t>(i)]);
    }

    TrainConfig tc = cfg.train;
    const Numerics bitwise{Mode::bitwise, 64, isa};
    Numerics fast = bitwise;
    fast.mode = Mode::fast;
    auto fx = std::make_unique<StepRunner>(mc, fast, tc, tokens, targets, B, T);
    auto bw = std::make_unique<StepRunner>(mc, bitwise, tc, tokens, targets, B, T);
    if (!init_path.empty()) save_init(fx->model, init_path);

    const double params = static_cast<double>(fx->model.num_params());
    const double matmul_params = params - static_cast<double>(mc.vocab * mc.hidden);  // not wte
    const double flops = 6.0 * matmul_params * static_cast<double>(B * T) +
                         12.0 * static_cast<double>(mc.layers * B * T * T * mc.attn_channels());
    std::printf(
        "bench_llama_step: %s, Llama L=%lld C=%lld NH=%lld KV=%lld F=%lld V=%lld %s, "
        "%.0f params, B=%lld T=%lld, %d threads, isa %s\n",
        config_path.c_str(), static_cast<long long>(mc.layers), static_cast<long long>(mc.hidden),
        static_cast<long long>(mc.heads), static_cast<long long>(mc.kv_head_count()),
        static_cast<long long>(mc.ffn), static_cast<long long>(mc.vocab),
        mc.tie_embeddings ? "tied" : "untied", params, static_cast<long long>(B),
        static_cast<long long>(T), threads, isa_name(isa));
    std::printf("step FLOPs: %.1f GFLOP (6 * non-embedding params * tokens + attention)\n",
                flops / 1e9);
    std::printf(
        "fp32 matmul (fast): %s; AdamW lr %g (constant), weight decay %g, betas %g %g, "
        "clip %g\n",
        ops::matmul_path(fast, Device::cpu, DType::f32).c_str(), tc.lr, tc.weight_decay, tc.beta1,
        tc.beta2, tc.grad_clip);

    // Results from the initial weights: determinism, fast against bitwise.
    int failures = 0;
    auto fail = [&](const std::string& what) {
        std::printf("FAIL: %s\n", what.c_str());
        failures++;
    };
    const double l0 = bw->loss(), l0r = bw->loss(), l0f = fx->loss();
    const double lnv = std::log(static_cast<double>(mc.vocab));
    if (l0 != l0r) fail("a bitwise forward repeated gives another loss");
    if (std::abs(l0 - l0f) > 1e-5 * l0) fail("fast's initial loss is beyond fp32 rounding");
    if (!(std::abs(l0 - lnv) < 0.5)) fail("the initial loss is not within 0.5 of ln V");
    std::printf(
        "check: initial loss bitwise %.7f (repeat identical) fast %.7f (|diff| %.2e), "
        "ln V %.4f\n",
        l0, l0f, std::abs(l0 - l0f), lnv);

    // The steps: a warm-up step each, then the modes in turn.
    std::vector<double> ms[2];  // bitwise, fast
    std::vector<double> peaks;
    fx->step();
    bw->step();
    fx->best.total = bw->best.total = 1e300;
    std::uint64_t digest2 = 0;  // the bitwise model's parameters after its second step
    auto timed = [&](StepRunner& r) {
        if (&r == fx.get()) peaks.push_back(bench::fp32_fma_peak_gflops(threads, isa));
        const double t = r.step();
        ms[&r == fx.get() ? 1 : 0].push_back(t);
        if (&r == bw.get() && r.t == 2) digest2 = r.params_digest();
        return t;
    };
    if (serve) {  // a driver sends "fast" or "bitwise" per step, then anything else to end
        std::printf("ready\n");
        std::fflush(stdout);
        char line[64];
        while (std::fgets(line, sizeof line, stdin) != nullptr) {
            const std::string cmd(line, std::strcspn(line, "\r\n"));
            if (cmd != "fast" && cmd != "bitwise") break;
            StepRunner& r = cmd == "fast" ? *fx : *bw;
            const double t = timed(r);
            std::printf("%.3f %.7f\n", t, r.losses.back());
            std::fflush(stdout);
        }
        if (ms[0].empty() || ms[1].empty()) {
            std::fprintf(stderr, "bench_llama_step: --serve ended before a step of each mode\n");
            return 2;
        }
    } else {
        for (int s = 0; s < steps; s++) {
            timed(*fx);
            timed(*bw);
        }
    }
    const double peak = *std::max_element(peaks.begin(), peaks.end());
    std::printf("fp32 FMA peak (measured, %d threads): %.1f GFLOP/s (median %.1f)\n", threads, peak,
                median(peaks));
    std::printf("%-14s %10s %10s %10s %8s   %s\n", "variant", "best ms", "median ms", "GFLOP/s",
                "%peak", "best step: forward / backward / clip+AdamW ms");
    for (const int k : {1, 0}) {
        const StepRunner& r = k == 1 ? *fx : *bw;
        const double best = *std::min_element(ms[k].begin(), ms[k].end());
        std::printf("%-14s %10.1f %10.1f %10.1f %7.1f%%   %.1f / %.1f / %.1f\n",
                    k == 1 ? "fp32 fast" : "fp32 bitwise", best, median(ms[k]), flops / best / 1e6,
                    100.0 * flops / best / 1e6 / peak, r.best.forward, r.best.backward,
                    r.best.optimizer);
    }
    std::printf("bitwise / fast throughput: %.3f (median), %.3f (best)\n",
                median(ms[1]) / median(ms[0]),
                *std::min_element(ms[1].begin(), ms[1].end()) /
                    *std::min_element(ms[0].begin(), ms[0].end()));
    for (const int k : {1, 0}) {
        const StepRunner& r = k == 1 ? *fx : *bw;
        std::printf("losses %s:", k == 1 ? "fast" : "bitwise");
        for (const double l : r.losses) std::printf(" %.7f", l);
        std::printf("\n");
        bool finite = true;
        for (const double l : r.losses) finite = finite && std::isfinite(l);
        if (!finite) fail(std::string(mode_name(r.model.numerics().mode)) + " loss not finite");
        if (!(r.losses.back() < r.losses.front()))
            fail(std::string(mode_name(r.model.numerics().mode)) + " loss does not fall");
    }
    for (const int k : {1, 0}) {
        std::printf("%s_ms:", k == 1 ? "fast" : "bitwise");
        for (const double v : ms[k]) std::printf(" %.3f", v);
        std::printf("\n");
    }
    std::printf(
        "summary: fast_best_ms=%.3f fast_median_ms=%.3f bitwise_best_ms=%.3f "
        "bitwise_median_ms=%.3f peak_gflops=%.1f\n",
        *std::min_element(ms[1].begin(), ms[1].end()), median(ms[1]),
        *std::min_element(ms[0].begin(), ms[0].end()), median(ms[0]), peak);
    const double fast_best = *std::min_element(ms[1].begin(), ms[1].end()),
                 bit_best = *std::min_element(ms[0].begin(), ms[0].end());
    const StepRunner::Phases fast_phases = fx->best, bit_phases = bw->best;
    const StepRunner::Cpu fast_cpu = fx->least_cpu, bit_cpu = bw->least_cpu;
    const std::vector<double> bw_losses = bw->losses;
    fx.reset();

    // A second bitwise model from the same weights: the same bits.
    {
        StepRunner again(mc, bitwise, tc, tokens, targets, B, T);
        again.step();
        again.step();
        const bool same =
            std::memcmp(again.losses.data(), bw_losses.data(), 2 * sizeof(double)) == 0;
        const bool same_params = again.params_digest() == digest2;
        if (!same || !same_params)
            fail("a second bitwise run from the same weights gives other bits");
        std::printf(
            "check: a second bitwise run: losses of steps 1-2 %s, parameters after step 2 "
            "%s\n",
            same ? "identical" : "DIFFER", same_params ? "identical" : "DIFFER");
    }
    bw.reset();

    if (shares) {
        const std::vector<Share> s = op_shares(mc, B, T, 3);
        std::printf(
            "where a step goes: each op alone on the step's shapes (best of 3) times its calls "
            "per step; ms of wall time, its share of the best step's wall time (%%wall) and of "
            "the least CPU time a step took (%%cpu: this process's, which a busy host disturbs "
            "less)\n");
        std::printf("%-11s %-18s %10s %7s %7s %12s %7s %7s\n", "group", "op", "fast ms", "%wall",
                    "%cpu", "bitwise ms", "%wall", "%cpu");
        const double step_ms[2] = {bit_best, fast_best};
        const double step_cpu[2] = {bit_cpu.total, fast_cpu.total};
        auto row = [&](const std::string& name, const double wall[2], const double cpu[2]) {
            std::printf("%-30s %10.1f %6.1f%% %6.1f%% %12.1f %6.1f%% %6.1f%%\n", name.c_str(),
                        wall[1], 100 * wall[1] / step_ms[1], 100 * cpu[1] / step_cpu[1], wall[0],
                        100 * wall[0] / step_ms[0], 100 * cpu[0] / step_cpu[0]);
        };
        double gw[3][2] = {}, gc[3][2] = {}, aw[2] = {}, ac[2] = {};
        const char* groups[3] = {"llama ops", "linears", "attention"};
        for (const Share& sh : s) {
            char name[64];
            std::snprintf(name, sizeof name, "%-11s %-18s", sh.group, sh.name);
            row(name, sh.wall, sh.cpu);
            for (int g = 0; g < 3; g++)
                if (std::strcmp(sh.group, groups[g]) == 0)
                    for (int k = 0; k < 2; k++) gw[g][k] += sh.wall[k], gc[g][k] += sh.cpu[k];
            for (int k = 0; k < 2; k++) aw[k] += sh.wall[k], ac[k] += sh.cpu[k];
        }
        for (int g = 0; g < 3; g++) row(std::string("total ") + groups[g], gw[g], gc[g]);
        const double ow[2] = {bit_phases.optimizer, fast_phases.optimizer},
                     oc[2] = {bit_cpu.optimizer, fast_cpu.optimizer};
        row("clip+AdamW (in the step)", ow, oc);
        const double rw[2] = {step_ms[0] - aw[0] - ow[0], step_ms[1] - aw[1] - ow[1]},
                     rc[2] = {step_cpu[0] - ac[0] - oc[0], step_cpu[1] - ac[1] - oc[1]};
        row("rest (embedding, loss, glue)", rw, rc);
        std::printf(
            "best step: fast %.1f ms wall / %.1f ms CPU, bitwise %.1f / %.1f (CPU: least "
            "of the steps)\n",
            step_ms[1], step_cpu[1], step_ms[0], step_cpu[0]);
        if (rw[0] < 0 || rw[1] < 0 || rc[0] < 0 || rc[1] < 0)
            std::printf(
                "(a negative rest: the ops alone took longer than inside a step, the host busier "
                "then; the shares are rough, rerun on a quiet host)\n");
    }
    std::printf(failures == 0 ? "checks passed\n" : "checks FAILED\n");
    return failures == 0 ? 0 : 1;
}
