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

void check_precision_across(const PrecisionConfig& pr, const NumericsConfig& n) {
    if (pr.fp8 != "off" && pr.activations != "bf16")
        throw Problem{{"precision.fp8", "precision.activations"},
                      "precision.fp8 = " + quote(pr.fp8) +
                          " needs precision.activations = \"bf16\" (the activations between the "
                          "fp8 matmuls), got " +
                          quote(pr.activations) +
                          ": set precision.activations = \"bf16\", or precision.fp8 = \"off\""};
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
    at_least("spikes.window", sp.window, 4);
    at_most("spikes.window", sp.window, i64{1} << 20, "the window is sorted every step");
    at_least("spikes.min_history", sp.min_history, 3);
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
