// Hugging Face safetensors files, read and written without Python: one file, or a sharded set
// (model.safetensors.index.json beside its shards).
//
// Index
//   SafeDType, safe_dtype_name, safe_dtype_from_name, safe_dtype_bits   the file's element types
//   safe_dtype_of, px_dtype_of        to and from Parallax's DType (f32, bf16, f16, e4m3, e5m2)
//   SafetensorsMetadata, kPtMetadata  the header's "__metadata__" (string -> string, file order)
//   SafetensorsEntry                  one tensor of a header: name, dtype, shape, data_offsets
//   SafetensorsFile                   opens a file, checks its whole header; lists and reads
//   SafetensorsData, SafetensorsOrder one tensor to write (borrowed bytes); the order in the file
//   write_safetensors                 writes one file, atomically, byte for byte as HF's library
//   SafetensorsShards, write_safetensors_shards   shards of at most a size, and their index
//   SafetensorsSet                    an index and its shards (or one file) as one set of tensors
//
// The format (huggingface.co/docs/safetensors): an unsigned little-endian 64-bit N; N bytes of
// UTF-8 JSON, an object that starts with '{': tensor name -> {"dtype": "F32", "shape": [2, 3],
// "data_offsets": [begin, end]} (end - begin = elements x dtype size; offsets from the byte
// after the header), plus an optional "__metadata__" object of string -> string; then the data,
// little-endian, row-major. Rules the reader holds a file to, the spec's: N at most 100,000,000
// (the reference library's limit) and within the file; the JSON starts with '{' and has no
// duplicate keys (safetensors 0.8.0 itself lets leading spaces pass and keeps the last of two
// keys); every dtype one of SafeDType's; the tensors tile the data region exactly, sorted by
// offset: no overlap, no hole, no byte after the last tensor (holes would let one file be two
// formats at once). Beyond the spec, a shape has at most 1024 dimensions, each below 2^63.
//
// Writing, as safetensors 0.8.0 (the Python package's serialize, which transformers'
// save_pretrained calls with metadata {"format": "pt"}) writes, checked byte for byte in
// tests/io/test_safetensors.cpp:
//   - compact JSON (no spaces), "__metadata__" first (its keys in the order given), then the
//     tensors in data order, each {"dtype":..,"shape":[..],"data_offsets":[b,e]} in that key order;
//     strings escaped as serde_json does: \" \\ \b \f \n \r \t, other bytes below 0x20 as \u00xx,
//     everything else (/, DEL, non-ASCII) as is;
//   - the tensors sorted by dtype, widest first (the reference library's dtype order, U64 ... BOOL:
//     SafeDType's order reversed), then by name (bytewise): every tensor stays aligned to its
//     element size; SafetensorsOrder::given keeps the caller's order instead;
//   - the JSON padded with spaces to a multiple of 8 bytes, so the data starts 8-byte aligned.
// A file read and written back with its entries (in file order, SafetensorsOrder::given) and its
// metadata is the same bytes whenever its header is compact as above (every file this library or
// HF's writes).
//
// Shards, as transformers' save_pretrained: the tensors taken in the given order into shards of at
// most max_shard_bytes of data (a larger tensor alone in its own shard), named
// <prefix>-00001-of-0000K.safetensors, and <prefix>.safetensors.index.json =
// {"metadata": {"total_size": <data bytes>}, "weight_map": {name: shard file}}, written as Python's
// json.dumps(index, indent=2, sort_keys=True) + "\n". One shard is written as <prefix>.safetensors
// with no index, as transformers does.
//
// Errors. A file that breaks a rule is refused when it is opened, before any tensor is read, with
// a DataError naming the file, the tensor where there is one, and what is wrong; so is a missing
// tensor asked for. A write the file system refuses throws StorageError and leaves no partial
// file (temporary file, fsync, rename, as the checkpoint writer). Input that cannot be written
// (bytes that do not match the shape, duplicate names) throws Error naming the tensor.
#pragma once
#include "core/base/dtype.h"
#include "core/base/shapes.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace px {

using u64 = std::uint64_t;

// ---- dtypes ----

// Every dtype of the reference library, in its order (the writer sorts by it, widest last here).
// The names are the file's spelling.
enum class SafeDType : std::uint8_t {
    BOOL,
    F4,
    F6_E2M3,
    F6_E3M2,
    U8,
    I8,
    F8_E5M2,
    F8_E4M3,
    F8_E8M0,
    F8_E4M3FNUZ,
    F8_E5M2FNUZ,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64
};
inline constexpr int kNumSafeDTypes = 22;

const char* safe_dtype_name(SafeDType t);                           // "F32", "BF16", ...
std::optional<SafeDType> safe_dtype_from_name(std::string_view s);  // nullopt if unknown
int safe_dtype_bits(SafeDType t);                                   // 4 for F4, 6 for F6, 8 .. 64
SafeDType safe_dtype_of(DType t);                                   // f32 -> F32, e4m3 -> F8_E4M3
std::optional<DType> px_dtype_of(SafeDType t);  // the Parallax dtype of the same bits, if any

// ---- reading one file ----

// "__metadata__" in file order (a writer given the same order writes the same bytes).
using SafetensorsMetadata = std::vector<std::pair<std::string, std::string>>;
inline const SafetensorsMetadata kPtMetadata = {{"format", "pt"}};  // what transformers writes

struct SafetensorsEntry {
    std::string name;
    SafeDType dtype = SafeDType::F32;
    std::vector<i64> shape;  // [] is a scalar
    u64 begin = 0, end = 0;  // data_offsets, from the first byte after the header
    i64 numel() const;       // product of shape (1 for a scalar)
    u64 bytes() const { return end - begin; }
};

// An open, checked file. Reads with pread into the caller's buffer (never the whole file), so
// const members may be called from several threads. Move-only: it owns the file descriptor.
class SafetensorsFile {
public:
    // Opens and checks the whole header (rules above); throws DataError naming path.
    explicit SafetensorsFile(const std::string& path);
    SafetensorsFile(SafetensorsFile&& o) noexcept;
    SafetensorsFile& operator=(SafetensorsFile&& o) noexcept;
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;
    ~SafetensorsFile();

    const std::string& path() const { return path_; }
    const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // data order
    const std::optional<SafetensorsMetadata>& metadata() const { return metadata_; }
    u64 header_bytes() const { return header_bytes_; }  // N
    u64 file_bytes() const { return file_bytes_; }

    bool has(const std::string& name) const;
    const SafetensorsEntry& entry(const std::string& name) const;  // DataError if absent

    // The tensor's bytes as stored; dst holds exactly entry(name).bytes() (else Error).
    void read_raw(const std::string& name, void* dst, u64 dst_bytes) const;
    std::vector<unsigned char> read_raw(const std::string& name) const;
    // The tensor as fp32, exactly: F32 as is; BF16, F16, F8_E4M3, F8_E5M2 widened (core/base/
    // dtype.h); other dtypes refused by name (read_raw them). dst holds numel() floats.
    void read_f32(const std::string& name, float* dst, i64 n) const;
    std::vector<float> read_f32(const std::string& name) const;

private:
    std::string path_;
    int fd_ = -1;
    u64 file_bytes_ = 0, header_bytes_ = 0;
    std::vector<SafetensorsEntry> entries_;
    std::optional<SafetensorsMetadata> metadata_;
    std::unordered_map<std::string, size_t> index_;  // name -> entries_ position
};

// ---- writing ----

// One tensor to write: its bytes as they go in the file (little-endian, row-major), borrowed.
struct SafetensorsData {
    std::string name;
    SafeDType dtype = SafeDType::F32;
    std::vector<i64> shape;
    const void* data = nullptr;
    u64 bytes = 0;  // must be numel x dtype size
};

enum class SafetensorsOrder {
    hf,     // by dtype, widest first, then by name: what HF's library writes
    given,  // the order of the vector (a file's entries() order reproduces that file)
};

// Writes path atomically. metadata nullopt writes no "__metadata__" (HF's metadata=None).
void write_safetensors(const std::string& path, const std::vector<SafetensorsData>& tensors,
                       const std::optional<SafetensorsMetadata>& metadata = kPtMetadata,
                       SafetensorsOrder order = SafetensorsOrder::hf);

struct SafetensorsShards {
    std::vector<std::string> files;  // paths of the shards written, in shard order
    std::string index;               // path of the index; empty when one file holds everything
};

// Writes folder/<prefix>... as transformers shards (above); each shard in HF order with
// metadata, each file atomically, the index last (a reader never sees it before its shards).
// Then removes what an earlier write of this prefix left there that this set does not hold (its
// shards, its index, its single file): a reader of the folder finds this set and no other, as
// transformers' cleanup does. max_shard_bytes > 0.
SafetensorsShards write_safetensors_shards(
    const std::string& folder, const std::vector<SafetensorsData>& tensors, u64 max_shard_bytes,
    const std::optional<SafetensorsMetadata>& metadata = kPtMetadata,
    const std::string& prefix = "model");

// ---- a set: an index and its shards, or one file ----

class SafetensorsSet {
public:
    // path: an index (*.json), one .safetensors file, or a folder holding
    // model.safetensors.index.json or else model.safetensors. Opens and checks every shard, and
    // refuses (DataError naming the index, the shard and the tensor) an index that names a
    // missing file or a file outside its folder, a tensor absent from the shard it names, a
    // tensor held by two shards, or a shard tensor the index does not list.
    explicit SafetensorsSet(const std::string& path);

    const std::string& path() const { return path_; }  // the index, or the single file
    const std::vector<SafetensorsFile>& files() const { return files_; }
    std::vector<std::string> names() const;  // shard by shard, each in data order
    std::optional<u64> total_size() const { return total_size_; }  // the index's, if given

    bool has(const std::string& name) const;
    const SafetensorsFile& file_of(const std::string& name) const;  // DataError if absent
    const SafetensorsEntry& entry(const std::string& name) const;
    void read_raw(const std::string& name, void* dst, u64 dst_bytes) const;
    void read_f32(const std::string& name, float* dst, i64 n) const;

private:
    std::string path_;
    std::vector<SafetensorsFile> files_;
    std::unordered_map<std::string, size_t> where_;  // tensor -> files_ position
    std::optional<u64> total_size_;
};

}  // namespace px
