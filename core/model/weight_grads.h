// The weight-gradient half of a backward, kept to run later: a zero-bubble pipeline schedule's
// W (core/parallel/pipeline/schedule.h). A backward given a queue computes every input
// gradient at once (B) and, for the linears and norms whose weight gradients can wait, records
// what they need; run() computes them (W), each exactly as the backward would have, into the
// same token-node buffers. Deferring changes when a weight gradient is computed, never its value.
//
// Index
//   WeightGradQueue   the kept tasks and the tensors they read
#pragma once
#include "core/base/tensor.h"

#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace px {

class WeightGradQueue {
public:
    // Under recompute the block internals (a linear's input, a norm's statistics) share one slot
    // that the next block's recompute overwrites: the queue keeps its own copies of them too.
    bool keep_inputs = false;

    // A copy of t (contiguous) in the queue's storage, valid until clear(): an output gradient
    // lives in backward scratch that the next op reuses.
    Tensor keep(const Tensor& t);
    // t itself, or under keep_inputs its copy.
    Tensor input(const Tensor& t) { return keep_inputs ? keep(t) : t; }
    void defer(std::function<void()> task) { tasks_.push_back(std::move(task)); }

    bool empty() const { return tasks_.empty(); }
    size_t size() const { return tasks_.size(); }
    void run();    // every task in the order deferred, then clear()
    void clear();  // drops the tasks; the storage stays for the next microbatch
    std::size_t bytes() const;  // storage held (the kept tensors' high-water mark)

private:
    std::vector<std::function<void()>> tasks_;
    std::vector<std::unique_ptr<std::vector<std::byte>>> store_;  // kept tensors, reused
    size_t used_ = 0;
};

}  // namespace px
