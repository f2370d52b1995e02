// The `parallax` subcommands. Each registers itself on the CLI11 app and runs when chosen.
//
// Exit codes (for cluster scripts): 0 success, 1 internal error, 2 bad input (config, data or
// checkpoint file, command line), 3 the run itself failed (e.g. the loss became non-finite),
// 4 a rank died, stalled or could not communicate (a CommError: a peer did not arrive within
// layout.timeout_s, or the job was aborted): restart the job, with checkpoint.resume = "auto"
// to continue from the newest valid checkpoint, 5 silent data corruption that a re-run
// reproduced (a CorruptionError naming the ranks): take their nodes out, then restart,
// 6 parallax validate found a layout that diverges from the single-device reference.
// Under mpirun a rank that is killed ends the job through the launcher, whose exit status is
// 128 + the signal (137 for SIGKILL): also a restart.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace px::comm {
class MpiEnvironment;
}

namespace px::app {

enum ExitCode : int {
    kOk = 0,
    kInternal = 1,
    kBadInput = 2,
    kRunFailed = 3,
    kRestart = 4,
    kCorruption = 5,
    kDiverged = 6,
    kStorage = 7,
};

// Adds the subcommand; the returned function runs it (after parsing) and returns an exit code.
// `mpi`: this process is one rank of an MPI launch (mpirun / srun), else null.
std::function<int()> add_train_command(CLI::App& app, const comm::MpiEnvironment* mpi = nullptr);
std::function<int()> add_inspect_command(CLI::App& app);  // parallax inspect FILE|DIR
std::function<int()> add_convert_command(CLI::App& app);  // parallax convert IN --to OUT
std::function<int()> add_gradcheck_command(CLI::App& app);  // parallax gradcheck [CONFIG] [--op ..]
std::function<int()> add_check_command(CLI::App& app);  // parallax check determinism|resume [CONFIG]
std::function<int()> add_validate_command(CLI::App& app, const comm::MpiEnvironment* mpi = nullptr);
std::function<int()> add_record_command(CLI::App& app);  // parallax record [CONFIG] --out TRACE.h5
std::function<int()> add_compare_command(CLI::App& app);  // parallax compare REF.h5 RUN.h5
// parallax plan CONFIG --gpus N --cluster FILE.toml: layouts for N devices, ranked
std::function<int()> add_plan_command(CLI::App& app);
// parallax gui [CONFIG] [--screenshot DIR]: the workbench's own executable, parallax-gui, has
// the command; parallax's `gui` starts it with the same arguments (building it first in a build
// tree where it is not built yet). `self`: this program's argv[0].
std::function<int()> add_gui_command(CLI::App& app);
std::function<int()> add_gui_launcher(CLI::App& app, const char* self);
std::function<int()> add_config_command(CLI::App& app);  // parallax config [--keys | --markdown]

// Runs a parsed command and maps what it throws to an exit code, with one line on stderr that
// starts with `who` (e.g. "parallax (rank 1 of 4)") and says the kind of failure.
int run_reporting(const std::string& who, const std::function<int()>& run);

// Writes a report (JSON, Markdown) whose path check_output_file checked before the work: through
// a temporary file renamed over it, so a reader never sees half of one. A failure now is the file
// system's: StorageError (exit 7).
void write_report(const std::string& path, const std::string& text);

// The key reference as docs/config.md holds it: one Markdown table per section, from the key
// registry (parallax config --markdown).
std::string config_reference_markdown();

}  // namespace px::app
