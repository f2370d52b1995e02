// llm.c GPT-2 checkpoints (train_gpt2.c's gpt2_124M.bin and friends), read and written in fp32,
// and model.init_from, which takes such a file, a Parallax checkpoint (.h5) or a Hugging Face
// folder.
//
// Index
//   ParamLookup             name -> the model's fp32 storage of that parameter
//   LlmcHeader              the header fields
//   read_llmc_header        reads and checks a header
//   read_llmc_checkpoint    loads a checkpoint into the model's parameters
//   write_llmc_checkpoint   writes the model's parameters as a version-3 checkpoint, atomically
//   llmc_model_config       the ModelConfig an llm.c header describes
//   WeightsFile, sniff_weights_file   what a weights file is, by its first bytes
//   read_init_weights       model.init_from: the weights of an llm.c .bin, a checkpoint .h5 or a
//                           Hugging Face folder
//
// The format. 256 little-endian int32: [0] magic 20240326, [1] version (1: no padded vocab;
// 3: padded vocab in [7]), [2] max_seq_len maxT, [3] vocab V, [4] layers L, [5] heads NH,
// [6] channels C, [7] padded vocab Vp (version 3; Vp = V in version 1). Then the fp32
// parameters, each llm.c tensor holding all layers, layer-major:
//   wte (Vp,C)  wpe (maxT,C)  ln1w (L,C)  ln1b (L,C)  qkvw (L,3C,C)  qkvb (L,3C)
//   attprojw (L,C,C)  attprojb (L,C)  ln2w (L,C)  ln2b (L,C)  fcw (L,4C,C)  fcb (L,4C)
//   fcprojw (L,C,4C)  fcprojb (L,C)  lnfw (C)  lnfb (C)
// Parallax names the per-layer slices GPT-2 style: wte (V,C), wpe (seq_len,C),
// h.{i}.ln_1.weight, h.{i}.attn.c_attn.weight (3C,C), ..., ln_f.bias. Only the first V rows of
// wte and the first seq_len rows of wpe are Parallax parameters; pad rows are read and checked
// but dropped, and written as zeros.
#pragma once
#include "core/base/config.h"

#include <functional>
#include <string>

namespace px {

// Returns the fp32 storage of the named parameter (its shape as listed above).
using ParamLookup = std::function<float*(const std::string& name)>;

struct LlmcHeader {
    int version = 0;  // 1 or 3
    i64 max_T = 0;    // rows of wpe in the file
    i64 V = 0;        // vocabulary
    i64 L = 0;        // layers
    i64 NH = 0;       // heads
    i64 C = 0;        // channels
    i64 Vp = 0;       // rows of wte in the file (padded vocabulary; V for version 1)
};

// Reads and checks the header (magic, version, positive sizes, Vp >= V). Throws DataError.
LlmcHeader read_llmc_header(const std::string& path);

// Loads every parameter. Checks the header against `mc` (naming the mismatching key), the file
// size, and that every value is finite, all before it writes any parameter, so on an error the
// model is untouched. Requires model.ffn == 4 * model.hidden and file maxT >= model.seq_len.
void read_llmc_checkpoint(const std::string& path, const ModelConfig& mc,
                          const ParamLookup& params);

// Writes version 3 (Vp = V rounded up to a multiple of 128, pad rows zero, maxT = seq_len) to a
// temporary file in the same folder, fsyncs it and renames it over `path`, so a crash leaves
// either the old file or the whole new one. Refuses non-finite parameters (names the tensor).
void write_llmc_checkpoint(const std::string& path, const ModelConfig& mc,
                           const ParamLookup& params);

// The model an llm.c header describes: vocab V, seq_len maxT, layers L, heads NH, hidden C,
// ffn 4C (llm.c's GPT-2 MLP); init_std and init_from keep their defaults.
ModelConfig llmc_model_config(const LlmcHeader& h);

// What a file holds, judged by its first bytes (never by its name): the HDF5 signature
// "\x89HDF\r\n\x1a\n" (a Parallax checkpoint, core/io/checkpoint.h), the llm.c GPT-2 checkpoint
// magic, the llm.c token-file magic, or something else (also: shorter than 8 bytes).
enum class WeightsFile { parallax, llmc, llmc_tokens, other };
// Throws DataError "<role> <path>: cannot open it ..." when the file cannot be read.
WeightsFile sniff_weights_file(const std::string& path, const std::string& role);

// model.init_from: loads the weights of `path` into the model's parameters, whichever of the three
// formats it is: a Hugging Face folder (a folder holding config.json, or a .safetensors file in
// one: read_hf_init_weights, core/io/hf_checkpoint.h); else, by its first bytes
// (sniff_weights_file), an llm.c checkpoint by read_llmc_checkpoint, or a Parallax
// checkpoint by its /model tensors (every checksum verified and every value finite; its Adam
// moments, step, history and data state are not used: training starts at step 0 with a fresh
// optimizer). The checkpoint's model must be the config's (model.vocab, layers, heads, hidden,
// ffn equal; its seq_len at least model.seq_len: the first seq_len rows of wpe are taken), else a
// ConfigError / CheckpointError names both values and the key. Everything is checked before any
// parameter is written, so on an error the model is untouched. Safe to call from several
// threads (in-process ranks): HDF5 reads are serialised.
void read_init_weights(const std::string& path, const ModelConfig& mc, const ParamLookup& params);

}  // namespace px
