// parallax.Job's state (job.h): the logical weights, gradients and moments, a rank's own memory,
// the shard map, the recorded probes, and checkpoints written from Python.
#include "bindings/job.h"
#include "bindings/state.h"

#include "core/io/checkpoint.h"
#include "core/io/output_paths.h"
#include "core/train/checkpointing.h"

#include <string>
#include <vector>

namespace px::py_bind {

namespace {

std::string save_checkpoint(PyJob& j, const py::object& where) {
    raise_if_failed(j);
    const std::string dir = py::str(py::module_::import("os").attr("fspath")(where));
    Config c = j.cfg;
    c.checkpoint.dir = dir;
    c.checkpoint.every = 1;  // due after every step: RunCheckpoints saves now
    c.checkpoint.keep = INT64_MAX / 2;
    check_output_folder(dir, "save_checkpoint(dir)");
    const i64 step = j.run->steps_done();
    if (step == 0)
        throw ConfigError("save_checkpoint: nothing to save before the first step (a checkpoint "
                          "holds the state after a step)");
    {
        py::gil_scoped_release nogil;
        j.run->on_each_rank([&](Job& job, comm::Communicator& world) {
            RunCheckpoints(c, &world).after_step(job);
        });
    }
    return checkpoint_path(dir, step);
}

}  // namespace

void bind_job_state(JobClass& job) {
    job
        .def(
            "weights",
            [](py::object self) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                return logical_tensors(*j.run, What::weights, self);
            },
            "{name: array} of the logical weights, GPT-2 names and shapes. On one device they "
            "view the job's memory (no copy: base is this job; they see later steps); under a "
            "parallel layout they are assembled from the ranks' pieces (copies).")
        .def(
            "grads",
            [](py::object self) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                return logical_tensors(*j.run, What::grads, self);
            },
            "{name: array} of the last step's reduced gradients (as weights()).")
        .def(
            "adam_m",
            [](py::object self) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                return logical_tensors(*j.run, What::adam_m, self);
            },
            "{name: array} of AdamW's first moments (as weights()).")
        .def(
            "adam_v",
            [](py::object self) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                return logical_tensors(*j.run, What::adam_v, self);
            },
            "{name: array} of AdamW's second moments (as weights()).")
        .def(
            "rank",
            [](py::object self, int r) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                if (r < 0 || r >= j.run->world_size())
                    throw IndexLookupError("rank(" + std::to_string(r) +
                                           "): not a rank of this layout (0 .. " +
                                           std::to_string(j.run->world_size() - 1) + ")");
                return rank_view(*j.run, r, self);
            },
            py::arg("rank"), R"doc(
World rank r's own memory, as views (no copy): a dict with rank, pp, dp, tp, cp, layers (its
chunks' layer ranges), for a MoE model experts (the [lo, hi) of every MoE layer's experts it holds:
all of them, or under expert parallelism its share), and for each of weights, grads, adam_m, adam_v a dict {name: array} of the
local tensors it holds whole (a tp shard's local shape), `<what>_flat` (everything it holds of
it, flat) and `<what>_range` (those floats' range in its local table: a ZeRO shard).)doc")
        .def(
            "shard_map",
            [](PyJob& j) {
                raise_if_failed(j);
                return shard_map(*j.run);
            },
            "One dict per (rank, tensor): its coordinates, the tensor, its logical and local "
            "shapes, the slice of the logical tensor it holds (\"h.0.mlp.c_fc.weight[0:128, :]\"), "
            "and how many of its elements the rank holds as weights and as Adam moments between "
            "steps (ZeRO shards) and writes to checkpoints.")
        .def(
            "probe_names",
            [](PyJob& j) {
                raise_if_failed(j);
                return j.probes ? j.probes->names() : std::vector<std::string>{};
            },
            "The probes recorded so far, in the order they were first captured.")
        .def(
            "probe",
            [](PyJob& j, const std::string& name) {
                raise_if_failed(j);
                if (!j.probes) throw ConfigError("probe: this job records no probes; give Job(..., probes=[patterns])");
                std::vector<i64> shape;
                std::vector<float> v = j.probes->unshard(name, &shape);
                const DType t = j.probes->dtype(name);
                if (t != DType::f32) return narrowed(v.data(), shape, t);
                return adopt(std::move(v), shape);
            },
            py::arg("name"), R"doc(
A probe's logical tensor, put together from every rank's pieces, in the dtype the library holds
it in: float32, or with precision.activations = "bf16" / "fp16" the activations and their
gradients as ml_dtypes.bfloat16 / float16 (their values exactly; .astype(np.float32) widens
them). An array that owns its data; ParallaxError naming the probe when pieces are missing or
replicas disagree.)doc")
        .def(
            "clear_probes",
            [](PyJob& j) {
                if (j.probes) j.probes->clear();
            },
            "Forgets the probes recorded so far (the patterns stay).")
        .def("save_checkpoint", &save_checkpoint, py::arg("dir"),
             "Writes a checkpoint of the state after the steps done to <dir>/ckpt-<step>.h5, "
             "every rank its own hyperslabs (as the run's checkpoints), and returns its path.");
}

}  // namespace px::py_bind
