// A sharded safetensors checkpoint as one set (core/io/safetensors.h): the index's weight_map and
// the shards' own headers must agree tensor for tensor before anything is read.
#include "core/io/safetensors.h"

#include "core/base/error.h"
#include "core/base/files.h"
#include "core/io/safetensors_internal.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <unordered_set>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace px {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxIndexDepth = 64;

// The index's text; DataError naming it when it cannot be read or is absurdly large.
std::string read_index_text(const std::string& path) {
    const std::string prefix = "safetensors index " + path;
    const FileKind kind = file_kind(path);
    if (kind != FileKind::regular && kind != FileKind::missing)
        throw DataError(prefix + " is " + file_kind_text(kind) +
                        ", not a regular file; give a model.safetensors.index.json");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        throw DataError(prefix + ": cannot open it: " + std::strerror(errno) + "; check the path");
    struct stat sb {};
    if (::fstat(fd, &sb) != 0 || u64(sb.st_size) > st::kMaxHeaderBytes) {
        ::close(fd);
        throw DataError(prefix + " is " + std::to_string(sb.st_size) +
                        " bytes, larger than any index (" + std::to_string(st::kMaxHeaderBytes) +
                        "); is it an index?");
    }
    std::string text(size_t(sb.st_size), '\0');
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t r = ::pread(fd, text.data() + done, text.size() - done, off_t(done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        done += size_t(r);
    }
    ::close(fd);
    if (done != text.size()) throw DataError(prefix + ": cannot read it: " + std::strerror(errno));
    // nlohmann's parser takes a NUL for the end of its input; JSON text never holds one.
    if (text.find('\0') != std::string::npos)
        throw DataError(prefix + " holds a NUL byte; it is no JSON index: re-download it");
    return text;
}

// Parses JSON refusing duplicate keys at any depth (a weight_map naming a tensor twice would
// otherwise keep one silently).
nlohmann::json parse_strict(const std::string& path, const std::string& text) {
    std::vector<std::unordered_set<std::string>> keys;
    auto cb = [&](int depth, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
        using E = nlohmann::json::parse_event_t;
        if ((ev == E::object_start || ev == E::array_start) && depth > kMaxIndexDepth)
            throw DataError("safetensors index " + path + " nests deeper than " +
                            std::to_string(kMaxIndexDepth) + " levels; it is no index");
        if (ev == E::object_start) keys.emplace_back();
        if (ev == E::object_end) keys.pop_back();
        if (ev == E::key && !keys.back().insert(v.get<std::string>()).second)
            throw DataError("safetensors index " + path + " has the key " +
                            st::quoted(v.get<std::string>()) + " twice in one object" +
                            "; it is damaged: re-download it");
        return true;
    };
    try {
        return nlohmann::json::parse(text, cb);
    } catch (const nlohmann::json::exception& e) {
        std::string what = e.what();
        const size_t cut = what.find("] ");
        if (cut != std::string::npos) what = what.substr(cut + 2);
        throw DataError("safetensors index " + path + " is not valid JSON: " + what +
                        "; it is damaged: re-download it");
    }
}

bool plain_file_name(const std::string& s) {
    return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
           s.find('\\') == std::string::npos && s.find('\0') == std::string::npos;
}

}  // namespace

SafetensorsSet::SafetensorsSet(const std::string& path) : path_(path) {
    if (file_kind(path) == FileKind::folder) {
        const fs::path index = fs::path(path) / "model.safetensors.index.json";
        const fs::path single = fs::path(path) / "model.safetensors";
        if (file_kind(index.string()) != FileKind::missing)
            path_ = index.string();
        else if (file_kind(single.string()) != FileKind::missing)
            path_ = single.string();
        else
            throw DataError("safetensors folder " + path +
                            " holds neither model.safetensors.index.json nor model.safetensors; "
                            "give the index or the file itself");
    }
    if (path_.size() < 5 || path_.compare(path_.size() - 5, 5, ".json") != 0) {
        files_.emplace_back(path_);
        for (const SafetensorsEntry& e : files_[0].entries()) where_.emplace(e.name, 0);
        return;
    }

    const std::string prefix = "safetensors index " + path_;
    const nlohmann::json index = parse_strict(path_, read_index_text(path_));
    if (!index.is_object())
        throw DataError(prefix +
                        " is not a JSON object; an index is {\"metadata\": {...}, "
                        "\"weight_map\": {tensor: shard file}}");
    const auto wm = index.find("weight_map");
    if (wm == index.end() || !wm->is_object())
        throw DataError(prefix + " has no \"weight_map\" object (tensor name -> shard file); " +
                        "is it a safetensors index?");
    const auto md = index.find("metadata");
    if (md != index.end()) {
        if (!md->is_object()) throw DataError(prefix + " has a \"metadata\" that is not an object");
        const auto ts = md->find("total_size");
        if (ts != md->end() && ts->is_number_unsigned()) total_size_ = ts->get<u64>();
    }

    // The shards, in file-name order (model-00001-of-... first), each opened and checked.
    std::map<std::string, std::string> first_tensor;  // shard -> a tensor the index maps to it
    for (const auto& [tensor, file] : wm->items()) {
        if (!file.is_string())
            throw DataError(prefix + " maps tensor " + st::quoted(tensor) +
                            " to something that is not a file name");
        const std::string f = file.get<std::string>();
        if (!plain_file_name(f))
            throw DataError(prefix + " maps tensor " + st::quoted(tensor) + " to " + st::quoted(f) +
                            ", which is not a file beside the index; shards sit in the index's "
                            "folder");
        first_tensor.emplace(f, tensor);
    }
    const fs::path folder =
        fs::path(path_).has_parent_path() ? fs::path(path_).parent_path() : fs::path(".");
    std::map<std::string, size_t> shard_at;
    for (const auto& [f, tensor] : first_tensor) {
        const std::string shard = (folder / f).string();
        if (file_kind(shard) == FileKind::missing)
            throw DataError(prefix + " maps tensor " + st::quoted(tensor) + " to shard " + shard +
                            ", which does not exist; the set is incomplete: fetch the missing "
                            "shard");
        shard_at.emplace(f, files_.size());
        files_.emplace_back(shard);
    }

    // The index and the shards agree: every listed tensor in its shard, every shard tensor
    // listed there and nowhere else.
    for (const auto& [tensor, file] : wm->items()) {
        const size_t at = shard_at.at(file.get<std::string>());
        if (!files_[at].has(tensor))
            throw DataError(prefix + " maps tensor " + st::quoted(tensor) + " to shard " +
                            files_[at].path() + ", which has no such tensor; the index and its " +
                            "shards disagree: re-download the set");
        where_.emplace(tensor, at);
    }
    for (size_t s = 0; s < files_.size(); s++)
        for (const SafetensorsEntry& e : files_[s].entries()) {
            const auto it = where_.find(e.name);
            if (it == where_.end())
                throw DataError("safetensors shard " + files_[s].path() + " holds tensor " +
                                st::quoted(e.name) + ", which its index " + path_ +
                                " does not list; the index and its shards disagree: "
                                "re-download the set");
            if (it->second != s)
                throw DataError("tensor " + st::quoted(e.name) + " is in two shards, " +
                                files_[s].path() + " and " + files_[it->second].path() +
                                " (the index " + path_ + " names the second); a tensor belongs " +
                                "to one shard: re-download the set");
        }
}

std::vector<std::string> SafetensorsSet::names() const {
    std::vector<std::string> out;
    for (const SafetensorsFile& f : files_)
        for (const SafetensorsEntry& e : f.entries()) out.push_back(e.name);
    return out;
}

bool SafetensorsSet::has(const std::string& name) const {
    return where_.count(name) != 0;
}

const SafetensorsFile& SafetensorsSet::file_of(const std::string& name) const {
    const auto it = where_.find(name);
    if (it == where_.end())
        throw DataError("safetensors set " + path_ + " has no tensor " + st::quoted(name) +
                        " (it holds " + std::to_string(where_.size()) + "); check the name");
    return files_[it->second];
}

const SafetensorsEntry& SafetensorsSet::entry(const std::string& name) const {
    return file_of(name).entry(name);
}

void SafetensorsSet::read_raw(const std::string& name, void* dst, u64 dst_bytes) const {
    file_of(name).read_raw(name, dst, dst_bytes);
}

void SafetensorsSet::read_f32(const std::string& name, float* dst, i64 n) const {
    file_of(name).read_f32(name, dst, n);
}

}  // namespace px
