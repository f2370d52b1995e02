// 16-bit activations (precision.activations = "bf16" or "fp16", kernels/cpu/bf16_backend.cpp):
// each op is the fp32 kernel on 16-bit inputs, with a matmul's weights rounded to the dtype and
// every activation it writes rounded once; training falls in loss, differs from fp32, and every
// layout (dp, ZeRO, pp, tp, sp) is bit-identical to the single device of its precision. fp16's
// dynamic loss scale (core/train/loss_scaler.h) backs off on an overflow planted from outside
// (step hooks), on every rank alike, grows back, and a resume goes on with it bit for bit.
#include "core/base/config.h"
#include "core/base/dtype.h"
#include "core/base/error.h"
#include "core/base/rng.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "core/io/checkpoint.h"
#include "core/model/fp8.h"
#include "core/io/state.h"
#include "core/train/checkpointing.h"
#include "kernels/ops.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <cstring>
#include <vector>

using namespace px;
using test::check_same_bits;
using test::series;
using test::single_device;

namespace {

// The 16-bit dtypes and their casts (core/base/dtype.h).
std::uint16_t narrow16(DType t, float x) {
    return t == DType::bf16 ? f32_to_bf16(x) : f32_to_f16(x);
}
float wide16(DType t, std::uint16_t h) {
    return t == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// n values N(0, 1) from the project's generator, stored as 16-bit bits and as their fp32 values.
struct Narrow {
    std::vector<std::uint16_t> bits;
    std::vector<float> wide;
};
Narrow narrow_normal(DType t, i64 n, std::uint64_t seed) {
    Narrow v;
    std::vector<float> x(static_cast<size_t>(n));
    fill_normal(x.data(), n, 0.0f, 1.0f, seed, 0, 0);
    for (float f : x) {
        v.bits.push_back(narrow16(t, f));
        v.wide.push_back(wide16(t, v.bits.back()));
    }
    return v;
}

std::vector<std::uint16_t> rounded(DType t, const std::vector<float>& x) {
    std::vector<std::uint16_t> out;
    for (float f : x) out.push_back(narrow16(t, f));
    return out;
}

}  // namespace

TEST_CASE("a 16-bit op (bf16, fp16) is the fp32 kernel on 16-bit inputs, rounded once", "[precision]") {
    for (const DType dt : {DType::bf16, DType::f16})
    for (Mode mode : {Mode::bitwise, Mode::fast}) {
        INFO(dtype_name(dt) << " " << mode_name(mode));
        auto view16 = [dt](std::vector<std::uint16_t>& v, std::initializer_list<i64> shape, const char* name) {
            return view_of(dt, v.data(), shape, name);
        };
        Numerics nx;
        nx.mode = mode;
        nx.block = 8;
        const i64 BT = 6, C = 24, OC = 10;
        Narrow inp = narrow_normal(dt, BT * C, 1);
        std::vector<float> w(static_cast<size_t>(OC * C)), b(static_cast<size_t>(OC));
        fill_normal(w.data(), OC * C, 0.0f, 0.3f, 2, 0, 0);
        fill_normal(b.data(), OC, 0.0f, 0.1f, 3, 0, 0);

        // matmul: the weights are rounded to the dtype (the cast point), products summed in fp32.
        std::vector<std::uint16_t> out(static_cast<size_t>(BT * OC));
        ops::matmul_forward(nx, view16(out, {BT, OC}, "out"), view16(inp.bits, {BT, C}, "inp"),
                            view_f32(w.data(), {OC, C}, "w"), nullptr);
        std::vector<float> w16(w), ref(static_cast<size_t>(BT * OC));
        for (float& x : w16) x = round_to(dt, x);
        ops::matmul_forward(nx, view_f32(ref.data(), {BT, OC}), view_f32(inp.wide.data(), {BT, C}),
                            view_f32(w16.data(), {OC, C}), nullptr);
        CHECK(out == rounded(dt, ref));
        // The weights were rounded: the fp32 weights give other products.
        std::vector<float> unrounded(ref.size());
        ops::matmul_forward(nx, view_f32(unrounded.data(), {BT, OC}),
                            view_f32(inp.wide.data(), {BT, C}), view_f32(w.data(), {OC, C}), nullptr);
        CHECK(ref != unrounded);

        // matmul backward: dinp in the dtype, dweight and dbias in fp32 from the 16-bit operands.
        Narrow dout = narrow_normal(dt, BT * OC, 4);
        std::vector<std::uint16_t> dinp(static_cast<size_t>(BT * C), 0);
        std::vector<float> dw(w.size(), 0.0f), db(b.size(), 0.0f);
        const Tensor dinp_t = view16(dinp, {BT, C}, "dinp");
        const Tensor dw_t = view_f32(dw.data(), {OC, C}, "dw"), db_t = view_f32(db.data(), {OC}, "db");
        ops::matmul_backward(nx, &dinp_t, &dw_t, &db_t, view16(dout.bits, {BT, OC}, "dout"),
                             view16(inp.bits, {BT, C}, "inp"), view_f32(w.data(), {OC, C}, "w"));
        std::vector<float> rdinp(dinp.size(), 0.0f), rdw(w.size(), 0.0f), rdb(b.size(), 0.0f);
        const Tensor rdinp_t = view_f32(rdinp.data(), {BT, C}), rdw_t = view_f32(rdw.data(), {OC, C}),
                     rdb_t = view_f32(rdb.data(), {OC});
        ops::matmul_backward(nx, &rdinp_t, &rdw_t, &rdb_t, view_f32(dout.wide.data(), {BT, OC}),
                             view_f32(inp.wide.data(), {BT, C}), view_f32(w16.data(), {OC, C}));
        CHECK(dinp == rounded(dt, rdinp));
        // dweight is fp32, so it shows the summation order. On a CPU with bf16 instructions fast
        // bf16 runs oneDNN's bf16 matmul (ops::matmul_path says "oneDNN"), another order over the
        // same products than sgemm's: there it is held to the fp32 bound of any order, n = BT + 1
        // roundings of Σ|products| (the += onto 0 included). Everywhere else, the same bits.
        const bool own_order = mode == Mode::fast && dt == DType::bf16 &&
                               ops::matmul_path(nx, Device::cpu, dt).rfind("oneDNN", 0) == 0;
        if (own_order) {
            const double u = std::ldexp(1.0, -24);
            for (i64 o = 0; o < OC; o++)
                for (i64 c = 0; c < C; c++) {
                    double mag = 0.0;
                    for (i64 t = 0; t < BT; t++)
                        mag += std::fabs(double(dout.wide[size_t(t * OC + o)]) *
                                         double(inp.wide[size_t(t * C + c)]));
                    const size_t k = size_t(o * C + c);
                    INFO("dweight[" << o << "][" << c << "]");
                    CHECK(std::fabs(double(dw[k]) - double(rdw[k])) <=
                          2.0 * double(BT + 1) * u * mag);
                }
        } else {
            CHECK(test::same_bits(dw, rdw));
        }
        CHECK(test::same_bits(db, rdb));

        // LayerNorm: 16-bit output, fp32 statistics.
        std::vector<float> g(static_cast<size_t>(C), 1.25f), beta(static_cast<size_t>(C), -0.5f);
        std::vector<std::uint16_t> ln(static_cast<size_t>(BT * C));
        std::vector<float> mean(static_cast<size_t>(BT)), rstd(static_cast<size_t>(BT));
        ops::layernorm_forward(nx, view16(ln, {BT, C}, "ln"), view_f32(mean.data(), {BT}, "mean"),
                               view_f32(rstd.data(), {BT}, "rstd"), view16(inp.bits, {BT, C}, "inp"),
                               view_f32(g.data(), {C}, "g"), view_f32(beta.data(), {C}, "b"));
        std::vector<float> rln(ln.size()), rmean(mean.size()), rrstd(rstd.size());
        ops::layernorm_forward(nx, view_f32(rln.data(), {BT, C}), view_f32(rmean.data(), {BT}),
                               view_f32(rrstd.data(), {BT}), view_f32(inp.wide.data(), {BT, C}),
                               view_f32(g.data(), {C}), view_f32(beta.data(), {C}));
        CHECK(ln == rounded(dt, rln));
        CHECK(test::same_bits(mean, rmean));
        CHECK(test::same_bits(rstd, rrstd));

        // GELU.
        std::vector<std::uint16_t> ge(inp.bits.size());
        ops::gelu_forward(nx, view16(ge, {BT * C}, "gelu"), view16(inp.bits, {BT * C}, "inp"));
        std::vector<float> rge(ge.size());
        ops::gelu_forward(nx, view_f32(rge.data(), {BT * C}), view_f32(inp.wide.data(), {BT * C}));
        CHECK(ge == rounded(dt, rge));
    }
}

namespace {
Config job_in(const char* activations) {
    Config c = test::small_job();
    c.precision.activations = activations;
    return c;
}
}  // namespace

TEST_CASE("training with 16-bit activations falls in loss and is not the fp32 run", "[precision]") {
    for (const char* act : {"bf16", "fp16"}) {
        INFO(act);
        Config c = job_in(act);
        c.train.steps = 8;
        const LogicalState narrow = single_device(c);
        c.precision.activations = "fp32";
        const LogicalState fp = single_device(c);
        const std::vector<double> ln = series(narrow, &StepMetrics::loss), lf = series(fp, &StepMetrics::loss);
        REQUIRE(ln.size() == 8);
        CHECK(ln.back() < ln.front() - 0.1);
        CHECK(ln != lf);  // the activations were rounded
        // The first step's loss is the same model on 16-bit activations: near the fp32 one.
        CHECK(std::abs(ln.front() - lf.front()) < 0.02 * lf.front());
        // fp16 at the default loss scale (2^16) skips no step: every grad norm is finite.
        for (double g : series(narrow, &StepMetrics::grad_norm)) CHECK(std::isfinite(g));
    }
}

TEST_CASE("16-bit layouts are bit-identical to the single device of their precision", "[precision]") {
    struct L {
        int dp, pp, zero, microbatches;
    };
    for (const char* act : {"bf16", "fp16"}) {
        const Config base = job_in(act);
        const LogicalState ref = single_device(base);
        for (const L l : {L{2, 1, 0, 0}, L{2, 1, 3, 2}, L{1, 2, 0, 2}, L{2, 2, 2, 0}}) {
            Config c = base;
            c.layout.dp = l.dp;
            c.layout.pp = l.pp;
            c.layout.zero = l.zero;
            c.layout.microbatches = l.microbatches;
            LogicalState got;
            bool agree = true;
            run_layout(c, {}, test::inspecting([&](Job& job) { agree = absorb(got, job) && agree; }));
            INFO(act << " dp" << l.dp << " pp" << l.pp << " zero" << l.zero << " mb" << l.microbatches);
            CHECK(agree);
            CHECK(got.complete());
            check_same_bits(ref, got);
        }
    }
}

TEST_CASE("16-bit activations under tensor parallelism are bit-identical to the single device", "[precision]") {
    // The tp layers widen 16-bit activations for their fp32 routines, round a matmul's weights to
    // the dtype and each output once: the single device's ops, split between ranks.
    struct L {
        int dp, tp, pp, zero;
        bool sp;
    };
    for (const char* act : {"bf16", "fp16"}) {
        const Config base = test::with_tp_shapes(job_in(act));
        const LogicalState ref = single_device(base);
        for (const L l : {L{1, 2, 1, 0, false}, L{1, 4, 1, 0, true}, L{2, 2, 1, 3, false},
                          L{1, 2, 2, 0, true}}) {
            Config c = base;
            c.layout.dp = l.dp;
            c.layout.tp = l.tp;
            c.layout.pp = l.pp;
            c.layout.zero = l.zero;
            c.layout.sequence_parallel = l.sp;
            if (l.pp > 1) c.layout.microbatches = 2;
            LogicalState got;
            bool agree = true;
            run_layout(c, {}, test::inspecting([&](Job& job) { agree = absorb(got, job) && agree; }));
            INFO(act << " dp" << l.dp << " tp" << l.tp << " pp" << l.pp << " zero" << l.zero
                     << (l.sp ? " +SP" : ""));
            CHECK(agree);
            CHECK(got.complete());
            check_same_bits(ref, got);
        }
    }
}

// ---- fp16's dynamic loss scale ---------------------------------------------------------------

namespace {

// fp16 with a small scale that moves fast: grows after 2 good steps, halves on an overflow.
Config scaled_job() {
    Config c = job_in("fp16");
    c.train.steps = 7;
    c.precision.loss_scale_init = 1024;
    c.precision.loss_scale_growth_interval = 2;
    c.precision.loss_scale_growth_factor = 2;
    c.precision.loss_scale_backoff_factor = 0.5;
    return c;
}

// What each rank saw after every step: the loss scale of the next step and its weights.
struct RankTrace {
    std::vector<float> scales;
    std::vector<std::vector<float>> params;
    std::vector<float> final_m;
};

int world_rank(const Job& job) {
    return (job.dp_rank() * job.tp_size() + job.tp_rank()) * job.pp_size() + job.pp_rank();
}

// Runs c with an infinity planted at step `bad` (0: none): into one element of rank
// `plant_rank`'s microbatch gradient (before any reduction) or, `after_reduce`, of its reduced
// gradient only (the other replicas' stay finite). Every rank's trace, by world rank.
std::vector<RankTrace> run_planted(const Config& c, i64 bad, int plant_rank, bool after_reduce,
                                   LogicalState* state = nullptr) {
    const int world = c.layout.dp * c.layout.pp * c.layout.tp;
    std::vector<RankTrace> traces(static_cast<size_t>(world));
    std::mutex mu;
    RunHooks hooks;
    hooks.setup = [&](Job& job) {
        const int rank = job.dp_rank();
        StepHooks h;
        if (after_reduce)
            h.grads = [=](i64 step, float* g) {
                if (step == bad && rank == plant_rank) g[5] = INFINITY;
            };
        else
            h.microbatch_grad = [=](i64 step, int microbatch, float* g, i64 lo, i64 hi) {
                if (step == bad && rank == plant_rank && microbatch == 0 && lo <= 5 && 5 < hi)
                    g[5] = INFINITY;
            };
        job.add_step_hooks(std::move(h));
    };
    hooks.each_step = [&](Job& job) {
        std::lock_guard<std::mutex> lock(mu);
        RankTrace& t = traces[static_cast<size_t>(world_rank(job))];
        t.scales.push_back(job.loss_scaler().scale());
        t.params.emplace_back(job.model().params(), job.model().params() + job.model().table().total);
    };
    hooks.inspect = [&](Job& job) {
        RankTrace& t = traces[static_cast<size_t>(world_rank(job))];
        t.final_m.assign(job.optimizer().m(), job.optimizer().m() + job.optimizer().size());
        if (state) absorb(*state, job);
    };
    run_layout(c, {}, hooks);
    return traces;
}

}  // namespace

TEST_CASE("fp16: the loss scaler backs off on an injected overflow, skips the step and grows back", "[precision]") {
    const Config c = scaled_job();
    const std::vector<RankTrace> clean = run_planted(c, 0, 0, false);
    const std::vector<RankTrace> hit = run_planted(c, 3, 0, false);
    // Good steps 1, 2: grows to 2048; step 3 overflows: 1024 and the count restarts; 4, 5 grow it
    // again; 6, 7 once more.
    CHECK(clean[0].scales == std::vector<float>{1024, 2048, 2048, 4096, 4096, 8192, 8192});
    CHECK(hit[0].scales == std::vector<float>{1024, 2048, 1024, 1024, 2048, 2048, 4096});
    // Step 3 was skipped: its weights are step 2's; the steps around it updated.
    CHECK(test::same_bits(hit[0].params[2], hit[0].params[1]));
    CHECK_FALSE(test::same_bits(hit[0].params[1], hit[0].params[0]));
    CHECK_FALSE(test::same_bits(hit[0].params[3], hit[0].params[2]));
    // Before the overflow the runs agree; after it they differ (the update of step 3 is missing).
    CHECK(test::same_bits(hit[0].params[1], clean[0].params[1]));
    CHECK_FALSE(test::same_bits(hit[0].params[6], clean[0].params[6]));
}

TEST_CASE("fp16: an overflow in one replica's gradient skips the step on every rank alike", "[precision]") {
    Config c = scaled_job();
    const std::vector<RankTrace> single = run_planted(c, 3, 0, false);
    c.layout.dp = 2;
    // Planted after the reduction, in replica 1 only: replica 0's gradient is finite, yet the
    // decision is reduced over the ranks, so both skip step 3 and keep one scale.
    const std::vector<RankTrace> dp = run_planted(c, 3, 1, true);
    for (const RankTrace& t : dp) {
        CHECK(t.scales == single[0].scales);
        CHECK(test::same_bits(t.params[2], t.params[1]));
        CHECK(test::same_bits(t.params.back(), single[0].params.back()));
        CHECK(test::same_bits(t.final_m, single[0].final_m));
    }
    // Under ZeRO-2 the overflow, planted before the reduction in replica 1, lands in replica 0's
    // gradient shard only: the same skip, the same bits as the single device.
    c.layout.zero = 2;
    LogicalState got;
    const std::vector<RankTrace> z2 = run_planted(c, 3, 1, false, &got);
    LogicalState ref;
    c.layout.dp = 1;
    c.layout.zero = 0;
    run_planted(c, 3, 0, false, &ref);
    for (const RankTrace& t : z2) CHECK(t.scales == single[0].scales);
    check_same_bits(ref, got);
}

TEST_CASE("fp16: a resume goes on with the checkpoint's loss scale, bit for bit", "[precision]") {
    Config c = test::with_tp_shapes(scaled_job());
    c.train.steps = 6;
    c.layout.dp = 2;
    const std::string dir = test::temp_dir("fp16_resume");
    c.checkpoint.dir = dir;
    c.checkpoint.every = 3;
    LogicalState whole;
    const std::vector<RankTrace> ref = run_planted(c, 2, 0, false, &whole);
    {
        // After step 3: step 2 overflowed (1024 -> 512), step 3 was good (one step counted).
        const CheckpointReader file(checkpoint_path(dir, 3));
        CHECK(file.meta().loss_scale == 512.0);
        CHECK(file.meta().growth_tracker == 1);
        CHECK(file.meta().loss_scale_dynamic);
    }
    // Resumed under another layout (tp2) from step 3: the scale goes on from 512, and the run
    // ends in the uninterrupted run's bits.
    Config r = c;
    r.checkpoint.dir = test::temp_dir("fp16_resume_2");
    r.checkpoint.resume = checkpoint_path(dir, 3);
    r.layout.dp = 1;
    r.layout.tp = 2;
    LogicalState resumed;
    const std::vector<RankTrace> got = run_planted(r, 0, 0, false, &resumed);
    REQUIRE(got[0].scales.size() == 3);
    CHECK(std::vector<float>(ref[0].scales.begin() + 3, ref[0].scales.end()) == got[0].scales);
    CHECK(got[1].scales == got[0].scales);
    check_same_bits(whole, resumed);
}

// ---- fp8 with delayed scaling ----------------------------------------------------------------

namespace {

// fp8 delayed over bf16 activations, every block's linears in fp8 (the small job has two blocks,
// both ends), a short history so the scales move within a few steps.
Config fp8_job() {
    Config c = job_in("bf16");
    c.precision.fp8 = "delayed";
    c.precision.fp8_keep_ends_bf16 = false;
    c.precision.fp8_amax_history_len = 4;
    return c;
}

}  // namespace

TEST_CASE("fp8 delayed: training falls in loss, is not the bf16 run, and the scales move", "[precision]") {
    Config c = fp8_job();
    c.train.steps = 8;
    std::vector<float> scales;
    LogicalState fp8;
    run_layout(c, {}, test::inspecting([&](Job& job) {
                   absorb(fp8, job);
                   REQUIRE(job.fp8() != nullptr);
                   CHECK(job.fp8()->gemms() == 8);  // 4 linears x 2 blocks
                   scales = job.fp8()->state();
               }));
    c.precision.fp8 = "off";
    const LogicalState bf = single_device(c);
    const std::vector<double> l8 = series(fp8, &StepMetrics::loss), lb = series(bf, &StepMetrics::loss);
    REQUIRE(l8.size() == 8);
    CHECK(l8.back() < l8.front() - 0.1);
    CHECK(l8 != lb);
    CHECK(std::abs(l8.front() - lb.front()) < 0.05 * lb.front());
    // Every scale left 1: X and W near 448 / amax, dY (tiny gradients) far above 1.
    for (int k = 0; k < 8 * 3; k++) CHECK(scales[static_cast<size_t>(k)] != 1.0f);
    for (int g = 0; g < 8; g++) CHECK(scales[static_cast<size_t>(g * 3 + 2)] > 1000.0f);
}

TEST_CASE("fp8 delayed and block: layouts are bit-identical to the fp8 single device", "[precision]") {
    struct L {
        int dp, tp, pp, zero, microbatches;
        bool sp;
    };
    for (const char* recipe : {"delayed", "block"}) {
    Config base = test::with_tp_shapes(fp8_job());
    base.precision.fp8 = recipe;
    base.precision.fp8_block_size = 16;  // tp4's shares of hidden 64 and ffn 128: whole tiles
    LogicalState ref;
    std::vector<float> ref_fp8;
    run_layout(base, {}, test::inspecting([&](Job& job) {
                   absorb(ref, job);
                   ref_fp8 = job.fp8()->state();
               }));
    for (const L l : {L{2, 1, 1, 0, 0, false}, L{2, 1, 1, 3, 2, false}, L{1, 1, 2, 0, 2, false},
                      L{2, 1, 2, 2, 0, false}, L{1, 2, 1, 0, 0, false}, L{1, 4, 1, 0, 0, true},
                      L{2, 2, 1, 3, 0, false}, L{1, 2, 2, 0, 2, true}}) {
        Config c = base;
        c.layout.dp = l.dp;
        c.layout.tp = l.tp;
        c.layout.pp = l.pp;
        c.layout.zero = l.zero;
        c.layout.microbatches = l.microbatches;
        c.layout.sequence_parallel = l.sp;
        LogicalState got;
        bool agree = true;
        std::vector<std::vector<float>> states;
        run_layout(c, {}, test::inspecting([&](Job& job) {
                       agree = absorb(got, job) && agree;
                       states.push_back(job.fp8()->state());
                   }));
        INFO(recipe << " dp" << l.dp << " tp" << l.tp << " pp" << l.pp << " zero" << l.zero << " mb"
                  << l.microbatches << (l.sp ? " +SP" : ""));
        CHECK(agree);
        CHECK(got.complete());
        check_same_bits(ref, got);
        for (const auto& s : states) CHECK(test::same_bits(s, ref_fp8));  // scales, histories
    }
    }
}

TEST_CASE("fp8_layers and fp8_lm_head: the chosen matmuls run in fp8, bit-identical under tp2 and pp2", "[precision]") {
    Config base = test::with_tp_shapes(fp8_job());
    base.model.layers = 4;
    base.precision.fp8_keep_ends_bf16 = true;
    base.precision.fp8_layers = "0,2";  // not the default's middle blocks 1-2
    base.precision.fp8_lm_head = true;
    base.precision.fp8_block_size = 16;
    const Fp8Scaling f(base.model, base.precision);
    REQUIRE(f.gemms() == 9);  // 4 linears of blocks 0 and 2, and the LM head
    CHECK(f.gemm(0).name == "h.0.attn.c_attn");
    CHECK(f.gemm(1).name == "h.0.attn.c_proj");
    CHECK(f.gemm(2).name == "h.0.mlp.c_fc");
    CHECK(f.gemm(3).name == "h.0.mlp.c_proj");
    CHECK(f.gemm(4).layer == 2);
    CHECK(f.gemm(8).name == "lm_head");
    CHECK(f.gemm(8).kind == Fp8Gemm::lm_head);
    CHECK(f.head_gemm() == 8);
    const ParamTable t = ParamTable::build(base.model);
    CHECK(f.gemm_of(t.entries[static_cast<size_t>(t.layer_index(1, QKVW))].id) == -1);
    CHECK(f.gemm_of(t.entries[static_cast<size_t>(t.layer_index(2, FCW))].id) == 6);
    CHECK(f.gemm_of(t.entries[static_cast<size_t>(t.wte)].id) == -1);  // the embedding: a lookup

    for (const char* recipe : {"delayed", "block"}) {
        Config c = base;
        c.precision.fp8 = recipe;
        LogicalState ref;
        std::vector<float> ref_fp8;
        run_layout(c, {}, test::inspecting([&](Job& job) {
                       absorb(ref, job);
                       ref_fp8 = job.fp8()->state();
                   }));
        if (c.precision.fp8 == "delayed") {  // every matmul's scales moved, the head's included
            REQUIRE(ref_fp8.size() > 9 * 3);
            for (int k = 0; k < 9 * 3; k++) CHECK(ref_fp8[static_cast<size_t>(k)] != 1.0f);
        }
        // The LM head in fp8 changes the run (it is not the bf16 head under another name).
        Config bf_head = c;
        bf_head.precision.fp8_lm_head = false;
        const LogicalState other = single_device(bf_head);
        CHECK_FALSE(test::same_bits(series(ref, &StepMetrics::loss), series(other, &StepMetrics::loss)));
        struct L {
            int tp, pp, microbatches;
            bool sp;
        };
        for (const L l : {L{2, 1, 0, false}, L{2, 1, 2, true}, L{1, 2, 2, false}, L{2, 2, 0, false}}) {
            Config lc = c;
            lc.layout.tp = l.tp;
            lc.layout.pp = l.pp;
            lc.layout.microbatches = l.microbatches;
            lc.layout.sequence_parallel = l.sp;
            INFO(recipe << " tp" << l.tp << " pp" << l.pp << " mb" << l.microbatches << (l.sp ? " +SP" : ""));
            if (c.precision.fp8 == "block" && l.tp > 1) {  // the vocabulary's pieces may cut tiles
                CHECK_THAT(test::error_of<ConfigError>([&] { run_layout(lc); }),
                           Catch::Contains("precision.fp8_lm_head = true with precision.fp8 = \"block\" "
                                           "under layout.tp = 2"));
                continue;
            }
            LogicalState got;
            bool agree = true;
            std::vector<std::vector<float>> states;
            run_layout(lc, {}, test::inspecting([&](Job& job) {
                           agree = absorb(got, job) && agree;
                           states.push_back(job.fp8()->state());
                       }));
            CHECK(agree);
            CHECK(got.complete());
            check_same_bits(ref, got);
            for (const auto& st : states) CHECK(test::same_bits(st, ref_fp8));
        }
    }
}

TEST_CASE("fp8 delayed: casts and the scale update follow Transformer Engine's definition", "[precision]") {
    Config c = fp8_job();
    c.model.layers = 3;
    c.precision.fp8_keep_ends_bf16 = true;  // only the middle block's 4 linears
    c.precision.fp8_amax_history_len = 3;
    c.precision.fp8_margin = 1;
    Fp8Scaling f(c.model, c.precision);
    REQUIRE(f.gemms() == 4);
    const ParamTable t = ParamTable::build(c.model);
    CHECK(f.gemm_of(t.entries[static_cast<size_t>(t.layer_index(0, QKVW))].id) == -1);
    CHECK(f.gemm_of(t.entries[static_cast<size_t>(t.layer_index(1, QKVW))].id) == 0);
    CHECK(f.gemm_of(t.entries[static_cast<size_t>(t.layer_index(1, FCPROJW))].id) == 3);
    CHECK(f.gemm_of(t.entries[static_cast<size_t>(t.layer_index(1, QKVB))].id) == -1);
    CHECK(f.gemm_of(t.entries[static_cast<size_t>(t.layer_index(2, FCW))].id) == -1);
    CHECK(f.gemm_of(t.entries[static_cast<size_t>(t.wte)].id) == -1);  // the LM head: bf16

    // A cast: q = fp8(x * scale), read back as q * (1 / scale); amax recorded when asked.
    std::vector<float> x = {0.5f, -3.0f, 1000.0f, 1e-9f, -0.0f, 7.25f};
    std::vector<float> out(x.size());
    f.begin_step();
    f.cast(0, Fp8Scaling::x, view_f32(x.data(), {6}, "x"), out.data(), true);
    for (size_t i = 0; i < x.size(); i++)
        CHECK(std::bit_cast<std::uint32_t>(out[i]) ==
              std::bit_cast<std::uint32_t>(e4m3_to_f32(f32_to_e4m3(x[i] * 1.0f)) * 1.0f));
    CHECK(out[2] == 448.0f);  // saturated
    CHECK(out[3] == 0.0f);    // underflowed
    f.cast(0, Fp8Scaling::dy, view_f32(x.data(), {6}, "dy"), out.data(), false);
    CHECK(out[2] == 1024.0f);  // e5m2: 1000 rounds to 1024
    CHECK(f.step_amax()[0 * 3 + Fp8Scaling::x] == 1000.0f);
    CHECK(f.step_amax()[0 * 3 + Fp8Scaling::dy] == 0.0f);  // not recorded

    // Updates: scale = fp8_max / amax / 2^margin from the max of the history (newest first).
    auto step = [&](float ax, float ady) {
        f.begin_step();
        f.step_amax()[0] = ax;
        f.step_amax()[2] = ady;
        f.update();
    };
    step(1000.0f, 0.5f);
    CHECK(f.scale(0, Fp8Scaling::x) == 448.0f / 1000.0f / 2.0f);
    CHECK(f.scale(0, Fp8Scaling::dy) == 57344.0f / 0.5f / 2.0f);
    CHECK(f.scale(0, Fp8Scaling::w) == 1.0f);  // amax 0: the scale is kept
    CHECK(f.scale(1, Fp8Scaling::x) == 1.0f);
    step(10.0f, 0.25f);  // the history still holds 1000
    CHECK(f.scale(0, Fp8Scaling::x) == 448.0f / 1000.0f / 2.0f);
    step(10.0f, 0.25f);
    step(10.0f, 0.25f);  // 1000 left the history of 3
    CHECK(f.scale(0, Fp8Scaling::x) == 448.0f / 10.0f / 2.0f);
    const float kept = f.scale(0, Fp8Scaling::x);
    step(INFINITY, 0.25f);  // an overflow keeps the scale while it is in the history
    CHECK(f.scale(0, Fp8Scaling::x) == kept);
    // most_recent: only the newest amax counts.
    c.precision.fp8_amax_compute_algo = "most_recent";
    Fp8Scaling g(c.model, c.precision);
    g.begin_step();
    g.step_amax()[0] = 1000.0f;
    g.update();
    g.begin_step();
    g.step_amax()[0] = 10.0f;
    g.update();
    CHECK(g.scale(0, Fp8Scaling::x) == 448.0f / 10.0f / 2.0f);
    // State round trip.
    Fp8Scaling h(c.model, c.precision);
    h.restore(f.state());
    CHECK(test::same_bits(h.state(), f.state()));
}

TEST_CASE("fp8 block: tiles and blocks of their own scales; training; shares that cut a tile are refused", "[precision]") {
    Config c = fp8_job();
    c.precision.fp8 = "block";
    c.precision.fp8_block_size = 4;
    Fp8Scaling f(c.model, c.precision);
    CHECK_FALSE(f.delayed());
    CHECK(f.state().empty());
    // An activation (2, 6): tiles [0,4) and [4,6) of each row, each scaled by 448 / its amax.
    std::vector<float> x = {1.0f, -2.0f, 0.1f, 0.3f, 1000.0f, 3.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1e-3f, -1e-4f};
    std::vector<float> out(x.size());
    f.cast(0, Fp8Scaling::x, view_f32(x.data(), {2, 6}, "x"), out.data(), true);
    auto tile = [](const std::vector<float>& v, std::vector<size_t> idx) {
        float amax = 0.0f;
        for (size_t i : idx) amax = std::max(amax, std::fabs(v[i]));
        std::vector<float> r;
        const float s = amax > 0.0f ? 448.0f / amax : 1.0f, inv = 1.0f / s;
        for (size_t i : idx) r.push_back(e4m3_to_f32(f32_to_e4m3(v[i] * s)) * inv);
        return r;
    };
    std::vector<float> want;
    for (const auto& idx : std::vector<std::vector<size_t>>{{0, 1, 2, 3}, {4, 5}, {6, 7, 8, 9}, {10, 11}}) {
        const std::vector<float> t = tile(x, idx);
        want.insert(want.end(), t.begin(), t.end());
    }
    CHECK(test::same_bits(out, want));
    CHECK(std::abs(out[4] - 1000.0f) <= 1e-4f);  // each tile's amax maps to 448: no saturation
    // A weight (6, 6): blocks of 4 x 4, 4 x 2, 2 x 4, 2 x 2.
    std::vector<float> w(36);
    for (size_t i = 0; i < w.size(); i++) w[i] = std::sin(static_cast<float>(i)) * static_cast<float>(1 + i % 7);
    std::vector<float> wq(w.size());
    f.cast(0, Fp8Scaling::w, view_f32(w.data(), {6, 6}, "w"), wq.data(), true);
    for (int br : {0, 1})
        for (int bc : {0, 1}) {
            std::vector<size_t> idx;
            for (size_t i = static_cast<size_t>(br) * 4; i < std::min<size_t>(6, br * 4 + 4); i++)
                for (size_t j = static_cast<size_t>(bc) * 4; j < std::min<size_t>(6, bc * 4 + 4); j++)
                    idx.push_back(i * 6 + j);
            const std::vector<float> t = tile(w, idx);
            for (size_t k = 0; k < idx.size(); k++) CHECK(std::bit_cast<std::uint32_t>(wq[idx[k]]) == std::bit_cast<std::uint32_t>(t[k]));
        }

    // Training falls in loss and is neither the bf16 nor the delayed run.
    c.train.steps = 8;
    c.precision.fp8_block_size = 16;
    const LogicalState blk = single_device(c);
    const std::vector<double> lb = series(blk, &StepMetrics::loss);
    CHECK(lb.back() < lb.front() - 0.1);
    c.precision.fp8 = "delayed";
    CHECK(series(single_device(c), &StepMetrics::loss) != lb);

    // tp2 with hidden 32: shares of 16 are not whole tiles of 12.
    Config bad = fp8_job();
    bad.precision.fp8 = "block";
    bad.precision.fp8_block_size = 12;
    bad.layout.tp = 2;
    bad.numerics.block = 8;
    CHECK_THAT(test::error_of<std::exception>([&] { run_layout(bad); }),
               Catch::Contains("precision.fp8_block_size = 12") && Catch::Contains("layout.tp = 2"));
}

TEST_CASE("fp8: a resume continues bit for bit, delayed scales and histories from the file", "[precision]") {
    for (const char* recipe : {"delayed", "block"}) {
        INFO(recipe);
        const bool delayed = std::string(recipe) == "delayed";
        Config c = test::with_tp_shapes(fp8_job());
        c.precision.fp8 = recipe;
        c.precision.fp8_block_size = 16;
        c.train.steps = 6;
        c.layout.dp = 2;
        const std::string dir = test::temp_dir("fp8_resume");
        c.checkpoint.dir = dir;
        c.checkpoint.every = 3;
        LogicalState whole;
        std::vector<float> whole_fp8;
        run_layout(c, {}, test::inspecting([&](Job& job) {
                       absorb(whole, job);
                       whole_fp8 = job.fp8()->state();
                   }));
        {
            const CheckpointReader file(checkpoint_path(dir, 3));
            CHECK(file.meta().fp8_gemms == (delayed ? 8 : 0));  // block scaling keeps no state
            CHECK(file.meta().fp8_history_len == (delayed ? 4 : 0));
            file.verify_all();
        }
        // Resumed from step 3 under tp2·pp2: the same bits at the end, scales and histories too.
        Config r = c;
        r.checkpoint.dir = test::temp_dir("fp8_resume_2");
        r.checkpoint.resume = checkpoint_path(dir, 3);
        r.layout.dp = 1;
        r.layout.tp = 2;
        r.layout.pp = 2;
        r.layout.microbatches = 2;
        LogicalState resumed;
        std::vector<float> resumed_fp8;
        run_layout(r, {}, test::inspecting([&](Job& job) {
                       absorb(resumed, job);
                       resumed_fp8 = job.fp8()->state();
                   }));
        check_same_bits(whole, resumed);
        CHECK(test::same_bits(whole_fp8, resumed_fp8));
        if (!delayed) continue;
        // Another history length is refused by name.
        Config other = r;
        other.precision.fp8_amax_history_len = 5;
        other.checkpoint.dir = test::temp_dir("fp8_resume_3");
        CHECK_THAT(test::error_of<std::exception>([&] { run_layout(other); }),
                   Catch::Contains("precision.fp8_amax_history_len"));
    }
}

TEST_CASE("fp16 and fp8: a step the replica check re-runs restores the loss scale and the fp8 state", "[precision]") {
    // A bit of one replica's reduced gradient flips at step 3 (transient); the check (every
    // step) finds it and re-runs the step from the snapshot, which holds the loss scale and the
    // fp8 scales and histories: the run ends as the run without the flip, those states included.
    Config f16 = scaled_job();
    Config f8 = fp8_job();
    for (Config c : {f16, f8}) {
        c.train.steps = 5;
        c.layout.dp = 2;
        c.validate.replica_check_every = 1;
        auto run_states = [&](const Config& cfg, LogicalState& s) {
            std::vector<float> extra;
            run_layout(cfg, {}, test::inspecting([&](Job& job) {
                           absorb(s, job);
                           extra = job.fp8() ? job.fp8()->state() : std::vector<float>{};
                           extra.push_back(job.loss_scaler().scale());
                           extra.push_back(static_cast<float>(job.loss_scaler().state().growth_tracker));
                       }));
            return extra;
        };
        LogicalState clean, hit;
        const std::vector<float> clean_extra = run_states(c, clean);
        Config f = c;
        f.fault.kind = "flip_grad";
        f.fault.rank = 1;
        f.fault.step = 3;
        f.fault.tensor = "h.0.mlp.c_fc.weight";
        f.fault.element = 7;
        const std::vector<float> hit_extra = run_states(f, hit);
        INFO(c.precision.activations << " fp8 " << c.precision.fp8);
        check_same_bits(clean, hit);
        CHECK(test::same_bits(clean_extra, hit_extra));
    }
}
