// parallax convert IN --to OUT: GPT-2 weights between llm.c's checkpoint format and Parallax
// checkpoints, in either direction (core/io/checkpoint_convert.h does the work); OUT's extension
// says which. Bad input is a DataError, which main() maps to exit code 2.
#include "app/commands.h"
#include "core/io/checkpoint_convert.h"

#include <cstdio>
#include <memory>
#include <string>

namespace px::app {

std::function<int()> add_convert_command(CLI::App& app) {
    auto in = std::make_shared<std::string>();
    auto out = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand(
        "convert",
        "Convert GPT-2 weights between an llm.c checkpoint (.bin) and a Parallax "
        "checkpoint (.h5), either way: OUT's extension says which. Exit 0 on success, "
        "2 on bad input.");
    cmd->add_option("IN", *in, "the file to convert: an llm.c .bin or a Parallax checkpoint .h5")
        ->required();
    cmd->add_option("--to", *out, "the file to write: NAME.h5 (Parallax) or NAME.bin (llm.c)")
        ->required()
        ->type_name("OUT");
    cmd->footer(
        "OUT ending in .h5: IN is an llm.c GPT-2 checkpoint (fp32, version 1 or 3, e.g. "
        "gpt2_124M.bin); OUT is a Parallax checkpoint with its weights under /model, zero Adam "
        "moments, step 0, an empty history and the model config of the header (seq_len = "
        "max_seq_len, ffn = 4 * hidden). Start a run from it with --set model.init_from=OUT; "
        "checkpoint.resume refuses it, as it holds no training state.\n"
        "OUT ending in .bin: IN is a Parallax checkpoint of a GPT-2-shaped model (ffn = 4 * "
        "hidden), every checksum verified first; OUT is the llm.c fp32 checkpoint (version 3) of "
        "its weights that llm.c's train_gpt2 reads, the vocabulary padded to a multiple of 128 "
        "with zero rows.\n"
        "Padding rows are not weights: they are dropped on the way in and written as zeros on "
        "the way out, so an llm.c version-3 file (zero padding, as llm.c writes it) comes back "
        "byte for byte from .bin -> .h5 -> .bin. llm.c's bf16 files (version 5) are not read: "
        "convert the fp32 file. OUT is written to a temporary file next to it and renamed, so a "
        "failed conversion leaves it as it was.\n"
        "Examples:\n  parallax convert gpt2_124M.bin --to gpt2_124M.h5\n"
        "  parallax convert runs/ck/ckpt-00000600.h5 --to model.bin");
    return [in, out]() -> int {
        std::fputs(convert_weights(*in, *out).c_str(), stdout);
        return kOk;
    };
}

}  // namespace px::app
