// The config's validation (config_checks.h): the single-key checks, each section's rules, and
// check_config, which runs them all in order.
#include "core/base/config_checks.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <initializer_list>
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

// ---- the whole config ----

namespace {

constexpr i64 kMaxMarkovStates = i64{1} << 22;

// Sizes no machine holds. Counters and ids have fixed widths; and no product of sizes may reach
// 2^50 elements (4 PiB of fp32), so that every size computed from them fits in 64 bits with room
// to spare. (Whether a job fits this machine is judged later, from a memory estimate.)
void check_limits(const Config& c) {
    const ModelConfig& m = c.model;
    const TrainConfig& t = c.train;
    constexpr i64 k32 = i64{1} << 32;
    at_most("model.vocab", m.vocab, i64{1} << 31, "tokens are 32-bit integers");
    const char* sampler = "the data sampler's counters are 32 bits";
    at_most("model.seq_len", m.seq_len, k32 - 2, sampler);
    at_most("model.layers", m.layers, (INT_MAX - 4) / 12, "tensor ids are 32-bit integers");
    at_most("train.steps", t.steps, k32, sampler);
    at_most("train.batch_size", t.batch_size, k32, sampler);
    at_most("train.val_batches", t.val_batches, k32, sampler);
    at_most("train.threads", t.threads, 1024, "OpenMP threads per rank; 0 uses all cores");
    const LayoutConfig& l = c.layout;
    if (double(l.dp) * double(l.pp) * double(l.cp) * double(l.tp) > double(INT_MAX))
        throw Problem{{"layout.dp", "layout.pp", "layout.cp", "layout.tp"},
                      "layout.dp=" + std::to_string(l.dp) + " x layout.pp=" + std::to_string(l.pp) +
                          " x layout.cp=" + std::to_string(l.cp) +
                          " x layout.tp=" + std::to_string(l.tp) +
                          " ranks is more than 2^31 - 1 (ranks are 32-bit integers)"};
    const double kMax = std::ldexp(1.0, 50);
    struct Factor {
        const char* key;
        i64 value;
    };
    auto product = [&](const char* what, std::initializer_list<Factor> factors, double extra = 1) {
        double n = extra;
        for (const Factor& f : factors) n *= static_cast<double>(f.value);
        if (n < kMax) return;
        Problem p;
        std::string terms;
        const Factor* largest = factors.begin();
        for (const Factor& f : factors) {
            p.keys.emplace_back(f.key);
            terms += (terms.empty() ? "" : " x ") + std::string(f.key) + "=" +
                     std::to_string(f.value);
            if (f.value > largest->value) largest = &f;
        }
        p.text = terms + " gives " + number(n) + " " + what +
                 ", more than 2^50 (no machine holds that many); lower " + largest->key;
        throw p;
    };
    const Factor L{"model.layers", m.layers}, C{"model.hidden", m.hidden}, F{"model.ffn", m.ffn},
        V{"model.vocab", m.vocab}, T{"model.seq_len", m.seq_len}, NH{"model.heads", m.heads},
        B{"train.batch_size", t.batch_size}, VB{"train.val_batches", t.val_batches};
    product("parameters in attention weights", {L, C, C}, 4);
    product("parameters in MLP weights", {L, C, F}, 2);
    product("embedding parameters", {V, C});
    product("position embedding parameters", {T, C});
    product("validation tokens", {VB, B, T});
    product("logits per step", {B, T, V});
    product("activations per step", {L, B, T, C}, 8);
    product("activations per step", {L, B, T, F}, 2);
    // Attention scores are made a microbatch of a replica at a time: L·micro_B·NH·T² at most.
    const i64 replicas_mb = i64(std::max(1, l.dp)) *
                            std::max<i64>(1, l.microbatches > 0 ? l.microbatches : t.microbatches);
    const Factor MB{"train.batch_size", t.batch_size % replicas_mb == 0
                                            ? t.batch_size / replicas_mb
                                            : t.batch_size};
    product("attention scores per microbatch", {L, MB, NH, T, T});
}

// The llama block's keys (model.arch = "llama"): GQA's KV heads, the head size, RMSNorm's epsilon
// and RoPE's frequencies.
void check_llama_keys(const ModelConfig& m) {
    at_least("model.kv_heads", m.kv_heads, 0);
    at_least("model.head_dim", m.head_dim, 0);
    if (m.heads % m.kv_head_count() != 0)
        throw Problem{{"model.kv_heads", "model.heads"},
                      "model.kv_heads=" + std::to_string(m.kv_heads) + " does not divide model.heads=" +
                          std::to_string(m.heads) +
                          ": each KV head serves heads / kv_heads query heads (1: multi-query, = heads: "
                          "multi-head)"};
    if (m.head_size() % 2 != 0)
        throw Problem{{m.head_dim > 0 ? "model.head_dim" : "model.heads"},
                      std::string(m.head_dim > 0 ? "model.head_dim=" : "the head size hidden / heads = ") +
                          std::to_string(m.head_size()) +
                          " is odd: RoPE turns pairs of a head's channels; choose an even head size"};
    positive("model.norm_eps", m.norm_eps);
    finite("model.norm_eps", m.norm_eps);
    positive("model.rope_theta", m.rope_theta);
    finite("model.rope_theta", m.rope_theta);
    non_negative("model.rope_factor", m.rope_factor);
    finite("model.rope_factor", m.rope_factor);
    if (m.rope_factor > 0) {
        positive("model.rope_low_freq_factor", m.rope_low_freq_factor);
        finite("model.rope_high_freq_factor", m.rope_high_freq_factor);
        if (!(m.rope_high_freq_factor > m.rope_low_freq_factor))
            throw Problem{{"model.rope_high_freq_factor", "model.rope_low_freq_factor"},
                          "model.rope_high_freq_factor=" + number(m.rope_high_freq_factor) +
                              " must exceed model.rope_low_freq_factor=" +
                              number(m.rope_low_freq_factor) + " (Llama 3.1 uses 4 and 1)"};
        at_least("model.rope_original_max_positions", m.rope_original_max_positions, 1);
    }
}

}  // namespace

// Throws the first problem: single keys in table order, then constraints across keys.
void check_config(const Config& c) {
    const ModelConfig& m = c.model;
    const LayoutConfig& l = c.layout;
    const TrainConfig& t = c.train;
    const DataConfig& d = c.data;
    const NumericsConfig& n = c.numerics;

    at_least("model.vocab", m.vocab, 2);
    at_least("model.seq_len", m.seq_len, 1);
    at_least("model.layers", m.layers, 1);
    at_least("model.heads", m.heads, 1);
    at_least("model.hidden", m.hidden, 1);
    at_least("model.ffn", m.ffn, 1);
    positive("model.init_std", m.init_std);
    one_of("model.arch", m.arch, {"gpt2", "llama"});
    check_moe_keys(m);

    at_least("layout.dp", l.dp, 1);
    at_least("layout.pp", l.pp, 1);
    at_least("layout.tp", l.tp, 1);
    at_least("layout.cp", l.cp, 1);
    at_least("layout.ep", l.ep, 1);
    one_of("layout.cp_method", l.cp_method, {"ring", "ulysses"});
    if (l.zero < 0 || l.zero > 3) throw out_of_range("layout.zero", std::to_string(l.zero), "in 0..3");
    at_least("layout.microbatches", l.microbatches, 0);
    one_of("layout.schedule", l.schedule, {"gpipe", "1f1b", "interleaved", "zb-h1", "zbv"});
    at_least("layout.virtual_stages", l.virtual_stages, 1);
    one_of("layout.recompute", l.recompute, {"none", "full"});
    one_of("layout.comm", l.comm, {"auto", "canonical", "ring"});
    positive("layout.timeout_s", l.timeout_s);

    at_least("train.steps", t.steps, 1);
    at_least("train.batch_size", t.batch_size, 1);
    at_least("train.microbatches", t.microbatches, 1);
    positive("train.lr", t.lr);
    non_negative("train.min_lr", t.min_lr);
    at_least("train.warmup_steps", t.warmup_steps, 0);
    non_negative("train.weight_decay", t.weight_decay);
    finite("train.beta1", t.beta1);
    if (!(t.beta1 >= 0 && t.beta1 < 1)) throw out_of_range("train.beta1", number(t.beta1), "in [0, 1)");
    finite("train.beta2", t.beta2);
    if (!(t.beta2 >= 0 && t.beta2 < 1)) throw out_of_range("train.beta2", number(t.beta2), "in [0, 1)");
    positive("train.eps", t.eps);
    non_negative("train.grad_clip", t.grad_clip);
    below_2_63("train.seed", t.seed);
    at_least("train.eval_every", t.eval_every, 0);
    at_least("train.val_batches", t.val_batches, 1);
    at_least("train.threads", t.threads, 0);
    non_negative("train.max_memory_gib", t.max_memory_gib);
    at_least("train.lr_jump_step", t.lr_jump_step, 0);
    positive("train.lr_jump_factor", t.lr_jump_factor);
    at_least("train.lr_jump_steps", t.lr_jump_steps, 1);

    one_of("data.source", d.source, {"markov", "mixture", "copy", "bin"});
    at_least("data.markov_order", d.markov_order, 1);
    positive("data.markov_alpha", d.markov_alpha);
    below_2_63("data.markov_seed", d.markov_seed);
    at_least("data.markov_vocab", d.markov_vocab, 0);
    at_least("data.mixture_chains", d.mixture_chains, 2);
    at_least("data.copy_distance", d.copy_distance, 0);

    at_least("numerics.block", n.block, 1);
    check_precision_keys(c.precision);

    at_least("checkpoint.every", c.checkpoint.every, 0);
    at_least("checkpoint.keep", c.checkpoint.keep, 1);
    one_of("numerics.isa", n.isa, {"auto", "avx512", "avx2", "scalar"});
    at_least("validate.replica_check_every", c.validate.replica_check_every, 0);
    one_of("fault.kind", c.fault.kind, {"", "kill", "stall", "flip_grad", "flip_weight"});
    at_least("fault.rank", c.fault.rank, 0);
    at_least("fault.step", c.fault.step, 1);
    at_least("fault.element", c.fault.element, 0);
    if (c.fault.bit < 0 || c.fault.bit > 31)
        throw out_of_range("fault.bit", std::to_string(c.fault.bit), "in 0..31");
    non_negative("fault.stall_s", c.fault.stall_s);
    at_least("data.corrupt_step", d.corrupt_step, 0);
    one_of("data.corrupt_kind", d.corrupt_kind, {"repeat", "shuffle"});
    check_spikes_keys(c.spikes);
    check_fp8_monitor_keys(c.fp8_monitor);

    check_limits(c);

    if (m.llama()) check_llama_keys(m);
    if (!(m.llama() && m.head_dim > 0) && m.hidden % m.heads != 0)
        throw Problem{{"model.heads", "model.hidden"},
                      "model.heads=" + std::to_string(m.heads) + " does not divide model.hidden=" +
                          std::to_string(m.hidden) + ": choose heads that divide hidden (head size = hidden / heads)"};
    if (t.batch_size % t.microbatches != 0)
        throw Problem{{"train.microbatches", "train.batch_size"},
                      "train.microbatches=" + std::to_string(t.microbatches) + " does not divide train.batch_size=" +
                          std::to_string(t.batch_size) + ": every microbatch must hold the same number of sequences"};
    if (l.schedule == "zbv" && l.virtual_stages > 2)
        throw Problem{{"layout.virtual_stages", "layout.schedule"},
                      "layout.schedule = \"zbv\" runs two model chunks per rank (a V), got layout.virtual_stages=" +
                          std::to_string(l.virtual_stages) + ": leave it out or set it to 2"};
    if (l.virtual_stages > 1 && l.schedule != "interleaved" && l.schedule != "zbv")
        throw Problem{{"layout.virtual_stages", "layout.schedule"},
                      "layout.virtual_stages=" + std::to_string(l.virtual_stages) + " needs layout.schedule = " +
                          "\"interleaved\", got " + quote(l.schedule) +
                          ": only the interleaved schedule gives a pipeline rank several model chunks"};
    if (l.schedule == "interleaved" && l.virtual_stages < 2)
        throw Problem{{"layout.schedule", "layout.virtual_stages"},
                      "layout.schedule = \"interleaved\" needs layout.virtual_stages >= 2, got " +
                          std::to_string(l.virtual_stages) +
                          ": with one model chunk per rank use layout.schedule = \"1f1b\""};
    if (l.comm == "ring" && n.mode == Mode::bitwise)
        throw Problem{{"layout.comm", "numerics.mode"},
                      "layout.comm = \"ring\" breaks numerics.mode = \"bitwise\": a ring all-reduce sums in ring "
                      "order, not the canonical tree; use layout.comm = \"auto\" or \"canonical\", or "
                      "numerics.mode = \"fast\""};
    check_precision_across(c.precision, n);
    check_moe_across(c);
    check_fp8_layers(c.precision, m.layers);
    check_fp8_monitor_across(c.fp8_monitor, c.precision);
    if (c.checkpoint.resume == "auto" && c.checkpoint.dir.empty())
        throw Problem{{"checkpoint.resume", "checkpoint.dir"},
                      "checkpoint.resume = \"auto\" needs checkpoint.dir: set it to the folder the "
                      "checkpoints are in, or give checkpoint.resume a checkpoint file"};
    if (c.checkpoint.every > 0 && c.checkpoint.dir.empty())
        throw Problem{{"checkpoint.every", "checkpoint.dir"},
                      "checkpoint.every=" + std::to_string(c.checkpoint.every) +
                          " needs checkpoint.dir: set it to a folder for the checkpoints, or "
                          "checkpoint.every = 0"};
    if (c.validate.replica_check_every > 0 && l.dp < 2)
        throw Problem{{"validate.replica_check_every", "layout.dp"},
                      "validate.replica_check_every=" + std::to_string(c.validate.replica_check_every) +
                          " compares data-parallel replicas, but layout.dp = " + std::to_string(l.dp) +
                          ": use layout.dp >= 2, or validate.replica_check_every = 0"};
    if (!c.fault.kind.empty() && c.fault.step > t.steps)
        throw Problem{{"fault.step", "train.steps"},
                      "fault.step=" + std::to_string(c.fault.step) + " comes after the last step (train.steps=" +
                          std::to_string(t.steps) + "), so the fault would never strike: choose a step in 1.." +
                          std::to_string(t.steps)};
    if (d.corrupt_step > t.steps)
        throw Problem{{"data.corrupt_step", "train.steps"},
                      "data.corrupt_step=" + std::to_string(d.corrupt_step) + " comes after the last step (train.steps=" +
                          std::to_string(t.steps) + "), so no batch would be corrupted: choose a step in 1.." +
                          std::to_string(t.steps) + ", or 0 for none"};
    if (c.spikes.action == "rollback" && c.spikes.rollback_to == "checkpoint" && c.checkpoint.dir.empty())
        throw Problem{{"spikes.rollback_to", "checkpoint.dir"},
                      "spikes.rollback_to = \"checkpoint\" needs checkpoint.dir (and checkpoint.every) "
                      "so that there is a checkpoint to go back to: set them, or spikes.rollback_to = \"memory\""};
    if (c.spikes.action != "off" && (c.spikes.action != "log" || c.spikes.replay) &&
        c.validate.replica_check_every > 0)
        throw Problem{{"spikes.action", "validate.replica_check_every"},
                      "spikes.action = " + quote(c.spikes.action) + (c.spikes.replay ? " with spikes.replay" : "") +
                          " changes or re-runs steps, and so does the replica check "
                          "(validate.replica_check_every=" + std::to_string(c.validate.replica_check_every) +
                          "): run one of them at a time (spikes.action = \"log\" with spikes.replay = false "
                          "works beside it)"};
    if (t.lr_jump_step > t.steps)
        throw Problem{{"train.lr_jump_step", "train.steps"},
                      "train.lr_jump_step=" + std::to_string(t.lr_jump_step) +
                          " comes after the last step (train.steps=" + std::to_string(t.steps) +
                          "), so the learning rate would never jump: choose a step in 1.." +
                          std::to_string(t.steps) + ", or 0 for none"};
    if (t.min_lr > t.lr)
        throw Problem{{"train.min_lr", "train.lr"},
                      "train.min_lr=" + number(t.min_lr) + " is larger than train.lr=" + number(t.lr) +
                          ": the cosine decay must end at or below the peak learning rate"};
    if (d.source == "bin" && d.train_path.empty())
        throw Problem{{"data.train_path", "data.source"},
                      "data.source = \"bin\" needs data.train_path: set it to an llm.c .bin token file, "
                      "or use data.source = \"markov\""};
    if (d.source == "copy" && (d.markov_vocab > m.vocab || d.markov_vocab == 1))
        throw Problem{{"data.markov_vocab", "model.vocab"},
                      "data.markov_vocab=" + std::to_string(d.markov_vocab) +
                          ": the copy source draws from 2..model.vocab=" + std::to_string(m.vocab) +
                          " symbols (0 means model.vocab)"};
    if (d.source == "markov" || d.source == "mixture") {
        if (d.markov_vocab > m.vocab)
            throw Problem{{"data.markov_vocab", "model.vocab"},
                          "data.markov_vocab=" + std::to_string(d.markov_vocab) + " exceeds model.vocab=" +
                              std::to_string(m.vocab) + ": the model must be able to emit every symbol"};
        if (d.markov_vocab == 1)
            throw Problem{{"data.markov_vocab"},
                          "data.markov_vocab=1: a Markov chain needs at least 2 symbols (0 means "
                          "model.vocab)"};
        i64 V = d.markov_vocab > 0 ? d.markov_vocab : m.vocab;
        if (d.source == "mixture") {
            if (d.mixture_chains > V / 2)
                throw Problem{{"data.mixture_chains",
                               d.markov_vocab > 0 ? "data.markov_vocab" : "model.vocab"},
                              "data.mixture_chains=" + std::to_string(d.mixture_chains) + " with " +
                                  std::to_string(V) + " symbols (" +
                                  (d.markov_vocab > 0 ? "data.markov_vocab" : "model.vocab") +
                                  ") leaves a chain fewer than 2 symbols of its own: use at most " +
                                  std::to_string(V / 2) + " chains, or more symbols"};
            V /= d.mixture_chains;  // each chain's own symbols
        }
        i64 states = 1;  // V^k, counted only until it passes the limit (V = 1 stays 1: no loop)
        for (i64 k = 0; V >= 2 && k < d.markov_order && states <= kMaxMarkovStates; k++)
            states *= V;
        if (states > kMaxMarkovStates)
            throw Problem{{"data.markov_order", "data.markov_vocab"},
                          "data.markov_order=" + std::to_string(d.markov_order) + " with " +
                              std::to_string(V) + " symbols needs " + std::to_string(V) + "^" +
                              std::to_string(d.markov_order) + " Markov states, " +
                              "more than the limit of 2^22 = " + std::to_string(kMaxMarkovStates) +
                              ": lower data.markov_order, or set data.markov_vocab below model.vocab"};
    }
}

}  // namespace px::config_checks
