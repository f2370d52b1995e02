// Test-only mutations: deliberate, known bugs in the code under test, which a test arms around a
// layout's run to prove that the validation harness (validators/validate.h) names exactly the
// step, the op, the rank and the element where each one acts. Nothing arms a mutation in a normal
// run; where the hooks sit they cost one atomic load. A mutation strikes only the ranks of a
// parallel layout (a job with a dp group, or tp layers), never the single-device reference the
// harness compares with.
//
// Index
//   Kind, Mutation  what to break, where and when
//   Armed           arms a mutation for its scope (process-wide: every rank's thread sees it)
//   armed           the armed mutation, or null
//   strikes         whether the armed mutation is of a kind and strikes a step, rank and layer
//   strike_gradient flip_grad and drop_microbatch on a microbatch's gradient buffer
//   PartialSwap     swap_partials as the all_reduce carries it (comm::Request::swap)
//   set_swap/take_swap  the job hands a swap to its thread's next all_reduce
//
// The mutations:
//   swap_partials    step s, the data-parallel gradient all-reduce (ZeRO-0/1): the partials of dp
//                    ranks `rank` and `other` trade places in the canonical tree, for the elements
//                    of parameter `tensor` (both comm backends). Sums are not associative, so
//                    with three or more partials the reduced gradient changes on every rank.
//   flip_grad        step s, dp rank `rank`, its local microbatch `microbatch`: the lowest mantissa
//                    bit of element `element` of parameter `tensor`'s gradient, as backward leaves
//                    it (before it joins the other microbatches and ranks: under ZeRO-2/3 before
//                    its unit's reduce-scatter; in a pipeline on the stage that holds it).
//   drop_microbatch  step s, dp rank `rank`: its local microbatch `microbatch` contributes no
//                    gradient (in a pipeline, on every stage of that replica).
//   tp_offset        step s, tp rank `rank`, block `layer`: mlp.fc's forward reads its weight shard
//                    one row off (row i+1 for row i, the last wrapping to the first).
#pragma once
#include "core/arena.h"   // ParamTable
#include "core/shapes.h"  // i64

#include <cstdint>
#include <string>

namespace px::mutation {

enum class Kind : std::uint8_t { none, swap_partials, flip_grad, drop_microbatch, tp_offset };

struct Mutation {
    Kind kind = Kind::none;
    i64 step = 1;        // 1-based step it strikes
    int rank = 0;        // the dp rank (tp_offset: the tp rank)
    int other = 1;       // swap_partials: the dp rank whose partial trades places with rank's
    std::string tensor;  // swap_partials, flip_grad: a parameter's name ("h.1.mlp.c_fc.weight")
    i64 element = 0;     // flip_grad: the element of the tensor (flat, local)
    int microbatch = 0;  // flip_grad, drop_microbatch: the rank's local microbatch
    int layer = 0;       // tp_offset: the block
};

// Arms m until the end of the scope. Only one at a time; arm it before the run starts and keep
// it until every rank has finished.
class Armed {
public:
    explicit Armed(const Mutation& m);
    ~Armed();
    Armed(const Armed&) = delete;
    Armed& operator=(const Armed&) = delete;
};

const Mutation* armed();  // null unless a test armed one

// Whether the armed mutation is of kind k and strikes step `step` on rank `rank` (and, with
// layer >= 0, block `layer`).
bool strikes(Kind k, i64 step, int rank, int layer = -1);

// flip_grad and drop_microbatch where a gradient leaves backward: `grads` is a gradient buffer
// laid out as `table` (a GradLayout's), of which floats [lo, hi) hold microbatch `microbatch` of
// dp rank `rank` at `step` (a whole model's, a pipeline chunk's, a ZeRO unit's). A flip strikes
// when its element lies in [lo, hi); a drop zeroes [lo, hi).
void strike_gradient(const ParamTable& table, i64 step, int rank, int microbatch, float* grads,
                     i64 lo, i64 hi);

// swap_partials as an all_reduce carries it: the partials of ranks a and b trade places for
// elements [lo, hi) of the buffer. a < 0: none.
struct PartialSwap {
    int a = -1, b = -1;
    i64 lo = 0, hi = 0;
};
// The calling thread's next all_reduce carries `s` (comm.cpp takes it when it builds the request).
void set_swap(const PartialSwap& s);
PartialSwap take_swap();  // and forgets it

}  // namespace px::mutation
