#include "core/io/output_paths.h"

#include "core/base/error.h"
#include "core/base/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <system_error>

namespace px {

namespace {

namespace fs = std::filesystem;

std::string quoted(const std::string& key, const std::string& path) {
    return key + " = \"" + path + "\"";
}

// Creates and removes a file in `folder`: the only test that sees a read-only file system and
// permissions alike, for any user.
void try_write(const std::string& folder, const std::string& key, const std::string& path) {
    // Unique among the ranks of a job, which may share the folder across hosts.
    const std::string probe =
        (fs::path(folder) / (".parallax-write-test-" + std::to_string(::getpid()) + "-" +
                             std::to_string(std::random_device{}())))
            .string();
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0) {
        const int err = errno;
        throw ConfigError(quoted(key, path) + ": cannot write in " + folder + " (" +
                          std::strerror(err) +
                          "); choose a folder this user can write on a writable file system");
    }
    ::close(fd);
    ::unlink(probe.c_str());
}

}  // namespace

namespace {

// `dir` must be a writable folder (created when missing); errors quote key = path.
void check_folder(const std::string& dir, const std::string& key, const std::string& path) {
    std::error_code ec;
    if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
        throw ConfigError(quoted(key, path) +
                          " is a file, not a folder; give a folder (it is "
                          "created when missing)");
    fs::create_directories(dir, ec);
    if (ec)
        throw ConfigError(quoted(key, path) + ": the folder cannot be created (" + ec.message() +
                          "); give a folder this user can create");
    try_write(dir, key, path);
}

}  // namespace

void check_output_folder(const std::string& path, const std::string& key) {
    check_folder(path.empty() ? "." : path, key, path);
}

void check_output_file(const std::string& path, const std::string& key) {
    std::error_code ec;
    if (fs::is_directory(path, ec))
        throw ConfigError(quoted(key, path) + " is a folder, not a file; give a file's path");
    // A FIFO or a device is replaced (a rename over it) or read back (a run file resumed) as if
    // it were a file: neither is what its owner meant.
    if (const FileKind k = file_kind(path); k != FileKind::regular && k != FileKind::missing)
        throw ConfigError(quoted(key, path) + " is " + file_kind_text(k) +
                          ", not a regular file; give the path of a file (it is created or "
                          "replaced)");
    const fs::path parent = fs::path(path).parent_path();
    check_folder(parent.empty() ? "." : parent.string(), key, path);
    if (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0) {
        const int err = errno;
        throw ConfigError(quoted(key, path) + ": the file cannot be replaced (" +
                          std::strerror(err) + "); remove it or choose another path");
    }
}

void check_run_outputs(const Config& cfg, const std::string& dump) {
    if (cfg.output.run_file) {
        check_output_folder(cfg.output.dir, "output.dir");
        check_output_file((fs::path(cfg.output.dir) / "run.h5").string(), "the run file");
    }
    if (!cfg.checkpoint.dir.empty()) check_output_folder(cfg.checkpoint.dir, "checkpoint.dir");
    if (!cfg.output.export_llmc.empty())
        check_output_file(cfg.output.export_llmc, "output.export_llmc");
    if (!dump.empty()) check_output_file(dump, "--dump");
}

FolderLock::FolderLock(const std::string& folder, const std::string& key) {
    const std::string path = (fs::path(folder.empty() ? "." : folder) / ".parallax-lock").string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) {
        const int err = errno;
        throw ConfigError(quoted(key, folder) + ": cannot create its lock file " + path + " (" +
                          std::strerror(err) + ")");
    }
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        char holder[32] = "";
        const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
        if (n > 0) holder[n] = 0;
        ::close(fd_);
        fd_ = -1;
        throw ConfigError(quoted(key, folder) + " is in use by another run" +
                          (holder[0] ? std::string(" (process ") + holder + ")" : std::string()) +
                          ", which holds " + path +
                          "; wait for it to end, or give this run another folder");
    }
    // The pid only names the holder in another run's message; the lock is what counts.
    const std::string pid = std::to_string(::getpid());
    if (::ftruncate(fd_, 0) == 0) {
        [[maybe_unused]] const ssize_t written = ::pwrite(fd_, pid.data(), pid.size(), 0);
    }
}

FolderLock::~FolderLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace px
