// Numerics modes and the canonical reduction order (DESIGN.md §2).
//
// Index
//   Mode, Isa, Numerics      what a kernel is told about how to compute
//   detect_isa, isa_name     run-time CPU feature detection
//   num_blocks               blocks of a reduced dimension
//   tree_*                   the canonical binary tree over blocks
//   MergeSchedule            the tree as a post-order list of pushes and merges, for kernels that
//                            produce block partials left to right and combine them on a small stack
//   is_tree_node             whether a block range is one node of the tree (microbatch ranges)
//
// The contract. A reduction over a dimension of n elements is cut into blocks of `block`
// elements. Inside a block the sum runs sequentially in index order in fp32, starting from +0,
// with explicit FMA where it is a sum of products. Block results combine in a fixed binary tree
// over block indices: a node of m blocks splits at ceil(m/2), and its value is left + right.
// Empty subtrees (all of their elements masked, e.g. future keys under a causal mask) are skipped.
#pragma once
#include "core/base/shapes.h"

#include <string>
#include <vector>

namespace px {

enum class Mode { bitwise, fast };
inline constexpr int kNumModes = 2;
enum class Isa { scalar, avx2, avx512 };

Isa detect_isa();                  // best path this CPU supports

struct Numerics {
    Mode mode = Mode::bitwise;  // bitwise: canonical order everywhere; fast: any order, oneDNN
    int block = 64;             // canonical block size of every reduction
    Isa isa = detect_isa();     // vector path; forced by config or tests (same bits on every path)
};

const char* isa_name(Isa isa);     // "scalar", "avx2", "avx512"
const char* mode_name(Mode mode);  // "bitwise", "fast"

inline i64 num_blocks(i64 n, int block) { return (n + block - 1) / block; }

// Split point of a node [lo, hi) of blocks.
inline i64 tree_mid(i64 lo, i64 hi) { return lo + (hi - lo + 1) / 2; }

// Combine nb partial rows of width w, stored contiguously as p[nb][w], in the canonical tree.
// The result is left in p[0..w). `present[j]` (optional) marks blocks that hold any element;
// absent subtrees are skipped. Returns false when no block is present (p[0..w) untouched).
bool tree_combine_rows(float* p, i64 nb, i64 w, const unsigned char* present = nullptr);

// Scalar variant: canonical tree over nb block partials.
float tree_sum(const float* partials, i64 nb);

// Canonical sum / dot / sum of squares of a contiguous fp32 vector (scalar reference path,
// correct for any n; kernels may vectorise across independent reductions instead).
float canonical_sum(const float* x, i64 n, int block);
float canonical_dot(const float* x, const float* y, i64 n, int block);
double canonical_sum_f64(const double* x, i64 n, int block);  // same tree, in fp64, for references

// The tree as a post-order program: after producing block j (left to right), merge the
// top of the stack `merges_after[j]` times (node = below + top). The stack never exceeds `depth`.
struct MergeSchedule {
    i64 nb = 0;
    int depth = 0;
    std::vector<unsigned char> merges_after;
};
MergeSchedule make_merge_schedule(i64 nb);

// True when blocks [lo, hi) form exactly one node of the tree over nb blocks.
bool is_tree_node(i64 nb, i64 lo, i64 hi);

}  // namespace px
