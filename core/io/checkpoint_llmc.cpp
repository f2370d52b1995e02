#include "core/io/checkpoint_llmc.h"

#include "core/base/arena.h"
#include "core/base/error.h"
#include "core/base/files.h"
#include "core/io/checkpoint.h"
#include "core/io/hdf5_util.h"
#include "core/io/hf_checkpoint.h"
#include "core/model/data.h"  // the llm.c magic numbers

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace px {

static_assert(std::endian::native == std::endian::little, "llm.c checkpoints are little-endian");

namespace {

constexpr i64 kHeaderBytes = kLlmcHeaderInts * 4;

// The per-layer llm.c tensors in file order, with the Parallax name of one layer's slice and its
// element count in units of C*C (matrices) or C (vectors): {llmc name, suffix, cc, c}.
struct LayerTensor {
    const char* llmc;
    const char* suffix;  // h.{i}.<suffix>
    int cc;              // element count = cc*C*C + c*C
    int c;
};
constexpr LayerTensor kLayerTensors[] = {
    {"ln1w", "ln_1.weight", 0, 1},
    {"ln1b", "ln_1.bias", 0, 1},
    {"qkvw", "attn.c_attn.weight", 3, 0},
    {"qkvb", "attn.c_attn.bias", 0, 3},
    {"attprojw", "attn.c_proj.weight", 1, 0},
    {"attprojb", "attn.c_proj.bias", 0, 1},
    {"ln2w", "ln_2.weight", 0, 1},
    {"ln2b", "ln_2.bias", 0, 1},
    {"fcw", "mlp.c_fc.weight", 4, 0},
    {"fcb", "mlp.c_fc.bias", 0, 4},
    {"fcprojw", "mlp.c_proj.weight", 4, 0},
    {"fcprojb", "mlp.c_proj.bias", 0, 1},
};

// A contiguous run of floats in the file: one Parallax parameter, or rows that are not one
// (padded vocabulary rows of wte, positions beyond seq_len in wpe) when `name` is empty.
struct Segment {
    const char* llmc;
    std::string name;
    i64 count;
    i64 first_row = 0;  // for padding: the llm.c row it starts at (messages)
};

std::vector<Segment> file_segments(i64 V, i64 Vp, i64 seq_len, i64 maxT, i64 L, i64 C) {
    std::vector<Segment> segs;
    segs.push_back({"wte", "wte", V * C});
    if (Vp > V) segs.push_back({"wte", "", (Vp - V) * C, V});
    segs.push_back({"wpe", "wpe", seq_len * C});
    if (maxT > seq_len) segs.push_back({"wpe", "", (maxT - seq_len) * C, seq_len});
    for (const LayerTensor& t : kLayerTensors)
        for (i64 i = 0; i < L; i++)
            segs.push_back(
                {t.llmc, "h." + std::to_string(i) + "." + t.suffix, t.cc * C * C + t.c * C});
    segs.push_back({"lnfw", "ln_f.weight", C});
    segs.push_back({"lnfb", "ln_f.bias", C});
    return segs;
}

std::string describe(const Segment& s, i64 C, i64 element) {
    if (!s.name.empty())
        return std::string(s.llmc) + " (" + s.name + ") at element " + std::to_string(element);
    return std::string(s.llmc) + " (padding row " + std::to_string(s.first_row + element / C) + ")";
}

// First non-finite element of x[0..n), or -1.
i64 first_non_finite(const float* x, i64 n) {
    for (i64 i = 0; i < n; i++)
        if (!std::isfinite(x[i])) return i;
    return -1;
}

struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_checkpoint(const std::string& path) {
    const FileKind kind = file_kind(path);
    if (kind != FileKind::regular && kind != FileKind::missing)
        throw DataError("llm.c checkpoint " + path + " is " + file_kind_text(kind) +
                        ", not a regular file; give a checkpoint file such as gpt2_124M.bin");
    File f(std::fopen(path.c_str(), "rb"));
    if (!f)
        throw DataError("llm.c checkpoint " + path + ": cannot open it: " + std::strerror(errno) +
                        "; check the path (llm.c's train_gpt2.py writes e.g. gpt2_124M.bin)");
    return f;
}

i64 file_size(std::FILE* f, const std::string& path) {
    struct stat st {};
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode))
        throw DataError("llm.c checkpoint " + path + ": not a readable regular file");
    return i64(st.st_size);
}

// llm.c's GPT-2: its block, with a dense MLP in every layer.
void refuse_llama(const ModelConfig& mc, const char* what) {
    if (mc.llama())
        throw ConfigError(std::string("model.arch = \"llama\", but llm.c checkpoints hold GPT-2 "
                                      "only; ") +
                          what);
}
void refuse_moe(const ModelConfig& mc, const char* what) {
    if (mc.is_moe())
        throw ConfigError("model.moe_experts = " + std::to_string(mc.moe_experts) +
                          ", but llm.c GPT-2 checkpoints hold dense MLPs only; " + what);
}

void check_config(const std::string& path, const LlmcHeader& h, const ModelConfig& mc) {
    refuse_llama(mc, "start a llama model from a Parallax checkpoint or a Hugging Face folder");
    refuse_moe(mc, "set model.moe_experts = 0 to start from one");
    if (mc.ffn != 4 * mc.hidden)
        throw ConfigError("model.ffn = " + std::to_string(mc.ffn) +
                          ", but llm.c GPT-2 checkpoints have an MLP of 4 * model.hidden = " +
                          std::to_string(4 * mc.hidden) +
                          "; set model.ffn = " + std::to_string(4 * mc.hidden));
    std::vector<std::string> bad;
    auto want = [&](i64 file, i64 cfg, const char* what, const char* key) {
        if (file != cfg)
            bad.push_back(std::to_string(file) + " " + what + " but " + key + " = " +
                          std::to_string(cfg));
    };
    want(h.L, mc.layers, "layers", "model.layers");
    want(h.C, mc.hidden, "channels", "model.hidden");
    want(h.NH, mc.heads, "heads", "model.heads");
    want(h.V, mc.vocab, "vocabulary entries", "model.vocab");
    if (h.max_T < mc.seq_len)
        bad.push_back("positions for " + std::to_string(h.max_T) +
                      " tokens but model.seq_len = " + std::to_string(mc.seq_len));
    if (bad.empty()) return;
    std::string msg = path + " has ";
    for (size_t i = 0; i < bad.size(); i++) msg += (i ? ", " : "") + bad[i];
    throw DataError(msg + "; set the model config to match the checkpoint");
}

}  // namespace

LlmcHeader read_llmc_header(const std::string& path) {
    File f = open_checkpoint(path);
    const i64 size = file_size(f.get(), path);
    std::int32_t hd[kLlmcHeaderInts];
    if (size < kHeaderBytes || std::fread(hd, sizeof hd, 1, f.get()) != 1)
        throw DataError("llm.c checkpoint " + path + " is " + std::to_string(size) +
                        " bytes, shorter than the " + std::to_string(kHeaderBytes) +
                        "-byte llm.c header; it is not an llm.c checkpoint, or it was cut short");
    if (hd[0] == kLlmcTokenMagic)
        throw DataError("llm.c checkpoint " + path + " has magic " + std::to_string(hd[0]) +
                        ", the llm.c token-file magic, not the checkpoint magic " +
                        std::to_string(kLlmcCheckpointMagic) +
                        ": it holds training tokens, not weights; give it to data.train_path or "
                        "data.val_path instead");
    if (hd[0] != kLlmcCheckpointMagic)
        throw DataError("llm.c checkpoint " + path + " has magic number " + std::to_string(hd[0]) +
                        " but an llm.c GPT-2 checkpoint starts with " +
                        std::to_string(kLlmcCheckpointMagic) + "; is it an llm.c .bin checkpoint?");
    LlmcHeader h;
    h.version = hd[1];
    if (h.version != 1 && h.version != 3)
        throw DataError(
            "llm.c checkpoint " + path + " has version " + std::to_string(h.version) +
            "; Parallax reads fp32 checkpoints of version 1 and 3 (version 5 is llm.c's bf16 "
            "format: use the fp32 file, e.g. gpt2_124M.bin rather than gpt2_124M_bf16.bin)");
    h.max_T = hd[2];
    h.V = hd[3];
    h.L = hd[4];
    h.NH = hd[5];
    h.C = hd[6];
    h.Vp = h.version == 3 ? hd[7] : h.V;
    const std::pair<const char*, i64> fields[] = {
        {"max_seq_len", h.max_T}, {"vocab_size", h.V}, {"num_layers", h.L},
        {"num_heads", h.NH},      {"channels", h.C},   {"padded_vocab_size", h.Vp}};
    for (const auto& [name, value] : fields)
        if (value <= 0)
            throw DataError("llm.c checkpoint " + path + " has " + name + " = " +
                            std::to_string(value) + " in its header; the file is corrupt");
    if (h.Vp < h.V)
        throw DataError("llm.c checkpoint " + path + " has padded_vocab_size " +
                        std::to_string(h.Vp) + " < vocab_size " + std::to_string(h.V) +
                        "; the file is corrupt");
    // The sizes the header claims must be the file's, before anything is sized by them: a
    // damaged header could otherwise ask for terabytes (or a layer count that takes hours to
    // list). Exact in 128 bits: each field is below 2^31.
    using u128 = unsigned __int128;
    const u128 C = u128(h.C);
    const u128 floats =
        u128(h.Vp) * C + u128(h.max_T) * C + u128(h.L) * (12 * C * C + 13 * C) + 2 * C;
    const u128 expected = u128(kHeaderBytes) + 4 * floats;
    if (expected != u128(size)) {
        const double want = double(expected);
        char claimed[48];
        if (expected < u128(std::numeric_limits<i64>::max()))
            std::snprintf(claimed, sizeof claimed, "%lld", static_cast<long long>(expected));
        else
            std::snprintf(claimed, sizeof claimed, "%.6g", want);
        throw DataError("llm.c checkpoint " + path + " has " + std::to_string(size) +
                        " bytes, but its header (version " + std::to_string(h.version) +
                        ", max_seq_len " + std::to_string(h.max_T) + ", padded vocab " +
                        std::to_string(h.Vp) + ", layers " + std::to_string(h.L) +
                        ", channels " + std::to_string(h.C) + ") describes " + claimed +
                        " bytes of fp32 weights and header; the file is " +
                        (want > double(size) ? "truncated" : "corrupt or not fp32") +
                        ": re-download or re-export it");
    }
    return h;
}

void read_llmc_checkpoint(const std::string& path, const ModelConfig& mc,
                          const ParamLookup& params) {
    const LlmcHeader h = read_llmc_header(path);
    check_config(path, h, mc);
    const i64 C = h.C;
    const std::vector<Segment> segs = file_segments(h.V, h.Vp, mc.seq_len, h.max_T, h.L, C);
    i64 floats = 0, largest = 0;
    for (const Segment& s : segs) {
        floats += s.count;
        largest = std::max(largest, s.count);
    }

    File f = open_checkpoint(path);
    const i64 size = file_size(f.get(), path);
    const i64 expected = kHeaderBytes + 4 * floats;
    const std::string dims = "(version " + std::to_string(h.version) + ", maxT " +
                             std::to_string(h.max_T) + ", Vp " + std::to_string(h.Vp) + ", L " +
                             std::to_string(h.L) + ", C " + std::to_string(C) + ")";
    if (size < expected)
        throw DataError("llm.c checkpoint " + path + " is truncated: its header " + dims +
                        " needs " + std::to_string(expected) + " bytes but the file has " +
                        std::to_string(size) + " bytes; re-download or re-export it");
    if (size > expected)
        throw DataError("llm.c checkpoint " + path + " has " + std::to_string(size) +
                        " bytes but its header " + dims + " needs " + std::to_string(expected) +
                        "; the file is corrupt or not fp32");

    // Pass 1 checks every value, so a bad file leaves the model untouched; pass 2 copies.
    std::vector<float> buf(static_cast<size_t>(largest));
    for (int pass = 0; pass < 2; pass++) {
        if (std::fseek(f.get(), kHeaderBytes, SEEK_SET) != 0)
            throw DataError("llm.c checkpoint " + path + ": cannot seek: " + std::strerror(errno));
        for (const Segment& s : segs) {
            float* dst = buf.data();
            if (pass == 1) {
                if (s.name.empty()) {
                    if (std::fseek(f.get(), long(4 * s.count), SEEK_CUR) != 0)
                        throw DataError("llm.c checkpoint " + path +
                                        ": cannot seek: " + std::strerror(errno));
                    continue;
                }
                dst = params(s.name);
                PX_ASSERT(dst != nullptr, "the model has no parameter named " + s.name);
            }
            if (std::fread(dst, 4, size_t(s.count), f.get()) != size_t(s.count))
                throw DataError(
                    "llm.c checkpoint " + path + ": read failed in " + s.llmc + ": " +
                    (std::ferror(f.get()) ? std::strerror(errno) : "unexpected end of file"));
            if (pass == 0) {
                const i64 bad = first_non_finite(dst, s.count);
                if (bad >= 0)
                    throw DataError("llm.c checkpoint " + path + " holds a non-finite value (" +
                                    std::to_string(dst[bad]) + ") in " + describe(s, C, bad) +
                                    "; the file is corrupt, or the run that wrote it diverged");
            }
        }
    }
}

void write_llmc_checkpoint(const std::string& path, const ModelConfig& mc,
                           const ParamLookup& params) {
    refuse_llama(mc, "this model cannot be exported to llm.c");
    refuse_moe(mc, "this model cannot be exported to llm.c");
    if (mc.ffn != 4 * mc.hidden)
        throw ConfigError("model.ffn = " + std::to_string(mc.ffn) +
                          ", but llm.c GPT-2 checkpoints have an MLP of 4 * model.hidden = " +
                          std::to_string(4 * mc.hidden) +
                          "; this model cannot be exported to llm.c");
    const i64 V = mc.vocab, C = mc.hidden, L = mc.layers, T = mc.seq_len;
    const i64 Vp = (V + 127) / 128 * 128;  // llm.c pads the vocabulary for its kernels
    const i64 limit = std::numeric_limits<std::int32_t>::max();
    PX_ASSERT(V > 0 && C > 0 && L > 0 && T > 0 && mc.heads > 0 && Vp <= limit && C <= limit,
              "model sizes out of range for an llm.c header");
    const std::vector<Segment> segs = file_segments(V, Vp, T, T, L, C);

    // Refuse a file the reader would refuse.
    for (const Segment& s : segs) {
        if (s.name.empty()) continue;
        const float* src = params(s.name);
        PX_ASSERT(src != nullptr, "the model has no parameter named " + s.name);
        const i64 bad = first_non_finite(src, s.count);
        if (bad >= 0)
            throw Error("not writing llm.c checkpoint " + path + ": parameter " +
                        describe(s, C, bad) + " is non-finite (" + std::to_string(src[bad]) +
                        "); the run diverged");
    }

    std::int32_t hd[kLlmcHeaderInts] = {};
    hd[0] = kLlmcCheckpointMagic;
    hd[1] = 3;
    hd[2] = std::int32_t(T);
    hd[3] = std::int32_t(V);
    hd[4] = std::int32_t(L);
    hd[5] = std::int32_t(mc.heads);
    hd[6] = std::int32_t(C);
    hd[7] = std::int32_t(Vp);

    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        throw DataError("cannot write llm.c checkpoint " + path + ": cannot create " + tmp + ": " +
                        std::strerror(errno));
    auto fail = [&](const std::string& what) {
        const std::string err = std::strerror(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        throw DataError("cannot write llm.c checkpoint " + path + ": " + what + ": " + err);
    };
    auto put = [&](const void* data, i64 bytes) {
        const char* p = static_cast<const char*>(data);
        while (bytes > 0) {
            const ssize_t n = ::write(fd, p, size_t(std::min<i64>(bytes, i64(1) << 30)));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) fail("write failed");
            p += n;
            bytes -= n;
        }
    };
    put(hd, sizeof hd);
    const std::vector<float> zeros(
        size_t(std::min<i64>(i64(1) << 16, std::max<i64>(Vp - V, 1) * C)), 0.0f);
    for (const Segment& s : segs) {
        if (!s.name.empty()) {
            put(params(s.name), 4 * s.count);
            continue;
        }
        for (i64 left = s.count; left > 0;) {
            const i64 n = std::min<i64>(left, i64(zeros.size()));
            put(zeros.data(), 4 * n);
            left -= n;
        }
    }
    if (::fsync(fd) != 0) fail("fsync failed");
    if (::close(fd) != 0) {
        const std::string err = std::strerror(errno);
        ::unlink(tmp.c_str());
        throw DataError("cannot write llm.c checkpoint " + path + ": close failed: " + err);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string err = std::strerror(errno);
        ::unlink(tmp.c_str());
        throw DataError("cannot write llm.c checkpoint " + path + ": rename from " + tmp +
                        " failed: " + err);
    }
    // Make the rename itself durable.
    const size_t slash = path.find_last_of('/');
    const std::string dir =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

ModelConfig llmc_model_config(const LlmcHeader& h) {
    ModelConfig mc;
    mc.vocab = h.V;
    mc.seq_len = h.max_T;
    mc.layers = h.L;
    mc.heads = h.NH;
    mc.hidden = h.C;
    mc.ffn = 4 * h.C;
    return mc;
}

WeightsFile sniff_weights_file(const std::string& path, const std::string& role) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
        std::string msg = role;
        msg.append(" ").append(path).append(": cannot open it: ").append(std::strerror(errno));
        throw DataError(msg.append("; check the path"));
    }
    if (!S_ISREG(st.st_mode)) {
        std::string msg = role;
        msg.append(" ").append(path).append(" is ").append(file_kind_text(file_kind(path)));
        msg.append(", not a regular file");
        throw DataError(msg.append("; give the path of a checkpoint file"));
    }
    File f(std::fopen(path.c_str(), "rb"));
    if (!f) {
        std::string msg = role;
        msg.append(" ").append(path).append(": cannot open it: ").append(std::strerror(errno));
        throw DataError(msg.append("; check the file's permissions"));
    }
    unsigned char head[8] = {};
    const size_t n = std::fread(head, 1, sizeof head, f.get());
    static constexpr char kHdf5Signature[] = "\x89HDF\r\n\x1a\n";  // 8 bytes and a NUL
    if (n == sizeof head && std::memcmp(head, kHdf5Signature, sizeof head) == 0)
        return WeightsFile::parallax;
    if (n >= 4) {
        std::int32_t magic = 0;
        std::memcpy(&magic, head, 4);
        if (magic == kLlmcCheckpointMagic) return WeightsFile::llmc;
        if (magic == kLlmcTokenMagic) return WeightsFile::llmc_tokens;
    }
    return WeightsFile::other;
}

namespace {

std::string shape_text(const std::vector<i64>& s) {
    std::string t = "(";
    for (size_t i = 0; i < s.size(); i++) t.append(i ? ", " : "").append(std::to_string(s[i]));
    return t.append(s.size() == 1 ? ",)" : ")");
}

// The model keys of the checkpoint's own config against the job's: every mismatch, naming the
// key and both values.
void check_saved_model(const std::string& path, const ModelConfig& saved, const ModelConfig& mc) {
    std::vector<std::string> bad;
    auto want = [&](const char* key, i64 file, i64 cfg) {
        if (file == cfg) return;
        std::string b = key;
        bad.push_back(b.append(" = ")
                          .append(std::to_string(file))
                          .append(" in the checkpoint but ")
                          .append(std::to_string(cfg))
                          .append(" in this config"));
    };
    want("model.vocab", saved.vocab, mc.vocab);
    want("model.layers", saved.layers, mc.layers);
    want("model.heads", saved.heads, mc.heads);
    want("model.hidden", saved.hidden, mc.hidden);
    want("model.ffn", saved.ffn, mc.ffn);
    if (saved.seq_len < mc.seq_len) {
        std::string b = "model.seq_len = ";
        bad.push_back(b.append(std::to_string(saved.seq_len))
                          .append(" in the checkpoint (rows of wpe) but ")
                          .append(std::to_string(mc.seq_len))
                          .append(" in this config (it may be at most the checkpoint's)"));
    }
    if (bad.empty()) return;
    std::string msg = "model.init_from = ";
    msg.append(path).append(": the checkpoint's model differs from this config's: ");
    for (size_t i = 0; i < bad.size(); i++) msg.append(i ? "; " : "").append(bad[i]);
    msg.append(". Set these model keys to the checkpoint's (parallax inspect ")
        .append(path)
        .append(" shows its config)");
    throw CheckpointError(msg);
}

// The /model tensors of a Parallax checkpoint into the parameters (read_init_weights).
void read_parallax_weights(const std::string& path, const ModelConfig& mc,
                           const ParamLookup& params) {
    // In-process ranks are threads that each read the file: one at a time in HDF5 (hdf5_util.h).
    std::lock_guard<std::recursive_mutex> lock(hdf5_lock());
    const CheckpointReader r(path);  // format, version and meta checksum

    // 1. The model it was written for, by its config; a config this build cannot parse leaves
    //    the decision to the shapes below.
    std::optional<ModelConfig> saved;
    try {
        saved = parse_config(r.meta().config_toml, path + " (its config attribute)").model;
    } catch (const ConfigError&) {
    }
    if (saved) check_saved_model(path, *saved, mc);

    // 2. Every tensor of this config's model, with its shape (wpe may have more rows).
    const ParamTable table = ParamTable::build(mc);
    i64 largest = 0, file_tensors = 0;
    for (const DatasetInfo& d : r.datasets())
        if (d.path.rfind("model/", 0) == 0) file_tensors++;
    for (const TableEntry& e : table.entries) {
        const std::string ds = model_dataset(e.name);
        if (!r.has(ds))
            throw CheckpointError(
                "model.init_from = " + path + ": the checkpoint has no /" + ds +
                ", which this config's model (model.layers = " + std::to_string(mc.layers) +
                ") needs; set the model keys to the checkpoint's (parallax inspect " + path +
                " shows its config)");
        const std::vector<i64> got = r.shape(ds);
        std::vector<i64> want = e.shape();
        const bool wpe_longer =
            e.name == "wpe" && got.size() == 2 && got[1] == e.cols && got[0] > e.rows;
        if (got != want && !wpe_longer)
            throw CheckpointError(
                "model.init_from = " + path + ": the checkpoint's /" + ds + " has shape " +
                shape_text(got) + " but this config (model.vocab = " + std::to_string(mc.vocab) +
                ", model.seq_len = " + std::to_string(mc.seq_len) + ", model.hidden = " +
                std::to_string(mc.hidden) + ", model.ffn = " + std::to_string(mc.ffn) + ") needs " +
                shape_text(want) + "; set the model keys to the checkpoint's (parallax inspect " +
                path + " shows its config)");
        i64 n = 1;
        for (i64 g : got) n *= g;
        largest = std::max(largest, n);
    }
    if (file_tensors != static_cast<i64>(table.entries.size()))
        throw CheckpointError(
            "model.init_from = " + path + ": the checkpoint holds " + std::to_string(file_tensors) +
            " model tensors but this config's model (model.layers = " + std::to_string(mc.layers) +
            ") has " + std::to_string(table.entries.size()) +
            "; set model.layers to the checkpoint's");

    // 3. Pass 1 verifies every checksum and value, so a bad file leaves the model untouched;
    //    pass 2 reads each tensor into its parameter right after looking it up.
    std::vector<float> buf(static_cast<size_t>(largest));
    for (const TableEntry& e : table.entries) {
        const std::string ds = model_dataset(e.name);
        r.read(ds, buf.data());  // throws CheckpointError on a checksum mismatch
        i64 n = 1;
        for (i64 g : r.shape(ds)) n *= g;
        const i64 bad = first_non_finite(buf.data(), n);
        if (bad >= 0)
            throw CheckpointError("model.init_from = " + path + ": /" + ds +
                                  " holds a non-finite value (" + std::to_string(buf[bad]) +
                                  ") at element " + std::to_string(bad) +
                                  "; the run that wrote it diverged: use an earlier checkpoint");
    }
    for (const TableEntry& e : table.entries) {
        const std::string ds = model_dataset(e.name);
        float* dst = params(e.name);
        PX_ASSERT(dst != nullptr, "the model has no parameter named " + e.name);
        i64 n = 1;
        for (i64 g : r.shape(ds)) n *= g;
        if (n == e.numel())
            r.read(ds, dst);
        else  // wpe of a longer sequence: its first seq_len rows (verified in pass 1)
            r.read(ds, Slab{0, e.rows, 0, e.cols}, dst);
    }
}

}  // namespace

void read_init_weights(const std::string& path, const ModelConfig& mc, const ParamLookup& params) {
    if (const std::optional<HfInput> hf = hf_input(path)) {  // a folder, or safetensors in one
        read_hf_init_weights(*hf, mc, params);
        return;
    }
    switch (sniff_weights_file(path, "model.init_from =")) {
        case WeightsFile::parallax:
            read_parallax_weights(path, mc, params);
            return;
        case WeightsFile::llmc:
        case WeightsFile::llmc_tokens:  // its header check says what the file is
            read_llmc_checkpoint(path, mc, params);
            return;
        case WeightsFile::other:
            break;
    }
    std::string msg = "model.init_from = ";
    throw DataError(msg.append(path).append(
        " is neither a Parallax checkpoint (an HDF5 file such as ckpt-00000100.h5, or one made by "
        "parallax convert) nor an llm.c GPT-2 checkpoint (a .bin starting with magic 20240326) "
        "nor a Hugging Face model (a folder holding config.json and model.safetensors); give one "
        "of those, or \"\" for random init"));
}

}  // namespace px
