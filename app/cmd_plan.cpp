// parallax plan CONFIG --gpus N --cluster FILE.toml [--top K] [--json F] [--calibrate RUN.h5]
// Which layout for N devices of a cluster, how much memory per device, what step time and MFU
// (planner/plan.h, docs/planner.md). Exit 0 with a plan; 2 on bad input or when no layout fits.
#include "app/commands.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/io/output_paths.h"
#include "core/train/memory.h"
#include "validators/plan/calibrate.h"
#include "validators/plan/cluster.h"
#include "validators/plan/plan.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace px::app {

namespace {

struct PlanCmdOptions {
    std::string config, cluster, json;
    int gpus = 0, top = 10;
    std::vector<std::string> calibrate, sets;
};

std::string plan_gib(double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
    return buf;
}

using plan::format_seconds;

// The best's largest terms beside the runner-up's, and the terms that differ most.
std::string why_best(const plan::Candidate& a, const plan::Candidate& b) {
    std::string s = "why " + a.label() + " wins over the runner-up " + b.label() + ": step " +
                    format_seconds(a.time.step) + " vs " + format_seconds(b.time.step) + "\n";
    std::vector<const plan::TimeTermName*> order;
    for (const plan::TimeTermName& t : plan::kTimeTerms) order.push_back(&t);
    std::sort(order.begin(), order.end(), [&](const plan::TimeTermName* x, const plan::TimeTermName* y) {
        return a.time.*(x->field) > a.time.*(y->field);
    });
    s += "  its largest terms:";
    for (size_t i = 0; i < 3 && i < order.size(); i++)
        s += std::string(i ? "," : "") + " " + order[i]->name + " " + format_seconds(a.time.*(order[i]->field)) +
             " (runner-up " + format_seconds(b.time.*(order[i]->field)) + ")";
    s += "\n";
    std::sort(order.begin(), order.end(), [&](const plan::TimeTermName* x, const plan::TimeTermName* y) {
        return b.time.*(x->field) - a.time.*(x->field) > b.time.*(y->field) - a.time.*(y->field);
    });
    s += "  where it gains:";
    int n = 0;
    for (const plan::TimeTermName* t : order) {
        const double d = b.time.*(t->field) - a.time.*(t->field);
        if (d <= 0 || n == 3) break;
        s += std::string(n++ ? "," : "") + " " + t->name + " -" + format_seconds(d);
    }
    if (n == 0) s += " nothing: it ties";
    s += "\n";
    return s;
}

int run_plan(const PlanCmdOptions& opt) {
    if (!opt.json.empty()) check_output_file(opt.json, "--json");
    const Config cfg = job_config(opt.config, opt.sets);
    plan::ClusterSpec cluster = plan::load_cluster(opt.cluster);
    if (!opt.calibrate.empty()) {
        const plan::Calibration cal = plan::calibrate(cluster, opt.calibrate);
        std::fputs(plan::text(cluster, cal).c_str(), stdout);
        cluster = plan::apply(cluster, cal);
    }
    plan::PlanOptions po;
    po.gpus = opt.gpus;
    const plan::Plan p = plan::plan_layouts(cfg, cluster, po);
    const plan::ModelFlops f = plan::model_flops(cfg.model);
    std::printf("parallax plan: %s on %d x %s (%s)\n", cfg.source_name.c_str(), opt.gpus,
                cluster.name.c_str(), cluster.source.c_str());
    std::printf("model: %.4g B matmul parameters, %lld layers, batch %lld x %lld tokens, %s; "
                "%zu layouts, %d refused by the runtime's rules, %d fit in %s\n",
                f.matmul_params / 1e9, static_cast<long long>(cfg.model.layers),
                static_cast<long long>(cfg.train.batch_size),
                static_cast<long long>(cfg.model.seq_len),
                cfg.precision.fp8 != "off" ? "fp8" : cfg.precision.activations.c_str(),
                p.candidates.size(), p.rejected, p.fitting, plan_gib(p.usable_bytes).c_str());
    if (!opt.json.empty()) write_report(opt.json, plan::plan_json(p) + "\n");
    if (p.fitting == 0) {
        const plan::Candidate& c = p.candidates.front();  // the smallest
        const MemoryItem* big = &c.memory.front();
        for (const MemoryItem& i : c.memory)
            if (i.bytes > big->bytes) big = &i;
        throw ConfigError(cfg.source_name + ": no layout of " + std::to_string(opt.gpus) +
                          " devices fits in " + plan_gib(p.usable_bytes) + " per device (" +
                          cluster.source + "): the smallest, " + c.label() + ", needs " +
                          plan_gib(c.memory_bytes) + ", most of it " + big->what + " (" +
                          plan_gib(big->bytes) + "); use more devices, a smaller batch or model, or "
                                            "a cluster with more memory");
    }
    std::printf("\n%3s  %-42s %10s %10s %9s %9s %9s %9s %9s %6s %11s\n", "#", "layout", "mem/GPU",
                "step", "compute", "tp comm", "bubble", "dp exp.", "other", "MFU", "tokens/s");
    for (int i = 0; i < std::min(opt.top, p.fitting); i++) {
        const plan::Candidate& c = p.candidates[static_cast<size_t>(i)];
        const plan::TimeTerms& t = c.time;
        std::printf("%3d  %-42s %10s %10s %9s %9s %9s %9s %9s %5.1f%% %11.4g\n", i + 1,
                    c.label().c_str(), plan_gib(c.memory_bytes).c_str(), format_seconds(t.step).c_str(),
                    format_seconds(t.compute).c_str(), format_seconds(t.tp_comm).c_str(), format_seconds(t.bubble).c_str(),
                    format_seconds(t.dp_exposed).c_str(),
                    format_seconds(t.pp_comm + t.gather_exposed + t.update + t.other).c_str(), 100 * c.mfu,
                    c.tokens_per_s);
    }
    std::printf("\n");
    if (p.fitting >= 2) std::fputs(why_best(p.candidates[0], p.candidates[1]).c_str(), stdout);
    if (!opt.json.empty()) std::printf("plan: %s (every candidate and its terms)\n", opt.json.c_str());
    return kOk;
}

}  // namespace

std::function<int()> add_plan_command(CLI::App& app) {
    auto opt = std::make_shared<PlanCmdOptions>();
    CLI::App* sub = app.add_subcommand(
        "plan", "Choose a layout for N devices of a cluster before having them: memory per "
                "device, step time and MFU of every layout the runtime accepts, ranked.");
    sub->add_option("config", opt->config, "The job config (.toml): model, batch, precision")
        ->required();
    sub->add_option("--gpus", opt->gpus, "Devices to plan for")->required();
    sub->add_option("--cluster", opt->cluster,
                    "The cluster file (.toml, examples/clusters/): peaks, memory, links")
        ->required();
    sub->add_option("--top", opt->top, "Rows of the table (default 10)");
    sub->add_option("--json", opt->json, "Also write every candidate and its terms as JSON");
    sub->add_option("--calibrate", opt->calibrate,
                    "Fit the cluster's achievable compute (and, from two or more runs, its "
                    "bandwidth) to these run files (.h5) first");
    sub->add_option("--set", opt->sets, "Override config keys: section.key=value");
    return [opt] { return run_plan(*opt); };
}

}  // namespace px::app
