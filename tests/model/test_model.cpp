// The whole model: the fp32 forward against a plain fp64 GPT-2 (validators/gradcheck.h RefGPT),
// and the fp32 backward against fp64 central finite differences of that fp64 model.
#include "core/model/model.h"
#include "core/base/numerics.h"
#include "validators/gradcheck.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace px;

namespace {

struct Fixture {
    ModelConfig mc;
    int B = 2, T = 9;  // tokens (i·7+3) mod V, targets (i·5+1) mod V (gradcheck::model_fd_samples)
    Fixture() {
        mc.vocab = 11;
        mc.seq_len = 9;
        mc.layers = 2;
        mc.heads = 2;
        mc.hidden = 16;
        mc.ffn = 24;
    }
};

void check_model_gradients(int block) {
    Fixture fx;
    Numerics nx;
    nx.block = block;
    nx.isa = detect_isa();
    gradcheck::ModelFdOptions o;
    o.B = fx.B;
    o.T = fx.T;
    // Weights N(0, 0.4), seed 99 (ModelFdOptions' defaults).
    const gradcheck::ModelProbe probe = gradcheck::model_fd_samples(fx.mc, nx, o);
    // fp32 forward: ~60 dependent ops per value, each within eps32 = 6e-8 relative.
    CHECK(std::abs(probe.loss32 - probe.loss64) <= 60 * 6e-8 * std::abs(probe.loss64) + 1e-6);

    // Central differences in fp64 (h = 1e-5): truncation ~h²·|f'''| ≈ 1e-12, rounding ~eps64/h
    // ≈ 1e-11, both far below the fp32 gradient's own error, which is what the bound below allows
    // for: each gradient passes through ~100 fp32 ops (relative error ≤ ~100·eps32 = 6e-6 of the
    // magnitudes involved), so errors are judged against the tensor's gradient scale.
    REQUIRE(probe.names.size() == GPT(fx.mc, nx).table().entries.size());
    for (size_t ti = 0; ti < probe.names.size(); ti++) {
        std::vector<const gradcheck::ModelSample*> mine;
        for (const gradcheck::ModelSample& s : probe.samples)
            if (s.tensor == static_cast<int>(ti)) mine.push_back(&s);
        REQUIRE(static_cast<i64>(mine.size()) == std::min<i64>(probe.sizes[ti], 6));
        double scale = 0;
        for (const auto* s : mine) scale = std::max(scale, std::abs(s->fd));
        for (const auto* s : mine) {
            INFO(probe.names[ti] << " element " << s->element << ": analytic " << s->analytic
                                 << " fd " << s->fd);
            CHECK(std::abs(s->analytic - s->fd) <= 1e-4 * scale + 1e-3 * std::abs(s->fd) + 1e-9);
        }
    }
}

}  // namespace

TEST_CASE("whole-model loss gradient matches fp64 finite differences (block 64)") {
    check_model_gradients(64);
}

TEST_CASE("whole-model loss gradient matches fp64 finite differences (block 4: deep trees)") {
    check_model_gradients(4);
}

TEST_CASE("GPT-2 parameter names and count") {
    Fixture fx;
    GPT model(fx.mc, Numerics{});
    const auto& e = model.table().entries;
    CHECK(e.front().name == "wte");
    CHECK(e[1].name == "wpe");
    CHECK(e[2].name == "h.0.ln_1.weight");
    CHECK(e[model.table().layer_index(1, QKVW)].name == "h.1.attn.c_attn.weight");
    CHECK(e[model.table().layer_index(1, FCPROJB)].name == "h.1.mlp.c_proj.bias");
    CHECK(e.back().name == "ln_f.bias");
    const i64 C = 16, V = 11, T = 9, F = 24, L = 2;
    const i64 per_layer = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + F * C + F + C * F + C;
    CHECK(model.num_params() == V * C + T * C + L * per_layer + 2 * C);
}

// The door for a narrower activation dtype: the table types every activation, the arena is sized
// in bytes from those types, and a model hands its activations to the ops in that dtype.
TEST_CASE("activations carry the run's dtype and are sized in bytes from the table") {
    Fixture fx;
    for (DType dt : {DType::f32, DType::bf16})
        for (bool recompute : {false, true}) {
            INFO(dtype_name(dt) << (recompute ? ", recompute" : ""));
            ActShape s;
            s.B = fx.B;
            s.T = fx.T;
            s.layers = 2;
            s.recompute = recompute;
            s.dtype = dt;
            const Activations a(fx.mc, s);
            CHECK(a.dtype() == dt);
            i64 aligned = 0, packed = 0;
            for (int i = 0; i < kNumActs; i++) {
                const ActSpec& spec = kActs[i];
                const DType want = spec.type == ActType::f32 ? DType::f32 : dt;
                const Tensor t = a.tensor(i);
                INFO(spec.name);
                CHECK(t.dtype == want);
                aligned += (bytes_of(want, t.numel()) + 63) / 64 * 64;
                packed += bytes_of(want, t.numel());
                if (spec.d0 == Dim::L || spec.d0 == Dim::LS)
                    for (int l = 0; l < s.layers; l++) {
                        const Tensor v = a.layer(i, l);
                        CHECK(v.dtype == want);
                        const auto* lo = static_cast<const std::byte*>(v.data);
                        CHECK(lo >= static_cast<const std::byte*>(t.data));
                        CHECK(lo + bytes_of(want, v.numel()) <=
                              static_cast<const std::byte*>(t.data) + bytes_of(want, t.numel()));
                    }
            }
            CHECK(a.bytes() == aligned);  // Σ numel·dtype size, each tensor 64-byte aligned
            CHECK(a.bytes() >= packed);
            CHECK(a.bytes() < packed + 64 * kNumActs);
            CHECK(a.input().dtype == dt);
            CHECK(a.output().dtype == dt);
            CHECK(a.dresidual().dtype == dt);
            CHECK(a.losses().dtype == DType::f32);
            if (dt != DType::f32) CHECK_THROWS_AS(a.input().f32(), InternalError);
        }
}

TEST_CASE("a model with bf16 activations hands them to the ops as bf16, never as float") {
    Fixture fx;
    GPT model(fx.mc, Numerics{}, ModelPart::whole(fx.mc), nullptr, DType::bf16);
    model.init_random(1, 0.02);
    CHECK(model.activation_dtype() == DType::bf16);
    Activations a = model.make_activations(0, fx.B, fx.T);
    CHECK(a.dtype() == DType::bf16);
    std::vector<int> tokens(static_cast<size_t>(fx.B * fx.T), 1), targets = tokens;
    // The bf16 backend runs it: the output is bf16 and the losses (fp32) are finite.
    model.forward(a, 0, tokens.data(), targets.data());
    CHECK(a.output().dtype == DType::bf16);
    const Tensor losses = a.losses();
    for (i64 i = 0; i < losses.numel(); i++) CHECK(std::isfinite(losses.f32()[i]));
    // fp8 activations have no kernels: the first op (the embedding, writing `encoded`) refuses
    // its e4m3 output by name.
    GPT narrow(fx.mc, Numerics{}, ModelPart::whole(fx.mc), nullptr, DType::e4m3);
    narrow.init_random(1, 0.02);
    Activations h = narrow.make_activations(0, fx.B, fx.T);
    try {
        narrow.forward(h, 0, tokens.data(), targets.data());
        FAIL("fp8 activations ran on the fp32 kernels");
    } catch (const Error& e) {
        const std::string what = e.what();
        CHECK(what.find("'encoded'") != std::string::npos);
        CHECK(what.find("e4m3") != std::string::npos);
    }
}
