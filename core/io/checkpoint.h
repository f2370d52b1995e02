// Checkpoints: the logical, layout-free state of a run in one HDF5 file (docs/files.md), written
// piecewise by the ranks that hold it and loadable under any other layout.
//
// Index
//   CheckpointError         a checkpoint that cannot be used: names the file, what is wrong, what to do
//   checksum_term, checksum_f32/_f64/_i64/_bytes   the per-dataset checksum (below), piecewise
//   Slab                    a 2-D hyperslab (rows, cols) of a dataset; 1-D datasets have one row
//   CheckpointMeta          step, seed, config, data-loader, RNG, optimizer and scaler state, history
//   data_source_description what identifies a run's token stream, stored to check a resume
//   make_checkpoint_meta    the meta of a run from its config, step and history
//   check_same_data         a resume's config draws the data the checkpoint's run drew
//   model_dataset, moment_dataset   "model/<name>", "optim/m/<name>", "optim/v/<name>"
//   CheckpointWriter        creates every dataset, takes each rank's pieces, commits atomically
//   write_checkpoint        a whole LogicalState, one writer, atomically
//   DatasetInfo             one dataset as listed by a reader: path, shape, dtype, stored checksum
//   CheckpointReader        opens and checks a file; reads meta, tensors, hyperslabs; verifies
//   read_checkpoint         a whole file into a LogicalState (checks shapes against a ModelConfig)
//   checkpoint_path, list_checkpoints, prune_checkpoints, find_latest_valid, save_checkpoint
//                           a folder of checkpoints: names, retention of the last K, resume choice
//
// File layout (format "parallax-checkpoint", format_version 1; little-endian; HDF5's 1.8 file
// format, whose own metadata is checksummed; groups keep their links and attributes in their
// object headers ("compact" storage), never in a fractal heap, which is not checksummed; strings
// are fixed-length UTF-8, which h5py returns as bytes: a variable-length string would sit in
// HDF5's global heap, which is not checksummed either):
//   /                    attributes: format, format_version (int64), parallax_version, created
//                        (ISO 8601 UTC), step (int64, optimizer steps done), seed (uint64),
//                        config (the job's TOML), checksum_algorithm ("sum-mix64-v1"),
//                        meta_checksum (uint64, over every meta attribute; see meta_text in .cpp)
//   /model               attributes: source_dtype (string, only in a checkpoint converted from a
//                        Hugging Face folder: its weights' safetensors dtype, "F32", "BF16", "F16")
//   /model/<name>        float32 weights, GPT-2 names and shapes: wte (V,C), wpe (T,C),
//                        h.{i}.attn.c_attn.weight (3C,C), ..., vectors 1-D: h.{i}.ln_1.bias (C)
//   /optim               attributes: algorithm ("adamw"), adam_step (int64, t of the last update)
//   /optim/m/<name>, /optim/v/<name>   float32 Adam moments, the same shapes
//   /data                attributes: source (data_source_description), next_step (int64, the step
//                        index the next batch is drawn with; windows are a function of (seed,
//                        split, step, sample), core/model/data.h), seed (uint64), and only
//                        when a spike rollback skipped batches, skipped_batches (string:
//                        ascending 0-based batch indices, comma-separated; Job::batch_index)
//   /rng                 attributes: generator ("philox4x32-10"), seed (uint64, the Philox key),
//                        counter_base (int64: the step counter the next draws use)
//   /scaler              attributes: loss_scale (float64: the fp32 scale of the next step),
//                        growth_tracker (int64: good steps in a row), dynamic (int64: 1 when the
//                        run scaled its loss, fp16 activations; 0 with the defaults 1.0 and 0
//                        otherwise). A resume of an fp16 run goes on with the file's scale when
//                        dynamic is 1 (core/train/loss_scaler.h).
//   /fp8/scale           only when the run has fp8 matmuls (precision.fp8 = "delayed"): float32
//                        (gemms, 3), the scale of the next step of each fp8 matmul (in the order
//                        of its weight in the model: block by block, qkv, attn proj, fc, fc proj)
//                        for its input, weight and output gradient (core/model/fp8.h)
//   /fp8/amax_history    float32 (gemms * 3, history_len): their amax histories, newest first.
//                        Files without /fp8 (written before fp8, or by runs without it) read as
//                        having no fp8 state
//   /history/step        int64 per finished step; /history/<field> float64 for loss, val_loss
//                        (-1: none), grad_norm, lr, tokens_per_s, step_ms, comm_bytes
// Every dataset has a uint64 attribute `checksum`.
//
// The checksum. For a dataset with elements e_0 .. e_{n-1} (row-major logical order) whose bit
// patterns are b_i (zero-extended to 64 bits):
//     checksum = sum_i mix64(mix64(i ^ K) ^ b_i)  (mod 2^64),  K = 0x5058434b50543031 ("PXCKPT01")
// with mix64 the splitmix64 finaliser (a bijection of 64-bit words). It is order-free, so ranks
// that each hold a hyperslab sum their own elements (with their logical indices) and the sums
// add up (an all-reduce of uint64 sums); any change of one element changes its term (mix64 is a
// bijection in b_i), so a flipped bit is always detected; swapping two different elements
// changes the sum except with probability about 2^-64.
//
// Atomic writes. A CheckpointWriter writes to <dir>/.<name>.tmp-<pid> (pid of rank 0) in the
// final file's folder; commit() closes it, fsyncs it, renames it to the final name and fsyncs
// the folder, so a crash leaves the previous checkpoints and, at worst, a temporary file that
// readers ignore and prune_checkpoints removes.
//
// MPI. Given an MPI communicator (MPI initialised), every rank of it constructs the writer (a
// collective: the datasets are created by all), writes its own pieces (independent I/O through
// the MPI-IO driver), and calls commit() (collective: the checksums and element counts are
// summed over the ranks; the elements written must add up to each dataset's size, a cheap check
// that catches a missing or repeated piece, though not an overlap that exactly offsets a gap). An
// exception on one rank between the two leaves the others waiting in a collective: the caller
// aborts the job then (as for any failed collective). Without one
// (MPI_COMM_NULL, the default) it is one process with HDF5's default driver; MPI need not be
// initialised. Readers always use the default driver: every rank opens the file and reads the
// hyperslabs it needs. Serial HDF5 is not thread-safe: one thread at a time uses these classes.
#pragma once
#include "core/comm/mpi.h"  // MPI_Comm (the MPI C API, as the MPI backend includes it)
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/base/metrics.h"
#include "core/io/state.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace px {

// Derives from DataError, so the CLI maps it to exit code 2 (bad input).
struct CheckpointError : DataError {
    using DataError::DataError;
};

inline constexpr const char* kCheckpointFormat = "parallax-checkpoint";
inline constexpr std::int64_t kCheckpointVersion = 1;  // the only version this build reads
inline constexpr const char* kChecksumAlgorithm = "sum-mix64-v1";

// ---- the checksum ----

inline std::uint64_t mix64(std::uint64_t x) {  // splitmix64 finaliser
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
inline std::uint64_t checksum_term(std::uint64_t index, std::uint64_t bits) {
    return mix64(mix64(index ^ 0x5058434b50543031ull) ^ bits);
}
// The sum of the terms of data[0..n), whose logical indices start at first_index. Partial sums
// of disjoint pieces add up (mod 2^64) to the whole dataset's checksum.
std::uint64_t checksum_f32(const float* data, i64 n, i64 first_index = 0);
std::uint64_t checksum_f64(const double* data, i64 n, i64 first_index = 0);
std::uint64_t checksum_i64(const std::int64_t* data, i64 n, i64 first_index = 0);
std::uint64_t checksum_bytes(const void* data, i64 n, i64 first_index = 0);

// ---- pieces of a dataset ----

// Rows [row0, row0+rows) x columns [col0, col0+cols) of a dataset seen as (R, C); a 1-D dataset
// of n elements is (1, n). The data of a slab is row-major, rows*cols elements.
struct Slab {
    i64 row0 = 0, rows = 0, col0 = 0, cols = 0;
};

// ---- what a checkpoint holds besides tensors ----

struct CheckpointMeta {
    i64 step = 0;                   // optimizer steps done; a resume continues with step + 1
    std::uint64_t seed = 0;         // train.seed: init, data and RNG key
    std::string config_toml;        // the job's config (config_to_toml)
    std::string data_source;        // data_source_description of the job
    i64 data_next_step = 0;         // the step index of the next batch (= step here)
    i64 rng_counter_base = 0;       // the Philox counter (stream) of the next step's draws
    i64 adam_step = 0;              // AdamW t of the last update (= step here)
    double loss_scale = 1.0;        // /scaler: fp16's loss scale of the next step (1 without)
    i64 growth_tracker = 0;         // its good steps in a row
    bool loss_scale_dynamic = false;  // /scaler dynamic: the run scaled its loss (fp16)
    // /fp8 (precision.fp8 = "delayed"; empty without): per fp8 matmul, per role (input, weight,
    // output gradient), the scale of the next step and the amax history, newest first.
    i64 fp8_gemms = 0, fp8_history_len = 0;
    std::vector<float> fp8_scale;    // (fp8_gemms, 3)
    std::vector<float> fp8_history;  // (fp8_gemms * 3, fp8_history_len)
    // /data skipped_batches: batches the run will never draw (core/train/spikes.h rollbacks).
    std::vector<i64> skipped_batches;
    std::vector<StepMetrics> history;  // one entry per finished step
    // /model source_dtype: the safetensors dtype ("F32", "BF16", "F16") of the Hugging Face
    // weights a checkpoint was converted from (parallax convert); empty otherwise. Converting it
    // back to a Hugging Face folder writes that dtype unless told another.
    std::string source_dtype;
    std::string parallax_version;   // filled by the writer / read back
    std::string created;            // ISO 8601 UTC, filled by the writer / read back
};

// "source=markov vocab=32 order=1 alpha=0.25 table_seed=7 | seed=1337 batch=8 seq_len=64": the
// keys that decide which windows step s draws. A resume compares it with the checkpoint's.
std::string data_source_description(const Config& cfg);
// The meta of a run of cfg after `step` steps with that history (seed, config text, data
// source, counters = step, scaler defaults).
CheckpointMeta make_checkpoint_meta(const Config& cfg, i64 step,
                                    const std::vector<StepMetrics>& history);

// Throws CheckpointError naming the file and both descriptions when cfg's data (source, seed,
// batch, sequence length) differs from that of the run that wrote the checkpoint at `path`.
void check_same_data(const CheckpointMeta& meta, const Config& cfg, const std::string& path);

std::string model_dataset(const std::string& name);            // "model/<name>"
std::string moment_dataset(char which, const std::string& name);  // 'm' or 'v': "optim/m/<name>"

// ---- writing ----

class CheckpointWriter {
public:
    // Creates the temporary file next to final_path with every dataset of the whole model of mc
    // and the meta (collective under MPI: every rank of comm passes the same mc; rank 0's meta
    // is stored, since ranks' histories differ in their timings).
    CheckpointWriter(const std::string& final_path, const CheckpointMeta& meta,
                     const ModelConfig& mc, MPI_Comm comm = MPI_COMM_NULL);
    // Without commit(): closes and removes the temporary file (rank 0 under MPI).
    ~CheckpointWriter();
    CheckpointWriter(const CheckpointWriter&) = delete;
    CheckpointWriter& operator=(const CheckpointWriter&) = delete;

    // This rank's piece of a float32 dataset ("model/wte", "optim/m/h.0.ln_1.weight"), row-major.
    void write(const std::string& dataset, const Slab& slab, const float* data);
    // Elements [first, first+count) of the dataset in row-major order (a flat range: a ZeRO
    // shard's part of one tensor); data holds count floats.
    void write_range(const std::string& dataset, i64 first, i64 count, const float* data);
    // Collective under MPI: combines the checksums, checks every element was written once,
    // writes the checksums, closes, fsyncs, renames to final_path and fsyncs the folder.
    void commit();

    const std::string& final_path() const;
    const std::string& temp_path() const;
    // The datasets of the model, "model/<name>", "optim/m/<name>", "optim/v/<name>", in order.
    std::vector<std::string> tensor_datasets() const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// The whole state by one writer (tensors of state.table; the history is taken from meta).
void write_checkpoint(const std::string& path, const LogicalState& state,
                      const CheckpointMeta& meta, const ModelConfig& mc);

// ---- reading ----

struct DatasetInfo {
    std::string path;              // "model/wte", "history/loss", ...
    std::vector<i64> shape;
    std::string dtype;             // "float32", "float64", "int64", or what HDF5 calls it
    std::uint64_t checksum = 0;    // as stored
    bool has_checksum = false;
    i64 numel() const;
};

// The result of verifying one dataset.
struct DatasetCheck {
    DatasetInfo info;
    std::uint64_t computed = 0;
    bool ok = false;
    std::string problem;  // empty when ok
};

class CheckpointReader {
public:
    // Opens the file and checks that it is a complete HDF5 file, a Parallax checkpoint of a
    // version this build reads, and that its meta attributes match meta_checksum. Throws
    // CheckpointError naming the file otherwise.
    explicit CheckpointReader(const std::string& path);
    ~CheckpointReader();
    CheckpointReader(CheckpointReader&&) noexcept;
    CheckpointReader& operator=(CheckpointReader&&) noexcept;

    const std::string& path() const;
    const CheckpointMeta& meta() const;
    std::vector<DatasetInfo> datasets() const;  // every dataset in the file, sorted by path
    bool has(const std::string& dataset) const;
    std::vector<i64> shape(const std::string& dataset) const;

    // A whole float32 dataset into out (numel floats); verifies its checksum.
    void read(const std::string& dataset, float* out) const;
    // A hyperslab (not verified: call verify() once for the dataset).
    void read(const std::string& dataset, const Slab& slab, float* out) const;
    void read_range(const std::string& dataset, i64 first, i64 count, float* out) const;

    // Recomputes one dataset's checksum; throws CheckpointError naming the file, the dataset and
    // both checksums on a mismatch.
    void verify(const std::string& dataset) const;
    DatasetCheck check(const std::string& dataset) const;  // the same, as a result
    std::vector<DatasetCheck> check_all() const;           // every dataset
    void verify_all() const;                               // throws on the first mismatch
    // Every tensor of the whole model of mc present with its shape; throws CheckpointError
    // naming the dataset, both shapes and the config keys otherwise.
    void check_model(const ModelConfig& mc) const;

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

// Reads a whole checkpoint into a LogicalState laid out as ParamTable::build(mc), verifying
// every checksum and the shapes; returns its meta through *meta when given.
LogicalState read_checkpoint(const std::string& path, const ModelConfig& mc,
                             CheckpointMeta* meta = nullptr);

// ---- a folder of checkpoints ----

std::string checkpoint_path(const std::string& dir, i64 step);  // <dir>/ckpt-00000100.h5

struct CheckpointFile {
    std::string path;
    i64 step = -1;       // from the name; -1 for a temporary file
    bool temp = false;   // an unfinished write: .ckpt-*.h5.tmp-<pid>
};
// The committed checkpoints in dir, newest (highest step) first, then the temporary files.
// A missing folder lists nothing.
std::vector<CheckpointFile> list_checkpoints(const std::string& dir);

// Removes all but the newest `keep` committed checkpoints and every temporary file not being
// written by this process. Returns the removed paths.
std::vector<std::string> prune_checkpoints(const std::string& dir, i64 keep);

struct SkippedCheckpoint {
    std::string path;
    std::string reason;
};
struct LatestCheckpoint {
    std::string path;  // empty: no valid checkpoint in the folder
    i64 step = -1;
    std::vector<SkippedCheckpoint> skipped;  // newer ones that failed, and temporary files
    bool found() const { return !path.empty(); }
};
// Newest first, opens and verifies each (format, version, meta and every dataset checksum) and
// returns the first that passes, with the ones skipped and why (the caller reports them).
// Temporary files are never candidates; they are listed as skipped, and removed when
// remove_temps is set (one process: the caller's rank 0).
LatestCheckpoint find_latest_valid(const std::string& dir, bool remove_temps = false);

// write_checkpoint to checkpoint_path(dir, meta.step) (creating dir), then prune_checkpoints
// to the last `keep`. Returns the path written.
std::string save_checkpoint(const std::string& dir, const LogicalState& state,
                            const CheckpointMeta& meta, const ModelConfig& mc, i64 keep);

}  // namespace px
