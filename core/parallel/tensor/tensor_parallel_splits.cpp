// The splits of a tensor-parallel group (tensor_parallel.h): a dimension cut into block-aligned
// ranges per rank and their canonical-tree plan, the shards of a model's tensors, the token slices
// of sequence parallelism.
#include "core/parallel/tensor/tensor_parallel.h"

#include "core/base/error.h"
#include "core/base/mathfun.h"

#include <algorithm>
#include <string>
#include <utility>

namespace px::tp {

namespace {

using std::to_string;

std::string str(const Range& r) {
    // Built by appending: "[" + std::string&& trips GCC 12's false -Wrestrict.
    std::string s = "[";
    s += to_string(r.lo);
    s += ',';
    s += to_string(r.hi);
    s += ')';
    return s;
}

}  // namespace

// ---- splits ----------------------------------------------------------------------------------

i64 DimSplit::local(int r) const {
    i64 n_local = 0;
    for (const Range& g : ranges[r]) n_local += g.size();
    return n_local;
}

i64 DimSplit::local_offset(int r, i64 e) const {
    i64 at = 0;
    for (const Range& g : ranges[r]) {
        if (e >= g.lo && e < g.hi) return at + (e - g.lo);
        at += g.size();
    }
    PX_ASSERT(false, "split '" + name + "': element " + to_string(e) + " is not rank " +
                         to_string(r) + "'s");
    return -1;
}

bool DimSplit::owns(int r, i64 e) const {
    for (const Range& g : ranges[r])
        if (e >= g.lo && e < g.hi) return true;
    return false;
}

Range DimSplit::elements(const Range& blocks) const {
    return {blocks.lo * block, std::min(n, blocks.hi * block)};
}

DimSplit make_split(std::string name, i64 n, int block, std::vector<std::vector<Range>> ranges) {
    if (block < 1) throw ConfigError("split '" + name + "': numerics.block must be at least 1");
    if (n < 0) throw ConfigError("split '" + name + "': negative extent " + to_string(n));
    DimSplit s;
    s.name = std::move(name);
    s.n = n;
    s.block = block;
    i64 covered = 0;
    std::vector<std::vector<Range>> blocks(ranges.size());
    for (size_t r = 0; r < ranges.size(); r++) {
        std::vector<Range> kept;
        for (const Range& g : ranges[r]) {
            if (g.lo == g.hi) continue;
            const std::string where = "split '" + s.name + "' (n = " + to_string(n) + "), rank " +
                                      to_string(r) + ", range " + str(g) + ": ";
            if (g.lo < 0 || g.hi > n || g.lo > g.hi)
                throw ConfigError(where + "is not inside [0, " + to_string(n) + ")");
            if (!kept.empty() && kept.back().hi > g.lo)
                throw ConfigError(where + "is not after the rank's previous range");
            if (g.lo % block != 0 || (g.hi % block != 0 && g.hi != n))
                throw ConfigError(
                    where +
                    "does not start and end on a multiple of numerics.block = " + to_string(block) +
                    " (a block cut between ranks would split a sequential sum); "
                    "choose tp or numerics.block so that shards are whole blocks");
            kept.push_back(g);
            covered += g.size();
            blocks[r].push_back({g.lo / block, num_blocks(g.hi, block)});
        }
        ranges[r] = std::move(kept);
    }
    try {
        s.plan = make_plan(num_blocks(n, block), blocks);
    } catch (const ConfigError&) {
        throw;
    } catch (const Error& e) {
        throw ConfigError("split '" + s.name + "': " + e.what());
    }
    if (covered != n)
        throw ConfigError("split '" + s.name + "': the ranks own " + to_string(covered) + " of " +
                          to_string(n) + " elements; every element needs exactly one owner");
    s.ranges = std::move(ranges);
    return s;
}

std::vector<i64> block_edges(i64 n, int block, int p) {
    PX_ASSERT(p >= 1 && block >= 1 && n >= 0, "block_edges: bad arguments");
    const i64 nb = num_blocks(n, block);
    std::vector<i64> eb(p + 1);
    if ((p & (p - 1)) == 0 && nb >= p) {
        // The tree's nodes at depth log2(p): each rank owns one node, sizes within one block.
        std::vector<Range> level{{0, nb}};
        while (static_cast<int>(level.size()) < p) {
            std::vector<Range> next;
            for (const Range& g : level) {
                const i64 mid = tree_mid(g.lo, g.hi);
                next.push_back({g.lo, mid});
                next.push_back({mid, g.hi});
            }
            level = std::move(next);
        }
        for (int r = 0; r < p; r++) eb[r] = level[r].lo;
    } else {
        // Equal pieces, except that a cut may move by up to nb/(32p) blocks (a few percent of a
        // piece) to where the fewest tree nodes straddle it: each straddling node costs the ranks
        // beside the cut one more partial. Ties go to the even position.
        auto straddling = [nb](i64 e) {
            int count = 0;
            for (i64 lo = 0, hi = nb; lo < e && e < hi; count++) {
                const i64 mid = tree_mid(lo, hi);
                if (e == mid) break;
                (e < mid ? hi : lo) = mid;
            }
            return count;
        };
        const i64 slack = nb / (32 * p);
        eb[0] = 0;
        for (int r = 1; r < p; r++) {
            const i64 even = nb * r / p;
            i64 best = even;
            for (i64 e = std::max(eb[r - 1], even - slack); e <= std::min(nb, even + slack); e++) {
                const int c = straddling(e), cb = straddling(best);
                if (c < cb || (c == cb && std::abs(e - even) < std::abs(best - even))) best = e;
            }
            eb[r] = best;
        }
    }
    eb[p] = nb;
    std::vector<i64> e(eb.size());
    for (size_t r = 0; r < eb.size(); r++) e[r] = std::min(n, eb[r] * block);
    return e;
}

TpShards make_tp_shards(const Numerics& nx, i64 C, i64 NH, i64 F, i64 V, int tp, i64 HS,
                        i64 KV) {
    const std::string t = "layout.tp = " + to_string(tp);
    if (tp < 1) throw ConfigError(t + " must be at least 1");
    if (HS == 0 && (NH < 1 || C % NH != 0))
        throw ConfigError("model.hidden = " + to_string(C) +
                          " is not a multiple of model.heads = " + to_string(NH));
    if (NH % tp != 0)
        throw ConfigError(t + " does not divide model.heads = " + to_string(NH) +
                          " (a rank owns whole heads)");
    if (F % tp != 0) throw ConfigError(t + " does not divide model.ffn = " + to_string(F));
    if (HS == 0) HS = C / NH;
    if (KV == 0) KV = NH;
    const i64 CA = NH * HS, Cr = CA / tp, Fr = F / tp;
    if (Cr % nx.block != 0 || Fr % nx.block != 0)
        throw ConfigError(
            t + " gives each rank " + to_string(Cr) + " attention channels and " + to_string(Fr) +
            " ffn channels; both must be multiples of numerics.block = " + to_string(nx.block) +
            " so that no canonical block is cut between ranks (lower the block or "
            "change tp)");
    TpShards s;
    s.tp = tp;
    s.C = C;
    s.NH = NH;
    s.F = F;
    s.V = V;
    s.HS = HS;
    s.KV = KV;
    s.heads = NH / tp;
    s.kv_split = KV % tp == 0;
    const i64 KVr = s.kv_split ? KV * HS / tp : KV * HS;
    if (s.kv_split && KV != NH && KVr % nx.block != 0)
        throw ConfigError(t + " gives each rank " + to_string(KVr) +
                          " key/value channels (model.kv_heads = " + to_string(KV) +
                          "); they must be a multiple of numerics.block = " + to_string(nx.block) +
                          " (lower the block or change tp)");
    std::vector<std::vector<Range>> qkv(tp), ch(tp), ffn(tp), voc(tp), kv(tp);
    const std::vector<i64> ve = block_edges(V, nx.block, tp);
    for (int r = 0; r < tp; r++) {
        for (i64 part = 0; part < 3; part++)  // q, k, v of this rank's heads
            qkv[r].push_back({part * CA + r * Cr, part * CA + (r + 1) * Cr});
        ch[r].push_back({r * Cr, (r + 1) * Cr});
        ffn[r].push_back({r * Fr, (r + 1) * Fr});
        voc[r].push_back({ve[r], ve[r + 1]});
        kv[r].push_back(s.kv_split ? Range{r * KVr, (r + 1) * KVr} : Range{0, KVr});
    }
    s.qkv = make_split("qkv rows", 3 * CA, nx.block, std::move(qkv));
    s.channels = make_split("attention channels", CA, nx.block, std::move(ch));
    s.ffn = make_split("ffn channels", F, nx.block, std::move(ffn));
    s.vocabulary = make_split("vocabulary", V, nx.block, std::move(voc));
    if (s.kv_split) s.kv = make_split("key/value channels", KV * HS, nx.block, std::move(kv));
    return s;
}

DimSplit token_split(const Numerics& nx, i64 BT, int tp) {
    const std::vector<i64> e = block_edges(BT, nx.block, tp);
    std::vector<std::vector<Range>> r(tp);
    for (int i = 0; i < tp; i++) r[i].push_back({e[i], e[i + 1]});
    return make_split("tokens", BT, nx.block, std::move(r));
}
}  // namespace px::tp
