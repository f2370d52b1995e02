// The library's exceptions as Python exceptions, with the library's messages:
//   ParallaxError(RuntimeError)        px::Error, and everything below
//   ConfigError(ParallaxError, ValueError)    a config key unknown, mistyped or out of range
//   DataError(ParallaxError, ValueError)      a malformed data, checkpoint or llm.c file
//   CheckpointError(DataError)                a checkpoint that cannot be used
//   CorruptionError(ParallaxError)            silent data corruption a re-run reproduced
//   CommError(ParallaxError)                  a rank died, stalled or could not communicate
//   StorageError(ParallaxError, OSError)      an output that could not be written
//   InternalError(ParallaxError)              a bug in Parallax
#include "bindings/common.h"
#include "core/base/error.h"
#include "core/comm/comm.h"
#include "core/io/checkpoint.h"

namespace px::py_bind {

namespace {

// Created once and kept for the life of the interpreter (never released: the module is never
// unloaded, and a static py::object would be released after the interpreter is gone).
PyObject* g_parallax = nullptr;
PyObject* g_config = nullptr;
PyObject* g_data = nullptr;
PyObject* g_checkpoint = nullptr;
PyObject* g_corruption = nullptr;
PyObject* g_comm = nullptr;
PyObject* g_storage = nullptr;
PyObject* g_internal = nullptr;

PyObject* make_exception(py::module_& m, const char* name, const char* doc,
                         std::initializer_list<PyObject*> bases) {
    py::tuple b(bases.size());
    size_t i = 0;
    for (PyObject* base : bases) b[i++] = py::reinterpret_borrow<py::object>(base);
    const std::string qualified = std::string("parallax.") + name;
    PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, b.ptr(), nullptr);
    if (!type) throw py::error_already_set();
    m.add_object(name, py::reinterpret_borrow<py::object>(type));
    return type;
}

}  // namespace

void bind_errors(py::module_& m) {
    g_parallax = make_exception(m, "ParallaxError",
                                "Base of every error Parallax raises; the message is the library's "
                                "sentence: what was wrong, where, and what to do.",
                                {PyExc_RuntimeError});
    g_config = make_exception(m, "ConfigError",
                              "A job config key is unknown, mistyped or out of range, or a layout "
                              "the job cannot take; the message names the key.",
                              {g_parallax, PyExc_ValueError});
    g_data = make_exception(m, "DataError",
                            "A data, checkpoint or llm.c file is malformed; the message names the "
                            "file.",
                            {g_parallax, PyExc_ValueError});
    g_checkpoint = make_exception(m, "CheckpointError",
                                  "A checkpoint that cannot be used (corrupt, truncated, another "
                                  "model or data stream); the message names the file.",
                                  {g_data});
    g_corruption = make_exception(m, "CorruptionError",
                                  "Silent data corruption: the replicas disagree and a re-run "
                                  "reproduced it; the message names the ranks and the step.",
                                  {g_parallax});
    g_comm = make_exception(m, "CommError",
                            "A rank died, stalled past layout.timeout_s or could not communicate; "
                            "the message names it.",
                            {g_parallax});
    g_storage = make_exception(m, "StorageError",
                               "An output could not be written (a full or failing file system).",
                               {g_parallax, PyExc_OSError});
    g_internal = make_exception(m, "InternalError", "A bug in Parallax: report it with the message.",
                                {g_parallax});

    py::register_exception_translator([](std::exception_ptr p) {
        if (!p) return;
        try {
            std::rethrow_exception(p);
        } catch (const CheckpointError& e) {
            PyErr_SetString(g_checkpoint, e.what());
        } catch (const ConfigError& e) {
            PyErr_SetString(g_config, e.what());
        } catch (const DataError& e) {
            PyErr_SetString(g_data, e.what());
        } catch (const CorruptionError& e) {
            PyErr_SetString(g_corruption, e.what());
        } catch (const comm::CommError& e) {
            PyErr_SetString(g_comm, e.what());
        } catch (const StorageError& e) {
            PyErr_SetString(g_storage, e.what());
        } catch (const InternalError& e) {
            PyErr_SetString(g_internal, e.what());
        } catch (const Error& e) {
            PyErr_SetString(g_parallax, e.what());
        }
    });
}

}  // namespace px::py_bind
