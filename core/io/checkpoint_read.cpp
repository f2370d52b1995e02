// The checkpoint reader (core/io/checkpoint.h): opens and checks a file, lists its datasets, reads
// and verifies them.
#include "core/io/checkpoint_internal.h"
#include "core/io/hdf5_util.h"
#include "core/base/files.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <filesystem>

namespace px {

namespace fs = std::filesystem;
using namespace ckpt;

namespace {

using H = H5Handle;
using namespace h5;

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
    return "class " + std::to_string(static_cast<int>(cls)) + ", " + std::to_string(size) +
           " bytes";
}

}  // namespace

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
        auto it =
            std::lower_bound(infos.begin(), infos.end(), p,
                             [](const DatasetInfo& a, const std::string& b) { return a.path < b; });
        if (it == infos.end() || it->path != p)
            fail("has no dataset /" + p +
                 "; the file is incomplete or of another model (see parallax inspect " + path +
                 ")");
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
                sum +=
                    checksum_i64(reinterpret_cast<const std::int64_t*>(buf.data()), count, first);
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

    const DatasetInfo& float32_info(const std::string& dataset) const {
        const DatasetInfo& in = info(dataset);
        if (in.dtype != "float32")
            fail("/" + in.path + " is " + in.dtype + ", not float32; read it as what it is");
        return in;
    }

    std::string mismatch_text(const DatasetInfo& in, std::uint64_t computed) const {
        return "checkpoint " + path + ": checksum mismatch in dataset /" + in.path + ": stored " +
               hex64(in.checksum) + ", computed " + hex64(computed) +
               ": the file is corrupt; use an earlier checkpoint (parallax inspect lists them)";
    }
};

CheckpointReader::CheckpointReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
    QuietHdf5 quiet;
    Impl& r = *impl_;
    r.path = path;
    std::error_code ec;
    if (!fs::exists(path, ec))
        r.fail(
            "does not exist; check the path (parallax inspect DIR lists a folder's checkpoints)");
    if (fs::is_directory(path, ec))
        r.fail("is a folder, not a checkpoint file; give a ckpt-*.h5 file in it");
    if (const FileKind k = file_kind(path); k != FileKind::regular)
        r.fail(std::string("is ") + file_kind_text(k) +
               ", not a checkpoint file; give a ckpt-*.h5 file");
    const htri_t is = H5Fis_hdf5(path.c_str());
    if (is <= 0)
        r.fail(
            "is not an HDF5 file (no HDF5 signature: empty, truncated at its start, or another "
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
        r.fail(
            "has no readable root attribute 'format_version'; the file is damaged: use an earlier "
            "checkpoint");
    if (version != kCheckpointVersion)
        r.fail("has format_version " + std::to_string(version) +
               ", this build of Parallax reads format_version " +
               std::to_string(kCheckpointVersion) +
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
        r.fail("uses checksum algorithm '" + algo + "'; this build knows '" + kChecksumAlgorithm +
               "'");
    std::uint64_t stored_meta = 0;
    need(get_number(r.file, "meta_checksum", H5T_NATIVE_UINT64, stored_meta), "/meta_checksum");
    auto grp = [&](const char* name) {
        H g(H5Gopen2(r.file, name, H5P_DEFAULT), H5Gclose);
        if (!g.ok())
            r.fail(std::string("has no group /") + name +
                   "; the file is damaged: use an earlier checkpoint");
        return g;
    };
    {
        H g = grp("optim");
        need(get_number(g.get(), "adam_step", H5T_NATIVE_INT64, m.adam_step), "/optim adam_step");
    }
    {
        H g = grp("data");
        need(get_string(g.get(), "source", m.data_source), "/data source");
        need(get_number(g.get(), "next_step", H5T_NATIVE_INT64, m.data_next_step),
             "/data next_step");
        // Written only when batches were skipped; a missing one the writer had fails the meta
        // checksum below.
        std::string skipped;
        if (H5Aexists(g.get(), "skipped_batches") > 0) {
            need(get_string(g.get(), "skipped_batches", skipped), "/data skipped_batches");
            size_t at = 0;
            while (at < skipped.size()) {
                const size_t end = std::min(skipped.find(',', at), skipped.size());
                const std::string word = skipped.substr(at, end - at);
                char* stop = nullptr;
                const long long v = std::strtoll(word.c_str(), &stop, 10);
                if (word.empty() || *stop != '\0' || v < 0 ||
                    (!m.skipped_batches.empty() && v <= m.skipped_batches.back()))
                    r.fail("has a /data skipped_batches attribute that is not ascending batch "
                           "indices (\"" + skipped.substr(0, 80) +
                           "\"); the file is damaged: use an earlier checkpoint");
                m.skipped_batches.push_back(static_cast<i64>(v));
                at = end + 1;
            }
        }
    }
    {
        H g = grp("model");  // source_dtype: written only by a conversion from Hugging Face
        if (H5Aexists(g.get(), "source_dtype") > 0)
            need(get_string(g.get(), "source_dtype", m.source_dtype), "/model source_dtype");
    }
    {
        H g = grp("rng");
        need(get_number(g.get(), "counter_base", H5T_NATIVE_INT64, m.rng_counter_base),
             "/rng counter_base");
    }
    {
        H g = grp("scaler");
        need(get_number(g.get(), "loss_scale", H5T_NATIVE_DOUBLE, m.loss_scale),
             "/scaler loss_scale");
        need(get_number(g.get(), "growth_tracker", H5T_NATIVE_INT64, m.growth_tracker),
             "/scaler growth_tracker");
        std::int64_t dynamic = 0;  // written by every version, 0 before fp16 existed
        need(get_number(g.get(), "dynamic", H5T_NATIVE_INT64, dynamic), "/scaler dynamic");
        m.loss_scale_dynamic = dynamic != 0;
    }
    const std::uint64_t computed_meta = meta_checksum(m, version);
    if (computed_meta != stored_meta)
        r.fail("checksum mismatch in its attributes (meta_checksum stored " + hex64(stored_meta) +
               ", computed " + hex64(computed_meta) +
               "): the step, config or another attribute was altered; use an earlier checkpoint");

    // Every dataset, with shape, dtype and stored checksum; none may claim more than the file
    // holds (h5::oversized), found here before anything is sized by it.
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
        if (const std::string big = oversized(d.get(), "dataset /" + name + " of shape " +
                                                            shape_text(in.shape));
            !big.empty())
            r.fail(big + ": the file is damaged; use an earlier checkpoint");
        in.has_checksum = get_number(d.get(), "checksum", H5T_NATIVE_UINT64, in.checksum);
        r.infos.push_back(std::move(in));
    }
    std::sort(r.infos.begin(), r.infos.end(),
              [](const DatasetInfo& a, const DatasetInfo& b) { return a.path < b.path; });

    // The history, verified as it is read.
    auto read_column = [&](const DatasetInfo& in, void* out) {
        verify(in.path);
        H d = r.open(in);
        r.read_raw(in, d.get(), 0, in.numel(), out);
    };
    const DatasetInfo& st = r.info("history/step");
    const i64 n = st.numel();
    // One entry per finished step, in order: a resume continues after the last, and the
    // learning rate, the data and the run file all follow the step count.
    if (n != m.step)
        r.fail("/history/step has " + std::to_string(n) + " rows but the checkpoint's step is " +
               std::to_string(m.step) + "; the file is damaged: use an earlier checkpoint");
    std::vector<std::int64_t> steps(static_cast<size_t>(n));
    if (n > 0) read_column(st, steps.data());
    for (i64 i = 0; i < n; i++)
        if (steps[static_cast<size_t>(i)] != i + 1)
            r.fail("/history/step row " + std::to_string(i) + " is step " +
                   std::to_string(steps[static_cast<size_t>(i)]) + ", not " +
                   std::to_string(i + 1) +
                   ": the history must hold steps 1.." + std::to_string(n) +
                   " in order; the file is damaged: use an earlier checkpoint");
    // fp8's scales and histories, when the run had fp8 matmuls (both datasets or neither).
    const auto has_set = [&](const std::string& p) {
        return std::any_of(r.infos.begin(), r.infos.end(),
                           [&](const DatasetInfo& d) { return d.path == p; });
    };
    if (has_set("fp8/scale") || has_set("fp8/amax_history")) {
        const DatasetInfo& sc = r.info("fp8/scale");
        const DatasetInfo& hi = r.info("fp8/amax_history");
        if (sc.dtype != "float32" || hi.dtype != "float32" || sc.shape.size() != 2 ||
            hi.shape.size() != 2 || sc.shape[1] != 3 || sc.shape[0] < 1 ||
            hi.shape[0] != sc.shape[0] * 3 || hi.shape[1] < 1)
            r.fail("/fp8/scale " + shape_text(sc.shape) + " and /fp8/amax_history " +
                   shape_text(hi.shape) +
                   " are not float32 (gemms, 3) and (gemms * 3, history); the file is damaged: "
                   "use an earlier checkpoint");
        m.fp8_gemms = sc.shape[0];
        m.fp8_history_len = hi.shape[1];
        m.fp8_scale.resize(static_cast<size_t>(sc.numel()));
        m.fp8_history.resize(static_cast<size_t>(hi.numel()));
        read_column(sc, m.fp8_scale.data());
        read_column(hi, m.fp8_history.data());
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
        read_column(in, col.data());
        for (i64 i = 0; i < n; i++) m.history[i].*hf.field = col[i];
    }
}

CheckpointReader::~CheckpointReader() = default;
CheckpointReader::CheckpointReader(CheckpointReader&&) noexcept = default;
CheckpointReader& CheckpointReader::operator=(CheckpointReader&&) noexcept = default;

const std::string& CheckpointReader::path() const {
    return impl_->path;
}
const CheckpointMeta& CheckpointReader::meta() const {
    return impl_->meta;
}
std::vector<DatasetInfo> CheckpointReader::datasets() const {
    return impl_->infos;
}

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
    const DatasetInfo& in = r.float32_info(dataset);
    const i64 n = in.numel();
    if (n > 0) {
        H d = r.open(in);
        r.read_raw(in, d.get(), 0, n, out);
    }
    if (!in.has_checksum)
        r.fail("dataset /" + in.path +
               " has no checksum attribute; the file is damaged: use an earlier checkpoint");
    const std::uint64_t got = checksum_f32(out, n);
    if (got != in.checksum) throw CheckpointError(r.mismatch_text(in, got));
}

void CheckpointReader::read(const std::string& dataset, const Slab& s, float* out) const {
    QuietHdf5 quiet;
    const Impl& r = *impl_;
    const DatasetInfo& in = r.float32_info(dataset);
    const i64 R = in.shape.size() == 2 ? in.shape[0] : 1,
              C = in.shape.empty() ? 1 : in.shape.back();
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
    const hsize_t cnt[2] = {static_cast<hsize_t>(s.rows), static_cast<hsize_t>(s.cols)};
    H mspace(H5Screate_simple(2, cnt, nullptr), H5Sclose);
    if (!fspace.ok() || !mspace.ok() || !select_slab(fspace.get(), H5S_SELECT_SET, 2, s) ||
        H5Dread(d.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, out) < 0)
        r.fail("cannot read a slab of /" + in.path + ": the file is truncated or damaged" +
               hdf5_detail() + "; use an earlier checkpoint");
}

void CheckpointReader::read_range(const std::string& dataset, i64 first, i64 count,
                                  float* out) const {
    QuietHdf5 quiet;
    const Impl& r = *impl_;
    const DatasetInfo& in = r.float32_info(dataset);
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
        ": the checkpoint was written for another model (the [model] keys, model.moe_experts = " +
        std::to_string(mc.moe_experts) +
        " and the other moe_* keys included, must be the same); use the config it was written "
        "with (its 'config' attribute, shown by parallax inspect " +
        r.path + ")";
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
                r.fail("dataset /" + p + " is " + in.dtype +
                       ", not float32; the file is damaged: use an earlier checkpoint");
        }
    }
    const auto tensors = std::count_if(r.infos.begin(), r.infos.end(), [](const DatasetInfo& d) {
        return d.path.rfind("model/", 0) == 0;
    });
    if (tensors != static_cast<i64>(table.entries.size()))
        r.fail("holds " + std::to_string(tensors) +
               " model tensors, the config (model.layers = " + std::to_string(mc.layers) +
               ") has " + std::to_string(table.entries.size()) + what_to_do);
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

}  // namespace px
