// What a path is, asked without opening it. Opening a FIFO for reading waits for a writer, and a
// device or a folder is no data file, so every reader of an input file asks first.
//
// Index
//   FileKind, file_kind     regular file, folder, FIFO, device, socket, or missing (stat, follows
//                           links; never blocks)
//   file_kind_text          "a FIFO (named pipe)", ... for messages
#pragma once
#include <string>

namespace px {

enum class FileKind { missing, regular, folder, fifo, char_device, block_device, socket, other };

FileKind file_kind(const std::string& path);
const char* file_kind_text(FileKind k);  // "a regular file", "a folder", "a FIFO (named pipe)", ...

}  // namespace px
