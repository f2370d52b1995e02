// Helpers shared by the training-level test suites.
#pragma once
#include "core/config.h"

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace px::test {

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
    c.train.steps = 5;
    c.train.warmup_steps = 2;
    c.train.eval_every = 0;
    c.output.run_file = false;
    c.layout.timeout_s = 30;
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

}  // namespace px::test
