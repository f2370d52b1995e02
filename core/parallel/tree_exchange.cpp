#include "core/parallel/tree_exchange.h"

#include "core/base/error.h"

#include <algorithm>
#include <string>
#include <utility>

namespace px {

namespace {

std::string str(const Range& r) {
    return "[" + std::to_string(r.lo) + "," + std::to_string(r.hi) + ")";
}

void collect(i64 lo, i64 hi, i64 a, i64 b, std::vector<Range>& out) {
    if (b <= lo || a >= hi) return;
    if (a <= lo && hi <= b) {
        out.push_back({lo, hi});
        return;
    }
    const i64 mid = tree_mid(lo, hi);
    collect(lo, mid, a, b, out);
    collect(mid, hi, a, b, out);
}

// Throws unless nodes are tree nodes of the tree over nb blocks, ascending and disjoint.
void check_nodes(i64 nb, std::span<const Range> nodes, const char* what) {
    for (size_t i = 0; i < nodes.size(); i++) {
        if (!is_tree_node(nb, nodes[i].lo, nodes[i].hi))
            throw Error(std::string(what) + ": " + str(nodes[i]) +
                        " is not a node of the canonical tree over " + std::to_string(nb) +
                        " blocks; pass the ranges through maximal_nodes first");
        if (i > 0 && nodes[i - 1].hi > nodes[i].lo)
            throw Error(std::string(what) + ": nodes " + str(nodes[i - 1]) + " and " +
                        str(nodes[i]) + " are not ascending and disjoint");
    }
}

// The value of tree node [lo, hi) from the present nodes i0..i1 inside it (ascending): left in
// rows[i0]; false when none is present. node = left + right, as tree_combine_rows.
bool combine_rec(i64 lo, i64 hi, size_t i0, size_t i1, const Range* nodes, float* const* rows,
                 i64 w) {
    if (i0 == i1) return false;
    if (i1 - i0 == 1) return true;  // the only present subtree: its value is the node's value
    const i64 mid = tree_mid(lo, hi);
    size_t im = i0;
    while (im < i1 && nodes[im].lo < mid) im++;
    const bool l = combine_rec(lo, mid, i0, im, nodes, rows, w);
    const bool r = combine_rec(mid, hi, im, i1, nodes, rows, w);
    if (l && r) {
        float* dst = rows[i0];
        const float* src = rows[im];
        for (i64 i = 0; i < w; i++) dst[i] = dst[i] + src[i];
    } else if (r) {
        std::copy_n(rows[im], w, rows[i0]);
    }
    return l || r;
}

// Whether ranks [rlo, rhi), one node each, combine in comm's rank tree exactly as in the block
// tree; `u` gets the union of their nodes.
bool rank_tree_rec(const NodePlan& plan, int rlo, int rhi, Range& u) {
    if (rhi - rlo == 1) {
        u = plan.nodes[rlo][0];
        return true;
    }
    const int rmid = rlo + (rhi - rlo + 1) / 2;
    Range l, r;
    if (!rank_tree_rec(plan, rlo, rmid, l) || !rank_tree_rec(plan, rmid, rhi, r)) return false;
    u = {l.lo, r.hi};
    return l.hi == r.lo && is_tree_node(plan.nb, l.lo, r.hi) && tree_mid(l.lo, r.hi) == l.hi;
}

// Cross-rank disjointness and the rank_tree flag.
void finish_plan(NodePlan& plan) {
    std::vector<std::pair<Range, int>> all;
    for (int r = 0; r < plan.size(); r++)
        for (const Range& n : plan.nodes[r]) all.push_back({n, r});
    std::sort(all.begin(), all.end(),
              [](const auto& a, const auto& b) { return a.first.lo < b.first.lo; });
    for (size_t i = 1; i < all.size(); i++)
        if (all[i - 1].first.hi > all[i].first.lo)
            throw Error("node plan: rank " + std::to_string(all[i - 1].second) + "'s blocks " +
                        str(all[i - 1].first) + " overlap rank " + std::to_string(all[i].second) +
                        "'s " + str(all[i].first) + "; every block needs at most one owner");
    plan.rank_tree = true;
    for (const auto& n : plan.nodes) plan.rank_tree = plan.rank_tree && n.size() == 1;
    Range u;
    plan.rank_tree = plan.rank_tree && plan.size() > 0 && rank_tree_rec(plan, 0, plan.size(), u);
}

bool any_node(const NodePlan& plan) {
    for (const auto& n : plan.nodes)
        if (!n.empty()) return true;
    return false;
}

void fill_identity(float* out, i64 n) {
    std::fill(out, out + n, -0.0f);
}

void check_group(const comm::Communicator& comm, const NodePlan& plan, const char* what) {
    if (plan.size() != comm.size())
        throw Error(std::string(what) + ": the node plan has " + std::to_string(plan.size()) +
                    " ranks but group '" + comm.group() + "' has " + std::to_string(comm.size()));
}

}  // namespace

// ---- nodes -----------------------------------------------------------------------------------

std::vector<Range> maximal_nodes(i64 nb, i64 lo, i64 hi) {
    if (lo < 0 || hi > nb || lo > hi)
        throw Error("maximal_nodes: block range " + str({lo, hi}) + " is not inside [0," +
                    std::to_string(nb) + ")");
    std::vector<Range> out;
    if (lo < hi) collect(0, nb, lo, hi, out);
    return out;
}

std::vector<Range> maximal_nodes(i64 nb, std::span<const Range> owned) {
    std::vector<Range> r;
    for (const Range& o : owned)
        if (o.lo < o.hi) r.push_back(o);
    std::sort(r.begin(), r.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
    std::vector<Range> merged;
    for (const Range& o : r) {
        if (!merged.empty() && merged.back().hi > o.lo)
            throw Error("maximal_nodes: owned block ranges " + str(merged.back()) + " and " +
                        str(o) + " overlap");
        if (!merged.empty() && merged.back().hi == o.lo)
            merged.back().hi = o.hi;
        else
            merged.push_back(o);
    }
    std::vector<Range> out;
    for (const Range& m : merged) {
        std::vector<Range> n = maximal_nodes(nb, m.lo, m.hi);
        out.insert(out.end(), n.begin(), n.end());
    }
    return out;
}

bool combine_nodes(i64 nb, std::span<const Range> nodes, float* values, i64 w) {
    check_nodes(nb, nodes, "combine_nodes");
    std::vector<float*> rows(nodes.size());
    for (size_t i = 0; i < nodes.size(); i++) rows[i] = values + static_cast<i64>(i) * w;
    return combine_rec(0, nb, 0, nodes.size(), nodes.data(), rows.data(), w);
}

// ---- plans -----------------------------------------------------------------------------------

NodePlan make_plan(i64 nb, const std::vector<std::vector<Range>>& owned_by_rank) {
    NodePlan plan;
    plan.nb = nb;
    for (const auto& owned : owned_by_rank) plan.nodes.push_back(maximal_nodes(nb, owned));
    finish_plan(plan);
    return plan;
}

NodePlan gather_plan(comm::Communicator& comm, i64 nb, std::span<const Range> my_nodes) {
    check_nodes(nb, my_nodes, "gather_plan");
    const int p = comm.size();
    i64 k = static_cast<i64>(my_nodes.size());
    std::vector<i64> ks(p);
    comm.all_gather(ks.data(), &k, 1);
    std::vector<i64> mine, counts(p);
    for (const Range& n : my_nodes) mine.insert(mine.end(), {n.lo, n.hi});
    i64 total = 0;
    for (int r = 0; r < p; r++) total += counts[r] = 2 * ks[r];
    std::vector<i64> all(total);
    comm.all_gather_v(all.data(), mine.data(), counts);
    NodePlan plan;
    plan.nb = nb;
    plan.nodes.resize(p);
    size_t at = 0;
    for (int r = 0; r < p; r++)
        for (i64 i = 0; i < ks[r]; i++, at += 2) plan.nodes[r].push_back({all[at], all[at + 1]});
    finish_plan(plan);
    return plan;
}

// ---- exchanges -------------------------------------------------------------------------------

bool reduce_scatter_nodes(comm::Communicator& comm, const NodePlan& plan, const float* values,
                          i64 w, std::span<const i64> edges, float* out, Path path) {
    check_group(comm, plan, "reduce_scatter_nodes");
    const int p = comm.size(), me = comm.rank();
    if (static_cast<int>(edges.size()) != p + 1 || edges[0] != 0 || edges[p] != w)
        throw Error("reduce_scatter_nodes: edges must hold " + std::to_string(p + 1) +
                    " ascending entries from 0 to w = " + std::to_string(w));
    for (int r = 0; r < p; r++)
        if (edges[r] > edges[r + 1])
            throw Error("reduce_scatter_nodes: edges are not ascending at rank " +
                        std::to_string(r));
    const i64 e0 = edges[me], len = edges[me + 1] - e0;
    if (!any_node(plan)) {
        fill_identity(out, len);
        return false;
    }
    const std::vector<Range>& my_nodes = plan.nodes[me];
    const i64 k = static_cast<i64>(my_nodes.size());

    if (p == 1) {  // the whole tree is here
        std::vector<float> work(values, values + k * w);
        combine_nodes(plan.nb, my_nodes, work.data(), w);
        std::copy_n(work.data(), len, out);
        return true;
    }
    if (path == Path::any && plan.rank_tree && w % p == 0) {
        bool equal = true;
        for (int r = 0; r <= p; r++) equal = equal && edges[r] == r * (w / p);
        if (equal) {
            comm.reduce_scatter(out, values, w / p, comm::Algo::canonical);
            return true;
        }
    }

    // Rank c receives element chunk c of every node value of every rank, node-major per sender.
    std::vector<i64> in_counts(p), out_counts(p);
    for (int c = 0; c < p; c++) in_counts[c] = k * (edges[c + 1] - edges[c]);
    for (int s = 0; s < p; s++) out_counts[s] = static_cast<i64>(plan.nodes[s].size()) * len;
    std::vector<float> send;
    const float* in = values;  // one node: its row is already chunk after chunk
    if (k > 1) {
        send.resize(k * w);
        float* dst = send.data();
        for (int c = 0; c < p; c++)
            for (i64 i = 0; i < k; i++) {
                const i64 n = edges[c + 1] - edges[c];
                std::copy_n(values + i * w + edges[c], n, dst);
                dst += n;
            }
        in = send.data();
    }
    i64 total = 0;
    for (i64 c : out_counts) total += c;
    std::vector<float> recv(total);
    comm.all_to_all_v(recv.data(), out_counts, in, in_counts);

    // Every node's chunk, in block order, then the tree.
    std::vector<std::pair<Range, float*>> rows;
    float* at = recv.data();
    for (int s = 0; s < p; s++)
        for (const Range& n : plan.nodes[s]) {
            rows.push_back({n, at});
            at += len;
        }
    std::sort(rows.begin(), rows.end(),
              [](const auto& a, const auto& b) { return a.first.lo < b.first.lo; });
    std::vector<Range> nodes(rows.size());
    std::vector<float*> ptrs(rows.size());
    for (size_t i = 0; i < rows.size(); i++) {
        nodes[i] = rows[i].first;
        ptrs[i] = rows[i].second;
    }
    combine_rec(0, plan.nb, 0, nodes.size(), nodes.data(), ptrs.data(), len);
    std::copy_n(ptrs[0], len, out);
    return true;
}

bool exchange_and_combine(comm::Communicator& comm, const NodePlan& plan, const float* values,
                          i64 w, float* out, Path path) {
    check_group(comm, plan, "exchange_and_combine");
    const int p = comm.size(), me = comm.rank();
    if (!any_node(plan)) {
        fill_identity(out, w);
        return false;
    }
    if (p > 1 && path == Path::any && plan.rank_tree) {
        std::copy_n(values, w, out);
        comm.all_reduce(out, w, comm::Algo::canonical);
        return true;
    }
    std::vector<i64> edges(p + 1), counts(p);
    for (int c = 0; c <= p; c++) edges[c] = comm::chunk_lo(w, p, c);
    for (int c = 0; c < p; c++) counts[c] = edges[c + 1] - edges[c];
    reduce_scatter_nodes(comm, plan, values, w, edges, out + edges[me], Path::general);
    if (p > 1) comm.all_gather_v(out, out + edges[me], counts);
    return true;
}

bool exchange_and_combine(comm::Communicator& comm, i64 nb, std::span<const Range> my_nodes,
                          const float* my_values, i64 w, float* out) {
    const NodePlan plan = gather_plan(comm, nb, my_nodes);
    return exchange_and_combine(comm, plan, my_values, w, out);
}

}  // namespace px
