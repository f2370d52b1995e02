// Reading and writing the job config: TOML text or a file -> Config, --set overrides, the
// embedded default job, a Config back to TOML, and the key reference. One table of keys
// (config_registry.h) drives them all, so a key is added in one place; the rules a Config must
// meet are config_checks.cpp's, given their source (file and line, or --set) here.
#include "core/base/config.h"

#include "core/base/config_checks.h"
#include "core/base/config_registry.h"
#include "core/base/error.h"
#include "core/base/files.h"

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <climits>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <variant>

namespace px {

using namespace config_checks;

namespace {

// The key table: core/base/config_registry.h.
using namespace config_registry;

std::string full_name(const KeyDef& d) { return std::string(d.section) + "." + d.name; }

const KeyDef* find_key(std::string_view section, std::string_view name) {
    for (const auto& d : kKeys)
        if (section == d.section && name == d.name) return &d;
    return nullptr;
}

bool is_section(std::string_view s) {
    return std::any_of(kSections.begin(), kSections.end(), [&](const SectionDef& d) { return s == d.name; });
}

bool is_string_like(const FieldRef& f) {
    return std::holds_alternative<std::string*>(f) || std::holds_alternative<Mode*>(f);
}

// ---- formatting values ----

std::string format_double(double x) {
    if (std::isnan(x)) return std::signbit(x) ? "-nan" : "nan";
    if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest text that reads back exactly
    std::string s(buf, r.ptr);
    const auto e = s.find('e');
    if (e == std::string::npos) {
        if (s.find('.') == std::string::npos) s += ".0";  // TOML floats need a point or an exponent
    } else {
        // "3e-04" -> "3e-4": TOML allows either; the short one reads better.
        std::size_t z = e + 1 + (s[e + 1] == '-' || s[e + 1] == '+');
        while (z + 1 < s.size() && s[z] == '0') s.erase(z, 1);
    }
    return s;
}

// The TOML text of a field's value.
std::string format_field(const FieldRef& f, const std::string& key) {
    return std::visit(
        [&](auto* p) -> std::string {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, double>) {
                return format_double(*p);
            } else if constexpr (std::is_same_v<T, std::uint64_t>) {
                if (*p > static_cast<std::uint64_t>(INT64_MAX))
                    throw ConfigError(key + " = " + std::to_string(*p) +
                                      " cannot be written as TOML (integers are signed 64-bit): "
                                      "use a value below 2^63");
                return std::to_string(*p);
            } else if constexpr (std::is_same_v<T, std::string>) {
                return quote(*p);
            } else if constexpr (std::is_same_v<T, bool>) {
                return *p ? "true" : "false";
            } else if constexpr (std::is_same_v<T, Mode>) {
                return quote(mode_name(*p));
            } else {
                return std::to_string(*p);
            }
        },
        f);
}

// "string \"two\"", "integer 3", ... for type errors.
std::string describe(const toml::node& n) {
    switch (n.type()) {
    case toml::node_type::string: return "string " + quote(n.as_string()->get());
    case toml::node_type::integer: return "integer " + std::to_string(n.as_integer()->get());
    case toml::node_type::floating_point: return "float " + format_double(n.as_floating_point()->get());
    case toml::node_type::boolean: return std::string("boolean ") + (n.as_boolean()->get() ? "true" : "false");
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
    }
}

// ---- setting a field from a TOML value ----

Problem type_problem(const std::string& key, const char* want, const toml::node& n) {
    return {{key}, key + " must be " + want + ", got " + describe(n)};
}

i64 need_integer(const std::string& key, const toml::node& n) {
    if (const auto* v = n.as_integer()) return v->get();
    throw type_problem(key, "an integer", n);
}

void set_field(const KeyDef& d, Config& cfg, const toml::node& n) {
    const std::string key = full_name(d);
    const FieldRef f = d.field(cfg);
    if (auto* p = std::get_if<i64*>(&f)) {
        **p = need_integer(key, n);
    } else if (auto* p = std::get_if<int*>(&f)) {
        const i64 v = need_integer(key, n);
        if (v < INT_MIN || v > INT_MAX)
            throw Problem{{key}, key + " = " + std::to_string(v) + " is out of range: must fit in 32 bits"};
        **p = static_cast<int>(v);
    } else if (auto* p = std::get_if<std::uint64_t*>(&f)) {
        const i64 v = need_integer(key, n);
        if (v < 0) throw Problem{{key}, key + " = " + std::to_string(v) + " is out of range: must be >= 0"};
        **p = static_cast<std::uint64_t>(v);
    } else if (auto* p = std::get_if<double*>(&f)) {
        if (const auto* i = n.as_integer()) **p = static_cast<double>(i->get());
        else if (const auto* x = n.as_floating_point()) **p = x->get();
        else throw type_problem(key, "a number", n);
    } else if (auto* p = std::get_if<std::string*>(&f)) {
        const auto* s = n.as_string();
        if (!s) throw type_problem(key, "a string", n);
        **p = s->get();
    } else if (auto* p = std::get_if<bool*>(&f)) {
        const auto* b = n.as_boolean();
        if (!b) throw type_problem(key, "true or false", n);
        **p = b->get();
    } else if (auto* p = std::get_if<Mode*>(&f)) {
        const auto* s = n.as_string();
        if (!s) throw type_problem(key, "a string", n);
        if (s->get() == "bitwise") **p = Mode::bitwise;
        else if (s->get() == "fast") **p = Mode::fast;
        else throw Problem{{key}, key + " must be \"bitwise\" or \"fast\", got " + quote(s->get())};
    }
}

// ---- suggestions ----

// Edit distance with adjacent transpositions (optimal string alignment): "trian" -> "train" is 1.
std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); i++) d[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); j++) d[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); i++) {
        for (std::size_t j = 1; j <= b.size(); j++) {
            const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    }
    return d[a.size()][b.size()];
}

// The candidate nearest to `word`, if within `limit` edits (default: a plausible typo of word).
std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates,
                                   std::size_t limit = 0) {
    std::optional<std::string> best;
    std::size_t best_d = SIZE_MAX;
    for (const auto& c : candidates) {
        const std::size_t dist = edit_distance(word, c);
        if (dist < best_d) best_d = dist, best = c;
    }
    if (limit == 0) limit = std::max<std::size_t>(2, word.size() / 3);
    if (best && best_d <= limit) return best;
    return std::nullopt;
}

std::vector<std::string> section_names() {
    std::vector<std::string> v;
    for (const auto& s : kSections) v.push_back(s.name);
    return v;
}

std::vector<std::string> keys_of(std::string_view section) {
    std::vector<std::string> v;
    for (const auto& d : kKeys)
        if (section == d.section) v.push_back(d.name);
    return v;
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + v[i];
    return s;
}

// "unknown key 'model.hiden' (did you mean 'model.hidden'?)"
std::string unknown_key_text(std::string_view section, std::string_view name) {
    const std::string key = std::string(section) + "." + std::string(name);
    std::string text = "unknown key '" + key + "'";
    for (const auto& d : kKeys)  // the right name in the wrong section
        if (name == d.name) return text + " (did you mean '" + full_name(d) + "'?)";
    if (const auto s = nearest(name, keys_of(section)))
        return text + " (did you mean '" + std::string(section) + "." + *s + "'?)";
    std::vector<std::string> all;
    for (const auto& d : kKeys) all.push_back(full_name(d));
    if (const auto s = nearest(key, all, std::max<std::size_t>(2, name.size() / 3)))
        return text + " (did you mean '" + *s + "'?)";
    return text + " (keys in [" + std::string(section) + "]: " + join(keys_of(section)) + ")";
}

std::string unknown_section_text(std::string_view section) {
    std::string text = "unknown section [" + std::string(section) + "]";
    if (const auto s = nearest(section, section_names())) return text + " (did you mean [" + *s + "]?)";
    return text + " (sections: " + join(section_names()) + ")";
}

// "unknown key 'vocab' at the top level": keys belong in sections.
std::string top_level_key_text(std::string_view name) {
    std::string text = "unknown key '" + std::string(name) + "' at the top level: keys belong in a section";
    for (const auto& d : kKeys)
        if (name == d.name) return text + " (did you mean '" + full_name(d) + "' under [" + d.section + "]?)";
    return text + " (sections: " + join(section_names()) + ")";
}

// ---- parsing ----

std::string location(const toml::source_region& r) {
    if (r.begin.line == 0) return "";
    return " (line " + std::to_string(r.begin.line) + ")";
}

struct Located {
    std::size_t line;
    std::string text;
};

// Reads every known key from a parsed document into cfg. Returns the problems found (unknown
// keys, wrong types), and records the line of every key that was set.
std::vector<Located> read_document(const toml::table& root, Config& cfg, std::map<std::string, std::size_t>& lines) {
    std::vector<Located> problems;
    auto add = [&](const toml::source_region& r, const std::string& text) {
        problems.push_back({r.begin.line, text + location(r)});
    };
    for (const auto& [skey, snode] : root) {
        const std::string_view section = skey.str();
        if (!snode.is_table()) {
            if (is_section(section))
                add(snode.source(), std::string(section) + " must be a table ([" + std::string(section) + "]), got " +
                                        describe(snode));
            else
                add(snode.source(), top_level_key_text(section));
            continue;
        }
        if (!is_section(section)) {
            add(snode.source(), unknown_section_text(section));
            continue;
        }
        for (const auto& [kkey, knode] : *snode.as_table()) {
            const KeyDef* d = find_key(section, kkey.str());
            if (d == nullptr) {
                add(knode.source(), unknown_key_text(section, kkey.str()));
                continue;
            }
            try {
                set_field(*d, cfg, knode);
                lines[full_name(*d)] = knode.source().begin.line;
            } catch (const Problem& p) {
                add(knode.source(), p.text);
            }
        }
    }
    return problems;
}

// Validates cfg; a problem is reported as "<prefix>: <text>", with the line of its first key if
// `lines` knows it.
void validate_or_throw(const Config& cfg, const std::string& prefix, const std::map<std::string, std::size_t>* lines) {
    try {
        check_config(cfg);
    } catch (const Problem& p) {
        std::string where;
        if (lines)
            for (const auto& k : p.keys)
                if (const auto it = lines->find(k); it != lines->end() && it->second > 0) {
                    where = " (line " + std::to_string(it->second) + ")";
                    break;
                }
        throw ConfigError(prefix + ": " + p.text + where);
    }
}

std::string trim(std::string_view s) {
    const auto b = s.find_first_not_of(" \t\r\n");
    if (b == std::string_view::npos) return "";
    const auto e = s.find_last_not_of(" \t\r\n");
    return std::string(s.substr(b, e - b + 1));
}

// Applies one "section.key=value" to cfg (no validation); returns the key's full name.
std::string assign(Config& cfg, const std::string& assignment) {
    const std::string where = "--set " + assignment;
    const auto eq = assignment.find('=');
    if (eq == std::string::npos)
        throw ConfigError(where + ": expected section.key=value (for example --set train.lr=1e-3)");
    const std::string lhs = trim(std::string_view(assignment).substr(0, eq));
    const std::string value = trim(std::string_view(assignment).substr(eq + 1));
    const auto dot = lhs.find('.');
    if (dot == std::string::npos) throw ConfigError(where + ": " + top_level_key_text(lhs));
    const std::string section = lhs.substr(0, dot), name = lhs.substr(dot + 1);
    if (!is_section(section)) throw ConfigError(where + ": " + unknown_section_text(section));
    const KeyDef* d = find_key(section, name);
    if (d == nullptr) throw ConfigError(where + ": " + unknown_key_text(section, name));

    // The value as TOML, or as a string when it is not TOML (bin, runs/x) or the key wants a string.
    std::optional<toml::table> doc;
    try {
        const std::string text = "v = " + value + "\n";
        doc = toml::parse(std::string_view(text), std::string_view("--set"));
    } catch (const toml::parse_error&) {
        doc.reset();
    }
    const toml::node* node = nullptr;
    if (doc && doc->size() == 1) node = doc->get("v");
    const bool as_text = node == nullptr || (is_string_like(d->field(cfg)) && !node->is_string());
    toml::value<std::string> text_node(value);
    try {
        set_field(*d, cfg, as_text ? static_cast<const toml::node&>(text_node) : *node);
    } catch (const Problem& p) {
        throw ConfigError(where + ": " + p.text);
    }
    return full_name(*d);
}

std::string to_toml(const Config& cfg_in, bool comments) {
    Config cfg = cfg_in;  // field accessors take a mutable Config
    std::string out;
    if (comments) {
        out += "# Parallax job config: the embedded default job, a tiny GPT on the built-in Markov source\n"
               "# (needs no files). Every key is optional: a missing key keeps the value shown here.\n";
    }
    for (const auto& s : kSections) {
        if (!out.empty()) out += "\n";
        if (comments) out += std::string("# ") + s.doc + "\n";
        out += std::string("[") + s.name + "]\n";
        for (const auto& d : kKeys) {
            if (std::strcmp(d.section, s.name) != 0) continue;
            if (comments) out += std::string("# ") + d.doc + "\n";
            out += std::string(d.name) + " = " + format_field(d.field(cfg), full_name(d)) + "\n";
        }
    }
    return out;
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& source_name) {
    toml::table root;
    try {
        root = toml::parse(std::string_view(toml_text), std::string_view(source_name));
    } catch (const toml::parse_error& e) {
        const auto& b = e.source().begin;
        throw ConfigError(source_name + ": TOML syntax error at line " + std::to_string(b.line) + ", column " +
                          std::to_string(b.column) + ": " + std::string(e.description()));
    }
    Config cfg;
    cfg.source_name = source_name;
    std::map<std::string, std::size_t> lines;
    auto problems = read_document(root, cfg, lines);
    if (!problems.empty()) {
        // Report the first in file order (tables iterate by name); unlocated ones last.
        const auto first = std::min_element(problems.begin(), problems.end(), [](const Located& a, const Located& b) {
            return (a.line == 0 ? SIZE_MAX : a.line) < (b.line == 0 ? SIZE_MAX : b.line);
        });
        std::string text = source_name + ": " + first->text;
        if (problems.size() > 1) text += " (and " + std::to_string(problems.size() - 1) + " more problem" +
                                         (problems.size() > 2 ? "s" : "") + ")";
        throw ConfigError(text);
    }
    validate_or_throw(cfg, source_name, &lines);
    return cfg;
}

Config load_config(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw ConfigError("cannot read config file '" + path + "': it is a directory; give a .toml file");
    // Reading a FIFO would wait for a writer; a device is no config.
    if (const FileKind k = file_kind(path); k != FileKind::regular && k != FileKind::missing)
        throw ConfigError("cannot read config file '" + path + "': it is " + file_kind_text(k) +
                          ", not a regular file; give a .toml file");
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw ConfigError("cannot read config file '" + path + "': " + std::strerror(errno) + "; check the path");
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw ConfigError("cannot read config file '" + path + "': read error");
    return parse_config(ss.str(), path);
}

void apply_override(Config& cfg, const std::string& assignment) { apply_overrides(cfg, {assignment}); }

Config job_config(const std::string& path, const std::vector<std::string>& sets) {
    Config cfg = path.empty() ? parse_config(default_config_toml(), "<embedded default>")
                              : load_config(path);
    apply_overrides(cfg, sets);
    return cfg;
}

void apply_overrides(Config& cfg, const std::vector<std::string>& assignments) {
    Config next = cfg;
    std::map<std::string, std::string> set_by;  // key -> the last assignment that set it
    for (const auto& a : assignments) set_by[assign(next, a)] = a;
    try {
        check_config(next);
    } catch (const Problem& p) {
        // Blame the --set that touched a key of the problem; if none did, the config was already bad.
        for (const auto& k : p.keys)
            if (const auto it = set_by.find(k); it != set_by.end())
                throw ConfigError("--set " + it->second + ": " + p.text);
        throw ConfigError(cfg.source_name + ": " + p.text);
    }
    cfg = std::move(next);
}

void validate_config(const Config& cfg) { validate_or_throw(cfg, cfg.source_name, nullptr); }

std::vector<std::string> config_keys() {
    std::vector<std::string> v;
    for (const auto& d : kKeys) v.push_back(full_name(d));
    return v;
}

std::vector<SectionDoc> config_reference() {
    Config defaults;
    std::vector<SectionDoc> out;
    for (const auto& s : kSections) {
        SectionDoc sd{s.name, s.doc, {}};
        for (const auto& d : kKeys)
            if (std::strcmp(d.section, s.name) == 0)
                sd.keys.push_back({d.name, d.type, format_field(d.field(defaults), full_name(d)),
                                   d.doc});
        out.push_back(std::move(sd));
    }
    return out;
}

const char* default_config_toml() {
    static const std::string text = to_toml(Config{}, true);
    return text.c_str();
}

std::string config_to_toml(const Config& cfg) { return to_toml(cfg, false); }

DType activation_dtype(const PrecisionConfig& pc) {
    try {
        return check_activations(pc.activations);
    } catch (const Problem& p) {
        throw ConfigError(p.text);
    }
}

std::vector<bool> fp8_block_mask(const PrecisionConfig& pc, i64 layers) {
    try {
        return fp8_blocks(pc, layers);
    } catch (const Problem& p) {
        throw ConfigError(p.text);
    }
}

Numerics make_numerics(const NumericsConfig& nc) {
    if (nc.block < 1)
        throw ConfigError("numerics.block = " + std::to_string(nc.block) + " is out of range: must be >= 1");
    Numerics n;
    n.mode = nc.mode;
    n.block = nc.block;
    const Isa best = detect_isa();
    if (nc.isa == "auto") {
        n.isa = best;
        return n;
    }
    std::optional<Isa> want;
    for (const Isa i : {Isa::scalar, Isa::avx2, Isa::avx512})
        if (nc.isa == isa_name(i)) want = i;
    if (!want)
        throw ConfigError("numerics.isa must be \"auto\", \"avx512\", \"avx2\" or \"scalar\", got " + quote(nc.isa));
    if (static_cast<int>(*want) > static_cast<int>(best))
        throw ConfigError("numerics.isa = " + quote(nc.isa) + " is not supported by this CPU (the best it has is " +
                          isa_name(best) + "): use numerics.isa = \"auto\" or \"" + isa_name(best) + "\"");
    n.isa = *want;
    return n;
}

}  // namespace px
