// Cluster files (cluster.h): one table of keys drives parsing, the required-key check and the
// documentation, so a key is added in one place.
#include "validators/plan/cluster.h"

#include "core/base/error.h"
#include "core/base/files.h"

#include <toml++/toml.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>

namespace px::plan {

namespace {

enum class Kind { integer, number, boolean, text };

struct KeyDef {
    const char* section;
    const char* key;
    Kind kind;
    double lo, hi;  // numbers: lo < value <= hi (integers: lo <= value <= hi)
    bool required;
    const char* type;  // as the docs write it
    const char* doc;
    std::function<void(ClusterSpec&, const toml::node&)> set;
};

template <class T>
std::function<void(ClusterSpec&, const toml::node&)> field(T ClusterSpec::*m) {
    return [m](ClusterSpec& c, const toml::node& n) {
        if constexpr (std::is_same_v<T, std::string>)
            c.*m = n.as_string()->get();
        else if constexpr (std::is_same_v<T, bool>)
            c.*m = n.as_boolean()->get();
        else if constexpr (std::is_same_v<T, int>)
            c.*m = static_cast<int>(n.as_integer()->get());
        else
            c.*m = n.is_integer() ? double(n.as_integer()->get()) : n.as_floating_point()->get();
    };
}

std::function<void(ClusterSpec&, const toml::node&)> link_field(Link ClusterSpec::*l,
                                                                double Link::*m) {
    return [l, m](ClusterSpec& c, const toml::node& n) {
        (c.*l).*m = n.is_integer() ? double(n.as_integer()->get()) : n.as_floating_point()->get();
    };
}

const std::vector<KeyDef>& keys() {
    static const std::vector<KeyDef> k = {
        {"cluster", "name", Kind::text, 0, 0, false, "string",
         "what the machine is, for the plan's header (default: the file's name)",
         field(&ClusterSpec::name)},
        {"cluster", "gpus_per_node", Kind::integer, 1, 1 << 20, true, "int ≥ 1",
         "devices per node, joined by NVLink; tensor parallelism stays inside a node",
         field(&ClusterSpec::gpus_per_node)},
        {"cluster", "ranks_share_node", Kind::boolean, 0, 0, false, "bool",
         "true for ranks that are threads of one machine (in-process CPU ranks): the node's peak "
         "and memory are shared by the ranks on it (default false: each device has its own)",
         field(&ClusterSpec::ranks_share_node)},
        {"cluster", "cores", Kind::integer, 0, 1 << 20, false, "int ≥ 0",
         "with ranks_share_node: the cores the ranks share. A rank runs on one core while no more "
         "ranks than cores can run; more ranks time-share them, and one waiting in the pipeline's "
         "bubble lends its core to the others (default 0: a core per rank)",
         field(&ClusterSpec::cores)},
        {"compute", "fp32", Kind::number, 0, 1e9, true, "float > 0",
         "peak dense fp32 TFLOP/s per device", field(&ClusterSpec::fp32_tflops)},
        {"compute", "bf16", Kind::number, -1, 1e9, false, "float ≥ 0",
         "peak dense bf16 TFLOP/s per device (0 or absent: no bf16)",
         field(&ClusterSpec::bf16_tflops)},
        {"compute", "fp16", Kind::number, -1, 1e9, false, "float ≥ 0",
         "peak dense fp16 TFLOP/s per device (0 or absent: no fp16)",
         field(&ClusterSpec::fp16_tflops)},
        {"compute", "fp8", Kind::number, -1, 1e9, false, "float ≥ 0",
         "peak dense fp8 TFLOP/s per device (0 or absent: no fp8)",
         field(&ClusterSpec::fp8_tflops)},
        {"compute", "achievable", Kind::number, 0, 1, true, "float in (0, 1]",
         "fraction of the peak a training step's matmuls reach (--calibrate fits it)",
         field(&ClusterSpec::achievable)},
        {"memory", "hbm_gib", Kind::number, 0, 1e9, true, "float > 0",
         "device memory in GiB", field(&ClusterSpec::hbm_gib)},
        {"memory", "reserve_gib", Kind::number, -1, 1e9, false, "float ≥ 0",
         "GiB the runtime holds beside the model (driver context, communication buffers, "
         "fragmentation); a layout must fit in hbm_gib - reserve_gib (default 0)",
         field(&ClusterSpec::reserve_gib)},
        {"nvlink", "gb_per_s", Kind::number, 0, 1e9, true, "float > 0",
         "NVLink bandwidth per device, one direction, GB/s",
         link_field(&ClusterSpec::nvlink, &Link::gb_per_s)},
        {"nvlink", "latency_us", Kind::number, -1, 1e9, true, "float ≥ 0",
         "start-up time of one NVLink transfer, µs",
         link_field(&ClusterSpec::nvlink, &Link::latency_us)},
        {"nvlink", "achievable", Kind::number, 0, 1, false, "float in (0, 1]",
         "fraction of gb_per_s a collective reaches (default 1; --calibrate fits it)",
         link_field(&ClusterSpec::nvlink, &Link::achievable)},
        {"ib", "gb_per_s", Kind::number, 0, 1e9, true, "float > 0",
         "InfiniBand bandwidth per device, one direction, GB/s (400 Gb/s = 50 GB/s)",
         link_field(&ClusterSpec::ib, &Link::gb_per_s)},
        {"ib", "latency_us", Kind::number, -1, 1e9, true, "float ≥ 0",
         "start-up time of one InfiniBand transfer, µs",
         link_field(&ClusterSpec::ib, &Link::latency_us)},
        {"ib", "achievable", Kind::number, 0, 1, false, "float in (0, 1]",
         "fraction of gb_per_s a collective reaches (default 1; --calibrate fits it)",
         link_field(&ClusterSpec::ib, &Link::achievable)},
    };
    return k;
}

std::string value_text(const toml::node& n) {
    std::ostringstream s;
    if (const auto* v = n.as_string())
        s << '"' << v->get() << '"';
    else if (const auto* i = n.as_integer())
        s << i->get();
    else if (const auto* f = n.as_floating_point())
        s << f->get();
    else if (const auto* b = n.as_boolean())
        s << (b->get() ? "true" : "false");
    else
        s << (n.is_table() ? "a table" : n.is_array() ? "an array" : "a date or time");
    return s.str();
}

std::string line_of(const toml::node& n) {
    const auto& b = n.source().begin;
    return b.line > 0 ? " (line " + std::to_string(b.line) + ")" : "";
}

std::string section_keys(const std::string& section) {
    std::string s;
    for (const KeyDef& d : keys())
        if (section == d.section) s += std::string(s.empty() ? "" : ", ") + d.key;
    return s;
}

void check_value(const KeyDef& d, const toml::node& n, const std::string& where) {
    const std::string what = where + ": [" + d.section + "] " + d.key + " = " + value_text(n);
    switch (d.kind) {
        case Kind::text:
            if (!n.is_string()) throw ConfigError(what + " must be a string" + line_of(n));
            return;
        case Kind::boolean:
            if (!n.is_boolean())
                throw ConfigError(what + " must be true or false" + line_of(n));
            return;
        case Kind::integer: {
            if (!n.is_integer()) throw ConfigError(what + " must be an integer" + line_of(n));
            const double v = double(n.as_integer()->get());
            if (v < d.lo || v > d.hi)
                throw ConfigError(what + " is out of range: give an " + d.type + line_of(n));
            return;
        }
        case Kind::number: {
            if (!n.is_number()) throw ConfigError(what + " must be a number" + line_of(n));
            const double v =
                n.is_integer() ? double(n.as_integer()->get()) : n.as_floating_point()->get();
            if (!std::isfinite(v) || v <= d.lo || v > d.hi)
                throw ConfigError(what + " is out of range: give a " + d.type + line_of(n));
            return;
        }
    }
}

}  // namespace

ClusterSpec parse_cluster(const std::string& toml_text, const std::string& source) {
    toml::table root;
    try {
        root = toml::parse(std::string_view(toml_text), std::string_view(source));
    } catch (const toml::parse_error& e) {
        const auto& b = e.source().begin;
        throw ConfigError(source + ": TOML syntax error at line " + std::to_string(b.line) +
                          ", column " + std::to_string(b.column) + ": " +
                          std::string(e.description()));
    }
    ClusterSpec c;
    c.source = source;
    std::set<std::string> seen;
    for (const auto& [skey, snode] : root) {
        const std::string section(skey.str());
        if (section_keys(section).empty())
            throw ConfigError(source + ": unknown section [" + section + "]" + line_of(snode) +
                              ": a cluster file has [cluster], [compute], [memory], [nvlink] "
                              "and [ib]");
        if (!snode.is_table())
            throw ConfigError(source + ": " + section + " must be a table ([" + section + "])" +
                              line_of(snode));
        for (const auto& [kkey, knode] : *snode.as_table()) {
            const std::string key(kkey.str());
            const KeyDef* def = nullptr;
            for (const KeyDef& d : keys())
                if (section == d.section && key == d.key) def = &d;
            if (!def)
                throw ConfigError(source + ": unknown key '" + key + "' in [" + section + "]" +
                                  line_of(knode) + " (its keys: " + section_keys(section) + ")");
            check_value(*def, knode, source);
            def->set(c, knode);
            seen.insert(section + "." + key);
        }
    }
    for (const KeyDef& d : keys())
        if (d.required && !seen.count(std::string(d.section) + "." + d.key))
            throw ConfigError(source + ": [" + d.section + "] " + d.key + " is missing: give " +
                              d.type + ", " + d.doc);
    if (c.reserve_gib >= c.hbm_gib)
        throw ConfigError(source + ": [memory] reserve_gib = " + std::to_string(c.reserve_gib) +
                          " leaves nothing of hbm_gib = " + std::to_string(c.hbm_gib) +
                          ": lower reserve_gib");
    if (c.name.empty()) {
        const size_t slash = source.find_last_of('/');
        c.name = slash == std::string::npos ? source : source.substr(slash + 1);
    }
    return c;
}

ClusterSpec load_cluster(const std::string& path) {
    const FileKind k = file_kind(path);
    if (k == FileKind::missing)
        throw ConfigError("cannot read cluster file '" + path +
                          "': no such file; give a .toml cluster file (examples/clusters/)");
    if (k != FileKind::regular)
        throw ConfigError("cannot read cluster file '" + path + "': it is " + file_kind_text(k) +
                          ", not a regular file; give a .toml cluster file");
    std::ifstream in(path, std::ios::binary);
    if (!in)
        throw ConfigError("cannot read cluster file '" + path + "': " + std::strerror(errno));
    std::ostringstream ss;
    ss << in.rdbuf();
    return parse_cluster(ss.str(), path);
}

std::vector<ClusterKeyDoc> cluster_key_docs() {
    std::vector<ClusterKeyDoc> out;
    for (const KeyDef& d : keys()) out.push_back({d.section, d.key, d.type, d.doc, d.required});
    return out;
}

double peak_tflops(const ClusterSpec& c, const std::string& dtype) {
    const double v = dtype == "fp32"   ? c.fp32_tflops
                     : dtype == "bf16" ? c.bf16_tflops
                     : dtype == "fp16" ? c.fp16_tflops
                     : dtype == "fp8"  ? c.fp8_tflops
                                       : -1;
    if (v < 0) throw ConfigError(c.source + ": no peak for dtype '" + dtype + "'");
    if (v == 0)
        throw ConfigError(c.source + ": [compute] " + dtype +
                          " is not given (or 0): this machine has no " + dtype +
                          " peak; give it, or plan another precision");
    return v;
}

}  // namespace px::plan
