// parallax inspect PATH: a checkpoint's contents with every checksum verified, or a folder's
// checkpoints, newest first, with their validity. Exit 0 when everything verifies, 2 otherwise.
#include "app/commands.h"
#include "core/io/checkpoint.h"
#include "core/base/config.h"
#include "core/base/error.h"

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <hdf5.h>

namespace px::app {

namespace {

std::string shape_text(const std::vector<i64>& s) {
    std::string t = "(";
    for (size_t i = 0; i < s.size(); i++) t.append(i ? ", " : "").append(std::to_string(s[i]));
    return t + (s.size() == 1 ? ",)" : ")");
}

std::string mib(double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1024.0 * 1024.0));
    return buf;
}

std::string bytes_of(const std::string& path) {
    std::error_code ec;
    const auto n = std::filesystem::file_size(path, ec);
    return ec ? std::string("?") : mib(static_cast<double>(n));
}

i64 element_bytes(const std::string& dtype) {
    return dtype == "float32" ? 4 : dtype == "float64" || dtype == "int64" || dtype == "uint64" ? 8 : 0;
}

void print_config_summary(const CheckpointMeta& m) {
    try {
        const Config c = parse_config(m.config_toml, "checkpoint config");
        std::printf("model:    L=%lld C=%lld NH=%lld F=%lld V=%lld T=%lld\n",
                    static_cast<long long>(c.model.layers), static_cast<long long>(c.model.hidden),
                    static_cast<long long>(c.model.heads), static_cast<long long>(c.model.ffn),
                    static_cast<long long>(c.model.vocab), static_cast<long long>(c.model.seq_len));
        std::printf("layout:   dp%d pp%d tp%d zero%d (written layout-free)\n", c.layout.dp,
                    c.layout.pp, c.layout.tp, c.layout.zero);
        std::printf("train:    %lld steps, batch %lld, lr %g, %s\n",
                    static_cast<long long>(c.train.steps), static_cast<long long>(c.train.batch_size),
                    c.train.lr, mode_name(c.numerics.mode));
    } catch (const ConfigError& e) {
        std::printf("config:   does not parse with this build (%s)\n", e.what());
    }
}

// One file: returns the number of datasets that failed (0: all verified).
int inspect_file(const std::string& path) {
    const CheckpointReader r(path);
    const CheckpointMeta& m = r.meta();
    std::printf("checkpoint %s (%s)\n", path.c_str(), bytes_of(path).c_str());
    std::printf("format:   %s, version %lld (written by parallax %s, %s)\n", kCheckpointFormat,
                static_cast<long long>(kCheckpointVersion), m.parallax_version.c_str(),
                m.created.c_str());
    std::printf("step:     %lld (adam step %lld), seed %llu\n", static_cast<long long>(m.step),
                static_cast<long long>(m.adam_step), static_cast<unsigned long long>(m.seed));
    print_config_summary(m);
    std::printf("data:     %s, next step %lld\n", m.data_source.c_str(),
                static_cast<long long>(m.data_next_step));
    if (!m.source_dtype.empty())
        std::printf("source:   Hugging Face weights stored as %s\n", m.source_dtype.c_str());
    std::printf("rng:      philox4x32-10, counter base %lld\n",
                static_cast<long long>(m.rng_counter_base));
    std::printf("scaler:   loss scale %g, growth tracker %lld (%s)\n", m.loss_scale,
                static_cast<long long>(m.growth_tracker),
                m.loss_scale_dynamic ? "dynamic loss scaling: fp16" : "no dynamic loss scaling");
    if (m.fp8_gemms > 0)
        std::printf("fp8:      delayed scaling of %lld matmuls, amax histories of %lld steps\n",
                    static_cast<long long>(m.fp8_gemms), static_cast<long long>(m.fp8_history_len));
    if (!m.history.empty()) {
        const StepMetrics& last = m.history.back();
        std::printf("history:  %zu steps, last loss %.6f grad norm %.6f lr %g\n", m.history.size(),
                    last.loss, last.grad_norm, last.lr);
    } else {
        std::printf("history:  empty\n");
    }
    std::printf("\n%-44s %-14s %-8s %-18s %s\n", "dataset", "shape", "dtype", "checksum", "status");
    int bad = 0;
    i64 elements = 0, bytes = 0;
    std::string first_problem;
    const std::vector<DatasetCheck> checks = r.check_all();
    for (const DatasetCheck& c : checks) {
        char sum[24];
        std::snprintf(sum, sizeof sum, "%016llx", static_cast<unsigned long long>(c.info.checksum));
        std::printf("/%-43s %-14s %-8s %-18s %s\n", c.info.path.c_str(),
                    shape_text(c.info.shape).c_str(), c.info.dtype.c_str(),
                    c.info.has_checksum ? sum : "(none)", c.ok ? "ok" : "MISMATCH");
        elements += c.info.numel();
        bytes += c.info.numel() * element_bytes(c.info.dtype);
        if (!c.ok) {
            bad++;
            if (first_problem.empty()) first_problem = c.problem;
        }
    }
    std::printf("\n%zu datasets, %lld elements, %s of data; %zu verified, %d failed\n",
                checks.size(), static_cast<long long>(elements), mib(static_cast<double>(bytes)).c_str(),
                checks.size() - static_cast<size_t>(bad), bad);
    if (bad > 0)
        throw CheckpointError(first_problem + (bad > 1 ? " (and " + std::to_string(bad - 1) +
                                                             " more datasets fail)"
                                                       : std::string()));
    return 0;
}

int inspect_folder(const std::string& dir) {
    const std::vector<CheckpointFile> files = list_checkpoints(dir);
    std::printf("checkpoints in %s, newest first:\n", dir.c_str());
    int good = 0, bad = 0;
    std::string first_problem;
    for (const CheckpointFile& f : files) {
        const std::string name = std::filesystem::path(f.path).filename().string();
        if (f.temp) {
            std::printf("  %-32s unfinished write (temporary file), ignored by resume\n", name.c_str());
            continue;
        }
        try {
            const CheckpointReader r(f.path);
            r.verify_all();
            std::printf("  %-32s step %-10lld %-12s ok\n", name.c_str(),
                        static_cast<long long>(r.meta().step), bytes_of(f.path).c_str());
            good++;
        } catch (const Error& e) {
            std::printf("  %-32s INVALID: %s\n", name.c_str(), e.what());
            if (first_problem.empty()) first_problem = e.what();
            bad++;
        }
    }
    std::printf("%d valid, %d invalid\n", good, bad);
    if (good + bad == 0)
        throw CheckpointError("checkpoint folder " + dir +
                              ": holds no checkpoints (ckpt-<step>.h5); check checkpoint.dir");
    if (bad > 0)
        throw CheckpointError(std::to_string(bad) + " of the checkpoints in " + dir +
                              " fail verification; resume would skip them. First: " + first_problem);
    return 0;
}

}  // namespace

std::function<int()> add_inspect_command(CLI::App& app) {
    auto path = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand(
        "inspect", "List a checkpoint's contents and verify every checksum (or, for a folder, "
                   "its checkpoints newest first with their validity). Exit 0 when all verify, "
                   "2 otherwise.");
    cmd->add_option("PATH", *path, "a checkpoint file (ckpt-<step>.h5) or a folder of them")
        ->required();
    return [path]() -> int {
        // Some damaged files make HDF5 1.10 leak internally on its error path, and then its
        // shutdown at exit prints "infinite loop closing library"; inspect only reads, so the
        // library need not shut down (a no-op if HDF5 is already in use).
        H5dont_atexit();
        std::error_code ec;
        if (std::filesystem::is_directory(*path, ec)) return inspect_folder(*path);
        return inspect_file(*path);
    };
}

}  // namespace px::app
