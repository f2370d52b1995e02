// parallax convert IN --to OUT [--dtype D]: weights between llm.c's checkpoint format (GPT-2),
// Parallax checkpoints and Hugging Face folders (GPT-2, Llama, Qwen3, Qwen3-MoE), in any direction
// (core/io/checkpoint_convert.h does the work); OUT's name says what to write. Bad input is a
// DataError, which main() maps to exit code 2.
#include "app/commands.h"
#include "core/io/checkpoint_convert.h"

#include <cstdio>
#include <memory>
#include <string>

namespace px::app {

std::function<int()> add_convert_command(CLI::App& app) {
    auto in = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    auto options = std::make_shared<ConvertOptions>();
    CLI::App* cmd = app.add_subcommand(
        "convert",
        "Convert weights between an llm.c GPT-2 checkpoint (.bin), a Parallax checkpoint (.h5) "
        "and a Hugging Face folder (config.json + model.safetensors: GPT2LMHeadModel, "
        "LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM), any way: OUT's name says "
        "what to write. Exit 0 on success, 2 on bad input.");
    cmd->add_option("IN", *in,
                    "what to convert: an llm.c .bin, a Parallax checkpoint .h5, or a Hugging "
                    "Face folder (or its model.safetensors)")
        ->required();
    cmd->add_option("--to", *out,
                    "what to write: NAME.h5 (Parallax), NAME.bin (llm.c), or a folder (Hugging "
                    "Face: an existing folder, a name without an extension, or one ending in /)")
        ->required()
        ->type_name("OUT");
    cmd->add_option("--dtype", options->dtype,
                    "a Hugging Face folder's dtype: fp32, bf16 or fp16 (default: the dtype the "
                    "weights came in from Hugging Face, else fp32)")
        ->type_name("D");
    cmd->footer(
        "OUT ending in .h5: a Parallax checkpoint with IN's weights under /model, zero Adam "
        "moments, step 0, an empty history and IN's model config (from llm.c: seq_len = "
        "max_seq_len, ffn = 4 * hidden; from Hugging Face: the model keys config.json sets, "
        "docs/files.md). Start a run from it with --set "
        "model.init_from=OUT; checkpoint.resume refuses it, as it holds no training state.\n"
        "OUT ending in .bin: the llm.c fp32 checkpoint (version 3) of a GPT-2-shaped model (ffn = "
        "4 * hidden) that llm.c's train_gpt2 reads, the vocabulary padded to a multiple of 128 "
        "with zero rows; a llama model is refused.\n"
        "OUT a folder: a Hugging Face folder, config.json and model.safetensors (shards and "
        "model.safetensors.index.json above 5 GB), which transformers' from_pretrained loads: "
        "GPT2LMHeadModel for model.arch = gpt2; for llama LlamaForCausalLM, with model.qk_norm "
        "Qwen3ForCausalLM, with qk_norm and MoE layers Qwen3MoeForCausalLM. Its tensors in "
        "--dtype, by default the dtype the weights were stored in when they came from Hugging "
        "Face, else fp32. GPT-2's four Conv1D matrices of a block are stored transposed, as "
        "transformers keeps them; Llama's tensors as they are (Parallax's RoPE is transformers' "
        "rotate_half: no permutation), a MoE layer's stacked experts one by one "
        "(mlp.experts.{e}.gate_proj.weight, ...); a tied lm_head.weight is left out, as "
        "save_pretrained does.\n"
        "A Parallax checkpoint is read with every checksum verified first. A Hugging Face input "
        "is a folder holding config.json (or its model.safetensors, or its index) of one of those "
        "classes in F32, BF16 or F16, with a model Parallax computes (GPT-2: gelu_new, "
        "layer_norm_epsilon 1e-5, tied embeddings; Llama, Qwen3: silu, no biases, rope_type "
        "default or llama3, no sliding window); every tensor is checked against config.json, a "
        "tied lm_head.weight must equal the embedding.\n"
        "Round trips are byte for byte: an llm.c version-3 file (zero padding, as llm.c writes "
        "it) through .bin -> .h5 -> .bin, and a Hugging Face model.safetensors through HF -> .h5 "
        "-> HF (the .h5 records the dtype). llm.c's bf16 files (version 5) are not read: convert "
        "the fp32 file. Every file is written to a temporary file next to it and renamed, so a "
        "failed conversion leaves OUT as it was.\n"
        "Examples:\n  parallax convert gpt2_124M.bin --to gpt2_124M.h5\n"
        "  parallax convert runs/ck/ckpt-00000600.h5 --to model.bin\n"
        "  parallax convert gpt2-hf/ --to gpt2.h5\n"
        "  parallax convert Qwen3-0.6B/ --to qwen3.h5\n"
        "  parallax convert runs/ck/ckpt-00000600.h5 --to gpt2-trained --dtype bf16");
    return [in, out, options]() -> int {
        std::fputs(convert_weights(*in, *out, *options).c_str(), stdout);
        return kOk;
    };
}

}  // namespace px::app
