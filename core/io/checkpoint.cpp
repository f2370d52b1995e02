// Checkpoints in HDF5: the layout and the checksum are described in checkpoint.h. Here: what the
// writer (checkpoint_write.cpp) and the reader (checkpoint_read.cpp) share, the checksum, the
// dataset names, the meta and its checksum, and hyperslab selections; a folder of checkpoints
// is checkpoint_folder.cpp.
#include "core/io/checkpoint_internal.h"
#include "core/model/data.h"

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace px {

static_assert(std::endian::native == std::endian::little,
              "checkpoints store little-endian data and checksum native bit patterns");

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
        sum += checksum_term(static_cast<std::uint64_t>(first_index + i),
                             static_cast<std::uint64_t>(b));
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
    if (!m.skipped_batches.empty()) line("data.skipped_batches", ckpt::join_batches(m.skipped_batches));
    line("rng.counter_base", std::to_string(m.rng_counter_base));
    line("scaler.loss_scale", bits_hex(m.loss_scale));
    line("scaler.growth_tracker", std::to_string(m.growth_tracker));
    if (!m.source_dtype.empty()) line("model.source_dtype", m.source_dtype);
    return t;
}

}  // namespace

std::string ckpt::join_batches(const std::vector<i64>& b) {
    std::string s;
    for (size_t i = 0; i < b.size(); i++) {
        if (i) s += ',';
        s += std::to_string(b[i]);
    }
    return s;
}

std::uint64_t ckpt::meta_checksum(const CheckpointMeta& m, std::int64_t version) {
    const std::string t = meta_text(m, version);
    return checksum_bytes(t.data(), static_cast<i64>(t.size()));
}

std::string data_source_description(const Config& cfg) {
    const DataConfig& d = cfg.data;
    std::string s = "source=" + d.source;
    if (d.source == "markov" || d.source == "mixture") {
        const i64 V = d.markov_vocab > 0 ? d.markov_vocab : cfg.model.vocab;
        s += " vocab=" + std::to_string(V) + " order=" + std::to_string(d.markov_order) +
             " alpha=" + shortest(d.markov_alpha) + " table_seed=" + std::to_string(d.markov_seed);
        if (d.source == "mixture") s += " chains=" + std::to_string(d.mixture_chains);
    } else if (d.source == "copy") {
        s += " vocab=" + std::to_string(source_vocab(cfg)) +
             " distance=" + std::to_string(copy_distance(cfg));
    } else {
        s += " train=" + d.train_path + " val=" + d.val_path;
    }
    s += " | seed=" + std::to_string(cfg.train.seed) +
         " batch=" + std::to_string(cfg.train.batch_size) +
         " seq_len=" + std::to_string(cfg.model.seq_len);
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
                              "weights with model.init_from = \"" +
                              path + "\" and checkpoint.resume = \"\"");
    if (now != meta.data_source)
        throw CheckpointError("checkpoint " + path +
                              ": it was written by a run that drew other data (" +
                              meta.data_source + ") than this config draws (" + now +
                              "); a resume must keep [data], train.seed, train.batch_size and "
                              "model.seq_len, or start fresh (checkpoint.resume = \"\")");
}

// ---- hyperslab selections ----

bool ckpt::select_slab(hid_t fspace, H5S_seloper_t op, int rank, const Slab& s) {
    if (rank == 1) {
        const hsize_t start = static_cast<hsize_t>(s.col0), cnt = static_cast<hsize_t>(s.cols);
        return H5Sselect_hyperslab(fspace, op, &start, nullptr, &cnt, nullptr) >= 0;
    }
    const hsize_t start[2] = {static_cast<hsize_t>(s.row0), static_cast<hsize_t>(s.col0)};
    const hsize_t cnt[2] = {static_cast<hsize_t>(s.rows), static_cast<hsize_t>(s.cols)};
    return H5Sselect_hyperslab(fspace, op, start, nullptr, cnt, nullptr) >= 0;
}

// The hyperslab of a flat range [first, first+count) of a (R, C) dataset: the tail of a first
// row, whole rows, the head of a last row, OR-ed together (row-major order is the order HDF5
// moves the elements of a hyperslab union in).
bool ckpt::select_range(hid_t fspace, int rank, i64 C, i64 first, i64 count) {
    if (H5Sselect_none(fspace) < 0) return false;
    auto add = [&](i64 r0, i64 nr, i64 c0, i64 nc) {
        return nr <= 0 || nc <= 0 || select_slab(fspace, H5S_SELECT_OR, rank, {r0, nr, c0, nc});
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

}  // namespace px
