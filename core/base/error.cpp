#include "core/base/error.h"

namespace px {

void assert_failed(const char* expr, const char* file, int line, const std::string& msg) {
    throw InternalError(std::string("internal error: ") + expr + " failed at " + file + ":" +
                        std::to_string(line) + (msg.empty() ? "" : ": " + msg) +
                        " (this is a bug in Parallax; please report it)");
}

}  // namespace px
