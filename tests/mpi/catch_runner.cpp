#define CATCH_CONFIG_RUNNER
#include "tests/mpi/catch_runner.h"

#include <catch2/catch.hpp>

int px::test::run_catch(int argc, char** argv) {
    Catch::Session session;
    return session.run(argc, argv);
}
