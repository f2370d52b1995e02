// The run file: an HDF5 file with the job's config and its metrics (DESIGN.md §6).
//
// Layout
//   /                      attributes: config (the job's TOML text), parallax_version, created
//                          (ISO 8601, UTC), plus summary attributes from set_attr
//   /metrics/<name>/step   int64, one row per append, extendible (chunks of 256 rows)
//   /metrics/<name>/value  float64, the same rows
//   /<any>/<path>          fixed-size arrays from write_array (dumps: weights, Adam moments)
// Strings are variable-length UTF-8, so h5py returns them as str.
//
// Index
//   RunFile            creates the file (truncating), appends metric rows, sets attributes
//
// Errors from HDF5 become px::Error naming the path; HDF5's own error printing is silenced
// around every call (and restored after). Serial HDF5 is not thread-safe: one thread per file.
#pragma once
#include "core/shapes.h"

#include <memory>
#include <string>
#include <vector>

namespace px {

class RunFile {
public:
    RunFile(const std::string& path, const std::string& config_toml);  // creates or truncates
    ~RunFile();                                                        // flushes and closes
    RunFile(RunFile&&) noexcept;
    RunFile& operator=(RunFile&&) noexcept;
    RunFile(const RunFile&) = delete;
    RunFile& operator=(const RunFile&) = delete;

    // One row (step, value) of /metrics/<metric>; the group is created on first use.
    // Metric names are non-empty and contain no '/'.
    void append(const std::string& metric, i64 step, double value);
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
    std::unique_ptr<Impl> impl_;
};

}  // namespace px
