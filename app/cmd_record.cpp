// parallax record [CONFIG] --out ref.h5 [--probes GLOB ...] [--stride K] [--steps N] [--set ...]
// Runs the single-device reference with probes and writes a golden trace (validators/trace.h),
// for `parallax validate --golden ref.h5` to check a layout against later.
#include "app/commands.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/io/output_paths.h"
#include "validators/trace.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace px::app {

namespace {

struct RecordOptions {
    std::string config_path, out;
    std::vector<std::string> probes{"**"};
    i64 stride = 1;
    i64 steps = 20;
    std::vector<std::string> sets;
};

int run_record(const RecordOptions& opt) {
    Config cfg = job_config(opt.config_path, opt.sets);
    if (opt.steps < 1 || opt.steps > cfg.train.steps)
        throw ConfigError("--steps " + std::to_string(opt.steps) + " must be in 1..train.steps (" +
                          std::to_string(cfg.train.steps) + ")");
    if (opt.stride < 1) throw ConfigError("--stride " + std::to_string(opt.stride) + " must be at least 1");
    check_output_file(opt.out, "--out");  // before the run, not after it
    cfg.layout = LayoutConfig{.timeout_s = cfg.layout.timeout_s};
    cfg.fault = FaultConfig{};
    cfg.validate = ValidateConfig{};
    cfg.output.run_file = false;
    std::printf("parallax record: %s | %lld of %lld steps, every %lld | probes %s\n",
                cfg.source_name.c_str(), static_cast<long long>(opt.steps),
                static_cast<long long>(cfg.train.steps), static_cast<long long>(opt.stride),
                opt.probes.size() == 1 ? opt.probes[0].c_str() : "(several patterns)");
    std::fflush(stdout);
    const i64 bytes = record_trace(cfg, opt.probes, opt.stride, opt.steps, opt.out);
    const double steps_recorded = static_cast<double>((opt.steps - 1) / opt.stride + 1);
    std::printf("  trace          %s: %.1f MB of probes, %.2f MB per recorded step (file %.1f MB)\n",
                opt.out.c_str(), static_cast<double>(bytes) / 1e6,
                static_cast<double>(bytes) / 1e6 / steps_recorded,
                static_cast<double>(std::filesystem::file_size(opt.out)) / 1e6);
    return kOk;
}

}  // namespace

std::function<int()> add_record_command(CLI::App& app) {
    auto opt = std::make_shared<RecordOptions>();
    CLI::App* sub = app.add_subcommand(
        "record", "Run the single-device reference with probes and write a golden trace (HDF5) to "
                  "validate layouts against later with parallax validate --golden.");
    sub->add_option("config", opt->config_path, "TOML job config (the embedded default when omitted)")
        ->check(CLI::ExistingFile);
    sub->add_option("--out", opt->out, "The trace file to write (.h5)")->required();
    sub->add_option("--probes", opt->probes,
                    "Probe patterns (repeatable): * any run without '/', ** any run, ? one "
                    "character; e.g. '*/fwd/*/attn.*/*'")
        ->capture_default_str();
    sub->add_option("--stride", opt->stride, "Record steps 1, 1+K, 1+2K, ...")->capture_default_str();
    sub->add_option("--steps", opt->steps, "Steps to run and record (at most train.steps)")
        ->capture_default_str();
    sub->add_option("--set", opt->sets, "Override a config key: --set section.key=value (repeatable)")
        ->type_name("KEY=VALUE");
    return [opt] { return run_record(*opt); };
}

}  // namespace px::app
