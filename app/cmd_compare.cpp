// parallax compare REF.h5 RUN.h5 [--json F]
// Two traces op by op under the error budget (validators/trace_compare.h): the reference (a
// golden trace of Parallax's single device, or a single-device PyTorch run recorded by
// parallax.torch) against a run of the same model, weights and tokens in any layout or framework.
// Exit 0 consistent with rounding, 3 a probe over its budget, 2 bad input.
#include "app/commands.h"
#include "core/base/error.h"
#include "core/io/output_paths.h"
#include "validators/trace_compare.h"

#include <cstdio>
#include <memory>
#include <string>

namespace px::app {

namespace {

struct CompareOptions {
    std::string ref, run, json;
};

int run_compare(const CompareOptions& opt) {
    if (!opt.json.empty()) check_output_file(opt.json, "--json");  // before the work, not after
    const TraceReader ref(opt.ref), run(opt.run);
    std::printf("parallax compare: %s against %s\n", opt.run.c_str(), opt.ref.c_str());
    std::fflush(stdout);
    const TraceComparison tc = compare_traces(ref, run);
    std::fputs(tc.text().c_str(), stdout);
    if (!opt.json.empty()) {
        write_report(opt.json, tc.json() + "\n");
        std::printf("report: %s\n", opt.json.c_str());
    }
    return tc.within() ? kOk : kRunFailed;
}

}  // namespace

std::function<int()> add_compare_command(CLI::App& app) {
    auto opt = std::make_shared<CompareOptions>();
    CLI::App* sub = app.add_subcommand(
        "compare", "Compare a run's trace with a reference trace op by op, each difference "
                   "judged against what reordering sums can explain (the error budget).");
    sub->add_option("reference", opt->ref,
                    "The reference trace (.h5): parallax record, or a single-device run "
                    "recorded by parallax.torch")
        ->required();
    sub->add_option("run", opt->run, "The trace of the run to check (.h5), same model, weights "
                                     "and tokens")
        ->required();
    sub->add_option("--json", opt->json, "Also write every probe's row and the verdict as JSON");
    return [opt] { return run_compare(*opt); };
}

}  // namespace px::app
