#include "core/model/weight_grads.h"

#include "core/base/error.h"

#include <cstring>

namespace px {

Tensor WeightGradQueue::keep(const Tensor& t) {
    PX_ASSERT(t.contiguous(), std::string("a deferred weight gradient keeps '") + t.name +
                                  "', which is not contiguous");
    if (used_ == store_.size()) store_.push_back(std::make_unique<std::vector<std::byte>>());
    std::vector<std::byte>& buf = *store_[used_++];
    const size_t n = static_cast<size_t>(bytes_of(t.dtype, t.numel()));
    if (buf.size() < n) buf.resize(n);
    std::memcpy(buf.data(), t.data, n);
    Tensor copy = t;
    copy.data = buf.data();
    return copy;
}

void WeightGradQueue::run() {
    for (const auto& task : tasks_) task();
    clear();
}

void WeightGradQueue::clear() {
    tasks_.clear();
    used_ = 0;
}

std::size_t WeightGradQueue::bytes() const {
    std::size_t n = 0;
    for (const auto& b : store_) n += b->size();
    return n;
}

}  // namespace px
