// parallax check determinism [CONFIG] [--set section.key=value ...]
// parallax check resume [CONFIG] [--at K] [--to-layout dpNxtpNxppN[xzN]] [--to-set k=v ...]
//                       [--set section.key=value ...]
// Runs a config twice and compares the final states (determinism), or runs it uninterrupted and
// from a checkpoint after step K, resumed (under another layout, or other settings) to the end
// (resume); validators/determinism.h. Prints one line per differing tensor; exit 0 equal, 3
// differ, 2 bad input.
#include "app/commands.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "validators/determinism.h"
#include "validators/validate.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace px::app {

namespace {

struct CheckOptions {
    std::string config_path;
    std::vector<std::string> sets;
    i64 at = kHalfway;
    std::string to_layout;
    std::vector<std::string> to_sets;
};

Config load(const CheckOptions& opt) {
    Config cfg = job_config(opt.config_path, opt.sets);
    return cfg;
}

int report(const StateCheck& r) {
    std::printf("%s", r.text().c_str());
    std::fflush(stdout);
    return r.equal() ? kOk : kRunFailed;
}

int run_determinism(const CheckOptions& opt) {
    const Config cfg = load(opt);
    return report(check_determinism(cfg));
}

int run_resume(const CheckOptions& opt) {
    const Config cfg = load(opt);
    Config to = cfg;
    if (!opt.to_layout.empty()) to = with_layout(to, parse_layout(opt.to_layout));
    apply_overrides(to, opt.to_sets);
    return report(check_resume(cfg, opt.at, to));
}

void add_common(CLI::App* sub, CheckOptions& opt) {
    sub->add_option("config", opt.config_path,
                    "TOML job config (default: the embedded job; mind its train.steps)")
        ->check(CLI::ExistingFile);
    sub->add_option("--set", opt.sets,
                    "Override a config key: --set section.key=value (repeatable)")
        ->type_name("KEY=VALUE")
        ->allow_extra_args(false);
}

}  // namespace

std::function<int()> add_check_command(CLI::App& app) {
    auto opt = std::make_shared<CheckOptions>();
    CLI::App* sub = app.add_subcommand(
        "check",
        "Check that a job is reproducible: run twice (determinism), or resumed from a "
        "checkpoint (resume); bit for bit");
    sub->require_subcommand(1);

    CLI::App* det =
        sub->add_subcommand("determinism",
                            "Run the config twice under its layout in this process and compare the "
                            "final weights, Adam moments, losses and grad norms bit for bit");
    add_common(det, *opt);

    CLI::App* res = sub->add_subcommand(
        "resume",
        "Run the config uninterrupted, and again from its checkpoint after step K "
        "resumed to the end (optionally under another layout); compare bit for bit");
    add_common(res, *opt);
    res->add_option("--at", opt->at, "The checkpoint's step, 1 <= K < train.steps (default: half)")
        ->type_name("K");
    res->add_option("--to-layout", opt->to_layout,
                    "Resume under this layout: parts joined by 'x', each dp<N>, tp<N>, pp<N> or "
                    "z<N> (ZeRO stage), e.g. dp2xtp2")
        ->type_name("SPEC");
    res->add_option("--to-set", opt->to_sets,
                    "Override a key of the resumed run only (repeatable): --to-set train.lr=1e-3")
        ->type_name("KEY=VALUE")
        ->allow_extra_args(false);

    return [opt, det, res]() {
        if (det->parsed()) return run_determinism(*opt);
        if (res->parsed()) return run_resume(*opt);
        return static_cast<int>(kBadInput);
    };
}

}  // namespace px::app
