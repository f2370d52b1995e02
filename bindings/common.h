// The Python module `parallax` (pybind11): what its files share.
//
// Index
//   bind_errors .. bind_files   each file's part of the module, called by module.cpp in order
//   PyConfig                    a job config as Python sees it (parallax.Config)
//   make_config                 a Config from a TOML path, a dict, a parallax.Config and
//                               keyword sections, the way the CLI's --set builds one
//   metrics_dict, metrics_row   per-step metrics as numpy columns, one step as a dict
//   fp8_dict                    the FP8 drift monitor's rows as numpy columns
//   adopt                       a vector's floats as a numpy array that owns them (no copy)
//   wait_interruptibly          waits for a SteppedRun with the GIL released, Ctrl-C honoured
//
// Errors: the library's exceptions become Python ones (errors.cpp) with the library's own
// messages: ConfigError is a ValueError, StorageError an OSError, all are ParallaxError.
#pragma once
#include "core/base/config.h"
#include "core/base/metrics.h"
#include "core/train/job_view.h"
#include "core/train/stepped_run.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

namespace px::py_bind {

namespace py = pybind11;

void bind_errors(py::module_& m);
void bind_config(py::module_& m);
void bind_layout(py::module_& m);
void bind_numerics(py::module_& m);
void bind_job(py::module_& m);
void bind_validate(py::module_& m);
void bind_files(py::module_& m);

struct PyConfig {
    Config cfg;
};

// `source`: None (the embedded default job), a path (str or os.PathLike) to a TOML file, a dict
// ({"train": {"lr": 1e-3}} or {"train.lr": 1e-3}) over the default job, or a parallax.Config;
// `sections`: keyword sections applied after it (train={"lr": 1e-3}, layout={"tp": 2}). Every
// value becomes a `section.key=value` assignment of TOML text and all are applied at once by
// apply_overrides, so errors are the CLI's own ConfigError sentences naming the key.
Config make_config(const py::object& source, const py::dict& sections);

// A TOML path for messages and the source of a Config: "<dict>" etc.
py::dict metrics_dict(const MetricColumns& c);  // {"step": int64 array, "loss": float64 array, ...}
py::dict metrics_row(const StepMetrics& m);     // {"step": 3, "loss": 3.41, ...}
// The FP8 drift monitor's rows as columns: step, count, nonfinite, alerts (int64 arrays), tensor
// and recipe (str arrays), amax ... sqnr_db (float64 arrays), one element per row.
py::dict fp8_dict(const std::vector<Fp8Stat>& rows);

// The array takes the vector over (a capsule owns it): the floats are not copied. An empty shape
// is flat.
py::array adopt(std::vector<float> v, const std::vector<i64>& shape);

// Until the run is paused, finished or failed, with the GIL released, checking for signals every
// 50 ms: on Ctrl-C (or any signal handler that raises) the run is held after the step in
// progress, waited for, and the Python exception propagates, leaving the run usable. A failed
// run's error is raised.
void wait_interruptibly(SteppedRun& run);

}  // namespace px::py_bind
