// Hugging Face folders (core/io/hf_checkpoint.h, parallax convert's third format): a tiny
// GPT2LMHeadModel folder built here as transformers saves one (config.json's keys, Conv1D weights
// stored (in, out), no lm_head.weight; model.safetensors by the writer that equals the reference
// library's bytes, tests/io/test_safetensors.cpp) goes HF -> .h5 -> HF byte for byte from F32, BF16
// and F16, with every tensor at its Parallax name in Parallax's layout; model.init_from takes the
// folder and names each key that differs; every malformed config.json (missing, not JSON, keys
// missing or of the wrong type, an unknown architecture, another activation or epsilon, untied
// embeddings) and every malformed weights file (missing, unknown or misshapen tensors, wrong
// dtypes, non-finite values, an lm_head that differs from wte) is refused naming the file and the
// key or tensor; 600 seeded mutations of config.json and of model.safetensors load or are refused,
// never crash.
#include "core/io/hf_checkpoint.h"

#include "core/base/arena.h"
#include "core/base/dtype.h"
#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/io/checkpoint_convert.h"
#include "core/io/checkpoint_llmc.h"
#include "core/io/state.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

using namespace px;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

struct TempDir {
    fs::path path;
    TempDir() {
        static int n = 0;
        path = fs::temp_directory_path() /
               ("px_test_hf_" + std::to_string(getpid()) + "_" + std::to_string(n++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

std::string get_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

void put_file(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    REQUIRE(f.good());
}

// The tiny model: C 8, 2 layers of 2 heads, 11 tokens, 6 positions, an MLP of 4C.
constexpr i64 C = 8, L = 2, NH = 2, V = 11, P = 6, F = 32;

// config.json as transformers 5 saves GPT2Config(n_embd=8, ...), as ordered (key, JSON) pairs.
using Keys = std::vector<std::pair<std::string, std::string>>;
Keys gpt2_keys(const char* dtype) {
    return {{"activation_function", "\"gelu_new\""},
            {"add_cross_attention", "false"},
            {"architectures", "[\"GPT2LMHeadModel\"]"},
            {"attn_pdrop", "0.1"},
            {"bos_token_id", "10"},
            {"dtype", std::string("\"") + dtype + "\""},
            {"embd_pdrop", "0.1"},
            {"eos_token_id", "10"},
            {"initializer_range", "0.02"},
            {"layer_norm_epsilon", "1e-05"},
            {"model_type", "\"gpt2\""},
            {"n_embd", std::to_string(C)},
            {"n_head", std::to_string(NH)},
            {"n_inner", "null"},
            {"n_layer", std::to_string(L)},
            {"n_positions", std::to_string(P)},
            {"pad_token_id", "null"},
            {"reorder_and_upcast_attn", "false"},
            {"resid_pdrop", "0.1"},
            {"scale_attn_by_inverse_layer_idx", "false"},
            {"scale_attn_weights", "true"},
            {"tie_word_embeddings", "true"},
            {"transformers_version", "\"5.25.0\""},
            {"use_cache", "true"},
            {"vocab_size", std::to_string(V)}};
}
std::string json_text(const Keys& keys) {
    std::string t = "{\n";
    for (size_t i = 0; i < keys.size(); i++)
        t +=
            "  \"" + keys[i].first + "\": " + keys[i].second + (i + 1 < keys.size() ? ",\n" : "\n");
    return t + "}\n";
}
Keys with(Keys k, const std::string& key, const std::string& value) {
    for (auto& [name, v] : k)
        if (name == key) {
            v = value;
            return k;
        }
    k.emplace_back(key, value);
    return k;
}
Keys without(Keys k, const std::string& key) {
    std::erase_if(k, [&](const auto& p) { return p.first == key; });
    return k;
}

// One HF tensor: its name, its shape in the file, and fp32 values (exact in its dtype).
struct HfTensor {
    std::string name;
    std::vector<i64> shape;
    std::vector<float> values;
    SafeDType dtype = SafeDType::F32;
    std::vector<unsigned char> bytes;  // as stored
};

// GPT2LMHeadModel's state dict without lm_head.weight, as save_pretrained writes it: written here
// from transformers' module names, independently of the library's table.
std::vector<HfTensor> gpt2_tensors(SafeDType dtype, unsigned seed) {
    std::vector<HfTensor> t;
    auto add = [&](const std::string& n, std::vector<i64> s) {
        t.push_back({n, s, {}, dtype, {}});
    };
    add("transformer.wte.weight", {V, C});
    add("transformer.wpe.weight", {P, C});
    for (int i = 0; i < L; i++) {
        const std::string h = "transformer.h." + std::to_string(i) + ".";
        add(h + "ln_1.weight", {C});
        add(h + "ln_1.bias", {C});
        add(h + "attn.c_attn.weight", {C, 3 * C});  // Conv1D: (in, out)
        add(h + "attn.c_attn.bias", {3 * C});
        add(h + "attn.c_proj.weight", {C, C});
        add(h + "attn.c_proj.bias", {C});
        add(h + "ln_2.weight", {C});
        add(h + "ln_2.bias", {C});
        add(h + "mlp.c_fc.weight", {C, F});
        add(h + "mlp.c_fc.bias", {F});
        add(h + "mlp.c_proj.weight", {F, C});
        add(h + "mlp.c_proj.bias", {C});
    }
    add("transformer.ln_f.weight", {C});
    add("transformer.ln_f.bias", {C});
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.5f);
    const DType px = *px_dtype_of(dtype);
    for (HfTensor& x : t) {
        i64 n = 1;
        for (i64 d : x.shape) n *= d;
        std::vector<float> raw(static_cast<size_t>(n));
        for (float& v : raw) v = normal(rng);
        x.bytes.resize(size_t(n) * dtype_size(px));
        convert(x.bytes.data(), px, raw.data(), DType::f32, size_t(n));
        x.values.resize(size_t(n));
        convert(x.values.data(), DType::f32, x.bytes.data(), px, size_t(n));
    }
    return t;
}

void write_weights(const std::string& path, const std::vector<HfTensor>& t) {
    std::vector<SafetensorsData> d;
    for (const HfTensor& x : t)
        d.push_back({x.name, x.dtype, x.shape, x.bytes.data(), x.bytes.size()});
    write_safetensors(path, d);
}

// A folder: config.json and model.safetensors.
struct Folder {
    TempDir dir;
    std::string path;
    std::vector<HfTensor> tensors;
    explicit Folder(SafeDType dtype = SafeDType::F32, unsigned seed = 1) {
        path = dir.file("gpt2-tiny");
        fs::create_directories(path);
        tensors = gpt2_tensors(dtype, seed);
        const char* word = dtype == SafeDType::BF16  ? "bfloat16"
                           : dtype == SafeDType::F16 ? "float16"
                                                     : "float32";
        config(gpt2_keys(word));
        weights(tensors);
    }
    void config(const Keys& k) const { put_file(path + "/config.json", json_text(k)); }
    void weights(const std::vector<HfTensor>& t) const {
        write_weights(path + "/model.safetensors", t);
    }
    std::string st() const { return path + "/model.safetensors"; }
    const HfTensor& tensor(const std::string& name) const {
        for (const HfTensor& x : tensors)
            if (x.name == name) return x;
        FAIL("no tensor " << name);
        return tensors[0];
    }
};

ModelConfig tiny_model() {
    ModelConfig mc;
    mc.vocab = V;
    mc.seq_len = P;
    mc.layers = L;
    mc.heads = NH;
    mc.hidden = C;
    mc.ffn = F;
    return mc;
}

// The folder's weights through read_init_weights, in a LogicalState of mc.
LogicalState init_from(const std::string& path, const ModelConfig& mc) {
    LogicalState s;
    s.allocate(mc);
    read_init_weights(path, mc, [&](const std::string& name) -> float* {
        const int i = s.table.find(name);
        return i < 0 ? nullptr : s.params.data() + s.table.entries[size_t(i)].offset;
    });
    return s;
}

const float* param(const LogicalState& s, const std::string& name) {
    const int i = s.table.find(name);
    REQUIRE(i >= 0);
    return s.params.data() + s.table.entries[size_t(i)].offset;
}

// The message of the E thrown by fn, or "<no exception>".
template <class E, class Fn>
std::string error_of(Fn&& fn) {
    try {
        fn();
    } catch (const E& e) {
        return e.what();
    }
    return "<no exception>";
}

// The message of a DataError from converting the folder to a checkpoint; the checkpoint must not
// appear.
std::string refusal(const Folder& f) {
    const std::string out = f.dir.file("out.h5");
    std::string msg = "<no exception>";
    try {
        convert_weights(f.path, out);
    } catch (const DataError& e) {
        msg = e.what();
    }
    CHECK_FALSE(fs::exists(out));
    return msg;
}

}  // namespace

TEST_CASE(
    "hf: HF -> h5 -> HF is byte for byte from F32, BF16 and F16, and puts every tensor in place",
    "[hf]") {
    for (SafeDType dtype : {SafeDType::F32, SafeDType::BF16, SafeDType::F16}) {
        INFO(safe_dtype_name(dtype));
        Folder f(dtype, 7);
        const std::string h5 = f.dir.file("m.h5"), back = f.dir.file("back");
        const std::string said = convert_weights(f.path, h5);
        CHECK_THAT(said, Contains(safe_dtype_name(dtype)) && Contains("model.init_from"));
        convert_weights(h5, back);
        CHECK(get_file(back + "/model.safetensors") == get_file(f.st()));
        CHECK_THAT(get_file(back + "/config.json"),
                   Contains(dtype == SafeDType::F32    ? "\"dtype\": \"float32\""
                            : dtype == SafeDType::BF16 ? "\"dtype\": \"bfloat16\""
                                                       : "\"dtype\": \"float16\""));
        const HfConfig again = read_hf_config(back + "/config.json");
        CHECK(again.model == tiny_model());

        // The checkpoint holds the logical tensors: Conv1D transposed, the rest as they are.
        CheckpointMeta meta;
        const LogicalState s = read_checkpoint(h5, tiny_model(), &meta);
        CHECK(meta.step == 0);
        CHECK(meta.source_dtype == safe_dtype_name(dtype));
        CHECK_THAT(meta.data_source, Contains("Hugging Face GPT2LMHeadModel gpt2-tiny"));
        const HfTensor& qkv = f.tensor("transformer.h.1.attn.c_attn.weight");  // (C, 3C)
        const float* ours = param(s, "h.1.attn.c_attn.weight");                // (3C, C)
        for (i64 r = 0; r < 3 * C; r++)
            for (i64 c = 0; c < C; c++)
                REQUIRE(ours[r * C + c] == qkv.values[size_t(c * 3 * C + r)]);
        const HfTensor& proj = f.tensor("transformer.h.0.mlp.c_proj.weight");  // (F, C)
        const float* p2 = param(s, "h.0.mlp.c_proj.weight");                   // (C, F)
        for (i64 r = 0; r < C; r++)
            for (i64 c = 0; c < F; c++) REQUIRE(p2[r * F + c] == proj.values[size_t(c * C + r)]);
        const HfTensor& wte = f.tensor("transformer.wte.weight");
        CHECK(std::memcmp(param(s, "wte"), wte.values.data(), wte.values.size() * 4) == 0);
        CHECK(std::memcmp(param(s, "ln_f.bias"), f.tensor("transformer.ln_f.bias").values.data(),
                          C * 4) == 0);
    }
}

TEST_CASE("hf: the dtype written: the source's by default, or the one asked for", "[hf]") {
    Folder f(SafeDType::BF16, 3);
    const std::string h5 = f.dir.file("m.h5");
    convert_weights(f.path, h5);
    ConvertOptions fp32;
    fp32.dtype = "fp32";
    convert_weights(h5, f.dir.file("wide"), fp32);
    const SafetensorsFile wide(f.dir.file("wide") + "/model.safetensors");
    for (const HfTensor& x : f.tensors) {
        CHECK(wide.entry(x.name).dtype == SafeDType::F32);
        CHECK(wide.read_f32(x.name) == x.values);  // bf16 widened exactly
    }
    // Back to bf16 from the fp32 folder: the same bytes as the source.
    ConvertOptions bf16;
    bf16.dtype = "bf16";
    convert_weights(f.dir.file("wide"), f.dir.file("m2.h5"));
    convert_weights(f.dir.file("m2.h5"), f.dir.file("narrow/"), bf16);
    CHECK(get_file(f.dir.file("narrow") + "/model.safetensors") == get_file(f.st()));
    // A checkpoint of a run (no source dtype) is written in fp32.
    CheckpointMeta meta;
    LogicalState s = read_checkpoint(h5, tiny_model(), &meta);
    Config cfg;
    cfg.model = tiny_model();
    write_checkpoint(f.dir.file("run.h5"), s, make_checkpoint_meta(cfg, 0, {}), tiny_model());
    convert_weights(f.dir.file("run.h5"), f.dir.file("from_run"));
    CHECK(SafetensorsFile(f.dir.file("from_run") + "/model.safetensors")
              .entry("transformer.wte.weight")
              .dtype == SafeDType::F32);
    ConvertOptions bad;
    bad.dtype = "int8";
    CHECK_THAT(error_of<DataError>([&] { convert_weights(h5, f.dir.file("x"), bad); }),
               Contains("int8") && Contains("bf16"));
    CHECK_THAT(error_of<DataError>([&] { convert_weights(f.path, f.dir.file("x.h5"), bf16); }),
               Contains("x.h5") && Contains("Hugging Face folder only"));
    CHECK_FALSE(fs::exists(f.dir.file("x")));
}

TEST_CASE(
    "hf: a tied lm_head.weight equal to wte and old mask buffers are read; an untied head is "
    "refused",
    "[hf]") {
    Folder f;
    std::vector<HfTensor> t = f.tensors;
    HfTensor head = f.tensor("transformer.wte.weight");
    head.name = "lm_head.weight";
    t.push_back(head);
    for (int i = 0; i < L; i++) {  // transformers 3's persistent buffers: a U8 mask, a scalar
        const std::string h = "transformer.h." + std::to_string(i) + ".attn.";
        t.push_back({h + "bias",
                     {1, 1, P, P},
                     {},
                     SafeDType::U8,
                     std::vector<unsigned char>(size_t(P * P), 1)});
        HfTensor fill{h + "masked_bias", {}, {}, SafeDType::F32, std::vector<unsigned char>(4)};
        const float v = -1e4f;
        std::memcpy(fill.bytes.data(), &v, 4);
        t.push_back(fill);
    }
    f.weights(t);
    const HfConfig cfg = read_hf_config(f.path + "/config.json");
    LogicalState s;
    s.allocate(tiny_model());
    const HfReadReport rep =
        read_hf_weights(*hf_input(f.path), cfg, tiny_model(), [&](const std::string& name) {
            return s.params.data() + s.table.entries[size_t(s.table.find(name))].offset;
        });
    CHECK(rep.lm_head);
    CHECK(rep.buffers == 2 * L);
    CHECK(rep.dtype == SafeDType::F32);
    CHECK(rep.files == std::vector<std::string>{f.st()});
    // Written back as save_pretrained writes it: without the head and the buffers.
    convert_weights(f.path, f.dir.file("m.h5"));
    convert_weights(f.dir.file("m.h5"), f.dir.file("back"));
    write_weights(f.dir.file("plain.safetensors"), f.tensors);
    CHECK(get_file(f.dir.file("back") + "/model.safetensors") ==
          get_file(f.dir.file("plain.safetensors")));

    // One element of the head differs: the model is untied.
    HfTensor& h = t[f.tensors.size()];
    REQUIRE(h.name == "lm_head.weight");
    h.values[17] += 1.0f;
    std::memcpy(h.bytes.data() + 17 * 4, &h.values[17], 4);
    f.weights(t);
    CHECK_THAT(refusal(f), Contains(f.st()) && Contains("'lm_head.weight'") &&
                               Contains("'transformer.wte.weight'") && Contains("element 17") &&
                               Contains("untied"));
}

TEST_CASE("hf: every malformed config.json is refused naming the file and the key", "[hf]") {
    Folder f;
    const std::string cfg = f.path + "/config.json";
    const Keys base = gpt2_keys("float32");
    struct Case {
        std::string text;
        std::vector<std::string> names;
    };
    Keys dup = base;
    dup.emplace_back("n_embd", "8");
    std::vector<Case> cases = {
        {"{\"n_embd\": 8,", {"not valid JSON"}},
        {"[1, 2]", {"not a JSON object"}},
        {std::string("{\"n_embd\": 8}\0", 14), {"NUL"}},
        {json_text(dup), {"\"n_embd\" twice"}},
        {json_text(without(base, "architectures")), {"\"architectures\"", "GPT2LMHeadModel"}},
        {json_text(with(base, "architectures", "\"GPT2LMHeadModel\"")), {"\"architectures\""}},
        {json_text(with(base, "architectures", "[]")), {"\"architectures\""}},
        {json_text(with(base, "architectures", "[\"MistralForCausalLM\"]")),
         {"MistralForCausalLM", "GPT2LMHeadModel (model_type \"gpt2\")",
          "LlamaForCausalLM (model_type \"llama\")"}},
        {json_text(with(base, "architectures", "[\"LlamaForCausalLM\"]")),
         {"\"model_type\" is \"gpt2\"", "LlamaForCausalLM's is \"llama\""}},
        {json_text(with(base, "model_type", "\"llama\"")), {"\"model_type\"", "\"llama\""}},
        {json_text(without(base, "model_type")), {"\"model_type\""}},
        {json_text(with(base, "n_inner", "\"x\"")), {"\"n_inner\"", "or null"}},
        {json_text(with(base, "activation_function", "\"gelu\"")),
         {"\"activation_function\"", "\"gelu\"", "gelu_new"}},
        {json_text(with(base, "layer_norm_epsilon", "1e-06")), {"\"layer_norm_epsilon\"", "1e-05"}},
        {json_text(with(base, "layer_norm_epsilon", "\"1e-05\"")), {"\"layer_norm_epsilon\""}},
        {json_text(with(base, "tie_word_embeddings", "false")), {"\"tie_word_embeddings\""}},
        {json_text(with(base, "scale_attn_weights", "false")), {"\"scale_attn_weights\""}},
        {json_text(with(base, "scale_attn_by_inverse_layer_idx", "true")),
         {"\"scale_attn_by_inverse_layer_idx\""}},
        {json_text(with(base, "add_cross_attention", "true")), {"\"add_cross_attention\""}},
        {json_text(with(base, "dtype", "5")), {"\"dtype\""}},
        {json_text(with(base, "torch_dtype", "[]")), {"\"torch_dtype\""}},
        {json_text(with(base, "n_head", "3")), {"n_head is model.heads", "model.heads"}},
    };
    for (const char* key : {"n_embd", "n_layer", "n_head", "n_positions", "vocab_size"}) {
        const std::string q = std::string("\"") + key + "\"";
        cases.push_back({json_text(without(base, key)), {q, "has no key"}});
        for (const char* bad : {"\"8\"", "8.0", "true", "-1", "0", "null", "[8]",
                                "99999999999999999999", "2000000000000"})
            cases.push_back({json_text(with(base, key, bad)), {q}});
    }
    for (const Case& c : cases) {
        put_file(cfg, c.text);
        const std::string msg = refusal(f);
        INFO(c.text.substr(0, 300));
        CHECK_THAT(msg, Contains(cfg));
        for (const std::string& n : c.names) CHECK_THAT(msg, Contains(n));
        // model.init_from reads it the same way.
        CHECK(error_of<DataError>([&] { init_from(f.path, tiny_model()); }) == msg);
    }
    fs::remove(cfg);
    CHECK_THAT(refusal(f), Contains(cfg) && Contains("does not exist"));
    fs::create_directory(cfg);
    CHECK_THAT(refusal(f), Contains(cfg) && Contains("not a regular file"));
    fs::remove(cfg);

    // What transformers may leave out or spell otherwise is read.
    Keys lean = base;
    for (const char* k : {"activation_function", "add_cross_attention", "layer_norm_epsilon",
                          "tie_word_embeddings", "scale_attn_weights", "n_inner", "dtype"})
        lean = without(lean, k);
    for (const Keys& k : {lean, with(base, "layer_norm_epsilon", "0.00001"),
                          with(base, "n_inner", "32"), with(base, "torch_dtype", "\"float32\""),
                          with(base, "architectures", "[\"GPT2LMHeadModel\", \"Other\"]")}) {
        f.config(k);
        CHECK(read_hf_config(cfg).model == tiny_model());
        CHECK_NOTHROW(convert_weights(f.path, f.dir.file("ok.h5")));
    }
}

TEST_CASE(
    "hf: missing, unknown, misshapen, mistyped and non-finite tensors are refused naming "
    "the file and the tensor",
    "[hf]") {
    Folder f;
    auto refused = [&](const std::vector<HfTensor>& t) {
        f.weights(t);
        return refusal(f);
    };
    auto renamed = [&](const std::string& from, const std::string& to) {
        std::vector<HfTensor> t = f.tensors;
        for (HfTensor& x : t)
            if (x.name == from) x.name = to;
        return t;
    };
    std::vector<HfTensor> t = f.tensors;
    std::erase_if(t, [](const HfTensor& x) { return x.name == "transformer.h.1.mlp.c_proj.bias"; });
    CHECK_THAT(refused(t), Contains(f.st()) && Contains("'transformer.h.1.mlp.c_proj.bias'") &&
                               Contains("n_layer = 2") && Contains("has no tensor"));
    t = f.tensors;
    t.erase(t.begin() + 2, t.end());  // fewer tensors than the model has: found before its table
    CHECK_THAT(refused(t), Contains("'transformer.h.0.ln_1.weight'") && Contains("has no tensor"));
    t = f.tensors;
    HfTensor extra = f.tensor("transformer.h.1.ln_1.weight");
    extra.name = "transformer.h.2.ln_1.weight";
    t.push_back(extra);
    CHECK_THAT(refused(t), Contains(f.st()) && Contains("'transformer.h.2.ln_1.weight'") &&
                               Contains("not a tensor of GPT2LMHeadModel") &&
                               Contains("n_layer = 2"));
    CHECK_THAT(refused(renamed("transformer.ln_f.bias", "transformer.ln_f.beta")),
               Contains("'transformer.ln_f.beta'"));

    // Parallax's (out, in) instead of Conv1D's (in, out).
    t = f.tensors;
    for (HfTensor& x : t)
        if (x.name == "transformer.h.0.attn.c_attn.weight") x.shape = {3 * C, C};
    CHECK_THAT(refused(t), Contains(f.st()) && Contains("'transformer.h.0.attn.c_attn.weight'") &&
                               Contains("[24, 8]") && Contains("[8, 24]") &&
                               Contains("config.json"));
    // A config.json of another model: n_inner 16 against weights of 32.
    f.config(with(gpt2_keys("float32"), "n_inner", "16"));
    CHECK_THAT(refused(f.tensors), Contains("'transformer.h.0.mlp.c_fc.weight'") &&
                                       Contains("n_inner = 16") && Contains("[8, 32]"));
    f.config(with(gpt2_keys("float32"), "vocab_size", "12"));
    CHECK_THAT(refused(f.tensors), Contains("'transformer.wte.weight'") && Contains("[11, 8]"));
    f.config(gpt2_keys("float32"));

    // Dtypes Parallax does not read, with bytes of the right length.
    for (SafeDType d :
         {SafeDType::I32, SafeDType::U32, SafeDType::F64, SafeDType::F8_E4M3, SafeDType::I8}) {
        t = f.tensors;
        for (HfTensor& x : t)
            if (x.name == "transformer.h.1.ln_2.weight") {
                x.dtype = d;
                x.bytes.resize(size_t(C) * size_t(safe_dtype_bits(d)) / 8);
            }
        CHECK_THAT(refused(t), Contains(f.st()) && Contains("'transformer.h.1.ln_2.weight'") &&
                                   Contains(std::string("stored as ") + safe_dtype_name(d)) &&
                                   Contains("F32, BF16 or F16"));
    }
    // Non-finite values.
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
        t = f.tensors;
        for (HfTensor& x : t)
            if (x.name == "transformer.h.0.mlp.c_fc.bias")
                std::memcpy(x.bytes.data() + 12, &bad, 4);
        CHECK_THAT(refused(t), Contains("'transformer.h.0.mlp.c_fc.bias'") &&
                                   Contains("non-finite") && Contains("element 3"));
    }
    // A sharded set missing a tensor names its index.
    f.weights(f.tensors);
    fs::remove(f.st());
    std::vector<SafetensorsData> d;
    for (const HfTensor& x : f.tensors)
        if (x.name != "transformer.wpe.weight")
            d.push_back({x.name, x.dtype, x.shape, x.bytes.data(), x.bytes.size()});
    const SafetensorsShards sh = write_safetensors_shards(f.path, d, 1024);
    REQUIRE_FALSE(sh.index.empty());
    CHECK_THAT(refusal(f), Contains(sh.index) && Contains("'transformer.wpe.weight'"));
}

TEST_CASE(
    "hf: model.init_from takes the folder or its model.safetensors and names each key "
    "that differs",
    "[hf]") {
    Folder f(SafeDType::F16, 5);
    const ModelConfig mc = tiny_model();
    const LogicalState a = init_from(f.path, mc);
    const LogicalState b = init_from(f.st(), mc);
    CHECK(a.params == b.params);
    const HfTensor& fc = f.tensor("transformer.h.1.mlp.c_fc.weight");  // (C, F)
    const float* ours = param(a, "h.1.mlp.c_fc.weight");               // (F, C)
    for (i64 r = 0; r < F; r++)
        for (i64 c = 0; c < C; c++) REQUIRE(ours[r * C + c] == fc.values[size_t(c * F + r)]);
    // A shorter sequence takes the first rows of wpe.
    ModelConfig shorter = mc;
    shorter.seq_len = 4;
    const LogicalState s = init_from(f.path, shorter);
    CHECK(std::memcmp(param(s, "wpe"), f.tensor("transformer.wpe.weight").values.data(),
                      4 * C * 4) == 0);

    ModelConfig wide = mc;
    wide.hidden = 16;
    wide.ffn = 64;
    std::string msg = error_of<ConfigError>([&] { init_from(f.path, wide); });
    CHECK_THAT(msg, Contains("model.init_from = " + f.path) && Contains("model.hidden = 16") &&
                        Contains("n_embd = 8") && Contains("model.ffn = 64") &&
                        Contains("n_inner = 32") && Contains(f.path + "/config.json"));
    ModelConfig longer = mc;
    longer.seq_len = P + 1;
    CHECK_THAT(error_of<ConfigError>([&] { init_from(f.path, longer); }),
               Contains("model.seq_len = 7") && Contains("n_positions = 6"));
    ModelConfig deep = mc;
    deep.layers = 3;
    CHECK_THAT(error_of<ConfigError>([&] { init_from(f.path, deep); }),
               Contains("model.layers = 3") && Contains("n_layer = 2"));
    ModelConfig moe = mc;
    moe.moe_experts = 2;
    CHECK_THAT(error_of<ConfigError>([&] { init_from(f.path, moe); }),
               Contains("model.moe_experts"));

    // A bad tensor leaves the model as it was.
    std::vector<HfTensor> t = f.tensors;
    const float inf = std::numeric_limits<float>::infinity();
    const std::uint16_t inf16 = f32_to_f16(inf);
    std::memcpy(t.back().bytes.data(), &inf16, 2);
    f.weights(t);
    LogicalState kept;
    kept.allocate(mc);
    std::fill(kept.params.begin(), kept.params.end(), 0.25f);
    CHECK_THROWS_AS(
        read_init_weights(f.path, mc,
                          [&](const std::string& name) {
                              return kept.params.data() +
                                     kept.table.entries[size_t(kept.table.find(name))].offset;
                          }),
        DataError);
    CHECK(std::all_of(kept.params.begin(), kept.params.end(), [](float x) { return x == 0.25f; }));
    // A folder without config.json is said to be one.
    TempDir empty;
    CHECK_THAT(error_of<DataError>([&] { init_from(empty.path.string(), mc); }),
               Contains(empty.file("config.json")) && Contains("model.safetensors"));
}

TEST_CASE("hf: the writer refuses what its dtype cannot hold and writes shards above a size",
          "[hf]") {
    Folder f;
    LogicalState s = init_from(f.path, tiny_model());
    auto lookup = [&](const std::string& name) {
        return s.params.data() + s.table.entries[size_t(s.table.find(name))].offset;
    };
    const std::string out = f.dir.file("out");
    lookup("h.1.attn.c_proj.weight")[9] = 1e5f;  // beyond fp16, within bf16
    CHECK_THAT(error_of<Error>([&] { write_hf_folder(out, tiny_model(), lookup, SafeDType::F16); }),
               Contains(out) && Contains("h.1.attn.c_proj.weight") &&
                   Contains("transformer.h.1.attn.c_proj.weight") &&
                   Contains("beyond the range of F16"));
    CHECK_FALSE(fs::exists(out));
    CHECK_NOTHROW(write_hf_folder(out, tiny_model(), lookup, SafeDType::BF16));
    lookup("ln_f.weight")[2] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THAT(error_of<Error>([&] { write_hf_folder(out, tiny_model(), lookup, SafeDType::F32); }),
               Contains("ln_f.weight") && Contains("diverged"));
    lookup("ln_f.weight")[2] = 1.0f;
    ModelConfig moe = tiny_model();
    moe.moe_experts = 2;
    CHECK_THAT(error_of<Error>([&] { hf_config_text(moe, SafeDType::F32); }),
               Contains("model.moe_experts"));
    CHECK_THAT(
        error_of<DataError>([&] { write_hf_folder(f.st(), tiny_model(), lookup, SafeDType::F32); }),
        Contains(f.st()) && Contains("not a folder"));

    // Shards of at most 1 kB and their index, read back through the folder; a later single file
    // replaces them.
    const std::vector<std::string> files =
        write_hf_folder(out, tiny_model(), lookup, SafeDType::F32, 1024);
    CHECK(files.size() > 3);
    CHECK(fs::exists(out + "/model.safetensors.index.json"));
    CHECK_FALSE(fs::exists(out + "/model.safetensors"));
    CHECK(init_from(out, tiny_model()).params == s.params);
    write_hf_folder(out, tiny_model(), lookup, SafeDType::F32);
    CHECK_FALSE(fs::exists(out + "/model.safetensors.index.json"));
    CHECK(init_from(out + "/model.safetensors", tiny_model()).params == s.params);

    // A model of another MLP width: n_inner is written, and read back.
    ModelConfig narrow = tiny_model();
    narrow.ffn = 12;
    const std::string text = hf_config_text(narrow, SafeDType::BF16);
    CHECK_THAT(text, Contains("\"n_inner\": 12") && Contains("\"dtype\": \"bfloat16\""));
    put_file(f.dir.file("c.json"), text);
    CHECK(read_hf_config(f.dir.file("c.json")).model == narrow);
    CHECK_THAT(hf_config_text(tiny_model(), SafeDType::F32), Contains("\"n_inner\": null"));
}

TEST_CASE("hf: llm.c and Hugging Face convert into each other", "[hf]") {
    Folder f;
    const std::string bin = f.dir.file("gpt2.bin");
    CHECK_THAT(convert_weights(f.path, bin), Contains("llm.c checkpoint " + bin));
    convert_weights(bin, f.dir.file("back"));
    CHECK(get_file(f.dir.file("back") + "/model.safetensors") == get_file(f.st()));
    // Same-format conversions and unknown outputs are refused.
    CHECK_THAT(error_of<DataError>([&] { convert_weights(f.path, f.dir.file("again")); }),
               Contains(f.path) && Contains("already a Hugging Face folder"));
    CHECK_THAT(error_of<DataError>([&] { convert_weights(f.path, f.dir.file("out.txt")); }),
               Contains("out.txt") && Contains(".h5") && Contains(".bin"));
    put_file(f.dir.file("notes.safetensors"), "not a safetensors file");
    CHECK_THAT(error_of<DataError>([&] { convert_weights(f.dir.file("notes.safetensors"), bin); }),
               Contains(f.dir.file("notes.safetensors")) && Contains("config.json"));
    put_file(f.dir.file("config.json"), json_text(gpt2_keys("float32")));
    CHECK_THAT(error_of<DataError>([&] { convert_weights(f.dir.file("notes.safetensors"), bin); }),
               Contains(f.dir.file("notes.safetensors")));
}

TEST_CASE(
    "hf: 600 seeded mutations of config.json and model.safetensors convert or are refused "
    "naming the folder, never crash",
    "[hf]") {
    Folder f;
    const Keys base = gpt2_keys("float32");
    const std::string st = get_file(f.st());
    const std::vector<std::string> pool = {"null",
                                           "true",
                                           "false",
                                           "0",
                                           "-1",
                                           "1",
                                           "2",
                                           "3",
                                           "4",
                                           "8",
                                           "11",
                                           "32",
                                           "1e-05",
                                           "0.5",
                                           "\"gelu_new\"",
                                           "\"x\"",
                                           "[]",
                                           "{}",
                                           "[\"GPT2LMHeadModel\"]",
                                           "99999999999999999999",
                                           "-9223372036854775808",
                                           "100000000",
                                           "1e300",
                                           "\"\\u0000\"",
                                           "[[[[[[]]]]]]"};
    std::mt19937_64 rng(20250611);
    auto pick = [&](size_t n) { return size_t(rng() % n); };
    int ok = 0, refused = 0;
    const std::string out = f.dir.file("out.h5");
    for (int it = 0; it < 600; it++) {
        std::string what;
        std::string cfg = json_text(base), weights = st;
        if (it % 2 == 0) {
            Keys k = base;
            switch (pick(5)) {
                case 0: {
                    const auto& key = base[pick(base.size())].first;
                    const auto& v = pool[pick(pool.size())];
                    k = with(k, key, v);
                    what = "config " + key + " = " + v;
                    break;
                }
                case 1:
                    what = "config without " + base[pick(base.size())].first;
                    k = without(k, base[pick(base.size())].first);
                    break;
                case 2:
                    k = with(k, "n_layer", std::to_string(pick(4)));
                    k = with(k, "n_embd", std::to_string(pick(3) * 4));
                    what = "config sizes";
                    break;
                default:
                    break;
            }
            cfg = json_text(k);
            if (what.empty()) {
                for (int n = 1 + int(pick(3)); n > 0; n--) cfg[pick(cfg.size())] = char(rng());
                what = "config bytes";
            }
        } else {
            const size_t header = 8 + size_t(st[0] & 0xff) + (size_t(st[1] & 0xff) << 8);
            if (pick(4) == 0) {
                weights.resize(pick(weights.size()));
                what = "weights cut";
            } else {
                for (int n = 1 + int(pick(3)); n > 0; n--)
                    weights[pick(pick(3) ? header : weights.size())] ^= char(1 << pick(8));
                what = "weights bits";
            }
        }
        put_file(f.path + "/config.json", cfg);
        put_file(f.st(), weights);
        try {
            convert_weights(f.path, out);
            ok++;
            fs::remove(out);
        } catch (const DataError& e) {
            refused++;
            INFO(it << " " << what);
            CHECK_THAT(e.what(), Contains(f.path));
        } catch (const std::exception& e) {
            FAIL("mutation " << it << " (" << what << ") threw other than DataError: " << e.what());
        }
    }
    CHECK(refused > 200);
    CHECK(ok > 20);
}
