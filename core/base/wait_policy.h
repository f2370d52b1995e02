// How idle OpenMP threads wait, chosen once per program before the OpenMP runtime starts.
//
// Every kernel is a parallel region whose threads meet at a barrier. libgomp's default lets a
// thread that arrives early spin for a while (300 000 polls) before it sleeps. On a quiet host
// that saves a wake-up; on a shared one (a CI runner, a laptop with an IDE, a second job) a
// spinning thread is a runnable thread: the scheduler counts it against the process that shares
// its core, and a thread that never sleeps earns no wake-up preference, so the thread still
// working waits behind the neighbour's whole time slice at every barrier. A thread that sleeps
// at once gives its core back and is woken first. bench/bench_step measures both hosts.
//
// libgomp fixes its spin count from the environment when it is loaded, before main(), and a
// variable set from inside the process (even from the executable's pre-initialisation array)
// does not reach that count. So openmp_passive_by_default, called first thing in a program's
// main(), sets OMP_WAIT_POLICY=passive and starts the program again in place (execv of
// /proc/self/exe with the same arguments; the process id stays) unless the user has set
// OMP_WAIT_POLICY or GOMP_SPINCOUNT, in which case their choice stands. If the restart fails the
// program simply goes on with the runtime's default. A Python interpreter loads the runtime with
// the module, so there the variable is the user's to set before the import.
#pragma once
#include <cstdlib>

#include <unistd.h>

namespace px {

inline void openmp_passive_by_default(char** argv) {
    if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr)
        return;
    if (setenv("OMP_WAIT_POLICY", "passive", 0) != 0) return;
    execv("/proc/self/exe", argv);  // returns only on failure: go on as we are
}

}  // namespace px
