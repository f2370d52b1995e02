#include "core/model/probe.h"

#include <algorithm>

namespace px {

std::string ProbeKey::name() const {
    std::string s = std::to_string(step);
    s += '/';
    s += phase;
    s += '/';
    if (layer < 0)
        s += '-';
    else
        s += std::to_string(layer);
    s += '/';
    s += op;
    s += '/';
    s += tensor;
    return s;
}

i64 Hyperslab::numel() const {
    i64 n = 1;
    for (size_t d = 0; d < lo.size(); d++) n *= hi[d] - lo[d];
    return n;
}

i64 ShardSpec::local_numel() const {
    i64 n = 0;
    for (const Hyperslab& p : pieces) n += p.numel();
    return n;
}

ShardSpec flat_shard(const std::vector<i64>& shape, i64 a, i64 b) {
    ShardSpec s;
    s.logical_shape = shape;
    if (a >= b) return s;
    const size_t nd = shape.size();
    if (nd == 0) {  // a scalar
        s.pieces.push_back({});
        return s;
    }
    const i64 cols = shape[nd - 1];
    // A slab of rows [r0, r1) (flat over the leading dimensions) and columns [c0, c1).
    auto rows = [&](i64 r0, i64 r1, i64 c0, i64 c1) {
        if (r0 >= r1 || c0 >= c1) return;
        if (nd == 1) {
            s.pieces.push_back({{c0}, {c1}});
            return;
        }
        // Flat rows map back to the leading dimensions only when they stay within one slab of
        // them: cut the run where the next-to-last dimension wraps.
        const i64 inner = shape[nd - 2];
        for (i64 r = r0; r < r1;) {
            const i64 end = std::min(r1, (r / inner + 1) * inner);
            Hyperslab p;
            p.lo.resize(nd);
            p.hi.resize(nd);
            i64 q = r;
            p.lo[nd - 2] = q % inner;
            p.hi[nd - 2] = p.lo[nd - 2] + (end - r);
            q /= inner;
            for (size_t d = nd - 2; d-- > 0;) {
                p.lo[d] = q % shape[d];
                p.hi[d] = p.lo[d] + 1;
                q /= shape[d];
            }
            p.lo[nd - 1] = c0;
            p.hi[nd - 1] = c1;
            s.pieces.push_back(std::move(p));
            r = end;
        }
    };
    const i64 ra = a / cols, ca = a % cols, rb = b / cols, cb = b % cols;
    if (ra == rb) {
        rows(ra, ra + 1, ca, cb);
        return s;
    }
    i64 full_lo = ra;
    if (ca > 0) {
        rows(ra, ra + 1, ca, cols);
        full_lo = ra + 1;
    }
    rows(full_lo, rb, 0, cols);
    rows(rb, rb + 1, 0, cb);
    return s;
}

ShardSpec slice(const ShardSpec& s, i64 a, i64 b) {
    ShardSpec out;
    out.logical_shape = s.logical_shape;
    i64 at = 0;  // local offset of the piece
    for (const Hyperslab& p : s.pieces) {
        const i64 n = p.numel();
        const i64 x = std::max(a, at), y = std::min(b, at + n);
        if (x < y) {
            std::vector<i64> extent(p.lo.size());
            for (size_t d = 0; d < extent.size(); d++) extent[d] = p.hi[d] - p.lo[d];
            const ShardSpec part = flat_shard(extent, x - at, y - at);
            for (Hyperslab q : part.pieces) {
                for (size_t d = 0; d < q.lo.size(); d++) {
                    q.lo[d] += p.lo[d];
                    q.hi[d] += p.lo[d];
                }
                out.pieces.push_back(std::move(q));
            }
        }
        at += n;
    }
    return out;
}

void offset_rows(ShardSpec& s, i64 lo, i64 total) {
    if (s.logical_shape.empty()) return;
    s.logical_shape[0] = total;
    for (Hyperslab& p : s.pieces) {
        p.lo[0] += lo;
        p.hi[0] += lo;
    }
}

ProbeSink::~ProbeSink() = default;

bool glob_match(std::string_view p, std::string_view n) {
    // Backtracking over the pattern; patterns and names are short.
    size_t i = 0, j = 0;
    while (i < p.size()) {
        if (p[i] == '*') {
            const bool any = i + 1 < p.size() && p[i + 1] == '*';
            const std::string_view rest = p.substr(i + (any ? 2 : 1));
            for (size_t k = j;; k++) {
                if (glob_match(rest, n.substr(k))) return true;
                if (k == n.size() || (!any && n[k] == '/')) return false;
            }
        }
        if (j == n.size()) return false;
        if (p[i] == '?') {
            if (n[j] == '/') return false;
        } else if (p[i] != n[j]) {
            return false;
        }
        i++;
        j++;
    }
    return j == n.size();
}

}  // namespace px
