#include "views/teaching.h"

#include "core/base/error.h"
#include "core/base/numerics.h"
#include "core/base/rng.h"
#include "core/comm/run_ranks.h"
#include "validators/compare.h"

#include <cmath>
#include <cstdio>
#include <mutex>

namespace px::views {

void ScheduleModel::make() {
    error.clear();
    schedule = Schedule{};
    sim = SimResult{};
    try {
        const ScheduleKind k = parse_schedule(kind);
        if (k == ScheduleKind::zbv) virtual_stages = 2;  // its V
        schedule = make_schedule(k, pp, microbatches, virtual_stages);
        sim = check_schedule(schedule, kUnitFBW);
    } catch (const Error& e) {
        error = e.what();
        schedule = Schedule{};
    }
}

double bubble_formula(int pp, int microbatches, int virtual_stages) {
    return (pp - 1.0) / (static_cast<double>(virtual_stages) * microbatches + pp - 1.0);
}

double bubble_rate_formula(const std::string& kind, int pp, int microbatches,
                           int virtual_stages) {
    const double p1 = pp - 1.0, m = microbatches;
    if (kind == "interleaved") return p1 / (virtual_stages * m);
    if (kind == "zb-h1") return p1 / (3 * m);
    if (kind == "zbv") return p1 / (6 * m);
    return p1 / m;
}

std::string compute_label(const Action& a, int virtual_stages) {
    char buf[32];
    const char letter = a.kind == Action::forward           ? 'F'
                        : a.kind == Action::backward_weight ? 'W'
                                                            : 'B';
    if (virtual_stages > 1)
        std::snprintf(buf, sizeof buf, "%c%d%c", letter, a.microbatch,
                      static_cast<char>('a' + a.chunk % 26));
    else
        std::snprintf(buf, sizeof buf, "%c%d", letter, a.microbatch);
    return buf;
}

namespace {

// Block b of p ranks' even split of nb blocks: [r·nb/p, (r+1)·nb/p).
Range rank_blocks(i64 nb, int p, int r) {
    return {nb * r / p, nb * (r + 1) / p};
}

// The canonical sum with the blocks spread over p ranks, as tp or dp ranks form it: each rank
// computes its maximal nodes alone, then the nodes combine in the tree (tree_exchange.h).
float canonical_over_ranks(const std::vector<float>& x, int block, int p,
                           std::vector<std::vector<Range>>* nodes_out) {
    const i64 n = static_cast<i64>(x.size());
    const i64 nb = num_blocks(n, block);
    std::vector<Range> nodes;
    std::vector<float> values;
    if (nodes_out) nodes_out->clear();
    for (int r = 0; r < p; r++) {
        const Range own = rank_blocks(nb, p, r);
        const std::vector<Range> mine = maximal_nodes(nb, own.lo, own.hi);
        if (nodes_out) nodes_out->push_back(mine);
        for (const Range& k : mine) {
            const i64 lo = k.lo * block, hi = std::min(n, k.hi * block);
            nodes.push_back(k);
            values.push_back(canonical_sum(x.data() + lo, hi - lo, block));
        }
    }
    combine_nodes(nb, nodes, values.data(), 1);
    return values[0];
}

// Each rank's canonical partial of its contiguous share, then the communicator's all-reduce
// (ring or canonical over rank index) across p in-process ranks.
float all_reduce_over_ranks(const std::vector<float>& x, int block, int p, comm::Algo algo) {
    const i64 n = static_cast<i64>(x.size());
    const i64 nb = num_blocks(n, block);
    float result = 0;
    std::mutex mu;
    comm::run_ranks(p, 10.0, [&](comm::Communicator& c) {
        const Range own = rank_blocks(nb, p, c.rank());
        const i64 lo = own.lo * block, hi = std::min(n, own.hi * block);
        float v = canonical_sum(x.data() + lo, hi - lo, block);
        c.all_reduce(&v, 1, algo);
        if (c.rank() == 0) {
            std::lock_guard lk(mu);
            result = v;
        }
    });
    return result;
}

// A plain loop split over t threads: each sums its share in index order, then the shares add
// left to right (what an OpenMP reduction does, with the split depending on the thread count).
float thread_split(const std::vector<float>& x, int t) {
    const size_t n = x.size();
    float total = 0;
    for (int k = 0; k < t; k++) {
        float s = 0;
        for (size_t i = n * k / t; i < n * (k + 1) / t; i++) s += x[i];
        total += s;
    }
    return total;
}

}  // namespace

void NumericsModel::make() {
    // Values of mixed sign and magnitudes spanning six decades, so that orders differ in fp32.
    x.assign(static_cast<size_t>(n), 0.0f);
    for (int i = 0; i < n; i++) {
        const double mag = std::pow(
            10.0, 6.0 * uniform_at(static_cast<u64>(seed), 902, static_cast<u64>(i)) - 3.0);
        x[static_cast<size_t>(i)] =
            static_cast<float>(normal_at(static_cast<u64>(seed), 901, static_cast<u64>(i)) * mag);
    }
    exact = 0;
    for (float v : x) exact += static_cast<double>(v);

    rows.clear();
    const float tree = canonical_sum(x.data(), n, block);
    auto add = [&](std::string how, float v, bool canonical) {
        SumRow r;
        r.how = std::move(how);
        r.value = v;
        r.canonical = canonical;
        r.ulp_vs_tree = ulp_distance(v, tree);
        r.error_vs_exact = std::fabs(static_cast<double>(v) - exact);
        rows.push_back(std::move(r));
    };
    add("canonical tree, one device", tree, true);
    for (int p : {2, 3, 4})
        add("canonical tree, blocks over " + std::to_string(p) + " ranks (nodes exchanged)",
            canonical_over_ranks(x, block, p, nullptr), true);
    for (int p : {2, 3, 4})
        add("ring all_reduce of " + std::to_string(p) + " ranks' partials",
            all_reduce_over_ranks(x, block, p, comm::Algo::ring), false);
    for (int t : {1, 2, 3, 4})
        add("plain loop, " + std::to_string(t) + " thread" + (t > 1 ? "s" : "") + ", shares added",
            thread_split(x, t), false);
    canonical_over_ranks(x, block, split, &nodes);
}

}  // namespace px::views
