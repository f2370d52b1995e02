// Numerics modes and the canonical reduction order (docs/numerics.md).
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
//
// The narrow accumulator (Numerics::fp8_promote = N > 0): Hopper's FP8 tensor cores sum products
// in an accumulator of about 14 significant bits, and DeepSeek-V3 promotes (adds) the partial sum
// into an fp32 register every N = 128 products. Emulated inside a block of a matmul's K (the
// tree above the blocks is unchanged): the block's fp32 sum starts at +0; its products, in index
// order, are cut into segments of N counted from the block's first element; a segment's narrow
// sum starts at +0 and after every product is s = trunc(fma(a, b, s)), where trunc keeps 13
// explicit mantissa bits of the fp32 result (the low 10 cleared: round toward zero); at a
// segment's end the block sum becomes block + s. Why truncation: public measurements of H100's
// FP8 MMA report an e8m13 accumulator whose results equal fp32 sums with the low 10 mantissa bits
// truncated (not rounded), which is also what a fixed-width aligned adder without rounding logic
// does; here the fma rounds once to fp32 before the truncation (a model, not the hardware's adder,
// whose products are exact and aligned to the largest exponent of a group). A segment never
// spans two blocks (precision.fp8_accumulator_promote <= numerics.block is checked), so the
// emulation changes only in-block sums and every layout that is exact without it stays exact.
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
    // > 0: a matmul's products are summed in the narrow accumulator, promoted to fp32 every
    // fp8_promote products (below); the fp8 linears' numerics under
    // precision.fp8_accumulator_promote, in either mode (the emulation has no fast form).
    int fp8_promote = 0;
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
