// An fp32 working copy of a tensor of any dtype, for code that computes in fp32 what it stores
// narrower (the bf16 backend's kernels, the tensor-parallel layers on bf16 activations).
//
// Widened(&t)            fp32 values of t: t itself when it is fp32 (no copy), else a contiguous
//                        copy widened exactly (any strides read)
// Widened(&t, bf16)      a copy of t's values rounded through bf16: the cast point of a matmul's
//                        fp32 weights when its activations are bf16 (f32: as above)
// store()                the copy rounded once into t (nearest even); nothing when t is fp32
//                        (used itself, or weights rounded only to be read). t must be contiguous.
// A null tensor gives an empty Widened whose get() is null.
#pragma once
#include "core/base/tensor.h"

#include <vector>

namespace px {

class Widened {
public:
    explicit Widened(const Tensor* from, DType round_through = DType::f32);
    Widened(const Widened&) = delete;
    Widened& operator=(const Widened&) = delete;

    const Tensor& operator*() const { return view_; }
    const Tensor* get() const { return from_ != nullptr ? &view_ : nullptr; }
    float* f32() const { return view_.f32(); }
    void store() const;

private:
    const Tensor* from_;
    std::vector<float> buf_;  // empty when from_ is used itself
    Tensor view_;
};

}  // namespace px
