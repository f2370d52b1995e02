// config.json of a Hugging Face folder (core/io/hf_checkpoint.h): read into a ModelConfig through
// the architecture's keys (and RoPE's parameters), checked against the keys whose value
// Parallax's model has built in, compared with a job's model, and written back for a ModelConfig
// as transformers writes it.
//
// Index
//   read_text, parse_json     the file's text and its JSON (duplicate keys refused)
//   json_type, shown          a value's JSON type and text, for messages
//   value_json, holds         a fixed key's value
//   read_key                  one key into its ModelConfig field (integer, number or boolean)
//   kRopeTheta, kLlama3Keys, read_rope, rope_json    RoPE's parameters, either layout
//   resolved, field_text      a ModelConfig with its 0 defaults resolved; a field's value as text
//   read_hf_config            config.json -> HfConfig
//   hf_config_text            HfConfig's inverse: the text of config.json for a ModelConfig
//   hf_sizes_text, hf_config_differences   for messages, and model.init_from
#include "core/base/error.h"
#include "core/base/files.h"
#include "core/io/hf_checkpoint.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace px {

namespace {

using json = nlohmann::json;

constexpr i64 kMaxConfigBytes = i64(16) << 20;  // transformers' configs are a few kB
constexpr int kMaxDepth = 64;
constexpr i64 kMaxSize = i64(1) << 40;  // beyond any model; validate_config has the real limits

std::string prefix(const std::string& path) {
    return "Hugging Face config " + path;
}

std::string read_text(const std::string& path) {
    const FileKind kind = file_kind(path);
    if (kind == FileKind::missing)
        throw DataError(prefix(path) +
                        " does not exist; a Hugging Face model folder holds config.json beside "
                        "model.safetensors (save_pretrained writes both): give such a folder");
    if (kind != FileKind::regular)
        throw DataError(prefix(path) + " is " + file_kind_text(kind) +
                        ", not a regular file; it must be the model's config.json");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        throw DataError(prefix(path) + ": cannot open it: " + std::strerror(errno) +
                        "; check its permissions");
    struct stat sb {};
    if (::fstat(fd, &sb) != 0 || sb.st_size > kMaxConfigBytes) {
        ::close(fd);
        throw DataError(prefix(path) + " is " + std::to_string(sb.st_size) +
                        " bytes, more than any config.json (" + std::to_string(kMaxConfigBytes) +
                        "); is it the model's config.json?");
    }
    std::string text(size_t(sb.st_size), '\0');
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t r = ::pread(fd, text.data() + done, text.size() - done, off_t(done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        done += size_t(r);
    }
    const int err = errno;
    ::close(fd);
    if (done != text.size())
        throw DataError(prefix(path) + ": cannot read it: " + std::strerror(err));
    // nlohmann's parser takes a NUL for the end of its input; JSON text never holds one.
    if (text.find('\0') != std::string::npos)
        throw DataError(prefix(path) + " holds a NUL byte, so it is not JSON; re-download it");
    return text;
}

// JSON with no key twice in one object (which value transformers keeps is Python's business).
json parse_json(const std::string& path, const std::string& text) {
    std::vector<std::unordered_set<std::string>> keys;
    auto cb = [&](int depth, json::parse_event_t ev, json& v) {
        using E = json::parse_event_t;
        if ((ev == E::object_start || ev == E::array_start) && depth > kMaxDepth)
            throw DataError(prefix(path) + " nests deeper than " + std::to_string(kMaxDepth) +
                            " levels; it is no model config");
        if (ev == E::object_start) keys.emplace_back();
        if (ev == E::object_end) keys.pop_back();
        if (ev == E::key && !keys.back().insert(v.get<std::string>()).second)
            throw DataError(prefix(path) + " has the key \"" + v.get<std::string>() +
                            "\" twice in one object; keep one");
        return true;
    };
    try {
        return json::parse(text, cb);
    } catch (const json::exception& e) {
        std::string what = e.what();
        const size_t cut = what.find("] ");
        if (cut != std::string::npos) what = what.substr(cut + 2);
        throw DataError(prefix(path) + " is not valid JSON: " + what + "; fix or re-download it");
    }
}

const char* json_type(const json& v) {
    switch (v.type()) {
        case json::value_t::null:
            return "null";
        case json::value_t::boolean:
            return "a boolean";
        case json::value_t::string:
            return "a string";
        case json::value_t::number_integer:
        case json::value_t::number_unsigned:
            return "an integer";
        case json::value_t::number_float:
            return "a non-integer number";
        case json::value_t::array:
            return "an array";
        case json::value_t::object:
            return "an object";
        default:
            return "an unusual value";
    }
}

// A value as JSON text for a message, cut short.
std::string shown(const json& v) {
    std::string t = v.dump(-1, ' ', true, json::error_handler_t::replace);
    if (t.size() > 80) t = t.substr(0, 77) + "...";
    return t;
}

std::string value_json(const HfValue& v, i64 layers) {
    switch (v.kind) {
        case HfValue::string:
            return json(v.s).dump();
        case HfValue::boolean:
            return v.b ? "true" : "false";
        case HfValue::number:
            return json(v.x).dump();
        case HfValue::empty:
            return "[]";
        case HfValue::per_layer:
            return json(std::vector<std::string>(size_t(layers), v.s)).dump();
    }
    return "";
}

// The value for a message: a list of layers, however many, in a few words.
std::string value_text(const HfValue& v) {
    if (v.kind == HfValue::per_layer)
        return "[" + json(v.s).dump() + ", ...] (one per layer, num_hidden_layers of them)";
    return value_json(v, 0);
}

bool holds(const json& got, const HfValue& want, i64 layers) {
    switch (want.kind) {
        case HfValue::string:
            return got.is_string() && got.get<std::string>() == want.s;
        case HfValue::boolean:
            return got.is_boolean() && got.get<bool>() == want.b;
        case HfValue::number:  // as the fp32 the kernels use (torch casts eps the same way)
            return got.is_number() && float(got.get<double>()) == float(want.x);
        case HfValue::empty:
            return got.is_array() && got.empty();
        case HfValue::per_layer:
            if (!got.is_array() || i64(got.size()) != layers) return false;
            for (const json& x : got)
                if (!x.is_string() || x.get<std::string>() != want.s) return false;
            return true;
    }
    return false;
}

std::string supported_list() {
    std::string s;
    for (const HfArchitecture& a : hf_architectures()) {
        if (!s.empty()) s += ", ";
        s.append(a.name).append(" (model_type \"").append(a.model_type).append("\")");
    }
    return s;
}

const char* dtype_word(SafeDType t) {
    switch (t) {
        case SafeDType::BF16:
            return "bfloat16";
        case SafeDType::F16:
            return "float16";
        default:
            return "float32";
    }
}

// ---- one key ----

void set_field(ModelConfig& mc, const HfField& field, double x) {
    if (auto f = std::get_if<i64 ModelConfig::*>(&field)) mc.*(*f) = i64(x);
    if (auto f = std::get_if<double ModelConfig::*>(&field)) mc.*(*f) = x;
    if (auto f = std::get_if<bool ModelConfig::*>(&field)) mc.*(*f) = x != 0;
}

// Key k of the JSON object obj (config.json itself, or its RoPE parameters, `where` then being
// "rope_parameters.") into mc; p names the file, owner the class.
void read_key(const std::string& p, const json& obj, const std::string& where, const HfKey& k,
              const char* owner, ModelConfig& mc) {
    auto it = obj.find(k.hf);
    std::string name = where + k.hf;
    if (k.alias) {
        const auto other = obj.find(k.alias);
        if (it != obj.end() && other != obj.end())
            throw DataError(p + " has both \"" + name + "\" and \"" + where + k.alias +
                            "\", two names of " + k.key + "; keep one");
        if (it == obj.end() && other != obj.end()) {
            it = other;
            name = where + k.alias;
        }
    }
    const bool absent = it == obj.end();
    if (absent || it->is_null()) {
        const bool takes_null = k.absent == HfAbsent::nullable || k.absent == HfAbsent::null_same;
        if (absent ? k.absent != HfAbsent::required : takes_null) {
            set_field(mc, k.field, k.fallback(mc));
            return;
        }
        if (absent)
            throw DataError(p + " has no key \"" + name + "\" (" + k.key + ", which " + owner +
                            " needs); add it");
    }
    const json& v = *it;
    const std::string is = p + ": \"" + name + "\" is " + shown(v) + " (" + json_type(v) + ")";
    const std::string or_null =
        k.absent == HfAbsent::nullable || k.absent == HfAbsent::null_same ? " or null" : "";
    if (std::holds_alternative<i64 ModelConfig::*>(k.field)) {
        if (!v.is_number_integer())
            throw DataError(is + " but must be a positive integer (" + k.key + ")" + or_null);
        const bool negative = !v.is_number_unsigned() && v.get<std::int64_t>() < 0;
        const std::uint64_t x = negative ? 0 : v.get<std::uint64_t>();
        if (negative || x == 0 || x > std::uint64_t(kMaxSize))
            throw DataError(p + ": \"" + name + "\" is " + shown(v) + " but must be a " +
                            "positive integer of at most 2^40 (" + k.key + ")");
        set_field(mc, k.field, double(x));
    } else if (std::holds_alternative<double ModelConfig::*>(k.field)) {
        if (!v.is_number() || !std::isfinite(v.get<double>()))
            throw DataError(is + " but must be a finite number (" + k.key + ")" + or_null);
        set_field(mc, k.field, v.get<double>());
    } else {
        if (!v.is_boolean())
            throw DataError(is + " but must be true or false (" + k.key + ")" + or_null);
        set_field(mc, k.field, v.get<bool>() ? 1 : 0);
    }
}

// ---- RoPE ----

double theta_1e4(const ModelConfig&) {
    return 10000;
}
double positions(const ModelConfig& m) {
    return double(m.seq_len);
}
// rope_theta: in the RoPE parameters, else (transformers 4) beside them, else transformers'
// default_theta.
constexpr HfKey kRopeTheta = {"rope_theta", &ModelConfig::rope_theta, "model.rope_theta",
                              HfAbsent::optional, theta_1e4};
// rope_type "llama3": Llama 3.1's frequency scaling; original_max_position_embeddings defaults
// to max_position_embeddings, as transformers' standardize_rope_params sets it.
constexpr HfKey kLlama3Keys[] = {
    {"factor", &ModelConfig::rope_factor, "model.rope_factor"},
    {"low_freq_factor", &ModelConfig::rope_low_freq_factor, "model.rope_low_freq_factor"},
    {"high_freq_factor", &ModelConfig::rope_high_freq_factor, "model.rope_high_freq_factor"},
    {"original_max_position_embeddings", &ModelConfig::rope_original_max_positions,
     "model.rope_original_max_positions", HfAbsent::optional, positions},
};

// The RoPE parameters of config.json j into mc: "rope_parameters" (transformers 5) or
// "rope_scaling" (4.x), either absent or null for plain RoPE; "rope_type" (4.x: "type")
// "default" or "llama3".
void read_rope(const std::string& p, const json& j, const char* owner, ModelConfig& mc) {
    const auto given = [&](const char* key) {
        const auto it = j.find(key);
        return it != j.end() && !it->is_null() ? &*it : nullptr;
    };
    const json* params = given("rope_parameters");
    std::string where = "rope_parameters.";
    if (const json* old = given("rope_scaling")) {
        if (params)
            throw DataError(p +
                            " has both \"rope_parameters\" (transformers 5) and "
                            "\"rope_scaling\" (transformers 4), RoPE's parameters twice; "
                            "keep one");
        params = old;
        where = "rope_scaling.";
    }
    if (params && !params->is_object())
        throw DataError(p + ": \"" + where.substr(0, where.size() - 1) + "\" is " + shown(*params) +
                        " (" + json_type(*params) +
                        ") but must be an object of RoPE parameters such as {\"rope_type\": "
                        "\"default\", \"rope_theta\": 10000.0}, or null");
    const json none = json::object();
    const json& r = params ? *params : none;

    std::string type = "default";
    for (const char* key : {"rope_type", "type"}) {
        const auto it = r.find(key);
        if (it == r.end()) continue;
        if (!it->is_string())
            throw DataError(p + ": \"" + where + key + "\" is " + shown(*it) +
                            " but must be a RoPE type name such as \"default\" or \"llama3\"");
        type = it->get<std::string>();
        break;
    }
    const std::string type_key = where + (r.contains("rope_type") ? "rope_type" : "type");
    if (type != "default" && type != "llama3")
        throw DataError(
            p + ": \"" + type_key + "\" is \"" + type + "\" but Parallax computes " + owner +
            "'s rotary embeddings as \"default\" (plain RoPE) or \"llama3\" (Llama "
            "3.1's frequency scaling, model.rope_factor); it cannot compute this model");
    const std::pair<const json*, std::string> places[] = {{&r, where}, {&j, ""}};
    for (const auto& [obj, at] : places) {
        const auto it = obj->find("partial_rotary_factor");
        if (it != obj->end() && !it->is_null() && !(it->is_number() && it->get<double>() == 1.0))
            throw DataError(p + ": \"" + at + "partial_rotary_factor\" is " + shown(*it) +
                            " but Parallax's RoPE turns every channel of a head (1.0); it cannot "
                            "compute this model");
    }
    if (r.contains("rope_theta"))
        read_key(p, r, where, kRopeTheta, owner, mc);
    else
        read_key(p, j, "", kRopeTheta, owner, mc);
    if (type == "default") {
        mc.rope_factor = 0;
        return;
    }
    for (const HfKey& k : kLlama3Keys) read_key(p, r, where, k, owner, mc);
    if (!(mc.rope_factor > 0))
        throw DataError(p + ": \"" + where + "factor\" is " + json(mc.rope_factor).dump() +
                        " but Llama 3.1's scaling divides frequencies by it: it must be positive "
                        "(model.rope_factor; Llama 3.1 uses 8)");
}

// RoPE's parameters as transformers 5 writes them.
json rope_json(const ModelConfig& mc) {
    json r = {{"rope_theta", mc.rope_theta}, {"rope_type", "default"}};
    if (mc.rope_factor > 0) {
        r["rope_type"] = "llama3";
        r["factor"] = mc.rope_factor;
        r["low_freq_factor"] = mc.rope_low_freq_factor;
        r["high_freq_factor"] = mc.rope_high_freq_factor;
        r["original_max_position_embeddings"] = mc.rope_original_max_positions;
    }
    return r;
}

// ---- a ModelConfig's values ----

// mc with the sizes whose 0 means a default made explicit, as config.json holds them.
ModelConfig resolved(ModelConfig mc) {
    if (mc.llama()) {
        mc.kv_heads = mc.kv_head_count();
        mc.head_dim = mc.head_size();
    }
    if (mc.is_moe()) mc.moe_ffn = mc.expert_ffn();
    return mc;
}

std::string field_text(const ModelConfig& mc, const HfField& field) {
    if (auto f = std::get_if<i64 ModelConfig::*>(&field)) return std::to_string(mc.*(*f));
    if (auto f = std::get_if<double ModelConfig::*>(&field)) return json(mc.*(*f)).dump();
    return mc.*std::get<bool ModelConfig::*>(field) ? "true" : "false";
}

double field_value(const ModelConfig& mc, const HfField& field) {
    if (auto f = std::get_if<i64 ModelConfig::*>(&field)) return double(mc.*(*f));
    if (auto f = std::get_if<double ModelConfig::*>(&field)) return mc.*(*f);
    return mc.*std::get<bool ModelConfig::*>(field) ? 1 : 0;
}

json field_json(const ModelConfig& mc, const HfField& field) {
    if (auto f = std::get_if<i64 ModelConfig::*>(&field)) return mc.*(*f);
    if (auto f = std::get_if<double ModelConfig::*>(&field)) return mc.*(*f);
    return mc.*std::get<bool ModelConfig::*>(field);
}

}  // namespace

HfConfig read_hf_config(const std::string& config_path) {
    const std::string p = prefix(config_path);
    const json j = parse_json(config_path, read_text(config_path));
    if (!j.is_object())
        throw DataError(p + " is " + json_type(j) +
                        ", not a JSON object of config keys; is it the model's config.json?");

    // 1. The architecture: transformers builds architectures[0].
    HfConfig out;
    out.path = config_path;
    const auto a = j.find("architectures");
    if (a == j.end())
        throw DataError(p +
                        " has no key \"architectures\" (the model class, e.g. "
                        "[\"GPT2LMHeadModel\"]); Parallax reads " +
                        supported_list() + ": add it, or save the model with save_pretrained");
    if (!a->is_array() || a->empty() || !(*a)[0].is_string())
        throw DataError(p + ": \"architectures\" is " + shown(*a) +
                        " but must be a list of model class names such as [\"GPT2LMHeadModel\"]");
    const std::string arch_name = (*a)[0].get<std::string>();
    out.arch = find_hf_architecture(arch_name);
    if (!out.arch)
        throw DataError(p + ": \"architectures\" is " + shown(*a) + "; Parallax reads " +
                        supported_list() + " and not " + arch_name);
    const HfArchitecture& arch = *out.arch;
    const auto mt = j.find("model_type");
    if (mt == j.end())
        throw DataError(p + " has no key \"model_type\"; " + arch.name + "'s is \"" +
                        arch.model_type + "\": add it");
    if (!mt->is_string() || mt->get<std::string>() != arch.model_type)
        throw DataError(p + ": \"model_type\" is " + shown(*mt) + " but " + arch.name + "'s is \"" +
                        arch.model_type + "\"; the config is inconsistent");

    // 2. The class's model, then the keys (and RoPE's parameters) into it. transformers'
    //    Qwen3-MoE router drops no token and has no z-loss.
    ModelConfig& mc = out.model;
    mc.arch = arch.arch;
    mc.qk_norm = arch.qk_norm;
    if (arch.moe) {
        mc.moe_capacity_factor = 0;
        mc.moe_z_loss = 0;
    }
    for (const HfKey& k : arch.keys) read_key(p, j, "", k, arch.name, mc);
    if (arch.rope) read_rope(p, j, arch.name, mc);

    // 3. The keys whose value the model has built in.
    for (const HfFixedKey& k : arch.fixed) {
        const auto it = j.find(k.key);
        if (it == j.end()) {
            if (k.absent_ok) continue;
            throw DataError(p + " has no key \"" + k.key + "\"; Parallax computes " + arch.name +
                            " with " + k.key + " = " + value_text(k.value) + ": add it");
        }
        if (!holds(*it, k.value, mc.layers))
            throw DataError(p + ": \"" + k.key + "\" is " + shown(*it) + " but Parallax computes " +
                            arch.name + " with " + value_text(k.value) + " (" + k.why +
                            "); it cannot compute this model");
    }
    for (const char* key : {"dtype", "torch_dtype"}) {  // either may say the weights' dtype
        const auto it = j.find(key);
        if (it != j.end() && !it->is_string() && !it->is_null())
            throw DataError(p + ": \"" + key + "\" is " + shown(*it) + " (" + json_type(*it) +
                            ") but must be a dtype name such as \"float32\" or null");
    }

    // 4. A model Parallax can build (heads divide the width, the limits of the sizes, ...).
    Config cfg;
    cfg.model = mc;
    try {
        validate_config(cfg);
    } catch (const ConfigError& e) {
        std::string keys;
        for (const HfKey& k : arch.keys)
            keys.append(keys.empty() ? "" : ", ").append(k.hf).append(" is ").append(k.key);
        if (arch.rope) {
            keys.append(", rope_parameters.")
                .append(kRopeTheta.hf)
                .append(" is ")
                .append(kRopeTheta.key);
            for (const HfKey& k : kLlama3Keys)
                keys.append(", rope_parameters.").append(k.hf).append(" is ").append(k.key);
        }
        throw DataError(p + " describes a model Parallax cannot build: " + e.what() + " (" + keys +
                        ")");
    }
    return out;
}

std::string hf_config_text(const ModelConfig& model, SafeDType dtype) {
    const HfArchitecture& arch = hf_architecture_for(model);  // refuses what no class is
    const ModelConfig mc = resolved(model);
    json j = json::parse(arch.written);
    j["architectures"] = json::array({arch.name});
    j["model_type"] = arch.model_type;
    for (const HfKey& k : arch.keys)
        j[k.hf] = k.absent == HfAbsent::null_same && field_value(mc, k.field) == k.fallback(mc)
                      ? json(nullptr)
                      : field_json(mc, k.field);
    if (arch.rope) j["rope_parameters"] = rope_json(mc);
    for (const HfFixedKey& k : arch.fixed) j[k.key] = json::parse(value_json(k.value, mc.layers));
    j["dtype"] = dtype_word(dtype);
    // Python's json.dumps(indent=2, sort_keys=True) + "\n", as transformers' to_json_file.
    return j.dump(2) + "\n";
}

std::string hf_sizes_text(const HfConfig& cfg) {
    std::string s;
    for (const HfKey& k : cfg.arch->keys)
        if (std::holds_alternative<i64 ModelConfig::*>(k.field))
            s.append(s.empty() ? "" : ", ")
                .append(k.hf)
                .append(" = ")
                .append(field_text(cfg.model, k.field));
    return s;
}

std::vector<std::string> hf_config_differences(const HfConfig& cfg, const ModelConfig& job_model) {
    const HfArchitecture& arch = *cfg.arch;
    const ModelConfig file = resolved(cfg.model), job = resolved(job_model);
    const auto yes = [](bool b) { return std::string(b ? "true" : "false"); };
    std::vector<std::string> bad;

    // 1. The class.
    if (job.arch != arch.arch)
        bad.push_back("model.arch = \"" + job.arch + "\" in this config but " + arch.name +
                      " is model.arch = \"" + arch.arch + "\"");
    else if (job.llama() && job.qk_norm != arch.qk_norm)
        bad.push_back("model.qk_norm = " + yes(job.qk_norm) + " in this config but " + arch.name +
                      (arch.qk_norm ? " normalises each head's q and k (true)"
                                    : " has no per-head norms of q and k (false)"));
    if (!arch.moe && job.is_moe())
        bad.push_back("model.moe_experts = " + std::to_string(job.moe_experts) +
                      " in this config but " + arch.name + " has dense MLPs only (0)");
    if (arch.moe && job.moe_shared_experts > 0)
        bad.push_back("model.moe_shared_experts = " + std::to_string(job.moe_shared_experts) +
                      " in this config but " + arch.name + " has no shared experts (0)");

    // 2. Its keys, by value; seq_len may be less: no tensor (or only wpe's first rows) needs more.
    const auto compare = [&](const HfKey& k, const std::string& where) {
        if (!k.compared) return;
        const std::string a = field_text(job, k.field), b = field_text(file, k.field);
        const auto* size = std::get_if<i64 ModelConfig::*>(&k.field);
        const bool positions = size && *size == &ModelConfig::seq_len;
        if (a == b || (positions && job.seq_len < file.seq_len)) return;
        bad.push_back(std::string(k.key) + " = " + a + " in this config but " + where + k.hf +
                      " = " + b + " in " + cfg.path +
                      (positions ? " (model.seq_len may be at most that)" : ""));
    };
    for (const HfKey& k : arch.keys) compare(k, "");
    if (arch.rope) {
        compare(kRopeTheta, "rope_parameters.");
        if (job.rope_factor > 0 || file.rope_factor > 0)
            for (const HfKey& k : kLlama3Keys) compare(k, "rope_parameters.");
    }
    return bad;
}

}  // namespace px
