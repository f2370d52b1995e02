// The config's validation (core/base/config_checks.cpp): check_config, every rule in order, and
// the checks it is made of. Its Problems name keys but not the source; core/base/config.cpp gives
// them one (file and line, or the --set that caused them). Not for use outside
// core/base/config*.cpp.
//
// Index
//   Problem                      a problem with one or more keys, before it gets its source
//   quote, number                a string and a number as a message shows them
//   out_of_range, at_least, at_most, finite, positive, non_negative, below_2_63, one_of
//                                single-key range checks: each throws a Problem naming the key
//   check_activations            precision.activations -> its dtype (a Problem when it has none)
//   check_precision_keys         every [precision] key on its own
//   check_moe_keys, check_moe_across   the model's mixture-of-experts keys, alone and against
//                                the precision and the layout
//   check_precision_across       the rules between [precision] keys
//   check_spikes_keys            every [spikes] key, and window against min_history
//   fp8_blocks, check_fp8_layers precision.fp8_layers read against model.layers
//   fp8_compare_recipes, check_fp8_monitor_keys, check_fp8_monitor_across   [fp8_monitor]
//   check_config                 every rule: single keys in table order, then across keys
#pragma once
#include "core/base/config.h"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace px::config_checks {

// A problem with one or more keys, before it is given its source ("file:", "--set ...:").
struct Problem {
    std::vector<std::string> keys;
    std::string text;
};

std::string quote(std::string_view s);  // a TOML basic string
// A number in a message: the shortest text, without the ".0" TOML would need ("train.lr = -1").
std::string number(double x);

Problem out_of_range(const std::string& key, const std::string& value, const std::string& rule);
void at_least(const char* key, i64 v, i64 min);
void at_most(const char* key, i64 v, i64 max, const char* why);
void finite(const char* key, double v);
void positive(const char* key, double v);
void non_negative(const char* key, double v);
void below_2_63(const char* key, std::uint64_t v);
void one_of(const char* key, const std::string& v, const std::vector<std::string>& allowed);

DType check_activations(const std::string& v);
void check_precision_keys(const PrecisionConfig& pr);
void check_moe_keys(const ModelConfig& m);
void check_moe_across(const Config& c);
void check_precision_across(const PrecisionConfig& pr, const NumericsConfig& n);
void check_spikes_keys(const SpikesConfig& sp);
std::vector<bool> fp8_blocks(const PrecisionConfig& pr, i64 layers);  // per block: in fp8
void check_fp8_layers(const PrecisionConfig& pr, i64 layers);
std::vector<std::string> fp8_compare_recipes(const std::string& compare);  // "current", "block"
void check_fp8_monitor_keys(const Fp8MonitorConfig& m);
void check_fp8_monitor_across(const Fp8MonitorConfig& m, const PrecisionConfig& pr);

// Every rule: single keys in table order, then constraints across keys; throws the first Problem.
void check_config(const Config& c);

}  // namespace px::config_checks
