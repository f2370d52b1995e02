// How idle OpenMP threads wait, chosen once per program before the OpenMP runtime starts.
//
// Every kernel is a parallel region whose threads meet at a barrier. libgomp's default lets a
// thread that arrives early spin for a while (about 300 000 polls) before it sleeps. On a quiet
// host that saves a wake-up; on a shared one (a CI runner, a laptop with an IDE, a second job)
// a spinning thread is a runnable thread: the scheduler counts it against the process that
// shares its core, and a thread that never sleeps earns no wake-up preference, so the thread
// still working waits behind the neighbour's whole time slice at every barrier. A thread that
// sleeps at once gives its core back and is woken first. bench/bench_step measures both hosts.
//
// libgomp reads its environment in its own initialiser, which runs before main() and before any
// static constructor of the program, so the choice has to be made earlier still: the ELF
// pre-initialisation array of the executable. PX_OPENMP_PASSIVE_BY_DEFAULT, placed once in a
// program's main file, sets OMP_WAIT_POLICY=passive there unless the user has set
// OMP_WAIT_POLICY or GOMP_SPINCOUNT. (A Python interpreter loads the runtime with the module, so
// there the variable is the user's to set before the import.)
#pragma once
#include <cstdlib>

namespace px::detail {

inline void openmp_passive_by_default(int, char**, char**) {
    if (std::getenv("OMP_WAIT_POLICY") == nullptr && std::getenv("GOMP_SPINCOUNT") == nullptr)
        setenv("OMP_WAIT_POLICY", "passive", 0);
}

}  // namespace px::detail

#define PX_OPENMP_PASSIVE_BY_DEFAULT                                                      \
    [[gnu::used, gnu::section(".preinit_array")]] static void (*const px_openmp_wait_policy)( \
        int, char**, char**) = &px::detail::openmp_passive_by_default;
