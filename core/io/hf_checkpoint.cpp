// Hugging Face model folders (core/io/hf_checkpoint.h): the weights checked and read through an
// architecture's name table (core/io/hf_architectures.cpp), or written.
//
// Index
//   Expected, expected_tensors   a table expanded for a config: every HF name, its role and shape
//   read_hf_weights              check every tensor, then read the parameters
//   read_hf_init_weights         model.init_from's case: config.json against the job's keys first
//   write_hf_folder              the parameters converted, checked, written with config.json
#include "core/io/hf_checkpoint.h"

#include "core/base/arena.h"
#include "core/base/error.h"
#include "core/base/files.h"
#include "core/io/safetensors_internal.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <unordered_map>

namespace px {

namespace fs = std::filesystem;

namespace {

// ---- a table expanded for a config ----

struct Expected {
    std::string hf;
    const HfNameRow* row = nullptr;
    int entry = -1;          // in the file's ParamTable (param and tied rows)
    i64 expert = -1;         // a stacked row's expert
    std::vector<i64> shape;  // in the file (param and tied rows)
};

bool has(const char* pattern, const char* what) {
    return std::strstr(pattern, what) != nullptr;
}

// Every tensor the architecture's table names for the model mc (table = ParamTable::build(mc)),
// in the state dict's order: a run of per-layer rows goes layer by layer (h.0.*, then h.1.*, ...),
// a run of an expert's rows expert by expert, as transformers lists and shards them. A row is in
// when its parameter is in mc's table, a tied row when mc's head is tied. With a cap, stops after
// `cap` parameter tensors (a config's claim of many layers or experts costs no more than the
// files hold); without one, checks that every parameter of the table is some row's.
std::vector<Expected> expected_tensors(const HfArchitecture& arch, const ModelConfig& mc,
                                       const ParamTable& table, i64 cap = -1) {
    std::unordered_map<std::string, int> entry_of;
    for (size_t i = 0; i < table.entries.size(); i++)
        entry_of.emplace(table.entries[i].name, int(i));
    std::vector<Expected> out;
    std::vector<bool> covered(table.entries.size());
    i64 params = 0;
    const auto full = [&] { return cap >= 0 && params >= cap; };
    // The row for layer i (and expert e), if mc has it.
    auto add = [&](const HfNameRow& row, i64 i, i64 e) {
        if (full()) return;
        Expected x;
        x.hf = hf_name(row.hf, i, e);
        x.row = &row;
        if (row.role != HfRole::buffer) {
            if (row.role == HfRole::tied && !mc.tied_head()) return;
            const auto it = entry_of.find(hf_name(row.px, i));
            if (it == entry_of.end()) {
                PX_ASSERT(row.role == HfRole::param, "a tied row names no parameter: " + x.hf);
                return;  // a parameter this config does not have
            }
            x.entry = it->second;
            const TableEntry& t = table.entries[size_t(it->second)];
            x.shape = t.shape();
            if (row.transform == HfTransform::transpose) {
                PX_ASSERT(x.shape.size() == 2, "a transposed row must be a matrix: " + x.hf);
                std::swap(x.shape[0], x.shape[1]);
            }
            if (row.transform == HfTransform::stack) {
                PX_ASSERT(x.shape.size() == 2 && mc.moe_experts > 0 && t.rows % mc.moe_experts == 0,
                          "a stacked row must be a matrix of moe_experts blocks: " + x.hf);
                x.expert = e;
                x.shape[0] = t.rows / mc.moe_experts;
            }
            if (row.role == HfRole::param) {
                covered[size_t(x.entry)] = true;
                params++;
            }
        }
        out.push_back(std::move(x));
    };
    // Rows [r, end) for layer i: a run of stacked rows expert by expert.
    auto add_rows = [&](const std::span<const HfNameRow> rows, i64 i) {
        for (size_t r = 0; r < rows.size();) {
            if (!has(rows[r].hf, "{e}")) {
                add(rows[r++], i, 0);
                continue;
            }
            size_t end = r;
            while (end < rows.size() && has(rows[end].hf, "{e}")) end++;
            const bool held = entry_of.count(hf_name(rows[r].px, i)) > 0;
            for (i64 e = 0; held && e < mc.moe_experts && !full(); e++)
                for (size_t k = r; k < end; k++) add(rows[k], i, e);
            r = end;
        }
    };
    const std::span<const HfNameRow> rows = arch.names;
    for (size_t r = 0; r < rows.size();) {
        if (!has(rows[r].hf, "{i}")) {
            add_rows(rows.subspan(r++, 1), 0);
            continue;
        }
        size_t end = r;
        while (end < rows.size() && has(rows[end].hf, "{i}")) end++;
        for (i64 i = 0; i < mc.layers && !full(); i++) add_rows(rows.subspan(r, end - r), i);
        r = end;
    }
    if (cap < 0)
        for (size_t i = 0; i < covered.size(); i++)
            PX_ASSERT(covered[i], std::string("the name table of ") + arch.name +
                                      " has no row for parameter " + table.entries[i].name);
    return out;
}

bool readable(SafeDType t) {
    return t == SafeDType::F32 || t == SafeDType::BF16 || t == SafeDType::F16;
}

i64 numel(const std::vector<i64>& shape) {
    i64 n = 1;
    for (i64 d : shape) n *= d;
    return n;
}

i64 first_non_finite(const float* x, i64 n) {
    for (i64 i = 0; i < n; i++)
        if (!std::isfinite(x[i])) return i;
    return -1;
}

std::string number(float x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", double(x));
    return buf;
}

}  // namespace

std::optional<HfInput> hf_input(const std::string& path) {
    auto ends = [&](const char* suffix) {
        const size_t n = std::strlen(suffix);
        return path.size() > n && path.compare(path.size() - n, n, suffix) == 0;
    };
    const FileKind kind = file_kind(path);
    if (kind == FileKind::folder)
        return HfInput{path, (fs::path(path) / "config.json").string(), path};
    if (kind == FileKind::regular && (ends(".safetensors") || ends(".safetensors.index.json"))) {
        const fs::path p(path);
        const fs::path folder = p.has_parent_path() ? p.parent_path() : fs::path(".");
        return HfInput{folder.string(), (folder / "config.json").string(), path};
    }
    return std::nullopt;
}

HfConfig read_hf_config(const HfInput& in) {
    if (in.weights != in.folder && file_kind(in.config) == FileKind::missing)
        throw DataError("safetensors file " + in.weights + " has no config.json beside it (" +
                        in.config +
                        "); Parallax reads a Hugging Face model from the folder "
                        "save_pretrained writes: config.json beside model.safetensors");
    return read_hf_config(in.config);
}

HfReadReport read_hf_weights(const HfInput& in, const HfConfig& cfg, const ModelConfig& mc,
                             const ParamLookup& params) {
    const HfArchitecture& arch = *cfg.arch;
    const SafetensorsSet set(in.weights);  // every header checked
    const std::string missing_tail = std::string(", which ") + arch.name + " with the sizes of " +
                                     cfg.path + " (" + hf_sizes_text(cfg) +
                                     ") holds; the weights are " +
                                     "incomplete, or saved for another config.json";

    // 0. Fewer tensors than the config's model has parameters: one is missing. Found before the
    //    model's table is built, whose size config.json alone sets (n_layer = 10^8 is a table of
    //    a billion entries, while the files' headers are bounded by their size): every layer has
    //    a tensor, so a model of one layer more than the files have tensors has too many
    //    parameter tensors, and it names the first one missing.
    const std::vector<std::string> names = set.names();
    const i64 held = i64(names.size());
    ModelConfig head = cfg.model;
    head.layers = std::min(head.layers, held + 1);
    const std::vector<Expected> first_ones =
        expected_tensors(arch, head, ParamTable::build(head), held + 1);
    if (std::count_if(first_ones.begin(), first_ones.end(),
                      [](const Expected& e) { return e.row->role == HfRole::param; }) > held)
        for (const Expected& e : first_ones)
            if (e.row->role == HfRole::param && !set.has(e.hf))
                throw DataError("safetensors " + set.path() + " has no tensor " + st::quoted(e.hf) +
                                missing_tail);

    const ParamTable file_table = ParamTable::build(cfg.model);
    const ParamTable table = ParamTable::build(mc);
    const std::vector<Expected> want = expected_tensors(arch, cfg.model, file_table);
    auto where = [&](const std::string& hf) {
        return "safetensors file " + set.file_of(hf).path() + ": tensor " + st::quoted(hf);
    };
    const std::string disagree = "; the weights and " + cfg.path + " (" + hf_sizes_text(cfg) +
                                 ") disagree: give the config.json saved with these weights";

    // 1. Names: every tensor of the files is in the table, every parameter is in the files.
    std::unordered_map<std::string, const Expected*> by_name;
    for (const Expected& e : want) by_name.emplace(e.hf, &e);
    for (const std::string& name : names)
        if (!by_name.count(name))
            throw DataError(where(name) + " is not a tensor of " + arch.name + disagree);
    HfReadReport report;
    for (const SafetensorsFile& f : set.files()) report.files.push_back(f.path());
    i64 largest = 0;
    for (const Expected& e : want) {
        if (e.row->role == HfRole::buffer) {
            report.buffers += set.has(e.hf) ? 1 : 0;
            continue;
        }
        if (!set.has(e.hf)) {
            if (e.row->role == HfRole::tied) continue;
            throw DataError("safetensors " + set.path() + " has no tensor " + st::quoted(e.hf) +
                            missing_tail);
        }
        // 2. Dtypes and shapes.
        const SafetensorsEntry& s = set.entry(e.hf);
        if (!readable(s.dtype))
            throw DataError(where(e.hf) + " is stored as " + safe_dtype_name(s.dtype) +
                            "; Parallax reads weights stored as F32, BF16 or F16 (widened "
                            "exactly to fp32): save the model in one of them");
        if (s.shape != e.shape)
            throw DataError(where(e.hf) + " has shape " + st::shape_text(s.shape) + " but " +
                            arch.name + " holds it as " + st::shape_text(e.shape) + disagree);
        largest = std::max(largest, numel(e.shape));
    }
    // The dtype of every parameter, when they share one.
    bool first = true;
    for (const Expected& e : want) {
        if (e.row->role != HfRole::param) continue;
        const SafeDType d = set.entry(e.hf).dtype;
        if (first) report.dtype = d;
        if (report.dtype && *report.dtype != d) report.dtype.reset();
        first = false;
    }

    // 3. Values: finite, and each tied copy equal to its parameter, before any parameter is set.
    std::vector<float> buf(static_cast<size_t>(largest));
    std::vector<float> other;
    std::unordered_map<int, const Expected*> param_of;  // file entry -> its param row
    for (const Expected& e : want)
        if (e.row->role == HfRole::param) param_of.emplace(e.entry, &e);
    for (const Expected& e : want) {
        if (e.row->role == HfRole::buffer || !set.has(e.hf)) continue;
        const i64 n = numel(e.shape);
        set.read_f32(e.hf, buf.data(), n);
        const i64 bad = first_non_finite(buf.data(), n);
        if (bad >= 0)
            throw DataError(where(e.hf) + " holds a non-finite value (" + number(buf[bad]) +
                            ") at element " + std::to_string(bad) +
                            "; the weights are damaged, or the training that wrote them diverged");
        if (e.row->role != HfRole::tied) continue;
        const Expected& p = *param_of.at(e.entry);
        other.resize(size_t(n));
        set.read_f32(p.hf, other.data(), n);
        for (i64 k = 0; k < n; k++)
            if (std::bit_cast<std::uint32_t>(buf[k]) != std::bit_cast<std::uint32_t>(other[k]))
                throw DataError(where(e.hf) + " differs from " + st::quoted(p.hf) + " at element " +
                                std::to_string(k) + " (" + number(buf[k]) + " against " +
                                number(other[k]) + "), but " + arch.name +
                                " ties them and Parallax holds one matrix for both: these weights "
                                "have an untied head, which Parallax cannot compute");
        report.lm_head = true;
        other = {};
    }

    // 4. The parameters, in the job's shapes: a tensor with more rows in the file (wpe, positions
    //    beyond model.seq_len) gives its first rows; a stacked row its expert's block.
    std::unordered_map<std::string, size_t> job_entry;
    for (size_t i = 0; i < table.entries.size(); i++) job_entry.emplace(table.entries[i].name, i);
    for (const Expected& e : want) {
        if (e.row->role != HfRole::param) continue;
        const TableEntry& f = file_table.entries[size_t(e.entry)];
        const auto ti = job_entry.find(f.name);
        PX_ASSERT(ti != job_entry.end(), "the job's model has no parameter " + f.name);
        const TableEntry& t = table.entries[ti->second];
        PX_ASSERT(t.cols == f.cols && t.rows <= f.rows, "shapes checked by the caller: " + f.name);
        float* dst = params(t.name);
        PX_ASSERT(dst != nullptr, "the model has no parameter named " + t.name);
        const i64 n = numel(e.shape);
        set.read_f32(e.hf, buf.data(), n);
        switch (e.row->transform) {
            case HfTransform::none:
                std::copy(buf.begin(), buf.begin() + t.rows * t.cols, dst);
                break;
            case HfTransform::transpose:  // the file holds (cols, rows_in_file)
                for (i64 r = 0; r < t.rows; r++)
                    for (i64 c = 0; c < t.cols; c++)
                        dst[r * t.cols + c] = buf[size_t(c * f.rows + r)];
                break;
            case HfTransform::stack:
                PX_ASSERT(t.rows == f.rows, "a stacked tensor has no rows to drop: " + f.name);
                std::copy(buf.begin(), buf.begin() + n, dst + e.expert * n);
                break;
        }
    }
    return report;
}

void read_hf_init_weights(const HfInput& in, const ModelConfig& mc, const ParamLookup& params) {
    const HfConfig cfg = read_hf_config(in);
    const std::string from = "model.init_from = " + in.folder + ": ";
    const std::vector<std::string> bad = hf_config_differences(cfg, mc);
    if (!bad.empty()) {
        std::string msg = from + "the Hugging Face model differs from this config's: ";
        for (size_t i = 0; i < bad.size(); i++) msg.append(i ? "; " : "").append(bad[i]);
        throw ConfigError(msg + ". Set these model keys to the folder's");
    }
    read_hf_weights(in, cfg, mc, params);
}

std::optional<SafeDType> hf_write_dtype(std::string_view name) {
    if (name == "fp32" || name == "f32" || name == "float32") return SafeDType::F32;
    if (name == "bf16" || name == "bfloat16") return SafeDType::BF16;
    if (name == "fp16" || name == "f16" || name == "float16") return SafeDType::F16;
    return std::nullopt;
}

std::vector<std::string> write_hf_folder(const std::string& folder, const ModelConfig& mc,
                                         const ParamLookup& params, SafeDType dtype,
                                         u64 max_shard_bytes) {
    if (!readable(dtype))
        throw Error(std::string("cannot write a Hugging Face folder in ") + safe_dtype_name(dtype) +
                    "; write F32, BF16 or F16");
    const std::string config = hf_config_text(mc, dtype);  // refuses what no class is
    const HfArchitecture& arch = hf_architecture_for(mc);

    // 1. Every parameter in the file's layout and dtype, checked before anything is written.
    const ParamTable table = ParamTable::build(mc);
    const std::vector<Expected> want = expected_tensors(arch, mc, table);
    std::vector<std::vector<unsigned char>> bytes;
    std::vector<SafetensorsData> data;
    bytes.reserve(want.size());
    std::vector<float> f32, back;
    for (const Expected& e : want) {
        if (e.row->role != HfRole::param) continue;
        const TableEntry& t = table.entries[size_t(e.entry)];
        const i64 n = numel(e.shape);
        const i64 at = e.expert >= 0 ? e.expert * n : 0;  // a stacked row: its expert's block
        PX_ASSERT(params(t.name) != nullptr, "the model has no parameter named " + t.name);
        const float* src = params(t.name) + at;
        f32.assign(src, src + n);
        if (e.row->transform == HfTransform::transpose)
            for (i64 r = 0; r < t.rows; r++)
                for (i64 c = 0; c < t.cols; c++) f32[size_t(c * t.rows + r)] = src[r * t.cols + c];
        const SafeDType to = e.row->store == HfStore::f32 ? SafeDType::F32 : dtype;
        const DType px = *px_dtype_of(to);
        std::vector<unsigned char> b(size_t(n) * dtype_size(px));
        convert(b.data(), px, f32.data(), DType::f32, size_t(n));
        back.resize(size_t(n));
        convert(back.data(), DType::f32, b.data(), px, size_t(n));  // overflow shows as inf
        for (i64 k = 0; k < n; k++) {
            if (!std::isfinite(back[size_t(k)]))
                throw Error("not writing Hugging Face folder " + folder + ": parameter " + t.name +
                            " (" + e.hf + ") holds " + number(f32[size_t(k)]) + " at element " +
                            std::to_string(at + k) +
                            (std::isfinite(f32[size_t(k)])
                                 ? std::string(", beyond the range of ") + safe_dtype_name(to) +
                                       ": write a wider dtype (fp32 or bf16)"
                                 : std::string(": the run that wrote it diverged")));
        }
        bytes.push_back(std::move(b));
        data.push_back({e.hf, to, e.shape, bytes.back().data(), u64(bytes.back().size())});
    }

    // 2. The folder, the weights (model.safetensors, or shards and their index), config.json.
    const FileKind kind = file_kind(folder);
    if (kind != FileKind::folder && kind != FileKind::missing)
        throw DataError("Hugging Face folder " + folder + " is " + file_kind_text(kind) +
                        ", not a folder; give a folder to write config.json and "
                        "model.safetensors into");
    std::error_code ec;
    fs::create_directories(folder, ec);
    if (ec)
        throw StorageError("cannot create the Hugging Face folder " + folder + ": " + ec.message() +
                           "; check the path and its permissions");
    const SafetensorsShards shards =
        write_safetensors_shards(folder, data, max_shard_bytes, kPtMetadata, "model");
    const std::string config_path = (fs::path(folder) / "config.json").string();
    st::AtomicFile f(config_path, "Hugging Face config");
    f.write(config.data(), config.size());
    f.commit();
    std::vector<std::string> files = shards.files;
    if (!shards.index.empty()) files.push_back(shards.index);
    files.push_back(config_path);
    return files;
}

}  // namespace px
