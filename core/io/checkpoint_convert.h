// Converting weights between llm.c's checkpoint format (GPT-2), Parallax checkpoints and Hugging
// Face folders (GPT-2, Llama, Qwen3, Qwen3-MoE; docs/files.md), in any direction: the work of
// `parallax convert` and `parallax.convert`.
#pragma once
#include <string>

namespace px {

struct ConvertOptions {
    // The dtype of a Hugging Face output: "fp32", "bf16" or "fp16" (also "float32", ...); empty:
    // the source's (a checkpoint converted from a Hugging Face folder records its dtype), else
    // fp32. Other outputs refuse it.
    std::string dtype;
};

// OUT says what to write: ending in ".h5" a Parallax checkpoint of IN's weights (zero Adam
// moments, step 0, meant for model.init_from); ending in ".bin" llm.c's fp32 version-3 file (a
// GPT-2-shaped model: ffn = 4 * hidden); an existing folder, or a name without an extension (or
// ending in '/'), a Hugging Face folder: config.json and model.safetensors (the model's class,
// hf_architecture_for; shards and their index above 5 GB). IN is told by what it is: a folder holding config.json, or a
// .safetensors / .safetensors.index.json file beside one, is a Hugging Face model; a file, by its
// first bytes, an llm.c checkpoint or a Parallax checkpoint (every checksum verified). IN and OUT
// of the same format are refused. Every file is written atomically. Returns what was written, in a
// few lines. DataError naming the file (and the tensor or key) on bad input.
std::string convert_weights(const std::string& in, const std::string& out,
                            const ConvertOptions& options = {});

}  // namespace px
