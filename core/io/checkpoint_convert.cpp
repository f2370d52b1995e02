// Converting weights (parallax convert IN --to OUT, parallax.convert) between llm.c's checkpoint
// format (GPT-2), Parallax checkpoints and Hugging Face folders (GPT-2, Llama, Qwen3, Qwen3-MoE;
// docs/files.md), in any direction: IN is read into the logical fp32 weights of its model, which
// OUT's format is written from. OUT's name says its format, IN's content says its own.
//
// Index
//   Format, format_text      the three formats
//   output_format            OUT's, by its name (.h5, .bin, a folder)
//   input_format             IN's: a Hugging Face folder (or a safetensors file in one), else by
//                            its first bytes (sniff_weights_file), never by its name
//   Weights                  a model config and its logical weights, and where they came from
//   read_llmc, read_parallax, read_hf      IN into Weights
//   write_parallax, write_llmc, write_hf   Weights into OUT
//   convert_weights          one of each
//
// Every writer is atomic (a temporary file next to OUT, fsync, rename), so a failed conversion
// leaves OUT as it was; every input is checked whole before anything is written. Every error names
// the file and says what to do; bad input is a DataError (the CLI's exit code 2).
//
// A Parallax checkpoint written here records in /data source where it came from and carries no
// training state, so checkpoint.resume refuses it (its data source differs from any run's); it is
// meant for model.init_from, which starts a run from its weights at step 0. From a Hugging Face
// folder it also records the dtype the weights were stored in (/model source_dtype), which a
// conversion back to a Hugging Face folder writes again, so HF -> .h5 -> HF is byte for byte.
#include "core/io/checkpoint_convert.h"

#include "core/base/arena.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/base/files.h"
#include "core/io/checkpoint.h"
#include "core/io/checkpoint_llmc.h"
#include "core/io/hf_checkpoint.h"
#include "core/io/state.h"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include <hdf5.h>

namespace px {

namespace {

enum class Format { llmc, parallax, hf };

const char* format_text(Format f) {
    switch (f) {
        case Format::llmc:
            return "an llm.c checkpoint";
        case Format::parallax:
            return "a Parallax checkpoint";
        case Format::hf:
            return "a Hugging Face folder";
    }
    return "";
}

bool has_suffix(const std::string& s, const std::string& suffix) {
    return s.size() > suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string file_name(const std::string& path) {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    return std::filesystem::path(p).filename().string();
}

std::string model_text(const ModelConfig& mc) {
    std::string t = "L=";
    t.append(std::to_string(mc.layers))
        .append(" C=")
        .append(std::to_string(mc.hidden))
        .append(" NH=")
        .append(std::to_string(mc.heads))
        .append(" V=")
        .append(std::to_string(mc.vocab))
        .append(" T=")
        .append(std::to_string(mc.seq_len));
    if (mc.ffn != 4 * mc.hidden) t.append(" F=").append(std::to_string(mc.ffn));
    if (mc.llama())
        t.append(" KV=")
            .append(std::to_string(mc.kv_head_count()))
            .append(" HS=")
            .append(std::to_string(mc.head_size()));
    if (mc.is_moe())
        t.append(" E=")
            .append(std::to_string(mc.moe_experts))
            .append(" k=")
            .append(std::to_string(mc.moe_top_k));
    return t;
}

Format output_format(const std::string& out) {
    if (has_suffix(out, ".h5")) return Format::parallax;
    if (has_suffix(out, ".bin")) return Format::llmc;
    if (file_kind(out) == FileKind::folder || (!out.empty() && out.back() == '/'))
        return Format::hf;
    const std::string name = file_name(out);
    if (!name.empty() && name.find('.') == std::string::npos) return Format::hf;
    std::string msg = "output ";
    throw DataError(msg.append(out).append(
        " has an extension convert does not know; end it in .h5 to write a Parallax checkpoint or "
        "in .bin to write an llm.c checkpoint, or give a folder (an existing one, a name without "
        "an extension, or one ending in /) to write a Hugging Face folder"));
}

Format input_format(const std::string& in) {
    if (hf_input(in)) return Format::hf;
    switch (sniff_weights_file(in, "input")) {
        case WeightsFile::parallax:
            return Format::parallax;
        case WeightsFile::llmc:
            return Format::llmc;
        case WeightsFile::llmc_tokens:
            read_llmc_header(in);  // says that it holds tokens
            return Format::llmc;
        case WeightsFile::other:
            break;
    }
    std::string msg = "input ";
    throw DataError(msg.append(in).append(
        " is none of the formats convert reads: not an llm.c GPT-2 checkpoint (it does not start "
        "with the magic 20240326), not a Parallax checkpoint (HDF5), not a Hugging Face "
        "model.safetensors; give an llm.c .bin such as gpt2_124M.bin, a checkpoint .h5, or a "
        "folder holding config.json and model.safetensors"));
}

struct Weights {
    ModelConfig mc;
    LogicalState s;            // the weights in s.params; moments zero
    std::string source;        // for the report: "llm.c checkpoint X (version 3, L=...)"
    std::string from;          // for /data source: "llm.c gpt2_124M.bin"
    std::string source_dtype;  // the Hugging Face dtype it came in, if it did ("BF16")

    float* param(const std::string& name) {
        const int i = s.table.find(name);
        return i < 0 ? nullptr : s.params.data() + s.table.entries[static_cast<size_t>(i)].offset;
    }
};

// The model a file describes, refused as a DataError when Parallax cannot build it.
void check_buildable(const std::string& what, const ModelConfig& mc) {
    Config cfg;
    cfg.model = mc;
    try {
        validate_config(cfg);
    } catch (const ConfigError& e) {
        throw DataError(what + ": its header describes a model Parallax cannot build (" + e.what() +
                        "); the file is corrupt or not a GPT-2 checkpoint");
    }
}

Weights read_llmc(const std::string& in) {
    const LlmcHeader h = read_llmc_header(in);
    Weights w;
    w.mc = llmc_model_config(h);
    check_buildable("llm.c checkpoint " + in, w.mc);
    w.s.allocate(w.mc);
    read_llmc_checkpoint(in, w.mc, [&w](const std::string& name) { return w.param(name); });
    w.source = "llm.c checkpoint " + in + " (version " + std::to_string(h.version) + ", " +
               model_text(w.mc) + ", padded vocab " + std::to_string(h.Vp) + ")";
    w.from = "llm.c " + file_name(in);
    return w;
}

Weights read_parallax(const std::string& in) {
    // Some damaged files make HDF5 1.10 leak on its error path, and its shutdown at exit then
    // prints "infinite loop closing library"; convert only reads HDF5, so it need not shut down.
    H5dont_atexit();
    const CheckpointReader r(in);
    r.verify_all();  // every checksum, before anything is written
    Weights w;
    try {
        w.mc = parse_config(r.meta().config_toml, in + " (its config attribute)").model;
    } catch (const ConfigError& e) {
        std::string msg = "checkpoint ";
        throw DataError(msg.append(in)
                            .append(": its config attribute does not parse with this build (")
                            .append(e.what())
                            .append("), so its model's shape is unknown; convert it with the "
                                    "Parallax version that wrote it"));
    }
    r.check_model(w.mc);
    w.s.allocate(w.mc);
    // Verified above; other formats refuse non-finite weights, so they are refused here.
    for (const TableEntry& e : w.s.table.entries) {
        float* dst = w.param(e.name);
        r.read(model_dataset(e.name), dst);
        for (i64 i = 0; i < e.numel(); i++)
            if (!std::isfinite(dst[i])) {
                std::string msg = "checkpoint ";
                throw DataError(msg.append(in)
                                    .append(": /model/")
                                    .append(e.name)
                                    .append(" holds a non-finite value at element ")
                                    .append(std::to_string(i))
                                    .append(" (the run that wrote it diverged); llm.c and Hugging "
                                            "Face cannot use it: convert an earlier checkpoint"));
            }
    }
    w.source = "Parallax checkpoint " + in + " (step " + std::to_string(r.meta().step) + ", " +
               model_text(w.mc) + ", " + std::to_string(w.s.table.num_params) + " parameters)";
    w.from = "Parallax " + file_name(in);
    w.source_dtype = r.meta().source_dtype;
    return w;
}

Weights read_hf(const HfInput& in) {
    const HfConfig cfg = read_hf_config(in);
    Weights w;
    w.mc = cfg.model;
    // Allocated when the first parameter is written, after every check: until the weights
    // agree with config.json, its sizes are only claims.
    const HfReadReport rep = read_hf_weights(in, cfg, w.mc, [&w](const std::string& name) {
        if (w.s.params.empty()) w.s.allocate(w.mc);
        return w.param(name);
    });
    const std::string dtype = rep.dtype ? safe_dtype_name(*rep.dtype) : "mixed dtypes";
    w.source = std::string("Hugging Face ") + cfg.arch->name + " " + in.folder + " (" +
               model_text(w.mc) + ", " + dtype + (rep.lm_head ? ", with its tied lm_head" : "") +
               ")";
    w.from = std::string("Hugging Face ") + cfg.arch->name + " " + file_name(in.folder);
    if (rep.dtype) w.source_dtype = safe_dtype_name(*rep.dtype);
    return w;
}

std::string write_parallax(const std::string& out, Weights& w) {
    Config cfg;
    cfg.model = w.mc;
    CheckpointMeta meta = make_checkpoint_meta(cfg, 0, {});
    meta.data_source = "converted from " + w.from +
                       " (weights only, no training state: start a run from it with "
                       "model.init_from, not checkpoint.resume)";
    meta.source_dtype = w.source_dtype;
    write_checkpoint(out, w.s, meta, w.mc);
    return "Parallax checkpoint " + out + ": " + std::to_string(w.s.table.num_params) +
           " parameters under /model, Adam moments zero, step 0\nstart a run from it with --set "
           "model.init_from=" +
           out + " (and these model keys)\n";
}

std::string write_llmc(const std::string& out, Weights& w) {
    const ModelConfig& mc = w.mc;
    if (mc.llama())
        throw DataError("cannot write llm.c checkpoint " + out + " from " + w.source +
                        ": it holds a llama model (model.arch = \"llama\"), and llm.c's format "
                        "holds GPT-2 only; write a Parallax checkpoint (.h5) or a Hugging Face "
                        "folder");
    if (mc.ffn != 4 * mc.hidden) {
        std::string msg = "cannot write llm.c checkpoint " + out + " from " + w.source;
        throw DataError(msg.append(": it holds a model with model.ffn = ")
                            .append(std::to_string(mc.ffn))
                            .append(", but llm.c's GPT-2 has an MLP of 4 * model.hidden = ")
                            .append(std::to_string(4 * mc.hidden))
                            .append("; only GPT-2-shaped models (ffn = 4 * hidden) can be written "
                                    "in llm.c's format"));
    }
    const i64 limit = std::numeric_limits<std::int32_t>::max();
    if ((mc.vocab + 127) / 128 * 128 > limit || mc.seq_len > limit || mc.hidden > limit ||
        mc.layers > limit || mc.heads > limit)
        throw DataError("cannot write llm.c checkpoint " + out + " from " + w.source +
                        ": its model is too large for llm.c's int32 header");
    // Version 3, padded vocabulary rows zero, maxT = seq_len; atomically.
    write_llmc_checkpoint(out, mc, [&w](const std::string& name) { return w.param(name); });
    return "llm.c checkpoint " + out + " (version 3, fp32, padded vocab " +
           std::to_string((mc.vocab + 127) / 128 * 128) + ")\n";
}

std::string write_hf(const std::string& out, Weights& w, const std::string& dtype_option) {
    SafeDType dtype = SafeDType::F32;
    if (!dtype_option.empty()) {
        const std::optional<SafeDType> d = hf_write_dtype(dtype_option);
        if (!d)
            throw DataError("dtype \"" + dtype_option + "\" for " + out +
                            " is not one convert writes; give fp32, bf16 or fp16");
        dtype = *d;
    } else if (const std::optional<SafeDType> d = safe_dtype_from_name(w.source_dtype);
               d && (*d == SafeDType::BF16 || *d == SafeDType::F16)) {
        dtype = *d;  // the dtype the weights came in from a Hugging Face folder
    }
    const std::vector<std::string> files = write_hf_folder(
        out, w.mc, [&w](const std::string& name) { return w.param(name); }, dtype);
    const char* cls = hf_architecture_for(w.mc).name;
    std::string names;
    for (const std::string& f : files) names.append(names.empty() ? "" : ", ").append(file_name(f));
    return std::string("Hugging Face folder ") + out + ": " + cls + " in " +
           safe_dtype_name(dtype) + " (" + names + ")\nload it with transformers' " + cls +
           ".from_pretrained(\"" + out + "\")\n";
}

}  // namespace

std::string convert_weights(const std::string& in, const std::string& out,
                            const ConvertOptions& options) {
    const Format to = output_format(out);
    if (!options.dtype.empty() && to != Format::hf)
        throw DataError("output " + out + " is " + format_text(to) +
                        ", whose weights are fp32; a dtype applies to a Hugging Face folder only");
    const Format from = input_format(in);
    if (from == to) {
        std::string msg = "input ";
        throw DataError(msg.append(in)
                            .append(" is already ")
                            .append(format_text(from))
                            .append("; give an output of another format: NAME.h5 (Parallax), "
                                    "NAME.bin (llm.c) or a folder (Hugging Face)"));
    }
    Weights w = from == Format::llmc       ? read_llmc(in)
                : from == Format::parallax ? read_parallax(in)
                                           : read_hf(*hf_input(in));
    const std::string wrote = to == Format::parallax ? write_parallax(out, w)
                              : to == Format::llmc   ? write_llmc(out, w)
                                                     : write_hf(out, w, options.dtype);
    return "converted " + w.source + "\n       to " + wrote;
}

}  // namespace px
