// bench_validate: what parallax validate's comparison costs per step (validators/validate.h).
// One layout of a job trained twice for the same steps: alone (run_layout, nothing compared),
// and under validate_layouts against the single-device reference (its turns timed as the
// layout's; the reference's own steps are timed apart). The difference is what comparing every
// rank's pieces after every step costs.
//
//   build/bench/bench_validate [config.toml] [--layout L] [--steps N] [--set key=value ...]
//
// Defaults: the embedded default job, dp2xtp2xpp2, 2 steps, bitwise. For GPT-2 124M:
//   build/bench/bench_validate examples/gpt2-124m.toml --set numerics.mode=bitwise
//
// Prints seconds per step of the plain layout, of the validated layout and of the reference, the
// comparison's cost per step (validated − plain) and the process's peak resident memory. Checks
// its result: the layout matches the reference (exit 1 otherwise).
#include "core/base/config.h"
#include "core/train/runner.h"
#include "validators/validate.h"

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

using namespace px;

namespace {

double peak_rss_gib() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss: KiB on Linux
}

int run(int argc, char** argv) {
    std::string path, layout = "dp2xtp2xpp2";
    i64 steps = 2;
    std::vector<std::string> sets;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        const bool has_value = i + 1 < argc;
        if (a == "--layout" && has_value)
            layout = argv[++i];
        else if (a == "--steps" && has_value)
            steps = std::atoll(argv[++i]);
        else if (a == "--set" && has_value)
            sets.emplace_back(argv[++i]);
        else if (a.rfind("--", 0) != 0 && path.empty())
            path = a;
        else {
            std::fprintf(stderr, "bench_validate: unknown option %s; use [config.toml] --layout L "
                                 "--steps N --set key=value\n", a.c_str());
            return 2;
        }
    }
    Config c = path.empty() ? parse_config(default_config_toml(), "bench_validate") : load_config(path);
    c.numerics.mode = Mode::bitwise;
    apply_overrides(c, sets);
    c.train.steps = steps;
    c.train.eval_every = 0;
    c.output.run_file = false;
    c.output.progress = false;
    const LayoutSpec spec = parse_layout(layout);

    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    run_layout(with_layout(c, spec));
    const double plain = std::chrono::duration<double>(Clock::now() - t0).count();
    const double plain_rss = peak_rss_gib();

    const ValidationReport rep = validate_layouts(c, {spec}, steps);
    const LayoutResult& r = rep.layouts.at(0);
    const double n = static_cast<double>(steps);
    std::printf("bench_validate: %s, layout %s, %lld steps, bitwise\n",
                path.empty() ? "the embedded default" : path.c_str(), layout.c_str(),
                static_cast<long long>(steps));
    std::printf("  plain layout       %8.3f s/step  (peak memory %.1f GiB)\n", plain / n, plain_rss);
    std::printf("  validated layout   %8.3f s/step\n", r.seconds / n);
    std::printf("  reference          %8.3f s/step\n", rep.reference_seconds / n);
    std::printf("  comparison         %+8.3f s/step  (%.2fx the plain layout's step)\n",
                (r.seconds - plain) / n, r.seconds / plain);
    std::printf("  peak memory        %8.1f GiB (the whole process)\n", peak_rss_gib());
    std::printf("  verdict            %s%s%s\n", r.verdict.c_str(), r.error.empty() ? "" : ": ",
                r.error.c_str());
    return r.verdict == "match" ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_validate: %s\n", e.what());
        return 2;
    }
}
