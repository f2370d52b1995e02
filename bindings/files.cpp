// Files from Python: checkpoints (inspect, read), llm.c and Hugging Face weights (convert), run
// files (read).
// Saving a checkpoint is Job.save_checkpoint (job.cpp): every rank writes its own hyperslabs.
#include "bindings/common.h"

#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/io/checkpoint_convert.h"
#include "core/io/runfile.h"

#include <algorithm>
#include <cstdlib>
#include <optional>

namespace px::py_bind {

namespace {

std::string path_of(const py::object& p) {
    return py::str(py::module_::import("os").attr("fspath")(p));
}

py::dict history_dict(const std::vector<StepMetrics>& h) {
    MetricColumns c;
    for (const StepMetrics& m : h) c.push_back(m);
    return metrics_dict(c);
}

py::dict meta_dict(const CheckpointMeta& m) {
    py::dict d;
    d["step"] = m.step;
    d["seed"] = m.seed;
    d["config"] = m.config_toml;
    d["data_source"] = m.data_source;
    d["data_next_step"] = m.data_next_step;
    d["rng_counter_base"] = m.rng_counter_base;
    d["adam_step"] = m.adam_step;
    d["loss_scale"] = m.loss_scale;
    d["growth_tracker"] = m.growth_tracker;
    d["loss_scale_dynamic"] = m.loss_scale_dynamic;
    d["parallax_version"] = m.parallax_version;
    d["created"] = m.created;
    d["source_dtype"] = m.source_dtype;
    d["history"] = history_dict(m.history);
    return d;
}

}  // namespace

void bind_files(py::module_& m) {
    m.def(
        "inspect_checkpoint",
        [](const py::object& path) {
            const std::string p = path_of(path);
            return with_files({p}, [&] {
                py::gil_scoped_release nogil;
                const CheckpointReader r(p);
                const std::vector<DatasetCheck> checks = r.check_all();
                py::gil_scoped_acquire gil;
                py::list datasets;
                bool ok = true;
                for (const DatasetCheck& c : checks) {
                    py::dict d;
                    d["path"] = c.info.path;
                    d["shape"] = py::tuple(py::cast(c.info.shape));
                    d["dtype"] = c.info.dtype;
                    d["checksum"] = c.info.checksum;
                    d["computed"] = c.computed;
                    d["ok"] = c.ok;
                    d["problem"] = c.problem;
                    datasets.append(d);
                    ok = ok && c.ok;
                }
                py::dict d = meta_dict(r.meta());
                d["fp8"] = fp8_checkpoint_dict(r.meta(), nullptr);
                d["path"] = p;
                d["datasets"] = datasets;
                d["ok"] = ok;
                return d;
            });
        },
        py::arg("path"), R"doc(
Opens a checkpoint and verifies every dataset's checksum, as `parallax inspect`: a dict with its
meta (step, seed, config, data_source, adam_step, created, parallax_version, history as numpy
columns), fp8 (None, or the fp8 scales and amax histories as read_checkpoint gives them, gemms
left empty), datasets (path, shape, dtype, stored and computed checksum, ok, problem) and ok
(every checksum verifies). CheckpointError naming the file when it is not a readable checkpoint.)doc");

    m.def(
        "read_checkpoint",
        [](const py::object& path) {
            const std::string p = path_of(path);
            return with_files({p}, [&] {
                std::unique_ptr<CheckpointReader> r;
                {
                    py::gil_scoped_release nogil;
                    r = std::make_unique<CheckpointReader>(p);
                    r->verify_all();
                }
                const Config cfg = parse_config(r->meta().config_toml, p + " (its config)");
                const ModelConfig& mc = cfg.model;
                r->check_model(mc);
                const ParamTable table = ParamTable::build(mc);
                py::dict weights, m1, m2;
                for (const TableEntry& e : table.entries) {
                    const auto read = [&](const std::string& dataset) {
                        std::vector<py::ssize_t> dims;
                        for (const i64 d : e.shape()) dims.push_back(d);
                        py::array_t<float> a(dims);
                        r->read(dataset, a.mutable_data());
                        return a;
                    };
                    weights[py::str(e.name)] = read(model_dataset(e.name));
                    m1[py::str(e.name)] = read(moment_dataset('m', e.name));
                    m2[py::str(e.name)] = read(moment_dataset('v', e.name));
                }
                py::dict d = meta_dict(r->meta());
                d["fp8"] = fp8_checkpoint_dict(r->meta(), &cfg);
                d["weights"] = weights;
                d["adam_m"] = m1;
                d["adam_v"] = m2;
                return d;
            });
        },
        py::arg("path"), R"doc(
A checkpoint's logical state, every checksum verified first: its meta (as inspect_checkpoint)
with weights, adam_m and adam_v as {name: float32 array} in GPT-2 names and shapes, loss_scale
(fp16's scale of the next step) and fp8: None without fp8 state, else the delayed recipe's
state as Job.fp8_state() gives it (gemms: the fp8 matmuls' names, roles, history_len, scale
(gemms, 3) and amax_history (gemms, 3, history_len) float32, copies).)doc");

    m.def(
        "convert",
        [](const py::object& in, const py::object& out, const std::optional<std::string>& dtype) {
            const std::string a = path_of(in), b = path_of(out);
            ConvertOptions options;
            options.dtype = dtype.value_or("");
            return with_files({a}, [&] {
                py::gil_scoped_release nogil;
                return convert_weights(a, b, options);
            });
        },
        py::arg("input"), py::arg("output"), py::arg("dtype") = py::none(), R"doc(
Converts weights between llm.c (GPT-2), Parallax and Hugging Face (GPT-2, Llama, Qwen3,
Qwen3-MoE), as `parallax convert IN --to OUT [--dtype D]`: OUT's name picks the format written
(.h5: a Parallax checkpoint with zero Adam moments at step 0, to start a job from with
model={"init_from": OUT}; .bin: llm.c's fp32 version-3 file of a GPT-2; a folder, existing or
named without an extension: a Hugging Face folder of the model's class (GPT2LMHeadModel,
LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM), config.json and model.safetensors, in
dtype "fp32", "bf16" or "fp16", by default the
dtype the weights came in from Hugging Face, else fp32). input is an llm.c .bin, a Parallax
checkpoint, or a Hugging Face folder (or its model.safetensors). Returns a sentence saying what
was written. DataError naming the file (and the tensor or config key) on bad input.)doc");

    m.def(
        "read_run_file",
        [](const py::object& path) {
            const std::string p = path_of(path);
            return with_files({p}, [&] {
                RunRecords rec;
                {
                    py::gil_scoped_release nogil;
                    rec = read_run_records(p);
                }
                py::dict metrics;
                for (const auto& [name, rows] : rec.metrics) {
                    py::array_t<std::int64_t> steps(static_cast<py::ssize_t>(rows.steps.size()));
                    py::array_t<double> values(static_cast<py::ssize_t>(rows.values.size()));
                    std::copy(rows.steps.begin(), rows.steps.end(), steps.mutable_data());
                    std::copy(rows.values.begin(), rows.values.end(), values.mutable_data());
                    metrics[py::str(name)] = py::make_tuple(steps, values);
                }
                py::list events;
                for (const RunRecords::Event& e : rec.events) {
                    py::dict d;
                    d["step"] = e.step;
                    d["kind"] = e.kind;
                    d["message"] = e.message;
                    py::dict ev;  // "name=value;..." as a dict
                    for (size_t at = 0; at < e.evidence.size();) {
                        const size_t end = std::min(e.evidence.find(';', at), e.evidence.size());
                        const std::string item = e.evidence.substr(at, end - at);
                        const size_t eq = item.find('=');
                        if (eq != std::string::npos)
                            ev[py::str(item.substr(0, eq))] =
                                std::strtod(item.c_str() + eq + 1, nullptr);
                        at = end + 1;
                    }
                    d["evidence"] = ev;
                    events.append(d);
                }
                py::dict d;
                d["config"] = rec.config_toml;
                d["metrics"] = metrics;
                d["events"] = events;
                d["fp8"] = fp8_dict(rec.fp8);
                return d;
            });
        },
        py::arg("path"), R"doc(
A run file's records (<out>/run.h5 of parallax train or Job(out=...)): config (TOML text),
metrics ({name: (steps int64 array, values float64 array)}: loss, val_loss, grad_norm, lr,
tokens_per_s, step_ms, comm_bytes, and with [spikes] the per-layer evidence layer.<group>.<what>
and spike.*), events (step, kind, message, evidence: a spike's per-layer values as its first
run saw them, {} for other events) and fp8 (the FP8 drift monitor's /fp8 table as Job.fp8()
gives it; empty arrays without one), read without opening the file for writing.)doc");
}

}  // namespace px::py_bind
