// A tensor is plain data: dtype, shape, strides, device, name, and a pointer it does not own.
// Memory belongs to arenas (core/base/arena.h); a Tensor is a view that is cheap to copy.
#pragma once
#include "core/base/dtype.h"
#include "core/base/error.h"
#include "core/base/shapes.h"

#include <array>
#include <cstddef>
#include <initializer_list>

namespace px {

enum class Device : std::uint8_t { cpu, cuda };
inline constexpr int kNumDevices = 2;

inline constexpr int kMaxDims = 4;

inline i64 bytes_of(DType t, i64 n) {  // bytes of n elements of t
    return n * static_cast<i64>(dtype_size(t));
}

struct Tensor {
    void* data = nullptr;
    DType dtype = DType::f32;
    Device device = Device::cpu;
    int ndim = 0;
    std::array<i64, kMaxDims> shape{};    // elements per dimension
    std::array<i64, kMaxDims> strides{};  // in elements
    const char* name = "";                // stable name, e.g. "h.0.attn.c_attn.weight"
    int id = -1;                          // tensor id (keys the RNG), -1 for scratch

    i64 numel() const {
        i64 n = 1;
        for (int i = 0; i < ndim; i++) n *= shape[i];
        return n;
    }
    bool contiguous() const {
        i64 s = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            if (shape[i] != 1 && strides[i] != s) return false;
            s *= shape[i];
        }
        return true;
    }
    // The data as floats, for code that handles fp32 only: a tensor of another dtype is never
    // read as float by mistake.
    float* f32() const {
        PX_ASSERT(dtype == DType::f32,
                  std::string("tensor '") + name + "' is " + dtype_name(dtype) + ", read as fp32");
        return static_cast<float*>(data);
    }
};

// A contiguous CPU view of dtype `type` over `data` with the given shape.
inline Tensor view_of(DType type, void* data, std::initializer_list<i64> shape,
                      const char* name = "") {
    Tensor t;
    t.data = data;
    t.dtype = type;
    t.ndim = static_cast<int>(shape.size());
    int i = 0;
    for (i64 s : shape) t.shape[i++] = s;
    i64 stride = 1;
    for (int d = t.ndim - 1; d >= 0; d--) {
        t.strides[d] = stride;
        stride *= t.shape[d];
    }
    t.name = name;
    return t;
}
// The same in fp32.
inline Tensor view_f32(float* data, std::initializer_list<i64> shape, const char* name = "") {
    return view_of(DType::f32, data, shape, name);
}
// The same over data an op only reads (a Tensor carries no constness).
inline Tensor view_f32(const float* data, std::initializer_list<i64> shape, const char* name = "") {
    return view_f32(const_cast<float*>(data), shape, name);
}
// Elements [offset, offset + its elements) of t's data, contiguous, in the given shape, with t's
// dtype, device and name.
inline Tensor subview(const Tensor& t, i64 offset, std::initializer_list<i64> shape) {
    Tensor v = view_of(t.dtype, static_cast<std::byte*>(t.data) + bytes_of(t.dtype, offset), shape,
                       t.name);
    v.device = t.device;
    return v;
}

}  // namespace px
