// HDF5 plumbing shared by the files that speak it (core/io/runfile.cpp, core/io/checkpoint_read.cpp,
// checkpoint_write.cpp, checkpoint_llmc.cpp, validators/trace.cpp): one thread in the library at
// a time, quiet calls, the innermost error message, handles closed on scope exit, attributes
// (h5::put_*, h5::get_*: fixed-length strings, scalars), compact group storage, the time stamp.
#pragma once
#include <hdf5.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>
#include <vector>

namespace px {

// Debian's HDF5 (serial and openmpi) is built without thread safety, and in-process ranks are
// threads that may read a checkpoint while rank 0 writes the run file: every use of the library
// runs under this one process-wide lock. Recursive, so a locked function may call another. Never
// hold it across a collective of in-process ranks (a peer waiting for it would never arrive).
inline std::recursive_mutex& hdf5_lock() {
    static std::recursive_mutex m;
    // Before the library's first use: HDF5 must not shut itself down at exit. A file whose
    // writes failed (a full disk) keeps a half-closed handle, which that shutdown would try to
    // flush again and crash on; every file that closed normally is closed already, and the
    // operating system takes back the rest.
    [[maybe_unused]] static const bool no_shutdown_at_exit = (H5dont_atexit(), true);
    return m;
}

// One piece of work in HDF5: holds hdf5_lock() and silences HDF5's automatic error-stack
// printing, restoring whatever the process had before (other code may want HDF5's printing).
// Declare it before any handle (H5Handle) of the scope, so that they close under the lock.
class QuietHdf5 {
public:
    QuietHdf5() : lock_(hdf5_lock()) {
        H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
        H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    }
    ~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
    QuietHdf5(const QuietHdf5&) = delete;
    QuietHdf5& operator=(const QuietHdf5&) = delete;

private:
    std::lock_guard<std::recursive_mutex> lock_;
    H5E_auto2_t func_ = nullptr;
    void* data_ = nullptr;
};

// The innermost HDF5 error message (the most specific) as " (HDF5: ...)", then clears the stack.
inline std::string hdf5_detail() {
    std::string msg;
    H5Ewalk2(
        H5E_DEFAULT, H5E_WALK_UPWARD,
        [](unsigned n, const H5E_error2_t* err, void* data) -> herr_t {
            if (n == 0 && err->desc) *static_cast<std::string*>(data) = err->desc;
            return 0;
        },
        &msg);
    H5Eclear2(H5E_DEFAULT);
    return msg.empty() ? std::string() : " (HDF5: " + msg + ")";
}

// An HDF5 handle closed on scope exit (or by close()).
class H5Handle {
public:
    H5Handle() = default;
    H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
    ~H5Handle() { close(); }
    H5Handle(H5Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
    H5Handle& operator=(H5Handle&& o) noexcept {
        if (this != &o) {
            close();
            id_ = o.id_;
            close_ = o.close_;
            o.id_ = -1;
        }
        return *this;
    }
    H5Handle(const H5Handle&) = delete;
    H5Handle& operator=(const H5Handle&) = delete;
    hid_t get() const { return id_; }
    bool ok() const { return id_ >= 0; }
    herr_t close() {
        herr_t r = 0;
        if (id_ >= 0 && close_) r = close_(id_);
        id_ = -1;
        return r;
    }

private:
    hid_t id_ = -1;
    herr_t (*close_)(hid_t) = nullptr;
};

// ---- attributes and storage, shared by the checkpoint and the probe trace ----

namespace h5 {

using H = H5Handle;

inline H scalar_space() { return H(H5Screate(H5S_SCALAR), H5Sclose); }

inline H string_type() {
    H t(H5Tcopy(H5T_C_S1), H5Tclose);
    if (t.ok()) {
        H5Tset_size(t.get(), H5T_VARIABLE);
        H5Tset_cset(t.get(), H5T_CSET_UTF8);
    }
    return t;
}

// Fixed-length strings (h5py returns them as bytes): a variable-length string would live in the
// global heap, which has no checksum, and HDF5 can loop forever on a damaged one; a fixed-length
// one lives in the object header, which the 1.8 format checksums.
inline bool put_string(hid_t obj, const char* key, const std::string& value) {
    H type(H5Tcopy(H5T_C_S1), H5Tclose);
    const size_t n = std::max<size_t>(value.size(), 1);
    if (!type.ok() || H5Tset_size(type.get(), n) < 0 ||
        H5Tset_strpad(type.get(), H5T_STR_NULLPAD) < 0 || H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
        return false;
    std::string buf = value;
    buf.resize(n, '\0');
    H space = scalar_space();
    H attr(H5Acreate2(obj, key, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    return space.ok() && attr.ok() && H5Awrite(attr.get(), type.get(), buf.data()) >= 0;
}

inline bool put_i64(hid_t obj, const char* key, std::int64_t value) {
    H space = scalar_space();
    H attr(H5Acreate2(obj, key, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    return space.ok() && attr.ok() && H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) >= 0;
}

inline bool put_u64(hid_t obj, const char* key, std::uint64_t value) {
    H space = scalar_space();
    H attr(H5Acreate2(obj, key, H5T_STD_U64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    return space.ok() && attr.ok() && H5Awrite(attr.get(), H5T_NATIVE_UINT64, &value) >= 0;
}

inline bool put_f64(hid_t obj, const char* key, double value) {
    H space = scalar_space();
    H attr(H5Acreate2(obj, key, H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    return space.ok() && attr.ok() && H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value) >= 0;
}

// Links and attributes kept in their group's object header ("compact" storage), which the 1.8
// format checksums, never in "dense" storage (a fractal heap and a B-tree, which HDF5 switches
// to past 8 links or attributes): fractal heap blocks carry no checksum, and HDF5 1.10 frees
// garbage pointers while walking a damaged one (found by the random-damage test), so a flipped
// bit there could crash a reader instead of failing a checksum. An object header holds up to
// 64 KiB of messages per chunk and chains more chunks, so GPT-2's 148 tensors fit with room.
inline bool compact_storage(hid_t plist) {
    return H5Pset_link_phase_change(plist, 65535, 65535) >= 0 &&
           H5Pset_attr_phase_change(plist, 65535, 65535) >= 0;
}

// Reading attributes: nullopt-like failure is reported by the caller with the attribute's name.
inline bool get_string(hid_t obj, const char* key, std::string& out) {
    if (H5Aexists(obj, key) <= 0) return false;
    H attr(H5Aopen(obj, key, H5P_DEFAULT), H5Aclose);
    if (!attr.ok()) return false;
    H ftype(H5Aget_type(attr.get()), H5Tclose);
    if (!ftype.ok() || H5Tget_class(ftype.get()) != H5T_STRING) return false;
    if (H5Tis_variable_str(ftype.get()) > 0) {
        H mtype = string_type();
        char* text = nullptr;
        if (H5Aread(attr.get(), mtype.get(), &text) < 0) return false;
        out = text ? text : "";
        H5free_memory(text);
        return true;
    }
    const size_t n = H5Tget_size(ftype.get());
    std::string buf(n, '\0');
    H mtype(H5Tcopy(ftype.get()), H5Tclose);  // the file's own string type: no conversion
    if (n == 0 || !mtype.ok() || H5Aread(attr.get(), mtype.get(), buf.data()) < 0) return false;
    out = buf.substr(0, buf.find('\0'));
    return true;
}

template <class T>
inline bool get_number(hid_t obj, const char* key, hid_t mem_type, T& out) {
    if (H5Aexists(obj, key) <= 0) return false;
    H attr(H5Aopen(obj, key, H5P_DEFAULT), H5Aclose);
    if (!attr.ok()) return false;
    H space(H5Aget_space(attr.get()), H5Sclose);
    if (!space.ok() || H5Sget_simple_extent_npoints(space.get()) != 1) return false;
    H ftype(H5Aget_type(attr.get()), H5Tclose);
    const H5T_class_t cls = H5Tget_class(ftype.get());
    if (cls != H5T_INTEGER && cls != H5T_FLOAT) return false;
    return H5Aread(attr.get(), mem_type, &out) >= 0;
}

// A 1-D integer attribute of at most 32 elements (a hyperslab's corner), read as int64.
inline bool get_i64_array(hid_t obj, const char* key, std::vector<std::int64_t>& out) {
    if (H5Aexists(obj, key) <= 0) return false;
    H attr(H5Aopen(obj, key, H5P_DEFAULT), H5Aclose);
    if (!attr.ok()) return false;
    H space(H5Aget_space(attr.get()), H5Sclose);
    const hssize_t n = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
    H ftype(H5Aget_type(attr.get()), H5Tclose);
    if (n < 1 || n > 32 || !ftype.ok() || H5Tget_class(ftype.get()) != H5T_INTEGER) return false;
    out.resize(static_cast<size_t>(n));
    return H5Aread(attr.get(), H5T_NATIVE_INT64, out.data()) >= 0;
}

// Parallax's files hold every dataset whole (contiguous, allocated when created), so a dataset
// whose shape claims more bytes than its file holds is damage (an extent that was never written
// can claim terabytes). Readers ask before they size a buffer by a shape. In doubles: no product
// of dimensions overflows.
inline double claimed_bytes(hid_t dset) {
    H space(H5Dget_space(dset), H5Sclose);
    H type(H5Dget_type(dset), H5Tclose);
    const int nd = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
    if (nd < 0 || nd > 32 || !type.ok()) return -1;
    hsize_t dims[32] = {};
    if (H5Sget_simple_extent_dims(space.get(), dims, nullptr) < 0) return -1;
    double bytes = static_cast<double>(H5Tget_size(type.get()));
    for (int i = 0; i < nd; i++) bytes *= static_cast<double>(dims[i]);
    return bytes;
}
inline double file_bytes_of(hid_t obj) {
    const hid_t f = H5Iget_file_id(obj);
    hsize_t size = 0;
    const bool ok = f >= 0 && H5Fget_filesize(f, &size) >= 0;
    if (f >= 0) H5Fclose(f);
    return ok ? static_cast<double>(size) : -1;
}
// "" when the dataset's claim fits its file, else the sentence that says it does not.
inline std::string oversized(hid_t dset, const std::string& name) {
    const double claim = claimed_bytes(dset), file = file_bytes_of(dset);
    if (claim >= 0 && file >= 0 && claim <= file) return "";
    if (claim < 0 || file < 0) return "the shape of " + name + " cannot be read";
    auto bytes = [](double b) {
        char text[48];
        std::snprintf(text, sizeof text, "%.0f bytes", b);
        return std::string(text);
    };
    return name + " claims " + bytes(claim) + ", more than the whole file (" + bytes(file) + ")";
}

}  // namespace h5

// Now, as ISO 8601 UTC ("2026-11-29T20:29:06Z").
inline std::string iso_time_utc() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&now, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

}  // namespace px
