#include "app/gui/config_editor.h"

#include "core/base/error.h"
#include "core/parallel/mesh.h"

#include <toml++/toml.h>

#include <sstream>

namespace px::gui {

namespace {

// What the editor shows, in this order.
const char* const kEditorKeys[] = {
    "model.layers",
    "model.hidden",
    "model.heads",
    "model.ffn",
    "model.vocab",
    "model.seq_len",
    "model.moe_experts",
    "model.moe_top_k",
    "model.moe_ffn",
    "layout.dp",
    "layout.tp",
    "layout.pp",
    "layout.cp",
    "layout.cp_method",
    "layout.ep",
    "layout.zero",
    "layout.microbatches",
    "layout.schedule",
    "layout.virtual_stages",
    "layout.sequence_parallel",
    "numerics.mode",
    "numerics.block",
    "precision.activations",
    "train.steps",
    "train.batch_size",
    "train.lr",
};

}  // namespace

std::string value_text(const Config& cfg, const std::string& key) {
    const toml::table t = toml::parse(config_to_toml(cfg));
    const toml::node_view<const toml::node> n = t.at_path(key);
    if (!n) return "";
    if (const auto* s = n.as_string()) return s->get();
    std::ostringstream out;
    out << n;
    return out.str();
}

ConfigEditor::ConfigEditor(Config base) {
    load_base(base);
}

void ConfigEditor::load_base(const Config& base) {
    base_ = base;
    fields_.clear();
    general_error_.clear();
    for (const char* key : kEditorKeys) {
        EditorField f;
        f.key = key;
        f.base = value_text(base, key);
        f.text = f.base;
        fields_.push_back(std::move(f));
    }
}

EditorField* ConfigEditor::field(const std::string& key) {
    for (EditorField& f : fields_)
        if (f.key == key) return &f;
    return nullptr;
}

bool ConfigEditor::set(const std::string& key, const std::string& text) {
    EditorField* f = field(key);
    if (!f) return false;
    f->text = text;
    return true;
}

bool ConfigEditor::has_error() const {
    if (!general_error_.empty()) return true;
    for (const EditorField& f : fields_)
        if (!f.error.empty()) return true;
    return false;
}

std::optional<Config> ConfigEditor::build() {
    general_error_.clear();
    for (EditorField& f : fields_) f.error.clear();
    std::vector<std::string> sets;
    for (const EditorField& f : fields_)
        if (f.edited()) sets.push_back(f.key + "=" + f.text);
    Config c = base_;
    try {
        apply_overrides(c, sets);
        make_layout(c);  // the mesh's checks, with the sentence a job would print
        return c;
    } catch (const ConfigError& e) {
        const std::string msg = e.what();
        // The field whose key the message names first ("layout.tp=3 does not divide ...").
        EditorField* at = nullptr;
        size_t best = std::string::npos;
        for (EditorField& f : fields_) {
            size_t p = msg.find(f.key);
            while (p != std::string::npos) {  // whole keys only: layout.pp is not layout.pp_x
                const size_t end = p + f.key.size();
                const bool whole =
                    end >= msg.size() ||
                    !(std::isalnum(static_cast<unsigned char>(msg[end])) || msg[end] == '_');
                if (whole) break;
                p = msg.find(f.key, p + 1);
            }
            if (p < best) {
                best = p;
                at = &f;
            }
        }
        if (at)
            at->error = msg;
        else
            general_error_ = msg;
        return std::nullopt;
    }
}

}  // namespace px::gui
