// Converting GPT-2 weights (parallax convert IN --to OUT, parallax.convert): GPT-2 weights
// between llm.c's checkpoint format and Parallax checkpoints (docs/files.md), in either
// direction; OUT's extension says which.
//
// Index
//   has_suffix, file_name   small helpers
//   llmc_to_parallax        IN an llm.c .bin -> OUT a Parallax checkpoint .h5 (weights, zero Adam
//                           moments, step 0, empty history, the model config from the header)
//   parallax_to_llmc        IN a Parallax checkpoint .h5 (every checksum verified) -> OUT an llm.c
//                           fp32 checkpoint, version 3, as write_llmc_checkpoint writes it
//   convert_weights         either, by OUT's extension
//
// What the input is comes from its first bytes (sniff_weights_file), never from its name. Both
// writers are atomic (a temporary file next to OUT, fsync, rename), so a failed conversion leaves
// OUT as it was. Every error names the file and says what to do; bad input is a DataError (the CLI's
// exit code 2).
//
// A converted checkpoint records in /data source that it came from llm.c and carries no training
// state, so checkpoint.resume refuses it (its data source differs from any run's); it is meant
// for model.init_from, which starts a run from its weights at step 0.
#include "core/io/checkpoint_convert.h"

#include "core/base/arena.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/io/checkpoint_llmc.h"
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

bool has_suffix(const std::string& s, const std::string& suffix) {
    return s.size() > suffix.size() &&
           s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string file_name(const std::string& path) {
    return std::filesystem::path(path).filename().string();
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
    return t;
}

std::string llmc_to_parallax(const std::string& in, const std::string& out) {
    switch (sniff_weights_file(in, "input")) {
        case WeightsFile::llmc:
        case WeightsFile::llmc_tokens:  // read_llmc_header says it holds tokens
            break;
        case WeightsFile::parallax: {
            std::string msg = "input ";
            throw DataError(msg.append(in).append(
                " is already a Parallax checkpoint (HDF5); to write llm.c's format give an output "
                "ending in .bin"));
        }
        case WeightsFile::other: {
            std::string msg = "input ";
            throw DataError(msg.append(in).append(
                " is not an llm.c GPT-2 checkpoint (it does not start with the magic 20240326) "
                "nor a Parallax checkpoint; give an llm.c .bin such as gpt2_124M.bin"));
        }
    }
    const LlmcHeader h = read_llmc_header(in);

    // 1. The model the header describes, in an otherwise default config.
    Config cfg;
    cfg.model = llmc_model_config(h);
    try {
        validate_config(cfg);
    } catch (const ConfigError& e) {
        std::string msg = "llm.c checkpoint ";
        throw DataError(msg.append(in)
                            .append(": its header describes a model Parallax cannot build (")
                            .append(e.what())
                            .append("); the file is corrupt or not a GPT-2 checkpoint"));
    }
    const ModelConfig& mc = cfg.model;

    // 2. The weights, checked (size, finite values) before anything is written.
    LogicalState s;
    s.allocate(mc);
    read_llmc_checkpoint(in, mc, [&s](const std::string& name) -> float* {
        const int i = s.table.find(name);
        return i < 0 ? nullptr : s.params.data() + s.table.entries[static_cast<size_t>(i)].offset;
    });

    // 3. Step 0, empty history, zero moments; the data source says where it came from.
    CheckpointMeta meta = make_checkpoint_meta(cfg, 0, {});
    meta.data_source = "converted from llm.c ";
    meta.data_source.append(file_name(in))
        .append(
            " (weights only, no training state: start a run from it with model.init_from, not "
            "checkpoint.resume)");
    write_checkpoint(out, s, meta, mc);

    return "converted llm.c checkpoint " + in + " (version " + std::to_string(h.version) + ", " +
           model_text(mc) + ", padded vocab " + std::to_string(h.Vp) + ")\n       to Parallax checkpoint " +
           out + ": " + std::to_string(s.table.num_params) +
           " parameters under /model, Adam moments zero, step 0\nstart a run from it with --set "
           "model.init_from=" + out + " (and these model keys)\n";
}

std::string parallax_to_llmc(const std::string& in, const std::string& out) {
    switch (sniff_weights_file(in, "input")) {
        case WeightsFile::parallax:
            break;
        case WeightsFile::llmc: {
            std::string msg = "input ";
            throw DataError(msg.append(in).append(
                " is already an llm.c checkpoint; to make a Parallax checkpoint give an output "
                "ending in .h5"));
        }
        case WeightsFile::llmc_tokens:
        case WeightsFile::other: {
            std::string msg = "input ";
            throw DataError(msg.append(in).append(
                " is not a Parallax checkpoint (it does not start with the HDF5 signature); give "
                "a checkpoint file such as ckpt-00000100.h5"));
        }
    }
    // Some damaged files make HDF5 1.10 leak on its error path, and its shutdown at exit then
    // prints "infinite loop closing library"; convert only reads HDF5, so it need not shut down.
    H5dont_atexit();
    const CheckpointReader r(in);
    r.verify_all();  // every checksum, before anything is written

    // 1. The model, from the checkpoint's config; it must be GPT-2 shaped for llm.c.
    ModelConfig mc;
    try {
        mc = parse_config(r.meta().config_toml, in + " (its config attribute)").model;
    } catch (const ConfigError& e) {
        std::string msg = "checkpoint ";
        throw DataError(msg.append(in)
                            .append(": its config attribute does not parse with this build (")
                            .append(e.what())
                            .append("), so its model's shape is unknown; convert it with the "
                                    "Parallax version that wrote it"));
    }
    r.check_model(mc);
    if (mc.ffn != 4 * mc.hidden) {
        std::string msg = "checkpoint ";
        throw DataError(msg.append(in)
                            .append(" holds a model with model.ffn = ")
                            .append(std::to_string(mc.ffn))
                            .append(", but llm.c's GPT-2 has an MLP of 4 * model.hidden = ")
                            .append(std::to_string(4 * mc.hidden))
                            .append("; only GPT-2-shaped models (ffn = 4 * hidden) can be written "
                                    "in llm.c's format"));
    }
    const i64 limit = std::numeric_limits<std::int32_t>::max();
    if ((mc.vocab + 127) / 128 * 128 > limit || mc.seq_len > limit || mc.hidden > limit ||
        mc.layers > limit || mc.heads > limit) {
        std::string msg = "checkpoint ";
        throw DataError(msg.append(in)
                            .append(" holds a model (")
                            .append(model_text(mc))
                            .append(") too large for llm.c's int32 header; it cannot be written "
                                    "in llm.c's format"));
    }

    // 2. The weights (verified above); llm.c refuses non-finite values, so they are refused here.
    const ParamTable table = ParamTable::build(mc);
    std::vector<float> w(static_cast<size_t>(table.total), 0.0f);
    for (const TableEntry& e : table.entries) {
        float* dst = w.data() + e.offset;
        r.read(model_dataset(e.name), dst);
        for (i64 i = 0; i < e.numel(); i++)
            if (!std::isfinite(dst[i])) {
                std::string msg = "checkpoint ";
                throw DataError(msg.append(in)
                                    .append(": /model/")
                                    .append(e.name)
                                    .append(" holds a non-finite value at element ")
                                    .append(std::to_string(i))
                                    .append(" (the run that wrote it diverged); llm.c cannot use "
                                            "it: convert an earlier checkpoint"));
            }
    }

    // 3. Version 3, padded vocabulary rows zero, maxT = seq_len; atomically.
    write_llmc_checkpoint(out, mc, [&](const std::string& name) -> float* {
        const int i = table.find(name);
        return i < 0 ? nullptr : w.data() + table.entries[static_cast<size_t>(i)].offset;
    });
    return "converted Parallax checkpoint " + in + " (step " + std::to_string(r.meta().step) + ", " +
           model_text(mc) + ", " + std::to_string(table.num_params) +
           " parameters)\n       to llm.c checkpoint " + out + " (version 3, fp32, padded vocab " +
           std::to_string((mc.vocab + 127) / 128 * 128) + ")\n";
}

}  // namespace

std::string convert_weights(const std::string& in, const std::string& out) {
    if (has_suffix(out, ".h5")) return llmc_to_parallax(in, out);
    if (has_suffix(out, ".bin")) return parallax_to_llmc(in, out);
    std::string msg = "output ";
    throw DataError(msg.append(out).append(
        " has an extension convert does not know; end it in .h5 to write a Parallax "
        "checkpoint or in .bin to write an llm.c checkpoint"));
}

}  // namespace px
