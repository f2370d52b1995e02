// Mixed precision in fast mode, and the kernels both modes share:
//   (a) the vectorised casts (kernels/cpu/convert.h: bf16, fp8 fake quantisation) give the bits
//       of core/base/dtype.h's scalar casts, on every exponent, rounding boundary and special;
//   (b) fast bf16 matmuls (kernels/cpu/matmul_bf16.h), on both paths (oneDNN's bf16 primitive and
//       sgemm), equal a plainly written reference bit for bit when every sum is exact in fp32,
//       so the bf16 contract's cast points (weights rounded to bf16, each output rounded once,
//       nearest even) are checked without a tolerance; and the path report says what ran;
//   (c) fast-mode training in bf16 and fp8, whose fp8 casts are the bitwise mode's casts;
//   (d) precision.fp8_accumulator_promote: Hopper's narrow FP8 accumulator emulated in bitwise
//       mode, bit-identical in every layout, and its config checks.
#include "core/base/config.h"
#include "core/base/dtype.h"
#include "core/base/error.h"
#include "core/base/rng.h"
#include "core/io/state.h"
#include "core/model/fp8.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "kernels/cpu/casts.h"
#include "kernels/cpu/matmul_bf16.h"
#include "kernels/ops.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using namespace px;

namespace {

std::uint32_t bits(float x) {
    return std::bit_cast<std::uint32_t>(x);
}
float from_bits(std::uint32_t b) {
    return std::bit_cast<float>(b);
}

// Floats that cover every exponent and sign with varied mantissas (every 251st bit pattern), the
// specials, and values at and next to the rounding boundaries of bf16, e4m3 and e5m2.
std::vector<float> cast_inputs() {
    std::vector<float> v;
    for (std::uint64_t b = 0; b < (1ull << 32); b += 251)
        v.push_back(from_bits(static_cast<std::uint32_t>(b)));
    for (std::uint32_t hi = 0; hi < 0x10000u; hi++)  // bf16: just below, at and above each midpoint
        for (std::uint32_t lo : {0x7FFFu, 0x8000u, 0x8001u}) v.push_back(from_bits(hi << 16 | lo));
    auto around = [&](float x) {
        for (float s : {1.0f, -1.0f}) {
            v.push_back(s * x);
            v.push_back(s * std::nextafter(x, 0.0f));
            v.push_back(s * std::nextafter(x, INFINITY));
        }
    };
    for (int code = 0; code < 0x7F; code++) {  // fp8: each value and each midpoint
        const float a = e4m3_to_f32(static_cast<std::uint8_t>(code));
        const float b = code < 0x7E ? e4m3_to_f32(static_cast<std::uint8_t>(code + 1)) : 480.0f;
        around(a);
        around((a + b) / 2);
    }
    for (int code = 0; code < 0x7C; code++) {
        const float a = e5m2_to_f32(static_cast<std::uint8_t>(code));
        const float b = code < 0x7B ? e5m2_to_f32(static_cast<std::uint8_t>(code + 1)) : 65536.0f;
        around(a);
        around((a + b) / 2);
    }
    for (std::uint32_t s : {0x7F800000u, 0x7FC00000u, 0x7F800001u, 0x7FA00000u, 0x7FBFFFFFu,
                            0x00000001u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu})
        for (std::uint32_t sign : {0u, 0x80000000u}) v.push_back(from_bits(s | sign));
    return v;
}

bool same_bits_f(const std::vector<float>& a, const std::vector<float>& b, size_t* first) {
    for (size_t i = 0; i < a.size(); i++)
        if (bits(a[i]) != bits(b[i])) {
            *first = i;
            return false;
        }
    return a.size() == b.size();
}

}  // namespace

TEST_CASE("vectorised casts give the scalar casts' bits (bf16, e4m3, e5m2)", "[precision]") {
    if (detect_isa() != Isa::avx512) {
        WARN("no AVX-512 on this CPU: only the scalar table exists");
        return;
    }
    const std::vector<float> in = cast_inputs();
    const i64 n = static_cast<i64>(in.size());
    const cpu::Convert& sc = cpu::scalar::convert;
    const cpu::Convert& vx = cpu::avx512::convert;
    size_t bad = 0;

    SECTION("bf16: narrow, widen, round") {
        std::vector<std::uint16_t> a(in.size()), b(in.size());
        sc.narrow_bf16(a.data(), in.data(), n);
        vx.narrow_bf16(b.data(), in.data(), n);
        CHECK(a == b);
        size_t wrong = 0;
        for (size_t i = 0; i < in.size(); i++) wrong += a[i] != f32_to_bf16(in[i]);
        CHECK(wrong == 0);
        std::vector<std::uint16_t> codes(0x10000);
        for (std::uint32_t c = 0; c < 0x10000u; c++) codes[c] = static_cast<std::uint16_t>(c);
        std::vector<float> wa(codes.size()), wb(codes.size());
        sc.widen_bf16(wa.data(), codes.data(), 0x10000);
        vx.widen_bf16(wb.data(), codes.data(), 0x10000);
        INFO("first difference at code " << bad);
        CHECK(same_bits_f(wa, wb, &bad));
        std::vector<float> ra(in.size()), rb(in.size());
        sc.round_bf16(ra.data(), in.data(), n);
        vx.round_bf16(rb.data(), in.data(), n);
        INFO("first difference at input " << bad);
        CHECK(same_bits_f(ra, rb, &bad));
    }
    SECTION("fp8 fake quantisation with scales, and the amax") {
        for (const float scale : {1.0f, 0.75f, 3.0e-3f, 448.0f / 300.1f, 57344.0f / 1.7f}) {
            const float inv = 1.0f / scale;
            for (int e5 = 0; e5 < 2; e5++) {
                std::vector<float> a = in, b = in;
                int nan_a = 0, nan_b = 0;
                const float ma =
                    (e5 ? sc.quant_e5m2 : sc.quant_e4m3)(a.data(), n, scale, inv, &nan_a);
                const float mb =
                    (e5 ? vx.quant_e5m2 : vx.quant_e4m3)(b.data(), n, scale, inv, &nan_b);
                INFO((e5 ? "e5m2" : "e4m3") << " scale " << scale << ", first difference at input "
                                            << bad << " = 0x" << std::hex << bits(in[bad]));
                CHECK(same_bits_f(a, b, &bad));
                CHECK(bits(ma) == bits(mb));
                CHECK(nan_a == 1);
                CHECK(nan_b == 1);
                // The reference, written out: decode(fp8(x·scale))·inv.
                size_t wrong = 0;
                for (size_t i = 0; i < in.size(); i++) {
                    const float y = in[i] * scale;
                    const float r =
                        (e5 ? e5m2_to_f32(f32_to_e5m2(y)) : e4m3_to_f32(f32_to_e4m3(y))) * inv;
                    wrong += bits(a[i]) != bits(r);
                }
                CHECK(wrong == 0);
            }
        }
    }
    SECTION("every tail length and offset") {
        for (i64 len = 0; len <= 40; len++)
            for (i64 off = 0; off < 3; off++) {
                std::vector<float> a(in.begin() + 1000 + off, in.begin() + 1000 + off + len), b = a;
                int na = 0, nb = 0;
                CHECK(bits(sc.quant_e4m3(a.data(), len, 3.0f, 1.0f / 3.0f, &na)) ==
                      bits(vx.quant_e4m3(b.data(), len, 3.0f, 1.0f / 3.0f, &nb)));
                CHECK(same_bits_f(a, b, &bad));
                CHECK(bits(sc.absmax(a.data(), len, &na)) == bits(vx.absmax(b.data(), len, &nb)));
            }
    }
}

TEST_CASE("core's bulk bf16 conversions give the scalar casts' bits, NaN payloads included", "[precision]") {
    const std::vector<float> in = cast_inputs();
    std::vector<std::uint16_t> h(in.size());
    convert(h.data(), DType::bf16, in.data(), DType::f32, in.size());
    size_t wrong = 0;
    for (size_t i = 0; i < in.size(); i++) wrong += h[i] != f32_to_bf16(in[i]);
    CHECK(wrong == 0);
    std::vector<std::uint16_t> codes(0x10000);
    for (std::uint32_t c = 0; c < 0x10000u; c++) codes[c] = static_cast<std::uint16_t>(c);
    std::vector<float> w(codes.size());
    convert(w.data(), DType::f32, codes.data(), DType::bf16, codes.size());
    for (std::uint32_t c = 0; c < 0x10000u; c++)
        wrong += bits(w[c]) != bits(bf16_to_f32(static_cast<std::uint16_t>(c)));
    CHECK(wrong == 0);
}

TEST_CASE("ops::fake_quant and fake_quant_tiles are the scalar casts on every ISA", "[precision]") {
    std::vector<float> x(5000);
    fill_normal(x.data(), static_cast<i64>(x.size()), 0.0f, 3.0f, 11, 0, 0);
    x[17] = INFINITY;
    x[4000] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); i++) xb[i] = f32_to_bf16(x[i]);
    for (const Isa isa : {Isa::scalar, detect_isa()}) {
        Numerics nx;
        nx.isa = isa;
        INFO(isa_name(isa));
        // Delayed scaling, on a bf16 activation (50, 100).
        std::vector<float> got(x.size());
        bool nan = false;
        const float amax =
            ops::fake_quant(nx, got.data(), view_of(DType::bf16, xb.data(), {50, 100}), DType::e5m2,
                            0.37f, 1.0f / 0.37f, &nan);
        float want_amax = 0.0f;
        for (size_t i = 0; i < x.size(); i++) {
            const float v = bf16_to_f32(xb[i]);
            if (!std::isnan(v)) want_amax = std::max(want_amax, std::fabs(v));
            CHECK(bits(got[i]) == bits(e5m2_to_f32(f32_to_e5m2(v * 0.37f)) * (1.0f / 0.37f)));
        }
        CHECK(nan);
        CHECK(amax == want_amax);
        // Block-wise: (50, 100) in tiles of 1 x 32, and as a weight in 32 x 32 blocks.
        for (const i64 band : {i64{1}, i64{32}}) {
            ops::fake_quant_tiles(nx, got.data(), view_f32(x.data(), {50, 100}), band, 32);
            for (i64 r0 = 0; r0 < 50; r0 += band)
                for (i64 c0 = 0; c0 < 100; c0 += 32) {
                    float m = 0.0f;
                    bool finite = true;
                    for (i64 r = r0; r < std::min<i64>(50, r0 + band); r++)
                        for (i64 c = c0; c < std::min<i64>(100, c0 + 32); c++) {
                            finite = finite && std::isfinite(x[static_cast<size_t>(r * 100 + c)]);
                            m = std::max(m, std::fabs(x[static_cast<size_t>(r * 100 + c)]));
                        }
                    float s = 448.0f / m;
                    if (!(m > 0.0f) || !finite || !std::isfinite(s)) s = 1.0f;
                    for (i64 r = r0; r < std::min<i64>(50, r0 + band); r++)
                        for (i64 c = c0; c < std::min<i64>(100, c0 + 32); c++) {
                            const size_t i = static_cast<size_t>(r * 100 + c);
                            CHECK(bits(got[i]) ==
                                  bits(e4m3_to_f32(f32_to_e4m3(x[i] * s)) * (1.0f / s)));
                        }
                }
        }
    }
}

// ---- fast bf16 matmuls ------------------------------------------------------------------------

namespace {

// Operands whose every sum is exact in fp32, in any order: bf16 activations and output gradients
// are small integers; weights round (in bf16) to multiples of 1/16 below 16 in magnitude, and are
// given in fp32 with an offset the rounding must remove (up to half an ulp, ties included); the
// bias is on the same grid. Then Σ|x·w| < 2^20 · 1/16 over K <= 4096, so each sum is exact, and
// the result differs from the reference only if a cast point is wrong.
struct ExactCase {
    i64 BT, C, OC;
    std::vector<std::uint16_t> inp, dout, dinp0;
    std::vector<float> w, bias, dweight0, dbias0;
};

ExactCase exact_case(i64 BT, i64 C, i64 OC, std::uint64_t seed) {
    ExactCase e{BT, C, OC, {}, {}, {}, {}, {}, {}, {}};
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    auto next = [&] {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    };
    auto small = [&] { return static_cast<float>(static_cast<int>(next() % 15) - 7); };
    for (i64 i = 0; i < BT * C; i++) e.inp.push_back(f32_to_bf16(small()));
    for (i64 i = 0; i < BT * OC; i++) e.dout.push_back(f32_to_bf16(small()));
    for (i64 i = 0; i < BT * C; i++) e.dinp0.push_back(f32_to_bf16(small() * 64.0f));
    const float offsets[] = {0.0f, 0.01f, -0.01f, 1.0f / 32, -1.0f / 32, 0.03f};
    for (i64 i = 0; i < OC * C; i++) {
        const int m = static_cast<int>(next() % 511) - 255;  // weights m/16: bf16's grid at 8..16
        const float off = std::abs(m) >= 128 ? offsets[next() % 6] : 0.0f;
        e.w.push_back(static_cast<float>(m) / 16.0f + (m < 0 ? -off : off));
    }
    for (i64 i = 0; i < OC; i++)
        e.bias.push_back(static_cast<float>(static_cast<int>(next() % 255) - 127) / 16.0f);
    for (i64 i = 0; i < OC * C; i++) e.dweight0.push_back(small());
    for (i64 i = 0; i < OC; i++) e.dbias0.push_back(small());
    return e;
}

// The plainly written reference: fp64 sums (exact here), rounded as the bf16 contract says.
struct Expected {
    std::vector<std::uint16_t> out, dinp;
    std::vector<float> dweight, dbias;
};

Expected expected(const ExactCase& e) {
    Expected x;
    auto wr = [&](i64 o, i64 c) {
        return static_cast<double>(bf16_to_f32(f32_to_bf16(e.w[static_cast<size_t>(o * e.C + c)])));
    };
    auto in = [&](i64 t, i64 c) {
        return static_cast<double>(bf16_to_f32(e.inp[static_cast<size_t>(t * e.C + c)]));
    };
    auto d = [&](i64 t, i64 o) {
        return static_cast<double>(bf16_to_f32(e.dout[static_cast<size_t>(t * e.OC + o)]));
    };
    for (i64 t = 0; t < e.BT; t++)
        for (i64 o = 0; o < e.OC; o++) {
            double acc = 0;
            for (i64 c = 0; c < e.C; c++) acc += in(t, c) * wr(o, c);
            x.out.push_back(f32_to_bf16(static_cast<float>(acc) + e.bias[static_cast<size_t>(o)]));
        }
    for (i64 t = 0; t < e.BT; t++)
        for (i64 c = 0; c < e.C; c++) {
            double acc = bf16_to_f32(e.dinp0[static_cast<size_t>(t * e.C + c)]);
            for (i64 o = 0; o < e.OC; o++) acc += d(t, o) * wr(o, c);
            x.dinp.push_back(f32_to_bf16(static_cast<float>(acc)));
        }
    for (i64 o = 0; o < e.OC; o++)
        for (i64 c = 0; c < e.C; c++) {
            double acc = e.dweight0[static_cast<size_t>(o * e.C + c)];
            for (i64 t = 0; t < e.BT; t++) acc += d(t, o) * in(t, c);
            x.dweight.push_back(static_cast<float>(acc));
        }
    for (i64 o = 0; o < e.OC; o++) {
        double acc = e.dbias0[static_cast<size_t>(o)];
        for (i64 t = 0; t < e.BT; t++) acc += d(t, o);
        x.dbias.push_back(static_cast<float>(acc));
    }
    return x;
}

Numerics fast_nx() {
    Numerics nx;
    nx.mode = Mode::fast;
    return nx;
}

}  // namespace

TEST_CASE("fast bf16 matmuls equal the plain reference bit for bit when every sum is exact",
          "[precision]") {
    struct Shape {
        i64 BT, C, OC;
    };
    for (const Shape sh :
         {Shape{5, 7, 3}, Shape{64, 96, 80}, Shape{33, 130, 17}, Shape{256, 768, 512}}) {
        const ExactCase e =
            exact_case(sh.BT, sh.C, sh.OC, static_cast<std::uint64_t>(sh.BT * 7 + sh.C));
        const Expected want = expected(e);
        for (const cpu::Bf16Path path : {cpu::Bf16Path::onednn, cpu::Bf16Path::sgemm}) {
            INFO(cpu::bf16_path_name(path) << " BT=" << sh.BT << " C=" << sh.C << " OC=" << sh.OC);
            std::vector<std::uint16_t> out(want.out.size()), dinp = e.dinp0;
            std::vector<float> dweight = e.dweight0, dbias = e.dbias0;
            cpu::matmul_forward_bf16(fast_nx(), path, out.data(), e.inp.data(), e.w.data(),
                                     e.bias.data(), e.BT, e.C, e.OC);
            CHECK(out == want.out);
            cpu::matmul_backward_bf16(fast_nx(), path, dinp.data(), dweight.data(), dbias.data(),
                                      e.dout.data(), e.inp.data(), e.w.data(), e.BT, e.C, e.OC);
            CHECK(dinp == want.dinp);
            CHECK(test::same_bits(dweight, want.dweight));
            CHECK(test::same_bits(dbias, want.dbias));
            // Each output of the backward alone, the others null.
            std::vector<std::uint16_t> di = e.dinp0;
            std::vector<float> dw = e.dweight0;
            cpu::matmul_backward_bf16(fast_nx(), path, di.data(), nullptr, nullptr, e.dout.data(),
                                      e.inp.data(), e.w.data(), e.BT, e.C, e.OC);
            cpu::matmul_backward_bf16(fast_nx(), path, nullptr, dw.data(), nullptr, e.dout.data(),
                                      e.inp.data(), e.w.data(), e.BT, e.C, e.OC);
            CHECK(di == want.dinp);
            CHECK(test::same_bits(dw, want.dweight));
        }
    }
}

TEST_CASE("fast bf16 through ops equals bitwise bf16 when every sum is exact; the path is reported",
          "[precision]") {
    const ExactCase e = exact_case(48, 64, 40, 5);
    ExactCase f = e;  // the bitwise run's copies of the outputs
    std::vector<std::uint16_t> out_fast(48 * 40), out_bit(48 * 40);
    std::vector<float> w = e.w, bias = e.bias;
    auto run = [&](Mode mode, std::vector<std::uint16_t>& out, ExactCase& c) {
        Numerics nx;
        nx.mode = mode;
        const Tensor o = view_of(DType::bf16, out.data(), {48, 40});
        const Tensor x = view_of(DType::bf16, c.inp.data(), {48, 64});
        const Tensor wt = view_f32(w.data(), {40, 64}), b = view_f32(bias.data(), {40});
        ops::matmul_forward(nx, o, x, wt, &b);
        const Tensor di = view_of(DType::bf16, c.dinp0.data(), {48, 64});
        const Tensor d = view_of(DType::bf16, c.dout.data(), {48, 40});
        const Tensor dw = view_f32(c.dweight0.data(), {40, 64}),
                     db = view_f32(c.dbias0.data(), {40});
        ops::matmul_backward(nx, &di, &dw, &db, d, x, wt);
    };
    ExactCase a = e;
    run(Mode::fast, out_fast, a);
    run(Mode::bitwise, out_bit, f);
    CHECK(out_fast == out_bit);
    CHECK(a.dinp0 == f.dinp0);
    CHECK(test::same_bits(a.dweight0, f.dweight0));
    CHECK(test::same_bits(a.dbias0, f.dbias0));

    // The report: oneDNN's bf16 primitive exactly when oneDNN's ISA has bf16 instructions.
    const cpu::Bf16MatmulInfo& info = cpu::bf16_matmul_info();
    const std::string path = ops::matmul_path(fast_nx(), Device::cpu, DType::bf16);
    INFO(path);
    CHECK(path == info.text);
    const bool native =
        info.onednn_isa == "avx512_core_bf16" || info.onednn_isa == "avx512_core_amx";
    CHECK((info.path == cpu::Bf16Path::onednn) == native);
    CHECK(path.find(native ? "oneDNN " + info.onednn_isa : "fp32 sgemm") == 0);
    if (!info.amx_bf16 && !info.avx512_bf16) CHECK(info.path == cpu::Bf16Path::sgemm);
    CHECK(ops::matmul_path(fast_nx(), Device::cpu, DType::f32) == "oneDNN sgemm");
    std::printf("bf16 matmul: %s\n", path.c_str());
}

// ---- precision.fp8_accumulator_promote ---------------------------------------------------------

namespace {

// fp8 in every block's linears, shaped so that tp = 2 shares (hidden 256, ffn 512, vocabulary 256)
// are whole blocks and tiles of 128 and a batch of 8 x 64 tokens is four token blocks: the narrow
// accumulator promotes every 128 products, as DeepSeek-V3 does, inside blocks of 128.
Config promote_job(const char* recipe) {
    Config c = test::small_job();
    c.model.vocab = 256;
    c.model.hidden = 256;
    c.model.heads = 4;
    c.model.ffn = 512;
    c.model.seq_len = 64;
    c.train.steps = 3;
    c.numerics.block = 128;
    c.precision.activations = "bf16";
    c.precision.fp8 = recipe;
    c.precision.fp8_keep_ends_bf16 = false;
    c.precision.fp8_amax_history_len = 4;
    c.precision.fp8_accumulator_promote = 128;
    return c;
}

LogicalState run_any(const Config& c) {
    LogicalState s;
    bool agree = true;
    run_layout(c, {}, test::inspecting([&](Job& j) { agree = absorb(s, j) && agree; }));
    CHECK(agree);
    CHECK(s.complete());
    return s;
}

}  // namespace

TEST_CASE("fp8_accumulator_promote: layouts are bit-identical to the single device",
          "[precision]") {
    struct L {
        int dp, tp, pp, zero, microbatches;
        bool sp;
    };
    for (const char* recipe : {"delayed", "block"}) {
        const Config base = promote_job(recipe);
        const LogicalState ref = test::single_device(base);
        // The emulation changes the sums: not the fp32-accumulated run's bits.
        Config off = base;
        off.precision.fp8_accumulator_promote = 0;
        const LogicalState fp32_sums = test::single_device(off);
        CHECK_FALSE(test::same_bits(ref.params, fp32_sums.params));
        for (const L l : {L{2, 1, 1, 0, 0, false}, L{1, 2, 1, 0, 0, false}, L{1, 2, 1, 0, 0, true},
                          L{1, 1, 2, 0, 2, false}, L{2, 1, 1, 3, 2, false}, L{2, 2, 1, 1, 0, false},
                          L{1, 2, 2, 0, 2, true}}) {
            if (std::string(recipe) == "block" && l.dp * l.tp * l.pp > 2) continue;  // time
            Config c = base;
            c.layout.dp = l.dp;
            c.layout.tp = l.tp;
            c.layout.pp = l.pp;
            c.layout.zero = l.zero;
            c.layout.microbatches = l.microbatches;
            c.layout.sequence_parallel = l.sp;
            INFO(recipe << " dp" << l.dp << " tp" << l.tp << " pp" << l.pp << " zero" << l.zero
                        << " mb" << l.microbatches << (l.sp ? " +SP" : ""));
            test::check_same_bits(ref, run_any(c));
        }
    }
}

TEST_CASE("fp8_accumulator_promote: config checks name the key", "[precision]") {
    Config c = promote_job("delayed");
    CHECK_NOTHROW(validate_config(c));
    c.precision.fp8_accumulator_promote = -1;
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(c); }),
               Catch::Contains("precision.fp8_accumulator_promote"));
    c.precision.fp8_accumulator_promote = 128;
    c.numerics.block = 64;
    const std::string e = test::error_of<ConfigError>([&] { validate_config(c); });
    CHECK_THAT(e, Catch::Contains("precision.fp8_accumulator_promote = 128 is larger than "
                                  "numerics.block = 64"));
    c.numerics.block = 128;
    c.precision.fp8_lm_head = true;  // the head's matmul does not take the fp8 numerics
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(c); }),
               Catch::Contains("precision.fp8_accumulator_promote = 128 with "
                               "precision.fp8_lm_head = true"));
    c.precision.fp8_lm_head = false;
    c.numerics.block = 64;
    c.precision.fp8 = "off";  // no fp8 matmuls: nothing to promote, nothing to refuse
    CHECK_NOTHROW(validate_config(c));
    const std::string toml =
        "[numerics]\nblock = 64\n[precision]\nactivations = \"bf16\"\nfp8 = \"delayed\"\n"
        "fp8_accumulator_promote = 64\n";
    CHECK(parse_config(toml, "t").precision.fp8_accumulator_promote == 64);
    CHECK_THAT(test::error_of<ConfigError>(
                   [&] { parse_config("[precision]\nfp8_accumulator_promote = 1.5\n", "t"); }),
               Catch::Contains("precision.fp8_accumulator_promote"));
}
