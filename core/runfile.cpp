#include "core/runfile.h"

#include "core/error.h"
#include "core/hdf5_util.h"

#include <ctime>
#include <unordered_map>
#include <utility>

#include <hdf5.h>

namespace px {

namespace {

constexpr const char* kParallaxVersion =
    "0.1.0";  // keep in step with meson.build's project version
constexpr hsize_t kChunkRows = 256;

using Handle = H5Handle;

}  // namespace

struct RunFile::Impl {
    struct Metric {
        hid_t group = -1, step = -1, value = -1;
        hsize_t rows = 0;
    };

    std::string path;
    hid_t file = -1;
    hid_t metrics = -1;
    std::unordered_map<std::string, Metric> series;

    ~Impl() {
        QuietHdf5 quiet;
        for (auto& [name, m] : series) {
            if (m.step >= 0) H5Dclose(m.step);
            if (m.value >= 0) H5Dclose(m.value);
            if (m.group >= 0) H5Gclose(m.group);
        }
        if (metrics >= 0) H5Gclose(metrics);
        if (file >= 0) {
            H5Fflush(file, H5F_SCOPE_LOCAL);
            H5Fclose(file);
        }
    }

    [[noreturn]] void fail(const std::string& what) const {
        throw Error("run file " + path + ": " + what + hdf5_detail());
    }

    void remove_attr(const std::string& key) {
        const htri_t exists = H5Aexists(file, key.c_str());
        if (exists < 0) fail("cannot look up attribute '" + key + "'");
        if (exists > 0 && H5Adelete(file, key.c_str()) < 0)
            fail("cannot replace attribute '" + key + "'");
    }

    void write_string_attr(const std::string& key, const std::string& value) {
        remove_attr(key);
        Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
        if (!type.ok() || H5Tset_size(type.get(), H5T_VARIABLE) < 0 ||
            H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
            fail("cannot make a string type");
        Handle space(H5Screate(H5S_SCALAR), H5Sclose);
        Handle attr(
            H5Acreate2(file, key.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
            H5Aclose);
        const char* text = value.c_str();
        if (!space.ok() || !attr.ok() || H5Awrite(attr.get(), type.get(), &text) < 0)
            fail("cannot write attribute '" + key + "'");
    }

    void write_double_attr(const std::string& key, double value) {
        remove_attr(key);
        Handle space(H5Screate(H5S_SCALAR), H5Sclose);
        Handle attr(
            H5Acreate2(file, key.c_str(), H5T_IEEE_F64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
            H5Aclose);
        if (!space.ok() || !attr.ok() || H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value) < 0)
            fail("cannot write attribute '" + key + "'");
    }

    // An empty, extendible 1-D dataset of `type` in `group`.
    hid_t create_series(hid_t group, const char* name, hid_t type, const std::string& metric) {
        const hsize_t dims = 0, maxdims = H5S_UNLIMITED, chunk = kChunkRows;
        Handle space(H5Screate_simple(1, &dims, &maxdims), H5Sclose);
        Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
        if (!space.ok() || !dcpl.ok() || H5Pset_chunk(dcpl.get(), 1, &chunk) < 0)
            fail("cannot set up /metrics/" + metric + "/" + name);
        const hid_t d =
            H5Dcreate2(group, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT);
        if (d < 0) fail("cannot create /metrics/" + metric + "/" + name);
        return d;
    }

    Metric& metric(const std::string& name) {
        auto it = series.find(name);
        if (it != series.end()) return it->second;
        if (name.empty() || name.find('/') != std::string::npos)
            throw Error("run file " + path + ": metric name '" + name +
                        "' is not usable: it must be non-empty and contain no '/'");
        Metric m;
        m.group = H5Gcreate2(metrics, name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (m.group < 0) fail("cannot create group /metrics/" + name);
        Metric& slot = series.emplace(name, m).first->second;  // owned from here: ~Impl closes it
        slot.step = create_series(slot.group, "step", H5T_STD_I64LE, name);
        slot.value = create_series(slot.group, "value", H5T_IEEE_F64LE, name);
        return slot;
    }

    // The group at `path` ("a/b"), created with its parents when missing; the caller closes it.
    hid_t group_at(const std::string& gpath) {
        hid_t g = H5Gopen2(file, "/", H5P_DEFAULT);
        size_t start = 0;
        while (g >= 0 && start < gpath.size()) {
            const size_t end = gpath.find('/', start);
            const std::string part = gpath.substr(start, end == std::string::npos ? end : end - start);
            if (part.empty()) fail("empty part in the path '" + gpath + "'");
            const htri_t exists = H5Lexists(g, part.c_str(), H5P_DEFAULT);
            const hid_t next = exists > 0 ? H5Gopen2(g, part.c_str(), H5P_DEFAULT)
                                          : H5Gcreate2(g, part.c_str(), H5P_DEFAULT, H5P_DEFAULT,
                                                       H5P_DEFAULT);
            H5Gclose(g);
            g = next;
            if (end == std::string::npos) break;
            start = end + 1;
        }
        if (g < 0) fail("cannot create group /" + gpath);
        return g;
    }

    void write_array(const std::string& where, hid_t file_type, hid_t mem_type, const void* data,
                     const std::vector<i64>& shape) {
        const size_t slash = where.rfind('/');
        const std::string name = slash == std::string::npos ? where : where.substr(slash + 1);
        if (name.empty()) fail("array path '" + where + "' has no name");
        Handle group(group_at(slash == std::string::npos ? "" : where.substr(0, slash)), H5Gclose);
        std::vector<hsize_t> dims(shape.begin(), shape.end());
        Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                     H5Sclose);
        Handle dset(H5Dcreate2(group.get(), name.c_str(), file_type, space.get(), H5P_DEFAULT,
                               H5P_DEFAULT, H5P_DEFAULT),
                    H5Dclose);
        if (!space.ok() || !dset.ok() ||
            H5Dwrite(dset.get(), mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0)
            fail("cannot write /" + where);
    }

    // Writes row `row` of a 1-D dataset, growing it by one.
    void write_row(hid_t dset, hsize_t row, hid_t mem_type, const void* v,
                   const std::string& what) {
        const hsize_t n = row + 1, one = 1;
        if (H5Dset_extent(dset, &n) < 0) fail("cannot extend " + what);
        Handle fspace(H5Dget_space(dset), H5Sclose);
        Handle mspace(H5Screate_simple(1, &one, nullptr), H5Sclose);
        if (!fspace.ok() || !mspace.ok() ||
            H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &row, nullptr, &one, nullptr) < 0 ||
            H5Dwrite(dset, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, v) < 0)
            fail("cannot append to " + what);
    }
};

RunFile::RunFile(const std::string& path, const std::string& config_toml)
    : impl_(std::make_unique<Impl>()) {
    QuietHdf5 quiet;
    impl_->path = path;
    impl_->file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (impl_->file < 0) impl_->fail("cannot create it; does its folder exist and is it writable?");
    impl_->write_string_attr("config", config_toml);
    impl_->write_string_attr("parallax_version", kParallaxVersion);
    impl_->write_string_attr("created", iso_time_utc());
    impl_->metrics = H5Gcreate2(impl_->file, "metrics", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (impl_->metrics < 0) impl_->fail("cannot create group /metrics");
}

RunFile::~RunFile() = default;
RunFile::RunFile(RunFile&&) noexcept = default;
RunFile& RunFile::operator=(RunFile&&) noexcept = default;

void RunFile::append(const std::string& metric, i64 step, double value) {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    QuietHdf5 quiet;
    Impl::Metric& m = impl_->metric(metric);
    const std::int64_t s = step;
    impl_->write_row(m.step, m.rows, H5T_NATIVE_INT64, &s, "/metrics/" + metric + "/step");
    impl_->write_row(m.value, m.rows, H5T_NATIVE_DOUBLE, &value, "/metrics/" + metric + "/value");
    m.rows++;
}

void RunFile::set_attr(const std::string& key, const std::string& value) {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    QuietHdf5 quiet;
    impl_->write_string_attr(key, value);
}

void RunFile::set_attr(const std::string& key, double value) {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    QuietHdf5 quiet;
    impl_->write_double_attr(key, value);
}

void RunFile::write_array(const std::string& where, const float* data,
                          const std::vector<i64>& shape) {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    QuietHdf5 quiet;
    impl_->write_array(where, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, data, shape);
}

void RunFile::write_array(const std::string& where, const double* data,
                          const std::vector<i64>& shape) {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    QuietHdf5 quiet;
    impl_->write_array(where, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, data, shape);
}

void RunFile::flush() {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    QuietHdf5 quiet;
    if (H5Fflush(impl_->file, H5F_SCOPE_LOCAL) < 0) impl_->fail("flush failed");
}

const std::string& RunFile::path() const {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    return impl_->path;
}

}  // namespace px
