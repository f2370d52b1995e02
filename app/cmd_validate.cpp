// parallax validate [CONFIG] --layouts dp2,tp2,pp2,dp2xtp2xpp2 [--steps N] [--mode bitwise|fast]
//                   [--golden TRACE.h5] [--set section.key=value ...] [--json FILE] [--md FILE]
// Runs the single-device reference and each layout, compares them after every step, prints the
// table and writes the JSON and Markdown reports (validators/validate.h). With --golden, each
// layout is checked against a recorded trace instead (validators/trace.h); under mpirun this
// process is one rank of the one layout given, and rank 0 reports.
#include "app/commands.h"
#include "core/comm/mpi.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/io/output_paths.h"
#include "core/train/runner.h"
#include "validators/trace.h"
#include "validators/validate.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace px::app {

namespace {

struct ValidateOptions {
    std::string config_path;
    std::string layouts = "dp2,tp2,pp2,dp2xtp2xpp2";
    i64 steps = 20;
    std::string mode;
    std::vector<std::string> sets;
    std::string json, md, out_dir;
    std::string golden;
};

void print_layout(const LayoutResult& r) {
    std::fprintf(stderr, "  %s: %s (%lld steps, %.1f s)\n", r.layout.c_str(), r.verdict.c_str(),
                 static_cast<long long>(r.steps), r.seconds);
    std::fflush(stderr);
}

// A Comparison as numbers and text, to travel from the rank that found it to rank 0.
// Under mpirun: this process is one rank of the layout; every rank compares its own pieces with
// the trace, and the first difference over the ranks (the earliest probe, then the lowest rank)
// travels to rank 0.
ValidationReport validate_golden_mpi(const Config& cfg, const LayoutSpec& spec,
                                     const TraceReader& trace, const comm::MpiEnvironment& mpi) {
    const TraceInfo& t = trace.info();
    Config c = cfg;
    c.train.steps = parse_config(t.config_toml, trace.path()).train.steps;
    check_trace_config(t, c, trace.path());
    c = with_layout(c, spec);
    c.output.run_file = false;
    c.checkpoint = CheckpointConfig{};
    c.train.threads = threads_per_rank(c, comm::local_ranks());
    const std::unique_ptr<comm::Communicator> world = mpi.world(c.layout.timeout_s);
    ProbeRecorder rec(t.patterns, t.stride);
    rec.exclude({"*/mgrad/**"});
    LayoutResult r;
    r.layout = spec.name;
    try {
        RunHooks hooks;
        hooks.setup = [&](Job& job) {
            job.set_probes(&rec);
            job.stop_after(t.steps);
        };
        run_rank(c, *world, {}, hooks);
    } catch (const std::exception& e) {
        world->abort("rank " + std::to_string(mpi.rank()) + " failed: " + e.what());
        throw;
    }
    const GoldenResult total =
        combine_golden(compare_to_trace(trace, {&rec}, world->rank(), false), trace, rec, *world);
    ValidationReport rep;
    rep.job = cfg.source_name + " against " + trace.path();
    rep.mode = "bitwise";
    rep.steps = t.steps;
    if (world->rank() == 0) {
        set_golden_result(r, total, t.steps);
    } else {  // the verdict only: rank 0 holds the comparison
        r.verdict = total.first_order < 0 && total.probes > 0 ? "match" : "diverged";
    }
    rep.layouts.push_back(r);
    return rep;
}

int run_validate(const ValidateOptions& opt, const comm::MpiEnvironment* mpi) {
    std::vector<std::string> sets = opt.sets;
    if (!opt.mode.empty()) sets.push_back("numerics.mode=" + opt.mode);
    Config cfg = job_config(opt.config_path, sets);
    if (!opt.out_dir.empty()) cfg.output.dir = opt.out_dir;
    if (opt.steps < 1)
        throw ConfigError("--steps " + std::to_string(opt.steps) + ": validate at least one step");
    // The reports' paths are checked before anything runs (a folder is created when missing).
    const std::string json =
        opt.json.empty() ? (std::filesystem::path(cfg.output.dir) / "validate.json").string()
                         : opt.json;
    const std::string md =
        opt.md.empty() ? (std::filesystem::path(cfg.output.dir) / "validate.md").string() : opt.md;
    if (opt.json.empty() || opt.md.empty()) check_output_folder(cfg.output.dir, "output.dir");
    check_output_file(json, opt.json.empty() ? "the JSON report" : "--json");
    check_output_file(md, opt.md.empty() ? "the Markdown report" : "--md");
    const std::vector<LayoutSpec> layouts = parse_layouts(opt.layouts);
    for (const LayoutSpec& l : layouts) {
        try {
            Config c = cfg;
            c.train.steps = opt.steps;
            with_layout(c, l);
        } catch (const ConfigError& e) {
            throw ConfigError("layout " + l.name + ": " + e.what());
        }
    }
    ValidationReport rep;
    if (!opt.golden.empty()) {
        const TraceReader trace(opt.golden);
        if (mpi) {
            if (layouts.size() != 1)
                throw ConfigError(
                    "under mpirun, --layouts names the one layout this job's ranks run");
            rep = validate_golden_mpi(cfg, layouts[0], trace, *mpi);
            if (mpi->rank() != 0) return rep.all_ok() ? kOk : kDiverged;
        } else {
            std::printf("parallax validate: %s | against the golden trace %s (%lld steps)\n",
                        cfg.source_name.c_str(), opt.golden.c_str(),
                        static_cast<long long>(trace.info().steps));
            std::fflush(stdout);
            rep = validate_golden(cfg, layouts, trace, &print_layout);
        }
    } else {
        if (mpi)
            throw ConfigError(
                "under mpirun, parallax validate checks a layout against a golden "
                "trace: record one with parallax record and pass --golden");
        std::printf("parallax validate: %s | %lld steps | %s | reference: the single device\n",
                    cfg.source_name.c_str(), static_cast<long long>(opt.steps),
                    cfg.numerics.mode == Mode::fast ? "fast (error budget)" : "bitwise");
        std::fflush(stdout);
        rep = validate_layouts(cfg, layouts, opt.steps, &print_layout);
    }
    std::printf("\n%s", rep.table().c_str());
    write_report(json, rep.to_json());
    write_report(md, rep.to_markdown());
    std::printf("\nreports: %s, %s\n", json.c_str(), md.c_str());
    if (rep.any_error()) return kRunFailed;
    return rep.all_ok() ? kOk : kDiverged;
}

}  // namespace

std::function<int()> add_validate_command(CLI::App& app, const comm::MpiEnvironment* mpi) {
    auto opt = std::make_shared<ValidateOptions>();
    CLI::App* sub = app.add_subcommand(
        "validate",
        "Run the single-device reference and each parallel layout of a job, compare them after "
        "every step, print a table and write JSON and Markdown reports.");
    sub->add_option("config", opt->config_path,
                    "TOML job config (the embedded default when omitted)")
        ->check(CLI::ExistingFile);
    sub->add_option("--layouts", opt->layouts,
                    "Comma-separated layouts, parts joined by 'x': dpN, tpN, ppN, cpN (context "
                    "parallel), zN (ZeRO stage), mbN (microbatches), sp (sequence parallel), "
                    "ulysses (cp's all-to-all method)")
        ->capture_default_str()
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // a later one wins
    sub->add_option("--steps", opt->steps, "Steps to run and compare")
        ->capture_default_str()
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
    sub->add_option("--mode", opt->mode,
                    "bitwise: every layout must match bit for bit; fast: the layouts run fast "
                    "kernels and ring collectives and are judged by the error budget (in bf16, "
                    "fp16 and fp8 it also allows the precision's own error, measured against the "
                    "same job in fp32)")
        ->check(CLI::IsMember({"bitwise", "fast"}));
    sub->add_option("--set", opt->sets,
                    "Override a config key: --set section.key=value (repeatable)")
        ->type_name("KEY=VALUE");
    sub->add_option("--json", opt->json, "JSON report (default <output.dir>/validate.json)");
    sub->add_option("--md", opt->md, "Markdown report (default <output.dir>/validate.md)");
    sub->add_option("--out", opt->out_dir, "Output directory (overrides output.dir)");
    sub->add_option("--golden", opt->golden,
                    "Check each layout against this golden trace (parallax record) instead of "
                    "running the reference; under mpirun, the one layout the ranks run")
        ->check(CLI::ExistingFile);
    sub->footer(
        "Exit codes: 0 every layout matched (bitwise) or stayed within its error budget (fast); "
        "6 a layout diverged; 3 a layout could not run; 2 bad input.");
    return [opt, mpi] { return run_validate(*opt, mpi); };
}

}  // namespace px::app
