// Catch2's session for the MPI suites, whose own main() starts MPI first: Catch2's
// implementation is compiled once (catch_runner.cpp), not in each suite.
#pragma once

namespace px::test {

int run_catch(int argc, char** argv);  // runs every selected test case; Catch2's exit code

}  // namespace px::test
