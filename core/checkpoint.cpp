// Checkpoints in HDF5: the layout and the checksum are described in checkpoint.h.
#include "core/checkpoint.h"

#include "core/arena.h"
#include "core/hdf5_util.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <type_traits>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

namespace px {

static_assert(std::endian::native == std::endian::little,
              "checkpoints store little-endian data and checksum native bit patterns");

namespace fs = std::filesystem;

// ---- the checksum ----

namespace {

template <class Bits, class T>
std::uint64_t checksum_of(const T* data, i64 n, i64 first_index) {
    static_assert(sizeof(Bits) == sizeof(T));
    std::uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (n > (i64{1} << 16))
    for (i64 i = 0; i < n; i++) {
        Bits b;
        std::memcpy(&b, data + i, sizeof b);
        sum += checksum_term(static_cast<std::uint64_t>(first_index + i), static_cast<std::uint64_t>(b));
    }
    return sum;
}

}  // namespace

std::uint64_t checksum_f32(const float* data, i64 n, i64 first_index) {
    return checksum_of<std::uint32_t>(data, n, first_index);
}
std::uint64_t checksum_f64(const double* data, i64 n, i64 first_index) {
    return checksum_of<std::uint64_t>(data, n, first_index);
}
std::uint64_t checksum_i64(const std::int64_t* data, i64 n, i64 first_index) {
    return checksum_of<std::uint64_t>(data, n, first_index);
}
std::uint64_t checksum_bytes(const void* data, i64 n, i64 first_index) {
    return checksum_of<std::uint8_t>(static_cast<const std::uint8_t*>(data), n, first_index);
}

// ---- names and meta ----

std::string model_dataset(const std::string& name) {
    std::string s = "model/";
    return s.append(name);
}

std::string moment_dataset(char which, const std::string& name) {
    PX_ASSERT(which == 'm' || which == 'v', "moment_dataset: which must be 'm' or 'v'");
    std::string s = "optim/";
    s += which;
    return s.append("/").append(name);
}

namespace {

std::string shortest(double x) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", x);
    return buf;
}

std::string bits_hex(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%016" PRIx64, std::bit_cast<std::uint64_t>(x));
    return buf;
}

constexpr const char* kParallaxVersion = "0.1.0";  // keep in step with meson.build

// Every meta attribute as one text, in a fixed order; meta_checksum is checksum_bytes of it.
std::string meta_text(const CheckpointMeta& m, std::int64_t version) {
    std::string t;
    auto line = [&](const char* key, const std::string& value) {
        t.append(key).append("=").append(value).append("\n");
    };
    line("format", kCheckpointFormat);
    line("format_version", std::to_string(version));
    line("parallax_version", m.parallax_version);
    line("created", m.created);
    line("step", std::to_string(m.step));
    line("seed", std::to_string(m.seed));
    line("config", m.config_toml);
    line("checksum_algorithm", kChecksumAlgorithm);
    line("optim.adam_step", std::to_string(m.adam_step));
    line("data.source", m.data_source);
    line("data.next_step", std::to_string(m.data_next_step));
    line("rng.counter_base", std::to_string(m.rng_counter_base));
    line("scaler.loss_scale", bits_hex(m.loss_scale));
    line("scaler.growth_tracker", std::to_string(m.growth_tracker));
    return t;
}

std::uint64_t meta_checksum(const CheckpointMeta& m, std::int64_t version) {
    const std::string t = meta_text(m, version);
    return checksum_bytes(t.data(), static_cast<i64>(t.size()));
}

// The history as columns: /history/step (int64) and one float64 dataset per field.
struct HistoryField {
    const char* name;
    double StepMetrics::*field;
};
constexpr HistoryField kHistoryFields[] = {
    {"loss", &StepMetrics::loss},         {"val_loss", &StepMetrics::val_loss},
    {"grad_norm", &StepMetrics::grad_norm}, {"lr", &StepMetrics::lr},
    {"tokens_per_s", &StepMetrics::tokens_per_s}, {"step_ms", &StepMetrics::step_ms},
    {"comm_bytes", &StepMetrics::comm_bytes},
};

std::vector<i64> tensor_shape(const TableEntry& e) {
    return e.rows == 1 ? std::vector<i64>{e.cols} : std::vector<i64>{e.rows, e.cols};
}

std::string shape_text(const std::vector<i64>& s) {
    std::string t = "(";
    for (size_t i = 0; i < s.size(); i++) t.append(i ? ", " : "").append(std::to_string(s[i]));
    return t + (s.size() == 1 ? ",)" : ")");
}

std::string hex64(std::uint64_t x) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%016" PRIx64, x);
    return buf;
}

}  // namespace

std::string data_source_description(const Config& cfg) {
    const DataConfig& d = cfg.data;
    std::string s = "source=" + d.source;
    if (d.source == "markov") {
        const i64 V = d.markov_vocab > 0 ? d.markov_vocab : cfg.model.vocab;
        s += " vocab=" + std::to_string(V) + " order=" + std::to_string(d.markov_order) +
             " alpha=" + shortest(d.markov_alpha) + " table_seed=" + std::to_string(d.markov_seed);
    } else {
        s += " train=" + d.train_path + " val=" + d.val_path;
    }
    s += " | seed=" + std::to_string(cfg.train.seed) + " batch=" +
         std::to_string(cfg.train.batch_size) + " seq_len=" + std::to_string(cfg.model.seq_len);
    return s;
}

CheckpointMeta make_checkpoint_meta(const Config& cfg, i64 step,
                                    const std::vector<StepMetrics>& history) {
    CheckpointMeta m;
    m.step = step;
    m.seed = cfg.train.seed;
    m.config_toml = config_to_toml(cfg);
    m.data_source = data_source_description(cfg);
    m.data_next_step = step;
    m.rng_counter_base = step;
    m.adam_step = step;
    m.history = history;
    return m;
}

void check_same_data(const CheckpointMeta& meta, const Config& cfg, const std::string& path) {
    const std::string now = data_source_description(cfg);
    if (meta.data_source.rfind("converted from ", 0) == 0)  // parallax convert: weights only
        throw CheckpointError("checkpoint " + path + " holds weights only (" + meta.data_source +
                              "): it has no training state to resume; start a run from its "
                              "weights with model.init_from = \"" + path +
                              "\" and checkpoint.resume = \"\"");
    if (now != meta.data_source)
        throw CheckpointError("checkpoint " + path + ": it was written by a run that drew other "
                              "data (" + meta.data_source + ") than this config draws (" + now +
                              "); a resume must keep [data], train.seed, train.batch_size and "
                              "model.seq_len, or start fresh (checkpoint.resume = \"\")");
}

// ---- HDF5 plumbing ----

namespace {

using H = H5Handle;
using namespace h5;

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

// The hyperslab of a flat range [first, first+count) of a (R, C) dataset: the tail of a first
// row, whole rows, the head of a last row, OR-ed together (row-major order is the order HDF5
// moves the elements of a hyperslab union in).
bool select_range(hid_t fspace, int rank, i64 C, i64 first, i64 count) {
    if (H5Sselect_none(fspace) < 0) return false;
    auto add = [&](i64 r0, i64 nr, i64 c0, i64 nc) {
        if (nr <= 0 || nc <= 0) return true;
        if (rank == 1) {
            const hsize_t start = static_cast<hsize_t>(c0), cnt = static_cast<hsize_t>(nc);
            return H5Sselect_hyperslab(fspace, H5S_SELECT_OR, &start, nullptr, &cnt, nullptr) >= 0;
        }
        const hsize_t start[2] = {static_cast<hsize_t>(r0), static_cast<hsize_t>(c0)};
        const hsize_t cnt[2] = {static_cast<hsize_t>(nr), static_cast<hsize_t>(nc)};
        return H5Sselect_hyperslab(fspace, H5S_SELECT_OR, start, nullptr, cnt, nullptr) >= 0;
    };
    const i64 last = first + count;  // exclusive
    i64 r = first / C, c = first % C;
    if (c != 0) {
        const i64 n = std::min(C - c, count);
        if (!add(r, 1, c, n)) return false;
        first += n;
        r++;
    }
    if (first >= last) return true;
    const i64 full = (last - first) / C;
    if (!add(r, full, 0, C)) return false;
    first += full * C;
    return add(r + full, 1, 0, last - first);
}

void broadcast_string(std::string& s, MPI_Comm comm) {
    long long n = static_cast<long long>(s.size());
    MPI_Bcast(&n, 1, MPI_LONG_LONG, 0, comm);
    s.resize(static_cast<size_t>(n));
    if (n > 0) MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, 0, comm);
}

void broadcast_meta(CheckpointMeta& m, MPI_Comm comm) {
    static_assert(std::is_trivially_copyable_v<StepMetrics>);
    long long nums[7] = {m.step, static_cast<long long>(m.seed), m.data_next_step,
                         m.rng_counter_base, m.adam_step, m.growth_tracker,
                         static_cast<long long>(m.history.size())};
    MPI_Bcast(nums, 7, MPI_LONG_LONG, 0, comm);
    m.step = nums[0];
    m.seed = static_cast<std::uint64_t>(nums[1]);
    m.data_next_step = nums[2];
    m.rng_counter_base = nums[3];
    m.adam_step = nums[4];
    m.growth_tracker = nums[5];
    MPI_Bcast(&m.loss_scale, 1, MPI_DOUBLE, 0, comm);
    for (std::string* t : {&m.config_toml, &m.data_source, &m.parallax_version, &m.created})
        broadcast_string(*t, comm);
    m.history.resize(static_cast<size_t>(nums[6]));
    if (nums[6] > 0)
        MPI_Bcast(m.history.data(), static_cast<int>(nums[6] * sizeof(StepMetrics)), MPI_BYTE, 0,
                  comm);
}

}  // namespace

// ---- the writer ----

struct CheckpointWriter::Impl {
    struct Dataset {
        hid_t id = -1;
        i64 rows = 1, cols = 0;  // seen as (rows, cols)
        int rank = 1;
        std::uint64_t sum = 0;   // this rank's part of the checksum
        i64 written = 0;         // elements this rank wrote
        bool tensor = true;      // float32, written piecewise; else complete at creation
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

    void close_all() {
        for (auto& [name, d] : sets)
            if (d.id >= 0) H5Dclose(d.id), d.id = -1;
        for (hid_t g : groups) H5Gclose(g);
        groups.clear();
        if (file >= 0) H5Fclose(file), file = -1;
    }

    ~Impl() {
        QuietHdf5 quiet;
        close_all();
        if (!committed && rank == 0 && !temp_path.empty()) std::remove(temp_path.c_str());
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
            fail("cannot write " + std::to_string(count) + " elements of /" + path +
                 "; is the disk full?");
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
    const fs::path fp(final_path);
    w.temp_path = (fp.has_parent_path() ? fp.parent_path() : fs::path("."))
                      .append("." + fp.filename().string() + ".tmp-" + std::to_string(pid))
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
    if (!fcpl.ok() || !compact_storage(fcpl.get())) w.fail("cannot set up the root group's storage");
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
    ok = ok && put_string(optim, "algorithm", "adamw") && put_i64(optim, "adam_step", meta.adam_step) &&
         put_string(data, "source", meta.data_source) &&
         put_i64(data, "next_step", meta.data_next_step) && put_u64(data, "seed", meta.seed) &&
         put_string(rng, "generator", "philox4x32-10") && put_u64(rng, "seed", meta.seed) &&
         put_i64(rng, "counter_base", meta.rng_counter_base) &&
         put_f64(scaler, "loss_scale", meta.loss_scale) &&
         put_i64(scaler, "growth_tracker", meta.growth_tracker) && put_i64(scaler, "dynamic", 0);
    if (!ok) w.fail("cannot write the checkpoint's attributes");

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
    std::vector<std::int64_t> steps(static_cast<size_t>(n));
    for (i64 i = 0; i < n; i++) steps[i] = meta.history[i].step;
    {
        Impl::Dataset& d = w.create(hist, "history/step", "step", H5T_STD_I64LE, {n}, false);
        if (w.rank == 0 && n > 0 &&
            H5Dwrite(d.id, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, steps.data()) < 0)
            w.fail("cannot write /history/step");
        d.sum = checksum_i64(steps.data(), n);
        d.written = n;
    }
    std::vector<double> col(static_cast<size_t>(n));
    for (const HistoryField& hf : kHistoryFields) {
        for (i64 i = 0; i < n; i++) col[i] = meta.history[i].*hf.field;
        const std::string path = std::string("history/") + hf.name;
        Impl::Dataset& d = w.create(hist, path, hf.name, H5T_IEEE_F64LE, {n}, false);
        if (w.rank == 0 && n > 0 &&
            H5Dwrite(d.id, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, col.data()) < 0)
            w.fail("cannot write /" + path);
        d.sum = checksum_f64(col.data(), n);
        d.written = n;
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
        throw CheckpointError("checkpoint " + w.final_path + ": slab rows [" +
                              std::to_string(s.row0) + ", " + std::to_string(s.row0 + s.rows) +
                              ") x cols [" + std::to_string(s.col0) + ", " +
                              std::to_string(s.col0 + s.cols) + ") lies outside /" + dataset +
                              " of (" + std::to_string(d.rows) + ", " + std::to_string(d.cols) +
                              ")");
    if (s.rows == 0 || s.cols == 0) return;
    H fspace(H5Dget_space(d.id), H5Sclose);
    bool ok = fspace.ok();
    if (ok && d.rank == 1) {
        const hsize_t start = static_cast<hsize_t>(s.col0), cnt = static_cast<hsize_t>(s.cols);
        ok = H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, &start, nullptr, &cnt, nullptr) >= 0;
    } else if (ok) {
        const hsize_t start[2] = {static_cast<hsize_t>(s.row0), static_cast<hsize_t>(s.col0)};
        const hsize_t cnt[2] = {static_cast<hsize_t>(s.rows), static_cast<hsize_t>(s.cols)};
        ok = H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, cnt, nullptr) >= 0;
    }
    if (!ok) w.fail("cannot select a slab of /" + dataset);
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
        MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(n), MPI_UINT64_T, MPI_SUM, w.comm);
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
            w.fail("cannot write the checksum of /" + w.order[i]);
    if (H5Fflush(w.file, H5F_SCOPE_GLOBAL) < 0) w.fail("cannot flush the file; is the disk full?");
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

const std::string& CheckpointWriter::final_path() const { return impl_->final_path; }
const std::string& CheckpointWriter::temp_path() const { return impl_->temp_path; }

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

// ---- the reader ----

i64 DatasetInfo::numel() const {
    i64 n = 1;
    for (i64 d : shape) n *= d;
    return n;
}

struct CheckpointReader::Impl {
    std::string path;
    hid_t file = -1;
    CheckpointMeta meta;
    std::vector<DatasetInfo> infos;  // sorted by path

    ~Impl() {
        if (file >= 0) {
            QuietHdf5 quiet;
            H5Fclose(file);
        }
    }

    [[noreturn]] void fail(const std::string& what) const {
        throw CheckpointError("checkpoint " + path + ": " + what);
    }

    const DatasetInfo& info(const std::string& dataset) const {
        const std::string p = !dataset.empty() && dataset[0] == '/' ? dataset.substr(1) : dataset;
        auto it = std::lower_bound(infos.begin(), infos.end(), p,
                                   [](const DatasetInfo& a, const std::string& b) { return a.path < b; });
        if (it == infos.end() || it->path != p)
            fail("has no dataset /" + p +
                 "; the file is incomplete or of another model (see parallax inspect " + path + ")");
        return *it;
    }

    H open(const DatasetInfo& in) const {
        H d(H5Dopen2(file, in.path.c_str(), H5P_DEFAULT), H5Dclose);
        if (!d.ok()) fail("cannot open /" + in.path + hdf5_detail());
        return d;
    }

    // Reads elements [first, first+count) of a dataset (any dtype of 1, 4 or 8 bytes) as raw bit
    // patterns into buf (count * size bytes).
    void read_raw(const DatasetInfo& in, hid_t dset, i64 first, i64 count, void* buf) const {
        H ftype(H5Dget_type(dset), H5Tclose);
        H mtype(H5Tget_native_type(ftype.get(), H5T_DIR_ASCEND), H5Tclose);
        H fspace(H5Dget_space(dset), H5Sclose);
        const i64 C = in.shape.empty() ? 1 : in.shape.back();
        const hsize_t n = static_cast<hsize_t>(count);
        H mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
        if (!mtype.ok() || !fspace.ok() || !mspace.ok() ||
            !select_range(fspace.get(), static_cast<int>(in.shape.size()), C, first, count) ||
            H5Dread(dset, mtype.get(), mspace.get(), fspace.get(), H5P_DEFAULT, buf) < 0)
            fail("cannot read /" + in.path + " (elements " + std::to_string(first) + ".." +
                 std::to_string(first + count) + "): the file is truncated or damaged" +
                 hdf5_detail() + "; use an earlier checkpoint");
    }

    std::uint64_t compute(const DatasetInfo& in) const {
        H d = open(in);
        const i64 total = in.numel();
        const i64 chunk = i64{1} << 22;
        std::vector<std::uint64_t> buf(static_cast<size_t>(std::min(total, chunk)));
        std::uint64_t sum = 0;
        for (i64 first = 0; first < total; first += chunk) {
            const i64 count = std::min(chunk, total - first);
            read_raw(in, d.get(), first, count, buf.data());
            if (in.dtype == "float32")
                sum += checksum_f32(reinterpret_cast<const float*>(buf.data()), count, first);
            else if (in.dtype == "float64" || in.dtype == "int64")
                sum += checksum_i64(reinterpret_cast<const std::int64_t*>(buf.data()), count, first);
            else
                fail("dataset /" + in.path + " has dtype " + in.dtype +
                     ", which the checksum does not cover");
        }
        return sum;
    }

    DatasetCheck check(const DatasetInfo& in) const {
        DatasetCheck c;
        c.info = in;
        if (!in.has_checksum) {
            c.problem = "checkpoint " + path + ": dataset /" + in.path +
                        " has no checksum attribute; the file was not written by a Parallax "
                        "checkpoint writer or was damaged";
            return c;
        }
        try {
            c.computed = compute(in);
        } catch (const CheckpointError& e) {
            c.problem = e.what();
            return c;
        }
        c.ok = c.computed == in.checksum;
        if (!c.ok) c.problem = mismatch_text(in, c.computed);
        return c;
    }

    std::string mismatch_text(const DatasetInfo& in, std::uint64_t computed) const {
        return "checkpoint " + path + ": checksum mismatch in dataset /" + in.path + ": stored " +
               hex64(in.checksum) + ", computed " + hex64(computed) +
               ": the file is corrupt; use an earlier checkpoint (parallax inspect lists them)";
    }
};

namespace {

herr_t collect_dataset(hid_t, const char* name, const H5O_info_t* info, void* data) {
    if (info->type == H5O_TYPE_DATASET)
        static_cast<std::vector<std::string>*>(data)->push_back(name);
    return 0;
}

std::string dtype_name(hid_t t) {
    const H5T_class_t cls = H5Tget_class(t);
    const size_t size = H5Tget_size(t);
    if (cls == H5T_FLOAT && size == 4) return "float32";
    if (cls == H5T_FLOAT && size == 8) return "float64";
    if (cls == H5T_INTEGER && size == 8) return H5Tget_sign(t) == H5T_SGN_NONE ? "uint64" : "int64";
    return "class " + std::to_string(static_cast<int>(cls)) + ", " + std::to_string(size) + " bytes";
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
    QuietHdf5 quiet;
    Impl& r = *impl_;
    r.path = path;
    std::error_code ec;
    if (!fs::exists(path, ec)) r.fail("does not exist; check the path (parallax inspect DIR lists a folder's checkpoints)");
    if (fs::is_directory(path, ec)) r.fail("is a folder, not a checkpoint file; give a ckpt-*.h5 file in it");
    const htri_t is = H5Fis_hdf5(path.c_str());
    if (is <= 0)
        r.fail("is not an HDF5 file (no HDF5 signature: empty, truncated at its start, or another "
               "kind of file); give a ckpt-*.h5 checkpoint");
    r.file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (r.file < 0)
        r.fail("cannot be opened as HDF5: it is truncated or damaged" + hdf5_detail() +
               "; use an earlier checkpoint");

    std::string format;
    if (!get_string(r.file, "format", format))
        r.fail("is an HDF5 file but not a Parallax checkpoint (no root attribute 'format')");
    if (format != kCheckpointFormat)
        r.fail("is an HDF5 file but not a Parallax checkpoint (format is '" + format +
               "', expected '" + kCheckpointFormat + "')");
    std::int64_t version = 0;
    if (!get_number(r.file, "format_version", H5T_NATIVE_INT64, version))
        r.fail("has no readable root attribute 'format_version'; the file is damaged: use an earlier checkpoint");
    if (version != kCheckpointVersion)
        r.fail("has format_version " + std::to_string(version) + ", this build of Parallax reads "
               "format_version " + std::to_string(kCheckpointVersion) +
               " only: use the Parallax version that wrote it (parallax_version attribute), or "
               "start from an earlier checkpoint");

    CheckpointMeta& m = r.meta;
    auto need = [&](bool ok, const char* where) {
        if (!ok)
            r.fail(std::string("attribute ") + where +
                   " is missing or unreadable; the file is damaged or not written by Parallax");
    };
    std::string algo;
    need(get_string(r.file, "parallax_version", m.parallax_version), "/parallax_version");
    need(get_string(r.file, "created", m.created), "/created");
    need(get_number(r.file, "step", H5T_NATIVE_INT64, m.step), "/step");
    need(get_number(r.file, "seed", H5T_NATIVE_UINT64, m.seed), "/seed");
    need(get_string(r.file, "config", m.config_toml), "/config");
    need(get_string(r.file, "checksum_algorithm", algo), "/checksum_algorithm");
    if (algo != kChecksumAlgorithm)
        r.fail("uses checksum algorithm '" + algo + "'; this build knows '" + kChecksumAlgorithm + "'");
    std::uint64_t stored_meta = 0;
    need(get_number(r.file, "meta_checksum", H5T_NATIVE_UINT64, stored_meta), "/meta_checksum");
    auto grp = [&](const char* name) {
        H g(H5Gopen2(r.file, name, H5P_DEFAULT), H5Gclose);
        if (!g.ok()) r.fail(std::string("has no group /") + name + "; the file is damaged: use an earlier checkpoint");
        return g;
    };
    {
        H g = grp("optim");
        need(get_number(g.get(), "adam_step", H5T_NATIVE_INT64, m.adam_step), "/optim adam_step");
    }
    {
        H g = grp("data");
        need(get_string(g.get(), "source", m.data_source), "/data source");
        need(get_number(g.get(), "next_step", H5T_NATIVE_INT64, m.data_next_step), "/data next_step");
    }
    {
        H g = grp("rng");
        need(get_number(g.get(), "counter_base", H5T_NATIVE_INT64, m.rng_counter_base),
             "/rng counter_base");
    }
    {
        H g = grp("scaler");
        need(get_number(g.get(), "loss_scale", H5T_NATIVE_DOUBLE, m.loss_scale), "/scaler loss_scale");
        need(get_number(g.get(), "growth_tracker", H5T_NATIVE_INT64, m.growth_tracker),
             "/scaler growth_tracker");
    }
    const std::uint64_t computed_meta = meta_checksum(m, version);
    if (computed_meta != stored_meta)
        r.fail("checksum mismatch in its attributes (meta_checksum stored " + hex64(stored_meta) +
               ", computed " + hex64(computed_meta) +
               "): the step, config or another attribute was altered; use an earlier checkpoint");

    // Every dataset, with shape, dtype and stored checksum.
    std::vector<std::string> names;
    if (H5Ovisit2(r.file, H5_INDEX_NAME, H5_ITER_INC, collect_dataset, &names, H5O_INFO_BASIC) < 0)
        r.fail("cannot list its datasets: the file is damaged" + hdf5_detail());
    for (const std::string& name : names) {
        DatasetInfo in;
        in.path = name;
        H d(H5Dopen2(r.file, name.c_str(), H5P_DEFAULT), H5Dclose);
        if (!d.ok()) r.fail("cannot open dataset /" + name + hdf5_detail());
        H space(H5Dget_space(d.get()), H5Sclose);
        const int nd = H5Sget_simple_extent_ndims(space.get());
        std::vector<hsize_t> dims(static_cast<size_t>(std::max(nd, 0)));
        if (nd < 0 || H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0)
            r.fail("cannot read the shape of /" + name + hdf5_detail());
        in.shape.assign(dims.begin(), dims.end());
        H type(H5Dget_type(d.get()), H5Tclose);
        in.dtype = dtype_name(type.get());
        in.has_checksum = get_number(d.get(), "checksum", H5T_NATIVE_UINT64, in.checksum);
        r.infos.push_back(std::move(in));
    }
    std::sort(r.infos.begin(), r.infos.end(),
              [](const DatasetInfo& a, const DatasetInfo& b) { return a.path < b.path; });

    // The history, verified as it is read.
    const DatasetInfo& st = r.info("history/step");
    const i64 n = st.numel();
    std::vector<std::int64_t> steps(static_cast<size_t>(n));
    if (n > 0) {
        verify("history/step");
        H d = r.open(st);
        r.read_raw(st, d.get(), 0, n, steps.data());
    }
    m.history.assign(static_cast<size_t>(n), StepMetrics{});
    for (i64 i = 0; i < n; i++) m.history[i].step = steps[i];
    std::vector<double> col(static_cast<size_t>(n));
    for (const HistoryField& hf : kHistoryFields) {
        const std::string p = std::string("history/") + hf.name;
        const DatasetInfo& in = r.info(p);
        if (in.numel() != n)
            r.fail("/" + p + " has " + std::to_string(in.numel()) + " rows, /history/step " +
                   std::to_string(n) + "; the file is damaged: use an earlier checkpoint");
        if (n == 0) continue;
        verify(p);
        H d = r.open(in);
        r.read_raw(in, d.get(), 0, n, col.data());
        for (i64 i = 0; i < n; i++) m.history[i].*hf.field = col[i];
    }
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

const std::string& CheckpointReader::path() const { return impl_->path; }
const CheckpointMeta& CheckpointReader::meta() const { return impl_->meta; }
std::vector<DatasetInfo> CheckpointReader::datasets() const { return impl_->infos; }

bool CheckpointReader::has(const std::string& dataset) const {
    const std::string p = !dataset.empty() && dataset[0] == '/' ? dataset.substr(1) : dataset;
    return std::any_of(impl_->infos.begin(), impl_->infos.end(),
                       [&](const DatasetInfo& d) { return d.path == p; });
}

std::vector<i64> CheckpointReader::shape(const std::string& dataset) const {
    return impl_->info(dataset).shape;
}

void CheckpointReader::read(const std::string& dataset, float* out) const {
    QuietHdf5 quiet;
    const Impl& r = *impl_;
    const DatasetInfo& in = r.info(dataset);
    if (in.dtype != "float32")
        r.fail("/" + in.path + " is " + in.dtype + ", not float32; read it as what it is");
    const i64 n = in.numel();
    if (n > 0) {
        H d = r.open(in);
        r.read_raw(in, d.get(), 0, n, out);
    }
    if (!in.has_checksum)
        r.fail("dataset /" + in.path + " has no checksum attribute; the file is damaged: use an earlier checkpoint");
    const std::uint64_t got = checksum_f32(out, n);
    if (got != in.checksum) throw CheckpointError(r.mismatch_text(in, got));
}

void CheckpointReader::read(const std::string& dataset, const Slab& s, float* out) const {
    QuietHdf5 quiet;
    const Impl& r = *impl_;
    const DatasetInfo& in = r.info(dataset);
    if (in.dtype != "float32")
        r.fail("/" + in.path + " is " + in.dtype + ", not float32; read it as what it is");
    const i64 R = in.shape.size() == 2 ? in.shape[0] : 1, C = in.shape.empty() ? 1 : in.shape.back();
    if (s.row0 < 0 || s.col0 < 0 || s.rows < 0 || s.cols < 0 || s.row0 + s.rows > R ||
        s.col0 + s.cols > C)
        r.fail("slab rows [" + std::to_string(s.row0) + ", " + std::to_string(s.row0 + s.rows) +
               ") x cols [" + std::to_string(s.col0) + ", " + std::to_string(s.col0 + s.cols) +
               ") lies outside /" + in.path + " of shape " + shape_text(in.shape));
    if (s.rows == 0 || s.cols == 0) return;
    H d = r.open(in);
    if (s.cols == C || s.rows == 1) {  // one run of the row-major order
        r.read_raw(in, d.get(), s.row0 * C + s.col0, s.rows * s.cols, out);
        return;
    }
    H fspace(H5Dget_space(d.get()), H5Sclose);
    const hsize_t start[2] = {static_cast<hsize_t>(s.row0), static_cast<hsize_t>(s.col0)};
    const hsize_t cnt[2] = {static_cast<hsize_t>(s.rows), static_cast<hsize_t>(s.cols)};
    H mspace(H5Screate_simple(2, cnt, nullptr), H5Sclose);
    if (!fspace.ok() || !mspace.ok() ||
        H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start, nullptr, cnt, nullptr) < 0 ||
        H5Dread(d.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, out) < 0)
        r.fail("cannot read a slab of /" + in.path + ": the file is truncated or damaged" +
               hdf5_detail() + "; use an earlier checkpoint");
}

void CheckpointReader::read_range(const std::string& dataset, i64 first, i64 count,
                                  float* out) const {
    QuietHdf5 quiet;
    const Impl& r = *impl_;
    const DatasetInfo& in = r.info(dataset);
    if (in.dtype != "float32")
        r.fail("/" + in.path + " is " + in.dtype + ", not float32; read it as what it is");
    if (first < 0 || count < 0 || first + count > in.numel())
        r.fail("elements [" + std::to_string(first) + ", " + std::to_string(first + count) +
               ") lie outside /" + in.path + " of " + std::to_string(in.numel()) + " elements");
    if (count == 0) return;
    H d = r.open(in);
    r.read_raw(in, d.get(), first, count, out);
}

DatasetCheck CheckpointReader::check(const std::string& dataset) const {
    QuietHdf5 quiet;
    return impl_->check(impl_->info(dataset));
}

void CheckpointReader::verify(const std::string& dataset) const {
    const DatasetCheck c = check(dataset);
    if (!c.ok) throw CheckpointError(c.problem);
}

std::vector<DatasetCheck> CheckpointReader::check_all() const {
    QuietHdf5 quiet;
    std::vector<DatasetCheck> out;
    for (const DatasetInfo& in : impl_->infos) out.push_back(impl_->check(in));
    return out;
}

void CheckpointReader::verify_all() const {
    QuietHdf5 quiet;
    for (const DatasetInfo& in : impl_->infos) {
        const DatasetCheck c = impl_->check(in);
        if (!c.ok) throw CheckpointError(c.problem);
    }
}

void CheckpointReader::check_model(const ModelConfig& mc) const {
    const Impl& r = *impl_;
    const ParamTable table = ParamTable::build(mc);
    const std::string what_to_do =
        ": the checkpoint was written for another model; use the config it was written with "
        "(its 'config' attribute, shown by parallax inspect " + r.path + ")";
    for (const TableEntry& e : table.entries) {
        const std::vector<i64> want = tensor_shape(e);
        for (const std::string& p :
             {model_dataset(e.name), moment_dataset('m', e.name), moment_dataset('v', e.name)}) {
            if (!has(p))
                r.fail("has no dataset /" + p + " that the config (model.layers = " +
                       std::to_string(mc.layers) + ") needs" + what_to_do);
            const DatasetInfo& in = r.info(p);
            if (in.shape != want)
                r.fail("dataset /" + p + " has shape " + shape_text(in.shape) +
                       ", the config (model.vocab, seq_len, hidden, ffn = " +
                       std::to_string(mc.vocab) + ", " + std::to_string(mc.seq_len) + ", " +
                       std::to_string(mc.hidden) + ", " + std::to_string(mc.ffn) + ") needs " +
                       shape_text(want) + what_to_do);
            if (in.dtype != "float32")
                r.fail("dataset /" + p + " is " + in.dtype + ", not float32; the file is damaged: use an earlier checkpoint");
        }
    }
    const auto tensors = std::count_if(r.infos.begin(), r.infos.end(), [](const DatasetInfo& d) {
        return d.path.rfind("model/", 0) == 0;
    });
    if (tensors != static_cast<i64>(table.entries.size()))
        r.fail("holds " + std::to_string(tensors) + " model tensors, the config (model.layers = " +
               std::to_string(mc.layers) + ") has " + std::to_string(table.entries.size()) +
               what_to_do);
}

LogicalState read_checkpoint(const std::string& path, const ModelConfig& mc, CheckpointMeta* meta) {
    CheckpointReader r(path);
    r.check_model(mc);
    LogicalState s;
    s.allocate(mc);
    for (const TableEntry& e : s.table.entries) {
        r.read(model_dataset(e.name), s.params.data() + e.offset);
        r.read(moment_dataset('m', e.name), s.m.data() + e.offset);
        r.read(moment_dataset('v', e.name), s.v.data() + e.offset);
    }
    s.history = r.meta().history;
    if (meta) *meta = r.meta();
    return s;
}

// ---- a folder of checkpoints ----

std::string checkpoint_path(const std::string& dir, i64 step) {
    char name[40];
    std::snprintf(name, sizeof name, "ckpt-%08lld.h5", static_cast<long long>(step));
    return (fs::path(dir) / name).string();
}

namespace {

bool all_digits(const std::string& s) {
    return !s.empty() && s.size() <= 18 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "ckpt-00000100.h5" -> 100; -1 if the name is not a committed checkpoint's.
i64 committed_step(const std::string& name) {
    if (name.size() < 9 || name.rfind("ckpt-", 0) != 0 || name.substr(name.size() - 3) != ".h5")
        return -1;
    const std::string digits = name.substr(5, name.size() - 8);
    return all_digits(digits) ? std::stoll(digits) : -1;
}

// ".ckpt-00000100.h5.tmp-1234" -> 1234; -1 if not a temporary checkpoint file.
long temp_pid(const std::string& name) {
    const size_t t = name.rfind(".tmp-");
    if (name.rfind(".ckpt-", 0) != 0 || t == std::string::npos) return -1;
    if (committed_step(name.substr(1, t - 1)) < 0) return -1;
    const std::string digits = name.substr(t + 5);
    return all_digits(digits) ? std::stol(digits) : -1;
}

}  // namespace

std::vector<CheckpointFile> list_checkpoints(const std::string& dir) {
    std::vector<CheckpointFile> done, temps;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return {};
    for (const auto& ent : fs::directory_iterator(dir, ec)) {
        if (!ent.is_regular_file(ec)) continue;
        const std::string name = ent.path().filename().string();
        if (const i64 step = committed_step(name); step >= 0)
            done.push_back({ent.path().string(), step, false});
        else if (temp_pid(name) >= 0)
            temps.push_back({ent.path().string(), -1, true});
    }
    std::sort(done.begin(), done.end(), [](const CheckpointFile& a, const CheckpointFile& b) {
        return a.step != b.step ? a.step > b.step : a.path > b.path;
    });
    std::sort(temps.begin(), temps.end(),
              [](const CheckpointFile& a, const CheckpointFile& b) { return a.path < b.path; });
    done.insert(done.end(), temps.begin(), temps.end());
    return done;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, i64 keep) {
    PX_ASSERT(keep >= 1, "prune_checkpoints: keep must be >= 1");
    std::vector<std::string> removed;
    i64 kept = 0;
    const long me = static_cast<long>(::getpid());
    for (const CheckpointFile& f : list_checkpoints(dir)) {
        bool drop = false;
        if (f.temp)
            drop = temp_pid(fs::path(f.path).filename().string()) != me;
        else
            drop = ++kept > keep;
        std::error_code ec;
        if (drop && fs::remove(f.path, ec)) removed.push_back(f.path);
    }
    return removed;
}

LatestCheckpoint find_latest_valid(const std::string& dir, bool remove_temps) {
    LatestCheckpoint out;
    for (const CheckpointFile& f : list_checkpoints(dir)) {
        if (f.temp) {
            std::error_code ec;
            const bool gone = remove_temps && fs::remove(f.path, ec);
            out.skipped.push_back({f.path, std::string("an unfinished write (temporary file, never "
                                                       "committed); ignored") +
                                               (gone ? " and removed" : "")});
            continue;
        }
        if (out.found()) continue;
        try {
            CheckpointReader r(f.path);
            r.verify_all();
            if (r.meta().step != f.step)
                throw CheckpointError("checkpoint " + f.path + ": its name says step " +
                                      std::to_string(f.step) + " but it holds step " +
                                      std::to_string(r.meta().step) +
                                      "; it was renamed by hand: rename it back");
            out.path = f.path;
            out.step = f.step;
        } catch (const Error& e) {
            out.skipped.push_back({f.path, e.what()});
        }
    }
    return out;
}

std::string save_checkpoint(const std::string& dir, const LogicalState& state,
                            const CheckpointMeta& meta, const ModelConfig& mc, i64 keep) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
        throw CheckpointError("checkpoint folder " + dir + ": cannot create it: " + ec.message() +
                              "; check checkpoint.dir");
    const std::string path = checkpoint_path(dir, meta.step);
    write_checkpoint(path, state, meta, mc);
    prune_checkpoints(dir, keep);
    return path;
}

}  // namespace px
