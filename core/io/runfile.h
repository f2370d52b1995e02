// The run file: an HDF5 file with the job's config, its metrics and its events (docs/files.md).
//
// Layout
//   /                      attributes: config (the job's TOML text), parallax_version, created
//                          (ISO 8601, UTC), plus summary attributes from set_attr
//   /metrics/<name>/step   int64, one row per step the metric was logged at, in increasing step
//                          order, extendible (chunks of 256 rows)
//   /metrics/<name>/value  float64, the same rows
//   /events/step           int64, one row per event, in the order they happened (extendible)
//   /events/kind           string, what happened: "resume", "rerun", "alert"
//   /events/message        string, a sentence for people ("resumed at step 4 from ck/ckpt-...")
//   /events/evidence       string, "name=value;..." (a spike's per-layer values as the first run
//                          saw them: the rows of a rolled-back step are replaced); only once an
//                          event had evidence, "" for the others
//   /fp8/<column>          the FP8 drift monitor's table (core/train/fp8_monitor.h), one row
//                          per fp8-scaled tensor and monitored step, extendible, in step order:
//                          step, count, nonfinite, alerts (int64); tensor, recipe (string);
//                          amax, scale, scale_ratio, saturated, underflow, dynamic_range, mse,
//                          sqnr_db (float64): the fields of Fp8Stat (core/base/metrics.h)
//   /<any>/<path>          fixed-size arrays from write_array (dumps: weights, Adam moments)
// Strings are variable-length UTF-8: h5py returns attributes as str, dataset rows as bytes
// (`f["events/kind"].asstr()[()]` gives str).
//
// Each step appears once per metric. Appending a step at or before a metric's last one (a step
// that was run again) replaces that row and drops the rows after it; truncate() drops the rows
// after a step in every metric and in /fp8 (whose rows of a step run again are replaced alike). Events are a log and are never dropped: a resumed or re-run
// step is recorded there.
//
// Index
//   RunFile            creates the file (truncating) or reopens one to continue it; appends and
//                      truncates metric rows, logs events, sets attributes
//   RunFileDamaged     a file at the path that is not a readable run file
//   Fp8Column, fp8_columns         the /fp8 datasets and the Fp8Stat fields they hold
//   RunRecords, read_run_records   a run file's config, metrics, events, /fp8 rows and numeric
//                                  summaries, opened read-only
//   (RunFileObserver, core/train/run_file_observer.h, writes a training run's file, continued
//   across a resume; a damaged one is moved aside to <path>.damaged (or .damaged-2, ...) and
//   written anew from the checkpoint.)
//
// Errors from HDF5 become px::Error naming the path; HDF5's own error printing is silenced
// around every call (and restored after). Serial HDF5 is not thread-safe: one thread per file.
#pragma once
#include "core/base/error.h"
#include "core/base/metrics.h"
#include "core/base/shapes.h"

#include <memory>
#include <utility>
#include <string>
#include <vector>

namespace px {

// A file at a run file's path that HDF5 cannot open, or whose structure is not a run file's
// (e.g. left half-written by a killed process). RunFileObserver moves it aside on a resume.
struct RunFileDamaged : Error {
    using Error::Error;
};

// One dataset of /fp8: its name, 'i' (int64), 'f' (float64) or 's' (string), and the field.
struct Fp8Column {
    const char* name;
    char kind;
    i64 Fp8Stat::*i = nullptr;
    double Fp8Stat::*f = nullptr;
    std::string Fp8Stat::*s = nullptr;
};
const std::vector<Fp8Column>& fp8_columns();  // step first

class RunFile {
public:
    // Creates or truncates. `label` names the file in errors ("run file", "dump").
    RunFile(const std::string& path, const std::string& config_toml,
            const std::string& label = "run file");
    // The run file at `path`, opened read-write to continue it; its rows and attributes are kept.
    // Null when there is nothing to continue: no file, or an HDF5 file that is not a run file (no
    // parallax_version attribute or no /metrics group). Throws px::Error naming the file when a
    // file is there that can be read but not opened read-write (permissions, another process
    // holding it): it may hold a good run, so it is never replaced behind the user's back; and
    // RunFileDamaged when HDF5 cannot open a readable file, or a part of it is not what a run
    // file holds.
    static std::unique_ptr<RunFile> reopen(const std::string& path);
    ~RunFile();  // flushes and closes
    RunFile(RunFile&&) noexcept;
    RunFile& operator=(RunFile&&) noexcept;
    RunFile(const RunFile&) = delete;
    RunFile& operator=(const RunFile&) = delete;

    // One row (step, value) of /metrics/<metric>; the group is created on first use. A step at
    // or before the metric's last one replaces that row and drops the later ones.
    // Metric names are non-empty and contain no '/'.
    void append(const std::string& metric, i64 step, double value);
    void truncate(i64 last_step);                    // every metric keeps its rows with step <= it
    i64 last_step(const std::string& metric) const;  // of /metrics/<metric>; 0: absent or empty
    void read(const std::string& metric, std::vector<i64>* steps,
              std::vector<double>* values) const;  // every row; empty when absent
    // One row of /events (created on first use): what happened at `step`.
    // evidence: "name=value;name=value" (a spike's per-layer values), in /events/evidence,
    // which is made when the first event with evidence comes ("" for the rows before it).
    void event(i64 step, const std::string& kind, const std::string& message,
               const std::string& evidence = "");
    // The rows of one monitored step (all of the same step) appended to /fp8 (created on first
    // use); a step at or before the last one written replaces its rows and drops the later ones.
    void append_fp8(const std::vector<Fp8Stat>& rows);
    void set_attr(const std::string& key, const std::string& value);  // root attribute, replaced
    void set_attr(const std::string& key, double value);
    // A fixed-size array at `where` ("weights/h.0.ln_1.weight"); missing groups are created.
    // Names may contain '.', not empty path parts.
    void write_array(const std::string& where, const float* data, const std::vector<i64>& shape);
    void write_array(const std::string& where, const double* data, const std::vector<i64>& shape);
    void flush();  // everything appended so far reaches the file
    const std::string& path() const;

    struct Impl;

private:
    RunFile();
    std::unique_ptr<Impl> impl_;
};

// What a run file holds, read without opening it for writing (a reader beside a running job, a
// notebook): the config, every metric's rows, every event.
struct RunRecords {
    struct Rows {
        std::vector<i64> steps;
        std::vector<double> values;
    };
    struct Event {
        i64 step = 0;
        std::string kind, message;
        std::string evidence;  // /events/evidence ("" when the file has none)
    };
    std::string config_toml;
    std::vector<std::pair<std::string, Rows>> metrics;  // by name, sorted
    std::vector<Event> events;                          // in the order they happened
    std::vector<Fp8Stat> fp8;                           // /fp8's rows; empty without it
    // The numeric root attributes (set_attr's summaries: num_params, memory_params_bytes, ...,
    // entropy_rate), by name.
    std::vector<std::pair<std::string, double>> numbers;
};
// Throws px::Error naming the file when it is missing or not a run file.
RunRecords read_run_records(const std::string& path);

}  // namespace px
