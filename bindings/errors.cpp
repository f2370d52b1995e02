// The library's exceptions as Python exceptions, with the library's messages:
//   ParallaxError(RuntimeError)        px::Error, and everything below; also a call the job
//                                      cannot take in its state (docs/python.md, "Errors")
//   ConfigError(ParallaxError, ValueError)    a config key unknown, mistyped or out of range
//   ConfigKeyError(ConfigError, KeyError)     Config()[key] of a key or section not there
//   RankIndexError(ConfigError, IndexError)   job.rank(r) of a rank not in the layout
//   DataError(ParallaxError, ValueError)      a malformed data, checkpoint or llm.c file
//   CheckpointError(DataError)                a checkpoint that cannot be used
//   CorruptionError(ParallaxError)            silent data corruption a re-run reproduced
//   CommError(ParallaxError)                  a rank died, stalled or could not communicate
//   StorageError(ParallaxError, OSError)      an output that could not be written
//   InternalError(ParallaxError)              a bug in Parallax
// A file that is missing or unreadable raises its error's class made also an OSError: a class
// of both, e.g. CheckpointError and FileNotFoundError, named as the first (FileAccessError).
#include "bindings/common.h"
#include "core/base/error.h"
#include "core/comm/comm.h"
#include "core/io/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

namespace px::py_bind {

namespace {

// Created once and kept for the life of the interpreter (never released: the module is never
// unloaded, and a static py::object would be released after the interpreter is gone).
PyObject* g_parallax = nullptr;
PyObject* g_config = nullptr;
PyObject* g_config_key = nullptr;
PyObject* g_rank_index = nullptr;
PyObject* g_data = nullptr;
PyObject* g_checkpoint = nullptr;
PyObject* g_corruption = nullptr;
PyObject* g_comm = nullptr;
PyObject* g_storage = nullptr;
PyObject* g_internal = nullptr;

// A class parallax.<name> of `bases`; str() of an instance is its message as given (KeyError's
// own str() would quote it).
PyObject* new_exception(const char* name, const char* doc, std::initializer_list<PyObject*> bases) {
    py::tuple b(bases.size());
    size_t i = 0;
    for (PyObject* base : bases) b[i++] = py::reinterpret_borrow<py::object>(base);
    py::dict d;
    d["__str__"] = py::reinterpret_borrow<py::object>(PyExc_BaseException).attr("__str__");
    const std::string qualified = std::string("parallax.") + name;
    PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, b.ptr(), d.ptr());
    if (!type) throw py::error_already_set();
    return type;
}

PyObject* make_exception(py::module_& m, const char* name, const char* doc,
                         std::initializer_list<PyObject*> bases) {
    PyObject* type = new_exception(name, doc, bases);
    m.add_object(name, py::reinterpret_borrow<py::object>(type));
    return type;
}

// The Python class of a library error (null: not one of the library's).
PyObject* class_of(const std::exception_ptr& p) {
    try {
        std::rethrow_exception(p);
    } catch (const KeyLookupError&) {
        return g_config_key;
    } catch (const IndexLookupError&) {
        return g_rank_index;
    } catch (const CheckpointError&) {
        return g_checkpoint;
    } catch (const ConfigError&) {
        return g_config;
    } catch (const DataError&) {
        return g_data;
    } catch (const CorruptionError&) {
        return g_corruption;
    } catch (const comm::CommError&) {
        return g_comm;
    } catch (const StorageError&) {
        return g_storage;
    } catch (const InternalError&) {
        return g_internal;
    } catch (const Error&) {
        return g_parallax;
    } catch (...) {
        return nullptr;
    }
}

// `base` made also the OSError of `err`: one class per pair, made when first raised.
PyObject* file_class(PyObject* base, int err) {
    PyObject* os = err == ENOENT || err == ENOTDIR ? PyExc_FileNotFoundError
                   : err == EACCES || err == EPERM ? PyExc_PermissionError
                                                   : PyExc_OSError;
    static std::map<std::pair<PyObject*, PyObject*>, PyObject*> made;  // kept, as the classes
    PyObject*& cls = made[{base, os}];
    if (!cls) {
        const std::string name = py::str(py::handle(base).attr("__name__"));
        const std::string doc = name + ", about a file, that is also a " +
                                std::string(reinterpret_cast<PyTypeObject*>(os)->tp_name) + ".";
        cls = new_exception(name.c_str(), doc.c_str(), {base, os});
    }
    return cls;
}

void raise_file_error(const FileAccessError& e) {
    PyObject* base = class_of(e.cause);
    PyObject* cls = file_class(base ? base : g_parallax, e.err);
    py::object inst = py::reinterpret_borrow<py::object>(cls)(e.what());
    inst.attr("errno") = e.err;
    inst.attr("strerror") = std::strerror(e.err);
    inst.attr("filename") = e.path;
    PyErr_SetObject(cls, inst.ptr());
}

}  // namespace

int file_errno(const std::string& path) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) return errno;
    if (::access(path.c_str(), R_OK) != 0) return errno;
    return 0;
}

void throw_if_file_error(const Error& e, const std::vector<std::string>& paths) {
    if (dynamic_cast<const FileAccessError*>(&e)) return;
    const std::string what = e.what();
    for (const std::string& path : paths) {
        if (path.empty() || what.find(path) == std::string::npos) continue;
        if (const int err = file_errno(path); err != 0)
            throw FileAccessError(std::current_exception(), what, err, path);
    }
}

void bind_errors(py::module_& m) {
    g_parallax = make_exception(m, "ParallaxError",
                                "Base of every error Parallax raises; the message is the library's "
                                "sentence: what was wrong, where, and what to do.",
                                {PyExc_RuntimeError});
    g_config = make_exception(m, "ConfigError",
                              "A job config key is unknown, mistyped or out of range, or a layout "
                              "the job cannot take; the message names the key.",
                              {g_parallax, PyExc_ValueError});
    g_config_key = make_exception(m, "ConfigKeyError",
                                  "Config()[key] of a section or key the config does not have; "
                                  "also a KeyError.",
                                  {g_config, PyExc_KeyError});
    g_rank_index = make_exception(m, "RankIndexError",
                                  "A rank the job's layout does not have (job.rank(r)); also an "
                                  "IndexError.",
                                  {g_config, PyExc_IndexError});
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
        } catch (const FileAccessError& e) {
            raise_file_error(e);
        } catch (const Error& e) {
            PyErr_SetString(class_of(p), e.what());
        }
    });
}

}  // namespace px::py_bind
