// parallax: the command-line entry point.
#include "app/commands.h"
#include "core/error.h"

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
    CLI::App app{"Parallax: a GPT training runtime whose every parallel layout is checked, bit for "
                 "bit, against the single-device reference."};
    app.require_subcommand(1);
    app.set_version_flag("--version", "parallax 0.1.0");

    std::vector<std::pair<CLI::App*, std::function<int()>>> commands;
    auto run_train = px::app::add_train_command(app);
    commands.emplace_back(app.get_subcommand("train"), run_train);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        const int rc = app.exit(e);
        return rc == 0 ? 0 : px::app::kBadInput;
    }
    for (auto& [sub, run] : commands) {
        if (!sub->parsed()) continue;
        try {
            return run();
        } catch (const px::ConfigError& e) {
            std::fprintf(stderr, "parallax: config error: %s\n", e.what());
            return px::app::kBadInput;
        } catch (const px::DataError& e) {
            std::fprintf(stderr, "parallax: data error: %s\n", e.what());
            return px::app::kBadInput;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "parallax: error: %s\n", e.what());
            return px::app::kInternal;
        }
    }
    return px::app::kInternal;
}
