// What the safetensors reader, writer and set (core/io/safetensors*.cpp) share, and the Hugging
// Face folders built on them (core/io/hf_*.cpp); not for use outside them.
//
// Index
//   kMaxHeaderBytes      the largest header accepted (the reference library's limit)
//   quoted               a name for a message: in single quotes, control bytes escaped
//   shape_text           "[2, 3]"
//   AtomicFile           a file written under a temporary name, fsynced, then renamed
#pragma once
#include "core/io/safetensors.h"

#include <string>
#include <string_view>
#include <vector>

namespace px::st {

inline constexpr u64 kMaxHeaderBytes = 100'000'000;

std::string quoted(std::string_view name);
std::string shape_text(const std::vector<i64>& shape);

// Writes <folder>/.<name>.tmp-<pid>; commit() fsyncs it, renames it to path and fsyncs the
// folder, so a crash leaves the earlier file or the whole new one. Destroyed uncommitted, it
// removes the temporary file. Failures throw StorageError naming path (`what` starts messages:
// "safetensors file").
class AtomicFile {
public:
    AtomicFile(std::string path, std::string what);
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;
    ~AtomicFile();
    void write(const void* data, u64 bytes);
    void commit();

private:
    [[noreturn]] void fail(const std::string& step);
    std::string path_, what_, temp_;
    int fd_ = -1;
};

}  // namespace px::st
