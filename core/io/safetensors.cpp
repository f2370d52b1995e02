// safetensors dtypes and the reader (core/io/safetensors.h): the header is parsed by a SAX
// handler that builds the entries as it goes, so a duplicate key, a wrong type or an unknown
// dtype is refused at the byte where it is, and no JSON tree of a 100 MB header is ever built.
#include "core/io/safetensors.h"

#include "core/base/error.h"
#include "core/base/files.h"
#include "core/io/safetensors_internal.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <unordered_set>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace px {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

struct DTypeInfo {
    SafeDType t;
    const char* name;
    int bits;
};
constexpr std::array<DTypeInfo, kNumSafeDTypes> kDTypes = {{
    {SafeDType::BOOL, "BOOL", 8},
    {SafeDType::F4, "F4", 4},
    {SafeDType::F6_E2M3, "F6_E2M3", 6},
    {SafeDType::F6_E3M2, "F6_E3M2", 6},
    {SafeDType::U8, "U8", 8},
    {SafeDType::I8, "I8", 8},
    {SafeDType::F8_E5M2, "F8_E5M2", 8},
    {SafeDType::F8_E4M3, "F8_E4M3", 8},
    {SafeDType::F8_E8M0, "F8_E8M0", 8},
    {SafeDType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {SafeDType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8},
    {SafeDType::I16, "I16", 16},
    {SafeDType::U16, "U16", 16},
    {SafeDType::F16, "F16", 16},
    {SafeDType::BF16, "BF16", 16},
    {SafeDType::I32, "I32", 32},
    {SafeDType::U32, "U32", 32},
    {SafeDType::F32, "F32", 32},
    {SafeDType::C64, "C64", 64},
    {SafeDType::F64, "F64", 64},
    {SafeDType::I64, "I64", 64},
    {SafeDType::U64, "U64", 64},
}};
constexpr bool table_in_enum_order() {
    for (int i = 0; i < kNumSafeDTypes; i++)
        if (static_cast<int>(kDTypes[size_t(i)].t) != i) return false;
    return static_cast<int>(SafeDType::U64) == kNumSafeDTypes - 1;
}
static_assert(table_in_enum_order(), "kDTypes lists every SafeDType, in the enum's order");

std::string known_dtypes() {
    std::string s;
    for (const DTypeInfo& d : kDTypes) s.append(s.empty() ? "" : ", ").append(d.name);
    return s;
}

using u128 = unsigned __int128;
constexpr u64 kMaxRank = 1024;  // no real tensor comes near; bounds a hostile shape's array
constexpr int kMaxSkipDepth = 64;

// Builds the entries and metadata from the header's JSON events (nlohmann's SAX interface).
// Throws DataError at the first thing that breaks the format.
class HeaderParser {
public:
    using json = nlohmann::json;
    HeaderParser(const std::string& path, u64 data_bytes) : path_(path), data_bytes_(data_bytes) {}

    std::vector<SafetensorsEntry> entries;
    std::optional<SafetensorsMetadata> metadata;

    bool null() { return scalar("null"); }
    bool boolean(bool) { return scalar("a boolean"); }
    bool number_integer(json::number_integer_t v) {
        if (ctx_ == Ctx::shape || ctx_ == Ctx::offsets)
            bad_entry("has a negative number (" + std::to_string(v) + ") in " + field_name());
        return scalar("a number");
    }
    bool number_unsigned(json::number_unsigned_t v) {
        if (ctx_ == Ctx::shape) {
            if (cur_.shape.size() >= kMaxRank)
                bad_entry("has a shape of more than " + std::to_string(kMaxRank) + " dimensions");
            if (v > u64(std::numeric_limits<i64>::max()))
                bad_entry("has a dimension of " + std::to_string(v) + ", beyond any file");
            cur_.shape.push_back(i64(v));
            return true;
        }
        if (ctx_ == Ctx::offsets) {
            if (offsets_seen_ >= 2) bad_entry("has more than 2 numbers in its data_offsets");
            (offsets_seen_++ == 0 ? cur_.begin : cur_.end) = v;
            return true;
        }
        return scalar("a number");
    }
    bool number_float(json::number_float_t, const std::string& text) {
        if (ctx_ == Ctx::shape || ctx_ == Ctx::offsets)
            bad_entry("has " + text + " in " + field_name() +
                      ", not an integer from 0 to 2^64 - 1");
        return scalar("a number");
    }
    bool string(std::string& s) {
        if (ctx_ == Ctx::metadata) {
            metadata->emplace_back(std::move(key_), std::move(s));
            return true;
        }
        if (ctx_ == Ctx::entry && field_ == Field::dtype) {
            const std::optional<SafeDType> t = safe_dtype_from_name(s);
            if (!t)
                bad_entry("has dtype \"" + s +
                          "\", which is no safetensors dtype (known: " + known_dtypes() + ")");
            cur_.dtype = *t;
            return true;
        }
        return scalar("a string");
    }
    bool binary(json::binary_t&) { return scalar("binary data"); }

    bool start_object(std::size_t) {
        switch (ctx_) {
            case Ctx::start:
                ctx_ = Ctx::top;
                return true;
            case Ctx::top:
                if (key_ == "__metadata__") {
                    metadata.emplace();
                    ctx_ = Ctx::metadata;
                } else {
                    cur_ = SafetensorsEntry{};
                    cur_.name = std::move(key_);
                    fields_seen_.clear();
                    have_ = {};
                    ctx_ = Ctx::entry;
                }
                return true;
            case Ctx::metadata:
                bad_metadata("holds an object; its values must be strings");
            default:
                return container();
        }
    }
    bool start_array(std::size_t) {
        if (ctx_ == Ctx::entry && field_ == Field::shape) {
            ctx_ = Ctx::shape;
            return true;
        }
        if (ctx_ == Ctx::entry && field_ == Field::offsets) {
            ctx_ = Ctx::offsets;
            offsets_seen_ = 0;
            return true;
        }
        if (ctx_ == Ctx::metadata) bad_metadata("holds an array; its values must be strings");
        return container();
    }
    bool key(std::string& k) {
        if (ctx_ == Ctx::top) {
            if (!top_keys_.insert(k).second)
                bad(k == "__metadata__" ? std::string("has two \"__metadata__\" objects")
                                        : "names tensor " + st::quoted(k) + " twice");
        } else if (ctx_ == Ctx::metadata) {
            for (const auto& [have, value] : *metadata)
                if (have == k) bad_metadata("has the key " + st::quoted(k) + " twice");
        } else if (ctx_ == Ctx::entry) {
            if (std::find(fields_seen_.begin(), fields_seen_.end(), k) != fields_seen_.end())
                bad_entry("has the key \"" + k + "\" twice");
            fields_seen_.push_back(k);
            field_ = k == "dtype"          ? Field::dtype
                     : k == "shape"        ? Field::shape
                     : k == "data_offsets" ? Field::offsets
                                           : Field::other;  // ignored, as the reference does
            if (field_ != Field::other) have_[size_t(field_)] = true;
        }
        key_ = std::move(k);
        return true;
    }
    bool end_object() {
        if (ctx_ == Ctx::skip) return end_container();
        if (ctx_ == Ctx::metadata) {
            ctx_ = Ctx::top;
        } else if (ctx_ == Ctx::entry) {
            finish_entry();
            ctx_ = Ctx::top;
        } else if (ctx_ == Ctx::top) {
            ctx_ = Ctx::done;
        }
        return true;
    }
    bool end_array() {
        if (ctx_ == Ctx::skip) return end_container();
        if (ctx_ == Ctx::offsets && offsets_seen_ != 2)
            bad_entry("has " + std::to_string(offsets_seen_) +
                      " number(s) in its data_offsets; they must be [begin, end]");
        ctx_ = Ctx::entry;  // from shape or offsets
        return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
        std::string what = e.what();
        const size_t cut = what.find("] ");  // drop nlohmann's "[json.exception.parse_error.101]"
        if (cut != std::string::npos) what = what.substr(cut + 2);
        bad("has a header that is not valid JSON: " + what);
    }

    [[noreturn]] void bad(const std::string& what) const {
        throw DataError("safetensors file " + path_ + " " + what +
                        "; the file is damaged or not a safetensors file: re-download or "
                        "re-export it");
    }

private:
    enum class Ctx { start, top, metadata, entry, shape, offsets, skip, done };
    enum class Field { dtype, shape, offsets, other };

    std::string field_name() const { return ctx_ == Ctx::shape ? "its shape" : "its data_offsets"; }
    [[noreturn]] void bad_entry(const std::string& what) const {
        bad("tensor " + st::quoted(cur_.name) + " " + what);
    }
    [[noreturn]] void bad_metadata(const std::string& what) const {
        bad("has a \"__metadata__\" that " + what);
    }
    // A value where the format has none: only an unknown key of an entry may hold anything.
    bool scalar(const char* what) {
        if (ctx_ == Ctx::skip) return true;
        if (ctx_ == Ctx::entry && field_ == Field::other) return true;
        if (ctx_ == Ctx::start)
            bad("has a header that is " + std::string(what) + ", not an object");
        if (ctx_ == Ctx::top)
            bad(key_ == "__metadata__"
                    ? "has a \"__metadata__\" that is " + std::string(what) + ", not an object"
                    : "has tensor " + st::quoted(key_) + " as " + what +
                          ", not an object with dtype, shape and data_offsets");
        if (ctx_ == Ctx::metadata)
            bad_metadata("maps " + st::quoted(key_) + " to " + what +
                         "; its values must be strings");
        if (ctx_ == Ctx::entry)
            bad_entry("has " + std::string(field_ == Field::dtype ? "a dtype" : "a " + key_) +
                      " that is " + what);
        bad_entry("has " + std::string(what) + " in " + field_name() + ", not an integer");
    }
    bool container() {
        if (ctx_ == Ctx::entry && field_ == Field::other) {
            ctx_ = Ctx::skip;
            skip_depth_ = 1;
            return true;
        }
        if (ctx_ == Ctx::skip) {
            if (++skip_depth_ > kMaxSkipDepth) bad_entry("nests deeper than any header does");
            return true;
        }
        if (ctx_ == Ctx::start) bad("has a header that is an array, not an object");
        if (ctx_ == Ctx::top)
            bad("has tensor " + st::quoted(key_) +
                " as an array, not an object with dtype, shape and data_offsets");
        if (ctx_ == Ctx::entry)
            bad_entry("has a " + key_ + " that is an object or array of the wrong kind");
        bad_entry("has an object or array in " + field_name() + ", not an integer");
    }
    bool end_container() {
        if (--skip_depth_ == 0) ctx_ = Ctx::entry;
        return true;
    }
    void finish_entry() {
        const char* names[] = {"dtype", "shape", "data_offsets"};
        for (size_t i = 0; i < 3; i++)
            if (!have_[i])
                bad_entry("has no \"" + std::string(names[i]) +
                          "\"; every tensor has dtype, shape and data_offsets");
        SafetensorsEntry& e = cur_;
        const std::string span =
            "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
        if (e.end < e.begin) bad_entry("has " + span + " that end before they begin");
        // Elements x bits in 128 bits: a product past 2^64 elements cannot match any file.
        u128 n = 1;
        bool huge = false;
        for (i64 d : e.shape) {
            n *= u128(d);
            if (n > (u128(1) << 64)) huge = true, n = u128(1) << 64;
        }
        if (std::find(e.shape.begin(), e.shape.end(), i64(0)) != e.shape.end()) n = 0, huge = false;
        const u128 bits = n * u128(safe_dtype_bits(e.dtype));
        if (!huge && bits % 8 != 0)
            bad_entry("has " + std::to_string(u64(n)) + " elements of " + safe_dtype_name(e.dtype) +
                      ", which is not a whole number of bytes");
        if (huge || bits / 8 != u128(e.end - e.begin))
            bad_entry("has shape " + st::shape_text(e.shape) + " of " + safe_dtype_name(e.dtype) +
                      (huge ? std::string(", more bytes than any file,")
                            : ", " + std::to_string(u64(bits / 8)) + " bytes,") +
                      " but " + span + " span " + std::to_string(e.end - e.begin) + " bytes");
        if (e.end > data_bytes_)
            bad_entry("has " + span + " past the end of the data (" + std::to_string(data_bytes_) +
                      " bytes after the header): is it truncated?");
        entries.push_back(std::move(cur_));
    }

    const std::string& path_;
    u64 data_bytes_;
    Ctx ctx_ = Ctx::start;
    Field field_ = Field::other;
    std::string key_;
    std::unordered_set<std::string> top_keys_;
    SafetensorsEntry cur_;
    std::vector<std::string> fields_seen_;
    std::array<bool, 3> have_{};
    int offsets_seen_ = 0;
    int skip_depth_ = 0;
};

std::string describe_names(const std::vector<SafetensorsEntry>& es) {
    if (es.empty()) return "it holds no tensors";
    std::string s = "it holds " + std::to_string(es.size()) + " (";
    for (size_t i = 0; i < es.size() && i < 5; i++)
        s.append(i ? ", " : "").append(st::quoted(es[i].name));
    return s.append(es.size() > 5 ? ", ...)" : ")");
}

}  // namespace

// ---- dtypes ----

const char* safe_dtype_name(SafeDType t) {
    return kDTypes[size_t(t)].name;
}
std::optional<SafeDType> safe_dtype_from_name(std::string_view s) {
    for (const DTypeInfo& d : kDTypes)
        if (s == d.name) return d.t;
    return std::nullopt;
}
int safe_dtype_bits(SafeDType t) {
    return kDTypes[size_t(t)].bits;
}
SafeDType safe_dtype_of(DType t) {
    switch (t) {
        case DType::f32:
            return SafeDType::F32;
        case DType::bf16:
            return SafeDType::BF16;
        case DType::f16:
            return SafeDType::F16;
        case DType::e4m3:
            return SafeDType::F8_E4M3;  // OCP e4m3 is torch's float8_e4m3fn
        case DType::e5m2:
            return SafeDType::F8_E5M2;
    }
    PX_ASSERT(false, "unknown DType");
    return SafeDType::F32;
}
std::optional<DType> px_dtype_of(SafeDType t) {
    switch (t) {
        case SafeDType::F32:
            return DType::f32;
        case SafeDType::BF16:
            return DType::bf16;
        case SafeDType::F16:
            return DType::f16;
        case SafeDType::F8_E4M3:
            return DType::e4m3;
        case SafeDType::F8_E5M2:
            return DType::e5m2;
        default:
            return std::nullopt;
    }
}

namespace st {

std::string quoted(std::string_view name) {
    std::string s = "'";
    for (unsigned char c : name) {
        if (c < 0x20 || c == 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            s += buf;
        } else {
            s += char(c);
        }
    }
    return s + "'";
}

std::string shape_text(const std::vector<i64>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++)
        s.append(i ? ", " : "").append(std::to_string(shape[i]));
    return s + "]";
}

}  // namespace st

i64 SafetensorsEntry::numel() const {
    if (std::find(shape.begin(), shape.end(), i64(0)) != shape.end()) return 0;
    i64 n = 1;
    for (i64 d : shape) n *= d;  // no zero: checked against the file's size when it was read
    return n;
}

// ---- the reader ----

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
    const std::string prefix = "safetensors file " + path;
    const FileKind kind = file_kind(path);
    if (kind != FileKind::regular && kind != FileKind::missing)
        throw DataError(prefix + " is " + file_kind_text(kind) +
                        ", not a regular file; give a .safetensors file");
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0)
        throw DataError(prefix + ": cannot open it: " + std::strerror(errno) + "; check the path");
    try {
        struct stat sb {};
        if (::fstat(fd_, &sb) != 0 || !S_ISREG(sb.st_mode))
            throw DataError(prefix + ": not a readable regular file");
        file_bytes_ = u64(sb.st_size);
        HeaderParser p(path_, 0);  // for its messages
        unsigned char len[8] = {};
        if (file_bytes_ < 8 || ::pread(fd_, len, 8, 0) != 8)
            p.bad("is " + std::to_string(file_bytes_) +
                  " bytes, shorter than the 8-byte header length that starts every safetensors "
                  "file");
        u64 n = 0;
        std::memcpy(&n, len, 8);
        if (n > st::kMaxHeaderBytes)
            p.bad("claims a header of " + std::to_string(n) + " bytes, more than the " +
                  std::to_string(st::kMaxHeaderBytes) + " any safetensors reader accepts (the " +
                  "file has " + std::to_string(file_bytes_) + ")");
        if (n > file_bytes_ - 8)
            p.bad("claims a header of " + std::to_string(n) + " bytes but has only " +
                  std::to_string(file_bytes_ - 8) + " after the length: is it truncated?");
        header_bytes_ = n;
        std::string text(size_t(n), '\0');
        for (u64 done = 0; done < n;) {
            const ssize_t r = ::pread(fd_, text.data() + done, size_t(n - done), off_t(8 + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0)
                throw DataError(prefix + ": cannot read its header: " +
                                (r < 0 ? std::strerror(errno) : "unexpected end of file"));
            done += u64(r);
        }
        if (text.empty() || text[0] != '{')
            p.bad(
                "has a header that does not start with '{' (a JSON object), as the format "
                "requires");
        // nlohmann's parser takes a NUL for the end of its input; JSON text never holds one.
        const size_t nul = text.find('\0');
        if (nul != std::string::npos)
            p.bad("has a NUL byte at byte " + std::to_string(8 + nul) +
                  " of its header; a JSON header has none (it is padded with spaces)");
        const u64 data_bytes = file_bytes_ - 8 - n;
        HeaderParser parser(path_, data_bytes);
        nlohmann::json::sax_parse(text.begin(), text.end(), &parser);
        entries_ = std::move(parser.entries);
        metadata_ = std::move(parser.metadata);

        // The tensors tile the data region: sorted by offset, each starts where the last ended.
        std::stable_sort(entries_.begin(), entries_.end(), [](const auto& a, const auto& b) {
            return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
        });
        u64 at = 0;
        for (size_t i = 0; i < entries_.size(); i++) {
            const SafetensorsEntry& e = entries_[i];
            const std::string me = "tensor " + st::quoted(e.name) + " (data_offsets [" +
                                   std::to_string(e.begin) + ", " + std::to_string(e.end) + "])";
            if (e.begin < at)
                p.bad("has " + me + " overlapping tensor " + st::quoted(entries_[i - 1].name) +
                      ", which ends at " + std::to_string(at) + "; tensors may not share bytes");
            if (e.begin > at)
                p.bad("has a hole: bytes [" + std::to_string(at) + ", " + std::to_string(e.begin) +
                      ") of the data belong to no tensor, before " + me +
                      "; the format forbids unused bytes");
            at = e.end;
        }
        if (at != data_bytes)
            p.bad("has " + std::to_string(data_bytes - at) + " bytes after its last tensor (" +
                  std::to_string(data_bytes) + " bytes of data, tensors cover " +
                  std::to_string(at) + "); the format forbids unused bytes");
        for (size_t i = 0; i < entries_.size(); i++) index_.emplace(entries_[i].name, i);
    } catch (...) {
        ::close(fd_);
        fd_ = -1;
        throw;
    }
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      file_bytes_(o.file_bytes_),
      header_bytes_(o.header_bytes_),
      entries_(std::move(o.entries_)),
      metadata_(std::move(o.metadata_)),
      index_(std::move(o.index_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& o) noexcept {
    if (this != &o) {
        if (fd_ >= 0) ::close(fd_);
        path_ = std::move(o.path_);
        fd_ = std::exchange(o.fd_, -1);
        file_bytes_ = o.file_bytes_;
        header_bytes_ = o.header_bytes_;
        entries_ = std::move(o.entries_);
        metadata_ = std::move(o.metadata_);
        index_ = std::move(o.index_);
    }
    return *this;
}

SafetensorsFile::~SafetensorsFile() {
    if (fd_ >= 0) ::close(fd_);
}

bool SafetensorsFile::has(const std::string& name) const {
    return index_.count(name) != 0;
}

const SafetensorsEntry& SafetensorsFile::entry(const std::string& name) const {
    const auto it = index_.find(name);
    if (it == index_.end())
        throw DataError("safetensors file " + path_ + " has no tensor " + st::quoted(name) + "; " +
                        describe_names(entries_) + ": check the name");
    return entries_[it->second];
}

void SafetensorsFile::read_raw(const std::string& name, void* dst, u64 dst_bytes) const {
    const SafetensorsEntry& e = entry(name);
    if (dst_bytes != e.bytes())
        throw Error("reading tensor " + st::quoted(name) + " of safetensors file " + path_ +
                    ": it is " + std::to_string(e.bytes()) + " bytes but the buffer given holds " +
                    std::to_string(dst_bytes));
    char* out = static_cast<char*>(dst);
    const u64 start = 8 + header_bytes_ + e.begin;
    for (u64 done = 0; done < dst_bytes;) {
        const size_t want = size_t(std::min<u64>(dst_bytes - done, u64(1) << 30));
        const ssize_t r = ::pread(fd_, out + done, want, off_t(start + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            throw DataError("safetensors file " + path_ + ": reading tensor " + st::quoted(name) +
                            " failed at byte " + std::to_string(start + done) + ": " +
                            (r < 0 ? std::string(std::strerror(errno))
                                   : "the file ends there; it was truncated or replaced after "
                                     "it was opened"));
        done += u64(r);
    }
}

std::vector<unsigned char> SafetensorsFile::read_raw(const std::string& name) const {
    std::vector<unsigned char> out(size_t(entry(name).bytes()));
    read_raw(name, out.data(), out.size());
    return out;
}

void SafetensorsFile::read_f32(const std::string& name, float* dst, i64 n) const {
    const SafetensorsEntry& e = entry(name);
    const std::optional<DType> t = px_dtype_of(e.dtype);
    if (!t)
        throw DataError("safetensors file " + path_ + ": tensor " + st::quoted(name) + " is " +
                        safe_dtype_name(e.dtype) +
                        "; only F32, BF16, F16, F8_E4M3 and F8_E5M2 convert to fp32 exactly (read "
                        "its raw bytes instead)");
    if (n != e.numel())
        throw Error("reading tensor " + st::quoted(name) + " of safetensors file " + path_ +
                    " as fp32: it has " + std::to_string(e.numel()) +
                    " elements but the buffer given holds " + std::to_string(n));
    if (*t == DType::f32) return read_raw(name, dst, u64(n) * 4);
    // In pieces through a small buffer: the narrow bytes are never all in memory at once.
    const size_t size = dtype_size(*t);
    const i64 chunk = i64(1) << 16;
    std::vector<unsigned char> buf(size_t(chunk) * size);
    const u64 start = 8 + header_bytes_ + e.begin;
    for (i64 i = 0; i < n; i += chunk) {
        const i64 m = std::min(chunk, n - i);
        const u64 bytes = u64(m) * size;
        for (u64 done = 0; done < bytes;) {
            const ssize_t r = ::pread(fd_, buf.data() + done, size_t(bytes - done),
                                      off_t(start + u64(i) * size + done));
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0)
                throw DataError("safetensors file " + path_ + ": reading tensor " +
                                st::quoted(name) + " failed: " +
                                (r < 0 ? std::string(std::strerror(errno))
                                       : "the file ends early; it was truncated or replaced "
                                         "after it was opened"));
            done += u64(r);
        }
        convert(dst + i, DType::f32, buf.data(), *t, size_t(m));
    }
}

std::vector<float> SafetensorsFile::read_f32(const std::string& name) const {
    std::vector<float> out(size_t(entry(name).numel()));
    read_f32(name, out.data(), i64(out.size()));
    return out;
}

}  // namespace px
