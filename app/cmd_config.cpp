// parallax config: the job config's keys. Without options, the embedded default job as TOML (every
// key with its default and a comment saying what it means: a file to start a job from); with
// --keys, one line per key (name, type, default); with --markdown, the key reference as docs/config.md
// holds it (one table per section), made from the key registry (core/base/config_registry.h).
#include "app/commands.h"
#include "core/base/config.h"

#include <cstdio>
#include <memory>
#include <string>

namespace px::app {

namespace {

// A table cell: '|' escaped, so text with one stays in its cell.
std::string cell(const std::string& s) {
    std::string out;
    for (char c : s) {
        if (c == '|') out += '\\';
        out += c;
    }
    return out;
}

}  // namespace

std::string config_reference_markdown() {
    std::string out;
    for (const SectionDoc& s : config_reference()) {
        out += "### `[" + s.name + "]`\n" + s.doc + "\n\n";
        out += "| key | type | default | meaning |\n| --- | --- | --- | --- |\n";
        for (const KeyDoc& k : s.keys)
            out += "| `" + k.name + "` | " + cell(k.type) + " | " + cell(k.default_value) + " | " +
                   cell(k.meaning) + " |\n";
        out += "\n";
    }
    return out;
}

std::function<int()> add_config_command(CLI::App& app) {
    struct Options {
        bool keys = false, markdown = false;
    };
    auto opt = std::make_shared<Options>();
    CLI::App* cmd = app.add_subcommand(
        "config", "Print the embedded default job as TOML (every key, its default and what it "
                  "means), or with --keys one line per key, or with --markdown the key reference "
                  "(docs/config.md's tables).");
    cmd->add_flag("--keys", opt->keys, "one line per key: section.key, type, default");
    cmd->add_flag("--markdown", opt->markdown,
                  "the key reference: one Markdown table per section (key, type, default, meaning)");
    return [opt]() -> int {
        if (opt->markdown) {
            std::fputs(config_reference_markdown().c_str(), stdout);
        } else if (opt->keys) {
            for (const SectionDoc& s : config_reference())
                for (const KeyDoc& k : s.keys)
                    std::printf("%s.%s\t%s\t%s\n", s.name.c_str(), k.name.c_str(), k.type.c_str(),
                                k.default_value.c_str());
        } else {
            std::fputs(default_config_toml(), stdout);
        }
        return kOk;
    };
}

}  // namespace px::app
