// Hugging Face model folders (config.json beside model.safetensors, or beside a sharded set
// model.safetensors.index.json + its shards), read into and written from Parallax's logical fp32
// tensors: the third weights format of `parallax convert` and model.init_from (docs/files.md).
//
// Index
//   HfTransform, HfStore, HfRole, HfNameRow    one row of an architecture's name table
//   HfSizeKey, HfValue, HfFixedKey              config.json's sizes (-> ModelConfig) and the keys
//                                               whose value Parallax's model has built in
//   HfArchitecture, hf_architectures, find_hf_architecture   the architectures read and written
//   hf_name                                     a pattern with {i} filled in
//   HfConfig, read_hf_config                    config.json read and checked
//   hf_config_text                              config.json's text for a ModelConfig
//   HfInput, hf_input, read_hf_config(HfInput)  whether a path is a Hugging Face folder (or a file
//                                               in one), where its config and weights are
//   HfReadReport, read_hf_weights               the weights checked, then read into the parameters
//   read_hf_init_weights                        model.init_from's case: config.json against the job
//   hf_write_dtype, kHfShardBytes, write_hf_folder   the weights and config.json written
//
// The name table. Each architecture lists its tensors as rows {HF name, Parallax name, transform,
// stored dtype, role}, "{i}" standing for a layer (0 .. n_layer - 1). The Parallax names are those
// of ParamTable::build(mc) (core/base/arena.h); GPT-2's HF names are GPT2LMHeadModel's state dict,
// whose four matrices per block are Conv1D modules that store their weight as (in, out), the
// transpose of Parallax's (out, in), hence `transpose`. Reading and writing are driven by the
// tables alone. Adding an architecture (LlamaForCausalLM, Qwen3ForCausalLM) is data in the .cpp:
// its name rows (a separate q/k/v in HF fused into one Parallax tensor needs a transform beside
// none/transpose), its size keys (hidden_size -> model.hidden, ...), its fixed keys (hidden_act
// "silu", ...), the JSON of its other keys, and one line of kHfArchitectures; its Parallax names
// are those its model's ParamTable builds.
//
// Dtypes. Tensors are read from F32, BF16 or F16 and widened exactly to fp32 (SafetensorsFile);
// every other dtype is refused by name. They are written in one dtype the caller picks (F32, BF16
// or F16, rounding to nearest even; a value that overflows it is refused by name), except rows
// stored as HfStore::f32. config.json's "dtype" says that dtype, as transformers writes it.
//
// Errors. A folder whose config.json is missing, not JSON, of an unknown architecture, missing a
// key or holding one of the wrong type, or asking for a model Parallax does not compute (another
// activation or norm epsilon, untied embeddings) is refused with a DataError naming config.json
// and the key; weights with a missing, unknown or misshapen tensor, a dtype not read, a
// non-finite value, or an lm_head.weight that differs from the embedding it is tied to are refused
// naming the file and the tensor. The safetensors layer refuses damaged files (core/io/
// safetensors.h). Everything is checked before any parameter is written.
#pragma once
#include "core/base/config.h"
#include "core/io/checkpoint_llmc.h"  // ParamLookup
#include "core/io/safetensors.h"

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace px {

// ---- the name table ----

enum class HfTransform : std::uint8_t {
    none,       // the same shape and element order
    transpose,  // a matrix stored (cols, rows): HF's Conv1D keeps (in, out), Parallax (out, in)
};
enum class HfStore : std::uint8_t {
    folder,  // in the dtype the folder is written in (fp32, bf16 or fp16)
    f32,     // always F32: a tensor the model keeps in fp32 (transformers' _keep_in_fp32_modules)
};
enum class HfRole : std::uint8_t {
    param,   // one Parallax parameter: required when read, written
    tied,    // a copy of a parameter (a tied lm_head.weight): optional when read, where it must
             // equal the parameter bit for bit; not written (save_pretrained drops it)
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

// A size of the model: config.json's key -> a ModelConfig field. A key that is null or absent
// takes `times` x the field `from` when `from` is set (GPT-2's n_inner: null = 4 x n_embd), and
// is written as null when it equals that; otherwise it is required.
struct HfSizeKey {
    const char* hf;           // "n_embd"
    i64 ModelConfig::*field;  // &ModelConfig::hidden
    const char* key;          // "model.hidden" (messages)
    i64 ModelConfig::*from = nullptr;
    i64 times = 0;
};

// A JSON value of a fixed key (a string, a boolean or a number compared as fp32).
struct HfValue {
    enum Kind : std::uint8_t { string, boolean, number } kind = boolean;
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
    std::span<const HfSizeKey> sizes;
    std::span<const HfFixedKey> fixed;
    std::span<const HfNameRow> names;
    const char* written;  // a JSON object of the further keys config.json gets when written
};

std::span<const HfArchitecture> hf_architectures();
const HfArchitecture* find_hf_architecture(std::string_view name);  // nullptr if unknown
std::string hf_name(const char* pattern, i64 layer);                // "{i}" replaced by the layer

struct HfConfig {
    std::string path;  // config.json
    const HfArchitecture* arch = nullptr;
    ModelConfig model;  // the sizes; every other field its default
};

// Reads and checks config.json (rules above); DataError naming the file and the key.
HfConfig read_hf_config(const std::string& config_path);

// config.json for mc, as transformers writes one (keys sorted, two-space indents, a final
// newline), declaring `dtype` (F32, BF16, F16) the weights'. Error if mc is not GPT-2 shaped for
// the architecture (mixture of experts).
std::string hf_config_text(const ModelConfig& mc, SafeDType dtype,
                           const HfArchitecture& arch = hf_architectures()[0]);

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

// model.init_from = a Hugging Face folder (read_init_weights): config.json's sizes must be mc's
// (model.seq_len may be less than n_positions) and mc dense, else a ConfigError naming each key
// and both values; then read_hf_weights.
void read_hf_init_weights(const HfInput& in, const ModelConfig& mc, const ParamLookup& params);

// "fp32"/"f32"/"float32", "bf16"/"bfloat16", "fp16"/"f16"/"float16" -> F32, BF16, F16; nullopt
// for anything else.
std::optional<SafeDType> hf_write_dtype(std::string_view name);

// transformers 4's save_pretrained default: shards of at most 5 GB (one file below that).
inline constexpr u64 kHfShardBytes = 5'000'000'000;

// Writes folder (created if missing) as a Hugging Face folder of mc's weights, params(name) in
// Parallax's shapes: model.safetensors (or shards of at most max_shard_bytes and their index, as
// save_pretrained: core/io/safetensors.h) with every tensor in `dtype` (F32, BF16 or F16), then
// config.json; each file atomically. Refuses non-finite values and values the dtype cannot hold,
// naming the tensor, before writing anything. Returns the files written.
std::vector<std::string> write_hf_folder(const std::string& folder, const ModelConfig& mc,
                                         const ParamLookup& params, SafeDType dtype,
                                         u64 max_shard_bytes = kHfShardBytes,
                                         const HfArchitecture& arch = hf_architectures()[0]);

}  // namespace px
