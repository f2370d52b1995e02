// bf16 activations (precision.activations = "bf16", kernels/cpu/bf16_backend.cpp): each op is
// the fp32 kernel on bf16 inputs, with a matmul's weights rounded to bf16 and every activation
// it writes rounded once; training in bf16 falls in loss, differs from fp32, and every layout
// (dp, ZeRO, pp, tp, sp) is bit-identical to the bf16 single device.
#include "core/base/config.h"
#include "core/base/dtype.h"
#include "core/base/error.h"
#include "core/base/rng.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "core/io/state.h"
#include "kernels/ops.h"
#include "tests/test_util.h"

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

using namespace px;
using test::check_same_bits;
using test::series;
using test::single_device;

namespace {

// n values N(0, 1) from the project's generator, stored as bf16 bits and as their fp32 values.
struct Bf16Values {
    std::vector<std::uint16_t> bits;
    std::vector<float> wide;
};
Bf16Values bf16_normal(i64 n, std::uint64_t seed) {
    Bf16Values v;
    std::vector<float> x(static_cast<size_t>(n));
    fill_normal(x.data(), n, 0.0f, 1.0f, seed, 0, 0);
    for (float f : x) {
        v.bits.push_back(f32_to_bf16(f));
        v.wide.push_back(bf16_to_f32(v.bits.back()));
    }
    return v;
}

std::vector<std::uint16_t> rounded(const std::vector<float>& x) {
    std::vector<std::uint16_t> out;
    for (float f : x) out.push_back(f32_to_bf16(f));
    return out;
}

Tensor bf16_view(std::vector<std::uint16_t>& v, std::initializer_list<i64> shape, const char* name) {
    return view_of(DType::bf16, v.data(), shape, name);
}

}  // namespace

TEST_CASE("a bf16 op is the fp32 kernel on bf16 inputs, rounded once", "[precision]") {
    for (Mode mode : {Mode::bitwise, Mode::fast}) {
        Numerics nx;
        nx.mode = mode;
        nx.block = 8;
        const i64 BT = 6, C = 24, OC = 10;
        Bf16Values inp = bf16_normal(BT * C, 1);
        std::vector<float> w(static_cast<size_t>(OC * C)), b(static_cast<size_t>(OC));
        fill_normal(w.data(), OC * C, 0.0f, 0.3f, 2, 0, 0);
        fill_normal(b.data(), OC, 0.0f, 0.1f, 3, 0, 0);

        // matmul: the weights are rounded to bf16 (the cast point), products summed in fp32.
        std::vector<std::uint16_t> out(static_cast<size_t>(BT * OC));
        ops::matmul_forward(nx, bf16_view(out, {BT, OC}, "out"), bf16_view(inp.bits, {BT, C}, "inp"),
                            view_f32(w.data(), {OC, C}, "w"), nullptr);
        std::vector<float> w16(w), ref(static_cast<size_t>(BT * OC));
        for (float& x : w16) x = round_to(DType::bf16, x);
        ops::matmul_forward(nx, view_f32(ref.data(), {BT, OC}), view_f32(inp.wide.data(), {BT, C}),
                            view_f32(w16.data(), {OC, C}), nullptr);
        CHECK(out == rounded(ref));
        // The weights were rounded: the fp32 weights give other products.
        std::vector<float> unrounded(ref.size());
        ops::matmul_forward(nx, view_f32(unrounded.data(), {BT, OC}),
                            view_f32(inp.wide.data(), {BT, C}), view_f32(w.data(), {OC, C}), nullptr);
        CHECK(ref != unrounded);

        // matmul backward: dinp in bf16, dweight and dbias in fp32 from the bf16 operands.
        Bf16Values dout = bf16_normal(BT * OC, 4);
        std::vector<std::uint16_t> dinp(static_cast<size_t>(BT * C), 0);
        std::vector<float> dw(w.size(), 0.0f), db(b.size(), 0.0f);
        const Tensor dinp_t = bf16_view(dinp, {BT, C}, "dinp");
        const Tensor dw_t = view_f32(dw.data(), {OC, C}, "dw"), db_t = view_f32(db.data(), {OC}, "db");
        ops::matmul_backward(nx, &dinp_t, &dw_t, &db_t, bf16_view(dout.bits, {BT, OC}, "dout"),
                             bf16_view(inp.bits, {BT, C}, "inp"), view_f32(w.data(), {OC, C}, "w"));
        std::vector<float> rdinp(dinp.size(), 0.0f), rdw(w.size(), 0.0f), rdb(b.size(), 0.0f);
        const Tensor rdinp_t = view_f32(rdinp.data(), {BT, C}), rdw_t = view_f32(rdw.data(), {OC, C}),
                     rdb_t = view_f32(rdb.data(), {OC});
        ops::matmul_backward(nx, &rdinp_t, &rdw_t, &rdb_t, view_f32(dout.wide.data(), {BT, OC}),
                             view_f32(inp.wide.data(), {BT, C}), view_f32(w16.data(), {OC, C}));
        CHECK(dinp == rounded(rdinp));
        CHECK(test::same_bits(dw, rdw));
        CHECK(test::same_bits(db, rdb));

        // LayerNorm: bf16 output, fp32 statistics.
        std::vector<float> g(static_cast<size_t>(C), 1.25f), beta(static_cast<size_t>(C), -0.5f);
        std::vector<std::uint16_t> ln(static_cast<size_t>(BT * C));
        std::vector<float> mean(static_cast<size_t>(BT)), rstd(static_cast<size_t>(BT));
        ops::layernorm_forward(nx, bf16_view(ln, {BT, C}, "ln"), view_f32(mean.data(), {BT}, "mean"),
                               view_f32(rstd.data(), {BT}, "rstd"), bf16_view(inp.bits, {BT, C}, "inp"),
                               view_f32(g.data(), {C}, "g"), view_f32(beta.data(), {C}, "b"));
        std::vector<float> rln(ln.size()), rmean(mean.size()), rrstd(rstd.size());
        ops::layernorm_forward(nx, view_f32(rln.data(), {BT, C}), view_f32(rmean.data(), {BT}),
                               view_f32(rrstd.data(), {BT}), view_f32(inp.wide.data(), {BT, C}),
                               view_f32(g.data(), {C}), view_f32(beta.data(), {C}));
        CHECK(ln == rounded(rln));
        CHECK(test::same_bits(mean, rmean));
        CHECK(test::same_bits(rstd, rrstd));

        // GELU.
        std::vector<std::uint16_t> ge(inp.bits.size());
        ops::gelu_forward(nx, bf16_view(ge, {BT * C}, "gelu"), bf16_view(inp.bits, {BT * C}, "inp"));
        std::vector<float> rge(ge.size());
        ops::gelu_forward(nx, view_f32(rge.data(), {BT * C}), view_f32(inp.wide.data(), {BT * C}));
        CHECK(ge == rounded(rge));
    }
}

namespace {
Config bf16_job() {
    Config c = test::small_job();
    c.precision.activations = "bf16";
    return c;
}
}  // namespace

TEST_CASE("training with bf16 activations falls in loss and is not the fp32 run", "[precision]") {
    Config c = bf16_job();
    c.train.steps = 8;
    const LogicalState bf = single_device(c);
    c.precision.activations = "fp32";
    const LogicalState fp = single_device(c);
    const std::vector<double> lb = series(bf, &StepMetrics::loss), lf = series(fp, &StepMetrics::loss);
    REQUIRE(lb.size() == 8);
    CHECK(lb.back() < lb.front() - 0.1);
    CHECK(lb != lf);  // the activations were rounded
    // The first step's loss is the same model on bf16 activations: near the fp32 one.
    CHECK(std::abs(lb.front() - lf.front()) < 0.02 * lf.front());
}

TEST_CASE("bf16 layouts are bit-identical to the bf16 single device", "[precision]") {
    const Config base = bf16_job();
    const LogicalState ref = single_device(base);
    struct L {
        int dp, pp, zero, microbatches;
    };
    for (const L l : {L{2, 1, 0, 0}, L{2, 1, 3, 2}, L{1, 2, 0, 2}, L{2, 2, 2, 0}}) {
        Config c = base;
        c.layout.dp = l.dp;
        c.layout.pp = l.pp;
        c.layout.zero = l.zero;
        c.layout.microbatches = l.microbatches;
        LogicalState got;
        bool agree = true;
        run_layout(c, {}, test::inspecting([&](Job& job) { agree = absorb(got, job) && agree; }));
        INFO("dp" << l.dp << " pp" << l.pp << " zero" << l.zero << " mb" << l.microbatches);
        CHECK(agree);
        CHECK(got.complete());
        check_same_bits(ref, got);
    }
}

TEST_CASE("bf16 under tensor parallelism is bit-identical to the bf16 single device", "[precision]") {
    // The tp layers widen bf16 activations for their fp32 routines, round a matmul's weights to
    // bf16 and each output once: the single device's bf16 ops, split between ranks.
    const Config base = test::with_tp_shapes(bf16_job());
    const LogicalState ref = single_device(base);
    struct L {
        int dp, tp, pp, zero;
        bool sp;
    };
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
        INFO("dp" << l.dp << " tp" << l.tp << " pp" << l.pp << " zero" << l.zero << (l.sp ? " +SP" : ""));
        CHECK(agree);
        CHECK(got.complete());
        check_same_bits(ref, got);
    }
}
