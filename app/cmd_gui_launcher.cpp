// parallax gui ...: starts the workbench, whose executable (parallax-gui, beside this one) holds
// Dear ImGui and GLFW, with the same arguments. Kept apart so that a machine without the GUI's
// packages builds and runs every other command. In a build tree where the workbench is not built
// yet (the quick start builds only `parallax`), it is built first, with its progress shown.
#include "app/commands.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace px::app {

namespace {

namespace fs = std::filesystem;

// Runs argv[0] (found on PATH) with `argv` and waits; its exit status, or -1 if it did not start.
int run_and_wait(const std::vector<std::string>& args) {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The workbench's executable, built first if this program lives in a build tree without it;
// empty (after saying why on stderr) when there is none to start.
std::string find_or_build_gui(const char* self) {
    std::error_code ec;
    fs::path exe = fs::canonical("/proc/self/exe", ec);
    if (ec) exe = fs::absolute(self, ec);
    const fs::path gui = exe.parent_path() / "parallax-gui";
    if (fs::exists(gui, ec)) return gui.string();
    const fs::path root = exe.parent_path().parent_path();  // a build tree holds app/parallax
    if (!fs::exists(root / "build.ninja", ec)) {
        std::fprintf(stderr, "parallax gui: the workbench (%s) is not installed beside %s\n",
                     gui.c_str(), exe.c_str());
        return {};
    }
    const std::string target = "app/parallax-gui";
    if (run_and_wait({"ninja", "-C", root.string(), "-t", "query", target}) != 0) {
        std::fprintf(stderr,
                     "parallax gui: the build in %s has no workbench: Dear ImGui, GLFW or OpenGL "
                     "(Debian's libimgui-dev, libglfw3-dev, libgl-dev) were missing when it was "
                     "set up; scripts/setup.sh --gui installs them and sets the build up again\n",
                     root.c_str());
        return {};
    }
    std::fprintf(stderr, "parallax gui: building the workbench first (once; about 2 minutes on "
                         "2 cores)\n");
    if (const int rc = run_and_wait({"ninja", "-C", root.string(), target}); rc != 0) {
        std::fprintf(stderr, "parallax gui: building the workbench failed (%s %d); the lines "
                             "above say why\n", rc < 0 ? "ninja did not start:" : "exit code", rc);
        return {};
    }
    return gui.string();
}

}  // namespace

std::function<int()> add_gui_launcher(CLI::App& app, const char* self) {
    CLI::App* sub = app.add_subcommand(
        "gui",
        "The desktop workbench: edit and run a job under live panels (loss, layout check, "
        "pipeline, memory and communication, events) and teaching views (layout, schedule "
        "and numerics explorers). `parallax gui --help` lists its options.");
    // Every argument, --help included, is the workbench's.
    sub->set_help_flag();
    sub->allow_extras();
    sub->prefix_command();
    return [sub, self] {
        const std::string gui = find_or_build_gui(self);
        if (gui.empty()) return static_cast<int>(kBadInput);
        std::vector<std::string> args{gui, "gui"};
        for (const auto& a : sub->remaining()) args.push_back(a);
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        std::fflush(nullptr);
        execv(gui.c_str(), argv.data());
        std::fprintf(stderr, "parallax gui: cannot start %s: %s\n", gui.c_str(),
                     std::strerror(errno));
        return static_cast<int>(kInternal);
    };
}

}  // namespace px::app
