// The checkpoint writer (core/io/checkpoint.h): every dataset created up front, pieces written by
// the ranks that hold them, checksums combined, then an atomic commit.
#include "core/io/checkpoint_internal.h"
#include "core/io/hdf5_util.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <type_traits>

#include <fcntl.h>
#include <unistd.h>

namespace px {

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

using H = H5Handle;
using namespace h5;

constexpr const char* kParallaxVersion = "0.1.0";  // keep in step with meson.build

bool fsync_path(const std::string& path, bool directory) {
    const int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
    if (fd < 0) return false;
    const bool ok = ::fsync(fd) == 0;
    ::close(fd);
    return ok;
}

std::string folder_of(const std::string& path) {
    const fs::path p(path);
    return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

void broadcast_string(std::string& s, MPI_Comm comm) {
    long long n = static_cast<long long>(s.size());
    MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm);
    s.resize(static_cast<size_t>(n));
    if (n > 0) MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
}

void broadcast_meta(CheckpointMeta& m, MPI_Comm comm) {
    static_assert(std::is_trivially_copyable_v<StepMetrics>);
    long long nums[8] = {m.step,
                         static_cast<long long>(m.seed),
                         m.data_next_step,
                         m.rng_counter_base,
                         m.adam_step,
                         m.growth_tracker,
                         static_cast<long long>(m.history.size()),
                         m.loss_scale_dynamic ? 1 : 0};
    MPI_Bcast(nums, 8, MPI_LONG_LONG, 0, comm);
    m.loss_scale_dynamic = nums[7] != 0;
    m.step = nums[0];
    m.seed = static_cast<std::uint64_t>(nums[1]);
    m.data_next_step = nums[2];
    m.rng_counter_base = nums[3];
    m.adam_step = nums[4];
    m.growth_tracker = nums[5];
    MPI_Bcast(&m.loss_scale, 1, MPI_DOUBLE, 0, comm);
    for (std::string* t :
         {&m.config_toml, &m.data_source, &m.parallax_version, &m.created, &m.source_dtype})
        broadcast_string(*t, comm);
    m.history.resize(static_cast<size_t>(nums[6]));
    if (nums[6] > 0)
        MPI_Bcast(m.history.data(), static_cast<int>(nums[6] * sizeof(StepMetrics)), MPI_BYTE, 0,
                  comm);
}

}  // namespace

struct CheckpointWriter::Impl {
    struct Dataset {
        hid_t id = -1;
        i64 rows = 1, cols = 0;  // seen as (rows, cols)
        int rank = 1;
        std::uint64_t sum = 0;  // this rank's part of the checksum
        i64 written = 0;        // elements this rank wrote
        bool tensor = true;     // float32, written piecewise; else complete at creation
    };

    std::string final_path, temp_path;
    MPI_Comm comm = MPI_COMM_NULL;
    bool mpi = false;
    int rank = 0;
    hid_t file = -1;
    std::vector<hid_t> groups;
    std::vector<std::string> order;  // dataset paths in creation order
    std::map<std::string, Dataset> sets;
    bool committed = false;

    [[noreturn]] void fail(const std::string& what) const {
        throw CheckpointError("checkpoint " + final_path + ": " + what + hdf5_detail());
    }
    // A write the file system refused (full, failing): nothing is committed.
    [[noreturn]] void write_failed(const std::string& what) const {
        throw StorageError("checkpoint " + final_path + ": " + what + hdf5_detail() +
                           "; nothing was committed and the earlier checkpoints are whole: free "
                           "space there, then resume (checkpoint.resume = auto)");
    }

    void close_all() {
        for (auto& [name, d] : sets)
            if (d.id >= 0) H5Dclose(d.id), d.id = -1;
        for (hid_t g : groups) H5Gclose(g);
        groups.clear();
        if (file >= 0) H5Fclose(file), file = -1;
    }

    ~Impl() {
        QuietHdf5 quiet;
        // An uncommitted file is garbage: empty it first, so that closing it (which flushes
        // HDF5's metadata) finds room on a full disk. A close that fails leaves HDF5 with a
        // half-closed file, which it would crash on when it shuts down.
        const bool discard = !committed && rank == 0 && !temp_path.empty();
        if (discard) [[maybe_unused]]
            const int emptied = ::truncate(temp_path.c_str(), 0);
        close_all();
        if (discard) std::remove(temp_path.c_str());
    }

    hid_t group(hid_t parent, const char* name) {
        H gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
        if (!gcpl.ok() || !compact_storage(gcpl.get())) fail("cannot set up a group's storage");
        const hid_t g = H5Gcreate2(parent, name, H5P_DEFAULT, gcpl.get(), H5P_DEFAULT);
        if (g < 0) fail(std::string("cannot create group ") + name);
        groups.push_back(g);
        return g;
    }

    Dataset& create(hid_t parent, const std::string& path, const std::string& name, hid_t type,
                    const std::vector<i64>& shape, bool tensor) {
        std::vector<hsize_t> dims(shape.begin(), shape.end());
        H space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
        H dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
        // Every element is written (commit checks it), so no fill values; allocation at creation
        // lets MPI ranks write into a dataset independently.
        if (!space.ok() || !dcpl.ok() || H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER) < 0 ||
            H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY) < 0)
            fail("cannot set up dataset /" + path);
        Dataset d;
        d.id = H5Dcreate2(parent, name.c_str(), type, space.get(), H5P_DEFAULT, dcpl.get(),
                          H5P_DEFAULT);
        if (d.id < 0) fail("cannot create dataset /" + path);
        d.rank = static_cast<int>(shape.size());
        d.rows = shape.size() == 2 ? shape[0] : 1;
        d.cols = shape.back();
        d.tensor = tensor;
        order.push_back(path);
        return sets.emplace(path, d).first->second;
    }

    Dataset& tensor(const std::string& path) {
        auto it = sets.find(path);
        if (it == sets.end() || !it->second.tensor)
            throw CheckpointError("checkpoint " + final_path + ": no tensor dataset '" + path +
                                  "' (tensors are model/<name>, optim/m/<name>, optim/v/<name> "
                                  "with the names of the model's ParamTable)");
        return it->second;
    }

    void write_selection(Dataset& d, const std::string& path, hid_t fspace, i64 count,
                         const float* data) {
        const hsize_t n = static_cast<hsize_t>(count);
        H mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
        if (!mspace.ok() ||
            H5Dwrite(d.id, H5T_NATIVE_FLOAT, mspace.get(), fspace, H5P_DEFAULT, data) < 0)
            write_failed("cannot write " + std::to_string(count) + " elements of /" + path);
        d.written += count;
    }
};

CheckpointWriter::CheckpointWriter(const std::string& final_path, const CheckpointMeta& meta_in,
                                   const ModelConfig& mc, MPI_Comm comm)
    : impl_(std::make_unique<Impl>()) {
    QuietHdf5 quiet;
    Impl& w = *impl_;
    w.final_path = final_path;
    if (comm != MPI_COMM_NULL) {
        int inited = 0;
        MPI_Initialized(&inited);
        if (!inited)
            throw Error("checkpoint " + final_path +
                        ": an MPI communicator was given but MPI is not initialised; call "
                        "MPI_Init first, or pass MPI_COMM_NULL for a single writer");
        w.comm = comm;
        w.mpi = true;
        MPI_Comm_rank(comm, &w.rank);
    }
    // The temporary name carries rank 0's pid, so every rank opens the same file.
    long pid = static_cast<long>(::getpid());
    if (w.mpi) MPI_Bcast(&pid, 1, MPI_LONG, 0, comm);
    const std::string file_name = fs::path(final_path).filename().string();
    w.temp_path =
        (fs::path(folder_of(final_path)) / ("." + file_name + ".tmp-" + std::to_string(pid)))
            .string();

    H fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
    if (!fapl.ok()) w.fail("cannot create a file access property list");
    if (w.mpi && H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL) < 0)
        w.fail("cannot select the MPI-IO driver");
    // The 1.8+ file format checksums HDF5's own metadata (superblock, object headers, B-trees),
    // so damage there is detected too; any HDF5 from 1.8 on (h5py too) reads it.
    if (H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V110) < 0)
        w.fail("cannot select the HDF5 1.8 file format");
    H fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
    if (!fcpl.ok() || !compact_storage(fcpl.get()))
        w.fail("cannot set up the root group's storage");
    w.file = H5Fcreate(w.temp_path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get());
    if (w.file < 0)
        w.fail("cannot create the temporary file " + w.temp_path +
               "; does the folder exist and is it writable?");

    CheckpointMeta meta = meta_in;
    if (meta.parallax_version.empty()) meta.parallax_version = kParallaxVersion;
    if (meta.created.empty()) meta.created = iso_time_utc();
    // Attributes are written collectively and must be the same on every rank: rank 0's meta is
    // the one stored (ranks' histories differ in their timings, their clocks in `created`).
    if (w.mpi) broadcast_meta(meta, comm);

    // Root and group attributes.
    const hid_t f = w.file;
    bool ok = put_string(f, "format", kCheckpointFormat) &&
              put_i64(f, "format_version", kCheckpointVersion) &&
              put_string(f, "parallax_version", meta.parallax_version) &&
              put_string(f, "created", meta.created) && put_i64(f, "step", meta.step) &&
              put_u64(f, "seed", meta.seed) && put_string(f, "config", meta.config_toml) &&
              put_string(f, "checksum_algorithm", kChecksumAlgorithm) &&
              put_u64(f, "meta_checksum", meta_checksum(meta, kCheckpointVersion));
    const hid_t model = w.group(f, "model");
    const hid_t optim = w.group(f, "optim");
    const hid_t om = w.group(optim, "m");
    const hid_t ov = w.group(optim, "v");
    const hid_t data = w.group(f, "data");
    const hid_t rng = w.group(f, "rng");
    const hid_t scaler = w.group(f, "scaler");
    const hid_t hist = w.group(f, "history");
    ok = ok && put_string(optim, "algorithm", "adamw") &&
         put_i64(optim, "adam_step", meta.adam_step) &&
         put_string(data, "source", meta.data_source) &&
         put_i64(data, "next_step", meta.data_next_step) && put_u64(data, "seed", meta.seed) &&
         put_string(rng, "generator", "philox4x32-10") && put_u64(rng, "seed", meta.seed) &&
         put_i64(rng, "counter_base", meta.rng_counter_base) &&
         put_f64(scaler, "loss_scale", meta.loss_scale) &&
         put_i64(scaler, "growth_tracker", meta.growth_tracker) && put_i64(scaler, "dynamic", meta.loss_scale_dynamic ? 1 : 0);
    if (!meta.skipped_batches.empty())
        ok = ok && put_string(data, "skipped_batches", join_batches(meta.skipped_batches));
    if (!meta.source_dtype.empty())
        ok = ok && put_string(model, "source_dtype", meta.source_dtype);
    if (!ok) w.write_failed("cannot write the checkpoint's attributes");

    // Tensors, in the whole model's table order.
    const ParamTable table = ParamTable::build(mc);
    for (const TableEntry& e : table.entries) {
        const std::vector<i64> shape = tensor_shape(e);
        w.create(model, model_dataset(e.name), e.name, H5T_IEEE_F32LE, shape, true);
        w.create(om, moment_dataset('m', e.name), e.name, H5T_IEEE_F32LE, shape, true);
        w.create(ov, moment_dataset('v', e.name), e.name, H5T_IEEE_F32LE, shape, true);
    }

    // The history: known to every rank, written by rank 0, checksummed locally.
    const i64 n = static_cast<i64>(meta.history.size());
    auto column = [&](const char* name, hid_t file_type, hid_t mem_type, const void* values,
                      std::uint64_t sum) {
        const std::string path = std::string("history/") + name;
        Impl::Dataset& d = w.create(hist, path, name, file_type, {n}, false);
        if (w.rank == 0 && n > 0 &&
            H5Dwrite(d.id, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values) < 0)
            w.write_failed("cannot write /" + path);
        d.sum = sum;
        d.written = n;
    };
    // fp8's scales and histories: the same on every rank (core/model/fp8.h), written by rank 0.
    if (meta.fp8_gemms > 0) {
        PX_ASSERT(static_cast<i64>(meta.fp8_scale.size()) == meta.fp8_gemms * 3 &&
                      static_cast<i64>(meta.fp8_history.size()) ==
                          meta.fp8_gemms * 3 * meta.fp8_history_len,
                  "fp8 state of the wrong size");
        const hid_t fp8 = w.group(f, "fp8");
        auto table = [&](const char* name, const std::vector<float>& v, i64 rows) {
            const std::string path = std::string("fp8/") + name;
            const i64 count = static_cast<i64>(v.size());
            Impl::Dataset& d = w.create(fp8, path, name, H5T_IEEE_F32LE, {rows, count / rows}, false);
            if (w.rank == 0 && H5Dwrite(d.id, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                        v.data()) < 0)
                w.write_failed("cannot write /" + path);
            d.sum = checksum_f32(v.data(), count);
            d.written = count;
        };
        table("scale", meta.fp8_scale, meta.fp8_gemms);
        table("amax_history", meta.fp8_history, meta.fp8_gemms * 3);
    }

    std::vector<std::int64_t> steps(static_cast<size_t>(n));
    for (i64 i = 0; i < n; i++) steps[i] = meta.history[i].step;
    column("step", H5T_STD_I64LE, H5T_NATIVE_INT64, steps.data(), checksum_i64(steps.data(), n));
    std::vector<double> col(static_cast<size_t>(n));
    for (const HistoryField& hf : kHistoryFields) {
        for (i64 i = 0; i < n; i++) col[i] = meta.history[i].*hf.field;
        column(hf.name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, col.data(), checksum_f64(col.data(), n));
    }
}

CheckpointWriter::~CheckpointWriter() = default;

void CheckpointWriter::write(const std::string& dataset, const Slab& s, const float* data) {
    PX_ASSERT(impl_ != nullptr && !impl_->committed, "write on a committed CheckpointWriter");
    QuietHdf5 quiet;
    Impl& w = *impl_;
    Impl::Dataset& d = w.tensor(dataset);
    if (s.row0 < 0 || s.col0 < 0 || s.rows < 0 || s.cols < 0 || s.row0 + s.rows > d.rows ||
        s.col0 + s.cols > d.cols)
        throw CheckpointError(
            "checkpoint " + w.final_path + ": slab rows [" + std::to_string(s.row0) + ", " +
            std::to_string(s.row0 + s.rows) + ") x cols [" + std::to_string(s.col0) + ", " +
            std::to_string(s.col0 + s.cols) + ") lies outside /" + dataset + " of (" +
            std::to_string(d.rows) + ", " + std::to_string(d.cols) + ")");
    if (s.rows == 0 || s.cols == 0) return;
    H fspace(H5Dget_space(d.id), H5Sclose);
    if (!fspace.ok() || !select_slab(fspace.get(), H5S_SELECT_SET, d.rank, s))
        w.fail("cannot select a slab of /" + dataset);
    w.write_selection(d, dataset, fspace.get(), s.rows * s.cols, data);
    if (s.cols == d.cols)  // whole rows: one contiguous run of logical indices
        d.sum += checksum_f32(data, s.rows * s.cols, s.row0 * d.cols);
    else
        for (i64 r = 0; r < s.rows; r++)
            d.sum += checksum_f32(data + r * s.cols, s.cols, (s.row0 + r) * d.cols + s.col0);
}

void CheckpointWriter::write_range(const std::string& dataset, i64 first, i64 count,
                                   const float* data) {
    PX_ASSERT(impl_ != nullptr && !impl_->committed, "write on a committed CheckpointWriter");
    QuietHdf5 quiet;
    Impl& w = *impl_;
    Impl::Dataset& d = w.tensor(dataset);
    if (first < 0 || count < 0 || first + count > d.rows * d.cols)
        throw CheckpointError("checkpoint " + w.final_path + ": elements [" +
                              std::to_string(first) + ", " + std::to_string(first + count) +
                              ") lie outside /" + dataset + " of " +
                              std::to_string(d.rows * d.cols) + " elements");
    if (count == 0) return;
    H fspace(H5Dget_space(d.id), H5Sclose);
    if (!fspace.ok() || !select_range(fspace.get(), d.rank, d.cols, first, count))
        w.fail("cannot select elements of /" + dataset);
    w.write_selection(d, dataset, fspace.get(), count, data);
    d.sum += checksum_f32(data, count, first);
}

void CheckpointWriter::commit() {
    PX_ASSERT(impl_ != nullptr && !impl_->committed, "commit twice on a CheckpointWriter");
    QuietHdf5 quiet;
    Impl& w = *impl_;
    const size_t n = w.order.size();
    std::vector<std::uint64_t> sums(n);
    std::vector<std::int64_t> counts(n);
    for (size_t i = 0; i < n; i++) {
        const Impl::Dataset& d = w.sets.at(w.order[i]);
        sums[i] = d.sum;
        counts[i] = d.tensor ? d.written : 0;
    }
    if (w.mpi) {
        MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(n), MPI_UINT64_T, MPI_SUM,
                      w.comm);
        MPI_Allreduce(MPI_IN_PLACE, counts.data(), static_cast<int>(n), MPI_INT64_T, MPI_SUM,
                      w.comm);
    }
    for (size_t i = 0; i < n; i++) {
        Impl::Dataset& d = w.sets.at(w.order[i]);
        if (!d.tensor) {
            sums[i] = d.sum;  // the same on every rank
            continue;
        }
        if (counts[i] != d.rows * d.cols)
            throw CheckpointError(
                "checkpoint " + w.final_path + ": /" + w.order[i] + " got " +
                std::to_string(counts[i]) + " elements written, it has " +
                std::to_string(d.rows * d.cols) +
                ": every element must be written exactly once (by one rank); the pieces " +
                (counts[i] < d.rows * d.cols ? "miss some" : "overlap") +
                ". Nothing was committed; the previous checkpoints are untouched");
    }
    for (size_t i = 0; i < n; i++)
        if (!put_u64(w.sets.at(w.order[i]).id, "checksum", sums[i]))
            w.write_failed("cannot write the checksum of /" + w.order[i]);
    if (H5Fflush(w.file, H5F_SCOPE_GLOBAL) < 0) w.write_failed("cannot flush the file");
    w.close_all();

    // Rank 0 makes it durable and gives it its name; every rank learns whether that worked.
    int status = 0;
    std::string why;
    if (w.rank == 0) {
        if (!fsync_path(w.temp_path, false)) {
            status = 1;
            why = "cannot fsync " + w.temp_path + ": " + std::strerror(errno);
        } else if (std::rename(w.temp_path.c_str(), w.final_path.c_str()) != 0) {
            status = 2;
            why = "cannot rename " + w.temp_path + " to it: " + std::strerror(errno);
        } else {
            fsync_path(folder_of(w.final_path), true);  // best effort: some filesystems refuse
        }
    }
    if (w.mpi) MPI_Bcast(&status, 1, MPI_INT, 0, w.comm);
    if (status != 0) {
        if (why.empty()) why = "rank 0 could not make the file durable or rename it";
        throw CheckpointError("checkpoint " + w.final_path + ": " + why +
                              "; nothing was committed, the previous checkpoints are untouched");
    }
    w.committed = true;
}

const std::string& CheckpointWriter::final_path() const {
    return impl_->final_path;
}
const std::string& CheckpointWriter::temp_path() const {
    return impl_->temp_path;
}

std::vector<std::string> CheckpointWriter::tensor_datasets() const {
    std::vector<std::string> out;
    for (const std::string& p : impl_->order)
        if (impl_->sets.at(p).tensor) out.push_back(p);
    return out;
}

void write_checkpoint(const std::string& path, const LogicalState& state,
                      const CheckpointMeta& meta, const ModelConfig& mc) {
    const ParamTable table = ParamTable::build(mc);
    if (state.table.entries.size() != table.entries.size() || state.table.total != table.total ||
        static_cast<i64>(state.params.size()) < table.total ||
        static_cast<i64>(state.m.size()) < table.total ||
        static_cast<i64>(state.v.size()) < table.total)
        throw Error("checkpoint " + path +
                    ": the state is not laid out as the whole model of this config (a "
                    "LogicalState absorbed from a job of another model?)");
    CheckpointWriter w(path, meta, mc);
    for (const TableEntry& e : table.entries) {
        w.write_range(model_dataset(e.name), 0, e.numel(), state.params.data() + e.offset);
        w.write_range(moment_dataset('m', e.name), 0, e.numel(), state.m.data() + e.offset);
        w.write_range(moment_dataset('v', e.name), 0, e.numel(), state.v.data() + e.offset);
    }
    w.commit();
}

}  // namespace px
