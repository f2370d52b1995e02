// parallax.Job: what a run shows while it goes (job.h): its metrics, events and named values,
// the batches it draws, the MoE router statistics, memory and communication per rank, and its
// layout in words.
#include "bindings/job.h"

#include "core/model/data.h"

#include <algorithm>
#include <map>
#include <string>

namespace px::py_bind {

namespace {

py::list memory_rows(PyJob& j) {
    py::list rows;
    for (int r = 0; r < j.run->world_size(); r++) {
        const MemoryStats m = j.run->job(r).memory();
        py::dict d;
        d["rank"] = r;
        d["params"] = m.params;
        d["grads"] = m.grads;
        d["optimizer"] = m.optimizer;
        d["activations"] = m.activations;
        d["comm"] = m.comm;
        d["peak_params"] = m.peak_params;
        d["peak_grads"] = m.peak_grads;
        d["total"] = m.total();
        rows.append(d);
    }
    return rows;
}

}  // namespace

void bind_job_watch(JobClass& job) {
    job
        .def(
            "metrics", [](PyJob& j) { return metrics_dict(j.view.snapshot().metrics); },
            "Per-step metrics of world rank 0 as numpy arrays: step (int64), loss, val_loss "
            "(-1: not evaluated), grad_norm, lr, tokens_per_s, step_ms, comm_bytes (float64).")
        .def(
            "events",
            [](PyJob& j) {
                py::list out;
                for (const RunEvent& e : j.view.snapshot().events) {
                    py::dict d;
                    d["step"] = e.step;
                    d["kind"] = event_kind_name(e.kind);
                    d["message"] = e.message;
                    py::dict ev;
                    for (const NamedValue& v : e.evidence) ev[py::str(v.name)] = v.value;
                    d["evidence"] = ev;
                    out.append(d);
                }
                return out;
            },
            "Events of the run (resume, rerun, checkpoint, fault, failure, spike, alert) as dicts: "
            "step, kind, message, evidence (a spike's per-layer values as its first run saw them).")
        .def(
            "values",
            [](PyJob& j) {
                // name -> (steps, values), each step once (a re-run step's latest values)
                std::map<std::string, std::pair<std::vector<std::int64_t>, std::vector<double>>> by;
                for (const StepValues& sv : j.view.snapshot().values)
                    for (const NamedValue& v : *sv.values) {
                        auto& [steps, vals] = by[v.name];
                        steps.push_back(sv.step);
                        vals.push_back(v.value);
                    }
                py::dict out;
                for (const auto& [name, rows] : by) {
                    py::array_t<std::int64_t> s(static_cast<py::ssize_t>(rows.first.size()));
                    py::array_t<double> x(static_cast<py::ssize_t>(rows.second.size()));
                    std::copy(rows.first.begin(), rows.first.end(), s.mutable_data());
                    std::copy(rows.second.begin(), rows.second.end(), x.mutable_data());
                    out[py::str(name)] = py::make_tuple(s, x);
                }
                return out;
            },
            "Named per-step values (with [spikes]: layer.<group>.grad_norm, .update_ratio, "
            ".adam_eps_ratio, layer.h.<l>.attn_logit_max, spike.loss_z, spike.grad_norm_z, "
            "spike.clip_norm) as {name: (steps int64 array, values float64 array)}.")
        .def(
            "batch",
            [](PyJob& j, i64 step, const std::string& split) {
                if (split != "train" && split != "val")
                    throw ConfigError("batch: split must be \"train\" or \"val\", got \"" +
                                      split + "\"");
                if (step < 1) throw ConfigError("batch: steps count from 1, got " + std::to_string(step));
                const i64 B = j.cfg.train.batch_size, T = j.cfg.model.seq_len;
                const std::unique_ptr<TokenSource> src = make_source(j.cfg);
                py::array_t<std::int32_t> out({B, T + 1});
                src->sample(out.mutable_data(), T, split == "val" ? Split::val : Split::train,
                            step - 1, 0, B);
                return out;
            },
            py::arg("step"), py::arg("split") = "train",
            "The global batch of a step (1-based; split \"val\": validation batch step - 1) as "
            "int32 windows (batch_size, seq_len + 1): inputs [:, :-1], targets [:, 1:]. Sampled "
            "from the job's source as the step draws it (a step of a run that skipped batches, "
            "spikes.action = \"rollback\", draws a later one).")
        .def(
            "router_stats",
            [](PyJob& j) {
                // moe.h.<l>.<field>[.<e>] -> per layer: steps, per-step fields, tokens (steps, E)
                struct Layer {
                    std::vector<std::int64_t> steps;
                    std::map<std::string, std::vector<double>> fields;
                    std::map<int, std::vector<double>> tokens;
                };
                std::map<int, Layer> layers;
                for (const StepValues& sv : j.view.snapshot().values)
                    for (const NamedValue& v : *sv.values) {
                        if (v.name.rfind("moe.h.", 0) != 0) continue;
                        const size_t dot = v.name.find('.', 6);
                        const int l = std::stoi(v.name.substr(6, dot - 6));
                        const std::string field = v.name.substr(dot + 1);
                        Layer& L = layers[l];
                        if (field.rfind("tokens.", 0) == 0) {
                            L.tokens[std::stoi(field.substr(7))].push_back(v.value);
                            continue;
                        }
                        if (field == "drop_fraction") L.steps.push_back(sv.step);
                        L.fields[field].push_back(v.value);
                    }
                py::dict out;
                for (const auto& [l, L] : layers) {
                    py::dict d;
                    d["steps"] = py::array_t<std::int64_t>(
                        static_cast<py::ssize_t>(L.steps.size()), L.steps.data());
                    for (const auto& [name, xs] : L.fields)
                        d[py::str(name)] =
                            py::array_t<double>(static_cast<py::ssize_t>(xs.size()), xs.data());
                    const py::ssize_t n = static_cast<py::ssize_t>(L.steps.size());
                    const py::ssize_t E = static_cast<py::ssize_t>(L.tokens.size());
                    py::array_t<std::int64_t> t({n, E});
                    auto w = t.mutable_unchecked<2>();
                    for (const auto& [e, xs] : L.tokens)
                        for (py::ssize_t i = 0; i < n && i < static_cast<py::ssize_t>(xs.size()); i++)
                            w(i, e) = static_cast<std::int64_t>(xs[static_cast<size_t>(i)]);
                    d["tokens"] = t;
                    out[py::int_(l)] = d;
                }
                return out;
            },
            "MoE router statistics per MoE layer and step (model.moe_experts > 0; {} for a dense "
            "model), from the job's named values moe.h.<l>.*: {layer: {'steps', 'tokens' (steps, "
            "E) slots each expert took, 'drop_fraction', 'balance' (E·Σ f_i·P_i, 1 when "
            "balanced), 'aux_loss', 'z_loss', 'router_entropy' (nats)}}.")
        .def(
            "memory",
            [](PyJob& j) {
                raise_if_failed(j);
                return memory_rows(j);
            },
            "Bytes each rank holds, by what they are for (params, grads, optimizer, activations, "
            "comm, peaks), one dict per world rank.")
        .def(
            "comm_stats",
            [](PyJob& j, bool reset) {
                raise_if_failed(j);
                py::list rows;
                for (int r = 0; r < j.run->world_size(); r++) {
                    comm::Communicator& world = j.run->world(r);
                    for (const comm::StatRow& s : world.stat_rows()) {
                        py::dict d;
                        d["rank"] = r;
                        d["group"] = s.group;
                        d["group_rank"] = s.rank;
                        d["op"] = s.op;
                        d["calls"] = s.calls;
                        d["bytes_sent"] = s.bytes_sent;
                        d["bytes_recv"] = s.bytes_recv;
                        d["seconds"] = s.seconds;
                        rows.append(d);
                    }
                    if (reset) world.stats_book()->reset();
                }
                return rows;
            },
            py::arg("reset") = false, R"doc(
What every rank's collectives moved since the start (or the last reset): one dict per (rank,
group, op) with rank, group ("dp", "tp", "pp", "world"), group_rank, op ("all_reduce",
"reduce_scatter", "all_gather", "send", ...), calls, bytes_sent, bytes_recv (by the algorithm's
actual traffic) and seconds. reset=True zeroes the counters after reading, so that the next call
reports the steps in between.)doc")
        .def(
            "describe",
            [](PyJob& j, bool collectives) {
                std::string s = j.run->mesh().describe();
                if (collectives) s += explored_words(explore(j.cfg));
                return s;
            },
            py::arg("collectives") = false, R"doc(
The layout in words: the mesh (every rank's coordinates and layers). collectives=True adds what
one traced step of the same config shows (parallax.explore_layout; the job's own ranks are not
touched): who holds which slice of every weight, every collective of each layer with its calls
and bytes, and memory per rank beside the admission estimate.)doc")
        .def(
            "explore", [](PyJob& j) { return explored(explore(j.cfg)); },
            "parallax.explore_layout(job.config): who holds what, the collectives per layer with "
            "their bytes (collectives, collectives_text, bytes_per_layer) and memory per rank, "
            "from one traced step of this job's config on ranks of its own.");
}

}  // namespace px::py_bind
