// The library's exceptions raised as the Python classes of parallax.errors (its docstring lists
// them), with the library's messages. A file that is missing or unreadable raises its error's
// class made also an OSError (parallax.errors.file_error_class).
#include "bindings/common.h"
#include "core/base/error.h"
#include "core/comm/comm.h"
#include "core/io/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace px::py_bind {

namespace {

// Borrowed from parallax.errors once and kept for the life of the interpreter (never released:
// the module is never unloaded, and a static py::object would be released after the interpreter
// is gone).
PyObject* g_errors = nullptr;
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

PyObject* error_class(const char* name) {
    return py::object(py::reinterpret_borrow<py::object>(g_errors).attr(name)).release().ptr();
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

// `base` made also the OSError of `err`.
py::object file_class(PyObject* base, int err) {
    PyObject* os = err == ENOENT || err == ENOTDIR ? PyExc_FileNotFoundError
                   : err == EACCES || err == EPERM ? PyExc_PermissionError
                                                   : PyExc_OSError;
    return py::reinterpret_borrow<py::object>(g_errors).attr("file_error_class")(
        py::handle(base), py::handle(os));
}

void raise_file_error(const FileAccessError& e) {
    PyObject* base = class_of(e.cause);
    const py::object cls = file_class(base ? base : g_parallax, e.err);
    py::object inst = cls(e.what());
    inst.attr("errno") = e.err;
    inst.attr("strerror") = std::strerror(e.err);
    inst.attr("filename") = e.path;
    PyErr_SetObject(cls.ptr(), inst.ptr());
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

void bind_errors(py::module_&) {
    g_errors = py::module_::import("parallax.errors").release().ptr();
    g_parallax = error_class("ParallaxError");
    g_config = error_class("ConfigError");
    g_config_key = error_class("ConfigKeyError");
    g_rank_index = error_class("RankIndexError");
    g_data = error_class("DataError");
    g_checkpoint = error_class("CheckpointError");
    g_corruption = error_class("CorruptionError");
    g_comm = error_class("CommError");
    g_storage = error_class("StorageError");
    g_internal = error_class("InternalError");

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
