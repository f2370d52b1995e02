// The Llama model in plain fp64 (gradcheck.h RefGPT::llama_loss), for the whole-model gradient
// check of model.arch = "llama": written from the definition, not from the fp32 code. Its MoE
// layers are RefGPT::moe64 (router, top-k, capacity, gates, auxiliary losses), whose experts
// and shared experts are SwiGLU MLPs without biases here (RefGPT::ffn64).
#include "validators/gradcheck.h"

#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace px::gradcheck {

namespace {

// out (C) = x·rstd·w, rstd = 1/sqrt(mean(x²) + eps); out may alias x.
void rmsnorm64(double* out, const double* x, const double* w, int C, double eps) {
    double ms = 0;
    for (int i = 0; i < C; i++) ms += x[i] * x[i];
    const double rstd = 1.0 / std::sqrt(ms / C + eps);
    for (int i = 0; i < C; i++) out[i] = x[i] * rstd * w[i];
}

void linear64(double* out, const double* x, const double* w, int C, int OC) {
    for (int o = 0; o < OC; o++) {
        double s = 0;
        for (int i = 0; i < C; i++) s += x[i] * w[o * C + i];
        out[o] = s;
    }
}

// One head (HS) turned in place by the angles of its position: pairs (i, i + HS/2).
void rope64(double* x, const std::vector<double>& cosv, const std::vector<double>& sinv, int HS) {
    const int h = HS / 2;
    for (int i = 0; i < h; i++) {
        const double a = x[i], b = x[i + h];
        x[i] = a * cosv[i] - b * sinv[i];
        x[i + h] = b * cosv[i] + a * sinv[i];
    }
}

}  // namespace

double RefGPT::llama_loss(const std::vector<int>& tok, const std::vector<int>& tgt, int B,
                          int T) const {
    const int C = static_cast<int>(mc.hidden), NH = static_cast<int>(mc.heads);
    const int KVH = static_cast<int>(mc.kv_head_count()), HS = static_cast<int>(mc.head_size());
    const int V = static_cast<int>(mc.vocab);
    const int CA = NH * HS, KVC = KVH * HS, group = NH / KVH, BT = B * T;
    const double eps = mc.norm_eps;
    // The angles as the fp32 table forms them: float(p)·inv_freq in fp32, then cos and sin.
    ops::RopeScaling scaling;
    scaling.factor = mc.rope_factor;
    scaling.low_freq_factor = mc.rope_low_freq_factor;
    scaling.high_freq_factor = mc.rope_high_freq_factor;
    scaling.original_max_position_embeddings = static_cast<double>(mc.rope_original_max_positions);
    const std::vector<float> inv = ops::rope_inv_freq(HS, mc.rope_theta, scaling);
    std::vector<std::vector<double>> cosv(static_cast<size_t>(T)), sinv(static_cast<size_t>(T));
    for (int t = 0; t < T; t++)
        for (float f : inv) {
            const float angle = static_cast<float>(t) * f;
            cosv[t].push_back(std::cos(static_cast<double>(angle)));
            sinv[t].push_back(std::sin(static_cast<double>(angle)));
        }

    std::vector<double> x(static_cast<size_t>(BT * C)), ln(x.size()), tmp(x.size());
    std::vector<double> q(static_cast<size_t>(BT * CA)), y(q.size());
    std::vector<double> k(static_cast<size_t>(BT * KVC)), v(k.size());
    double aux = 0;  // the MoE layers' auxiliary losses
    for (int r = 0; r < BT; r++)
        for (int i = 0; i < C; i++) x[r * C + i] = P(table.wte)[tok[r] * C + i];
    for (int l = 0; l < mc.layers; l++) {
        auto W = [&](LayerParam p) { return P(table.layer_index(l, p)); };
        for (int r = 0; r < BT; r++) {
            const int t = r % T;
            rmsnorm64(&ln[r * C], &x[r * C], W(LN1W), C, eps);
            linear64(&q[r * CA], &ln[r * C], W(QW), C, CA);
            linear64(&k[r * KVC], &ln[r * C], W(KW), C, KVC);
            linear64(&v[r * KVC], &ln[r * C], W(VW), C, KVC);
            for (int h = 0; h < NH; h++) {
                double* qh = &q[r * CA + h * HS];
                if (mc.qk_norm) rmsnorm64(qh, qh, W(QNORMW), HS, eps);
                rope64(qh, cosv[t], sinv[t], HS);
            }
            for (int h = 0; h < KVH; h++) {
                double* kh = &k[r * KVC + h * HS];
                if (mc.qk_norm) rmsnorm64(kh, kh, W(KNORMW), HS, eps);
                rope64(kh, cosv[t], sinv[t], HS);
            }
        }
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                    const int kvh = h / group;
                    std::vector<double> a(static_cast<size_t>(t + 1));
                    const double* qh = &q[(b * T + t) * CA + h * HS];
                    double mx = -1e300;
                    for (int s = 0; s <= t; s++) {
                        const double* kh = &k[(b * T + s) * KVC + kvh * HS];
                        double d = 0;
                        for (int i = 0; i < HS; i++) d += qh[i] * kh[i];
                        a[s] = d / std::sqrt(static_cast<double>(HS));
                        mx = std::max(mx, a[s]);
                    }
                    double sum = 0;
                    for (int s = 0; s <= t; s++) sum += (a[s] = std::exp(a[s] - mx));
                    for (int i = 0; i < HS; i++) {
                        double o = 0;
                        for (int s = 0; s <= t; s++)
                            o += a[s] / sum * v[(b * T + s) * KVC + kvh * HS + i];
                        y[(b * T + t) * CA + h * HS + i] = o;
                    }
                }
        for (int r = 0; r < BT; r++) {
            linear64(&tmp[r * C], &y[r * CA], W(ATTPROJW), CA, C);
            for (int i = 0; i < C; i++) x[r * C + i] += tmp[r * C + i];
            rmsnorm64(&ln[r * C], &x[r * C], W(LN2W), C, eps);
        }
        // SwiGLU (ffn64), or a MoE layer: the router, its SwiGLU experts and shared experts
        if (!mc.moe_layer(l))
            for (int r = 0; r < BT; r++) ffn64(&tmp[r * C], &ln[r * C], l, -1);
        else
            aux += moe64(tmp, ln, l, B, T);
        for (int r = 0; r < BT; r++)
            for (int i = 0; i < C; i++) x[r * C + i] += tmp[r * C + i];
    }
    const double* head = P(mc.tied_head() ? table.wte : table.lm_head);
    double total = 0;
    std::vector<double> logits(static_cast<size_t>(V));
    for (int r = 0; r < BT; r++) {
        rmsnorm64(&ln[r * C], &x[r * C], P(table.lnfw), C, eps);
        linear64(logits.data(), &ln[r * C], head, C, V);
        const double mx = *std::max_element(logits.begin(), logits.end());
        double sum = 0;
        for (double lv : logits) sum += std::exp(lv - mx);
        total += std::log(sum) - (logits[tgt[r]] - mx);
    }
    return total / BT + aux;
}

}  // namespace px::gradcheck
