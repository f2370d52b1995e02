#include "core/base/files.h"

#include <sys/stat.h>

namespace px {

FileKind file_kind(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return FileKind::missing;
    if (S_ISREG(st.st_mode)) return FileKind::regular;
    if (S_ISDIR(st.st_mode)) return FileKind::folder;
    if (S_ISFIFO(st.st_mode)) return FileKind::fifo;
    if (S_ISCHR(st.st_mode)) return FileKind::char_device;
    if (S_ISBLK(st.st_mode)) return FileKind::block_device;
    if (S_ISSOCK(st.st_mode)) return FileKind::socket;
    return FileKind::other;
}

const char* file_kind_text(FileKind k) {
    switch (k) {
        case FileKind::missing:
            return "missing";
        case FileKind::regular:
            return "a regular file";
        case FileKind::folder:
            return "a folder";
        case FileKind::fifo:
            return "a FIFO (named pipe)";
        case FileKind::char_device:
            return "a character device";
        case FileKind::block_device:
            return "a block device";
        case FileKind::socket:
            return "a socket";
        case FileKind::other:
            return "not a regular file";
    }
    return "not a regular file";
}

}  // namespace px
