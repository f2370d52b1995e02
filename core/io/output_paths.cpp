#include "core/io/output_paths.h"

#include "core/base/error.h"
#include "core/base/files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
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

std::string run_file_path(const Config& cfg) {
    return (fs::path(cfg.output.dir) / "run.h5").string();
}

void check_run_outputs(const Config& cfg, const std::string& dump) {
    if (cfg.output.run_file) {
        check_output_folder(cfg.output.dir, "output.dir");
        check_output_file(run_file_path(cfg), "the run file");
    }
    if (!cfg.checkpoint.dir.empty()) check_output_folder(cfg.checkpoint.dir, "checkpoint.dir");
    if (!cfg.output.export_llmc.empty())
        check_output_file(cfg.output.export_llmc, "output.export_llmc");
    if (!dump.empty()) check_output_file(dump, "--dump");
}

namespace {

// Who holds a lock file, as its holder wrote it: "<pid> <host>" (pid 0: nothing readable).
struct Holder {
    long pid = 0;
    std::string host;
};

Holder read_holder(int fd) {
    char text[300] = "";
    const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
    if (n <= 0) return {};
    text[n] = 0;
    Holder h;
    char host[256] = "";
    if (std::sscanf(text, "%ld %255s", &h.pid, host) < 1) return {};
    h.host = host;
    return h;
}

std::string this_host() {
    char host[256] = "";
    if (::gethostname(host, sizeof host - 1) != 0) return "";
    return host;
}

// A holder that is known to be gone: a process of this host that no longer runs. A holder on
// another host (a folder shared across hosts) or one without a host cannot be judged from here.
bool gone(const Holder& h) {
    if (h.pid <= 0 || h.host.empty() || h.host != this_host()) return false;
    return ::kill(static_cast<pid_t>(h.pid), 0) != 0 && errno == ESRCH;
}

bool same_file(int fd, const std::string& path) {
    struct stat a{}, b{};
    return ::fstat(fd, &a) == 0 && ::stat(path.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

}  // namespace

FolderLock::FolderLock(const std::string& folder, const std::string& key,
                       const std::function<void(const std::string&)>& note) {
    path_ = (fs::path(folder.empty() ? "." : folder) / ".parallax-lock").string();
    const auto tell = [&](const std::string& s) {
        if (note) {
            note(s);
        } else {
            std::fprintf(stderr, "parallax: %s\n", s.c_str());
            std::fflush(stderr);
        }
    };
    // A few rounds: a run that releases or takes over the lock removes the file between our
    // open and our flock, and the lock then taken is on a file no other run will see.
    for (int round = 0; round < 20; round++) {
        fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd_ < 0) {
            const int err = errno;
            throw ConfigError(quoted(key, folder) + ": cannot create its lock file " + path_ +
                              " (" + std::strerror(err) + ")");
        }
        if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
            const Holder h = read_holder(fd_);
            if (gone(h) && same_file(fd_, path_)) {
                // The lock lives on in a process the dead holder forked (a data loader's worker,
                // say), which inherited it: the folder is free, so the file is replaced.
                ::unlink(path_.c_str());
                ::close(fd_);
                fd_ = -1;
                tell(quoted(key, folder) + ": taking over the lock " + path_ +
                     " of process " + std::to_string(h.pid) +
                     ", which no longer runs (a process it started still held the lock)");
                continue;
            }
            ::close(fd_);
            fd_ = -1;
            if (h.pid == ::getpid() && h.host == this_host())
                throw ConfigError(quoted(key, folder) +
                                  " is in use by another job of this process, which is still "
                                  "open; end that one first (in Python: its close(), finish() or "
                                  "run(), or the end of its `with` block), or give this job "
                                  "another folder");
            throw ConfigError(quoted(key, folder) + " is in use by another run" +
                              (h.pid > 0 ? " (process " + std::to_string(h.pid) +
                                               (h.host.empty() ? "" : " on " + h.host) + ")"
                                         : std::string()) +
                              ", which holds " + path_ +
                              "; wait for it to end, or give this run another folder");
        }
        if (!same_file(fd_, path_)) {  // removed by its last holder as we opened it
            ::close(fd_);
            fd_ = -1;
            continue;
        }
        // A holder recorded in a file nobody locks was killed before it could remove it.
        if (const Holder h = read_holder(fd_); gone(h) && h.pid != ::getpid())
            tell(quoted(key, folder) + ": taking over the lock " + path_ + " left by process " +
                 std::to_string(h.pid) + ", which no longer runs");
        // The holder only names itself in another run's message; the lock is what counts.
        const std::string me = std::to_string(::getpid()) + " " + this_host() + "\n";
        if (::ftruncate(fd_, 0) == 0) {
            [[maybe_unused]] const ssize_t written = ::pwrite(fd_, me.data(), me.size(), 0);
        }
        return;
    }
    throw ConfigError(quoted(key, folder) + ": its lock file " + path_ +
                      " keeps being replaced by other runs; give this run another folder");
}

FolderLock::~FolderLock() {
    if (fd_ < 0) return;
    // Removed while still locked: a run that opened it meanwhile sees it gone and opens anew.
    if (same_file(fd_, path_)) ::unlink(path_.c_str());
    ::close(fd_);  // releases the lock
}

}  // namespace px
