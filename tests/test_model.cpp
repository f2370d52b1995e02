// The whole model: the fp32 forward against a plain fp64 GPT-2 written here, and the fp32
// backward against fp64 central finite differences of that fp64 model.
#include "core/model.h"
#include "core/numerics.h"
#include "core/rng.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace px;

namespace {

// A plain fp64 GPT-2 over the same parameter table (llm.c's math, no tricks).
struct RefGPT {
    ModelConfig mc;
    ParamTable table;
    std::vector<double> p;  // laid out like the fp32 arena

    const double* P(int i) const { return p.data() + table.entries[i].offset; }

    static void layernorm(double* out, const double* x, const double* w, const double* b, int C) {
        double mean = 0, var = 0;
        for (int i = 0; i < C; i++) mean += x[i];
        mean /= C;
        for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
        var /= C;
        const double rstd = 1.0 / std::sqrt(var + 1e-5);
        for (int i = 0; i < C; i++) out[i] = (x[i] - mean) * rstd * w[i] + b[i];
    }
    static void linear(double* out, const double* x, const double* w, const double* b, int C, int OC) {
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int i = 0; i < C; i++) s += x[i] * w[o * C + i];
            out[o] = s;
        }
    }

    double loss(const std::vector<int>& tok, const std::vector<int>& tgt, int B, int T) const {
        const int C = static_cast<int>(mc.hidden), NH = static_cast<int>(mc.heads), HS = C / NH;
        const int F = static_cast<int>(mc.ffn), V = static_cast<int>(mc.vocab);
        std::vector<double> x(static_cast<size_t>(B * T * C)), ln(x.size()), y(x.size()), tmp(x.size());
        std::vector<double> qkv(static_cast<size_t>(B * T * 3 * C)), h(static_cast<size_t>(F));
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int i = 0; i < C; i++)
                    x[(b * T + t) * C + i] = P(table.wte)[tok[b * T + t] * C + i] + P(table.wpe)[t * C + i];
        for (int l = 0; l < mc.layers; l++) {
            auto W = [&](LayerParam q) { return P(table.layer_index(l, q)); };
            for (int r = 0; r < B * T; r++) {
                layernorm(&ln[r * C], &x[r * C], W(LN1W), W(LN1B), C);
                linear(&qkv[r * 3 * C], &ln[r * C], W(QKVW), W(QKVB), C, 3 * C);
            }
            for (int b = 0; b < B; b++)
                for (int hh = 0; hh < NH; hh++)
                    for (int t = 0; t < T; t++) {
                        std::vector<double> a(static_cast<size_t>(t + 1));
                        const double* q = &qkv[(b * T + t) * 3 * C + hh * HS];
                        double mx = -1e300;
                        for (int s = 0; s <= t; s++) {
                            const double* k = &qkv[(b * T + s) * 3 * C + C + hh * HS];
                            double d = 0;
                            for (int i = 0; i < HS; i++) d += q[i] * k[i];
                            a[s] = d / std::sqrt(static_cast<double>(HS));
                            mx = std::max(mx, a[s]);
                        }
                        double sum = 0;
                        for (int s = 0; s <= t; s++) sum += (a[s] = std::exp(a[s] - mx));
                        for (int i = 0; i < HS; i++) {
                            double o = 0;
                            for (int s = 0; s <= t; s++)
                                o += a[s] / sum * qkv[(b * T + s) * 3 * C + 2 * C + hh * HS + i];
                            y[(b * T + t) * C + hh * HS + i] = o;
                        }
                    }
            for (int r = 0; r < B * T; r++) {
                linear(&tmp[r * C], &y[r * C], W(ATTPROJW), W(ATTPROJB), C, C);
                for (int i = 0; i < C; i++) x[r * C + i] += tmp[r * C + i];
                layernorm(&ln[r * C], &x[r * C], W(LN2W), W(LN2B), C);
                linear(h.data(), &ln[r * C], W(FCW), W(FCB), C, F);
                for (double& v : h)
                    v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
                linear(&tmp[r * C], h.data(), W(FCPROJW), W(FCPROJB), F, C);
                for (int i = 0; i < C; i++) x[r * C + i] += tmp[r * C + i];
            }
        }
        double total = 0;
        std::vector<double> logits(static_cast<size_t>(V));
        for (int r = 0; r < B * T; r++) {
            layernorm(&ln[r * C], &x[r * C], P(table.lnfw), P(table.lnfb), C);
            linear(logits.data(), &ln[r * C], P(table.wte), nullptr, C, V);
            const double mx = *std::max_element(logits.begin(), logits.end());
            double sum = 0;
            for (double v : logits) sum += std::exp(v - mx);
            total += std::log(sum) - (logits[tgt[r]] - mx);
        }
        return total / (B * T);
    }
};

struct Fixture {
    ModelConfig mc;
    int B = 2, T = 9;
    std::vector<int> tok, tgt;
    Fixture() {
        mc.vocab = 11;
        mc.seq_len = 9;
        mc.layers = 2;
        mc.heads = 2;
        mc.hidden = 16;
        mc.ffn = 24;
        for (int i = 0; i < B * T; i++) {
            tok.push_back(static_cast<int>((i * 7 + 3) % mc.vocab));
            tgt.push_back(static_cast<int>((i * 5 + 1) % mc.vocab));
        }
    }
};

void randomise(GPT& m) {
    for (size_t i = 0; i < m.table().entries.size(); i++) {
        const Tensor t = m.param(static_cast<int>(i));
        fill_normal(t.f32(), t.numel(), 0.0f, 0.4f, 99, static_cast<u32>(i), 0);
    }
}

void check_model_gradients(int block) {
    Fixture fx;
    Numerics nx;
    nx.block = block;
    nx.isa = detect_isa();
    GPT model(fx.mc, nx);
    randomise(model);

    model.forward(fx.tok.data(), fx.tgt.data(), fx.B, fx.T);
    double loss32 = 0;
    for (int i = 0; i < fx.B * fx.T; i++) loss32 += model.losses()[i];
    loss32 /= fx.B * fx.T;
    std::vector<float> grads(static_cast<size_t>(model.grad_layout().total), 0.0f);
    model.backward(grads.data(), fx.tok.data(), fx.tgt.data(), 1.0f / static_cast<float>(fx.B * fx.T));
    model.combine_tied_grads(grads.data());

    RefGPT ref{fx.mc, model.table(), {}};
    ref.p.assign(model.params(), model.params() + model.table().total);
    const double loss64 = ref.loss(fx.tok, fx.tgt, fx.B, fx.T);
    // fp32 forward: ~60 dependent ops per value, each within eps32 = 6e-8 relative.
    CHECK(std::abs(loss32 - loss64) <= 60 * 6e-8 * std::abs(loss64) + 1e-6);

    // Central differences in fp64: truncation ~h²·|f'''| ≈ 1e-12, rounding ~eps64/h ≈ 1e-11,
    // both far below the fp32 gradient's own error, which is what the bound below allows for:
    // each gradient passes through ~100 fp32 ops (relative error ≤ ~100·eps32 = 6e-6 of the
    // magnitudes involved), so errors are judged against the tensor's gradient scale.
    const double h = 1e-5;
    for (size_t ti = 0; ti < model.table().entries.size(); ti++) {
        const TableEntry& e = model.table().entries[ti];
        const i64 n = e.numel();
        const int samples = static_cast<int>(std::min<i64>(n, 6));
        std::vector<double> fd(samples), an(samples);
        double scale = 0;
        for (int s = 0; s < samples; s++) {
            const i64 idx = e.offset + (s * 7919) % n;
            const double orig = ref.p[idx];
            ref.p[idx] = orig + h;
            const double lp = ref.loss(fx.tok, fx.tgt, fx.B, fx.T);
            ref.p[idx] = orig - h;
            const double lm = ref.loss(fx.tok, fx.tgt, fx.B, fx.T);
            ref.p[idx] = orig;
            fd[s] = (lp - lm) / (2 * h);
            an[s] = grads[idx];
            scale = std::max(scale, std::abs(fd[s]));
        }
        for (int s = 0; s < samples; s++) {
            INFO(e.name << " element " << (s * 7919) % n << ": analytic " << an[s] << " fd " << fd[s]);
            CHECK(std::abs(an[s] - fd[s]) <= 1e-4 * scale + 1e-3 * std::abs(fd[s]) + 1e-9);
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
