// The backend registry: which Backend serves each (device, dtype, mode); see backend.h.
#include "kernels/backend.h"

#include <array>

namespace px::ops {

namespace {

struct Registration {
    Device device;
    DType dtype;
    Mode mode;
    const Backend* backend;
};

// Every backend and the keys it serves; a new backend or dtype adds its lines here.
constexpr Registration kRegistry[] = {
    {Device::cpu, DType::f32, Mode::bitwise, &cpu::f32_backend},
    {Device::cpu, DType::f32, Mode::fast, &cpu::f32_backend},
};

constexpr size_t slot(Device device, DType dtype, Mode mode) {
    return (static_cast<size_t>(device) * kNumDTypes + static_cast<size_t>(dtype)) * kNumModes +
           static_cast<size_t>(mode);
}

// The registry as a dense table, so a look-up is one index. Built at compile time, where a key
// registered twice stops the build.
constexpr auto kTable = [] {
    std::array<const Backend*, size_t(kNumDevices) * kNumDTypes * kNumModes> t{};
    for (const Registration& r : kRegistry) {
        const Backend*& s = t[slot(r.device, r.dtype, r.mode)];
        if (s != nullptr) throw "two backends registered for one device, dtype and mode";
        s = r.backend;
    }
    return t;
}();

}  // namespace

bool Backend::has(Op op) const {
    switch (op) {
        case Op::matmul:
            return matmul_forward && matmul_backward;
        case Op::gemm:
            return gemm;
        case Op::layernorm:
            return layernorm_forward && layernorm_backward;
        case Op::gelu:
            return gelu_forward && gelu_backward;
        case Op::attention:
            return attention_forward && attention_backward;
        case Op::residual:
            return residual_forward && residual_backward;
        case Op::embedding:
            return embedding_forward && embedding_backward;
        case Op::crossentropy:
            return crossentropy_forward && crossentropy_backward;
        case Op::row_max:
            return row_max;
        case Op::exp_sub:
            return exp_sub;
        case Op::row_sum:
            return row_sum;
        case Op::adamw:
            return adamw_update;
        case Op::sum_squares:
            return sum_squares && sum_squares_blocks;
        case Op::kCount:
            break;
    }
    return false;
}

const Backend* find_backend(Device device, DType dtype, Mode mode) {
    return kTable[slot(device, dtype, mode)];
}

}  // namespace px::ops
