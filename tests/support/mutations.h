// Mutations: deliberate, known bugs planted in a layout's ranks, to prove that the validation
// harness (validators/validate.h) names exactly the step, the op, the rank and the element where
// each one acts. The library knows nothing of them: each is a decorator the tests wrap around
// what the library hands out (core/train/runner.h RunHooks): a rank's dp group (a
// comm::Decorator), the model's parallel layers (GPT::wrap_parallel_layers) or the job's step
// hooks (StepHooks::microbatch_grad). validate_layouts applies them to the layouts' runs only,
// never to the single-device reference.
//
// Index
//   Kind, Mutation  what to break, where and when
//   plant           the RunHooks that plant a mutation in every rank of a run
//   SwapPartials    swap_partials as a decorator of a dp group (also used on its own)
//
// The mutations:
//   swap_partials    step s, the data-parallel gradient all-reduce (ZeRO-0/1): the partials of dp
//                    ranks `rank` and `other` trade places in the canonical tree, for the elements
//                    of parameter `tensor`. Sums are not associative, so with three or more
//                    partials the reduced gradient changes on every rank.
//   flip_grad        step s, dp rank `rank`, its local microbatch `microbatch`: the lowest mantissa
//                    bit of element `element` of parameter `tensor`'s gradient, as backward leaves
//                    it (before it joins the other microbatches and ranks: under ZeRO-2/3 before
//                    its unit's reduce-scatter; in a pipeline on the stage that holds it).
//   drop_microbatch  step s, dp rank `rank`: its local microbatch `microbatch` contributes no
//                    gradient (in a pipeline, on every stage of that replica).
//   tp_offset        step s, tp rank `rank`, block `layer`: mlp.fc's forward reads its weight shard
//                    one row off (row i+1 for row i, the last wrapping to the first).
#pragma once
#include "core/comm/comm.h"
#include "core/train/runner.h"

#include <cstdint>
#include <string>

namespace px::test::mutation {

enum class Kind : std::uint8_t { swap_partials, flip_grad, drop_microbatch, tp_offset };

struct Mutation {
    Kind kind = Kind::flip_grad;
    i64 step = 1;        // 1-based step it strikes
    int rank = 0;        // the dp rank (tp_offset: the tp rank)
    int other = 1;       // swap_partials: the dp rank whose partial trades places with rank's
    std::string tensor;  // swap_partials, flip_grad: a parameter's name ("h.1.mlp.c_fc.weight")
    i64 element = 0;     // flip_grad: the element of the tensor (flat, local)
    int microbatch = 0;  // flip_grad, drop_microbatch: the rank's local microbatch
    int layer = 0;       // tp_offset: the block
};

// The decorators that plant m in every rank of a run (only where the layout has the group the
// mutation acts in: a dp group of two or more for the first three, a tp group for tp_offset).
RunHooks plant(const Mutation& m);

// A dp group whose canonical all_reduce of f32 elements [lo, hi) adds the partials of ranks a
// and b in each other's places, whenever armed (the others pass through). The swapped sum is
// formed from the gathered partials in the canonical tree over rank indices, which is what both
// backends' canonical all_reduce computes.
class SwapPartials : public comm::Decorator {
public:
    SwapPartials(std::unique_ptr<comm::Communicator> inner, int a, int b);
    void arm(i64 lo, i64 hi, i64 n) {  // requests of n elements; elements [lo, hi)
        lo_ = lo;
        hi_ = hi;
        n_ = n;
    }
    void disarm() { n_ = -1; }

protected:
    void run(comm::Request& req) override;

private:
    int a_, b_;
    i64 lo_ = 0, hi_ = 0, n_ = -1;
};

// A group whose rank `rank` receives, in the first request `hits` accepts, its first element
// with bit 20 flipped (a low bit could round away); every other request passes through. The
// planted bug of a received message: a K/V block of the cp ring, rows of the ep dispatch.
class FlipFirstReceived : public comm::Decorator {
public:
    FlipFirstReceived(std::unique_ptr<comm::Communicator> inner, int rank,
                      bool (*hits)(const comm::Request&))
        : comm::Decorator(std::move(inner)), rank_(rank), hits_(hits) {}

protected:
    void run(comm::Request& req) override;

private:
    int rank_;
    bool (*hits_)(const comm::Request&);
    bool done_ = false;
};

}  // namespace px::test::mutation
