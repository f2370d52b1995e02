// The layout planner (planner/plan.h): parallax.plan(config, gpus=, cluster=) gives every layout
// the runtime accepts for that many devices of a cluster file, ranked, each as a dict of its
// layout, memory per rank, time terms, MFU and tokens per second; parallax.predicted_vs_measured(
// run, cluster=) a run file's own layout predicted beside what it measured (views/plan_view.h, as
// the workbench's plan panel shows it).
#include "bindings/common.h"

#include "validators/plan/calibrate.h"
#include "validators/plan/cluster.h"
#include "validators/plan/plan.h"
#include "views/plan_view.h"
#include "views/run_files.h"

#include <optional>

namespace px::py_bind {

namespace {

py::dict candidate_dict(const plan::Candidate& c) {
    py::dict d;
    d["label"] = c.label();
    d["dp"] = c.dp, d["tp"] = c.tp, d["pp"] = c.pp, d["cp"] = c.cp, d["ep"] = c.ep;
    d["zero"] = c.zero;
    d["microbatches"] = c.microbatches;
    d["schedule"] = c.schedule;
    d["virtual_stages"] = c.virtual_stages;
    d["recompute"] = c.recompute;
    d["fits"] = c.fits;
    d["memory_bytes"] = c.memory_bytes;
    py::dict mem;
    for (const MemoryItem& i : c.memory) mem[py::str(i.what)] = i.bytes;
    d["memory"] = mem;
    const plan::TimeTerms& t = c.time;
    py::dict time;
    time["step"] = t.step, time["compute"] = t.compute, time["tp_comm"] = t.tp_comm;
    time["pp_comm"] = t.pp_comm, time["bubble"] = t.bubble, time["dp_comm"] = t.dp_comm;
    time["dp_exposed"] = t.dp_exposed, time["gather"] = t.gather;
    time["gather_exposed"] = t.gather_exposed, time["update"] = t.update, time["other"] = t.other;
    d["time_s"] = time;
    d["schedule_bubble"] = c.schedule_bubble;
    d["model_flops"] = c.model_flops;
    d["mfu"] = c.mfu;
    d["tokens_per_s"] = c.tokens_per_s;
    d["comm_bytes_sent"] = c.comm_bytes;
    return d;
}

}  // namespace

void bind_plan(py::module_& m) {
    m.def(
        "plan",
        [](const py::object& config, int gpus, const std::string& cluster,
           const std::vector<std::string>& calibrate, const std::vector<int>& only_tp,
           const std::vector<int>& only_pp, const std::vector<int>& only_cp,
           const py::kwargs& sections) {
            const Config cfg = make_config(config, sections);
            plan::ClusterSpec spec = plan::load_cluster(cluster);
            if (!calibrate.empty()) spec = plan::apply(spec, plan::calibrate(spec, calibrate));
            plan::PlanOptions opt;
            opt.gpus = gpus;
            opt.only_tp = only_tp, opt.only_pp = only_pp, opt.only_cp = only_cp;
            const plan::Plan p = plan::plan_layouts(cfg, spec, opt);
            py::list out;
            for (const plan::Candidate& c : p.candidates) out.append(candidate_dict(c));
            return out;
        },
        py::arg("config") = py::none(), py::kw_only(), py::arg("gpus"), py::arg("cluster"),
        py::arg("calibrate") = std::vector<std::string>{}, py::arg("only_tp") = std::vector<int>{},
        py::arg("only_pp") = std::vector<int>{}, py::arg("only_cp") = std::vector<int>{}, R"doc(
Every layout the runtime accepts for `gpus` devices of the cluster file `cluster` (docs/planner.md),
as a list of dicts, the layouts that fit in the devices' memory first, fastest first, then the rest
by memory: label, dp, tp, pp, cp, ep, zero, microbatches, schedule, virtual_stages, recompute, fits,
memory_bytes and memory (the runtime's estimate by part, one rank), time_s (step and its terms,
seconds), schedule_bubble, model_flops, mfu, tokens_per_s and comm_bytes_sent (per step, the
busiest rank). `calibrate`: run files (.h5) to fit the cluster's achievable compute (and, from two
or more, its bandwidth) to first. `only_tp`, `only_pp`, `only_cp`: enumerate only these degrees
(empty: every one), to plan a large job faster where some choices are settled (tp = a node's GPUs).
ConfigError naming the file, key and value on bad input.)doc");

    m.def(
        "predicted_vs_measured",
        [](const std::string& run, const std::string& cluster,
           const std::vector<std::string>& calibrate) {
            const RunSnapshot snap = views::snapshot_from_run_file(run);
            const plan::ClusterSpec spec = plan::load_cluster(cluster);
            std::optional<plan::ClusterSpec> fitted;
            if (!calibrate.empty()) fitted = plan::apply(spec, plan::calibrate(spec, calibrate));
            const views::PlanComparison c = views::compare_with_run(
                snap.config, spec, fitted ? &*fitted : nullptr, views::measured_run(snap, nullptr));
            if (!c.error.empty()) throw ConfigError(run + " (its config): " + c.error);
            py::list rows;
            for (const views::PlanComparisonRow& r : c.rows) {
                py::dict d;
                d["what"] = r.what, d["unit"] = r.unit;
                d["predicted"] = r.predicted;
                d["measured"] = r.measured >= 0 ? py::cast(r.measured) : py::object(py::none());
                rows.append(d);
            }
            py::dict out;
            out["layout"] = c.layout;
            out["steps"] = snap.metrics.size();
            out["rows"] = rows;
            return out;
        },
        py::arg("run"), py::kw_only(), py::arg("cluster"),
        py::arg("calibrate") = std::vector<std::string>{}, R"doc(
A run file's own layout predicted on the cluster file `cluster` beside what the run measured (the
workbench's plan panel, docs/planner.md): a dict of layout (the plan's label), steps and rows, each
a dict of what, unit ("bytes" or "seconds"), predicted and measured (None where the run file does
not record it): rank 0's memory at the run's end against the runtime's estimate per rank, the
median step time after the first against the step time predicted with the file's figures (and,
with `calibrate`, run files to fit them to first, again after fitting), rank 0's bytes sent per
step, and the predicted bytes per group. ConfigError or DataError naming the file on bad input.)doc");
}

}  // namespace px::py_bind
