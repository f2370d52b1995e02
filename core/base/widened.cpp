#include "core/base/widened.h"

#include "core/base/error.h"

#include <cstddef>
#include <string>

namespace px {

Widened::Widened(const Tensor* from, DType round_through) : from_(from) {
    if (from == nullptr) return;
    view_ = *from;
    if (from->dtype == DType::f32 && round_through == DType::f32) return;  // itself
    const i64 n = from->numel();
    buf_.resize(static_cast<size_t>(n));
    if (from->contiguous()) {
        convert(buf_.data(), DType::f32, from->data, from->dtype, static_cast<size_t>(n));
    } else {
        PX_ASSERT(from->ndim == 2,
                  std::string("strided tensor '") + from->name + "' of more than two dimensions");
        const i64 R = from->shape[0], C = from->shape[1];
        const auto* base = static_cast<const std::byte*>(from->data);
        const size_t e = dtype_size(from->dtype);
        for (i64 r = 0; r < R; r++)
            for (i64 c = 0; c < C; c++)
                convert(buf_.data() + r * C + c, DType::f32,
                        base + static_cast<size_t>(r * from->strides[0] + c * from->strides[1]) * e,
                        from->dtype, 1);
    }
    if (round_through != DType::f32)
        for (float& x : buf_) x = round_to(round_through, x);
    view_.dtype = DType::f32;
    view_.data = buf_.data();
    i64 stride = 1;
    for (int d = view_.ndim - 1; d >= 0; d--) {
        view_.strides[d] = stride;
        stride *= view_.shape[d];
    }
}

void Widened::store() const {
    // Nothing to write: fp32 used in place, or fp32 weights rounded for reading (never written).
    if (from_ == nullptr || buf_.empty() || from_->dtype == DType::f32) return;
    PX_ASSERT(from_->contiguous(), std::string("output '") + from_->name + "' must be contiguous");
    convert(from_->data, from_->dtype, buf_.data(), DType::f32, buf_.size());
}

}  // namespace px
