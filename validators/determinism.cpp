// Run-twice determinism and checkpoint-resume checks (see determinism.h).
#include "validators/determinism.h"

#include "core/io/checkpoint.h"
#include "core/base/error.h"
#include "core/train/runner.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace px {

namespace {

// A fresh folder under the system's temporary directory, removed when this goes out of scope.
class ScratchDir {
public:
    explicit ScratchDir(const std::string& given) {
        namespace fs = std::filesystem;
        static std::atomic<int> counter{0};
        if (given.empty()) {
            std::string name = "parallax_resume_check_";
            name += std::to_string(static_cast<long long>(getpid()));
            name += "_";
            name += std::to_string(counter++);
            name += "_";
            name += std::to_string(static_cast<long long>(
                std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007));
            path_ = (fs::temp_directory_path() / name).string();
        } else {
            path_ = given;
        }
        std::error_code ec;
        fs::remove_all(path_, ec);
        fs::create_directories(path_, ec);
        if (ec) {
            std::string msg = "resume check: cannot create the scratch folder ";
            msg += path_;
            msg += ": ";
            msg += ec.message();
            msg += "; give a writable folder (or set TMPDIR)";
            throw ConfigError(msg);
        }
    }
    ~ScratchDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);  // best effort: a leftover folder is harmless
    }
    ScratchDir(const ScratchDir&) = delete;
    ScratchDir& operator=(const ScratchDir&) = delete;
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

std::string layout_name(const LayoutConfig& l) {
    std::string s = "dp";
    s += std::to_string(l.dp);
    s += "xtp";
    s += std::to_string(l.tp);
    s += "xpp";
    s += std::to_string(l.pp);
    s += "xz";
    s += std::to_string(l.zero);
    return s;
}

}  // namespace

// ---- StateCheck ---------------------------------------------------------------------------------

bool StateCheck::equal() const {
    if (!notes.empty()) return false;
    for (const Comparison& c : comparisons)
        if (!c.equal()) return false;
    return !comparisons.empty();
}

std::vector<const Comparison*> StateCheck::differing() const {
    std::vector<const Comparison*> v;
    for (const Comparison& c : comparisons)
        if (!c.equal()) v.push_back(&c);
    return v;
}

std::string StateCheck::text() const {
    std::string s = what;
    s += "\n";
    for (const std::string& n : notes) {
        s += "  note: ";
        s += n;
        s += "\n";
    }
    const auto diff = differing();
    for (const Comparison* c : diff) {
        s += "  ";
        s += c->text();
        s += "\n";
    }
    if (equal()) {
        s += "equal: all ";
        s += std::to_string(comparisons.size());
        s += " tensors bit for bit\n";
    } else {
        s += "DIFFER: ";
        s += std::to_string(diff.size());
        s += " of ";
        s += std::to_string(comparisons.size());
        s += " tensors differ";
        if (!notes.empty()) s += " (see the notes)";
        s += "\n";
    }
    return s;
}

// ---- running ------------------------------------------------------------------------------------

Config validator_config(const Config& cfg) {
    Config c = cfg;
    c.output.run_file = false;
    c.output.progress = false;
    c.output.export_llmc.clear();
    c.checkpoint.dir.clear();
    c.checkpoint.resume.clear();
    c.checkpoint.every = 0;
    return c;
}

LogicalState run_state(const Config& cfg, std::string* note) {
    LogicalState s;
    bool agree = true;
    RunHooks hooks;
    hooks.inspect = [&](Job& job) { agree = absorb(s, job) && agree; };
    run_layout(cfg, {}, hooks);
    if (!agree && note) {
        *note = "the ranks of the ";
        *note += layout_name(cfg.layout);
        *note += " run disagree on a weight or the history (a bug in Parallax: report it)";
    }
    return s;
}

namespace {

StateCheck compare_runs(std::string what, const LogicalState& ref, const LogicalState& got,
                        const std::string& note_ref, const std::string& note_got) {
    StateCheck r;
    r.what = std::move(what);
    if (!note_ref.empty()) r.notes.push_back(note_ref);
    if (!note_got.empty()) r.notes.push_back(note_got);
    r.comparisons = compare_states(ref, got);
    return r;
}

}  // namespace

StateCheck check_determinism(const Config& cfg) {
    const Config c = validator_config(cfg);
    validate_config(c);
    std::string n1, n2;
    const LogicalState first = run_state(c, &n1);
    const LogicalState second = run_state(c, &n2);
    std::string what = "determinism: ";
    what += c.source_name;
    what += " run twice under ";
    what += layout_name(c.layout);
    what += ", ";
    what += std::to_string(c.train.steps);
    what += " steps; the second run against the first";
    return compare_runs(what, first, second, n1, n2);
}

StateCheck check_resume(const Config& cfg, i64 at, const Config& resumed,
                        const std::string& scratch) {
    const Config c = validator_config(cfg);
    validate_config(c);
    const i64 steps = c.train.steps;
    if (at == kHalfway) at = steps / 2;
    if (at < 1 || at >= steps) {
        std::string msg =
            "resume check: the checkpoint step must be between 1 and train.steps - 1 (";
        msg += std::to_string(steps - 1);
        msg += "), not ";
        msg += std::to_string(at);
        msg += "; give another --at or more train.steps";
        throw ConfigError(msg);
    }
    // What compare_states cannot line up is refused before anything runs.
    if (resumed.train.steps != steps || !(resumed.model == c.model)) {
        std::string msg =
            "resume check: the resumed run must have the same model and train.steps (";
        msg += std::to_string(steps);
        msg += ") as the uninterrupted one, to compare their final states; change other keys";
        throw ConfigError(msg);
    }
    std::string n_ref, n_writer, n_got;
    const LogicalState ref = run_state(c, &n_ref);

    // The writer runs under the schedule of N steps (the learning rate depends on N) and saves
    // every `at` steps; what counts is the file of step `at`, the one a run killed after step
    // `at` would have left.
    const ScratchDir dir(scratch);
    Config w = c;
    w.checkpoint.dir = dir.path();
    w.checkpoint.every = at;
    w.checkpoint.keep = steps / at + 1;
    validate_config(w);
    run_state(w, &n_writer);
    const std::string ckpt = checkpoint_path(dir.path(), at);

    Config r = validator_config(resumed);
    r.checkpoint.resume = ckpt;
    validate_config(r);
    const LogicalState got = run_state(r, &n_got);

    std::string what = "resume: ";
    what += c.source_name;
    what += ", ";
    what += std::to_string(steps);
    what += " steps under ";
    what += layout_name(c.layout);
    what += " against a checkpoint after step ";
    what += std::to_string(at);
    what += " resumed under ";
    what += layout_name(r.layout);
    if (!(r.train == c.train) || !(r.numerics == c.numerics) || !(r.data == c.data) ||
        !(r.model == c.model))
        what += " (with other settings)";
    StateCheck out = compare_runs(what, ref, got, n_ref, n_got);
    if (!n_writer.empty()) out.notes.push_back(n_writer);
    return out;
}

StateCheck check_resume(const Config& cfg, i64 at) {
    return check_resume(cfg, at, cfg);
}

}  // namespace px
