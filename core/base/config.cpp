// The job config: one table of keys drives parsing, validation messages, --set, the embedded
// default job and writing a config back out, so a key is added in one place (kKeys below).
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

// ---- validation ----

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
    product("attention scores per step", {L, B, NH, T, T});
}

// Throws the first problem: single keys in table order, then constraints across keys.
void check(const Config& c) {
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
    check_moe_keys(m);

    at_least("layout.dp", l.dp, 1);
    at_least("layout.pp", l.pp, 1);
    at_least("layout.tp", l.tp, 1);
    at_least("layout.cp", l.cp, 1);
    at_least("layout.ep", l.ep, 1);
    one_of("layout.cp_method", l.cp_method, {"ring", "ulysses"});
    if (l.zero < 0 || l.zero > 3) throw out_of_range("layout.zero", std::to_string(l.zero), "in 0..3");
    at_least("layout.microbatches", l.microbatches, 0);
    one_of("layout.schedule", l.schedule, {"gpipe", "1f1b", "interleaved"});
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

    if (m.hidden % m.heads != 0)
        throw Problem{{"model.heads", "model.hidden"},
                      "model.heads=" + std::to_string(m.heads) + " does not divide model.hidden=" +
                          std::to_string(m.hidden) + ": choose heads that divide hidden (head size = hidden / heads)"};
    if (t.batch_size % t.microbatches != 0)
        throw Problem{{"train.microbatches", "train.batch_size"},
                      "train.microbatches=" + std::to_string(t.microbatches) + " does not divide train.batch_size=" +
                          std::to_string(t.batch_size) + ": every microbatch must hold the same number of sequences"};
    if (l.virtual_stages > 1 && l.schedule != "interleaved")
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
        check(cfg);
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
        check(next);
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
