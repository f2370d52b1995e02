// config.json of a Hugging Face folder (core/io/hf_checkpoint.h): read into a ModelConfig through
// the architecture's size keys, checked against the keys whose value Parallax's model has built
// in, and written back for a ModelConfig as transformers writes it.
//
// Index
//   read_text, parse_json     the file's text and its JSON (duplicate keys refused)
//   json_type, shown          a value's JSON type and text, for messages
//   read_hf_config            config.json -> HfConfig
//   hf_config_text            HfConfig's inverse: the text of config.json for a ModelConfig
#include "core/base/error.h"
#include "core/base/files.h"
#include "core/io/hf_checkpoint.h"

#include <nlohmann/json.hpp>

#include <cerrno>
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

std::string value_json(const HfValue& v) {
    switch (v.kind) {
        case HfValue::string:
            return json(v.s).dump();
        case HfValue::boolean:
            return v.b ? "true" : "false";
        case HfValue::number:
            return json(v.x).dump();
    }
    return "";
}

bool holds(const json& got, const HfValue& want) {
    switch (want.kind) {
        case HfValue::string:
            return got.is_string() && got.get<std::string>() == want.s;
        case HfValue::boolean:
            return got.is_boolean() && got.get<bool>() == want.b;
        case HfValue::number:  // as the fp32 the kernels use (torch casts eps the same way)
            return got.is_number() && float(got.get<double>()) == float(want.x);
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

    // 2. The sizes, into the ModelConfig.
    ModelConfig& mc = out.model;
    for (const HfSizeKey& k : arch.sizes) {
        const auto it = j.find(k.hf);
        if ((it == j.end() || it->is_null()) && k.from) {
            mc.*k.field = k.times * (mc.*k.from);
            continue;
        }
        if (it == j.end())
            throw DataError(p + " has no key \"" + k.hf + "\" (" + k.key + ", which " + arch.name +
                            " needs); add it");
        if (!it->is_number_integer())
            throw DataError(p + ": \"" + k.hf + "\" is " + shown(*it) + " (" + json_type(*it) +
                            ") but must be a positive integer (" + k.key + ")" +
                            (k.from ? std::string(" or null") : std::string()));
        const bool negative =
            it->is_number_integer() && !it->is_number_unsigned() && it->get<std::int64_t>() < 0;
        const std::uint64_t v = negative ? 0 : it->get<std::uint64_t>();
        if (negative || v == 0 || v > std::uint64_t(kMaxSize))
            throw DataError(p + ": \"" + k.hf + "\" is " + shown(*it) + " but must be a " +
                            "positive integer of at most 2^40 (" + k.key + ")");
        mc.*k.field = i64(v);
    }

    // 3. The keys whose value the model has built in.
    for (const HfFixedKey& k : arch.fixed) {
        const auto it = j.find(k.key);
        if (it == j.end()) {
            if (k.absent_ok) continue;
            throw DataError(p + " has no key \"" + k.key + "\"; Parallax computes " + arch.name +
                            " with " + k.key + " = " + value_json(k.value) + ": add it");
        }
        if (!holds(*it, k.value))
            throw DataError(p + ": \"" + k.key + "\" is " + shown(*it) + " but Parallax computes " +
                            arch.name + " with " + value_json(k.value) + " (" + k.why +
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
        for (const HfSizeKey& k : arch.sizes)
            keys.append(keys.empty() ? "" : ", ").append(k.hf).append(" is ").append(k.key);
        throw DataError(p + " describes a model Parallax cannot build: " + e.what() + " (" + keys +
                        ")");
    }
    return out;
}

std::string hf_config_text(const ModelConfig& mc, SafeDType dtype, const HfArchitecture& arch) {
    if (mc.is_moe())
        throw Error("model.moe_experts = " + std::to_string(mc.moe_experts) + ": " + arch.name +
                    " has dense MLPs only; a mixture-of-experts model has no Hugging Face " +
                    arch.name + " folder");
    json j = json::parse(arch.written);
    j["architectures"] = json::array({arch.name});
    j["model_type"] = arch.model_type;
    for (const HfSizeKey& k : arch.sizes) {
        const i64 v = mc.*k.field;
        if (k.from && v == k.times * (mc.*k.from))
            j[k.hf] = nullptr;
        else
            j[k.hf] = v;
    }
    for (const HfFixedKey& k : arch.fixed) j[k.key] = json::parse(value_json(k.value));
    j["dtype"] = dtype_word(dtype);
    // Python's json.dumps(indent=2, sort_keys=True) + "\n", as transformers' to_json_file.
    return j.dump(2) + "\n";
}

}  // namespace px
