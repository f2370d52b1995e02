// parallax-gui: the workbench's executable (app/gui/), which `parallax gui` starts with its own
// arguments after "gui". Run by hand it takes the same arguments, with or without the "gui".
#include "app/commands.h"
#include "core/base/wait_policy.h"

#include <cstring>
#include <vector>

int main(int argc, char** argv) {
    px::openmp_passive_by_default(argv);  // idle OpenMP threads sleep (core/base/wait_policy.h)
    CLI::App app{"Parallax's desktop workbench."};
    app.name("parallax");
    app.require_subcommand(1);
    auto run = px::app::add_gui_command(app);
    std::vector<char*> args(argv, argv + argc);
    if (argc < 2 || std::strcmp(argv[1], "gui") != 0)
        args.insert(args.begin() + 1, const_cast<char*>("gui"));
    try {
        app.parse(static_cast<int>(args.size()), args.data());
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : px::app::kBadInput;
    }
    return px::app::run_reporting("parallax gui", run);
}
