// Hugging Face model folders (config.json beside model.safetensors, or beside a sharded set
// model.safetensors.index.json + its shards), read into and written from Parallax's logical fp32
// tensors: the third weights format of `parallax convert` and model.init_from (docs/files.md).
//
// Index
//   HfTransform, HfStore, HfRole, HfNameRow    one row of an architecture's name table
//   HfField, HfAbsent, HfKey                   a config.json key that sets a ModelConfig field
//   HfValue, HfFixedKey                        a key whose value Parallax's model has built in
//   HfArchitecture, hf_architectures, find_hf_architecture, hf_architecture_for
//                                               the classes read and written (GPT2LMHeadModel,
//                                               LlamaForCausalLM, Qwen3ForCausalLM,
//                                               Qwen3MoeForCausalLM: core/io/hf_architectures.cpp)
//   hf_name                                     a pattern with {i} (and {e}) filled in
//   HfConfig, read_hf_config                    config.json read and checked
//   hf_config_text                              config.json's text for a ModelConfig
//   hf_sizes_text, hf_config_differences        config.json's sizes, and what a job differs in
//   HfInput, hf_input, read_hf_config(HfInput)  whether a path is a Hugging Face folder (or a file
//                                               in one), where its config and weights are
//   HfReadReport, read_hf_weights               the weights checked, then read into the parameters
//   read_hf_init_weights                        model.init_from's case: config.json against the job
//   hf_write_dtype, kHfShardBytes, write_hf_folder   the weights and config.json written
//
// The name table. Each architecture lists its tensors as rows {HF name, Parallax name, transform,
// stored dtype, role}, "{i}" standing for a layer (0 .. n_layer - 1) and "{e}" for an expert. The
// Parallax names are those of ParamTable::build(mc) (core/base/arena.h); GPT-2's HF names are
// GPT2LMHeadModel's state dict, whose four matrices per block are Conv1D modules that store their
// weight as (in, out), the transpose of Parallax's (out, in), hence `transpose`. Llama's Parallax
// names are Hugging Face's, so its rows are the identity, except the experts of a MoE layer, which
// transformers saves one by one and Parallax stacks (`stack`). One table serves every config of
// a class: a row is in a model's table when its Parallax parameter is in the model's ParamTable
// (Qwen3's q_norm with model.qk_norm, the router and experts on the MoE layers only, lm_head.weight
// when the head is untied), and a `tied` row when the model's head is tied (model.tied_head()).
// So which rows apply is said once, by the parameter list; every parameter must be some row's
// (asserted). Reading and writing are driven by the tables alone; adding a class is data in
// core/io/hf_architectures.cpp: its name rows, its keys (hidden_size -> model.hidden, ...), its
// fixed keys (hidden_act "silu", ...), the JSON of its other keys, and one line of the list.
//
// config.json. Each key sets a ModelConfig field of one of three kinds (HfField): an integer (a
// size), a number (an epsilon, a coefficient; fp64, as Python's float) or a boolean; a key may be
// absent (or null) where transformers then takes a default (HfAbsent). RoPE's parameters (Llama,
// Qwen3) are read from "rope_parameters" (transformers 5) or "rope_scaling" (4.x, rope_theta then
// beside it), rope_type "default" or "llama3" (Llama 3.1's scaling); they are written as
// transformers 5 writes them. Keys a job may choose freely (the aux loss coefficient) are not
// compared by model.init_from.
//
// Dtypes. Tensors are read from F32, BF16 or F16 and widened exactly to fp32 (SafetensorsFile);
// every other dtype is refused by name. They are written in one dtype the caller picks (F32, BF16
// or F16, rounding to nearest even; a value that overflows it is refused by name), except rows
// stored as HfStore::f32. config.json's "dtype" says that dtype, as transformers writes it.
//
// Errors. A folder whose config.json is missing, not JSON, of an unknown architecture, missing a
// key or holding one of the wrong type, or asking for a model Parallax does not compute (another
// activation, rope_type or norm epsilon, untied GPT-2 embeddings, sliding windows) is refused with
// a DataError naming config.json and the key; weights with a missing, unknown or misshapen
// tensor, a dtype not read, a non-finite value, or a tied lm_head.weight that differs from the
// embedding are refused naming the file and the tensor. The safetensors layer refuses damaged
// files (core/io/safetensors.h). Everything is checked before any parameter is written.
#pragma once
#include "core/base/config.h"
#include "core/io/checkpoint_llmc.h"  // ParamLookup
#include "core/io/safetensors.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace px {

// ---- the name table ----

enum class HfTransform : std::uint8_t {
    none,       // the same shape and element order
    transpose,  // a matrix stored (cols, rows): HF's Conv1D keeps (in, out), Parallax (out, in)
    stack,      // expert {e}'s block of a Parallax tensor of model.moe_experts blocks of rows:
                // transformers saves experts.{e}.gate_proj.weight (FE, C) one by one, Parallax
                // holds experts.gate_proj.weight (E·FE, C), expert e's rows [e·FE, (e+1)·FE)
};
enum class HfStore : std::uint8_t {
    folder,  // in the dtype the folder is written in (fp32, bf16 or fp16)
    f32,     // always F32: a tensor the model keeps in fp32 (transformers' _keep_in_fp32_modules)
};
enum class HfRole : std::uint8_t {
    param,   // one Parallax parameter (or one expert's block of it): required when read, written
    tied,    // a copy of a parameter (a tied lm_head.weight): in the table when the model ties its
             // head; optional when read, where it must equal the parameter bit for bit; not
             // written (save_pretrained drops it)
    buffer,  // a non-persistent buffer some older files hold (GPT-2's attn.bias, a causal mask):
             // skipped when read, never written; Parallax computes it
};

struct HfNameRow {
    const char* hf;  // "transformer.h.{i}.attn.c_attn.weight"
    const char* px;  // "h.{i}.attn.c_attn.weight"; "" for a buffer
    HfTransform transform = HfTransform::none;
    HfStore store = HfStore::folder;
    HfRole role = HfRole::param;
};

// ---- config.json ----

// The ModelConfig field a key sets: an integer (a size: a positive JSON integer of at most 2^40),
// a number (fp64: any finite JSON number) or a boolean.
using HfField = std::variant<i64 ModelConfig::*, double ModelConfig::*, bool ModelConfig::*>;

// What an absent or null key means.
enum class HfAbsent : std::uint8_t {
    required,   // absent or null: refused
    optional,   // absent: the fallback (transformers' default); null refused
    nullable,   // absent or null: the fallback (an `int | None` transformers resolves)
    null_same,  // as nullable, and written as null when the value is the fallback (GPT-2's n_inner)
};

struct HfKey {
    const char* hf;   // "hidden_size"
    HfField field;    // &ModelConfig::hidden
    const char* key;  // "model.hidden" (messages)
    HfAbsent absent = HfAbsent::required;
    // The value of an absent key, from the fields of the keys listed before it (GPT-2's n_inner:
    // 4 x n_embd); a boolean is 0 or 1.
    double (*fallback)(const ModelConfig&) = nullptr;
    // Another name transformers reads the key by (Qwen3-MoE's num_experts, which transformers 5
    // writes as num_local_experts): either may be given, not both.
    const char* alias = nullptr;
    // model.init_from requires the job's value; false for a training choice the job may make
    // (the aux loss coefficient).
    bool compared = true;
};

// A JSON value of a fixed key.
struct HfValue {
    enum Kind : std::uint8_t {
        string,     // s
        boolean,    // b
        number,     // x, compared as fp32
        empty,      // []
        per_layer,  // a list of model.layers copies of s (Qwen3's layer_types)
    } kind = boolean;
    const char* s = "";
    bool b = false;
    double x = 0;
};

// A key whose value Parallax's model has built in: config.json may omit it when transformers'
// default is that value (absent_ok), else it must hold exactly it.
struct HfFixedKey {
    const char* key;  // "activation_function"
    HfValue value;    // "gelu_new"
    bool absent_ok;
    const char* why;  // what Parallax computes instead, for the refusal
};

struct HfArchitecture {
    const char* name;        // config.json's "architectures": "GPT2LMHeadModel"
    const char* model_type;  // "gpt2"
    // The ModelConfig the class is: model.arch, model.qk_norm (llama), whether it has MoE layers
    // (model.moe_experts > 0, no shared experts), and whether it has rotary positions, whose
    // parameters (rope_parameters / rope_scaling) set model.rope_*.
    const char* arch;
    bool qk_norm;
    bool moe;
    bool rope;
    std::span<const HfKey> keys;  // in the order read: a fallback uses the keys before it
    std::span<const HfFixedKey> fixed;
    std::span<const HfNameRow> names;
    const char* written;  // a JSON object of the further keys config.json gets when written
};

std::span<const HfArchitecture> hf_architectures();
const HfArchitecture* find_hf_architecture(std::string_view name);  // nullptr if unknown
// The class a Parallax model is written as (its arch, qk_norm and MoE); Error naming the keys
// when it is none of them (a GPT-2 MoE, shared experts, a llama MoE without qk_norm).
const HfArchitecture& hf_architecture_for(const ModelConfig& mc);
// "{i}" replaced by the layer, "{e}" by the expert.
std::string hf_name(const char* pattern, i64 layer, i64 expert = 0);

struct HfConfig {
    std::string path;  // config.json
    const HfArchitecture* arch = nullptr;
    ModelConfig model;  // the class's model with config.json's keys; every other field its default
};

// Reads and checks config.json (rules above); DataError naming the file and the key.
HfConfig read_hf_config(const std::string& config_path);

// config.json for mc, as transformers writes one for the class hf_architecture_for(mc) (keys
// sorted, two-space indents, a final newline), declaring `dtype` (F32, BF16, F16) the weights'.
std::string hf_config_text(const ModelConfig& mc, SafeDType dtype);

// "vocab_size = 11, n_positions = 6, ...": config.json's integer keys, for messages.
std::string hf_sizes_text(const HfConfig& cfg);

// model.init_from: each thing the job's model differs in from cfg's, as "model.hidden = 16 in
// this config but n_embd = 8 in <config.json>" (its class: model.arch, qk_norm, MoE; its compared
// keys, kv_heads, head_dim and moe_ffn by their values, 0 resolved; RoPE's); the job's seq_len
// may be less than the file's. Empty when the job can start from the folder.
std::vector<std::string> hf_config_differences(const HfConfig& cfg, const ModelConfig& job);

// ---- a folder ----

struct HfInput {
    std::string folder;   // the folder
    std::string config;   // <folder>/config.json
    std::string weights;  // what SafetensorsSet opens: the file given, or the folder
};
// A Hugging Face input: a folder (whose config.json read_hf_config then requires), or a
// .safetensors file or a .safetensors.index.json (which names the weights) in one; nullopt for
// anything else. Never throws.
std::optional<HfInput> hf_input(const std::string& path);
// read_hf_config of in.config; a safetensors file given without a config.json beside it is
// refused naming the file.
HfConfig read_hf_config(const HfInput& in);

struct HfReadReport {
    std::optional<SafeDType> dtype;  // the dtype all the parameters were stored in, if one
    std::vector<std::string> files;  // the safetensors files read
    bool lm_head = false;            // the file held the tied lm_head.weight (checked equal)
    int buffers = 0;                 // non-persistent buffers skipped
};

// Checks every tensor of in.weights against the architecture's table and cfg's sizes (names,
// dtypes, shapes, finite values, tied copies), then reads each parameter of the model mc into
// params(name) (Parallax's shape). mc must have cfg's sizes except seq_len, which may be
// smaller (the first seq_len rows of wpe are taken): the caller checks that, naming its keys.
HfReadReport read_hf_weights(const HfInput& in, const HfConfig& cfg, const ModelConfig& mc,
                             const ParamLookup& params);

// model.init_from = a Hugging Face folder (read_init_weights): the job's model must be the
// folder's (hf_config_differences), else a ConfigError naming each key and both values; then
// read_hf_weights.
void read_hf_init_weights(const HfInput& in, const ModelConfig& mc, const ParamLookup& params);

// "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16" -> F32, BF16, F16; nullopt
// for anything else.
std::optional<SafeDType> hf_write_dtype(std::string_view name);

// transformers 4's save_pretrained default: shards of at most 5 GB (one file below that).
inline constexpr u64 kHfShardBytes = 5'000'000'000;

// Writes folder (created if missing) as a Hugging Face folder of mc's weights (the class
// hf_architecture_for(mc)), params(name) in Parallax's shapes: model.safetensors (or shards of at
// most max_shard_bytes and their index, as save_pretrained: core/io/safetensors.h) with every
// tensor in `dtype` (F32, BF16 or F16), then config.json; each file atomically. Refuses non-finite
// values and values the dtype cannot hold, naming the tensor, before writing anything. Returns the
// files written.
std::vector<std::string> write_hf_folder(const std::string& folder, const ModelConfig& mc,
                                         const ParamLookup& params, SafeDType dtype,
                                         u64 max_shard_bytes = kHfShardBytes);

}  // namespace px
