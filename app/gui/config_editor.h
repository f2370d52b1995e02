// The job bar's config editor as data: the keys a person edits most (model sizes, the layout,
// numerics, precision, steps), each as text, over a base config (a file or the embedded default).
// build() applies the edits as `--set` would and checks the layout as a job does; an error is
// the library's own message, placed beside the key it names.
//
// Index
//   EditorField   one key: its text, the base config's text, its error
//   ConfigEditor  fields(), set(), build(), errors; load_base()
#pragma once
#include "core/base/config.h"

#include <optional>
#include <string>
#include <vector>

namespace px::gui {

struct EditorField {
    std::string key;    // "layout.tp"
    std::string text;   // as edited
    std::string base;   // the base config's value, as text
    std::string error;  // the library's message when build() failed on this key; "" otherwise
    bool edited() const { return text != base; }
};

class ConfigEditor {
public:
    explicit ConfigEditor(Config base = Config{});
    void load_base(const Config& base);  // new base; the fields show its values

    std::vector<EditorField>& fields() { return fields_; }
    const std::vector<EditorField>& fields() const { return fields_; }
    EditorField* field(const std::string& key);                 // null when not edited here
    bool set(const std::string& key, const std::string& text);  // false: not a field

    // The base with every edited field applied (apply_overrides), validated as a job validates
    // it (make_layout: the mesh's checks). On error: nullopt, and the message is kept on the
    // field whose key it names first (general_error() when it names none of them).
    std::optional<Config> build();
    const std::string& general_error() const { return general_error_; }
    bool has_error() const;
    const Config& base() const { return base_; }

private:
    Config base_;
    std::vector<EditorField> fields_;
    std::string general_error_;
};

// A key's value in cfg as the editor shows it: numbers and booleans as TOML writes them,
// strings without quotes. "" when the key is unknown.
std::string value_text(const Config& cfg, const std::string& key);

}  // namespace px::gui
