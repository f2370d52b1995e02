// What the backends share (core/comm/backend.h): the clock of their waits and the pieces of their
// error messages.
#include "core/comm/backend.h"

#include <chrono>
#include <cstdio>

namespace px::comm::backend {

double since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string seconds_str(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f s", s);
    return buf;
}

std::string rank_list(const std::vector<int>& r) {
    if (r.empty()) return "no rank";
    std::string s = r.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < r.size(); i++) {
        if (i) s += ", ";
        s += std::to_string(r[i]);
    }
    return s;
}

std::string counts_str(const std::vector<i64>& c) {
    std::string s = "[";
    for (size_t i = 0; i < c.size(); i++) {
        if (i) s += ", ";
        s += std::to_string(c[i]);
    }
    return s + "]";
}

std::string what_of(const std::exception_ptr& e) {
    try {
        std::rethrow_exception(e);
    } catch (const std::exception& x) {
        return x.what();
    } catch (...) {
        return "unknown exception";
    }
}

}  // namespace px::comm::backend
