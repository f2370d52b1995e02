// HDF5 plumbing shared by the files that speak it (core/runfile.cpp, core/checkpoint.cpp,
// core/checkpoint_llmc.cpp, core/state.cpp): one thread in the library at a time, quiet calls,
// the innermost error message, handles closed on scope exit, and the time stamp they store.
#pragma once
#include <hdf5.h>

#include <ctime>
#include <mutex>
#include <string>

namespace px {

// Debian's HDF5 (serial and openmpi) is built without thread safety, and in-process ranks are
// threads that may read a checkpoint while rank 0 writes the run file: every use of the library
// runs under this one process-wide lock. Recursive, so a locked function may call another. Never
// hold it across a collective of in-process ranks (a peer waiting for it would never arrive).
inline std::recursive_mutex& hdf5_lock() {
    static std::recursive_mutex m;
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
