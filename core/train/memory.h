// How much memory a job will take, estimated from its config before anything is allocated, and
// the check that refuses a job that cannot fit, naming the key that makes it too big.
//
// Index
//   MemoryScope       whose memory: every rank of the layout in this process (in-process ranks),
//                     or one rank (a process of an MPI launch)
//   MemoryItem        one part of the estimate: what it is for and its bytes
//   MemoryEstimate    the parts and their total
//   estimate_memory   the estimate of a config (needs only its keys: runs before make_layout)
//   MemoryBudget      what this process may use, and where that figure comes from
//   memory_budget     train.max_memory_gib, else MemAvailable and the cgroup's limit, shared
//                     among the processes of a node
//   check_memory      ConfigError when the estimate exceeds the budget: by how much, which parts,
//                     which key to lower and to what
//   format_bytes      "3.62 GiB"
//
// The estimate follows what a rank of the trainer (core/train/job.h) holds at its peak: weights,
// gradients (with the microbatch tree's partial buffers), AdamW moments (ZeRO shards them), the
// activation sets of the microbatches in flight (per the schedule), the batch's token and loss
// buffers, validation losses, the Markov source's tables, and bookkeeping (schedules, token
// ranges, tensor tables). Each parallelism's terms are its part's (core/parallel/estimate.h:
// DataParallel::estimate, PipelineParallel::estimate, ...), so a parallelism adds its memory
// where it adds its work. It is computed in doubles, so no size overflows. It leaves out what is
// small or not anonymous memory (a mapped token file is page cache), so it errs low: a job it
// refuses cannot run; a job it admits is close to its budget only when the estimate says so.
#pragma once
#include "core/base/config.h"

#include <string>
#include <vector>

namespace px {

enum class MemoryScope { process, one_rank };

struct MemoryItem {
    std::string what;  // "activations", "weights", ...
    double bytes = 0;
};

struct MemoryEstimate {
    std::vector<MemoryItem> items;  // in a fixed order; zero items included
    double total = 0;
    i64 ranks = 1;  // ranks the estimate covers
};

// Extra copies a caller makes beyond the trainer (parallax train --dump gathers the logical
// state: weights and both moments of the whole model).
struct MemoryExtras {
    bool dump = false;
};

MemoryEstimate estimate_memory(const Config& cfg, MemoryScope scope,
                               const MemoryExtras& extras = {});

struct MemoryBudget {
    double bytes = 0;
    std::string source;  // "train.max_memory_gib = 2", "MemAvailable in /proc/meminfo", ...
};
// train.max_memory_gib when it is > 0; else the least of MemAvailable (/proc/meminfo) and the
// room left under this process's cgroup limits (v2 memory.max, v1 memory.limit_in_bytes), divided
// by `processes_on_node` (the ranks of an MPI launch on this node share it).
MemoryBudget memory_budget(const Config& cfg, int processes_on_node = 1);

// Throws ConfigError ("<cfg.source_name>: ...") when estimate_memory exceeds memory_budget: the
// estimate, the budget and its source, the excess, the largest parts, and the key whose lowering
// helps most with the largest value that fits (when lowering it alone can).
void check_memory(const Config& cfg, MemoryScope scope, int processes_on_node = 1,
                  const MemoryExtras& extras = {});

std::string format_bytes(double bytes);  // "512 B", "3.62 GiB", "1.5 TiB"

}  // namespace px
