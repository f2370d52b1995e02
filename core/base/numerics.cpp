#include "core/base/numerics.h"

#include "core/base/error.h"

#include <algorithm>
#include <cmath>

namespace px {

Isa detect_isa() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return Isa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
#endif
    return Isa::scalar;
}

const char* isa_name(Isa isa) {
    switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
    }
    return "?";
}

const char* mode_name(Mode mode) { return mode == Mode::bitwise ? "bitwise" : "fast"; }

namespace {

// Returns whether any block in [lo, hi) is present; the node's value is left in p[lo].
bool combine(float* p, i64 lo, i64 hi, i64 w, const unsigned char* present) {
    if (hi - lo == 1) return present == nullptr || present[lo];
    const i64 mid = tree_mid(lo, hi);
    const bool l = combine(p, lo, mid, w, present);
    const bool r = combine(p, mid, hi, w, present);
    float* dst = p + lo * w;
    const float* src = p + mid * w;
    if (l && r) {
        for (i64 i = 0; i < w; i++) dst[i] = dst[i] + src[i];
    } else if (r) {
        std::copy(src, src + w, dst);
    }
    return l || r;
}

float sum_node(const float* partials, i64 lo, i64 hi) {
    // Nodes of up to 3 leaves written out (mid = lo + 2 for 3): the same sums, without the calls
    // that dominate a tree of millions of block partials (the grad norm's).
    const float* p = partials + lo;
    switch (hi - lo) {
        case 1: return p[0];
        case 2: return p[0] + p[1];
        case 3: return (p[0] + p[1]) + p[2];
        default: break;
    }
    const i64 mid = tree_mid(lo, hi);
    return sum_node(partials, lo, mid) + sum_node(partials, mid, hi);
}

double sum_node_f64(const double* partials, i64 lo, i64 hi) {
    if (hi - lo == 1) return partials[lo];
    const i64 mid = tree_mid(lo, hi);
    return sum_node_f64(partials, lo, mid) + sum_node_f64(partials, mid, hi);
}

void schedule_node(MergeSchedule& s, i64 lo, i64 hi, int height_above, int& max_depth) {
    if (hi - lo == 1) {
        max_depth = std::max(max_depth, height_above + 1);
        return;
    }
    const i64 mid = tree_mid(lo, hi);
    schedule_node(s, lo, mid, height_above, max_depth);
    schedule_node(s, mid, hi, height_above + 1, max_depth);
    s.merges_after[hi - 1]++;
}

bool node_search(i64 lo, i64 hi, i64 a, i64 b) {
    if (lo == a && hi == b) return true;
    if (hi - lo == 1 || b <= lo || a >= hi) return false;
    const i64 mid = tree_mid(lo, hi);
    if (b <= mid) return node_search(lo, mid, a, b);
    if (a >= mid) return node_search(mid, hi, a, b);
    return false;
}

}  // namespace

bool tree_combine_rows(float* p, i64 nb, i64 w, const unsigned char* present) {
    PX_ASSERT(nb >= 1, "tree over zero blocks");
    return combine(p, 0, nb, w, present);
}

float tree_sum(const float* partials, i64 nb) {
    PX_ASSERT(nb >= 1, "tree over zero blocks");
    return sum_node(partials, 0, nb);
}

float canonical_sum(const float* x, i64 n, int block) {
    const i64 nb = num_blocks(n, block);
    if (nb == 0) return 0.0f;
    std::vector<float> part(nb);
    for (i64 b = 0; b < nb; b++) {
        float acc = 0.0f;
        const i64 end = std::min(n, (b + 1) * block);
        for (i64 i = b * block; i < end; i++) acc = acc + x[i];
        part[b] = acc;
    }
    return tree_sum(part.data(), nb);
}

float canonical_dot(const float* x, const float* y, i64 n, int block) {
    const i64 nb = num_blocks(n, block);
    if (nb == 0) return 0.0f;
    std::vector<float> part(nb);
    for (i64 b = 0; b < nb; b++) {
        float acc = 0.0f;
        const i64 end = std::min(n, (b + 1) * block);
        for (i64 i = b * block; i < end; i++) acc = std::fma(x[i], y[i], acc);
        part[b] = acc;
    }
    return tree_sum(part.data(), nb);
}

double canonical_sum_f64(const double* x, i64 n, int block) {
    const i64 nb = num_blocks(n, block);
    if (nb == 0) return 0.0;
    std::vector<double> part(nb);
    for (i64 b = 0; b < nb; b++) {
        double acc = 0.0;
        const i64 end = std::min(n, (b + 1) * block);
        for (i64 i = b * block; i < end; i++) acc = acc + x[i];
        part[b] = acc;
    }
    return sum_node_f64(part.data(), 0, nb);
}

MergeSchedule make_merge_schedule(i64 nb) {
    PX_ASSERT(nb >= 1, "tree over zero blocks");
    MergeSchedule s;
    s.nb = nb;
    s.merges_after.assign(nb, 0);
    int depth = 0;
    schedule_node(s, 0, nb, 0, depth);
    s.depth = depth;
    return s;
}

bool is_tree_node(i64 nb, i64 lo, i64 hi) {
    if (lo < 0 || hi > nb || lo >= hi) return false;
    return node_search(0, nb, lo, hi);
}

}  // namespace px
