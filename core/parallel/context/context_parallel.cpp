// Context parallelism: the zig-zag split, the ring and Ulysses attention (context_parallel.h).
#include "core/parallel/context/context_parallel.h"

#include "core/base/error.h"
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace px {

namespace {

constexpr int kRingTag = 0x4350;  // "CP": the ring's messages, in hop order

void zero_fill(std::vector<float>& v, i64 n) {
    v.assign(static_cast<size_t>(n), 0.0f);
}

void grow(std::vector<float>& v, i64 n) {
    if (static_cast<i64>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

}  // namespace

// ---- the split -------------------------------------------------------------------------------

std::vector<PositionRun> zigzag_runs(i64 T, int cp, int rank) {
    PX_ASSERT(cp >= 1 && rank >= 0 && rank < cp, "zigzag_runs: rank outside the cp group");
    if (cp == 1) return {{0, T, 0}};
    PX_ASSERT(T % (2 * cp) == 0, "zigzag_runs: the sequence does not cut into 2·cp chunks");
    const i64 n = T / (2 * cp);
    const i64 first = rank * n, second = (2 * cp - 1 - rank) * n;
    if (second == first + n) return {{0, 2 * n, first}};
    return {{0, n, first}, {n, 2 * n, second}};
}

std::vector<i64> zigzag_positions(i64 T, int cp, int rank) {
    std::vector<i64> pos;
    for (const PositionRun& r : zigzag_runs(T, cp, rank))
        for (i64 i = r.lo; i < r.hi; i++) pos.push_back(r.pos + (i - r.lo));
    return pos;
}

std::vector<Range> cp_owned_blocks(i64 T, int cp, int rank, int block, i64 s_lo, i64 s_hi) {
    std::vector<Range> out;
    for (i64 s = s_lo; s < s_hi; s++)
        for (const PositionRun& r : zigzag_runs(T, cp, rank)) {
            const i64 lo = s * T + r.pos, hi = lo + (r.hi - r.lo);
            PX_ASSERT(lo % block == 0 && hi % block == 0,
                      "cp_owned_blocks: a chunk that is not whole token blocks");
            const Range b{lo / block, hi / block};
            if (!out.empty() && out.back().hi == b.lo)
                out.back().hi = b.hi;
            else
                out.push_back(b);
        }
    return out;
}

// ---- the layers ------------------------------------------------------------------------------

CpAttention::CpAttention(comm::Communicator& cp, CpMethod method, i64 seq_len, int block)
    : comm_(cp), method_(method), size_(cp.size()), rank_(cp.rank()), block_(block), T_(seq_len) {
    const i64 nkb = num_blocks(T_, block_);
    for (int r = 0; r < size_; r++) {
        pos_.push_back(zigzag_positions(T_, size_, r));
        std::vector<Range> owned;
        for (const PositionRun& run : zigzag_runs(T_, size_, r))
            owned.push_back({run.pos / block_, (run.pos + run.hi - run.lo) / block_});
        nodes_.push_back(maximal_nodes(nkb, owned));
    }
}

std::shared_ptr<CpAttention> make_cp_attention(comm::Communicator& cp, CpMethod method, i64 seq_len,
                                               int block) {
    if (cp.size() > 1 &&
        (seq_len % (2 * cp.size()) != 0 || (seq_len / (2 * cp.size())) % block != 0))
        throw ConfigError(
            "layout.cp=" + std::to_string(cp.size()) + " cuts model.seq_len=" +
            std::to_string(seq_len) + " into " + std::to_string(2 * cp.size()) +
            " chunks that are not whole blocks of numerics.block=" + std::to_string(block));
    return std::make_shared<CpAttention>(cp, method, seq_len, block);
}

i64 CpAttention::staging_bytes() const {
    const size_t n = kv_.capacity() + send_.capacity() + recv_.capacity() + heads_.capacity() +
                     heads2_.capacity() + heads3_.capacity() + parts_.capacity();
    return static_cast<i64>(n * sizeof(float));
}

// Every rank's keys and values at their positions: cp-1 hops around the ring. A block is sent
// on as soon as it is here, and `arrived` (when given) computes with it while it travels: the
// rank's own block first, then each one that came, the last after the last hop.
void CpAttention::ring_gather(const Tensor& qkv, const std::function<void(int)>& arrived) const {
    const i64 B = qkv.shape[0], Tl = qkv.shape[1], C3 = qkv.shape[2], C = C3 / 3, T = Tl * size_;
    const float* q = qkv.f32();
    grow(kv_, B * T * C3);
    const i64 n = B * Tl * 2 * C;
    grow(send_, n);
    grow(recv_, n);
    float* cur = send_.data();
    float* next = recv_.data();
    for (i64 r = 0; r < B * Tl; r++)
        std::memcpy(cur + r * 2 * C, q + r * C3 + C, static_cast<size_t>(2 * C) * sizeof(float));
    auto place = [&](const float* blk, int owner) {
        const std::vector<i64>& pos = pos_[static_cast<size_t>(owner)];
        for (i64 b = 0; b < B; b++)
            for (i64 t = 0; t < Tl; t++)
                std::memcpy(kv_.data() + (b * T + pos[static_cast<size_t>(t)]) * C3 + C,
                            blk + (b * Tl + t) * 2 * C, static_cast<size_t>(2 * C) * sizeof(float));
    };
    place(cur, rank_);
    const int to = (rank_ + 1) % size_, from = (rank_ + size_ - 1) % size_;
    for (int hop = 0; hop + 1 < size_; hop++) {
        comm::Handle h = comm_.send_async(cur, n, to, kRingTag);
        if (arrived) arrived((rank_ + size_ - hop) % size_);  // cur's owner, while cur travels
        comm_.recv(next, n, from, kRingTag);
        h.wait();
        std::swap(cur, next);
        place(cur, (rank_ + size_ - 1 - hop) % size_);
    }
    if (arrived) arrived((rank_ + 1) % size_);
}

// Channels [o·W/p, (o+1)·W/p) of each of `parts` groups of W go to rank o; rank r's rows land at
// its positions. out (B, T, parts·W/p); in (B, Tl, parts·W).
void CpAttention::to_heads(float* out, const float* in, i64 B, i64 Tl, i64 W, int parts) const {
    const i64 Wc = W / size_, row = parts * Wc, n = B * Tl * row, T = Tl * size_;
    grow(send_, n * size_);
    grow(recv_, n * size_);
    for (int o = 0; o < size_; o++)
        for (i64 r = 0; r < B * Tl; r++)
            for (int p = 0; p < parts; p++)
                std::memcpy(send_.data() + o * n + r * row + p * Wc,
                            in + r * parts * W + p * W + o * Wc,
                            static_cast<size_t>(Wc) * sizeof(float));
    comm_.all_to_all(recv_.data(), send_.data(), n);
    for (int s = 0; s < size_; s++) {
        const std::vector<i64>& pos = pos_[static_cast<size_t>(s)];
        for (i64 b = 0; b < B; b++)
            for (i64 t = 0; t < Tl; t++)
                std::memcpy(out + (b * T + pos[static_cast<size_t>(t)]) * row,
                            recv_.data() + s * n + (b * Tl + t) * row,
                            static_cast<size_t>(row) * sizeof(float));
    }
}

// The reverse of to_heads: out (B, Tl, parts·W) assigned from in (B, T, parts·W/p).
void CpAttention::from_heads(float* out, const float* in, i64 B, i64 Tl, i64 W, int parts) const {
    const i64 Wc = W / size_, row = parts * Wc, n = B * Tl * row, T = Tl * size_;
    grow(send_, n * size_);
    grow(recv_, n * size_);
    for (int s = 0; s < size_; s++) {
        const std::vector<i64>& pos = pos_[static_cast<size_t>(s)];
        for (i64 b = 0; b < B; b++)
            for (i64 t = 0; t < Tl; t++)
                std::memcpy(send_.data() + s * n + (b * Tl + t) * row,
                            in + (b * T + pos[static_cast<size_t>(t)]) * row,
                            static_cast<size_t>(row) * sizeof(float));
    }
    comm_.all_to_all(recv_.data(), send_.data(), n);
    for (int o = 0; o < size_; o++)
        for (i64 r = 0; r < B * Tl; r++)
            for (int p = 0; p < parts; p++)
                std::memcpy(out + r * parts * W + p * W + o * Wc,
                            recv_.data() + o * n + r * row + p * Wc,
                            static_cast<size_t>(Wc) * sizeof(float));
}

void CpAttention::attention_forward(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                                    const Tensor& att, const Tensor& qkv, i64 NH) const {
    const i64 B = qkv.shape[0], Tl = qkv.shape[1], C = qkv.shape[2] / 3, T = Tl * size_;
    PX_ASSERT(T == T_, "context-parallel attention on a sequence of another length");
    if (method_ == CpMethod::ring) {  // each block's scores as it comes, then the softmax
        const i64* pos = pos_[static_cast<size_t>(rank_)].data();
        ring_gather(qkv, [&](int owner) {
            const Tensor kv = view_f32(kv_.data(), {B, T, 3 * C}, "kv");
            for (const PositionRun& r : zigzag_runs(T, size_, owner))
                ops::attention_queries_scores(nx, preatt, qkv, kv, pos, r.pos,
                                              r.pos + (r.hi - r.lo), NH);
        });
        ops::attention_queries_softmax(nx, out, preatt, att,
                                       view_f32(kv_.data(), {B, T, 3 * C}, "kv"), pos, NH);
        return;
    }
    const i64 Cc = C / size_, NHc = NH / size_;
    grow(heads_, B * T * 3 * Cc);
    grow(heads2_, B * T * Cc);
    to_heads(heads_.data(), qkv.f32(), B, Tl, C, 3);
    ops::attention_forward(nx, view_f32(heads2_.data(), {B, T, Cc}, "atty heads"),
                           view_f32(preatt.f32(), {B, NHc, T, T}, "preatt heads"),
                           view_f32(att.f32(), {B, NHc, T, T}, "att heads"),
                           view_f32(heads_.data(), {B, T, 3 * Cc}, "qkv heads"), NHc);
    from_heads(out.f32(), heads2_.data(), B, Tl, C, 1);
}

void CpAttention::attention_backward(const Numerics& nx, const Tensor& dqkv, const Tensor& dpreatt,
                                     const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                                     const Tensor& att, i64 NH) const {
    const i64 B = qkv.shape[0], Tl = qkv.shape[1], C = qkv.shape[2] / 3, T = Tl * size_;
    if (method_ == CpMethod::ulysses) {
        const i64 Cc = C / size_, NHc = NH / size_;
        grow(heads_, B * T * 3 * Cc);
        grow(heads2_, B * T * Cc);
        zero_fill(heads3_, B * T * 3 * Cc);
        to_heads(heads_.data(), qkv.f32(), B, Tl, C, 3);
        to_heads(heads2_.data(), dout.f32(), B, Tl, C, 1);
        ops::attention_backward(nx, view_f32(heads3_.data(), {B, T, 3 * Cc}, "dqkv heads"),
                                view_f32(dpreatt.f32(), {B, NHc, T, T}, "dpreatt heads"),
                                view_f32(datt.f32(), {B, NHc, T, T}, "datt heads"),
                                view_f32(heads2_.data(), {B, T, Cc}, "datty heads"),
                                view_f32(heads_.data(), {B, T, 3 * Cc}, "qkv heads"),
                                view_f32(att.f32(), {B, NHc, T, T}, "att heads"), NHc);
        // dqkv is zero here (the model clears it): assigning x gives the kernel's 0 + x.
        from_heads(dqkv.f32(), heads3_.data(), B, Tl, C, 3);
        return;
    }
    // Ring: the keys and values again, dq and this rank's node values of dk, dv for every key.
    ring_gather(qkv, {});
    const std::vector<Range>& mine = nodes_[static_cast<size_t>(rank_)];
    const i64 K = static_cast<i64>(mine.size()), HS = C / NH;
    std::vector<i64> lo, hi;
    for (const Range& r : mine) {
        lo.push_back(r.lo);
        hi.push_back(r.hi);
    }
    grow(parts_, B * NH * T * K * 2 * HS);
    const Tensor kv = view_f32(kv_.data(), {B, T, 3 * C}, "kv");
    ops::attention_queries_backward(
        nx, dqkv, view_f32(parts_.data(), {B * NH * T * K * 2 * HS}, "parts"), dpreatt, datt, dout,
        qkv, kv, att, pos_[static_cast<size_t>(rank_)].data(), lo.data(), hi.data(), K, NH);
    // To every key's owner: its keys' node values, Kmax slots per key (-0 past a rank's nodes).
    i64 Kmax = 0;
    for (const auto& n : nodes_) Kmax = std::max<i64>(Kmax, static_cast<i64>(n.size()));
    const i64 w = 2 * HS, per = B * NH * Tl * Kmax * w;
    std::vector<float> out(static_cast<size_t>(per * size_), -0.0f), in(out.size());
    for (int o = 0; o < size_; o++) {
        const std::vector<i64>& pos = pos_[static_cast<size_t>(o)];
        for (i64 bh = 0; bh < B * NH; bh++)
            for (i64 t = 0; t < Tl; t++)
                std::memcpy(out.data() + o * per + (bh * Tl + t) * Kmax * w,
                            parts_.data() + (bh * T + pos[static_cast<size_t>(t)]) * K * w,
                            static_cast<size_t>(K * w) * sizeof(float));
    }
    comm_.all_to_all(in.data(), out.data(), per);
    // Every rank's nodes in the tree's order; a key's present nodes end past it.
    struct Held {
        Range node;
        int rank;
        i64 k;
    };
    std::vector<Held> all;
    for (int r = 0; r < size_; r++)
        for (size_t k = 0; k < nodes_[static_cast<size_t>(r)].size(); k++)
            all.push_back({nodes_[static_cast<size_t>(r)][k], r, static_cast<i64>(k)});
    std::sort(all.begin(), all.end(),
              [](const Held& a, const Held& b) { return a.node.lo < b.node.lo; });
    const i64 nkb = num_blocks(T, block_);
    const float scale = 1.0f / std::sqrt(float(HS));
    const std::vector<i64>& pos = pos_[static_cast<size_t>(rank_)];
    float* dq = dqkv.f32();
#pragma omp parallel
    {
        std::vector<Range> nodes;
        std::vector<float> vals(all.size() * static_cast<size_t>(w));
#pragma omp for schedule(static)
        for (i64 bt = 0; bt < B * Tl; bt++) {
            const i64 b = bt / Tl, t = bt % Tl, p = pos[static_cast<size_t>(t)];
            for (i64 h = 0; h < NH; h++) {
                nodes.clear();
                for (const Held& x : all) {
                    if (std::min(T, x.node.hi * block_) <= p) continue;  // no query t >= p
                    std::memcpy(
                        vals.data() + nodes.size() * static_cast<size_t>(w),
                        in.data() + x.rank * per + (((b * NH + h) * Tl + t) * Kmax + x.k) * w,
                        static_cast<size_t>(w) * sizeof(float));
                    nodes.push_back(x.node);
                }
                if (!combine_nodes(nkb, nodes, vals.data(), w)) continue;
                float* dk = dq + bt * 3 * C + C + h * HS;
                float* dv = dq + bt * 3 * C + 2 * C + h * HS;
                for (i64 i = 0; i < HS; i++) dk[i] += vals[static_cast<size_t>(i)] * scale;
                for (i64 i = 0; i < HS; i++) dv[i] += vals[static_cast<size_t>(HS + i)];
            }
        }
    }
}

float CpAttention::logit_max(const Numerics& nx, const Tensor& preatt, i64 /*NH*/) const {
    const i64 T = T_;
    float best = -std::numeric_limits<float>::infinity(), row = 0;
    const Tensor out = view_f32(&row, {1}, "logit_max");
    const i64 rows = preatt.numel() / T;
    const std::vector<i64>& pos = pos_[static_cast<size_t>(rank_)];
    const i64 Tl = static_cast<i64>(pos.size());
    for (i64 r = 0; r < rows; r++) {
        // Ring: rows are this rank's queries; Ulysses: whole sequences of its heads.
        const i64 t = method_ == CpMethod::ring ? pos[static_cast<size_t>(r % Tl)] : r % T;
        ops::row_max(nx, out, subview(preatt, r * T, {1, t + 1}));
        best = std::max(best, row);
    }
    return best;
}

CpCosts cp_costs(const Layout& l, i64 layers, i64 micro_B) {
    CpCosts c;
    if (l.cp <= 1) return c;
    const double cp = l.cp, B = double(micro_B), Tl = double(l.local_seq_len()),
                 T = double(l.seq_len), C = double(l.hidden / l.tp), NH = double(l.heads / l.tp);
    const i64 nkb = num_blocks(l.seq_len, l.block);
    double K = 0;
    for (int r = 0; r < l.cp; r++) {
        std::vector<Range> owned;
        for (const PositionRun& run : zigzag_runs(l.seq_len, l.cp, r))
            owned.push_back({run.pos / l.block, (run.pos + run.hi - run.lo) / l.block});
        K = std::max(K, double(maximal_nodes(nkb, owned).size()));
    }
    double fwd = 0, bwd = 0;
    if (l.cp_method == CpMethod::ring) {
        fwd = (cp - 1) * B * Tl * 2 * C;
        bwd = fwd + (cp - 1) * B * Tl * K * 2 * C;
    } else {
        fwd = (cp - 1) / cp * B * Tl * 4 * C;
        bwd = (cp - 1) / cp * B * Tl * 7 * C;
    }
    const double per_layer = fwd * (l.recompute == Recompute::full ? 2 : 1) + bwd;
    c.comm_bytes_per_step = 4 * per_layer * double(layers) * double(l.microbatches);
    const double kept =
        l.recompute == Recompute::full ? std::min<double>(double(layers), 1) : double(layers);
    c.attention_bytes = 4 * B * NH * Tl * T * (kept + 2);
    return c;
}

}  // namespace px
