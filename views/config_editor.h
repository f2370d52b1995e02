// The job bar's config editor as data: the keys a person edits most (model sizes, the layout,
// numerics, precision, the FP8 monitor, the spike guard, steps) and every key a panel tells the
// user to set, each as text, over a base config (a file or the embedded default). build()
// applies the edits as `--set` would and checks the layout as a job does; every bad key gets its
// own message, the library's problem text without its "--set ...:" or "<source>:" prefix,
// beside the key it names. Each key carries its meaning from the key registry, and the keys
// only the llama block reads (the registry's "llama:" keys) say so: ignored() while model.arch
// is another block's, so the panel greys them rather than hiding what a job would carry.
//
// Index
//   EditorField   one key: its text, the base config's text, its error, its meaning
//   ConfigEditor  fields(), set(), build(), errors; load_base(); ignored()
#pragma once
#include "core/base/config.h"

#include <optional>
#include <string>
#include <vector>

namespace px::views {

struct EditorField {
    std::string key;    // "layout.tp"
    std::string text;   // as edited
    std::string base;   // the base config's value, as text
    std::string error;  // the library's message when build() failed on this key; "" otherwise
    std::string doc;    // what the key means (the key registry's sentence)
    bool llama_only = false;  // read by model.arch = "llama" only (the registry's "llama:" keys)
    bool edited() const { return text != base; }
};

class ConfigEditor {
public:
    explicit ConfigEditor(Config base = Config{});
    void load_base(const Config& base);  // new base; the fields show its values

    std::vector<EditorField>& fields() { return fields_; }
    const std::vector<EditorField>& fields() const { return fields_; }
    EditorField* field(const std::string& key);                 // null when not edited here
    const EditorField* field(const std::string& key) const;
    bool set(const std::string& key, const std::string& text);  // false: not a field
    // A llama-only key while model.arch (as edited) is not "llama": the job ignores its value.
    bool ignored(const EditorField& f) const;

    // The base with every edited field applied (apply_overrides), validated as a job validates
    // it (make_in_process_layout: the mesh's checks, threads and memory). On error: nullopt,
    // and each bad edit's message on its field: an edit blamed is set aside and the others are
    // tried again, so every bad key shows at once. A problem no edit is blamed for goes on the
    // field it names first (general_error() when it names none). Cheap: run it on every edit.
    std::optional<Config> build();
    const std::string& general_error() const { return general_error_; }
    bool has_error() const;
    int error_count() const;  // fields with a message, and the general one
    const Config& base() const { return base_; }

private:
    std::string problem_text(const std::string& msg) const;  // msg without where it came from

    Config base_;
    std::vector<EditorField> fields_;
    std::string general_error_;
};

// A key's value in cfg as the editor shows it: numbers and booleans as TOML writes them,
// strings without quotes. "" when the key is unknown.
std::string value_text(const Config& cfg, const std::string& key);

}  // namespace px::views
