// A folder of checkpoints (core/io/checkpoint.h): their names, retention of the last K, and which
// one a resume starts from.
#include "core/io/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <unistd.h>

namespace px {

namespace fs = std::filesystem;

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
