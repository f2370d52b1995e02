// The safetensors writer (core/io/safetensors.h): one file byte for byte as HF's safetensors 0.8.0
// serializes it, and transformers-style shards with their index.
#include "core/io/safetensors.h"

#include "core/base/error.h"
#include "core/io/safetensors_internal.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_set>
#include <utility>

#include <fcntl.h>
#include <unistd.h>

namespace px {

namespace fs = std::filesystem;

namespace st {

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)) {
    const fs::path p(path_);
    const fs::path folder = p.has_parent_path() ? p.parent_path() : fs::path(".");
    temp_ =
        (folder / ("." + p.filename().string() + ".tmp-" + std::to_string(::getpid()))).string();
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) fail("cannot create " + temp_);
}

AtomicFile::~AtomicFile() {
    if (fd_ >= 0) {
        ::close(fd_);
        ::unlink(temp_.c_str());
    }
}

void AtomicFile::fail(const std::string& step) {
    const std::string err = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    ::unlink(temp_.c_str());
    throw StorageError(what_ + " " + path_ + ": " + step + ": " + err +
                       "; nothing was written in its place (a file already there is untouched): "
                       "free space there or choose another folder");
}

void AtomicFile::write(const void* data, u64 bytes) {
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
        const ssize_t n = ::write(fd_, p, size_t(std::min<u64>(bytes, u64(1) << 30)));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) fail("write failed");
        p += n;
        bytes -= u64(n);
    }
}

void AtomicFile::commit() {
    if (::fsync(fd_) != 0) fail("fsync failed");
    if (::close(std::exchange(fd_, -1)) != 0) fail("close failed");
    if (std::rename(temp_.c_str(), path_.c_str()) != 0) {
        const std::string err = std::strerror(errno);
        ::unlink(temp_.c_str());
        throw StorageError(what_ + " " + path_ + ": cannot rename " + temp_ + " to it: " + err +
                           "; nothing was written in its place");
    }
    // Make the rename itself durable; best effort, as some file systems refuse.
    const fs::path p(path_);
    const std::string folder = p.has_parent_path() ? p.parent_path().string() : ".";
    const int dfd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

}  // namespace st

namespace {

using u128 = unsigned __int128;

// RFC 3629 UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF (what a JSON reader
// accepts, and what a Rust String holds).
bool valid_utf8(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        int more = 0;
        unsigned lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            more = 1;
        } else if (c >= 0xE0 && c <= 0xEF) {
            more = 2;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            more = 3;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return false;
        }
        if (i + size_t(more) >= s.size()) return false;  // cut short
        for (int k = 1; k <= more; k++) {
            const unsigned char d = static_cast<unsigned char>(s[i + size_t(k)]);
            if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) return false;
        }
        i += size_t(more) + 1;
    }
    return true;
}

// A JSON string as serde_json writes it (the reference library's header writer).
void put_string(std::string& out, std::string_view s) {
    out += '"';
    for (const char ch : s) {
        const unsigned char c = static_cast<unsigned char>(ch);
        switch (c) {
            case '"':
                out += "\\\"";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\b':
                out += "\\b";
                break;
            case '\f':
                out += "\\f";
                break;
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += ch;
                }
        }
    }
    out += '"';
}

// Refuses what the reader would refuse, naming the tensor.
void check_input(const std::string& path, const std::vector<SafetensorsData>& tensors,
                 const std::optional<SafetensorsMetadata>& metadata) {
    const std::string prefix = "not writing safetensors file " + path + ": ";
    std::unordered_set<std::string> names;
    for (const SafetensorsData& t : tensors) {
        const std::string me = prefix + "tensor " + st::quoted(t.name);
        if (!valid_utf8(t.name)) throw Error(me + " has a name that is not valid UTF-8");
        if (t.name == "__metadata__")
            throw Error(me + ": the name is reserved for the header's metadata");
        if (!names.insert(t.name).second) throw Error(me + " is given twice");
        u128 n = 1;
        bool huge = false;
        for (i64 d : t.shape) {
            if (d < 0) throw Error(me + " has a negative dimension in " + st::shape_text(t.shape));
            n *= u128(d);
            if (n > (u128(1) << 64)) huge = true, n = u128(1) << 64;
        }
        if (std::find(t.shape.begin(), t.shape.end(), i64(0)) != t.shape.end()) n = 0, huge = false;
        const u128 bits = n * u128(safe_dtype_bits(t.dtype));
        if (huge || bits % 8 != 0 || bits / 8 != u128(t.bytes))
            throw Error(
                me + " has shape " + st::shape_text(t.shape) + " of " + safe_dtype_name(t.dtype) +
                " but " + std::to_string(t.bytes) + " bytes of data" +
                (!huge && bits % 8 != 0 ? " (its elements fill no whole number of bytes)" : ""));
        if (t.bytes > 0 && t.data == nullptr) throw Error(me + " has no data");
    }
    if (!metadata) return;
    std::unordered_set<std::string> keys;
    for (const auto& [k, v] : *metadata) {
        if (!valid_utf8(k) || !valid_utf8(v))
            throw Error(prefix + "metadata key " + st::quoted(k) + " or its value is not UTF-8");
        if (!keys.insert(k).second)
            throw Error(prefix + "metadata key " + st::quoted(k) + " is given twice");
    }
}

// The tensors' positions in file order.
std::vector<size_t> file_order(const std::vector<SafetensorsData>& tensors, SafetensorsOrder o) {
    std::vector<size_t> order(tensors.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = i;
    if (o == SafetensorsOrder::hf)
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
            const SafetensorsData &x = tensors[a], &y = tensors[b];
            if (x.dtype != y.dtype) return x.dtype > y.dtype;
            return x.name < y.name;  // bytewise, as Rust compares strings
        });
    return order;
}

// The length prefix and the padded JSON, for tensors in the given order.
std::string header_bytes(const std::vector<SafetensorsData>& tensors,
                         const std::vector<size_t>& order,
                         const std::optional<SafetensorsMetadata>& metadata) {
    std::string j = "{";
    if (metadata) {
        j += "\"__metadata__\":{";
        for (size_t i = 0; i < metadata->size(); i++) {
            if (i) j += ',';
            put_string(j, (*metadata)[i].first);
            j += ':';
            put_string(j, (*metadata)[i].second);
        }
        j += '}';
    }
    u64 at = 0;
    for (size_t i : order) {
        const SafetensorsData& t = tensors[i];
        if (j.size() > 1) j += ',';
        put_string(j, t.name);
        j += ":{\"dtype\":\"";
        j += safe_dtype_name(t.dtype);
        j += "\",\"shape\":[";
        for (size_t k = 0; k < t.shape.size(); k++)
            j.append(k ? "," : "").append(std::to_string(t.shape[k]));
        j +=
            "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + t.bytes) + "]}";
        at += t.bytes;
    }
    j += '}';
    j.append((8 - j.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
    const u64 n = j.size();
    std::string out(8, '\0');
    std::memcpy(out.data(), &n, 8);  // little-endian (static_assert in safetensors.cpp)
    return out + j;
}

// <prefix>-<digits>-of-<digits>.safetensors: a shard name of any set with this prefix.
bool shard_name(const std::string& name, const std::string& prefix) {
    const std::string ext = ".safetensors";
    if (name.size() <= prefix.size() + 1 + ext.size() ||
        name.compare(0, prefix.size(), prefix) != 0 || name[prefix.size()] != '-' ||
        name.compare(name.size() - ext.size(), ext.size(), ext) != 0)
        return false;
    const std::string mid = name.substr(
        prefix.size() + 1, name.size() - prefix.size() - 1 - ext.size());  // NNNNN-of-MMMMM
    const size_t of = mid.find("-of-");
    auto digits = [](const std::string& s) {
        return !s.empty() &&
               std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    return of != std::string::npos && digits(mid.substr(0, of)) && digits(mid.substr(of + 4));
}

// What an earlier write of this prefix left that the new set does not hold: its shards, its
// index, or its single file. Left there, a reader of the folder could load the old weights
// (transformers removes the stale shards too).
void remove_stale(const fs::path& dir, const std::string& prefix, const SafetensorsShards& now) {
    std::vector<std::string> keep;  // file names
    for (const std::string& f : now.files) keep.push_back(fs::path(f).filename().string());
    if (!now.index.empty()) keep.push_back(fs::path(now.index).filename().string());
    const std::string index = prefix + ".safetensors.index.json", single = prefix + ".safetensors";
    std::vector<fs::path> stale;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
        const std::string name = e.path().filename().string();
        if (!e.is_regular_file(ec) || std::find(keep.begin(), keep.end(), name) != keep.end())
            continue;
        if (name == index || name == single || shard_name(name, prefix)) stale.push_back(e.path());
    }
    for (const fs::path& p : stale) fs::remove(p, ec);  // best effort: the new set is whole
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsData>& tensors,
                       const std::optional<SafetensorsMetadata>& metadata, SafetensorsOrder order) {
    check_input(path, tensors, metadata);
    const std::vector<size_t> o = file_order(tensors, order);
    const std::string head = header_bytes(tensors, o, metadata);
    if (head.size() - 8 > st::kMaxHeaderBytes)
        throw Error("not writing safetensors file " + path + ": its header would be " +
                    std::to_string(head.size() - 8) + " bytes, more than readers accept (" +
                    std::to_string(st::kMaxHeaderBytes) + "); write shards");
    st::AtomicFile f(path, "cannot write safetensors file");
    f.write(head.data(), head.size());
    for (size_t i : o) f.write(tensors[i].data, tensors[i].bytes);
    f.commit();
}

SafetensorsShards write_safetensors_shards(const std::string& folder,
                                           const std::vector<SafetensorsData>& tensors,
                                           u64 max_shard_bytes,
                                           const std::optional<SafetensorsMetadata>& metadata,
                                           const std::string& prefix) {
    const fs::path dir(folder.empty() ? "." : folder);
    if (max_shard_bytes == 0)
        throw Error("not writing safetensors shards in " + dir.string() +
                    ": the largest shard size is 0 bytes; give a positive size");
    if (prefix.empty() || prefix.find('/') != std::string::npos)
        throw Error("not writing safetensors shards in " + dir.string() + ": the file prefix " +
                    st::quoted(prefix) + " must be a plain file name such as \"model\"");
    check_input((dir / (prefix + ".safetensors")).string(), tensors, metadata);
    // Greedy in the given order; a tensor larger than a shard gets one of its own, placed before
    // the shard being filled (huggingface_hub's split_state_dict_into_shards).
    std::vector<std::vector<size_t>> shards;
    std::vector<size_t> current;
    u64 current_bytes = 0, total = 0;
    for (size_t i = 0; i < tensors.size(); i++) {
        const u64 b = tensors[i].bytes;
        total += b;
        if (b > max_shard_bytes) {
            shards.push_back({i});
            continue;
        }
        if (current_bytes + b > max_shard_bytes) {
            shards.push_back(std::move(current));
            current.clear();
            current_bytes = 0;
        }
        current.push_back(i);
        current_bytes += b;
    }
    if (!current.empty() || shards.empty()) shards.push_back(std::move(current));

    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
        throw StorageError("cannot write safetensors shards in " + dir.string() +
                           ": cannot create the folder: " + ec.message());
    SafetensorsShards out;
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); s++) {
        std::string name = prefix + ".safetensors";
        if (shards.size() > 1) {
            char suffix[64];
            std::snprintf(suffix, sizeof suffix, "-%05zu-of-%05zu", s + 1, shards.size());
            name = prefix + suffix + ".safetensors";
        }
        std::vector<SafetensorsData> part;
        for (size_t i : shards[s]) {
            part.push_back(tensors[i]);
            weight_map[tensors[i].name] = name;
        }
        out.files.push_back((dir / name).string());
        write_safetensors(out.files.back(), part, metadata, SafetensorsOrder::hf);
    }
    if (shards.size() > 1) {
        // Python's json.dumps(index, indent=2, sort_keys=True) + "\n": nlohmann's objects are
        // sorted by bytes, which for UTF-8 is Python's code point order; ensure_ascii as Python.
        nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
        const std::string text = index.dump(2, ' ', true) + "\n";
        out.index = (dir / (prefix + ".safetensors.index.json")).string();
        st::AtomicFile f(out.index, "cannot write safetensors index");
        f.write(text.data(), text.size());
        f.commit();
    }
    remove_stale(dir, prefix, out);
    return out;
}

}  // namespace px
