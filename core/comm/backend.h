// What the two backends (core/comm/inproc.cpp, core/comm/mpi.cpp) share, so that they form the
// same bits and word their errors the same way: the canonical tree over ranks applied to rows of
// contributions, and the pieces of their messages. Not for users of a Communicator.
//
// Index
//   max_of, tree_rows    the canonical tree over rank index (sum or max, NaN wins), row-wise
//   Clock, since         wall time of waits
//   seconds_str, rank_list, counts_str, what_of   "2.00 s", "ranks 1, 3", "[4, 4, 3]", what()
#pragma once
#include "core/base/numerics.h"  // tree_mid
#include "core/base/shapes.h"    // i64

#include <chrono>
#include <cmath>
#include <exception>
#include <string>
#include <type_traits>
#include <vector>

namespace px::comm::backend {

template <class T>
T max_of(T a, T b) {
    if constexpr (std::is_floating_point_v<T>)
        return (a > b || std::isnan(a)) ? a : b;
    else
        return a > b ? a : b;
}

// Node [lo, hi) of the canonical tree over ranks (core/base/numerics.h: split at tree_mid), applied
// to rows of width w: rows[lo] = node(lo, mid) + node(mid, hi) (Max: their maximum).
template <class T, bool Max>
void tree_rows(T* rows, int lo, int hi, i64 w) {
    if (hi - lo == 1) return;
    const int mid = static_cast<int>(tree_mid(lo, hi));
    tree_rows<T, Max>(rows, lo, mid, w);
    tree_rows<T, Max>(rows, mid, hi, w);
    T* a = rows + lo * w;
    const T* b = rows + mid * w;
    for (i64 i = 0; i < w; i++) a[i] = Max ? max_of(a[i], b[i]) : a[i] + b[i];
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0);                 // seconds
std::string seconds_str(double s);                  // "2.00 s"
std::string rank_list(const std::vector<int>& r);   // "no rank", "rank 3", "ranks 1, 3"
std::string counts_str(const std::vector<i64>& c);  // "[4, 4, 3]"
std::string what_of(const std::exception_ptr& e);   // its what(), or "unknown exception"

}  // namespace px::comm::backend
