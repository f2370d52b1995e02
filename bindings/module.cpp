// The extension module parallax._core: jobs, state as numpy arrays, layouts and schedules,
// validation, checkpoints and run files (docs/python.md). Each part is bound by its own file
// (common.h); the package bindings/python/parallax is its public face, in Python.
#include "bindings/common.h"

namespace px::py_bind {

py::array adopt(std::vector<float> v, const std::vector<i64>& shape) {
    auto* owned = new std::vector<float>(std::move(v));
    py::capsule owner(owned, [](void* p) { delete static_cast<std::vector<float>*>(p); });
    std::vector<py::ssize_t> dims(shape.begin(), shape.end());
    if (dims.empty()) dims.push_back(static_cast<py::ssize_t>(owned->size()));
    return py::array(py::dtype::of<float>(), dims, {}, owned->data(), owner);
}

py::dict metrics_row(const StepMetrics& m) {
    py::dict d;
    d["step"] = m.step;
    d["loss"] = m.loss;
    d["val_loss"] = m.val_loss;
    d["grad_norm"] = m.grad_norm;
    d["lr"] = m.lr;
    d["tokens_per_s"] = m.tokens_per_s;
    d["step_ms"] = m.step_ms;
    d["comm_bytes"] = m.comm_bytes;
    return d;
}

py::dict metrics_dict(const MetricColumns& c) {
    auto column = [](const auto& v) {
        using T = typename std::decay_t<decltype(v)>::value_type;
        py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
        std::copy(v.begin(), v.end(), a.mutable_data());
        return a;
    };
    py::dict d;
    d["step"] = column(c.step);
    d["loss"] = column(c.loss);
    d["val_loss"] = column(c.val_loss);
    d["grad_norm"] = column(c.grad_norm);
    d["lr"] = column(c.lr);
    d["tokens_per_s"] = column(c.tokens_per_s);
    d["step_ms"] = column(c.step_ms);
    d["comm_bytes"] = column(c.comm_bytes);
    return d;
}

py::dict fp8_dict(const std::vector<Fp8Stat>& rows) {
    py::dict d;
    for (const Fp8IntField& f : kFp8Ints) {
        py::array_t<std::int64_t> a(static_cast<py::ssize_t>(rows.size()));
        for (size_t i = 0; i < rows.size(); i++) a.mutable_data()[i] = rows[i].*f.field;
        d[f.name] = a;
    }
    py::list tensor, recipe;
    for (const Fp8Stat& r : rows) {
        tensor.append(r.tensor);
        recipe.append(r.recipe);
    }
    const py::object array = py::module_::import("numpy").attr("array");
    d["tensor"] = array(tensor, py::arg("dtype") = "str");
    d["recipe"] = array(recipe, py::arg("dtype") = "str");
    for (const Fp8RealField& f : kFp8Reals) {
        py::array_t<double> a(static_cast<py::ssize_t>(rows.size()));
        for (size_t i = 0; i < rows.size(); i++) a.mutable_data()[i] = rows[i].*f.field;
        d[f.name] = a;
    }
    return d;
}

}  // namespace px::py_bind

PYBIND11_MODULE(_core, m) {
    using namespace px::py_bind;
    m.doc() = "The extension module under the package parallax (bindings/python/parallax).";
    m.attr("__version__") = PARALLAX_VERSION;
    bind_errors(m);
    bind_config(m);
    bind_layout(m);
    bind_numerics(m);
    bind_job(m);
    bind_validate(m);
    bind_files(m);
    bind_precision(m);
    bind_plan(m);
}
