// The job config: TOML with sections [model] [layout] [train] [data] [numerics] [precision]
// [output] [checkpoint] [validate] [fault] [spikes] [fp8_monitor], one struct each
// (core/base/config_sections.h, whose defaults are the embedded default job). Every key is
// documented in its registry (core/base/config_registry.h), from which docs/config.md's tables
// are made (`parallax config --markdown`). Reading and writing TOML: config.cpp; validation:
// config_checks.cpp.
//
// Index
//   ModelConfig .. Config         the sections and the whole job (config_sections.h)
//   activation_dtype              the dtype precision.activations resolves to
//   parse_config                  TOML text -> Config; errors name the key (ConfigError)
//   load_config                   a file -> Config
//   apply_override(s)             "section.key=value" from --set
//   job_config                    the embedded default job or a file, then --set overrides: how
//                                 every front end (CLI, Python, workbench) makes a job's config
//   validate_config               ranges and cross-key constraints of a Config built in code
//   config_keys                   every "section.key", in file order
//   config_reference              every section and key with its type, default and meaning
//   default_config_toml           the embedded default job, as TOML text
//   config_to_toml                a Config back to TOML (stored in run files)
#pragma once
#include "core/base/config_sections.h"
#include "core/base/dtype.h"
#include "core/base/numerics.h"

#include <string>
#include <vector>

namespace px {

// Errors are ConfigError, "<source>: <what is wrong and what to do>", naming keys as section.key.
// A missing section or key keeps its default; unknown sections and keys are errors.
Config parse_config(const std::string& toml_text, const std::string& source_name);
Config load_config(const std::string& path);
// The value is read as a TOML value; text that is not TOML (or not a string, for a string key)
// is taken as a string, so `data.source=bin` works. The result is validated; on error cfg is
// unchanged and the message starts with "--set <assignment>:".
void apply_override(Config& cfg, const std::string& assignment);  // "section.key=value"
// Several --set at once, validated after all of them (so `model.heads=3 model.hidden=96` works in
// either order).
void apply_overrides(Config& cfg, const std::vector<std::string>& assignments);
// The config of a job: the embedded default job (path empty) or the file at `path`, then `sets`
// applied together as apply_overrides applies them.
Config job_config(const std::string& path, const std::vector<std::string>& sets = {});
void validate_config(const Config& cfg);  // throws ConfigError naming cfg.source_name and the key
std::vector<std::string> config_keys();   // "model.vocab", ..., "checkpoint.resume"

// The key reference, from the registry: every section in file order with what it holds and its
// keys, each with its type and range as the docs write them ("int ≥ 2"), its default as TOML
// writes it ("32", "\"markov\"", "true") and what it means.
struct KeyDoc {
    std::string name;  // "vocab"
    std::string type;
    std::string default_value;
    std::string meaning;
};
struct SectionDoc {
    std::string name;  // "model"
    std::string doc;
    std::vector<KeyDoc> keys;
};
std::vector<SectionDoc> config_reference();
const char* default_config_toml();         // the struct defaults, one comment line per key
std::string config_to_toml(const Config& cfg);  // complete and exact: parse_config gives cfg back
Numerics make_numerics(const NumericsConfig& nc);  // resolves isa "auto"; errors if unsupported here
DType activation_dtype(const PrecisionConfig& pc);  // ConfigError if it has no kernels
// Per block of a model of `layers` blocks: whether its linears run in fp8 (precision.fp8_layers,
// else fp8_keep_ends_bf16). ConfigError naming the key and the bad value.
std::vector<bool> fp8_block_mask(const PrecisionConfig& pc, i64 layers);

}  // namespace px
