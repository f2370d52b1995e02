// The layout planner (planner/plan.h): parallax.plan(config, gpus=, cluster=) gives every layout
// the runtime accepts for that many devices of a cluster file, ranked, each as a dict of its
// layout, memory per rank, time terms, MFU and tokens per second.
#include "bindings/common.h"

#include "validators/plan/calibrate.h"
#include "validators/plan/cluster.h"
#include "validators/plan/plan.h"

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
           const std::vector<std::string>& calibrate, const py::kwargs& sections) {
            const Config cfg = make_config(config, sections);
            plan::ClusterSpec spec = plan::load_cluster(cluster);
            if (!calibrate.empty()) spec = plan::apply(spec, plan::calibrate(spec, calibrate));
            plan::PlanOptions opt;
            opt.gpus = gpus;
            const plan::Plan p = plan::plan_layouts(cfg, spec, opt);
            py::list out;
            for (const plan::Candidate& c : p.candidates) out.append(candidate_dict(c));
            return out;
        },
        py::arg("config") = py::none(), py::kw_only(), py::arg("gpus"), py::arg("cluster"),
        py::arg("calibrate") = std::vector<std::string>{}, R"doc(
Every layout the runtime accepts for `gpus` devices of the cluster file `cluster` (docs/planner.md),
as a list of dicts, the layouts that fit in the devices' memory first, fastest first, then the rest
by memory: label, dp, tp, pp, cp, ep, zero, microbatches, schedule, virtual_stages, recompute, fits,
memory_bytes and memory (the runtime's estimate by part, one rank), time_s (step and its terms,
seconds), schedule_bubble, model_flops, mfu, tokens_per_s and comm_bytes_sent (per step, the
busiest rank). `calibrate`: run files (.h5) to fit the cluster's achievable compute (and, from two
or more, its bandwidth) to first. ConfigError naming the file, key and value on bad input.)doc");
}

}  // namespace px::py_bind
