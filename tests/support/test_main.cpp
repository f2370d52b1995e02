// Catch2's implementation and main(), compiled once for every suite. Idle OpenMP threads sleep, as
// in the parallax program (core/base/wait_policy.h): two suites share the test machine's cores,
// and a spinning thread of one takes the other's time (on 2 cores the suites took 310 s spinning,
// 228 s sleeping).
#define CATCH_CONFIG_RUNNER
#include "core/base/wait_policy.h"

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
    px::openmp_passive_by_default(argv);
    return Catch::Session().run(argc, argv);
}
