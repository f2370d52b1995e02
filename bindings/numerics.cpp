// The canonical reduction order from Python (core/base/numerics.h, core/parallel/tree_exchange.h):
// the library's own sums, and the nodes of its tree that a shard of a reduction owns, so that a
// notebook shows the order that runs, not a re-implementation of it.
#include "bindings/common.h"

#include "core/base/error.h"
#include "core/base/numerics.h"
#include "core/parallel/tree_exchange.h"

namespace px::py_bind {

namespace {

using F32 = py::array_t<float, py::array::c_style | py::array::forcecast>;

void check_block(int block) {
    if (block < 1) throw ConfigError("block = " + std::to_string(block) + " must be at least 1");
}

}  // namespace

void bind_numerics(py::module_& m) {
    m.def(
        "canonical_sum",
        [](const F32& x, int block) {
            check_block(block);
            return canonical_sum(x.data(), x.size(), block);
        },
        py::arg("x"), py::arg("block") = 64, R"doc(
The library's canonical fp32 sum of x (flattened): blocks of `block` elements summed in index
order from +0, block sums combined in the fixed binary tree (a node of n blocks splits at
ceil(n/2)). The same bits however the elements are shared out, as long as each share is whole
nodes of the tree.)doc");
    m.def(
        "canonical_dot",
        [](const F32& x, const F32& y, int block) {
            check_block(block);
            if (x.size() != y.size())
                throw ConfigError("canonical_dot: x has " + std::to_string(x.size()) +
                                  " elements and y " + std::to_string(y.size()));
            return canonical_dot(x.data(), y.data(), x.size(), block);
        },
        py::arg("x"), py::arg("y"), py::arg("block") = 64,
        "The canonical fp32 dot product (explicit FMA inside a block, then the tree).");
    m.def(
        "tree_sum",
        [](const F32& partials) { return tree_sum(partials.data(), partials.size()); },
        py::arg("partials"), "Block partials combined in the canonical tree.");
    m.def(
        "tree_nodes",
        [](i64 blocks, i64 lo, i64 hi) {
            if (blocks < 1 || lo < 0 || hi > blocks || lo > hi)
                throw ConfigError("tree_nodes: need 0 <= lo <= hi <= blocks and blocks >= 1");
            std::vector<std::pair<i64, i64>> out;
            for (const Range& r : maximal_nodes(blocks, lo, hi)) out.emplace_back(r.lo, r.hi);
            return out;
        },
        py::arg("blocks"), py::arg("lo"), py::arg("hi"), R"doc(
The maximal nodes [a, b) of the canonical tree over `blocks` blocks that lie inside blocks
[lo, hi): the partials a rank owning those blocks computes alone. E.g. tree_nodes(12, 4, 8) ==
[(4, 5), (5, 6), (6, 8)]: rank 1's nodes when 12 blocks are cut over tp = 3.)doc");
    m.def(
        "tree_split", [](i64 lo, i64 hi) { return tree_mid(lo, hi); }, py::arg("lo"), py::arg("hi"),
        "Where the tree splits the node [lo, hi) of blocks: lo + ceil((hi - lo) / 2).");
}

}  // namespace px::py_bind
