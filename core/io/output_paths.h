// Where a run will write, checked before its first step: a path that cannot be written is bad
// input, found while nothing has been computed yet (not after the last step), and named by the
// key or option that gave it.
//
// Index
//   check_output_folder  a folder a run writes into: created if missing, must be a writable folder
//   check_output_file    a file a run writes: not a folder, and its folder writable
//   check_run_outputs    every output of a training config (run file, checkpoints, llm.c export)
#pragma once
#include "core/base/config.h"

#include <string>

namespace px {

// ConfigError naming `key` ("output.dir", "--dump", ...) and what to do when `path` is a file,
// cannot be created, or cannot be written (a read-only folder or file system: a file is
// created there and removed, which also holds for root).
void check_output_folder(const std::string& path, const std::string& key);
void check_output_file(const std::string& path, const std::string& key);

// output.dir (when the run file is on), checkpoint.dir (when set), output.export_llmc (when
// set) and `dump` (when not empty).
void check_run_outputs(const Config& cfg, const std::string& dump = "");

}  // namespace px
