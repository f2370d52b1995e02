#include "core/io/runfile.h"

#include "core/base/config.h"
#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "core/io/hdf5_util.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <unordered_map>
#include <utility>

#include <fcntl.h>
#include <hdf5.h>
#include <unistd.h>

namespace px {

namespace {

// Room a run file keeps beside it while open: enough for HDF5 to flush its metadata when it
// closes on a disk that filled up meanwhile.
constexpr off_t kReserveBytes = 256 * 1024;

constexpr const char* kParallaxVersion =
    "0.1.0";  // keep in step with meson.build's project version
constexpr hsize_t kChunkRows = 256;

using Handle = H5Handle;

}  // namespace

struct RunFile::Impl {
    struct Metric {
        hid_t group = -1, step = -1, value = -1;
        hsize_t rows = 0;
        i64 last = 0;  // the step of the last row (0: none)
    };

    std::string path;
    std::string label = "run file";  // the file's name in errors
    std::string reserve;             // keep_reserve's file; "" when none
    hid_t file = -1;
    hid_t metrics = -1;
    std::unordered_map<std::string, Metric> series;
    hid_t events = -1, ev_step = -1, ev_kind = -1, ev_message = -1;  // /events, once used
    hid_t ev_evidence = -1;  // /events/evidence: once an event has some (older files: none)
    hsize_t ev_rows = 0;
    hid_t fp8 = -1;                // /fp8, once used
    std::vector<hid_t> fp8_cols;   // in fp8_columns() order
    hsize_t fp8_rows = 0;
    i64 fp8_last = 0;  // the step of the last row (0: none)

    ~Impl() {
        QuietHdf5 quiet;
        // The reserve goes first: on a full disk its room lets the close below flush HDF5's
        // metadata (a close that fails leaves a half-closed file that HDF5 crashes on later).
        if (!reserve.empty()) std::remove(reserve.c_str());
        for (auto& [name, m] : series) {
            if (m.step >= 0) H5Dclose(m.step);
            if (m.value >= 0) H5Dclose(m.value);
            if (m.group >= 0) H5Gclose(m.group);
        }
        for (hid_t d : {ev_step, ev_kind, ev_message, ev_evidence})
            if (d >= 0) H5Dclose(d);
        if (events >= 0) H5Gclose(events);
        for (hid_t d : fp8_cols)
            if (d >= 0) H5Dclose(d);
        if (fp8 >= 0) H5Gclose(fp8);
        if (metrics >= 0) H5Gclose(metrics);
        if (file >= 0) {
            H5Fflush(file, H5F_SCOPE_LOCAL);
            H5Fclose(file);
        }
    }

    // A failure the file system caused (full, failing) is a StorageError; others an Error.
    [[noreturn]] void fail(const std::string& what) const {
        const std::string detail = hdf5_detail();
        const std::string msg = label + " " + path + ": " + what + detail;
        if (detail.find("errno = 28") != std::string::npos ||  // ENOSPC
            detail.find("errno = 5,") != std::string::npos ||  // EIO
            detail.find("errno = 122") != std::string::npos)   // EDQUOT
            throw StorageError(msg + "; its file system is full or failing: free space there");
        throw Error(msg);
    }

    // Room kept beside the file while it is open (kReserveBytes, when the file system grants
    // it), given back before the file closes.
    void keep_reserve() {
        std::string name = ".";  // appended piecewise: GCC 12 misreads "." + a string
        name += std::filesystem::path(path).filename().string();
        name += ".reserve";
        reserve = (std::filesystem::path(path).parent_path() / name).string();
        const int fd = ::open(reserve.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) {
            reserve.clear();
            return;
        }
        const int err = ::posix_fallocate(fd, 0, kReserveBytes);
        ::close(fd);
        if (err != 0) {  // no room even for that: nothing to give back later
            std::remove(reserve.c_str());
            reserve.clear();
        }
    }

    // A part of a reopened file is not what a run file holds.
    [[noreturn]] void damaged(const std::string& what) const {
        throw RunFileDamaged(label + " " + path + ": " + what + "; the file is damaged" +
                             hdf5_detail());
    }

    void remove_attr(const std::string& key) {
        const htri_t exists = H5Aexists(file, key.c_str());
        if (exists < 0) fail("cannot look up attribute '" + key + "'");
        if (exists > 0 && H5Adelete(file, key.c_str()) < 0)
            fail("cannot replace attribute '" + key + "'");
    }

    // Variable-length UTF-8 strings (h5py: str).
    Handle string_type() const {
        Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
        if (!type.ok() || H5Tset_size(type.get(), H5T_VARIABLE) < 0 ||
            H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0)
            fail("cannot make a string type");
        return type;
    }

    void write_string_attr(const std::string& key, const std::string& value) {
        remove_attr(key);
        Handle type = string_type();
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

    // An empty, extendible 1-D dataset of `type` in `group`; `where` names it in errors.
    hid_t create_series(hid_t group, const char* name, hid_t type, const std::string& where) {
        const hsize_t dims = 0, maxdims = H5S_UNLIMITED, chunk = kChunkRows;
        Handle space(H5Screate_simple(1, &dims, &maxdims), H5Sclose);
        Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
        if (!space.ok() || !dcpl.ok() || H5Pset_chunk(dcpl.get(), 1, &chunk) < 0)
            fail("cannot set up " + where);
        const hid_t d =
            H5Dcreate2(group, name, type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT);
        if (d < 0) fail("cannot create " + where);
        return d;
    }

    // The rows of a reopened series, which must be what create_series makes: 1-D, extendible,
    // of the class its rows are written in, and no larger than the file.
    hsize_t extent(hid_t dset, const std::string& where, H5T_class_t cls) const {
        Handle space(H5Dget_space(dset), H5Sclose);
        Handle type(H5Dget_type(dset), H5Tclose);
        hsize_t n = 0, max = 0;
        if (!space.ok() || H5Sget_simple_extent_ndims(space.get()) != 1 ||
            H5Sget_simple_extent_dims(space.get(), &n, &max) < 0)
            damaged(where + " is not a 1-D dataset");
        if (max != H5S_UNLIMITED) damaged(where + " is not extendible");
        if (!type.ok() || H5Tget_class(type.get()) != cls)
            damaged(where + " does not hold the " +
                    (cls == H5T_INTEGER ? "integers" : cls == H5T_FLOAT ? "floats" : "strings") +
                    " a run file writes there");
        if (const std::string big = h5::oversized(dset, where); !big.empty()) damaged(big);
        return n;
    }

    void set_extent(hid_t dset, hsize_t rows, const std::string& where) {
        if (H5Dset_extent(dset, &rows) < 0) fail("cannot resize " + where);
    }

    std::vector<std::int64_t> read_steps(const Metric& m, const std::string& name) const {
        std::vector<std::int64_t> steps(m.rows);
        if (m.rows > 0 &&
            H5Dread(m.step, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps.data()) < 0)
            fail("cannot read /metrics/" + name + "/step");
        return steps;
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
        const std::string where = "/metrics/" + name + "/";
        slot.step = create_series(slot.group, "step", H5T_STD_I64LE, where + "step");
        slot.value = create_series(slot.group, "value", H5T_IEEE_F64LE, where + "value");
        return slot;
    }

    // Drops the rows of `m` after `last_step` (its steps increase row by row).
    void cut(Metric& m, const std::string& name, i64 last_step) {
        if (m.last <= last_step) return;
        const std::vector<std::int64_t> steps = read_steps(m, name);
        const hsize_t keep = static_cast<hsize_t>(
            std::upper_bound(steps.begin(), steps.end(), last_step) - steps.begin());
        const std::string where = "/metrics/" + name + "/";
        set_extent(m.step, keep, where + "step");
        set_extent(m.value, keep, where + "value");
        m.rows = keep;
        m.last = keep > 0 ? steps[keep - 1] : 0;
    }

    // The metrics of a reopened file. A crash between the two writes of a row can leave `step`
    // one row longer than `value`: both are cut to the rows they share.
    void load_metrics() {
        H5G_info_t info;
        if (H5Gget_info(metrics, &info) < 0) damaged("cannot list /metrics");
        for (hsize_t i = 0; i < info.nlinks; i++) {
            const ssize_t len = H5Lget_name_by_idx(metrics, ".", H5_INDEX_NAME, H5_ITER_INC, i,
                                                   nullptr, 0, H5P_DEFAULT);
            if (len < 0) damaged("cannot list /metrics");
            std::string name(static_cast<size_t>(len) + 1, '\0');
            H5Lget_name_by_idx(metrics, ".", H5_INDEX_NAME, H5_ITER_INC, i, name.data(),
                               name.size(), H5P_DEFAULT);
            name.resize(static_cast<size_t>(len));
            const std::string where = "/metrics/" + name;
            Metric m;
            m.group = H5Gopen2(metrics, name.c_str(), H5P_DEFAULT);
            if (m.group < 0) damaged(where + " is not a group");
            Metric& slot = series.emplace(name, m).first->second;  // ~Impl closes it from here
            slot.step = H5Dopen2(slot.group, "step", H5P_DEFAULT);
            slot.value = H5Dopen2(slot.group, "value", H5P_DEFAULT);
            if (slot.step < 0 || slot.value < 0)
                damaged(where + " lacks its step or value dataset");
            const hsize_t ns = extent(slot.step, where + "/step", H5T_INTEGER);
            const hsize_t nv = extent(slot.value, where + "/value", H5T_FLOAT);
            slot.rows = std::min(ns, nv);
            if (ns != nv) {
                set_extent(slot.step, slot.rows, where + "/step");
                set_extent(slot.value, slot.rows, where + "/value");
            }
            const std::vector<std::int64_t> steps = read_steps(slot, name);
            slot.last = steps.empty() ? 0 : steps.back();
        }
    }

    void load_events() {
        const htri_t has = H5Lexists(file, "events", H5P_DEFAULT);
        if (has < 0) damaged("cannot look up /events");
        if (has == 0) return;
        events = H5Gopen2(file, "events", H5P_DEFAULT);
        if (events < 0) damaged("/events is not a group");
        ev_step = H5Dopen2(events, "step", H5P_DEFAULT);
        ev_kind = H5Dopen2(events, "kind", H5P_DEFAULT);
        ev_message = H5Dopen2(events, "message", H5P_DEFAULT);
        if (ev_step < 0 || ev_kind < 0 || ev_message < 0)
            damaged("/events lacks its step, kind or message dataset");
        ev_rows = std::min({extent(ev_step, "/events/step", H5T_INTEGER),
                            extent(ev_kind, "/events/kind", H5T_STRING),
                            extent(ev_message, "/events/message", H5T_STRING)});
        if (H5Lexists(events, "evidence", H5P_DEFAULT) > 0) {
            ev_evidence = H5Dopen2(events, "evidence", H5P_DEFAULT);
            if (ev_evidence < 0) damaged("cannot open /events/evidence");
            if (extent(ev_evidence, "/events/evidence", H5T_STRING) < ev_rows)
                damaged("/events/evidence has fewer rows than /events/step");
        }
    }

    // /events/evidence, its rows so far empty (an older file, or no event had evidence yet).
    void create_evidence() {
        Handle str = string_type();
        ev_evidence = create_series(events, "evidence", str.get(), "/events/evidence");
        const char* none = "";
        for (hsize_t r = 0; r < ev_rows; r++)
            write_row(ev_evidence, r, str.get(), &none, "/events/evidence");
    }

    void create_events() {
        events = H5Gcreate2(file, "events", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (events < 0) fail("cannot create group /events");
        Handle str = string_type();
        ev_step = create_series(events, "step", H5T_STD_I64LE, "/events/step");
        ev_kind = create_series(events, "kind", str.get(), "/events/kind");
        ev_message = create_series(events, "message", str.get(), "/events/message");
    }

    // ---- /fp8: one dataset per column of Fp8Stat, a row per tensor and step ---------------
    void create_fp8() {
        fp8 = H5Gcreate2(file, "fp8", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (fp8 < 0) fail("cannot create group /fp8");
        Handle str = string_type();
        for (const Fp8Column& c : fp8_columns()) {
            const hid_t type = c.kind == 'i' ? H5T_STD_I64LE : c.kind == 'f' ? H5T_IEEE_F64LE
                                                                              : str.get();
            fp8_cols.push_back(create_series(fp8, c.name, type, std::string("/fp8/") + c.name));
        }
    }

    // A reopened /fp8: its columns cut to the rows they all hold (a crash between two columns'
    // writes leaves some longer).
    void load_fp8() {
        const htri_t has = H5Lexists(file, "fp8", H5P_DEFAULT);
        if (has < 0) damaged("cannot look up /fp8");
        if (has == 0) return;
        fp8 = H5Gopen2(file, "fp8", H5P_DEFAULT);
        if (fp8 < 0) damaged("/fp8 is not a group");
        hsize_t rows = ~hsize_t{0};
        for (const Fp8Column& c : fp8_columns()) {
            const std::string where = std::string("/fp8/") + c.name;
            const hid_t d = H5Dopen2(fp8, c.name, H5P_DEFAULT);
            if (d < 0) damaged("/fp8 lacks its " + std::string(c.name) + " dataset");
            fp8_cols.push_back(d);
            rows = std::min(rows, extent(d, where,
                                         c.kind == 'i'   ? H5T_INTEGER
                                         : c.kind == 'f' ? H5T_FLOAT
                                                         : H5T_STRING));
        }
        for (size_t k = 0; k < fp8_cols.size(); k++)
            set_extent(fp8_cols[k], rows, std::string("/fp8/") + fp8_columns()[k].name);
        fp8_rows = rows;
        const std::vector<std::int64_t> steps = read_fp8_steps();
        fp8_last = steps.empty() ? 0 : steps.back();
    }

    std::vector<std::int64_t> read_fp8_steps() const {
        std::vector<std::int64_t> steps(fp8_rows);
        if (fp8_rows > 0 && H5Dread(fp8_cols[0], H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                    steps.data()) < 0)
            fail("cannot read /fp8/step");
        return steps;
    }

    // Drops the /fp8 rows after `last_step` (steps increase row by row).
    void cut_fp8(i64 last_step) {
        if (fp8 < 0 || fp8_last <= last_step) return;
        const std::vector<std::int64_t> steps = read_fp8_steps();
        const hsize_t keep = static_cast<hsize_t>(
            std::upper_bound(steps.begin(), steps.end(), last_step) - steps.begin());
        for (size_t k = 0; k < fp8_cols.size(); k++)
            set_extent(fp8_cols[k], keep, std::string("/fp8/") + fp8_columns()[k].name);
        fp8_rows = keep;
        fp8_last = keep > 0 ? steps[keep - 1] : 0;
    }

    // Writes rows [at, at + k) of a 1-D dataset, growing it to at + k.
    void write_rows(hid_t dset, hsize_t at, hsize_t k, hid_t mem_type, const void* v,
                    const std::string& what) {
        const hsize_t n = at + k;
        if (H5Dset_extent(dset, &n) < 0) fail("cannot extend " + what);
        Handle fspace(H5Dget_space(dset), H5Sclose);
        Handle mspace(H5Screate_simple(1, &k, nullptr), H5Sclose);
        if (!fspace.ok() || !mspace.ok() ||
            H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &at, nullptr, &k, nullptr) < 0 ||
            H5Dwrite(dset, mem_type, mspace.get(), fspace.get(), H5P_DEFAULT, v) < 0)
            fail("cannot append to " + what);
    }

    // The group at `path` ("a/b"), created with its parents when missing; the caller closes it.
    hid_t group_at(const std::string& gpath) {
        hid_t g = H5Gopen2(file, "/", H5P_DEFAULT);
        size_t start = 0;
        while (g >= 0 && start < gpath.size()) {
            const size_t end = gpath.find('/', start);
            const std::string part =
                gpath.substr(start, end == std::string::npos ? end : end - start);
            if (part.empty()) fail("empty part in the path '" + gpath + "'");
            const htri_t exists = H5Lexists(g, part.c_str(), H5P_DEFAULT);
            const hid_t next =
                exists > 0 ? H5Gopen2(g, part.c_str(), H5P_DEFAULT)
                           : H5Gcreate2(g, part.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
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

RunFile::RunFile() : impl_(std::make_unique<Impl>()) {}

RunFile::RunFile(const std::string& path, const std::string& config_toml, const std::string& label)
    : impl_(std::make_unique<Impl>()) {
    QuietHdf5 quiet;
    impl_->path = path;
    impl_->label = label;
    impl_->file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (impl_->file < 0)
        impl_->fail(
            "cannot create it; does its folder exist and is it writable? (or set "
            "output.run_file=false)");
    impl_->keep_reserve();
    impl_->write_string_attr("config", config_toml);
    impl_->write_string_attr("parallax_version", kParallaxVersion);
    impl_->write_string_attr("created", iso_time_utc());
    impl_->metrics = H5Gcreate2(impl_->file, "metrics", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (impl_->metrics < 0) impl_->fail("cannot create group /metrics");
}

std::unique_ptr<RunFile> RunFile::reopen(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec) && !ec) return nullptr;
    QuietHdf5 quiet;
    std::unique_ptr<RunFile> rf(new RunFile());
    Impl& im = *rf->impl_;
    im.path = path;
    im.file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    if (im.file < 0) {
        const std::string detail = hdf5_detail();
        const hid_t ro = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        if (ro >= 0) H5Fclose(ro);
        H5Eclear2(H5E_DEFAULT);
        std::string msg = "run file ";
        msg += path;
        // Damaged: this user may read it (and write it, or HDF5 cannot even read it), yet HDF5
        // cannot open it to write, and not because another process holds its lock. (HDF5 opens
        // some damaged files read-only, and refuses them for writing.)
        // HDF5's words for a file another process holds ("unable to lock file, errno = 11");
        // not any "lock" ("bad superblock version number" has one).
        const bool locked = detail.find("unable to lock") != std::string::npos ||
                            detail.find("file lock") != std::string::npos;
        const bool readable = std::ifstream(path, std::ios::binary).good();
        if (!locked && readable && (ro < 0 || ::access(path.c_str(), W_OK) == 0))
            throw RunFileDamaged(msg +
                                 " is there but HDF5 cannot open it (it may be damaged, e.g. by "
                                 "a process killed while writing it)" +
                                 detail);
        msg += ro >= 0 || locked
                   ? " can be read but not written (check its permissions, and that no other "
                     "process, a viewer or another run, has it open)"
                   : " is there but cannot be read (check its permissions)";
        msg +=
            ", so this run cannot continue it; it is left as it is. Make it writable, or "
            "delete or move it (a new one is then written, starting with the checkpoint's "
            "steps), or set output.run_file=false";
        msg += detail;
        throw DataError(msg);  // bad input: an output this run cannot write (exit 2)
    }
    const htri_t has_version = H5Aexists(im.file, "parallax_version");
    const htri_t has_metrics = H5Lexists(im.file, "metrics", H5P_DEFAULT);
    if (has_version <= 0 || has_metrics <= 0) return nullptr;  // not a run file
    im.metrics = H5Gopen2(im.file, "metrics", H5P_DEFAULT);
    if (im.metrics < 0) return nullptr;  // "metrics" is not a group: not a run file
    im.load_metrics();
    im.load_events();
    im.load_fp8();
    im.keep_reserve();
    return rf;
}

RunFile::~RunFile() = default;
RunFile::RunFile(RunFile&&) noexcept = default;
RunFile& RunFile::operator=(RunFile&&) noexcept = default;

void RunFile::append(const std::string& metric, i64 step, double value) {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    QuietHdf5 quiet;
    Impl::Metric& m = impl_->metric(metric);
    if (m.rows > 0 && step <= m.last) impl_->cut(m, metric, step - 1);  // a step run again
    const std::int64_t s = step;
    impl_->write_row(m.step, m.rows, H5T_NATIVE_INT64, &s, "/metrics/" + metric + "/step");
    impl_->write_row(m.value, m.rows, H5T_NATIVE_DOUBLE, &value, "/metrics/" + metric + "/value");
    m.rows++;
    m.last = step;
}

void RunFile::truncate(i64 last_step) {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    QuietHdf5 quiet;
    for (auto& [name, m] : impl_->series) impl_->cut(m, name, last_step);
    impl_->cut_fp8(last_step);
}

i64 RunFile::last_step(const std::string& metric) const {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    const auto it = impl_->series.find(metric);
    return it == impl_->series.end() ? 0 : it->second.last;
}

void RunFile::read(const std::string& metric, std::vector<i64>* steps,
                   std::vector<double>* values) const {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    QuietHdf5 quiet;
    const auto it = impl_->series.find(metric);
    const Impl::Metric* m = it == impl_->series.end() ? nullptr : &it->second;
    if (steps) {
        steps->clear();
        if (m) {
            const std::vector<std::int64_t> s = impl_->read_steps(*m, metric);
            steps->assign(s.begin(), s.end());
        }
    }
    if (values) {
        values->assign(m ? m->rows : 0, 0.0);
        if (m && m->rows > 0 &&
            H5Dread(m->value, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, values->data()) < 0)
            impl_->fail("cannot read /metrics/" + metric + "/value");
    }
}

void RunFile::event(i64 step, const std::string& kind, const std::string& message,
                    const std::string& evidence) {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    QuietHdf5 quiet;
    Impl& im = *impl_;
    if (im.events < 0) im.create_events();
    const std::int64_t s = step;
    const char* k = kind.c_str();
    const char* msg = message.c_str();
    H5Handle str = im.string_type();
    im.write_row(im.ev_step, im.ev_rows, H5T_NATIVE_INT64, &s, "/events/step");
    im.write_row(im.ev_kind, im.ev_rows, str.get(), &k, "/events/kind");
    im.write_row(im.ev_message, im.ev_rows, str.get(), &msg, "/events/message");
    if (im.ev_evidence < 0 && !evidence.empty()) im.create_evidence();
    if (im.ev_evidence >= 0) {
        const char* ev = evidence.c_str();
        im.write_row(im.ev_evidence, im.ev_rows, str.get(), &ev, "/events/evidence");
    }
    im.ev_rows++;
}

void RunFile::append_fp8(const std::vector<Fp8Stat>& rows) {
    PX_ASSERT(impl_ != nullptr, "use of a moved-from RunFile");
    if (rows.empty()) return;
    QuietHdf5 quiet;
    Impl& im = *impl_;
    if (im.fp8 < 0) im.create_fp8();
    if (im.fp8_rows > 0 && rows.front().step <= im.fp8_last)
        im.cut_fp8(rows.front().step - 1);  // a step run again
    const hsize_t at = im.fp8_rows, k = rows.size();
    H5Handle str = im.string_type();
    const std::vector<Fp8Column>& cols = fp8_columns();
    for (size_t c = 0; c < cols.size(); c++) {
        const std::string what = std::string("/fp8/") + cols[c].name;
        if (cols[c].kind == 'i') {
            std::vector<std::int64_t> v;
            for (const Fp8Stat& r : rows) v.push_back(r.*cols[c].i);
            im.write_rows(im.fp8_cols[c], at, k, H5T_NATIVE_INT64, v.data(), what);
        } else if (cols[c].kind == 'f') {
            std::vector<double> v;
            for (const Fp8Stat& r : rows) v.push_back(r.*cols[c].f);
            im.write_rows(im.fp8_cols[c], at, k, H5T_NATIVE_DOUBLE, v.data(), what);
        } else {
            std::vector<const char*> v;
            for (const Fp8Stat& r : rows) v.push_back((r.*cols[c].s).c_str());
            im.write_rows(im.fp8_cols[c], at, k, str.get(), v.data(), what);
        }
    }
    im.fp8_rows += k;
    im.fp8_last = rows.back().step;
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
