#include "core/parallel/data/zero.h"

#include "core/base/error.h"
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace px {

std::vector<i64> zero_shard_edges(const ParamTable& t, int dp, int block) {
    // The first block boundary of a tensor at or after flat position x (tensor ends count too).
    auto snap = [&](i64 x) {
        for (const TableEntry& e : t.entries) {
            const i64 end = e.offset + e.numel();
            if (x <= e.offset) return e.offset;
            if (x < end)
                return std::min(end, e.offset + (x - e.offset + block - 1) / block * block);
        }
        return t.total;
    };
    std::vector<i64> edges(static_cast<size_t>(dp) + 1, 0);
    for (int r = 1; r < dp; r++)
        edges[static_cast<size_t>(r)] =
            std::max(edges[static_cast<size_t>(r) - 1], snap(t.total * r / dp));
    edges[static_cast<size_t>(dp)] = t.total;
    return edges;
}

void reduce_scatter_cut(comm::Communicator& dp, float* seg, const std::vector<i64>& cuts,
                        std::vector<float>& scratch, bool twice) {
    const int p = dp.size(), rank = dp.rank();
    if (cuts[static_cast<size_t>(p)] == cuts[0]) return;  // the same on every rank
    auto len = [&](int r) { return cuts[static_cast<size_t>(r) + 1] - cuts[static_cast<size_t>(r)]; };
    std::vector<i64> send(static_cast<size_t>(p)), recv(static_cast<size_t>(p));
    for (int r = 0; r < p; r++) send[static_cast<size_t>(r)] = len(r);
    const i64 mine = len(rank);
    if (!twice) {
        std::fill(recv.begin(), recv.end(), mine);
        // Row r of scratch: rank r's contribution to this rank's piece.
        scratch.resize(static_cast<size_t>(mine * p));
        dp.all_to_all_v(scratch.data(), recv, seg + cuts[0], send);
        if (mine == 0) return;
        tree_combine_rows(scratch.data(), p, mine);
        std::memcpy(seg + cuts[rank], scratch.data(), static_cast<size_t>(mine) * sizeof(float));
        return;
    }
    // Rank r is sent its piece, then the piece of rank (r + 1) mod p, from one packed buffer (the
    // pieces are overwritten in place below, after every send has left).
    const int next = (rank + 1) % p;
    const i64 other = len(next), row = mine + other;
    i64 packed_n = 0;
    for (int r = 0; r < p; r++) {
        send[static_cast<size_t>(r)] = len(r) + len((r + 1) % p);
        packed_n += send[static_cast<size_t>(r)];
    }
    std::vector<float> packed(static_cast<size_t>(packed_n));
    float* at = packed.data();
    for (int r = 0; r < p; r++)
        for (int piece : {r, (r + 1) % p}) {
            std::memcpy(at, seg + cuts[static_cast<size_t>(piece)],
                        static_cast<size_t>(len(piece)) * sizeof(float));
            at += len(piece);
        }
    std::fill(recv.begin(), recv.end(), row);
    std::vector<float> got(static_cast<size_t>(row * p));
    dp.all_to_all_v(got.data(), recv, static_cast<const float*>(packed.data()), send);
    // Rows of rank r's contributions to each of the two pieces, combined in the same tree.
    const std::pair<int, i64> pieces[2] = {{rank, 0}, {next, mine}};
    for (const auto& [piece, from] : pieces) {
        const i64 n = len(piece);
        if (n == 0) continue;
        scratch.resize(static_cast<size_t>(n * p));
        for (int r = 0; r < p; r++)
            std::memcpy(scratch.data() + r * n, got.data() + r * row + from,
                        static_cast<size_t>(n) * sizeof(float));
        tree_combine_rows(scratch.data(), p, n);
        std::memcpy(seg + cuts[static_cast<size_t>(piece)], scratch.data(),
                    static_cast<size_t>(n) * sizeof(float));
    }
}

ZeroShards::ZeroShards(const GPT& model, int dp, int rank)
    : model_(model),
      rank_(rank),
      edges_(zero_shard_edges(model.table(), dp, model.numerics().block)) {
    // The LM head's gradient shadows wte element for element: cut it where wte is cut.
    const ParamTable& t = model.table();
    head_edges_.assign(edges_.size(), 0);
    if (!model.part().head_region()) return;  // a stage without wte, or an untied head
    const TableEntry& wte = t.entries[static_cast<size_t>(t.wte)];
    for (size_t r = 0; r < edges_.size(); r++)
        head_edges_[r] = std::clamp<i64>(edges_[r] - wte.offset, 0, wte.numel());
}

// wte's gradient (the embedding's part on the first stage, the LM head's on the last) is
// all-reduced whole, since the first and the last stage cut their tables differently and
// exchange it whole; the rest of the table is reduce-scattered at the shard edges.
void ZeroShards::reduce_scatter_stage(comm::Communicator& dp, float* grads, comm::Algo algo) {
    const ParamTable& t = model_.table();
    i64 from = 0;  // the sharded segment [from, table total)
    if (model_.part().holds_wte()) {
        const TableEntry& wte = t.entries[static_cast<size_t>(t.wte)];
        PX_ASSERT(wte.offset == 0, "a table starts with wte");
        dp.all_reduce(grads, wte.numel(), algo);
        if (model_.part().head_region())
            dp.all_reduce(grads + model_.grad_layout().head_offset, wte.numel(), algo);
        from = wte.numel();
    }
    std::vector<i64> cuts(edges_.size());
    for (size_t r = 0; r < cuts.size(); r++) cuts[r] = std::clamp(edges_[r], from, t.total) - from;
    reduce_scatter_cut(dp, grads + from, cuts, scratch_, checked_ >= 0);
}

std::vector<i64> ZeroShards::cuts_in(i64 a, i64 b) const {
    // A range lies in the table's region or in the head region (GradLayout), never in both.
    const i64 head = model_.grad_layout().head_offset;
    const bool in_head = a >= head && model_.table().wte >= 0 && head < model_.grad_layout().total;
    std::vector<i64> cuts(edges_.size());
    for (size_t r = 0; r < cuts.size(); r++)
        cuts[r] = std::clamp(in_head ? head + head_edges_[r] : edges_[r], a, b);
    return cuts;
}

void ZeroShards::combine_tied(float* grads) const {
    if (!model_.part().head_region()) return;  // an untied head: nothing to add
    const TableEntry& wte = model_.table().entries[model_.table().wte];
    const float* head = grads + model_.grad_layout().head_offset;
    for (int r : {rank_, checked_}) {
        if (r < 0) continue;
        for (i64 i = head_edges_[r]; i < head_edges_[r + 1]; i++)
            grads[wte.offset + i] = grads[wte.offset + i] + head[i];
    }
}

std::vector<float> ZeroShards::sum_squares(comm::Communicator& dp, const float* grads,
                                           const std::vector<char>& owned) const {
    const Numerics& nx = model_.numerics();
    const auto& entries = model_.table().entries;
    const int block = nx.block;
    // The blocks of entry i that lie in shard r (shard edges are block boundaries).
    auto blocks = [&](size_t i, int r, i64& b0, i64& b1) {
        const TableEntry& e = entries[i];
        b0 = b1 = 0;
        if (!owned[i]) return;
        const i64 a = std::max(e.offset, lo(r)), b = std::min(e.offset + e.numel(), hi(r));
        if (a >= b) return;
        b0 = (a - e.offset) / block;
        b1 = num_blocks(b - e.offset, block);
    };
    std::vector<i64> counts(static_cast<size_t>(size()), 0);
    for (int r = 0; r < size(); r++)
        for (size_t i = 0; i < entries.size(); i++) {
            i64 b0, b1;
            blocks(i, r, b0, b1);
            counts[static_cast<size_t>(r)] += b1 - b0;
        }
    // This rank's block partials, in flat order; then every rank's, gathered.
    std::vector<float> mine(static_cast<size_t>(counts[static_cast<size_t>(rank_)]));
    i64 at = 0;
    for (size_t i = 0; i < entries.size(); i++) {
        i64 b0, b1;
        blocks(i, rank_, b0, b1);
        if (b1 == b0) continue;
        const TableEntry& e = entries[i];
        const i64 a = e.offset + b0 * block,
                  b = std::min(e.offset + e.numel(), e.offset + b1 * block);
        ops::sum_squares_blocks(nx, view_f32(mine.data() + at, {b1 - b0}),
                                view_f32(grads + a, {b - a}));
        at += b1 - b0;
    }
    i64 all_blocks = 0;
    for (i64 c : counts) all_blocks += c;
    std::vector<float> every(static_cast<size_t>(all_blocks));
    dp.all_gather_v(every.data(), mine.data(), counts);
    // Every block of every owned tensor, in flat order: the single device's tree per tensor.
    std::vector<float> sums(entries.size(), 0.0f);
    at = 0;
    for (size_t i = 0; i < entries.size(); i++) {
        if (!owned[i]) continue;
        const i64 nb = num_blocks(entries[i].numel(), block);
        sums[i] = tree_sum(every.data() + at, nb);
        at += nb;
    }
    PX_ASSERT(at == all_blocks, "every gradient block has exactly one owner");
    return sums;
}

void ZeroShards::all_gather_shards(comm::Communicator& dp, float* whole, const float* mine) const {
    std::vector<i64> counts(static_cast<size_t>(size()));
    for (int r = 0; r < size(); r++) counts[static_cast<size_t>(r)] = hi(r) - lo(r);
    dp.all_gather_v(whole, mine, counts);
}

void ZeroShards::all_gather_params(comm::Communicator& dp, float* params) const {
    const std::vector<float> mine(params + lo(), params + hi());
    all_gather_shards(dp, params, mine.data());
}

void ZeroShards::release_params(Arena& params) const {
    decommit_f32(params, 0, lo());
    decommit_f32(params, hi(), model_.table().total);
}

// ---- ZeroUnits -------------------------------------------------------------------------------

ZeroUnits::ZeroUnits(GPT& model, ZeroShards& shards, comm::Communicator& dp, int stage,
                     Arena& grads, std::vector<unsigned char> merges)
    : model_(model),
      shards_(shards),
      dp_(dp),
      stage_(stage),
      grads_(grads),
      merges_(std::move(merges)) {
    PX_ASSERT(stage_ >= 2 && stage_ <= 3, "ZeroUnits is ZeRO-2/3");
    // The partials' stack, as the single device's microbatch accumulation (job.cpp) uses it.
    const int m = static_cast<int>(merges_.size());
    push_.resize(static_cast<size_t>(m));
    // A node that merges at once is added straight into the partial below it, so only nodes
    // that wait for a sibling take a level: log2(m) levels for m a power of two.
    int sp = 0, depth = 0;
    for (int k = 0; k < m; k++) {
        push_[static_cast<size_t>(k)] = sp++;
        if (merges_[static_cast<size_t>(k)] == 0) depth = std::max(depth, sp);
        sp -= merges_[static_cast<size_t>(k)];
    }
    PX_ASSERT(m <= 1 || sp == 1, "the microbatch merges must leave one partial");
    depth_ = m > 1 ? depth : 0;
    held_.push_back(make_held(shards_.rank_));
}

ZeroUnits::Held ZeroUnits::make_held(int rank) const {
    Held h;
    h.rank = rank;
    h.head_lo = model_.grad_layout().head_offset + shards_.head_edges_[static_cast<size_t>(rank)];
    h.head_hi = model_.grad_layout().head_offset + shards_.head_edges_[static_cast<size_t>(rank) + 1];
    const i64 n = (shards_.hi(rank) - shards_.lo(rank)) + (h.head_hi - h.head_lo);
    for (int d = 0; d < depth_; d++) h.partial.emplace_back(bytes_of(DType::f32, n));
    return h;
}

void ZeroUnits::hold_checked() {
    PX_ASSERT(shards_.checked() >= 0 && held_.size() == 1, "hold_checked: nothing to hold");
    held_.push_back(make_held(shards_.checked()));
}

i64 ZeroUnits::Held::slot(const ZeroShards& s, i64 i) const {
    if (i >= s.lo(rank) && i < s.hi(rank)) return i - s.lo(rank);
    PX_ASSERT(i >= head_lo && i < head_hi, "slot of a gradient this rank does not hold");
    return (s.hi(rank) - s.lo(rank)) + (i - head_lo);
}

i64 ZeroUnits::partial_bytes() const {
    i64 n = 0;
    for (const Held& h : held_)
        for (const Arena& p : h.partial) n += p.resident_bytes();
    return n;
}

void ZeroUnits::reset_peaks() {
    peak_params_ = model_.param_arena().resident_bytes();
    peak_grads_ = grads_.resident_bytes() + partial_bytes();
}

void ZeroUnits::note_peaks() {
    peak_params_ = std::max(peak_params_, model_.param_arena().resident_bytes());
    peak_grads_ = std::max(peak_grads_, grads_.resident_bytes() + partial_bytes());
}

void ZeroUnits::gather(Unit u) {
    float* params = model_.params();
    const int p = shards_.size();
    std::vector<i64> counts(static_cast<size_t>(p));
    for (const GradSpan& s : model_.unit_params(u)) {
        for (int r = 0; r < p; r++)
            counts[static_cast<size_t>(r)] =
                std::max<i64>(0, std::min(s.hi, shards_.hi(r)) - std::max(s.lo, shards_.lo(r)));
        const i64 from = std::clamp(shards_.lo(), s.lo, s.hi);
        const std::vector<float> mine(params + from,
                                      params + from + counts[static_cast<size_t>(shards_.rank_)]);
        dp_.all_gather_v(params + s.lo, mine.data(), counts);
    }
}

void ZeroUnits::release(Unit u) {
    Arena& params = model_.param_arena();
    for (const GradSpan& s : model_.unit_params(u)) {
        decommit_f32(params, s.lo, std::min(s.hi, shards_.lo()));
        decommit_f32(params, std::max(s.lo, shards_.hi()), s.hi);
    }
}

void ZeroUnits::before_forward(Unit u) {
    if (stage_ == 3) gather(u);
    note_peaks();
}

void ZeroUnits::after_forward(Unit u) {
    if (stage_ == 3) release(u);
}

// The embedding's backward reads no weights (it scatters d(encoded) into wte's and wpe's rows).
void ZeroUnits::before_backward(Unit u, float* grads) {
    PX_ASSERT(grads == grads_.f32(), "ZeroUnits hooks a backward into another gradient buffer");
    if (stage_ == 3 && u.kind != Unit::embedding) gather(u);
    for (const GradSpan& s : model_.unit_grads(u))
        std::memset(grads + s.lo, 0, static_cast<size_t>(s.hi - s.lo) * sizeof(float));
}

void ZeroUnits::after_backward(Unit u, float* grads) {
    note_peaks();  // the unit's full gradient and its weights are mapped now
    if (tap_)      // this microbatch's gradients of the unit, before they are reduced
        for (const GradSpan& s : model_.unit_grads(u)) tap_(grads, s.lo, s.hi);
    const bool twice = held_.size() > 1;
    for (const GradSpan& s : model_.unit_grads(u)) {
        const std::vector<i64> cuts = shards_.cuts_in(s.lo, s.hi);
        reduce_scatter_cut(dp_, grads, cuts, shards_.scratch_, twice);
        if (depth_ == 0) {  // one microbatch: the pieces are the step's; keep them in place
            std::vector<std::pair<i64, i64>> keep;
            for (const Held& h : held_)
                keep.push_back({cuts[static_cast<size_t>(h.rank)], cuts[static_cast<size_t>(h.rank) + 1]});
            std::sort(keep.begin(), keep.end());
            i64 from = s.lo;
            for (const auto& [a, b] : keep) {
                decommit_f32(grads_, from, a);
                from = std::max(from, b);
            }
            decommit_f32(grads_, from, s.hi);
            continue;
        }
        // This microbatch's node goes on the partials' stack, then siblings merge (job.cpp's
        // accumulation, restricted to this rank's pieces of this unit).
        for (Held& h : held_) {
            const i64 a = cuts[static_cast<size_t>(h.rank)], b = cuts[static_cast<size_t>(h.rank) + 1];
            if (a >= b) continue;
            const int merges = merges_[static_cast<size_t>(mb_)];
            int top = push_[static_cast<size_t>(mb_)];
            const i64 at = h.slot(shards_, a), n = b - a;
            const float* right = grads + a;  // this microbatch's node
            if (merges == 0)
                std::memcpy(h.partial[static_cast<size_t>(top)].f32() + at, right,
                            static_cast<size_t>(n) * sizeof(float));
            for (int j = 0; j < merges; j++, top--) {
                float* left = h.partial[static_cast<size_t>(top) - 1].f32() + at;
                for (i64 i = 0; i < n; i++) left[i] = left[i] + right[i];
                right = left;
            }
        }
        decommit_f32(grads_, s.lo, s.hi);
    }
    if (stage_ == 3 && u.kind != Unit::embedding) release(u);
}

void ZeroUnits::finish() {
    if (depth_ == 0) return;
    float* g = grads_.f32();
    for (Held& h : held_) {
        const float* sum = h.partial[0].f32();
        const i64 lo = shards_.lo(h.rank), n = shards_.hi(h.rank) - lo;
        std::memcpy(g + lo, sum, static_cast<size_t>(n) * sizeof(float));
        std::memcpy(g + h.head_lo, sum + n, static_cast<size_t>(h.head_hi - h.head_lo) * sizeof(float));
    }
    note_peaks();
    for (Held& h : held_)
        for (Arena& p : h.partial) p.decommit(0, p.bytes());  // until the next step's first node
}

}  // namespace px
