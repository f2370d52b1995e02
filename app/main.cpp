// parallax: the command-line entry point.
#include "app/commands.h"
#include "core/comm/mpi.h"
#include "core/base/error.h"
#include "core/base/wait_policy.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

namespace {

// Runs the chosen command; under MPI the messages say which rank speaks.
int run_main(int argc, char** argv, const px::comm::MpiEnvironment* mpi) {
    CLI::App app{"Parallax: a GPT training runtime whose every parallel layout is checked, bit for "
                 "bit, against the single-device reference."};
    app.require_subcommand(1);
    app.set_version_flag("--version", "parallax 0.1.0");

    std::vector<std::pair<CLI::App*, std::function<int()>>> commands;
    auto run_train = px::app::add_train_command(app, mpi);
    commands.emplace_back(app.get_subcommand("train"), run_train);
    auto run_inspect = px::app::add_inspect_command(app);
    commands.emplace_back(app.get_subcommand("inspect"), run_inspect);
    auto run_convert = px::app::add_convert_command(app);
    commands.emplace_back(app.get_subcommand("convert"), run_convert);
    auto run_gradcheck = px::app::add_gradcheck_command(app);
    commands.emplace_back(app.get_subcommand("gradcheck"), run_gradcheck);
    auto run_check = px::app::add_check_command(app);
    commands.emplace_back(app.get_subcommand("check"), run_check);
    auto run_validate = px::app::add_validate_command(app, mpi);
    commands.emplace_back(app.get_subcommand("validate"), run_validate);
    auto run_record = px::app::add_record_command(app);
    commands.emplace_back(app.get_subcommand("record"), run_record);
    auto run_compare = px::app::add_compare_command(app);
    commands.emplace_back(app.get_subcommand("compare"), run_compare);
    auto run_plan = px::app::add_plan_command(app);
    commands.emplace_back(app.get_subcommand("plan"), run_plan);
    auto run_gui = px::app::add_gui_launcher(app, argv[0]);
    commands.emplace_back(app.get_subcommand("gui"), run_gui);
    auto run_config = px::app::add_config_command(app);
    commands.emplace_back(app.get_subcommand("config"), run_config);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        if (mpi && mpi->rank() != 0) return e.get_exit_code() == 0 ? 0 : px::app::kBadInput;
        const int rc = app.exit(e);
        return rc == 0 ? 0 : px::app::kBadInput;
    }
    std::string who = "parallax";
    if (mpi) {
        who += " (rank ";
        who += std::to_string(mpi->rank());
        who += " of ";
        who += std::to_string(mpi->size());
        who += ")";
    }
    for (auto& [sub, run] : commands)
        if (sub->parsed()) return px::app::run_reporting(who, run);
    return px::app::kInternal;
}

}  // namespace

int main(int argc, char** argv) {
    px::openmp_passive_by_default(argv);  // idle OpenMP threads sleep (core/base/wait_policy.h)
    // Under mpirun / srun this process is one rank: MPI starts before anything else and ends
    // after the command (every rank returns its own exit code; mpirun reports the first non-zero).
    std::unique_ptr<px::comm::MpiEnvironment> mpi;
    if (px::comm::launched_by_mpi()) {
        try {
            mpi = std::make_unique<px::comm::MpiEnvironment>(&argc, &argv);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "parallax: error: %s\n", e.what());
            return px::app::kInternal;
        }
    }
    return run_main(argc, argv, mpi.get());
}
