// parallax.Job's fp8 (job.h): the FP8 drift monitor's rows, the fp8 scaling state viewed in
// place, and the cast the next step makes of a weight.
#include "bindings/job.h"

#include <string>

namespace px::py_bind {

void bind_job_fp8(JobClass& job) {
    job
        .def(
            "fp8", [](PyJob& j) { return fp8_dict(j.view.snapshot().fp8); },
            R"doc(
The FP8 drift monitor's rows (fp8_monitor.every > 0; empty arrays otherwise), one per fp8-scaled
tensor, recipe and monitored step, as numpy columns: step, count, nonfinite, alerts (int64),
tensor ("h.1.attn.c_attn/x"), recipe ("delayed", "block", or a comparison: "current") (str),
amax, scale, scale_ratio, saturated, underflow, dynamic_range, mse, sqnr_db (float64). The same
on every layout, bit for bit; docs/precision.md says what each column measures.)doc")
        .def(
            "fp8_state",
            [](py::object self) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                return fp8_state_dict(j.run->job(0).fp8(), self);
            },
            R"doc(
The fp8 scaling state (None when precision.fp8 = "off"), the same on every rank: a dict with
recipe ("delayed" or "block"), gemms (the fp8 matmuls' names, "h.1.attn.c_attn" ... "lm_head", in
the order of the arrays), roles ("x", "w", "dy"), dtypes (per role: float8_e4m3fn, and
float8_e5m2 for a delayed "dy"), fp8_max (448 or 57344 per role), block_size, and for the delayed
recipe history_len, scale (gemms, 3) float32: the scales the next step casts with, and
amax_history (gemms, 3, history_len) float32, newest first. scale and amax_history are read-only
views of the job's memory (base: this job): they see every later step. The block recipe keeps no
state (scale and amax_history None): its scales are made per cast (fp8_cast).)doc")
        .def(
            "fp8_cast",
            [](py::object self, const std::string& name) {
                PyJob& j = self.cast<PyJob&>();
                raise_if_failed(j);
                const Fp8Scaling* f = j.run->job(0).fp8();
                if (!f)
                    throw ConfigError(
                        "fp8_cast: this job has no fp8 matmuls (precision.fp8 = \"off\"); give "
                        "precision={\"fp8\": \"delayed\"} or \"block\"");
                const ParamTable table = ParamTable::build(j.cfg.model);
                int g = 0;
                for (; g < f->gemms(); g++) {
                    const Fp8Gemm& gm = f->gemm(g);
                    if (gm.name == name ||
                        (gm.kind != Fp8Gemm::lm_head &&
                         table.entries[static_cast<size_t>(gm.weight_id)].name == name))
                        break;
                }
                if (g == f->gemms())
                    throw ConfigError("fp8_cast: \"" + name +
                                      "\" is not an fp8 matmul of this job or its weight; "
                                      "fp8_state()[\"gemms\"] lists them");
                const std::string weight =
                    table.entries[static_cast<size_t>(f->gemm(g).weight_id)].name;
                const py::dict all = logical_tensors(*j.run, What::weights, self);
                const auto w = py::array_t<float, py::array::c_style>::ensure(all[py::str(weight)]);
                const std::vector<i64> shape(w.shape(), w.shape() + w.ndim());
                py::dict d = fp8_cast_dict(w.data(), shape, f->delayed(), Fp8Scaling::w,
                                           f->delayed() ? f->scale(g, Fp8Scaling::w) : 1.0f,
                                           f->block_size());
                d["gemm"] = f->gemm(g).name;
                d["weight"] = weight;
                return d;
            },
            py::arg("name"), R"doc(
The fp8 cast the next step's forward makes of an fp8 matmul's weight ("h.1.mlp.c_fc" or its
weight's name "h.1.mlp.c_fc.weight"; "lm_head" casts wte): parallax.fp8_cast's dict (q as
float8_e4m3fn, scale, scale_inv, values) of the logical weight with the job's scale for it
(delayed) or its block_size x block_size blocks (block), plus gemm and weight. Every layout casts
these values (a tp rank its piece of them).)doc");
}

}  // namespace px::py_bind
