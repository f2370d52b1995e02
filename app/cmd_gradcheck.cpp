// parallax gradcheck [CONFIG] [--op NAME|all ...] [--model] [--set section.key=value ...]
//                    [--json FILE]
// fp64 central finite-difference checks (validators/gradcheck.h): each CPU op's fp32 backward
// on small generated inputs, and the whole model's loss gradient (the config's model, scaled
// down when it is too large for the fp64 reference to difference in seconds). Prints a table;
// exit 0 when every check passes, 3 when any fails, 2 on bad input.
#include "app/commands.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/io/output_paths.h"
#include "validators/gradcheck.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace px::app {

namespace {

struct GradcheckOptions {
    std::string config_path;
    std::vector<std::string> ops;  // empty: every op (unless only --model)
    bool model = false;
    std::vector<std::string> sets;
    std::string json;
};

int run_gradcheck(const GradcheckOptions& opt) {
    // Which checks: no --op and no --model means both, every op.
    const bool any_op = !opt.ops.empty(), do_model = opt.model || !any_op;
    std::vector<std::string> ops;
    if (!any_op && !opt.model) ops = gradcheck::op_names();
    for (const std::string& name : opt.ops) {
        if (name == "all") {
            ops = gradcheck::op_names();
            break;
        }
        try {
            gradcheck::find_op(name);
        } catch (const ConfigError& e) {
            std::fprintf(stderr, "parallax gradcheck: %s\n", e.what());
            return kBadInput;
        }
        ops.push_back(name);
    }

    Config cfg = job_config(opt.config_path, opt.sets);
    const Numerics nx = make_numerics(cfg.numerics);
    if (!opt.json.empty()) check_output_file(opt.json, "--json");  // before the checks run

    std::printf("parallax gradcheck: fp64 central finite differences | %s numerics, %s\n",
                mode_name(nx.mode), isa_name(nx.isa));
    gradcheck::GradcheckReport report;
    if (!ops.empty()) {
        std::printf(
            "ops: every element of each op's small generated inputs; bound: the kernel's "
            "fp32 rounding (error-bound arithmetic) plus the difference's own error\n");
        for (const std::string& name : ops)
            for (gradcheck::GradcheckRow& row : gradcheck::gradcheck_op(name, nx))
                report.rows.push_back(std::move(row));
    }
    if (do_model) {
        std::string note;
        const ModelConfig mc = gradcheck::scaled_model(cfg.model, &note);
        gradcheck::ModelFdOptions o;
        std::printf(
            "model: %s | L=%lld C=%lld NH=%lld F=%lld V=%lld | %d x %lld tokens, random "
            "weights, %d elements per tensor\n",
            cfg.source_name.c_str(), static_cast<long long>(mc.layers),
            static_cast<long long>(mc.hidden), static_cast<long long>(mc.heads),
            static_cast<long long>(mc.ffn), static_cast<long long>(mc.vocab), o.B,
            static_cast<long long>(mc.seq_len), o.samples);
        if (!note.empty()) {
            std::string line = "the config's model is scaled down for the fp64 reference: ";
            line += note;
            std::printf("model: %s\n", line.c_str());
            report.notes.push_back(line);
        }
        for (gradcheck::GradcheckRow& row : gradcheck::gradcheck_model(mc, nx, o))
            report.rows.push_back(std::move(row));
    }
    std::printf("\n%s", report.table().c_str());
    std::fflush(stdout);

    if (!opt.json.empty()) {
        std::ofstream out(opt.json);
        out << report.to_json();
        out.close();
        if (!out) {
            std::fprintf(stderr,
                         "parallax gradcheck: cannot write %s; give a writable path to --json\n",
                         opt.json.c_str());
            return kBadInput;
        }
    }
    return report.pass() ? kOk : kRunFailed;
}

}  // namespace

std::function<int()> add_gradcheck_command(CLI::App& app) {
    auto opt = std::make_shared<GradcheckOptions>();
    CLI::App* sub =
        app.add_subcommand("gradcheck",
                           "Check gradients against fp64 central finite differences: every op's "
                           "backward, and the whole model's loss gradient");
    sub->add_option("config", opt->config_path,
                    "TOML job config: its model and numerics (default: the embedded job)")
        ->check(CLI::ExistingFile);
    std::string names = "An op to check (repeatable), or 'all':";
    for (const std::string& n : gradcheck::op_names()) {
        names += " ";
        names += n;
    }
    sub->add_option("--op", opt->ops, names)->type_name("NAME")->allow_extra_args(false);
    sub->add_flag("--model", opt->model,
                  "Check the whole model (with --op: both; with neither: every op and the model)");
    sub->add_option("--set", opt->sets,
                    "Override a config key: --set section.key=value (repeatable)")
        ->type_name("KEY=VALUE")
        ->allow_extra_args(false);
    sub->add_option("--json", opt->json, "Also write the report as JSON to this file");
    return [opt]() { return run_gradcheck(*opt); };
}

}  // namespace px::app
