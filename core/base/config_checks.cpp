// The config's single-key checks and the [precision] section's rules (config_checks.h).
#include "core/base/config_checks.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <limits>

namespace px::config_checks {

std::string quote(std::string_view s) {
    std::string out = "\"";
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\f':
                out += "\\f";
                break;
            case '\r':
                out += "\\r";
                break;
            default:
                if (c < 0x20 || c == 0x7F) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04X", c);
                    out += buf;
                } else {
                    out += ch;
                }
        }
    }
    return out + "\"";
}

std::string number(double x) {
    if (std::isnan(x)) return std::signbit(x) ? "-nan" : "nan";
    if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, r.ptr);
}

Problem out_of_range(const std::string& key, const std::string& value, const std::string& rule) {
    return {{key}, key + " = " + value + " is out of range: must be " + rule};
}

void at_least(const char* key, i64 v, i64 min) {
    if (v < min) throw out_of_range(key, std::to_string(v), ">= " + std::to_string(min));
}

void finite(const char* key, double v) {
    if (!std::isfinite(v))
        throw Problem{{key}, std::string(key) + " = " + number(v) + " is not a finite number"};
}

void positive(const char* key, double v) {
    finite(key, v);
    if (!(v > 0)) throw out_of_range(key, number(v), "> 0");
}

void non_negative(const char* key, double v) {
    finite(key, v);
    if (!(v >= 0)) throw out_of_range(key, number(v), ">= 0");
}

void below_2_63(const char* key, std::uint64_t v) {
    if (v > static_cast<std::uint64_t>(INT64_MAX))
        throw out_of_range(key, std::to_string(v), "< 2^63 (TOML integers are signed 64-bit)");
}

void one_of(const char* key, const std::string& v, const std::vector<std::string>& allowed) {
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return;
    std::string list;
    for (std::size_t i = 0; i < allowed.size(); i++)
        list += (i == 0 ? "" : i + 1 == allowed.size() ? " or " : ", ") + quote(allowed[i]);
    throw Problem{{key}, std::string(key) + " must be " + list + ", got " + quote(v)};
}

// precision.activations: each name, its dtype, and whether kernels for it are registered
// (kernels/backend.cpp). A dtype becomes usable by registering its kernels and setting `ready`.
struct ActivationPrecision {
    const char* name;
    DType dtype;
    bool ready;
};
constexpr ActivationPrecision kActivationPrecisions[] = {
    {"fp32", DType::f32, true},
    {"bf16", DType::bf16, true},
    {"fp16", DType::f16, true},
};

DType check_activations(const std::string& v) {
    std::vector<std::string> ready;
    for (const ActivationPrecision& p : kActivationPrecisions)
        if (p.ready) ready.emplace_back(p.name);
    for (const ActivationPrecision& p : kActivationPrecisions) {
        if (v != p.name) continue;
        if (!p.ready)
            throw Problem{{"precision.activations"},
                          "precision.activations = " + quote(v) + " is not supported yet: " + v +
                              " activations need " + v +
                              " kernels (registered in kernels/backend.cpp); use \"fp32\""};
        return p.dtype;
    }
    one_of("precision.activations", v, ready);  // throws: no dtype has that name
    return DType::f32;
}

void at_most(const char* key, i64 v, i64 max, const char* why) {
    if (v > max)
        throw out_of_range(key, std::to_string(v), "<= " + std::to_string(max) + " (" + why + ")");
}

void check_precision_keys(const PrecisionConfig& pr) {
    check_activations(pr.activations);
    positive("precision.loss_scale_init", pr.loss_scale_init);
    if (pr.loss_scale_init > std::numeric_limits<float>::max() ||
        pr.loss_scale_init < std::numeric_limits<float>::min())
        throw out_of_range("precision.loss_scale_init", number(pr.loss_scale_init),
                           "in [1.1754944e-38, 3.4028235e38] (the scale is a normal fp32 number)");
    at_least("precision.loss_scale_growth_interval", pr.loss_scale_growth_interval, 1);
    finite("precision.loss_scale_growth_factor", pr.loss_scale_growth_factor);
    if (!(pr.loss_scale_growth_factor > 1))
        throw out_of_range("precision.loss_scale_growth_factor",
                           number(pr.loss_scale_growth_factor), "> 1");
    finite("precision.loss_scale_backoff_factor", pr.loss_scale_backoff_factor);
    if (!(pr.loss_scale_backoff_factor > 0 && pr.loss_scale_backoff_factor < 1))
        throw out_of_range("precision.loss_scale_backoff_factor",
                           number(pr.loss_scale_backoff_factor), "in (0, 1), e.g. 0.5");
    one_of("precision.fp8", pr.fp8, {"off", "delayed", "block"});
    at_least("precision.fp8_block_size", pr.fp8_block_size, 1);
    at_most("precision.fp8_block_size", pr.fp8_block_size, i64{1} << 20, "a tile of a row");
    at_least("precision.fp8_amax_history_len", pr.fp8_amax_history_len, 1);
    at_most("precision.fp8_amax_history_len", pr.fp8_amax_history_len, i64{1} << 20,
            "a history is kept per tensor and saved in checkpoints");
    one_of("precision.fp8_amax_compute_algo", pr.fp8_amax_compute_algo, {"max", "most_recent"});
    at_least("precision.fp8_margin", pr.fp8_margin, 0);
    at_most("precision.fp8_margin", pr.fp8_margin, 126, "2^margin must be a finite fp32 number");
    at_least("precision.fp8_accumulator_promote", pr.fp8_accumulator_promote, 0);
    at_most("precision.fp8_accumulator_promote", pr.fp8_accumulator_promote, i64{1} << 20,
            "a segment of a block of numerics.block");
}

void check_moe_keys(const ModelConfig& m) {
    at_least("model.moe_experts", m.moe_experts, 0);
    at_most("model.moe_experts", m.moe_experts, i64{1} << 16, "a token's routes are 16-bit ids");
    at_least("model.moe_top_k", m.moe_top_k, 1);
    at_least("model.moe_ffn", m.moe_ffn, 0);
    at_least("model.moe_shared_experts", m.moe_shared_experts, 0);
    at_most("model.moe_shared_experts", m.moe_shared_experts, i64{1} << 16,
            "a shared MLP of more experts than routed ones is a dense model");
    at_least("model.moe_every", m.moe_every, 1);
    non_negative("model.moe_capacity_factor", m.moe_capacity_factor);
    finite("model.moe_capacity_factor", m.moe_capacity_factor);
    non_negative("model.moe_aux_loss", m.moe_aux_loss);
    finite("model.moe_aux_loss", m.moe_aux_loss);
    non_negative("model.moe_z_loss", m.moe_z_loss);
    finite("model.moe_z_loss", m.moe_z_loss);
    if (m.is_moe())
        at_most("model.layers", m.layers, (INT_MAX - 4) / 17,
                "tensor ids are 32-bit integers, and a MoE layer has 17 tensors");
    const double expert_weights = 2.0 * double(m.layers) * double(m.moe_experts) *
                                  double(m.expert_ffn()) * double(m.hidden);
    if (m.is_moe() && expert_weights >= std::ldexp(1.0, 50))
        throw Problem{{"model.moe_experts", "model.moe_ffn", "model.layers", "model.hidden"},
                      "model.moe_experts=" + std::to_string(m.moe_experts) + " experts of " +
                          std::to_string(m.expert_ffn()) + " channels on " +
                          std::to_string(m.layers) + " layers of " + std::to_string(m.hidden) +
                          " give " + number(expert_weights) +
                          " expert weights, more than 2^50 (no machine holds that many); lower "
                          "model.moe_experts"};
    if (m.is_moe() && m.moe_top_k > m.moe_experts)
        throw Problem{{"model.moe_top_k", "model.moe_experts"},
                      "model.moe_top_k=" + std::to_string(m.moe_top_k) + " exceeds model.moe_experts=" +
                          std::to_string(m.moe_experts) +
                          ": a token is routed to at most every expert once; lower moe_top_k"};
    if (m.is_moe() && m.moe_every > m.layers)
        throw Problem{{"model.moe_every", "model.layers"},
                      "model.moe_every=" + std::to_string(m.moe_every) + " exceeds model.layers=" +
                          std::to_string(m.layers) +
                          ": no layer would be MoE; lower moe_every, or set moe_experts = 0"};
}

void check_moe_across(const Config& c) {
    if (!c.model.is_moe()) return;
    if (c.precision.activations != "fp32" || c.precision.fp8 != "off")
        throw Problem{{"model.moe_experts", "precision.activations", "precision.fp8"},
                      "model.moe_experts=" + std::to_string(c.model.moe_experts) +
                          " runs with precision.activations = \"fp32\" and precision.fp8 = \"off\" "
                          "(the experts' gathered matmuls are fp32 kernels), got " +
                          quote(c.precision.activations) + " and " + quote(c.precision.fp8) +
                          ": use fp32, or a dense model (moe_experts = 0)"};
    if (!c.output.export_llmc.empty())
        throw Problem{{"model.moe_experts", "output.export_llmc"},
                      "output.export_llmc = " + quote(c.output.export_llmc) +
                          " with model.moe_experts=" + std::to_string(c.model.moe_experts) +
                          ": llm.c checkpoints hold dense MLPs only; set output.export_llmc = \"\""};
    if (c.validate.replica_check_every > 0 && c.layout.ep > 1)
        throw Problem{{"validate.replica_check_every", "layout.ep"},
                      "validate.replica_check_every=" + std::to_string(c.validate.replica_check_every) +
                          " compares the data-parallel replicas' weights, but with layout.ep=" +
                          std::to_string(c.layout.ep) +
                          " the replicas hold different experts: not implemented yet; use "
                          "validate.replica_check_every = 0 or layout.ep = 1"};
    if (c.layout.tp > 1 && c.layout.sequence_parallel)
        throw Problem{{"model.moe_experts", "layout.sequence_parallel"},
                      "model.moe_experts=" + std::to_string(c.model.moe_experts) +
                          " with layout.tp=" + std::to_string(c.layout.tp) +
                          " and layout.sequence_parallel = true: a MoE layer runs whole on every "
                          "tensor-parallel rank (its experts are replicated over tp, not split), "
                          "on every token of the microbatch; set layout.sequence_parallel = false"};
}

void check_precision_across(const PrecisionConfig& pr, const NumericsConfig& n) {
    if (pr.fp8 != "off" && pr.activations != "bf16")
        throw Problem{{"precision.fp8", "precision.activations"},
                      "precision.fp8 = " + quote(pr.fp8) +
                          " needs precision.activations = \"bf16\" (the activations between the "
                          "fp8 matmuls), got " +
                          quote(pr.activations) +
                          ": set precision.activations = \"bf16\", or precision.fp8 = \"off\""};
    if (pr.fp8 != "off" && pr.fp8_accumulator_promote > 0 && pr.fp8_lm_head)
        throw Problem{{"precision.fp8_accumulator_promote", "precision.fp8_lm_head"},
                      "precision.fp8_accumulator_promote = " +
                          std::to_string(pr.fp8_accumulator_promote) +
                          " with precision.fp8_lm_head = true: the narrow accumulator is emulated "
                          "for the blocks' fp8 linears, not for the LM head's (vocabulary-parallel) "
                          "matmul; set precision.fp8_lm_head = false, or "
                          "precision.fp8_accumulator_promote = 0"};
    if (pr.fp8 != "off" && pr.fp8_accumulator_promote > n.block)
        throw Problem{
            {"precision.fp8_accumulator_promote", "numerics.block"},
            "precision.fp8_accumulator_promote = " + std::to_string(pr.fp8_accumulator_promote) +
                " is larger than numerics.block = " + std::to_string(n.block) +
                ": a narrow sum is promoted at the latest at the end of its block (blocks "
                "combine in fp32, in the canonical tree); set numerics.block to at least " +
                std::to_string(pr.fp8_accumulator_promote) +
                " (128 promotes every 128 products, as DeepSeek-V3 does), or promote at most " +
                std::to_string(n.block)};
}

void check_spikes_keys(const SpikesConfig& sp) {
    one_of("spikes.action", sp.action, {"off", "log", "skip", "clip", "rollback"});
    at_least("spikes.window", sp.window, kSpikeMinHistory);
    at_most("spikes.window", sp.window, i64{1} << 20, "the window is sorted every step");
    if (sp.min_history < kSpikeMinHistory)
        throw Problem{{"spikes.min_history"},
                      "spikes.min_history=" + std::to_string(sp.min_history) + " is below " +
                          std::to_string(kSpikeMinHistory) +
                          ": the median and MAD of so few steps are too unsteady to judge by (on "
                          "steady Gaussian noise a robust z above 6 comes by chance on 0.24% of "
                          "steps judged against 10, 8% against 3; 0.02% against 20), so normal "
                          "batches would be flagged; set spikes.min_history to at least " +
                          std::to_string(kSpikeMinHistory) +
                          " (the first steps are then not judged)"};
    if (sp.min_history > sp.window)
        throw Problem{{"spikes.min_history", "spikes.window"},
                      "spikes.min_history=" + std::to_string(sp.min_history) + " is more than spikes.window=" +
                          std::to_string(sp.window) + ": the window never holds that many steps; choose "
                          "min_history <= window"};
    finite("spikes.z_threshold", sp.z_threshold);
    positive("spikes.z_threshold", sp.z_threshold);
    finite("spikes.clip_z", sp.clip_z);
    positive("spikes.clip_z", sp.clip_z);
    at_least("spikes.snapshot_every", sp.snapshot_every, 1);
    one_of("spikes.rollback_to", sp.rollback_to, {"memory", "checkpoint"});
    one_of("spikes.skip", sp.skip, {"spike", "since_snapshot"});
}

}  // namespace px::config_checks

namespace px::config_checks {

namespace {

// "1-4,6": the items between commas, each trimmed.
std::vector<std::string> items_of(const std::string& spec) {
    std::vector<std::string> out;
    size_t at = 0;
    for (;;) {
        const size_t comma = std::min(spec.find(',', at), spec.size());
        std::string item = spec.substr(at, comma - at);
        const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
        out.push_back(b == std::string::npos ? std::string() : item.substr(b, e - b + 1));
        if (comma == spec.size()) return out;
        at = comma + 1;
    }
}

}  // namespace

std::vector<bool> fp8_blocks(const PrecisionConfig& pr, i64 layers) {
    const size_t L = static_cast<size_t>(std::max<i64>(layers, 0));
    std::vector<bool> mask(L, true);
    const std::string& spec = pr.fp8_layers;
    if (spec.empty()) {
        if (pr.fp8_keep_ends_bf16 && L > 0) mask.front() = mask.back() = false;
        return mask;
    }
    if (spec == "all") return mask;
    mask.assign(L, false);
    if (spec == "none") return mask;
    const std::string key = "precision.fp8_layers";
    auto bad = [&](const std::string& why) {
        return Problem{{key},
                       key + " = " + quote(spec) + ": " + why +
                           "; write \"all\", \"none\", or 0-based block indices and "
                           "inclusive ranges such as \"1-4,6\" (model.layers = " +
                           std::to_string(layers) + ")"};
    };
    auto index = [&](const std::string& s) -> i64 {
        i64 v = -1;
        const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || v < 0)
            throw bad(quote(s) + " is not a block index");
        if (v >= layers)
            throw bad("block " + s + " is beyond the last block, " + std::to_string(layers - 1));
        return v;
    };
    for (const std::string& item : items_of(spec)) {
        if (item.empty()) throw bad("an empty item between commas");
        const size_t dash = item.find('-', 1);
        i64 lo = 0, hi = 0;
        if (dash == std::string::npos) {
            lo = hi = index(item);
        } else {
            auto trim = [](std::string s) {
                const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
                return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
            };
            lo = index(trim(item.substr(0, dash)));
            hi = index(trim(item.substr(dash + 1)));
            if (hi < lo) throw bad("the range " + quote(item) + " runs backwards");
        }
        for (i64 i = lo; i <= hi; i++) mask[static_cast<size_t>(i)] = true;
    }
    return mask;
}

void check_fp8_layers(const PrecisionConfig& pr, i64 layers) {
    if (!pr.fp8_layers.empty() && !pr.fp8_keep_ends_bf16)
        throw Problem{{"precision.fp8_layers", "precision.fp8_keep_ends_bf16"},
                      "precision.fp8_keep_ends_bf16 = false and precision.fp8_layers = " +
                          quote(pr.fp8_layers) +
                          " both choose the fp8 blocks: keep one (fp8_keep_ends_bf16 = false is "
                          "fp8_layers = \"all\")"};
    fp8_blocks(pr, layers);  // throws on a bad spec
}

std::vector<std::string> fp8_compare_recipes(const std::string& compare) {
    std::vector<std::string> out;
    if (compare.empty()) return out;
    for (const std::string& item : items_of(compare)) {
        one_of("fp8_monitor.compare", item, {"current", "block"});
        if (std::find(out.begin(), out.end(), item) != out.end())
            throw Problem{{"fp8_monitor.compare"},
                          "fp8_monitor.compare = " + quote(compare) + " names " + quote(item) +
                              " twice; write \"current\", \"block\" or \"current,block\""};
        out.push_back(item);
    }
    return out;
}

void check_fp8_monitor_keys(const Fp8MonitorConfig& m) {
    at_least("fp8_monitor.every", m.every, 0);
    fp8_compare_recipes(m.compare);
    non_negative("fp8_monitor.scale_jump", m.scale_jump);
    if (m.scale_jump != 0 && !(m.scale_jump > 1))
        throw out_of_range("fp8_monitor.scale_jump", number(m.scale_jump),
                           "> 1 (a factor), or 0 for no scale-jump alerts");
    finite("fp8_monitor.saturation_max", m.saturation_max);
    if (!(m.saturation_max >= 0 && m.saturation_max <= 1))
        throw out_of_range("fp8_monitor.saturation_max", number(m.saturation_max),
                           "in [0, 1] (a fraction; 1: no saturation alerts)");
    finite("fp8_monitor.sqnr_min_db", m.sqnr_min_db);
}

void check_fp8_monitor_across(const Fp8MonitorConfig& m, const PrecisionConfig& pr) {
    if (m.every > 0 && pr.fp8 == "off")
        throw Problem{{"fp8_monitor.every", "precision.fp8"},
                      "fp8_monitor.every = " + std::to_string(m.every) +
                          " monitors fp8 casts, but precision.fp8 = \"off\": set precision.fp8 "
                          "= \"delayed\" or \"block\", or fp8_monitor.every = 0"};
    for (const std::string& c : fp8_compare_recipes(m.compare))
        if (c == pr.fp8)
            throw Problem{{"fp8_monitor.compare", "precision.fp8"},
                          "fp8_monitor.compare = " + quote(m.compare) + " names " + quote(c) +
                              ", the run's own recipe (precision.fp8), which the monitor "
                              "measures anyway; compare with another recipe"};
}

}  // namespace px::config_checks
