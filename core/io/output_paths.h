// Where a run will write, checked before its first step: a path that cannot be written is bad
// input, found while nothing has been computed yet (not after the last step), and named by the
// key or option that gave it.
//
// Index
//   run_file_path        where a training run's run file is: <output.dir>/run.h5
//   check_output_folder  a folder a run writes into: created if missing, must be a writable folder
//   check_output_file    a file a run writes: not a folder, and its folder writable
//   check_run_outputs    every output of a training config (run file, checkpoints, llm.c export)
//   FolderLock           one run at a time in an output folder (an advisory lock, held until the
//                        run ends; a dead holder's is taken over)
#pragma once
#include "core/base/config.h"

#include <functional>
#include <string>

namespace px {

// <output.dir>/run.h5: the one place the run file's name is composed.
std::string run_file_path(const Config& cfg);

// ConfigError naming `key` ("output.dir", "--dump", ...) and what to do when `path` is a file,
// cannot be created, or cannot be written (a read-only folder or file system: a file is
// created there and removed, which also holds for root).
void check_output_folder(const std::string& path, const std::string& key);
void check_output_file(const std::string& path, const std::string& key);

// output.dir (when the run file is on), checkpoint.dir (when set), output.export_llmc (when
// set) and `dump` (when not empty).
void check_run_outputs(const Config& cfg, const std::string& dump = "");

// An exclusive advisory lock (flock) on <folder>/.parallax-lock for as long as it lives, so that a
// second run started into the folder of a running one stops with a ConfigError naming the
// folder and the process that holds it, instead of writing over its run file and checkpoints.
// The file records "<pid> <host>" of its holder and is removed when the lock is released.
// A lock left by a process of this host that no longer runs is taken over, and `note` is told
// so in a sentence (stderr by default): the process was killed before it removed its file, or a
// child it forked still holds the lock it inherited. The lock goes with the process, also when
// it is killed. A second lock of the same folder in one process is refused with its own sentence
// (an earlier job of the process, a notebook's, still holds it).
class FolderLock {
public:
    FolderLock(const std::string& folder, const std::string& key,
               const std::function<void(const std::string&)>& note = {});
    ~FolderLock();  // releases: removes the file, then unlocks
    FolderLock(const FolderLock&) = delete;
    FolderLock& operator=(const FolderLock&) = delete;

private:
    std::string path_;
    int fd_ = -1;
};

}  // namespace px
