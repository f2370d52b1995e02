#include "core/mutation.h"

#include "core/error.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>

namespace px::mutation {

namespace {
Mutation g_mutation;  // written only while nothing runs
std::atomic<const Mutation*> g_armed{nullptr};
thread_local PartialSwap t_swap;
}  // namespace

Armed::Armed(const Mutation& m) {
    PX_ASSERT(!g_armed.load(), "a mutation is armed already");
    g_mutation = m;
    g_armed.store(&g_mutation);
}

Armed::~Armed() {
    g_armed.store(nullptr);
}

const Mutation* armed() {
    return g_armed.load(std::memory_order_relaxed);
}

bool strikes(Kind k, i64 step, int rank, int layer) {
    const Mutation* m = armed();
    return m && m->kind == k && m->step == step && m->rank == rank &&
           (layer < 0 || m->layer == layer);
}

void strike_gradient(const ParamTable& table, i64 step, int rank, int microbatch, float* grads,
                     i64 lo, i64 hi) {
    const Mutation* m = armed();
    if (!m || m->microbatch != microbatch) return;
    if (strikes(Kind::flip_grad, step, rank)) {
        const int i = table.find(m->tensor);
        if (i < 0) return;  // a part of the model without it (another pipeline stage)
        const TableEntry& e = table.entries[static_cast<size_t>(i)];
        PX_ASSERT(m->element >= 0 && m->element < e.numel(), "flip_grad: element out of range");
        const i64 at = e.offset + m->element;
        if (at < lo || at >= hi) return;  // another chunk's or unit's
        std::uint32_t bits = 0;
        std::memcpy(&bits, grads + at, sizeof bits);
        bits ^= 1u;  // the lowest mantissa bit
        std::memcpy(grads + at, &bits, sizeof bits);
    }
    if (strikes(Kind::drop_microbatch, step, rank)) std::fill(grads + lo, grads + hi, 0.0f);
}

void set_swap(const PartialSwap& s) {
    t_swap = s;
}

PartialSwap take_swap() {
    const PartialSwap s = t_swap;
    t_swap = PartialSwap{};
    return s;
}

}  // namespace px::mutation
