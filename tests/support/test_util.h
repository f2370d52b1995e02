// Helpers shared by the training-level test suites.
#pragma once
#include "core/base/config.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "core/io/state.h"

#include <catch2/catch.hpp>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <sys/wait.h>

namespace px::test {

// Hooks that call `f` with each rank's job after its last step (run_layout: one rank at a time).
inline RunHooks inspecting(std::function<void(Job&)> f) {
    RunHooks h;
    h.inspect = std::move(f);
    return h;
}

// A small job that trains in milliseconds: 2 layers, C = 32, T = 64 (one token block per
// sequence), batch 8, 5 steps, no run file.
inline Config small_job() {
    Config c = parse_config(default_config_toml(), "test");
    c.model.vocab = 32;
    c.model.seq_len = 64;
    c.model.layers = 2;
    c.model.heads = 4;
    c.model.hidden = 32;
    c.model.ffn = 80;
    c.train.batch_size = 8;
    c.train.microbatches = 1;
    c.numerics.block = 64;  // one block per sequence: the suites' token-block arithmetic
    c.train.steps = 5;
    c.train.warmup_steps = 2;
    c.train.eval_every = 0;
    c.output.run_file = false;
    c.layout.timeout_s = 30;
    return c;
}

// small_job with MoE layers: four experts of `ffn` channels, top-2 with capacity 1 (tokens do
// drop), one shared expert, token blocks of 16 (four per sequence), one thread, and an eval every
// 5 steps over 2 batches.
inline Config small_moe_job(i64 ffn) {
    Config c = small_job();
    c.model.moe_experts = 4;
    c.model.moe_top_k = 2;
    c.model.moe_ffn = ffn;
    c.model.moe_capacity_factor = 1.0;
    c.model.moe_shared_experts = 1;
    c.numerics.block = 16;
    c.train.eval_every = 5;
    c.train.val_batches = 2;
    c.train.threads = 1;
    return c;
}

// The named values (router statistics and the like) a job offers, by name, in step order.
struct ValueLog : Observer {
    std::map<std::string, std::vector<double>> got;
    void on_values(const RunView&, i64, const std::vector<NamedValue>& v) override {
        for (const NamedValue& x : v) got[x.name].push_back(x.value);
    }
};

// c with shapes whose tensor-parallel shares are whole blocks of 16 at tp = 2 and 4: C = 64,
// 4 heads, F = 128, V = 64 (one vocabulary block per rank at tp = 4), T = 32.
inline Config with_tp_shapes(Config c) {
    c.model.vocab = 64;
    c.model.hidden = 64;
    c.model.heads = 4;
    c.model.ffn = 128;
    c.model.seq_len = 32;
    c.numerics.block = 16;
    return c;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// A fresh, empty folder under the system's temporary directory.
inline std::string temp_dir(const std::string& name) {
    const auto p = std::filesystem::temp_directory_path() / ("parallax_test_" + name);
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
    return p.string();
}

// The single-device reference: cfg run to the end, its logical state.
inline LogicalState single_device(const Config& cfg) {
    Job job(cfg);
    job.run();
    LogicalState s;
    absorb(s, job);
    return s;
}

// c run on its in-process ranks to the end: the logical state gathered from every rank, and
// whether the replicas of each tensor agreed bit for bit.
inline LogicalState layout_state(const Config& c, bool& replicas_agree) {
    LogicalState s;
    replicas_agree = true;
    run_layout(c, {}, inspecting([&](Job& job) {
                   replicas_agree = absorb(s, job) && replicas_agree;
               }));
    return s;
}

// One metric of every step of a run, e.g. series(s, &StepMetrics::loss).
inline std::vector<double> series(const LogicalState& s, double StepMetrics::*field) {
    std::vector<double> out;
    for (const StepMetrics& m : s.history) out.push_back(m.*field);
    return out;
}

// A layout's run equals the reference bit for bit: loss, grad norm and validation loss of every
// step, every logical weight and every Adam moment.
inline void check_same_bits(const LogicalState& ref, const LogicalState& got) {
    CHECK(same_bits(series(ref, &StepMetrics::loss), series(got, &StepMetrics::loss)));
    CHECK(same_bits(series(ref, &StepMetrics::grad_norm), series(got, &StepMetrics::grad_norm)));
    CHECK(same_bits(series(ref, &StepMetrics::val_loss), series(got, &StepMetrics::val_loss)));
    CHECK(same_bits(ref.params, got.params));
    CHECK(same_bits(ref.m, got.m));
    CHECK(same_bits(ref.v, got.v));
}

// The message of the E thrown by f, or "<no exception>".
template <class E, class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    }
    return "<no exception>";
}

// `$PARALLAX_EXE args` with stderr folded into stdout: its exit code and output.
struct Cmd {
    int rc;
    std::string out;
};

inline Cmd run_cli(const std::string& args) {
    const char* exe = std::getenv("PARALLAX_EXE");
    REQUIRE(exe != nullptr);
    const std::string cmd = std::string(exe) + " " + args + " 2>&1";
    FILE* f = popen(cmd.c_str(), "r");
    REQUIRE(f != nullptr);
    std::string out;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
    const int status = pclose(f);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace px::test
