// The canonical reduction tree (docs/numerics.md), checked against a worked example of 12 blocks
// and against the stack program that kernels use to build it.
#include "core/base/numerics.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace px;

namespace {

// Values of very different magnitudes, so that any other association gives other bits.
std::vector<float> awkward(int n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (int i = 0; i < n; i++) v[i] = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
    return v;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("tree_sum follows the canonical tree over 12 blocks") {
    const auto p = awkward(12, 1);
    const float expect = (((p[0] + p[1]) + p[2]) + ((p[3] + p[4]) + p[5])) +
                         (((p[6] + p[7]) + p[8]) + ((p[9] + p[10]) + p[11]));
    CHECK(same_bits(tree_sum(p.data(), 12), expect));
    // and it is not what a left-to-right sum gives for these values
    float seq = 0.0f;
    for (float x : p) seq += x;
    CHECK_FALSE(same_bits(seq, expect));
}

TEST_CASE("tree splits a node of n blocks at ceil(n/2)") {
    const auto p = awkward(5, 2);
    // [0,5) -> [0,3) [3,5); [0,3) -> [0,2) [2,3)
    CHECK(same_bits(tree_sum(p.data(), 5), ((p[0] + p[1]) + p[2]) + (p[3] + p[4])));
    CHECK(same_bits(tree_sum(p.data(), 1), p[0]));
    CHECK(tree_mid(0, 12) == 6);
    CHECK(tree_mid(0, 3) == 2);
    CHECK(tree_mid(4, 8) == 6);
}

TEST_CASE("merge schedule reproduces the tree for every block count up to 200") {
    for (int n = 1; n <= 200; n++) {
        const auto p = awkward(n, 100 + n);
        const MergeSchedule s = make_merge_schedule(n);
        std::vector<float> stack;
        size_t max_depth = 0;
        for (int j = 0; j < n; j++) {
            stack.push_back(p[j]);
            max_depth = std::max(max_depth, stack.size());
            for (int r = 0; r < s.merges_after[j]; r++) {
                const float top = stack.back();
                stack.pop_back();
                stack.back() = stack.back() + top;
            }
        }
        REQUIRE(stack.size() == 1);
        CHECK(same_bits(stack[0], tree_sum(p.data(), n)));
        CHECK(static_cast<int>(max_depth) <= s.depth);
    }
}

TEST_CASE("tree_combine_rows equals tree_sum per column and skips absent blocks") {
    const int nb = 7, w = 3;
    auto p = awkward(nb * w, 3);
    std::vector<float> col(nb);
    std::vector<float> expect(w);
    for (int c = 0; c < w; c++) {
        for (int b = 0; b < nb; b++) col[b] = p[b * w + c];
        expect[c] = tree_sum(col.data(), nb);
    }
    auto q = p;
    REQUIRE(tree_combine_rows(q.data(), nb, w));
    for (int c = 0; c < w; c++) CHECK(same_bits(q[c], expect[c]));

    // Absent blocks behave as if they were not there: [0,7) -> [0,4) [4,7); with blocks 1, 4, 5
    // absent the value is (p0 + (p2 + p3)) + p6.
    const unsigned char present[nb] = {1, 0, 1, 1, 0, 0, 1};
    q = p;
    REQUIRE(tree_combine_rows(q.data(), nb, w, present));
    for (int c = 0; c < w; c++)
        CHECK(same_bits(q[c], (p[0 * w + c] + (p[2 * w + c] + p[3 * w + c])) + p[6 * w + c]));
    const unsigned char none[nb] = {};
    CHECK_FALSE(tree_combine_rows(q.data(), nb, w, none));
}

TEST_CASE("canonical_sum and canonical_dot: sequential inside blocks, tree across") {
    const int n = 150, block = 64;  // blocks of 64, 64, 22
    const auto x = awkward(n, 4), y = awkward(n, 5);
    float part[3], dpart[3];
    for (int b = 0; b < 3; b++) {
        float acc = 0.0f, dacc = 0.0f;
        for (int i = b * block; i < std::min(n, (b + 1) * block); i++) {
            acc = acc + x[i];
            dacc = std::fma(x[i], y[i], dacc);
        }
        part[b] = acc;
        dpart[b] = dacc;
    }
    CHECK(same_bits(canonical_sum(x.data(), n, block), (part[0] + part[1]) + part[2]));
    CHECK(same_bits(canonical_dot(x.data(), y.data(), n, block), (dpart[0] + dpart[1]) + dpart[2]));
    CHECK(canonical_sum(x.data(), 0, block) == 0.0f);
}

TEST_CASE("is_tree_node names exactly the nodes of the tree") {
    // 12 blocks: tp=4 ranks each own one node of 3 blocks; tp=3 ranks (4 blocks) do not.
    for (int r = 0; r < 4; r++) CHECK(is_tree_node(12, 3 * r, 3 * r + 3));
    CHECK_FALSE(is_tree_node(12, 0, 4));
    CHECK_FALSE(is_tree_node(12, 4, 8));
    CHECK(is_tree_node(12, 0, 12));
    CHECK(is_tree_node(12, 6, 12));
    CHECK(is_tree_node(8, 2, 4));
    CHECK(is_tree_node(8, 5, 6));
    CHECK_FALSE(is_tree_node(8, 1, 3));
    CHECK_FALSE(is_tree_node(8, 0, 0));
}
