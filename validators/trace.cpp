#include "validators/trace.h"

#include "validators/pieces.h"

#include "core/io/checkpoint.h"  // checksum_f32
#include "core/comm/comm.h"
#include "core/model/data.h"
#include "core/base/error.h"
#include "core/base/files.h"
#include "core/io/hdf5_util.h"
#include "core/train/job.h"

#include <unistd.h>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <unordered_map>

namespace px {

namespace {

using namespace h5;
constexpr const char* kFormat = "parallax-trace";
constexpr std::int64_t kVersion = 1;

std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); i++) {
        if (i) s += '\n';
        s += v[i];
    }
    return s;
}

std::vector<std::string> split_lines(const std::string& s) {
    std::vector<std::string> out;
    std::stringstream in(s);
    std::string line;
    while (std::getline(in, line))
        if (!line.empty()) out.push_back(line);
    return out;
}

[[noreturn]] void fail(const std::string& path, const std::string& what) {
    throw DataError("golden trace " + path + ": " + what + hdf5_detail());
}

// Groups "probes/3/fwd/2/attn.qkv" one level at a time, each with compact storage.
void ensure_groups(hid_t file, const std::string& path, std::set<std::string>& made,
                   const std::string& where) {
    size_t at = 0;
    while ((at = path.find('/', at + 1)) != std::string::npos) {
        const std::string g = path.substr(0, at);
        if (made.count(g)) continue;
        H gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
        if (!gcpl.ok() || !compact_storage(gcpl.get())) fail(where, "cannot set up group " + g);
        H grp(H5Gcreate2(file, g.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose);
        if (!grp.ok()) fail(where, "cannot create group " + g);
        made.insert(g);
    }
}

}  // namespace

void write_trace(const std::string& path, const ProbeRecorder& rec, const TraceInfo& info) {
    const std::filesystem::path p(path);
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
    std::string tmp_name = ".";
    tmp_name.append(p.filename().string()).append(".tmp-").append(std::to_string(::getpid()));
    const std::string tmp = (p.has_parent_path() ? p.parent_path() : std::filesystem::path("."))
                                .append(tmp_name)
                                .string();
    {
        QuietHdf5 quiet;
        H fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
        H fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
        if (!fapl.ok() || !fcpl.ok() ||
            H5Pset_libver_bounds(fapl.get(), H5F_LIBVER_V18, H5F_LIBVER_V110) < 0 ||
            !compact_storage(fcpl.get()))
            fail(path, "cannot set up the file's properties");
        H file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), H5Fclose);
        if (!file.ok()) fail(path, "cannot create " + tmp + "; is the folder writable?");
        if (!put_string(file.get(), "format", kFormat) ||
            !put_i64(file.get(), "format_version", kVersion) ||
            !put_string(file.get(), "created", iso_time_utc()) ||
            !put_string(file.get(), "config", info.config_toml) ||
            !put_string(file.get(), "patterns", joined(info.patterns)) ||
            !put_i64(file.get(), "stride", info.stride) ||
            !put_i64(file.get(), "steps", info.steps) ||
            (!info.data_hash.empty() && !put_string(file.get(), "data_hash", info.data_hash)) ||
            !put_string(file.get(), "source", info.source) ||
            (!info.precision.empty() && !put_string(file.get(), "precision", info.precision)) ||
            (!info.layout_json.empty() && !put_string(file.get(), "layout", info.layout_json)))
            fail(path, "cannot write the attributes");
        const std::string order = joined(info.order);
        const hsize_t n = std::max<hsize_t>(order.size(), 1);
        H space(H5Screate_simple(1, &n, nullptr), H5Sclose);
        H ds(H5Dcreate2(file.get(), "order", H5T_STD_U8LE, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                        H5P_DEFAULT),
             H5Dclose);
        std::string buf = order;
        buf.resize(n, '\n');
        if (!ds.ok() ||
            H5Dwrite(ds.get(), H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
            fail(path, "cannot write /order");
        std::set<std::string> made;
        for (const std::string& name : info.order) {
            std::vector<i64> shape;
            const std::vector<float> data = rec.unshard(name, &shape);
            const std::string dpath = "probes/" + name;
            ensure_groups(file.get(), dpath, made, path);
            std::vector<hsize_t> dims(shape.begin(), shape.end());
            if (dims.empty()) dims.push_back(data.size());
            H dspace(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                     H5Sclose);
            H d(H5Dcreate2(file.get(), dpath.c_str(), H5T_IEEE_F32LE, dspace.get(), H5P_DEFAULT,
                           H5P_DEFAULT, H5P_DEFAULT),
                H5Dclose);
            if (!d.ok() ||
                H5Dwrite(d.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()) <
                    0 ||
                !put_u64(d.get(), "checksum",
                         checksum_f32(data.data(), static_cast<i64>(data.size()))))
                fail(path, "cannot write probe " + name);
        }
        if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0 || file.close() < 0)
            fail(path, "cannot close " + tmp);
    }
    std::error_code ec;
    std::filesystem::rename(tmp, path, ec);
    if (ec) {
        std::filesystem::remove(tmp);
        throw DataError("golden trace " + path + ": cannot rename " + tmp +
                        " to it: " + ec.message());
    }
}

std::string data_fingerprint(const Config& cfg, i64 steps) {
    const std::unique_ptr<TokenSource> source = make_source(cfg);
    const i64 T = cfg.model.seq_len, B = cfg.train.batch_size;
    std::vector<int> tokens(static_cast<size_t>(B * (T + 1)));
    std::uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a, 64 bit, over the tokens' bytes
    for (i64 step = 0; step < steps; step++) {
        source->sample(tokens.data(), T, Split::train, step, 0, B);
        const auto* bytes = reinterpret_cast<const unsigned char*>(tokens.data());
        for (size_t i = 0; i < tokens.size() * sizeof(int); i++) {
            h ^= bytes[i];
            h *= 0x100000001b3ull;
        }
    }
    char text[24];
    std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(h));
    return text;
}

i64 record_trace(const Config& cfg, const std::vector<std::string>& patterns, i64 stride, i64 steps,
                 const std::string& path, const Cancel& cancel) {
    ProbeRecorder rec(patterns, stride);
    rec.exclude({"*/mgrad/**"});
    {
        Job job(cfg);
        job.set_probes(&rec);
        while (job.steps_done() < steps) {
            job.step();
            cancel.check();
        }
    }
    TraceInfo info;
    info.config_toml = config_to_toml(cfg);
    info.patterns = patterns;
    info.stride = stride;
    info.steps = steps;
    info.order = rec.names();
    info.data_hash = data_fingerprint(cfg, steps);
    write_trace(path, rec, info);
    return rec.bytes();
}

struct TraceReader::Impl {
    std::string path;
    TraceInfo info;
    H file;
    std::unordered_map<std::string, std::vector<TracePiece>> pieces;  // /pieces, by probe
};

namespace {

// "3,0,17" -> {3, 0, 17}; false on anything else.
bool parse_index_list(const std::string& s, std::vector<i64>& out) {
    out.clear();
    std::stringstream in(s);
    std::string item;
    while (std::getline(in, item, ',')) {
        if (item.empty()) return false;
        char* end = nullptr;
        const long long v = std::strtoll(item.c_str(), &end, 10);
        if (*end != '\0' || v < 0) return false;
        out.push_back(v);
    }
    return !out.empty();
}

// A uint8 dataset of text (/order, /pieces), whole.
std::string read_text(hid_t file, const char* name, const std::string& path) {
    H ds(H5Dopen2(file, name, H5P_DEFAULT), H5Dclose);
    H space(ds.ok() ? H5Dget_space(ds.get()) : -1, H5Sclose);
    const hssize_t n = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
    if (n < 0) fail(path, std::string("/") + name + " is missing or damaged");
    if (const std::string big = oversized(ds.get(), std::string("/") + name); !big.empty())
        fail(path, big + "; the trace is damaged");
    std::string buf(static_cast<size_t>(n), '\0');
    if (H5Dread(ds.get(), H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf.data()) < 0)
        fail(path, std::string("cannot read /") + name);
    return buf;
}

}  // namespace

TraceReader::TraceReader(const std::string& path) : impl_(std::make_unique<Impl>()) {
    impl_->path = path;
    QuietHdf5 quiet;
    if (!std::filesystem::exists(path)) fail(path, "no such file; record one with parallax record");
    if (const FileKind k = file_kind(path); k != FileKind::regular)
        fail(path, std::string("is ") + file_kind_text(k) +
                       ", not a trace file; give a file written by parallax record");
    impl_->file = H(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
    if (!impl_->file.ok()) fail(path, "is not an HDF5 file (or is damaged)");
    const hid_t f = impl_->file.get();
    std::string format, patterns;
    std::int64_t version = 0;
    if (!get_string(f, "format", format) || format != kFormat)
        fail(path, "is not a parallax trace (format attribute \"" + format +
                       "\"); record one with parallax record");
    if (!get_number(f, "format_version", H5T_NATIVE_INT64, version) || version != kVersion)
        fail(path, "format_version " + std::to_string(version) + ", this build reads " +
                       std::to_string(kVersion));
    TraceInfo& info = impl_->info;
    if (!get_string(f, "config", info.config_toml) || !get_string(f, "patterns", patterns) ||
        !get_number(f, "stride", H5T_NATIVE_INT64, info.stride) ||
        !get_number(f, "steps", H5T_NATIVE_INT64, info.steps))
        fail(path, "its attributes are missing or damaged");
    info.patterns = split_lines(patterns);
    if (H5Aexists(f, "data_hash") > 0 && !get_string(f, "data_hash", info.data_hash))
        fail(path, "its data_hash attribute is damaged");
    for (const char* key : {"source", "precision", "layout"}) {
        if (H5Aexists(f, key) <= 0) continue;
        std::string value;
        if (!get_string(f, key, value)) fail(path, std::string("its ") + key + " attribute is damaged");
        (key[0] == 's' ? info.source : key[0] == 'p' ? info.precision : info.layout_json) = value;
    }
    info.order = split_lines(read_text(f, "order", path));
    if (H5Lexists(f, "pieces", H5P_DEFAULT) > 0) {
        for (const std::string& line : split_lines(read_text(f, "pieces", path))) {
            std::vector<std::string> cols;
            std::stringstream in(line);
            std::string col;
            while (std::getline(in, col, '\t')) cols.push_back(col);
            TracePiece p;
            char* end = nullptr;
            bool ok = cols.size() == 4;
            if (ok) p.rank = static_cast<int>(std::strtol(cols[1].c_str(), &end, 10));
            ok = ok && *end == '\0' && p.rank >= 0 && parse_index_list(cols[2], p.slab.lo) &&
                 parse_index_list(cols[3], p.slab.hi) && p.slab.lo.size() == p.slab.hi.size();
            for (size_t d = 0; ok && d < p.slab.lo.size(); d++) ok = p.slab.lo[d] <= p.slab.hi[d];
            if (!ok) fail(path, "/pieces has a damaged line: \"" + line + "\"");
            impl_->pieces[cols[0]].push_back(std::move(p));
        }
    }
}

TraceReader::~TraceReader() {
    QuietHdf5 quiet;
    impl_->file.close();
}

const TraceInfo& TraceReader::info() const {
    return impl_->info;
}
const std::string& TraceReader::path() const {
    return impl_->path;
}

std::vector<float> TraceReader::read(const std::string& name, std::vector<i64>* shape) const {
    QuietHdf5 quiet;
    const std::string& path = impl_->path;
    const std::string dpath = "probes/" + name;
    if (H5Lexists(impl_->file.get(), "probes", H5P_DEFAULT) <= 0)
        fail(path, "has no /probes group");
    H ds(H5Dopen2(impl_->file.get(), dpath.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.ok()) fail(path, "probe " + name + " is missing");
    H space(H5Dget_space(ds.get()), H5Sclose);
    const int rank = space.ok() ? H5Sget_simple_extent_ndims(space.get()) : -1;
    if (rank < 1 || rank > 8) fail(path, "probe " + name + " has a damaged shape");
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
    if (const std::string big = oversized(ds.get(), "probe " + name); !big.empty())
        fail(path, big + "; the trace is damaged");
    i64 count = 1;
    shape->assign(dims.begin(), dims.end());
    for (hsize_t d : dims) count *= static_cast<i64>(d);
    std::vector<float> out(static_cast<size_t>(count));
    std::uint64_t stored = 0;
    if (H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0 ||
        !get_number(ds.get(), "checksum", H5T_NATIVE_UINT64, stored))
        fail(path, "cannot read probe " + name);
    if (checksum_f32(out.data(), count) != stored)
        fail(path, "probe " + name + " fails its checksum: the file is damaged; record it again");
    return out;
}

const std::vector<TracePiece>& TraceReader::pieces(const std::string& name) const {
    static const std::vector<TracePiece> none;
    const auto it = impl_->pieces.find(name);
    return it == impl_->pieces.end() ? none : it->second;
}

std::vector<TracePiece> TraceReader::replicas(const std::string& name) const {
    QuietHdf5 quiet;
    const std::string& path = impl_->path;
    const std::string gpath = "replicas/" + name;
    std::vector<TracePiece> out;
    const hid_t f = impl_->file.get();
    if (H5Lexists(f, "replicas", H5P_DEFAULT) <= 0) return out;
    // Each level of the probe's path must exist before the next is asked (H5Lexists).
    for (size_t at = gpath.find('/'); at != std::string::npos; at = gpath.find('/', at + 1))
        if (H5Lexists(f, gpath.substr(0, at).c_str(), H5P_DEFAULT) <= 0) return out;
    if (H5Lexists(f, gpath.c_str(), H5P_DEFAULT) <= 0) return out;
    H grp(H5Gopen2(f, gpath.c_str(), H5P_DEFAULT), H5Gclose);
    H5G_info_t gi{};
    if (!grp.ok() || H5Gget_info(grp.get(), &gi) < 0) fail(path, "/" + gpath + " is damaged");
    for (hsize_t k = 0; k < gi.nlinks; k++) {
        char member[64] = {};
        if (H5Lget_name_by_idx(grp.get(), ".", H5_INDEX_NAME, H5_ITER_INC, k, member,
                               sizeof member, H5P_DEFAULT) < 0)
            fail(path, "/" + gpath + " is damaged");
        TracePiece p;
        char* end = nullptr;
        p.rank = static_cast<int>(std::strtol(member, &end, 10));
        if (*end != '\0' || p.rank < 0) fail(path, "/" + gpath + "/" + member + " is not a rank");
        const std::string where = "/" + gpath + "/" + member;
        H ds(H5Dopen2(grp.get(), member, H5P_DEFAULT), H5Dclose);
        std::vector<i64> lo, hi;
        if (!ds.ok() || !get_i64_array(ds.get(), "lo", lo) || !get_i64_array(ds.get(), "hi", hi) ||
            lo.size() != hi.size())
            fail(path, where + " lacks its lo/hi attributes");
        p.slab = Hyperslab{lo, hi};
        H space(H5Dget_space(ds.get()), H5Sclose);
        const hssize_t n = space.ok() ? H5Sget_simple_extent_npoints(space.get()) : -1;
        bool ok = n >= 0;
        for (size_t d = 0; ok && d < lo.size(); d++) ok = lo[d] <= hi[d];
        if (!ok || p.slab.numel() != n) fail(path, where + ": its size is not its slab's");
        p.values.resize(static_cast<size_t>(n));
        std::uint64_t stored = 0;
        if (H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, p.values.data()) < 0 ||
            !get_number(ds.get(), "checksum", H5T_NATIVE_UINT64, stored))
            fail(path, "cannot read " + where);
        if (checksum_f32(p.values.data(), n) != stored)
            fail(path, where + " fails its checksum: the file is damaged; record it again");
        out.push_back(std::move(p));
    }
    return out;
}

void check_trace_config(const TraceInfo& trace, const Config& cfg, const std::string& path) {
    const Config t = parse_config(trace.config_toml, path);
    std::vector<std::string> bad;
    if (!(t.model == cfg.model)) bad.push_back("[model]");
    TrainConfig a = t.train, b = cfg.train;
    a.threads = b.threads = 0;
    a.steps = b.steps = 0;  // the run's steps are the trace's, set by the caller
    if (!(a == b)) bad.push_back("[train]");
    if (!(t.data == cfg.data)) bad.push_back("[data]");
    if (t.numerics.block != cfg.numerics.block) bad.push_back("numerics.block");
    if (t.train.steps != cfg.train.steps) bad.push_back("train.steps (the learning-rate schedule)");
    if (bad.empty()) {
        if (trace.data_hash.empty()) return;  // a trace from before data hashes were recorded
        const std::string here = data_fingerprint(cfg, trace.steps);
        if (here != trace.data_hash)
            throw DataError("golden trace " + path +
                            ": this machine's data source gives other "
                            "tokens for the recorded steps than the recording machine's (data "
                            "hash " +
                            here + ", the trace's " + trace.data_hash +
                            "), so no layout could match it. The same config draws the same "
                            "tokens only where libm does too (the Markov table) and the data "
                            "files are the same; record the trace on this machine, or copy the "
                            "data files");
        return;
    }
    std::string msg = "golden trace " + path + " was recorded from another job: ";
    for (size_t i = 0; i < bad.size(); i++) msg += (i ? ", " : "") + bad[i];
    msg +=
        " differ. Validate the config it was recorded from (its config attribute; parallax "
        "record writes it), changing only [layout]";
    throw ConfigError(msg);
}

GoldenResult compare_to_trace(const TraceReader& trace,
                              const std::vector<const ProbeRecorder*>& ranks, int rank0,
                              bool whole) {
    GoldenResult g;
    const std::vector<std::string>& order = trace.info().order;
    for (size_t i = 0; i < order.size(); i++) {
        const std::string& name = order[i];
        bool seen = false;
        for (const ProbeRecorder* r : ranks) seen = seen || r->has(name);
        if (!seen) {
            g.missing++;
            continue;
        }
        std::vector<i64> shape;
        const std::vector<float> want = trace.read(name, &shape);
        const PieceCheck c = check_pieces(name, name, want, shape, ranks);
        g.max_ulp = worse_ulp(g.max_ulp, c.worst_ulp());
        if (whole && c.uncovered > 0) {  // elements no rank's pieces hold were not compared
            g.partial++;
            if (g.partial_probe.empty()) g.partial_probe = name;
        }
        g.probes++;
        if (const RankPieces* d = c.first_differing()) {
            g.first_order = static_cast<i64>(i);
            g.rank = rank0 + d->rank;
            g.first = d->cmp;
            break;  // what follows the first difference is its consequence
        }
    }
    return g;
}

namespace {

// A Comparison as words for a communicator, and back.
std::vector<i64> pack(const Comparison& c) {
    std::vector<i64> w{c.count,
                       c.differing,
                       c.max_ulp,
                       c.first,
                       static_cast<i64>(c.shape.size()),
                       static_cast<i64>(c.first_index.size()),
                       static_cast<i64>(c.name.size())};
    for (i64 d : c.shape) w.push_back(d);
    for (i64 d : c.first_index) w.push_back(d);
    for (double x : {c.first_reference, c.first_candidate, c.max_abs, c.max_rel}) {
        i64 b;
        std::memcpy(&b, &x, sizeof b);
        w.push_back(b);
    }
    for (char ch : c.name) w.push_back(static_cast<unsigned char>(ch));
    return w;
}

Comparison unpack(const std::vector<i64>& w) {
    Comparison c;
    size_t at = 0;
    c.count = w[at++];
    c.differing = w[at++];
    c.max_ulp = w[at++];
    c.first = w[at++];
    const i64 ns = w[at++], ni = w[at++], nn = w[at++];
    for (i64 k = 0; k < ns; k++) c.shape.push_back(w[at++]);
    for (i64 k = 0; k < ni; k++) c.first_index.push_back(w[at++]);
    double* xs[] = {&c.first_reference, &c.first_candidate, &c.max_abs, &c.max_rel};
    for (double* x : xs) std::memcpy(x, &w[at++], sizeof(double));
    for (i64 k = 0; k < nn; k++) c.name.push_back(static_cast<char>(w[at++]));
    return c;
}

}  // namespace

GoldenResult combine_golden(const GoldenResult& mine, const TraceReader& trace,
                            const ProbeRecorder& rec, comm::Communicator& world) {
    // The earliest difference over the ranks, and the worst distance.
    i64 key[2] = {mine.first_order < 0 ? INT64_MAX : mine.first_order * world.size() + mine.rank,
                  mine.max_ulp == kNoUlp ? INT64_MAX : mine.max_ulp};
    std::vector<i64> all(static_cast<size_t>(2 * world.size()));
    world.all_gather(all.data(), key, 2);
    i64 best = INT64_MAX, worst = 0, probes = mine.probes;
    for (int k = 0; k < world.size(); k++) {
        best = std::min(best, all[static_cast<size_t>(2 * k)]);
        worst = std::max(worst, all[static_cast<size_t>(2 * k + 1)]);
    }
    world.all_reduce_max(&probes, 1);
    // Probes of the trace that no rank recorded (each rank holds its stage's and shard's only).
    std::vector<i64> held(trace.info().order.size());
    for (size_t i = 0; i < held.size(); i++) held[i] = rec.has(trace.info().order[i]) ? 1 : 0;
    world.all_reduce_max(held.data(), static_cast<i64>(held.size()));
    GoldenResult total;
    total.probes = probes;
    if (best == INT64_MAX)
        for (i64 h : held) total.missing += h == 0 ? 1 : 0;
    total.max_ulp = worst == INT64_MAX ? kNoUlp : worst;
    if (best != INT64_MAX) {
        const int owner = static_cast<int>(best % world.size());
        total.first_order = best / world.size();
        total.rank = owner;
        if (owner == 0 && world.rank() == 0) {
            total.first = mine.first;
        } else if (world.rank() == owner) {
            const std::vector<i64> w = pack(mine.first);
            const i64 n = static_cast<i64>(w.size());
            world.send(&n, 1, 0, 7);
            world.send(w.data(), n, 0, 7);
        } else if (world.rank() == 0) {
            i64 n = 0;
            world.recv(&n, 1, owner, 7);
            std::vector<i64> w(static_cast<size_t>(n));
            world.recv(w.data(), n, owner, 7);
            total.first = unpack(w);
        }
    }
    return total;
}

}  // namespace px
