// The extension module parallax._core (pybind11), under the package bindings/python/parallax:
// what its files share.
//
// Index
//   bind_errors .. bind_files   each file's part of the module, called by module.cpp in order
//   numpy_dtype, narrowed       the library's dtypes as numpy's (bf16, fp8 through ml_dtypes)
//   fp8_cast_dict               an fp8 cast's codes, scales and read-back (precision.cpp)
//   fp8_state_dict              a job's fp8 scales and amax histories, viewed in place
//   fp8_checkpoint_dict         a checkpoint's
//   explore, explored, explored_words   one traced step of a layout (the workbench's layout
//                               explorer): who holds what, the collectives per layer with their
//                               bytes, memory per rank; as a dict and in words (layout.cpp)
//   PyConfig                    a job config as Python sees it (parallax.Config)
//   make_config                 a Config from a TOML path, a dict, a parallax.Config and
//                               keyword sections, the way the CLI's --set builds one
//   metrics_dict, metrics_row   per-step metrics as numpy columns, one step as a dict
//   fp8_dict                    the FP8 drift monitor's rows as numpy columns
//   adopt                       a vector's floats as a numpy array that owns them (no copy)
//   wait_interruptibly          waits for a SteppedRun with the GIL released, Ctrl-C honoured
//   run_interruptibly           long library work (validate, record_trace) on a thread of its
//                               own, the GIL released, Ctrl-C cancelling it after a step
//
// Errors: the library's exceptions become Python ones (errors.cpp) with the library's own
// messages: ConfigError is a ValueError, StorageError an OSError, all are ParallaxError; the
// bindings' own below are also KeyError, IndexError or an OSError (docs/python.md, "Errors").
//   KeyLookupError, IndexLookupError  a key or rank that is not there
//   FileAccessError, with_files       a library error about a file that is missing or unreadable
#pragma once
#include "views/layout_explorer.h"
#include "core/base/config.h"
#include "core/base/metrics.h"
#include "core/io/checkpoint.h"
#include "core/model/fp8.h"
#include "core/train/job_view.h"
#include "core/train/runner.h"
#include "core/train/stepped_run.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <exception>
#include <functional>
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
void bind_precision(py::module_& m);
void bind_plan(py::module_& m);  // plan.cpp: the layout planner

// A ConfigError that Python also sees as a KeyError (Config()["nope"]), and one it also sees as
// an IndexError (job.rank(99)).
struct KeyLookupError : ConfigError {
    using ConfigError::ConfigError;
};
struct IndexLookupError : ConfigError {
    using ConfigError::ConfigError;
};

// A library error (`cause`, with its message) about a file that is missing or unreadable: Python
// raises it as cause's class and as the OSError of `err` (FileNotFoundError for ENOENT,
// PermissionError for EACCES), with errno and filename set.
struct FileAccessError : Error {
    FileAccessError(std::exception_ptr cause, const std::string& what, int err, std::string path)
        : Error(what), cause(std::move(cause)), err(err), path(std::move(path)) {}
    std::exception_ptr cause;
    int err;
    std::string path;
};

// 0 when `path` names something that is there and readable, else the errno that says why not.
int file_errno(const std::string& path);
// Inside a catch of the library's error e: throws FileAccessError when e names one of `paths`
// (its message holds it) and that file is missing or unreadable; returns otherwise.
void throw_if_file_error(const Error& e, const std::vector<std::string>& paths);
// f(), with a library error about one of `paths` raised as FileAccessError (throw_if_file_error).
template <class F>
auto with_files(const std::vector<std::string>& paths, F&& f) -> decltype(f()) {
    try {
        return f();
    } catch (const Error& e) {
        throw_if_file_error(e, paths);
        throw;
    }
}

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

// f32: float32, bf16: ml_dtypes.bfloat16, f16: float16, e4m3: ml_dtypes.float8_e4m3fn, e5m2:
// ml_dtypes.float8_e5m2 (an Error saying to pip install ml_dtypes when it is missing).
py::dtype numpy_dtype(DType t);
// v's floats as an array of dtype t that owns its data (exact when v holds t's values, as a
// probe of a narrow activation does).
py::array narrowed(const float* v, const std::vector<i64>& shape, DType t);
// x (shape, fp32) cast to fp8 as the model casts it: delayed (scale given; role dy in e5m2, else
// e4m3) or block-wise (tiles of 1 x block, or block x block for role w): {q, scale, scale_inv,
// values, ...} as parallax.fp8_cast documents.
py::dict fp8_cast_dict(const float* x, const std::vector<i64>& shape, bool delayed,
                       Fp8Scaling::Role role, float scale, i64 block);
// None without fp8; else recipe, gemms, roles, dtypes, fp8_max, block_size and (delayed) scale
// (gemms, 3) and amax_history (gemms, 3, history_len): read-only views whose base is `owner`.
py::object fp8_state_dict(const Fp8Scaling* f, const py::handle& owner);
// None without fp8 state; else gemms (names, from cfg when given), scale, amax_history (copies).
py::object fp8_checkpoint_dict(const CheckpointMeta& m, const Config* cfg);

// cfg's layout run for one step with a recorder around every group (GIL released); ConfigError
// with the library's sentence when the layout cannot run.
views::ExplorerResult explore(const Config& cfg);
py::dict explored(const views::ExplorerResult& r);  // parallax.explore_layout's dict
std::string explored_words(const views::ExplorerResult& r);  // holds, collectives, memory: lines

// The array takes the vector over (a capsule owns it): the floats are not copied. An empty shape
// is flat.
py::array adopt(std::vector<float> v, const std::vector<i64>& shape);

// Until the run is paused, finished or failed, with the GIL released, checking for signals every
// 50 ms: on Ctrl-C (or any signal handler that raises) the run is held after the step in
// progress, waited for, and the Python exception propagates, leaving the run usable. A failed
// run's error is raised.
void wait_interruptibly(SteppedRun& run);

// work(cancel) on a thread of its own while the calling (Python) thread waits with the GIL
// released, checking for signals every 50 ms. On Ctrl-C (or any signal handler that raises) the
// cancel answers true, the work stops after the step in progress (core/train/runner.h Cancel),
// its thread is joined and the Python exception propagates; otherwise the work's own exception,
// if any, is rethrown. The work must not touch Python objects.
void run_interruptibly(const std::function<void(const Cancel&)>& work);

}  // namespace px::py_bind
