#include "views/config_editor.h"

#include "core/base/error.h"
#include "core/parallel/mesh.h"
#include "core/train/runner.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <map>
#include <sstream>
#include <utility>

namespace px::views {

namespace {

// What the editor shows, in this order; the llama block's keys together, after the sizes.
const char* const kEditorKeys[] = {
    "model.arch",
    "model.layers",
    "model.hidden",
    "model.heads",
    "model.ffn",
    "model.vocab",
    "model.seq_len",
    "model.kv_heads",
    "model.head_dim",
    "model.norm_eps",
    "model.rope_theta",
    "model.rope_factor",
    "model.rope_low_freq_factor",
    "model.rope_high_freq_factor",
    "model.rope_original_max_positions",
    "model.tie_embeddings",
    "model.qk_norm",
    "model.moe_experts",
    "model.moe_top_k",
    "model.moe_ffn",
    "model.moe_every",
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
    "precision.fp8",
    "fp8_monitor.every",
    "spikes.action",
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
    if (const auto* f = n.as_floating_point()) {
        // The shortest text that reads back exactly, as config_to_toml writes it (1e-05, not
        // toml++'s 1.0000000000000001e-05; 0.003, not 0.003000000), a float's point kept.
        char buf[64];
        const auto r = std::to_chars(buf, buf + sizeof buf, f->get());
        std::string t(buf, r.ptr);
        if (std::isfinite(f->get()) && t.find_first_of(".e") == std::string::npos) t += ".0";
        return t;
    }
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
    std::map<std::string, std::string> docs;  // "model.kv_heads" -> its meaning
    for (const SectionDoc& s : config_reference())
        for (const KeyDoc& k : s.keys) docs[s.name + "." + k.name] = k.meaning;
    for (const char* key : kEditorKeys) {
        EditorField f;
        f.key = key;
        f.base = value_text(base, key);
        f.text = f.base;
        f.doc = docs[key];
        f.llama_only = f.doc.rfind("llama:", 0) == 0;
        fields_.push_back(std::move(f));
    }
}

bool ConfigEditor::ignored(const EditorField& f) const {
    if (!f.llama_only) return false;
    const EditorField* arch = field("model.arch");
    return (arch ? arch->text : base_.model.arch) != "llama";
}

const EditorField* ConfigEditor::field(const std::string& key) const {
    for (const EditorField& f : fields_)
        if (f.key == key) return &f;
    return nullptr;
}

EditorField* ConfigEditor::field(const std::string& key) {
    return const_cast<EditorField*>(std::as_const(*this).field(key));
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

// The problem itself, without what says where it came from ("--set model.hidden=abc: ", the base
// config's "<embedded default>: "): the field it stands beside says that.
std::string ConfigEditor::problem_text(const std::string& msg) const {
    const std::string set = "--set ";
    if (msg.rfind(set, 0) == 0) {
        for (const EditorField& f : fields_) {
            const std::string head = set + f.key + "=" + f.text + ": ";
            if (msg.rfind(head, 0) == 0) return msg.substr(head.size());
        }
    }
    const std::string source = base_.source_name + ": ";
    if (msg.rfind(source, 0) == 0) return msg.substr(source.size());
    return msg;
}

namespace {

// Where `key` first occurs in msg as a whole key (layout.pp is not layout.pp_x), or npos.
size_t key_at(const std::string& msg, const std::string& key) {
    for (size_t p = msg.find(key); p != std::string::npos; p = msg.find(key, p + 1)) {
        const size_t end = p + key.size();
        if (end >= msg.size() ||
            !(std::isalnum(static_cast<unsigned char>(msg[end])) || msg[end] == '_'))
            return p;
    }
    return std::string::npos;
}

}  // namespace

std::optional<Config> ConfigEditor::build() {
    general_error_.clear();
    for (EditorField& f : fields_) f.error.clear();
    // Every edit together (apply_overrides: `model.heads=3 model.hidden=96` in either order); a
    // bad one is blamed, set aside and the rest tried again, so each bad key gets its message
    // in one build, judged on top of the edits that are fine.
    std::vector<EditorField*> pending;
    for (EditorField& f : fields_)
        if (f.edited()) pending.push_back(&f);
    while (true) {
        std::vector<std::string> sets;
        for (const EditorField* f : pending) sets.push_back(f->key + "=" + f->text);
        Config c = base_;
        std::string msg;
        try {
            apply_overrides(c, sets);
            make_in_process_layout(c);  // the mesh's checks, threads and memory, as a job's
            if (!has_error()) return c;
            return std::nullopt;
        } catch (const ConfigError& e) {
            msg = e.what();
        }
        // The edit the message blames: its --set, else the pending key it names first; else the
        // first field it names at all (a problem of the base config), and no more to set aside.
        EditorField* blamed = nullptr;
        for (EditorField* f : pending)
            if (msg.rfind("--set " + f->key + "=" + f->text + ":", 0) == 0) blamed = f;
        size_t best = std::string::npos;
        for (EditorField* f : pending)
            if (!blamed && key_at(msg, f->key) < best) {
                best = key_at(msg, f->key);
                blamed = f;
            }
        if (blamed) {
            blamed->error = problem_text(msg);
            pending.erase(std::find(pending.begin(), pending.end(), blamed));
            continue;
        }
        EditorField* at = nullptr;
        for (EditorField& f : fields_)
            if (key_at(msg, f.key) < best) {
                best = key_at(msg, f.key);
                at = &f;
            }
        if (at && at->error.empty())
            at->error = problem_text(msg);
        else
            general_error_ = problem_text(msg);
        return std::nullopt;
    }
}

int ConfigEditor::error_count() const {
    int n = general_error_.empty() ? 0 : 1;
    for (const EditorField& f : fields_) n += !f.error.empty();
    return n;
}

}  // namespace px::views
