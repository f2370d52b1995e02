// The Hugging Face classes Parallax reads and writes (core/io/hf_checkpoint.h): each one's name
// table, config.json keys, fixed keys and further written keys, as data.
//
// Index
//   kGpt2*                      GPT2LMHeadModel
//   kLlamaNames                 the name table of LlamaForCausalLM, Qwen3ForCausalLM and
//                               Qwen3MoeForCausalLM: Hugging Face's names are Parallax's
//   kLlama*, kQwen3*, kQwen3Moe*   their keys
//   kHfArchitectures            the list; hf_architectures, find_hf_architecture,
//                               hf_architecture_for
#include "core/base/error.h"
#include "core/io/hf_checkpoint.h"
#include "kernels/ops.h"  // kLayerNormEps

#include <cstring>

namespace px {

namespace {

// ---- GPT2LMHeadModel ----

// transformers' GPT2LMHeadModel state dict. Its four matrices per block are Conv1D modules, which
// keep their weight as (in, out): the transpose of Parallax's (out, in).
constexpr HfNameRow kGpt2Names[] = {
    {"transformer.wte.weight", "wte"},
    {"transformer.wpe.weight", "wpe"},
    {"transformer.h.{i}.ln_1.weight", "h.{i}.ln_1.weight"},
    {"transformer.h.{i}.ln_1.bias", "h.{i}.ln_1.bias"},
    {"transformer.h.{i}.attn.c_attn.weight", "h.{i}.attn.c_attn.weight", HfTransform::transpose},
    {"transformer.h.{i}.attn.c_attn.bias", "h.{i}.attn.c_attn.bias"},
    {"transformer.h.{i}.attn.c_proj.weight", "h.{i}.attn.c_proj.weight", HfTransform::transpose},
    {"transformer.h.{i}.attn.c_proj.bias", "h.{i}.attn.c_proj.bias"},
    {"transformer.h.{i}.ln_2.weight", "h.{i}.ln_2.weight"},
    {"transformer.h.{i}.ln_2.bias", "h.{i}.ln_2.bias"},
    {"transformer.h.{i}.mlp.c_fc.weight", "h.{i}.mlp.c_fc.weight", HfTransform::transpose},
    {"transformer.h.{i}.mlp.c_fc.bias", "h.{i}.mlp.c_fc.bias"},
    {"transformer.h.{i}.mlp.c_proj.weight", "h.{i}.mlp.c_proj.weight", HfTransform::transpose},
    {"transformer.h.{i}.mlp.c_proj.bias", "h.{i}.mlp.c_proj.bias"},
    {"transformer.ln_f.weight", "ln_f.weight"},
    {"transformer.ln_f.bias", "ln_f.bias"},
    // The head is the embedding (tie_word_embeddings): save_pretrained drops it, older files
    // and other writers keep a copy.
    {"lm_head.weight", "wte", HfTransform::none, HfStore::folder, HfRole::tied},
    // The causal mask and its fill value were saved as buffers by transformers before 4.x made
    // them non-persistent; Parallax's attention computes the mask.
    {"transformer.h.{i}.attn.bias", "", HfTransform::none, HfStore::folder, HfRole::buffer},
    {"transformer.h.{i}.attn.masked_bias", "", HfTransform::none, HfStore::folder, HfRole::buffer},
};

constexpr HfKey kGpt2Keys[] = {
    {"vocab_size", &ModelConfig::vocab, "model.vocab"},
    {"n_positions", &ModelConfig::seq_len, "model.seq_len"},
    {"n_embd", &ModelConfig::hidden, "model.hidden"},
    {"n_layer", &ModelConfig::layers, "model.layers"},
    {"n_head", &ModelConfig::heads, "model.heads"},
    {"n_inner", &ModelConfig::ffn, "model.ffn", HfAbsent::null_same,
     [](const ModelConfig& m) { return 4.0 * double(m.hidden); }},
};

static_assert(float(1e-5) == ops::kLayerNormEps,
              "GPT-2's layer_norm_epsilon is the kernels' epsilon");
// clang-format off
constexpr HfFixedKey kGpt2Fixed[] = {
    {"activation_function", {HfValue::string, "gelu_new"}, true,
     "Parallax's GELU is the tanh approximation, gelu_new"},
    {"layer_norm_epsilon", {HfValue::number, "", false, 1e-5}, true,
     "its LayerNorm's epsilon is 1e-5"},
    {"tie_word_embeddings", {HfValue::boolean, "", true}, true,
     "its LM head is the token embedding wte: one matrix"},
    {"scale_attn_weights", {HfValue::boolean, "", true}, true,
     "attention scores are scaled by 1/sqrt(head size)"},
    {"scale_attn_by_inverse_layer_idx", {HfValue::boolean, "", false}, true,
     "attention scores are not scaled by the layer's index"},
    {"add_cross_attention", {HfValue::boolean, "", false}, true,
     "its blocks have no cross-attention"},
};
// clang-format on

// GPT2Config's defaults of the keys Parallax does not use (dropout: Parallax trains without it).
constexpr const char* kGpt2Written =
    R"({"attn_pdrop": 0.1, "embd_pdrop": 0.1, "resid_pdrop": 0.1, "initializer_range": 0.02,
        "reorder_and_upcast_attn": false, "summary_activation": null,
        "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
        "summary_type": "cls_index", "summary_use_proj": true, "use_cache": true})";

// ---- LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM ----

// Parallax's llama names are transformers' state dict (core/base/arena.h), in its per-layer
// order; RoPE turns pairs (j, j + HS/2) as transformers' rotate_half does, so q_proj and k_proj
// are stored as they are, unpermuted. Which rows a model has is its parameter list's business
// (core/io/hf_checkpoint.h): q_norm and k_norm with qk_norm (Qwen3), the dense MLP on dense
// layers, the router and experts on MoE layers, lm_head.weight when untied.
constexpr HfNameRow kLlamaNames[] = {
    {"model.embed_tokens.weight", "model.embed_tokens.weight"},
    {"model.layers.{i}.input_layernorm.weight", "model.layers.{i}.input_layernorm.weight"},
    {"model.layers.{i}.self_attn.q_proj.weight", "model.layers.{i}.self_attn.q_proj.weight"},
    {"model.layers.{i}.self_attn.k_proj.weight", "model.layers.{i}.self_attn.k_proj.weight"},
    {"model.layers.{i}.self_attn.v_proj.weight", "model.layers.{i}.self_attn.v_proj.weight"},
    {"model.layers.{i}.self_attn.q_norm.weight", "model.layers.{i}.self_attn.q_norm.weight"},
    {"model.layers.{i}.self_attn.k_norm.weight", "model.layers.{i}.self_attn.k_norm.weight"},
    {"model.layers.{i}.self_attn.o_proj.weight", "model.layers.{i}.self_attn.o_proj.weight"},
    {"model.layers.{i}.post_attention_layernorm.weight",
     "model.layers.{i}.post_attention_layernorm.weight"},
    {"model.layers.{i}.mlp.gate_proj.weight", "model.layers.{i}.mlp.gate_proj.weight"},
    {"model.layers.{i}.mlp.up_proj.weight", "model.layers.{i}.mlp.up_proj.weight"},
    {"model.layers.{i}.mlp.down_proj.weight", "model.layers.{i}.mlp.down_proj.weight"},
    {"model.layers.{i}.mlp.gate.weight", "model.layers.{i}.mlp.gate.weight"},
    {"model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
     "model.layers.{i}.mlp.experts.gate_proj.weight", HfTransform::stack},
    {"model.layers.{i}.mlp.experts.{e}.up_proj.weight",
     "model.layers.{i}.mlp.experts.up_proj.weight", HfTransform::stack},
    {"model.layers.{i}.mlp.experts.{e}.down_proj.weight",
     "model.layers.{i}.mlp.experts.down_proj.weight", HfTransform::stack},
    {"model.norm.weight", "model.norm.weight"},
    {"lm_head.weight", "lm_head.weight"},
    // tie_word_embeddings: transformers 5's save_pretrained drops the head, others keep a copy.
    {"lm_head.weight", "model.embed_tokens.weight", HfTransform::none, HfStore::folder,
     HfRole::tied},
};

double heads(const ModelConfig& m) {
    return double(m.heads);
}
double head_size(const ModelConfig& m) {
    return double(m.hidden / m.heads);
}
double eps_1e6(const ModelConfig&) {
    return 1e-6;
}
double no(const ModelConfig&) {
    return 0;
}
double one(const ModelConfig&) {
    return 1;
}
double aux_1e3(const ModelConfig&) {
    return 1e-3;
}

// In the order read: the fallbacks of num_key_value_heads and head_dim need the sizes first.
// LlamaConfig: num_key_value_heads and head_dim may be null (heads, hidden / heads).
constexpr HfKey kLlamaKeys[] = {
    {"vocab_size", &ModelConfig::vocab, "model.vocab"},
    {"max_position_embeddings", &ModelConfig::seq_len, "model.seq_len"},
    {"hidden_size", &ModelConfig::hidden, "model.hidden"},
    {"num_hidden_layers", &ModelConfig::layers, "model.layers"},
    {"num_attention_heads", &ModelConfig::heads, "model.heads"},
    {"intermediate_size", &ModelConfig::ffn, "model.ffn"},
    {"num_key_value_heads", &ModelConfig::kv_heads, "model.kv_heads", HfAbsent::nullable, heads},
    {"head_dim", &ModelConfig::head_dim, "model.head_dim", HfAbsent::nullable, head_size},
    {"rms_norm_eps", &ModelConfig::norm_eps, "model.norm_eps", HfAbsent::optional, eps_1e6},
    {"tie_word_embeddings", &ModelConfig::tie_embeddings, "model.tie_embeddings",
     HfAbsent::optional, no},
};
// Qwen3Config: both head counts given (its defaults, 32 and 128, belong to no small model).
constexpr HfKey kQwen3Keys[] = {
    {"vocab_size", &ModelConfig::vocab, "model.vocab"},
    {"max_position_embeddings", &ModelConfig::seq_len, "model.seq_len"},
    {"hidden_size", &ModelConfig::hidden, "model.hidden"},
    {"num_hidden_layers", &ModelConfig::layers, "model.layers"},
    {"num_attention_heads", &ModelConfig::heads, "model.heads"},
    {"intermediate_size", &ModelConfig::ffn, "model.ffn"},
    {"num_key_value_heads", &ModelConfig::kv_heads, "model.kv_heads"},
    {"head_dim", &ModelConfig::head_dim, "model.head_dim"},
    {"rms_norm_eps", &ModelConfig::norm_eps, "model.norm_eps", HfAbsent::optional, eps_1e6},
    {"tie_word_embeddings", &ModelConfig::tie_embeddings, "model.tie_embeddings",
     HfAbsent::optional, no},
};
// Qwen3MoeConfig: head_dim read as getattr(config, "head_dim", hidden / heads); layer l is MoE
// when (l + 1) % decoder_sparse_step == 0, Parallax's moe_every rule; intermediate_size is the
// dense layers' MLP.
constexpr HfKey kQwen3MoeKeys[] = {
    {"vocab_size", &ModelConfig::vocab, "model.vocab"},
    {"max_position_embeddings", &ModelConfig::seq_len, "model.seq_len"},
    {"hidden_size", &ModelConfig::hidden, "model.hidden"},
    {"num_hidden_layers", &ModelConfig::layers, "model.layers"},
    {"num_attention_heads", &ModelConfig::heads, "model.heads"},
    {"intermediate_size", &ModelConfig::ffn, "model.ffn"},
    {"num_key_value_heads", &ModelConfig::kv_heads, "model.kv_heads"},
    {"head_dim", &ModelConfig::head_dim, "model.head_dim", HfAbsent::optional, head_size},
    {"rms_norm_eps", &ModelConfig::norm_eps, "model.norm_eps", HfAbsent::optional, eps_1e6},
    {"tie_word_embeddings", &ModelConfig::tie_embeddings, "model.tie_embeddings",
     HfAbsent::optional, no},
    {"num_local_experts", &ModelConfig::moe_experts, "model.moe_experts", HfAbsent::required,
     nullptr, "num_experts"},
    {"num_experts_per_tok", &ModelConfig::moe_top_k, "model.moe_top_k"},
    {"moe_intermediate_size", &ModelConfig::moe_ffn, "model.moe_ffn"},
    {"norm_topk_prob", &ModelConfig::moe_norm_topk, "model.moe_norm_topk", HfAbsent::optional, no},
    {"decoder_sparse_step", &ModelConfig::moe_every, "model.moe_every", HfAbsent::optional, one},
    {"router_aux_loss_coef", &ModelConfig::moe_aux_loss, "model.moe_aux_loss", HfAbsent::optional,
     aux_1e3, nullptr, false},
};

// A key that may be absent has the value it then takes, and a required one none.
constexpr bool fallbacks_given(std::span<const HfKey> keys) {
    for (const HfKey& k : keys)
        if ((k.absent != HfAbsent::required) != (k.fallback != nullptr)) return false;
    return true;
}
static_assert(fallbacks_given(kGpt2Keys) && fallbacks_given(kLlamaKeys) &&
                  fallbacks_given(kQwen3Keys) && fallbacks_given(kQwen3MoeKeys),
              "every key that may be absent names its fallback, and only those");

// clang-format off
constexpr HfFixedKey kLlamaFixed[] = {
    {"hidden_act", {HfValue::string, "silu"}, true, "its MLP is SwiGLU: silu(gate) * up"},
    {"attention_bias", {HfValue::boolean, "", false}, true,
     "its q, k, v and o projections have no biases"},
    {"mlp_bias", {HfValue::boolean, "", false}, true, "its MLP projections have no biases"},
};
constexpr HfFixedKey kQwen3Fixed[] = {
    {"hidden_act", {HfValue::string, "silu"}, true, "its MLP is SwiGLU: silu(gate) * up"},
    {"attention_bias", {HfValue::boolean, "", false}, true,
     "its q, k, v and o projections have no biases"},
    {"use_sliding_window", {HfValue::boolean, "", false}, true,
     "every layer attends to every earlier position"},
    {"layer_types", {HfValue::per_layer, "full_attention"}, true,
     "every layer attends to every earlier position"},
};
constexpr HfFixedKey kQwen3MoeFixed[] = {
    {"hidden_act", {HfValue::string, "silu"}, true, "its experts are SwiGLU: silu(gate) * up"},
    {"attention_bias", {HfValue::boolean, "", false}, true,
     "its q, k, v and o projections have no biases"},
    {"use_sliding_window", {HfValue::boolean, "", false}, true,
     "every layer attends to every earlier position"},
    {"mlp_only_layers", {HfValue::empty}, true,
     "layer l is MoE exactly when (l + 1) % decoder_sparse_step == 0 (model.moe_every)"},
};
// clang-format on

// The configs' defaults of the keys Parallax does not use, as transformers 5 writes them.
constexpr const char* kLlamaWritten =
    R"({"attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2, "initializer_range": 0.02,
        "pad_token_id": null, "pretraining_tp": 1, "use_cache": true})";
constexpr const char* kQwen3Written =
    R"({"attention_dropout": 0.0, "bos_token_id": null, "eos_token_id": null,
        "initializer_range": 0.02, "max_window_layers": 28, "pad_token_id": null,
        "sliding_window": null, "use_cache": true})";
constexpr const char* kQwen3MoeWritten =
    R"({"attention_dropout": 0.0, "bos_token_id": null, "eos_token_id": null,
        "initializer_range": 0.02, "output_router_logits": false, "pad_token_id": null,
        "sliding_window": null, "use_cache": true})";

// A model is written as the first class it is.
constexpr HfArchitecture kHfArchitectures[] = {
    {"GPT2LMHeadModel", "gpt2", "gpt2", false, false, false, kGpt2Keys, kGpt2Fixed, kGpt2Names,
     kGpt2Written},
    {"LlamaForCausalLM", "llama", "llama", false, false, true, kLlamaKeys, kLlamaFixed, kLlamaNames,
     kLlamaWritten},
    {"Qwen3ForCausalLM", "qwen3", "llama", true, false, true, kQwen3Keys, kQwen3Fixed, kLlamaNames,
     kQwen3Written},
    {"Qwen3MoeForCausalLM", "qwen3_moe", "llama", true, true, true, kQwen3MoeKeys, kQwen3MoeFixed,
     kLlamaNames, kQwen3MoeWritten},
};

}  // namespace

std::span<const HfArchitecture> hf_architectures() {
    return kHfArchitectures;
}

const HfArchitecture* find_hf_architecture(std::string_view name) {
    for (const HfArchitecture& a : kHfArchitectures)
        if (name == a.name) return &a;
    return nullptr;
}

const HfArchitecture& hf_architecture_for(const ModelConfig& mc) {
    if (mc.moe_shared_experts > 0)
        throw Error("model.moe_shared_experts = " + std::to_string(mc.moe_shared_experts) +
                    ": no Hugging Face class Parallax writes has shared experts "
                    "(Qwen3MoeForCausalLM routes every expert)");
    for (const HfArchitecture& a : kHfArchitectures)
        if (mc.arch == a.arch && (!mc.llama() || mc.qk_norm == a.qk_norm) && mc.is_moe() == a.moe)
            return a;
    std::string classes;
    for (const HfArchitecture& a : kHfArchitectures)
        classes.append(classes.empty() ? "" : ", ")
            .append(a.name)
            .append(" (model.arch = \"")
            .append(a.arch)
            .append("\"")
            .append(a.qk_norm ? ", qk_norm" : "")
            .append(a.moe ? ", moe_experts > 0)" : ", moe_experts = 0)");
    throw Error("model.arch = \"" + mc.arch +
                "\", model.qk_norm = " + (mc.qk_norm ? "true" : "false") +
                ", model.moe_experts = " + std::to_string(mc.moe_experts) +
                ": this model is no Hugging Face class Parallax writes: " + classes);
}

std::string hf_name(const char* pattern, i64 layer, i64 expert) {
    std::string s = pattern;
    const size_t at = s.find("{i}");
    if (at != std::string::npos) s.replace(at, 3, std::to_string(layer));
    const size_t e = s.find("{e}");
    if (e != std::string::npos) s.replace(e, 3, std::to_string(expert));
    return s;
}

}  // namespace px
