// A cluster file (docs/planner.md): the machine a layout is planned for, in TOML. One node holds
// gpus_per_node devices joined by NVLink; nodes are joined by InfiniBand. Figures are per device:
// peak dense TFLOP/s per dtype and the fraction of it a training step reaches, HBM, and each
// link's bandwidth (GB/s per device, one direction), latency and reachable fraction.
//
// Index
//   Link             one kind of link: bandwidth, latency, the fraction a collective reaches
//   ClusterSpec      the whole file, resolved
//   parse_cluster    TOML text -> ClusterSpec; errors name the file, key and value (ConfigError)
//   load_cluster     a file -> ClusterSpec
//   cluster_key_docs every key with its range and meaning (docs/planner.md's table)
//   peak_tflops      the peak for an activation dtype ("fp32", "bf16", "fp16", "fp8")
#pragma once
#include <string>
#include <vector>

namespace px::plan {

struct Link {
    double gb_per_s = 0;    // per device, one direction (10^9 bytes per second)
    double latency_us = 0;  // one message's start-up time
    double achievable = 1;  // fraction of gb_per_s a collective's transfers reach
    double bytes_per_s() const { return gb_per_s * 1e9 * achievable; }
};

struct ClusterSpec {
    std::string source;  // the file, for messages
    std::string name;
    int gpus_per_node = 8;
    // In-process CPU ranks are threads on one machine: the node's peak and memory are shared by
    // its ranks.
    bool ranks_share_node = false;
    // With ranks_share_node: the cores the ranks share (0: as many as the ranks). More ranks
    // than cores time-share them, and a rank waiting in the pipeline's bubble lends its core.
    int cores = 0;
    double fp32_tflops = 0, bf16_tflops = 0, fp16_tflops = 0, fp8_tflops = 0;  // 0: none
    double achievable = 0.5;  // fraction of the peak a step's matmuls reach
    double hbm_gib = 80;      // device memory
    double reserve_gib = 0;   // held by the runtime beside the model (context, buffers)
    Link nvlink, ib;

    double usable_bytes() const { return (hbm_gib - reserve_gib) * 1024.0 * 1024.0 * 1024.0; }
};

// Errors are ConfigError "<source>: <what is wrong, and what to do>", naming [section] key and
// the value; unknown sections and keys are errors, and every key without a default is required.
ClusterSpec parse_cluster(const std::string& toml_text, const std::string& source);
ClusterSpec load_cluster(const std::string& path);

struct ClusterKeyDoc {
    std::string section, key, type, meaning;
    bool required = true;
};
std::vector<ClusterKeyDoc> cluster_key_docs();

// Peak dense TFLOP/s for a dtype name; ConfigError naming the cluster file's key when it is 0.
double peak_tflops(const ClusterSpec& c, const std::string& dtype);

}  // namespace px::plan
