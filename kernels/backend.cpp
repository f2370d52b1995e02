// The backend registry: which Backend serves each (device, dtype, mode); see backend.h.
#include "kernels/backend.h"

#include "core/base/error.h"

#include <algorithm>
#include <array>
#include <string>

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
    {Device::cpu, DType::bf16, Mode::bitwise, &cpu::bf16_backend},
    {Device::cpu, DType::bf16, Mode::fast, &cpu::bf16_fast_backend},
    {Device::cpu, DType::f16, Mode::bitwise, &cpu::f16_backend},
    {Device::cpu, DType::f16, Mode::fast, &cpu::f16_backend},
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

// How many entries each op has in op_list.h: an op with none would pass Backend::has for every
// backend and have nothing to call.
constexpr auto kEntries = [] {
    std::array<int, static_cast<size_t>(Op::kCount)> n{};
#define PX_ENTRY(op, entry, ret, params) n[static_cast<size_t>(Op::op)]++;
#include "kernels/op_list.h"
    return n;
}();
static_assert(std::ranges::find(kEntries, 0) == kEntries.end(), "an op of op_list.h has no entry");

}  // namespace

const char* role_name(Role r) {
    switch (r) {
        case Role::act:
            return "activation";
        case Role::weight:
            return "weight";
        case Role::grad:
            return "weight gradient";
        case Role::acc:
            return "fp32 sum";
        case Role::master:
            return "optimizer state";
    }
    return "?";
}

DType Operands::of(Role r) const {
    switch (r) {
        case Role::act:
            return act;
        case Role::weight:
            return weight;
        case Role::grad:
            return grad;
        case Role::acc:
            return acc;
        case Role::master:
            return master;
    }
    return act;
}

bool Backend::has(Op op) const {
#define PX_ENTRY(of, entry, ret, params) \
    if (op == Op::of && entry == nullptr) return false;
#include "kernels/op_list.h"
    return op < Op::kCount;
}

const Backend* find_backend(Device device, DType dtype, Mode mode) {
    const Backend* b = kTable[slot(device, dtype, mode)];
    PX_ASSERT(b == nullptr || b->operands.act == dtype,
              std::string("backend '") + (b ? b->name : "") + "' is registered for " +
                  dtype_name(dtype) + " activations but declares " +
                  dtype_name(b ? b->operands.act : dtype));
    return b;
}

}  // namespace px::ops
