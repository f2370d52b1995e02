// Hugging Face folders of the llama family (core/io/hf_checkpoint.h, core/io/hf_architectures.cpp):
// tiny LlamaForCausalLM (grouped-query attention, an untied or a tied head, Llama 3.1's RoPE
// scaling), Qwen3ForCausalLM (per-head q and k norms, head_dim != hidden / heads) and
// Qwen3MoeForCausalLM (a dense layer and a MoE layer of four experts, saved one by one) folders,
// built here as transformers 5 saves them (config.json's keys, the state dict's names and shapes,
// written from transformers' module names independently of the library's table), go HF -> .h5 ->
// HF byte for byte from F32 and BF16, with every tensor at its Parallax name (experts stacked in
// order); transformers 4's RoPE layout (rope_scaling, "type", rope_theta at the top) reads as 5's;
// every malformed config.json (another rope_type, activation, bias, sliding window, sparse-layer
// list, an odd head_dim, KV heads that do not divide the heads, a key of the wrong kind) and
// every weights file that does not fit it (a missing q_norm, a k_proj of other KV heads, a
// missing expert, a tensor of another class) is refused naming the file and the key or tensor;
// model.init_from names each key that differs with both values; the writer picks the class from
// the model and refuses a model no class is; llm.c's format refuses llama models.
#include "core/io/hf_checkpoint.h"

#include "core/base/arena.h"
#include "core/base/dtype.h"
#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/io/checkpoint_convert.h"
#include "core/io/checkpoint_llmc.h"
#include "core/io/state.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

using namespace px;
using Catch::Matchers::Contains;
using px::test::error_of;
namespace fs = std::filesystem;

namespace {

std::string get_file(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
}

void put_file(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), std::streamsize(bytes.size()));
    REQUIRE(f.good());
}

// The tiny models: C 8, 2 layers, 4 query heads over 2 KV heads, 11 tokens, 6 positions, an MLP
// of 12. Llama's head is C / NH = 2 channels, Qwen3's 4; the MoE's layer 1 (decoder_sparse_step
// 2) has 4 experts of 6 channels, 2 per token.
constexpr i64 C = 8, L = 2, NH = 4, KV = 2, V = 11, P = 6, F = 12, E = 4, FE = 6;

enum class Kind { llama, qwen3, moe };

struct Spec {
    Kind kind = Kind::llama;
    bool tied = false;
    i64 hs() const { return kind == Kind::llama ? C / NH : 4; }
    bool moe_layer(i64 l) const { return kind == Kind::moe && (l + 1) % 2 == 0; }
};

using Keys = std::vector<std::pair<std::string, std::string>>;

// config.json as transformers 5.25 saves LlamaConfig / Qwen3Config / Qwen3MoeConfig(...).
Keys config_keys(const Spec& s, const char* dtype) {
    Keys k = {{"architectures", s.kind == Kind::llama   ? "[\"LlamaForCausalLM\"]"
                                : s.kind == Kind::qwen3 ? "[\"Qwen3ForCausalLM\"]"
                                                        : "[\"Qwen3MoeForCausalLM\"]"},
              {"attention_bias", "false"},
              {"attention_dropout", "0.0"},
              {"dtype", std::string("\"") + dtype + "\""},
              {"head_dim", std::to_string(s.hs())},
              {"hidden_act", "\"silu\""},
              {"hidden_size", std::to_string(C)},
              {"initializer_range", "0.02"},
              {"intermediate_size", std::to_string(F)},
              {"max_position_embeddings", std::to_string(P)},
              {"model_type", s.kind == Kind::llama   ? "\"llama\""
                             : s.kind == Kind::qwen3 ? "\"qwen3\""
                                                     : "\"qwen3_moe\""},
              {"num_attention_heads", std::to_string(NH)},
              {"num_hidden_layers", std::to_string(L)},
              {"num_key_value_heads", std::to_string(KV)},
              {"pad_token_id", "null"},
              {"rms_norm_eps", "1e-06"},
              {"rope_parameters", "{\"rope_theta\": 10000.0, \"rope_type\": \"default\"}"},
              {"tie_word_embeddings", s.tied ? "true" : "false"},
              {"use_cache", "true"},
              {"vocab_size", std::to_string(V)}};
    if (s.kind == Kind::llama) {
        k.emplace_back("bos_token_id", "1");
        k.emplace_back("eos_token_id", "2");
        k.emplace_back("mlp_bias", "false");
        k.emplace_back("pretraining_tp", "1");
    } else {
        k.emplace_back("sliding_window", "null");
        k.emplace_back("use_sliding_window", "false");
    }
    if (s.kind == Kind::qwen3) {
        k.emplace_back("layer_types", "[\"full_attention\", \"full_attention\"]");
        k.emplace_back("max_window_layers", "28");
    }
    if (s.kind == Kind::moe) {
        k.emplace_back("decoder_sparse_step", "2");
        k.emplace_back("mlp_only_layers", "[]");
        k.emplace_back("moe_intermediate_size", std::to_string(FE));
        k.emplace_back("norm_topk_prob", "true");
        k.emplace_back("num_experts_per_tok", "2");
        k.emplace_back("num_local_experts", std::to_string(E));
        k.emplace_back("output_router_logits", "false");
        k.emplace_back("router_aux_loss_coef", "0.001");
    }
    return k;
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

struct HfTensor {
    std::string name;
    std::vector<i64> shape;
    std::vector<float> values;  // exact in its dtype
    SafeDType dtype = SafeDType::F32;
    std::vector<unsigned char> bytes;
};

// The state dict save_pretrained writes: transformers' module names, (out, in) Linear weights.
std::vector<HfTensor> state_dict(const Spec& s, SafeDType dtype, unsigned seed) {
    std::vector<HfTensor> t;
    auto add = [&](const std::string& n, std::vector<i64> shape) {
        t.push_back({n, shape, {}, dtype, {}});
    };
    const i64 HS = s.hs();
    add("model.embed_tokens.weight", {V, C});
    for (i64 i = 0; i < L; i++) {
        const std::string h = "model.layers." + std::to_string(i) + ".";
        add(h + "input_layernorm.weight", {C});
        add(h + "self_attn.q_proj.weight", {NH * HS, C});
        add(h + "self_attn.k_proj.weight", {KV * HS, C});
        add(h + "self_attn.v_proj.weight", {KV * HS, C});
        if (s.kind != Kind::llama) {
            add(h + "self_attn.q_norm.weight", {HS});
            add(h + "self_attn.k_norm.weight", {HS});
        }
        add(h + "self_attn.o_proj.weight", {C, NH * HS});
        add(h + "post_attention_layernorm.weight", {C});
        if (s.moe_layer(i)) {
            add(h + "mlp.gate.weight", {E, C});
            for (i64 e = 0; e < E; e++) {
                const std::string x = h + "mlp.experts." + std::to_string(e) + ".";
                add(x + "gate_proj.weight", {FE, C});
                add(x + "up_proj.weight", {FE, C});
                add(x + "down_proj.weight", {C, FE});
            }
        } else {
            add(h + "mlp.gate_proj.weight", {F, C});
            add(h + "mlp.up_proj.weight", {F, C});
            add(h + "mlp.down_proj.weight", {C, F});
        }
    }
    add("model.norm.weight", {C});
    if (!s.tied) add("lm_head.weight", {V, C});
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

struct Folder {
    std::string root, path;
    Spec spec;
    std::vector<HfTensor> tensors;
    explicit Folder(Spec s, SafeDType dtype = SafeDType::F32, unsigned seed = 1) : spec(s) {
        static int n = 0;
        root = test::temp_dir("hf_llama_" + std::to_string(n++));
        path = root + "/tiny";
        fs::create_directories(path);
        tensors = state_dict(s, dtype, seed);
        config(config_keys(s, dtype == SafeDType::BF16 ? "bfloat16" : "float32"));
        weights(tensors);
    }
    ~Folder() {
        std::error_code ec;
        fs::remove_all(root, ec);
    }
    std::string file(const std::string& name) const { return root + "/" + name; }
    std::string cfg() const { return path + "/config.json"; }
    std::string st() const { return path + "/model.safetensors"; }
    void config(const Keys& k) const { put_file(cfg(), json_text(k)); }
    void weights(const std::vector<HfTensor>& t) const { write_weights(st(), t); }
    const HfTensor& tensor(const std::string& name) const {
        for (const HfTensor& x : tensors)
            if (x.name == name) return x;
        FAIL("no tensor " << name);
        return tensors[0];
    }
};

// The ModelConfig a folder of spec s is.
ModelConfig model_of(const Spec& s) {
    ModelConfig mc;
    mc.arch = "llama";
    mc.vocab = V;
    mc.seq_len = P;
    mc.layers = L;
    mc.heads = NH;
    mc.hidden = C;
    mc.ffn = F;
    mc.kv_heads = KV;
    mc.head_dim = s.hs();
    mc.norm_eps = 1e-6;
    mc.rope_theta = 10000;
    mc.tie_embeddings = s.tied;
    mc.qk_norm = s.kind != Kind::llama;
    if (s.kind == Kind::moe) {
        mc.moe_experts = E;
        mc.moe_top_k = 2;
        mc.moe_ffn = FE;
        mc.moe_every = 2;
        mc.moe_norm_topk = true;
        mc.moe_aux_loss = 0.001;
        mc.moe_z_loss = 0;
        mc.moe_capacity_factor = 0;
    }
    return mc;
}

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

// The message of a DataError from converting the folder; the checkpoint must not appear.
std::string refusal(const Folder& f) {
    const std::string out = f.file("out.h5");
    std::string msg = "<no exception>";
    try {
        convert_weights(f.path, out);
    } catch (const DataError& e) {
        msg = e.what();
    }
    CHECK_FALSE(fs::exists(out));
    return msg;
}

// Round trip: HF -> .h5 -> HF gives model.safetensors back byte for byte, every tensor of the
// checkpoint at its Parallax name; returns the checkpoint's state.
LogicalState round_trip(const Folder& f, SafeDType dtype) {
    const std::string h5 = f.file("m.h5"), back = f.file("back");
    const std::string said = convert_weights(f.path, h5);
    CHECK_THAT(said, Contains(safe_dtype_name(dtype)));
    const std::string wrote = convert_weights(h5, back);
    CHECK(get_file(back + "/model.safetensors") == get_file(f.st()));
    const ModelConfig mc = model_of(f.spec);
    CHECK(read_hf_config(back + "/config.json").model == mc);
    CheckpointMeta meta;
    LogicalState s = read_checkpoint(h5, mc, &meta);
    CHECK(meta.source_dtype == safe_dtype_name(dtype));
    for (const HfTensor& x : f.tensors) {
        if (x.name.find(".experts.") != std::string::npos) continue;  // stacked: below
        INFO(x.name);
        CHECK(std::memcmp(param(s, x.name), x.values.data(), x.values.size() * 4) == 0);
    }
    return s;
}

}  // namespace

TEST_CASE("hf llama: LlamaForCausalLM goes HF -> h5 -> HF byte for byte, tied or not", "[hf]") {
    for (SafeDType dtype : {SafeDType::F32, SafeDType::BF16})
        for (bool tied : {false, true}) {
            INFO(safe_dtype_name(dtype) << (tied ? " tied" : " untied"));
            Folder f({Kind::llama, tied}, dtype, 3);
            round_trip(f, dtype);
            const std::string text = get_file(f.file("back") + "/config.json");
            CHECK_THAT(
                text,
                Contains("\"architectures\": [\n    \"LlamaForCausalLM\"\n  ]") &&
                    Contains("\"num_key_value_heads\": 2") && Contains("\"head_dim\": 2") &&
                    Contains("\"rms_norm_eps\": 1e-06") && Contains("\"rope_theta\": 10000.0") &&
                    Contains("\"rope_type\": \"default\"") && Contains("\"mlp_bias\": false") &&
                    Contains(std::string("\"tie_word_embeddings\": ") + (tied ? "true" : "false")));
        }
    // A tied head kept in the file is read when equal to the embedding and dropped when written.
    Folder f({Kind::llama, true});
    std::vector<HfTensor> t = f.tensors;
    HfTensor head = f.tensor("model.embed_tokens.weight");
    head.name = "lm_head.weight";
    t.push_back(head);
    f.weights(t);
    convert_weights(f.path, f.file("m.h5"));
    convert_weights(f.file("m.h5"), f.file("back"));
    write_weights(f.file("plain.safetensors"), f.tensors);
    CHECK(get_file(f.file("back") + "/model.safetensors") == get_file(f.file("plain.safetensors")));
    t.back().values[5] += 1.0f;
    std::memcpy(t.back().bytes.data() + 5 * 4, &t.back().values[5], 4);
    f.weights(t);
    CHECK_THAT(refusal(f), Contains("'lm_head.weight'") &&
                               Contains("'model.embed_tokens.weight'") && Contains("element 5"));
}

TEST_CASE("hf llama: Qwen3ForCausalLM and Qwen3MoeForCausalLM go round byte for byte", "[hf]") {
    for (SafeDType dtype : {SafeDType::F32, SafeDType::BF16}) {
        INFO(safe_dtype_name(dtype));
        Folder q({Kind::qwen3}, dtype, 5);
        round_trip(q, dtype);
        CHECK_THAT(get_file(q.file("back") + "/config.json"),
                   Contains("\"Qwen3ForCausalLM\"") && Contains("\"head_dim\": 4") &&
                       Contains("\"use_sliding_window\": false") &&
                       Contains("\"layer_types\": [\n    \"full_attention\",\n    "
                                "\"full_attention\"\n  ]"));

        Folder m({Kind::moe}, dtype, 6);
        const LogicalState s = round_trip(m, dtype);
        // Expert e's tensors are rows [e·FE, (e+1)·FE) (down_proj: [e·C, (e+1)·C)) of the stacks.
        for (i64 e = 0; e < E; e++)
            for (const char* w : {"gate_proj", "up_proj", "down_proj"}) {
                const HfTensor& x = m.tensor("model.layers.1.mlp.experts." + std::to_string(e) +
                                             "." + w + ".weight");
                const float* stack =
                    param(s, std::string("model.layers.1.mlp.experts.") + w + ".weight");
                CHECK(std::memcmp(stack + e * FE * C, x.values.data(), FE * C * 4) == 0);
            }
        CHECK(std::memcmp(param(s, "model.layers.0.mlp.down_proj.weight"),
                          m.tensor("model.layers.0.mlp.down_proj.weight").values.data(),
                          C * F * 4) == 0);
        CHECK_THAT(get_file(m.file("back") + "/config.json"),
                   Contains("\"Qwen3MoeForCausalLM\"") && Contains("\"num_local_experts\": 4") &&
                       Contains("\"decoder_sparse_step\": 2") &&
                       Contains("\"moe_intermediate_size\": 6") &&
                       Contains("\"mlp_only_layers\": []") &&
                       Contains("\"router_aux_loss_coef\": 0.001"));
    }
    // transformers 4 wrote num_experts.
    Folder m({Kind::moe});
    m.config(
        with(without(config_keys(m.spec, "float32"), "num_local_experts"), "num_experts", "4"));
    CHECK(read_hf_config(m.cfg()).model == model_of(m.spec));
}

TEST_CASE("hf llama: RoPE's parameters in transformers 5's and 4's layouts, Llama 3.1's scaling",
          "[hf]") {
    Folder f({Kind::llama});
    const Keys base = config_keys(f.spec, "float32");
    ModelConfig want = model_of(f.spec);
    want.rope_theta = 500000;
    want.rope_factor = 8;
    want.rope_low_freq_factor = 1;
    want.rope_high_freq_factor = 4;
    want.rope_original_max_positions = 4;
    const std::string five =
        "{\"factor\": 8.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, "
        "\"original_max_position_embeddings\": 4, \"rope_theta\": 500000.0, "
        "\"rope_type\": \"llama3\"}";
    const std::string four =
        "{\"factor\": 8, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, "
        "\"original_max_position_embeddings\": 4, \"type\": \"llama3\"}";
    for (const Keys& k :
         {with(base, "rope_parameters", five),
          with(with(without(base, "rope_parameters"), "rope_scaling", four), "rope_theta",
               "500000"),
          with(with(base, "rope_parameters", "null"), "rope_scaling",
               "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1, "
               "\"high_freq_factor\": 4, \"original_max_position_embeddings\": 4, "
               "\"rope_theta\": 500000.0}")}) {
        f.config(k);
        CHECK(read_hf_config(f.cfg()).model == want);
    }
    CHECK_THAT(
        hf_config_text(want, SafeDType::F32),
        Contains("\"rope_parameters\": {\n    \"factor\": 8.0,\n    \"high_freq_factor\": 4.0,\n   "
                 " \"low_freq_factor\": 1.0,\n    \"original_max_position_embeddings\": 4,\n    "
                 "\"rope_theta\": 500000.0,\n    \"rope_type\": \"llama3\"\n  }"));
    // original_max_position_embeddings defaults to max_position_embeddings; rope_theta to 1e4.
    f.config(with(base, "rope_parameters",
                  "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                  "\"high_freq_factor\": 4.0}"));
    CHECK(read_hf_config(f.cfg()).model.rope_original_max_positions == P);
    CHECK(read_hf_config(f.cfg()).model.rope_theta == 10000);
    // Plain RoPE: no parameters at all, or transformers 4's top-level rope_theta.
    f.config(without(base, "rope_parameters"));
    CHECK(read_hf_config(f.cfg()).model == model_of(f.spec));
    f.config(with(without(base, "rope_parameters"), "rope_theta", "1000000.0"));
    CHECK(read_hf_config(f.cfg()).model.rope_theta == 1e6);
    CHECK_NOTHROW(convert_weights(f.path, f.file("ok.h5")));
}

TEST_CASE("hf llama: every malformed config.json is refused naming the file and the key", "[hf]") {
    Folder f({Kind::llama});
    Folder q({Kind::qwen3});
    Folder m({Kind::moe});
    struct Case {
        const Folder* f;
        Keys keys;
        std::vector<std::string> names;
    };
    const Keys lk = config_keys(f.spec, "float32"), qk = config_keys(q.spec, "float32"),
               mk = config_keys(m.spec, "float32");
    const std::vector<Case> cases = {
        {&f,
         with(lk, "rope_parameters", "{\"rope_type\": \"yarn\", \"factor\": 4.0}"),
         {"\"rope_parameters.rope_type\"", "\"yarn\"", "llama3"}},
        {&f,
         with(lk, "rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}"),
         {"\"rope_parameters\"", "\"rope_scaling\"", "keep one"}},
        {&f,
         with(without(lk, "rope_parameters"), "rope_scaling", "{\"type\": \"dynamic\"}"),
         {"\"rope_scaling.type\"", "\"dynamic\""}},
        {&f, with(lk, "rope_parameters", "[1]"), {"\"rope_parameters\"", "an array"}},
        {&f, with(lk, "rope_parameters", "{\"rope_type\": 3}"), {"\"rope_parameters.rope_type\""}},
        {&f,
         with(lk, "rope_parameters",
              "{\"rope_type\": \"llama3\", \"low_freq_factor\": 1.0, "
              "\"high_freq_factor\": 4.0}"),
         {"\"rope_parameters.factor\"", "model.rope_factor", "has no key"}},
        {&f,
         with(lk, "rope_parameters",
              "{\"rope_type\": \"llama3\", \"factor\": 0, "
              "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}"),
         {"\"rope_parameters.factor\"", "positive"}},
        {&f,
         with(lk, "rope_parameters",
              "{\"rope_type\": \"llama3\", \"factor\": 8, "
              "\"low_freq_factor\": 4.0, \"high_freq_factor\": 1.0}"),
         {"model.rope_high_freq_factor", "high_freq_factor is model.rope_high_freq_factor"}},
        {&f,
         with(lk, "rope_parameters", "{\"rope_theta\": \"1e4\"}"),
         {"\"rope_parameters.rope_theta\"", "finite number"}},
        {&f, with(lk, "partial_rotary_factor", "0.5"), {"\"partial_rotary_factor\"", "1.0"}},
        {&f, with(lk, "head_dim", "3"), {"model.head_dim", "head_dim is model.head_dim", "odd"}},
        {&f,
         with(lk, "num_key_value_heads", "3"),
         {"model.kv_heads", "num_key_value_heads is model.kv_heads"}},
        {&f, with(lk, "num_key_value_heads", "2.0"), {"\"num_key_value_heads\"", "or null"}},
        {&f, with(lk, "hidden_act", "\"gelu\""), {"\"hidden_act\"", "\"silu\""}},
        {&f, with(lk, "attention_bias", "true"), {"\"attention_bias\"", "no biases"}},
        {&f, with(lk, "mlp_bias", "true"), {"\"mlp_bias\""}},
        {&f, with(lk, "rms_norm_eps", "\"1e-6\""), {"\"rms_norm_eps\"", "model.norm_eps"}},
        {&f, with(lk, "rms_norm_eps", "null"), {"\"rms_norm_eps\"", "model.norm_eps"}},
        {&f, with(lk, "tie_word_embeddings", "1"), {"\"tie_word_embeddings\"", "true or false"}},
        {&f, without(lk, "hidden_size"), {"\"hidden_size\"", "model.hidden", "has no key"}},
        {&f, with(lk, "model_type", "\"qwen3\""), {"\"model_type\"", "LlamaForCausalLM"}},
        {&q, without(qk, "head_dim"), {"\"head_dim\"", "Qwen3ForCausalLM"}},
        {&q, with(qk, "use_sliding_window", "true"), {"\"use_sliding_window\""}},
        {&q,
         with(qk, "layer_types", "[\"full_attention\", \"sliding_attention\"]"),
         {"\"layer_types\""}},
        {&q, with(qk, "layer_types", "[\"full_attention\"]"), {"\"layer_types\""}},
        {&m, with(mk, "mlp_only_layers", "[0]"), {"\"mlp_only_layers\"", "decoder_sparse_step"}},
        {&m,
         with(mk, "num_experts", "4"),
         {"\"num_local_experts\"", "\"num_experts\"", "keep one"}},
        {&m, with(mk, "num_experts_per_tok", "5"), {"model.moe_top_k"}},
        {&m, with(mk, "decoder_sparse_step", "3"), {"model.moe_every"}},
        {&m, with(mk, "norm_topk_prob", "\"yes\""), {"\"norm_topk_prob\""}},
    };
    for (const Case& c : cases) {
        c.f->config(c.keys);
        const std::string msg = refusal(*c.f);
        INFO(json_text(c.keys));
        CHECK_THAT(msg, Contains(c.f->cfg()));
        for (const std::string& n : c.names) CHECK_THAT(msg, Contains(n));
        CHECK(error_of<DataError>([&] { init_from(c.f->path, model_of(c.f->spec)); }) == msg);
    }
    // What transformers may leave out is read as its defaults.
    f.config(
        without(without(without(without(lk, "num_key_value_heads"), "head_dim"), "rms_norm_eps"),
                "tie_word_embeddings"));
    ModelConfig lean = model_of(f.spec);
    lean.kv_heads = NH;
    CHECK(read_hf_config(f.cfg()).model == lean);
    f.config(with(with(lk, "num_key_value_heads", "null"), "head_dim", "null"));
    CHECK(read_hf_config(f.cfg()).model == lean);
    m.config(without(without(without(mk, "decoder_sparse_step"), "norm_topk_prob"),
                     "router_aux_loss_coef"));
    ModelConfig moe = model_of(m.spec);
    moe.moe_every = 1;
    moe.moe_norm_topk = false;
    CHECK(read_hf_config(m.cfg()).model == moe);
}

TEST_CASE("hf llama: tensors that do not fit config.json are refused naming the file and tensor",
          "[hf]") {
    Folder q({Kind::qwen3});
    auto refused = [](const Folder& f, const std::vector<HfTensor>& t) {
        f.weights(t);
        return refusal(f);
    };
    std::vector<HfTensor> t = q.tensors;
    std::erase_if(
        t, [](const HfTensor& x) { return x.name == "model.layers.1.self_attn.q_norm.weight"; });
    CHECK_THAT(refused(q, t), Contains(q.st()) &&
                                  Contains("'model.layers.1.self_attn.q_norm.weight'") &&
                                  Contains("has no tensor") && Contains("num_key_value_heads = 2"));
    t = q.tensors;
    for (HfTensor& x : t)
        if (x.name == "model.layers.0.self_attn.k_proj.weight") {  // 4 KV heads, not 2
            x.shape = {2 * KV * 4, C};
            x.bytes.resize(size_t(2 * KV * 4 * C * 4));
        }
    CHECK_THAT(refused(q, t), Contains("'model.layers.0.self_attn.k_proj.weight'") &&
                                  Contains("[16, 8]") && Contains("[8, 8]") &&
                                  Contains("config.json"));
    // Qwen3's norms in a Llama folder: not Llama's tensors.
    Folder f({Kind::llama});
    t = f.tensors;
    t.push_back(q.tensor("model.layers.0.self_attn.q_norm.weight"));
    CHECK_THAT(refused(f, t), Contains("'model.layers.0.self_attn.q_norm.weight'") &&
                                  Contains("not a tensor of LlamaForCausalLM"));
    // An untied head missing; a tied config with an untied file's head.
    t = f.tensors;
    std::erase_if(t, [](const HfTensor& x) { return x.name == "lm_head.weight"; });
    CHECK_THAT(refused(f, t), Contains("'lm_head.weight'") && Contains("has no tensor"));
    f.weights(f.tensors);
    f.config(with(config_keys(f.spec, "float32"), "tie_word_embeddings", "true"));
    CHECK_THAT(refusal(f), Contains("'lm_head.weight'") && Contains("differs from"));

    Folder m({Kind::moe});
    t = m.tensors;
    std::erase_if(t, [](const HfTensor& x) {
        return x.name == "model.layers.1.mlp.experts.3.up_proj.weight";
    });
    CHECK_THAT(refused(m, t), Contains("'model.layers.1.mlp.experts.3.up_proj.weight'") &&
                                  Contains("has no tensor"));
    t = m.tensors;
    HfTensor extra = m.tensor("model.layers.1.mlp.experts.3.up_proj.weight");
    extra.name = "model.layers.1.mlp.experts.4.up_proj.weight";
    t.push_back(extra);
    CHECK_THAT(refused(m, t), Contains("'model.layers.1.mlp.experts.4.up_proj.weight'") &&
                                  Contains("not a tensor of Qwen3MoeForCausalLM"));
    // A dense MLP on the MoE layer, as decoder_sparse_step 1 would have none.
    m.weights(m.tensors);
    m.config(with(config_keys(m.spec, "float32"), "decoder_sparse_step", "1"));
    CHECK_THAT(refusal(m), Contains("model.layers.0.mlp") && Contains("num_local_experts = 4"));
    // Many layers claimed: the first missing tensor is named, no table of 10^8 layers built.
    q.weights(q.tensors);
    q.config(with(without(config_keys(q.spec, "float32"), "layer_types"), "num_hidden_layers",
                  "100000000"));
    CHECK_THAT(refusal(q), Contains("'model.layers.2.") && Contains("has no tensor"));
}

TEST_CASE("hf llama: model.init_from names each key that differs, with both values", "[hf]") {
    Folder q({Kind::qwen3}, SafeDType::BF16, 9);
    const ModelConfig mc = model_of(q.spec);
    const LogicalState a = init_from(q.path, mc);
    CHECK(std::memcmp(param(a, "model.layers.1.self_attn.k_norm.weight"),
                      q.tensor("model.layers.1.self_attn.k_norm.weight").values.data(),
                      4 * 4) == 0);
    // Fewer positions, another aux loss coefficient: the same weights.
    ModelConfig shorter = mc;
    shorter.seq_len = 4;
    CHECK(init_from(q.path, shorter).params == a.params);

    ModelConfig other = mc;
    other.kv_heads = 1;
    other.head_dim = 2;
    other.norm_eps = 1e-5;
    other.rope_theta = 500000;
    other.qk_norm = false;
    const std::string msg = error_of<ConfigError>([&] { init_from(q.path, other); });
    CHECK_THAT(msg,
               Contains("model.init_from = " + q.path) && Contains(q.cfg()) &&
                   Contains("model.kv_heads = 1 in this config but num_key_value_heads = 2") &&
                   Contains("model.head_dim = 2 in this config but head_dim = 4") &&
                   Contains("model.norm_eps = 1e-05 in this config but rms_norm_eps = 1e-06") &&
                   Contains("model.rope_theta = 500000.0 in this config but "
                            "rope_parameters.rope_theta = 10000.0") &&
                   Contains("model.qk_norm = false") && Contains("Qwen3ForCausalLM"));
    ModelConfig gpt2;
    CHECK_THAT(error_of<ConfigError>([&] { init_from(q.path, gpt2); }),
               Contains("model.arch = \"gpt2\"") && Contains("\"llama\""));
    ModelConfig scaled = mc;
    scaled.rope_factor = 8;
    CHECK_THAT(error_of<ConfigError>([&] { init_from(q.path, scaled); }),
               Contains("model.rope_factor = 8.0 in this config but rope_parameters.factor = 0.0"));
    ModelConfig tied = mc;
    tied.tie_embeddings = true;
    CHECK_THAT(
        error_of<ConfigError>([&] { init_from(q.path, tied); }),
        Contains("model.tie_embeddings = true in this config but tie_word_embeddings = false"));

    // A Llama folder: kv_heads and head_dim 0 in the job mean the folder's values.
    Folder f({Kind::llama}, SafeDType::F32, 2);
    ModelConfig zero = model_of(f.spec);
    zero.head_dim = 0;
    CHECK(init_from(f.path, zero).params == init_from(f.path, model_of(f.spec)).params);
    ModelConfig moe = model_of(f.spec);
    moe.moe_experts = 2;
    CHECK_THAT(
        error_of<ConfigError>([&] { init_from(f.path, moe); }),
        Contains("model.moe_experts = 2 in this config but LlamaForCausalLM has dense MLPs only"));

    Folder m({Kind::moe}, SafeDType::F32, 4);
    ModelConfig job = model_of(m.spec);
    job.moe_aux_loss = 0;  // a training choice
    job.moe_capacity_factor = 1.25;
    CHECK_NOTHROW(init_from(m.path, job));
    job.moe_top_k = 1;
    job.moe_every = 1;
    job.moe_shared_experts = 1;
    CHECK_THAT(error_of<ConfigError>([&] { init_from(m.path, job); }),
               Contains("model.moe_top_k = 1 in this config but num_experts_per_tok = 2") &&
                   Contains("model.moe_every = 1 in this config but decoder_sparse_step = 2") &&
                   Contains("model.moe_shared_experts = 1"));
}

TEST_CASE("hf llama: the writer picks the class from the model and refuses what none is", "[hf]") {
    ModelConfig mc = model_of({Kind::llama});
    CHECK(std::string(hf_architecture_for(mc).name) == "LlamaForCausalLM");
    mc.kv_heads = 0;  // written as the value it means
    CHECK_THAT(hf_config_text(mc, SafeDType::F32), Contains("\"num_key_value_heads\": 4"));
    mc.qk_norm = true;
    CHECK(std::string(hf_architecture_for(mc).name) == "Qwen3ForCausalLM");
    mc.moe_experts = 4;
    CHECK(std::string(hf_architecture_for(mc).name) == "Qwen3MoeForCausalLM");
    mc.moe_ffn = 0;
    CHECK_THAT(hf_config_text(mc, SafeDType::F32), Contains("\"moe_intermediate_size\": 12"));
    mc.moe_shared_experts = 1;
    CHECK_THAT(error_of<Error>([&] { hf_architecture_for(mc); }),
               Contains("model.moe_shared_experts = 1"));
    mc.moe_shared_experts = 0;
    mc.qk_norm = false;
    CHECK_THAT(error_of<Error>([&] { hf_config_text(mc, SafeDType::F32); }),
               Contains("model.qk_norm = false") && Contains("model.moe_experts = 4") &&
                   Contains("Qwen3MoeForCausalLM"));

    // llm.c's format holds GPT-2 only.
    Folder f({Kind::llama});
    CHECK_THAT(error_of<DataError>([&] { convert_weights(f.path, f.file("m.bin")); }),
               Contains(f.file("m.bin")) && Contains("llama") && Contains("GPT-2 only"));
    CHECK_FALSE(fs::exists(f.file("m.bin")));
    convert_weights(f.path, f.file("m.h5"));
    CHECK_THAT(error_of<DataError>([&] { convert_weights(f.file("m.h5"), f.file("m.bin")); }),
               Contains("GPT-2 only"));
    // Shards of a llama model, read back.
    LogicalState s = init_from(f.path, model_of(f.spec));
    const auto lookup = [&](const std::string& name) {
        return s.params.data() + s.table.entries[size_t(s.table.find(name))].offset;
    };
    const std::vector<std::string> files =
        write_hf_folder(f.file("shards"), model_of(f.spec), lookup, SafeDType::F32, 512);
    CHECK(files.size() > 3);
    CHECK(init_from(f.file("shards"), model_of(f.spec)).params == s.params);
}
