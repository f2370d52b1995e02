// The `parallax` subcommands. Each registers itself on the CLI11 app and runs when chosen.
//
// Exit codes (for cluster scripts): 0 success, 1 internal error, 2 bad input (config, data or
// checkpoint file, command line), 3 the run itself failed (e.g. the loss became non-finite).
#pragma once
#include <CLI/CLI.hpp>

#include <functional>

namespace px::comm {
class MpiEnvironment;
}

namespace px::app {

enum ExitCode : int { kOk = 0, kInternal = 1, kBadInput = 2, kRunFailed = 3 };

// Adds the subcommand; the returned function runs it (after parsing) and returns an exit code.
// `mpi`: this process is one rank of an MPI launch (mpirun / srun), else null.
std::function<int()> add_train_command(CLI::App& app, const comm::MpiEnvironment* mpi = nullptr);
std::function<int()> add_inspect_command(CLI::App& app);  // parallax inspect FILE|DIR

}  // namespace px::app
