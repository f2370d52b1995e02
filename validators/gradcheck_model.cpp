// The whole model's gradient check (gradcheck.h): the fp32 model's loss and gradients against
// central differences of a plain fp64 GPT-2 over the same parameters.
#include "validators/gradcheck.h"

#include "core/base/error.h"
#include "core/base/rng.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace px::gradcheck {

namespace {

void layernorm64(double* out, const double* x, const double* w, const double* b, int C) {
    double mean = 0, var = 0;
    for (int i = 0; i < C; i++) mean += x[i];
    mean /= C;
    for (int i = 0; i < C; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= C;
    const double rstd = 1.0 / std::sqrt(var + 1e-5);
    for (int i = 0; i < C; i++) out[i] = (x[i] - mean) * rstd * w[i] + b[i];
}
void linear64(double* out, const double* x, const double* w, const double* b, int C, int OC) {
    for (int o = 0; o < OC; o++) {
        double s = b ? b[o] : 0.0;
        for (int i = 0; i < C; i++) s += x[i] * w[o * C + i];
        out[o] = s;
    }
}
// out (C) = c_proj(gelu(c_fc(x))) of an MLP of F channels.
void mlp64(double* out, const double* x, const double* w1, const double* b1, const double* w2,
           const double* b2, int C, int F) {
    std::vector<double> h(static_cast<size_t>(F));
    linear64(h.data(), x, w1, b1, C, F);
    for (double& v : h)
        v = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    linear64(out, h.data(), w2, b2, F, C);
}

// out (C) = down(silu(gate(x)) · up(x)) of a SwiGLU MLP of F channels, without biases.
void swiglu64(double* out, const double* x, const double* gate, const double* up,
              const double* down, int C, int F) {
    std::vector<double> g(static_cast<size_t>(F)), u(static_cast<size_t>(F));
    linear64(g.data(), x, gate, nullptr, C, F);
    linear64(u.data(), x, up, nullptr, C, F);
    for (int j = 0; j < F; j++) g[j] = g[j] / (1.0 + std::exp(-g[j])) * u[j];
    linear64(out, g.data(), down, nullptr, F, C);
}

}  // namespace

void RefGPT::ffn64(double* out, const double* x, int l, int e) const {
    const int C = static_cast<int>(mc.hidden);
    auto W = [&](LayerParam q) { return P(table.layer_index(l, q)); };
    if (e < 0) {
        const int F = static_cast<int>(table.entries[table.layer_index(l, FCW)].rows);
        if (mc.llama())
            swiglu64(out, x, W(FCW), W(UPW), W(FCPROJW), C, F);
        else
            mlp64(out, x, W(FCW), W(FCB), W(FCPROJW), W(FCPROJB), C, F);
        return;
    }
    const int FE = static_cast<int>(mc.expert_ffn());
    if (mc.llama())
        swiglu64(out, x, W(EFCW) + e * FE * C, W(EUPW) + e * FE * C, W(EPROJW) + e * C * FE, C, FE);
    else
        mlp64(out, x, W(EFCW) + e * FE * C, W(EFCB) + e * FE, W(EPROJW) + e * C * FE,
              W(EPROJB) + e * C, C, FE);
}

double RefGPT::loss(const std::vector<int>& tok, const std::vector<int>& tgt, int B, int T) const {
    if (mc.llama()) return llama_loss(tok, tgt, B, T);
    const int C = static_cast<int>(mc.hidden), NH = static_cast<int>(mc.heads), HS = C / NH;
    const int V = static_cast<int>(mc.vocab);
    std::vector<double> x(static_cast<size_t>(B * T * C)), ln(x.size()), y(x.size()), tmp(x.size());
    std::vector<double> qkv(static_cast<size_t>(B * T * 3 * C));
    double aux = 0;  // the MoE layers' auxiliary losses
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++)
                x[(b * T + t) * C + i] =
                    P(table.wte)[tok[b * T + t] * C + i] + P(table.wpe)[t * C + i];
    for (int l = 0; l < mc.layers; l++) {
        auto W = [&](LayerParam q) { return P(table.layer_index(l, q)); };
        for (int r = 0; r < B * T; r++) {
            layernorm64(&ln[r * C], &x[r * C], W(LN1W), W(LN1B), C);
            linear64(&qkv[r * 3 * C], &ln[r * C], W(QKVW), W(QKVB), C, 3 * C);
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
            linear64(&tmp[r * C], &y[r * C], W(ATTPROJW), W(ATTPROJB), C, C);
            for (int i = 0; i < C; i++) x[r * C + i] += tmp[r * C + i];
            layernorm64(&ln[r * C], &x[r * C], W(LN2W), W(LN2B), C);
        }
        if (!mc.moe_layer(l)) {
            for (int r = 0; r < B * T; r++) ffn64(&tmp[r * C], &ln[r * C], l, -1);
        } else {
            aux += moe64(tmp, ln, l, B, T);
        }
        for (int r = 0; r < B * T; r++)
            for (int i = 0; i < C; i++) x[r * C + i] += tmp[r * C + i];
    }
    double total = 0;
    std::vector<double> logits(static_cast<size_t>(V));
    for (int r = 0; r < B * T; r++) {
        layernorm64(&ln[r * C], &x[r * C], P(table.lnfw), P(table.lnfb), C);
        linear64(logits.data(), &ln[r * C], P(table.wte), nullptr, C, V);
        const double mx = *std::max_element(logits.begin(), logits.end());
        double sum = 0;
        for (double v : logits) sum += std::exp(v - mx);
        total += std::log(sum) - (logits[tgt[r]] - mx);
    }
    return total / (B * T) + aux;
}

// A MoE layer (core/model/moe.h) in fp64: out (B·T,C) from ln (B·T,C); returns its auxiliary
// losses (load balancing and z-loss), as the fp32 model adds them to the objective.
double RefGPT::moe64(std::vector<double>& out, const std::vector<double>& ln, int l, int B,
                     int T) const {
    const int C = static_cast<int>(mc.hidden), E = static_cast<int>(mc.moe_experts);
    const int K = static_cast<int>(mc.moe_top_k);
    auto W = [&](LayerParam q) { return P(table.layer_index(l, q)); };
    const int BT = B * T;
    std::vector<double> p(static_cast<size_t>(BT * E)), lse(static_cast<size_t>(BT));
    std::vector<int> choice(static_cast<size_t>(BT * K));
    std::vector<char> kept(static_cast<size_t>(BT * K), 1);
    std::vector<double> gate(static_cast<size_t>(BT * K));
    for (int r = 0; r < BT; r++) {
        double* pr = &p[static_cast<size_t>(r * E)];
        linear64(pr, &ln[static_cast<size_t>(r * C)], W(ROUTERW), nullptr, C, E);
        const double mx = *std::max_element(pr, pr + E);
        double sum = 0;
        for (int e = 0; e < E; e++) sum += (pr[e] = std::exp(pr[e] - mx));
        for (int e = 0; e < E; e++) pr[e] /= sum;
        lse[static_cast<size_t>(r)] = mx + std::log(sum);
        double S = 0;
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int m = 0; m < j; m++) taken = taken || choice[static_cast<size_t>(r * K + m)] == e;
                if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
            }
            choice[static_cast<size_t>(r * K + j)] = best;
            S += pr[best];
        }
        for (int j = 0; j < K; j++) {
            const double pj = pr[choice[static_cast<size_t>(r * K + j)]];
            gate[static_cast<size_t>(r * K + j)] = mc.moe_norm_topk ? pj / S : pj;
        }
    }
    double aux = 0;
    for (int b = 0; b < B; b++) {
        if (mc.moe_capacity_factor > 0) {
            const double cap = std::ceil(mc.moe_capacity_factor * T * K / E);
            std::vector<int> taken(static_cast<size_t>(E), 0);
            for (int j = 0; j < K; j++)
                for (int t = 0; t < T; t++) {
                    const size_t s = static_cast<size_t>((b * T + t) * K + j);
                    if (taken[static_cast<size_t>(choice[s])] < cap)
                        taken[static_cast<size_t>(choice[s])]++;
                    else
                        kept[s] = 0;
                }
        }
        double balance = 0;
        for (int e = 0; e < E; e++) {
            double f = 0, P_e = 0;
            for (int t = 0; t < T; t++) {
                P_e += p[static_cast<size_t>((b * T + t) * E + e)] / T;
                for (int j = 0; j < K; j++)
                    f += choice[static_cast<size_t>((b * T + t) * K + j)] == e ? 1.0 / (T * K) : 0;
            }
            balance += f * P_e;
        }
        aux += mc.moe_aux_loss * E * balance / B;
    }
    for (int r = 0; r < BT; r++) aux += mc.moe_z_loss * lse[static_cast<size_t>(r)] * lse[static_cast<size_t>(r)] / BT;
    std::vector<double> y(static_cast<size_t>(C));
    for (int r = 0; r < BT; r++) {
        double* o = &out[static_cast<size_t>(r * C)];
        const double* x = &ln[static_cast<size_t>(r * C)];
        std::fill(o, o + C, 0.0);
        if (mc.moe_shared_experts > 0) ffn64(o, x, l, -1);
        for (int j = 0; j < K; j++) {
            const size_t s = static_cast<size_t>(r * K + j);
            if (!kept[s]) continue;
            ffn64(y.data(), x, l, choice[s]);
            for (int c = 0; c < C; c++) o[c] += gate[s] * y[static_cast<size_t>(c)];
        }
    }
    return aux;
}

bool ModelSample::ok() const {
    return std::abs(analytic - fd) <= bound;
}

ModelProbe model_fd_samples(const ModelConfig& mc, const Numerics& nx, const ModelFdOptions& o) {
    const int B = o.B, T = o.T > 0 ? o.T : static_cast<int>(mc.seq_len);
    if (B < 1 || T < 1 || T > mc.seq_len) {
        std::string msg =
            "gradcheck: the batch must be at least one sequence of 1 to model.seq_len (";
        msg += std::to_string(mc.seq_len);
        msg += ") tokens";
        throw ConfigError(msg);
    }
    std::vector<int> tok, tgt;
    for (int i = 0; i < B * T; i++) {
        tok.push_back(static_cast<int>((i * 7 + 3) % mc.vocab));
        tgt.push_back(static_cast<int>((i * 5 + 1) % mc.vocab));
    }
    GPT model(mc, nx);
    for (size_t i = 0; i < model.table().entries.size(); i++) {
        const Tensor t = model.param(static_cast<int>(i));
        fill_normal(t.f32(), t.numel(), 0.0f, o.init_std, o.seed, static_cast<u32>(i), 0);
    }

    ModelProbe probe;
    std::vector<RouterStats> router(static_cast<size_t>(mc.layers));
    for (RouterStats& r : router) r.reset(mc.moe_experts);
    if (mc.is_moe()) model.set_router_stats(router.data());
    model.forward(tok.data(), tgt.data(), B, T);
    model.set_router_stats(nullptr);
    double loss32 = 0;
    for (int i = 0; i < B * T; i++) loss32 += model.losses()[i];
    probe.loss32 = loss32 / (B * T);
    for (const RouterStats& r : router)  // the auxiliary losses the backward differentiates
        if (r.sequences > 0)
            probe.loss32 += mc.moe_aux_loss * router_unfixed(r.balance) / double(r.sequences) +
                            mc.moe_z_loss * router_unfixed(r.z) / double(r.token_count);
    std::vector<float> grads(static_cast<size_t>(model.grad_layout().total), 0.0f);
    model.backward(grads.data(), tok.data(), tgt.data(), 1.0f / static_cast<float>(B * T));
    model.combine_tied_grads(grads.data());

    RefGPT ref{mc, model.table(), {}};
    ref.p.assign(model.params(), model.params() + model.table().total);
    probe.loss64 = ref.loss(tok, tgt, B, T);
    probe.loss_bound = 60 * 6e-8 * std::abs(probe.loss64) + 1e-6;

    const double h = o.h;
    for (size_t ti = 0; ti < model.table().entries.size(); ti++) {
        const TableEntry& e = model.table().entries[ti];
        probe.names.push_back(e.name);
        probe.sizes.push_back(e.numel());
        const i64 n = e.numel();
        const int samples = static_cast<int>(std::min<i64>(n, o.samples));
        std::vector<ModelSample> got(static_cast<size_t>(samples));
        double scale = 0;
        for (int s = 0; s < samples; s++) {
            const i64 element = (s * 7919) % n, idx = e.offset + element;
            const double orig = ref.p[idx];
            ref.p[idx] = orig + h;
            const double lp = ref.loss(tok, tgt, B, T);
            ref.p[idx] = orig - h;
            const double lm = ref.loss(tok, tgt, B, T);
            ref.p[idx] = orig;
            got[s].tensor = static_cast<int>(ti);
            got[s].element = element;
            got[s].fd = (lp - lm) / (2 * h);
            got[s].analytic = grads[idx];
            scale = std::max(scale, std::abs(got[s].fd));
        }
        for (ModelSample& s : got) {
            s.bound = 1e-4 * scale + 1e-3 * std::abs(s.fd) + 1e-9;
            probe.samples.push_back(s);
        }
    }
    return probe;
}

std::vector<GradcheckRow> gradcheck_model(const ModelConfig& mc, const Numerics& nx,
                                          const ModelFdOptions& o) {
    const ModelProbe probe = model_fd_samples(mc, nx, o);
    std::vector<GradcheckRow> rows;
    GradcheckRow loss;
    loss.op = "model";
    loss.tensor = "loss";
    loss.kind = "loss";
    loss.size = 1;
    loss.add(0, std::abs(probe.loss32 - probe.loss64), probe.loss_bound, probe.loss32,
             probe.loss64);
    rows.push_back(loss);
    for (size_t t = 0; t < probe.names.size(); t++) {
        GradcheckRow row;
        row.op = "model";
        row.tensor = probe.names[t];
        row.kind = "gradient";
        row.size = probe.sizes[t];
        for (const ModelSample& s : probe.samples)
            if (s.tensor == static_cast<int>(t))
                row.add(s.element, std::abs(s.analytic - s.fd), s.bound, s.analytic, s.fd);
        rows.push_back(row);
    }
    return rows;
}

ModelConfig scaled_model(const ModelConfig& mc, std::string* note) {
    ModelConfig s = mc;
    s.layers = std::min<i64>(mc.layers, 2);
    s.hidden = std::min<i64>(mc.hidden, 32);
    s.heads = std::max<i64>(1, std::min(mc.heads, s.hidden));
    while (s.hidden % s.heads != 0) s.heads--;
    s.ffn = std::min<i64>(mc.ffn, 4 * s.hidden);
    s.vocab = std::min<i64>(mc.vocab, 64);
    s.seq_len = std::min<i64>(mc.seq_len, 16);
    if (mc.is_moe()) {  // at most 8 experts of 4·hidden channels (top-k and shared kept below)
        s.moe_experts = std::min<i64>(mc.moe_experts, 8);
        s.moe_top_k = std::min(mc.moe_top_k, s.moe_experts);
        if (mc.expert_ffn() > 4 * s.hidden) s.moe_ffn = 4 * s.hidden;
        s.moe_shared_experts = std::min<i64>(mc.moe_shared_experts, 2);
    }
    s.init_from.clear();
    if (note) {
        note->clear();
        if (s == mc) return s;
        const auto part = [&](const char* key, i64 from, i64 to) {
            if (from == to) return;
            if (!note->empty()) *note += ", ";
            *note += key;
            *note += " ";
            *note += std::to_string(from);
            *note += " -> ";
            *note += std::to_string(to);
        };
        part("layers", mc.layers, s.layers);
        part("hidden", mc.hidden, s.hidden);
        part("heads", mc.heads, s.heads);
        part("ffn", mc.ffn, s.ffn);
        part("vocab", mc.vocab, s.vocab);
        part("seq_len", mc.seq_len, s.seq_len);
        part("moe_experts", mc.moe_experts, s.moe_experts);
        part("moe_top_k", mc.moe_top_k, s.moe_top_k);
        part("moe_ffn", mc.moe_ffn, s.moe_ffn);
        part("moe_shared_experts", mc.moe_shared_experts, s.moe_shared_experts);
        if (!mc.init_from.empty()) {
            if (!note->empty()) *note += ", ";
            *note += "random weights instead of model.init_from";
        }
    }
    return s;
}

}  // namespace px::gradcheck
