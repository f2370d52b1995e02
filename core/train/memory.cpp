// The memory estimate of a job (memory.h): per rank from the config's keys, in doubles; each
// parallelism's terms come from its part (core/parallel/estimate.h).
#include "core/train/memory.h"

#include "core/base/arena.h"
#include "core/base/error.h"
#include "core/parallel/data/part.h"
#include "core/parallel/estimate.h"
#include "core/parallel/expert/part.h"
#include "core/parallel/mesh.h"
#include "core/parallel/pipeline/part.h"
#include "core/parallel/tensor/part.h"
#include "core/train/precision.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace px {

namespace {

// The parts of the estimate, in the order they are listed.
enum Item : size_t {
    kWeights,
    kGradients,
    kMoments,
    kActivations,
    kBatch,
    kValidation,
    kData,
    kBookkeeping,
    kCopies,
    kItems
};
constexpr const char* kItemNames[] = {"weights",
                                      "gradients",
                                      "AdamW moments",
                                      "activations",
                                      "token and loss buffers",
                                      "validation losses",
                                      "data tables",
                                      "bookkeeping",
                                      "whole-model copies"};
static_assert(sizeof(kItemNames) / sizeof(kItemNames[0]) == kItems, "a name per Item");

// A group's terms: each parallelism's from its part (core/parallel/<x>/part.h estimate), the
// job's own (its data tables and tensor tables, the llm.c export's copy of the weights).
void add_group(std::vector<MemoryItem>& items, const MemorySizes& s, const StageParams& p,
               const MemoryGroup& g) {
    MemoryTerms t;
    DataParallel::estimate(s, p, g, t);
    if (s.ep > 1) ExpertParallel::estimate(s, p, g, t);
    PipelineParallel::estimate(s, p, g, t);
    if (s.tp > 1) TensorParallel::estimate(s, p, g, t);
    Precision::estimate(s, p, g, t);
    t.data += g.ranks * s.markov;
    t.bookkeeping += g.ranks * 3 * (4 + 12 * s.L) * 96;  // tensor tables
    if (s.export_llmc)  // the final weights gathered whole, and their llm.c copy
        t.copies += g.ranks * kEstimateFloat * (p.wte + p.wpe + s.L * p.layer + p.lnf) * s.tp * 2;
    const double per_item[kItems] = {t.weights, t.gradients,  t.moments,     t.activations, t.batch,
                                     t.validation, t.data, t.bookkeeping, t.copies};
    for (size_t i = 0; i < kItems; i++) items[i].bytes += per_item[i] * g.copies;
}

// ---- the budget ----

// A number of bytes from a file holding one (cgroup files); < 0 when absent or "max".
double read_bytes(const std::string& path) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text == "max") return -1;
    try {
        return std::stod(text);
    } catch (const std::exception&) {
        return -1;
    }
}

// The room left under this process's cgroup limits, or < 0 when there are none.
double cgroup_room(std::string& source) {
    double room = -1;
    std::ifstream cg("/proc/self/cgroup");
    std::string line;
    while (std::getline(cg, line)) {
        if (line.rfind("0::", 0) == 0) {  // cgroup v2: this group and its ancestors
            std::string path = line.substr(3);
            for (;;) {
                const std::string dir = "/sys/fs/cgroup" + (path == "/" ? "" : path);
                const double max = read_bytes(dir + "/memory.max");
                const double cur = read_bytes(dir + "/memory.current");
                if (max >= 0 && cur >= 0 && (room < 0 || max - cur < room)) {
                    room = std::max(0.0, max - cur);
                    source = "the cgroup limit " + dir + "/memory.max";
                }
                const size_t slash = path.find_last_of('/');
                if (slash == std::string::npos || slash == 0) {
                    if (path == "/" || path.empty()) break;
                    path = "/";
                } else {
                    path.resize(slash);
                }
            }
        }
    }
    // cgroup v1: a limit near 2^63 means none.
    const double max = read_bytes("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    const double cur = read_bytes("/sys/fs/cgroup/memory/memory.usage_in_bytes");
    if (max >= 0 && cur >= 0 && max < 1e18 && (room < 0 || max - cur < room)) {
        room = std::max(0.0, max - cur);
        source = "the cgroup limit /sys/fs/cgroup/memory/memory.limit_in_bytes";
    }
    return room;
}

std::string number(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    return buf;
}

// The size keys the estimate grows with, and their smallest values.
struct Knob {
    const char* key;
    i64 min;
    i64 (*get)(const Config&);
    void (*set)(Config&, i64);
};

#define PX_KNOB(sec, key, min, type)                                                              \
    Knob {                                                                                        \
#sec "." #key, min,                                                                       \
            [](const Config&                                                                      \
                   c) { return i64(c.sec.key); }, [](Config & c,                                  \
                                                     i64 v) { c.sec.key = static_cast<type>(v); } \
    }
constexpr Knob kKnobs[] = {
    PX_KNOB(train, batch_size, 1, i64),   PX_KNOB(model, seq_len, 1, i64),
    PX_KNOB(model, layers, 1, i64),       PX_KNOB(model, hidden, 1, i64),
    PX_KNOB(model, ffn, 1, i64),          PX_KNOB(model, vocab, 2, i64),
    PX_KNOB(model, heads, 1, i64),        PX_KNOB(train, val_batches, 1, i64),
    PX_KNOB(data, markov_order, 1, i64),  PX_KNOB(layout, dp, 1, int),
    PX_KNOB(layout, pp, 1, int),          PX_KNOB(layout, tp, 1, int),
    PX_KNOB(train, microbatches, 1, i64), PX_KNOB(layout, microbatches, 1, int),
};
#undef PX_KNOB

}  // namespace

MemoryEstimate estimate_memory(const Config& cfg, MemoryScope scope, const MemoryExtras& extras) {
    const MemorySizes s = memory_sizes(cfg);
    const StageParams p = stage_params(s);
    MemoryEstimate e;
    e.items.resize(kItems);
    for (size_t i = 0; i < kItems; i++) e.items[i].what = kItemNames[i];
    const double chunk_layers = std::ceil(s.L / s.S);  // the longest chunk
    if (scope == MemoryScope::process) {
        // Every stage of the pipeline once (the wte of the LM head again on the last one when
        // the pipeline has several), times the replicas and tp ranks.
        const double P = p.wte + p.wpe + s.L * p.layer + p.lnf + (s.pp > 1 ? p.head_wte : 0);
        add_group(e.items, s, p, {P, s.L, s.S, 1, s.pp, 1, s.dp * s.cp * s.tp});
        e.ranks = static_cast<i64>(s.dp * s.cp * s.tp * s.pp);  // < 2^31 (validate_config)
    } else {
        // The larger of the first and the last stage (each with the longest chunks). zbv's V
        // puts both on rank 0, as one stage does; its other ranks hold layers alone.
        const double layers = s.v * chunk_layers;
        const bool one = s.pp == 1 || s.schedule == "zbv";
        std::vector<MemoryItem> first(kItems), last(kItems);
        add_group(first, s, p,
                  {p.wte + p.wpe + layers * p.layer + (one ? p.lnf : 0), layers, s.v,
                   one ? 1.0 : 0.0, 1, one ? 1.0 : 0.0, 1});
        if (one)
            add_group(last, s, p, {layers * p.layer, layers, s.v, 0, 1, 0, 1});
        else
            add_group(last, s, p, {p.head_wte + p.lnf + layers * p.layer, layers, s.v, 1, 1, 1, 1});
        double a = 0, b = 0;
        for (size_t i = 0; i < kItems; i++) a += first[i].bytes, b += last[i].bytes;
        for (size_t i = 0; i < kItems; i++) e.items[i].bytes = (a >= b ? first : last)[i].bytes;
    }
    if (extras.dump)  // the logical state: weights and both moments of the whole model
        e.items[kCopies].bytes += 3 * kEstimateFloat * (p.wte + p.wpe + s.L * p.layer + p.lnf) * s.tp;
    for (const MemoryItem& i : e.items) e.total += i.bytes;
    return e;
}

MemoryBudget memory_budget(const Config& cfg, int processes_on_node) {
    MemoryBudget b;
    if (cfg.train.max_memory_gib > 0) {
        b.bytes = cfg.train.max_memory_gib * 1024 * 1024 * 1024;
        b.source = "train.max_memory_gib = " + number(cfg.train.max_memory_gib);
        return b;
    }
    b.bytes = -1;
    std::ifstream mi("/proc/meminfo");
    std::string line;
    while (std::getline(mi, line)) {
        if (line.rfind("MemAvailable:", 0) != 0) continue;
        std::istringstream in(line.substr(13));
        double kb = 0;
        if (in >> kb) {
            b.bytes = kb * 1024;
            b.source = "MemAvailable in /proc/meminfo";
        }
    }
    std::string cg_source;
    const double room = cgroup_room(cg_source);
    if (room >= 0 && (b.bytes < 0 || room < b.bytes)) {
        b.bytes = room;
        b.source = cg_source;
    }
    if (b.bytes < 0) {  // nothing to read (not Linux?): no check but the limits of the config
        b.bytes = 1e300;
        b.source = "no limit found";
    }
    if (processes_on_node > 1) {
        b.bytes /= processes_on_node;
        b.source += ", shared by the " + std::to_string(processes_on_node) +
                    " processes of this job on the node";
    }
    return b;
}

std::string format_bytes(double bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (bytes >= 1024 && u < 6) bytes /= 1024, u++;
    char buf[48];
    if (u == 0)
        std::snprintf(buf, sizeof buf, "%.0f B", bytes);
    else
        std::snprintf(buf, sizeof buf, "%.3g %s", bytes, units[u]);
    return buf;
}

void check_memory(const Config& cfg, MemoryScope scope, int processes_on_node,
                  const MemoryExtras& extras) {
    const MemoryEstimate e = estimate_memory(cfg, scope, extras);
    const MemoryBudget b = memory_budget(cfg, processes_on_node);
    if (e.total <= b.bytes) return;

    // The key to lower: of those that alone can make the job fit, the one that needs the least
    // change (the largest fraction of its value that fits); if none can, the one whose halving
    // saves the most.
    const Knob* best = nullptr;
    i64 best_fit = -1;
    double best_score = -1;
    for (const Knob& k : kKnobs) {
        const i64 now = k.get(cfg);
        if (now <= k.min) continue;
        Config c = cfg;
        k.set(c, k.min);
        if (estimate_memory(c, scope, extras).total <= b.bytes) {
            i64 lo = k.min, hi = now;  // lo fits, hi does not
            while (hi - lo > 1) {
                const i64 mid = lo + (hi - lo) / 2;
                k.set(c, mid);
                (estimate_memory(c, scope, extras).total <= b.bytes ? lo : hi) = mid;
            }
            const double score = 2 + double(lo) / double(now);  // above any saving's score
            if (score > best_score) best_score = score, best = &k, best_fit = lo;
        } else if (best_fit < 0) {
            k.set(c, std::max(k.min, now / 2));
            const double score = (e.total - estimate_memory(c, scope, extras).total) / e.total;
            if (score > best_score) best_score = score, best = &k;
        }
    }
    std::vector<MemoryItem> parts = e.items;
    std::sort(parts.begin(), parts.end(),
              [](const MemoryItem& a, const MemoryItem& b) { return a.bytes > b.bytes; });
    std::string list;
    for (const MemoryItem& i : parts)
        if (i.bytes > 0.001 * e.total)
            list += (list.empty() ? "" : ", ") + i.what + " " + format_bytes(i.bytes);
    std::string msg = cfg.source_name + ": the job needs about " + format_bytes(e.total) +
                      " of memory in this process (" +
                      (scope == MemoryScope::process
                           ? std::to_string(e.ranks) + " rank" + (e.ranks == 1 ? "" : "s")
                           : std::string("one rank")) +
                      ": " + list + "), more than the " + format_bytes(b.bytes) + " available (" +
                      b.source + ") by " + format_bytes(e.total - b.bytes);
    if (b.bytes > 0) {
        char ratio[32];
        const double r = e.total / b.bytes;
        std::snprintf(ratio, sizeof ratio, r < 10 ? " (%.1fx)" : " (%.0fx)", r);
        msg += ratio;
    }
    if (best) {
        msg += std::string("; ") + best->key + " = " + std::to_string(best->get(cfg)) +
               " makes it too big";
        if (best_fit >= 0)
            msg += ": with " + std::string(best->key) + " <= " + std::to_string(best_fit) +
                   " it would fit";
        else
            msg += ", but even " + std::string(best->key) + " = " + std::to_string(best->min) +
                   " would not fit: lower the model's sizes or the batch";
    }
    msg += b.source.rfind("train.max_memory_gib", 0) == 0
               ? " (or raise train.max_memory_gib)"
               : " (set train.max_memory_gib to allow more, if the machine has it)";
    throw ConfigError(msg);
}

}  // namespace px
