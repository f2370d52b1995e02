#include "core/mutation.h"

#include "core/error.h"

#include <atomic>

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

void set_swap(const PartialSwap& s) {
    t_swap = s;
}

PartialSwap take_swap() {
    const PartialSwap s = t_swap;
    t_swap = PartialSwap{};
    return s;
}

}  // namespace px::mutation
