#include "core/parallel/state_slices.h"

#include "core/base/error.h"
#include "core/parallel/tensor/tp_model.h"
#include "core/parallel/data/zero.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace px {

namespace {

// A run of consecutive local indices along one dimension that are consecutive logical ones.
struct Run {
    i64 local = 0, logical = 0, n = 0;
};

// The runs of a dimension of `n` local elements: one when it is not split (local = logical),
// else one per range of the split that `rank` stores (back to back locally).
std::vector<Run> runs_of(const tp::DimSplit* s, int rank, i64 n) {
    if (!s) return {Run{0, 0, n}};
    std::vector<Run> out;
    i64 at = 0;
    for (const Range& r : s->ranges[static_cast<size_t>(rank)]) {
        if (r.size() > 0) out.push_back(Run{at, r.lo, r.size()});
        at += r.size();
    }
    PX_ASSERT(at == n, "a tp split's ranges add up to the local extent of the tensor");
    return out;
}

// Pieces of local rows [r0, r0+nr) x local cols [c0, c1) of one entry, cut at the runs' edges.
void emit(std::vector<StatePiece>& out, int entry, const TableEntry& e,
          const std::vector<Run>& rows, const std::vector<Run>& cols, i64 r0, i64 nr, i64 c0,
          i64 c1) {
    for (const Run& c : cols) {
        const i64 a = std::max(c0, c.local), b = std::min(c1, c.local + c.n);
        if (a >= b) continue;
        for (const Run& r : rows) {
            const i64 ra = std::max(r0, r.local), rb = std::min(r0 + nr, r.local + r.n);
            if (ra >= rb) continue;
            StatePiece p;
            p.entry = entry;
            p.id = e.id;
            p.local = e.offset + ra * e.cols + a;
            p.stride = e.cols;
            p.slab = Slab{r.logical + (ra - r.local), rb - ra, c.logical + (a - c.local), b - a};
            out.push_back(p);
        }
    }
}

// Staging for non-contiguous pieces, grown to the largest seen.
struct Staging {
    std::vector<float> buf;
    float* take(i64 n, SliceStats& st) {
        if (static_cast<i64>(buf.size()) < n) buf.resize(static_cast<size_t>(n));
        st.staging_bytes = std::max(st.staging_bytes, n * static_cast<i64>(sizeof(float)));
        return buf.data();
    }
};

}  // namespace

std::vector<StatePiece> state_pieces(const GPT& model, Range floats,
                                     const std::vector<char>* only) {
    const ParamTable& table = model.table();
    const auto* tpl = dynamic_cast<const TpLayers*>(model.parallel_layers());
    std::vector<StatePiece> out;
    for (size_t i = 0; i < table.entries.size(); i++) {
        if (only && !(*only)[i]) continue;
        const TableEntry& e = table.entries[i];
        // The entry's elements inside the range, as a flat range of its (rows, cols) matrix.
        const i64 a = std::max(floats.lo, e.offset) - e.offset;
        const i64 b = std::min(floats.hi, e.offset + e.numel()) - e.offset;
        if (a >= b) continue;
        // An expert-parallel part's stacked expert tensors: its experts' rows (never tp-split).
        const std::vector<Run> rows =
            GPT::expert_tensor(e)
                ? std::vector<Run>{Run{0, model.expert_row_offset(e), e.rows}}
                : runs_of(tpl ? tpl->row_split(e) : nullptr, tpl ? tpl->rank() : 0, e.rows);
        const std::vector<Run> cols =
            runs_of(tpl ? tpl->col_split(e) : nullptr, tpl ? tpl->rank() : 0, e.cols);
        const i64 C = e.cols;
        const int entry = static_cast<int>(i);
        const i64 whole_lo = (a + C - 1) / C, whole_hi = b / C;  // rows entirely inside [a, b)
        if (whole_lo > whole_hi) {  // inside one row, touching neither of its ends
            emit(out, entry, e, rows, cols, a / C, 1, a % C, b - (a / C) * C);
            continue;
        }
        if (a % C != 0) emit(out, entry, e, rows, cols, a / C, 1, a % C, C);
        if (whole_hi > whole_lo)
            emit(out, entry, e, rows, cols, whole_lo, whole_hi - whole_lo, 0, C);
        if (b % C != 0) emit(out, entry, e, rows, cols, whole_hi, 1, 0, b % C);
    }
    return out;
}

RankState replica_state(const GPT& model, float* params, const AdamW& opt, int dp_size, int dp_rank,
                        bool zero3) {
    const ParamTable& t = model.table();
    RankState s;
    s.model = &model;
    s.params = params;
    s.m = opt.m();
    s.v = opt.v();
    s.moments = Range{opt.lo(), opt.hi()};
    const std::vector<i64> cuts = zero_shard_edges(t, dp_size, model.numerics().block);
    s.writes = Range{cuts[static_cast<size_t>(dp_rank)], cuts[static_cast<size_t>(dp_rank) + 1]};
    s.weights = zero3 ? s.writes : Range{0, t.total};
    s.writes_entry.assign(t.entries.size(), 1);
    return s;
}

SliceStats write_rank_state(CheckpointWriter& w, const RankState& s) {
    PX_ASSERT(s.model != nullptr, "write_rank_state: a RankState without a model");
    PX_ASSERT(s.writes.size() == 0 || (s.moments.lo <= s.writes.lo && s.writes.hi <= s.moments.hi &&
                                       s.weights.lo <= s.writes.lo && s.writes.hi <= s.weights.hi),
              "a rank writes only floats it holds");
    const ParamTable& table = s.model->table();
    SliceStats st;
    Staging staging;
    for (const StatePiece& p : state_pieces(*s.model, s.writes, &s.writes_entry)) {
        const std::string& name = table.entries[static_cast<size_t>(p.entry)].name;
        const std::pair<std::string, const float*> kinds[3] = {
            {model_dataset(name), s.params + p.local},
            {moment_dataset('m', name), s.m + (p.local - s.moments.lo)},
            {moment_dataset('v', name), s.v + (p.local - s.moments.lo)},
        };
        for (const auto& [dataset, src] : kinds) {
            const i64 n = p.slab.rows * p.slab.cols;
            const float* data = src;
            if (!p.contiguous()) {
                float* buf = staging.take(n, st);
                for (i64 r = 0; r < p.slab.rows; r++)
                    std::memcpy(buf + r * p.slab.cols, src + r * p.stride,
                                static_cast<size_t>(p.slab.cols) * sizeof(float));
                data = buf;
            }
            w.write(dataset, p.slab, data);
            st.pieces++;
            st.floats += n;
        }
    }
    return st;
}

SliceStats read_rank_state(const CheckpointReader& r, const RankState& s) {
    PX_ASSERT(s.model != nullptr, "read_rank_state: a RankState without a model");
    const ParamTable& table = s.model->table();
    SliceStats st;
    Staging staging;
    auto read = [&](const StatePiece& p, const std::string& dataset, float* dst) {
        const i64 n = p.slab.rows * p.slab.cols;
        if (p.contiguous()) {
            r.read(dataset, p.slab, dst);
        } else {
            float* buf = staging.take(n, st);
            r.read(dataset, p.slab, buf);
            for (i64 row = 0; row < p.slab.rows; row++)
                std::memcpy(dst + row * p.stride, buf + row * p.slab.cols,
                            static_cast<size_t>(p.slab.cols) * sizeof(float));
        }
        st.pieces++;
        st.floats += n;
    };
    for (const StatePiece& p : state_pieces(*s.model, s.weights))
        read(p, model_dataset(table.entries[static_cast<size_t>(p.entry)].name),
             s.params + p.local);
    for (const StatePiece& p : state_pieces(*s.model, s.moments)) {
        const std::string& name = table.entries[static_cast<size_t>(p.entry)].name;
        read(p, moment_dataset('m', name), s.m + (p.local - s.moments.lo));
        read(p, moment_dataset('v', name), s.v + (p.local - s.moments.lo));
    }
    return st;
}

}  // namespace px
