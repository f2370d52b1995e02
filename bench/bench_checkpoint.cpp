// bench_checkpoint: write and read bandwidth of a GPT-2 124M checkpoint (weights and both Adam
// moments, about 1.5 GB of float32) beside the disk's raw write speed measured with dd.
//
//   build/bench/bench_checkpoint DIR [--small]
//   mpirun -np 4 --oversubscribe --allow-run-as-root build/bench/bench_checkpoint DIR [--small]
//
// Write: from creating the file to the committed rename (checksums, fsync of the file and the
// folder included). Under mpirun every rank writes its rows of every matrix (and its columns of
// every vector) through parallel HDF5 and the checksums are combined by an all-reduce.
// Read: the file's pages are dropped from the page cache first (posix_fadvise DONTNEED after
// the fsync; "cold"), then read again ("warm"). One process reads and verifies every checksum;
// under mpirun every rank also reads its own hyperslabs and the partial checksums are summed
// and compared with the stored ones (the composable checksum at work).
// Checks its results: every value read back equals the value written, bit for bit, and every
// checksum verifies.
// --small: a 2-layer GPT with an 8192-token vocabulary (about 255 MB) for a quick look.
//
// Saving during training: peak memory of a run's checkpoint save, per rank (--no-save-memory
// skips it). A dp·ZeRO-3 job of GPT-2 shapes with 2 layers, V = 8192, T = 256 (21 M parameters,
// 85 MB of weights) on 4 in-process ranks (under mpirun: one rank per process) saves twice: per
// rank (RunCheckpoints: every rank writes its hyperslabs; the first save warms up, the second is
// measured) and by the old gather path (gather_full on every rank, then rank 0 writes the
// logical state). Measured: the growth of the peak resident size (VmHWM, reset through
// /proc/self/clear_refs) while each runs; in-process that is the 4 ranks together (shown also
// divided by 4), under mpirun each process's own. Beside it, the per-rank save's largest staging
// buffer (counted). Checks: both files hold the same tensors (every stored checksum equal).
#include "core/base/arena.h"
#include "core/io/checkpoint.h"
#include "core/comm/run_ranks.h"
#include "core/comm/mpi.h"
#include "core/train/checkpointing.h"
#include "core/base/rng.h"
#include "core/io/state.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

using namespace px;

namespace {

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The value of element i of dataset kind k (0 weights, 1 m, 2 v) of tensor id: a slice of a
// Philox normal draw, so any rank can generate any piece of it.
void fill(float* out, i64 n, int kind, int id, i64 first) {
    fill_normal(out, n, 0.0f, kind == 2 ? 1e-3f : 0.02f, 2024 + static_cast<u64>(kind),
                static_cast<u32>(id), static_cast<u64>(first));
}

const char* kKinds[3] = {"model", "m", "v"};
std::string dataset_of(int kind, const std::string& name) {
    return kind == 0 ? model_dataset(name) : moment_dataset(kKinds[kind][0], name);
}

// This rank's piece of a tensor: rows of a matrix, columns of a vector.
Slab piece(const TableEntry& e, int rank, int size) {
    if (e.rows > 1) {
        const i64 r0 = e.rows * rank / size, r1 = e.rows * (rank + 1) / size;
        return {r0, r1 - r0, 0, e.cols};
    }
    const i64 c0 = e.cols * rank / size, c1 = e.cols * (rank + 1) / size;
    return {0, 1, c0, c1 - c0};
}

void drop_cache(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
}

// One process reads every tensor (verifying its checksum as it reads); returns seconds.
// Compares with the generated values outside the timed part.
double read_all(const std::string& path, const ParamTable& table, i64& wrong) {
    double reading = 0;
    const double t0 = now_s();
    CheckpointReader r(path);  // opening verifies the meta and the history
    reading += now_s() - t0;
    std::vector<float> buf, want;
    for (const TableEntry& e : table.entries)
        for (int k = 0; k < 3; k++) {
            buf.resize(static_cast<size_t>(e.numel()));
            const double a = now_s();
            r.read(dataset_of(k, e.name), buf.data());
            reading += now_s() - a;
            want.resize(buf.size());
            fill(want.data(), e.numel(), k, e.id, 0);
            if (std::memcmp(want.data(), buf.data(), buf.size() * 4) != 0) wrong++;
        }
    return reading;
}

std::string run_dd(const std::string& dir, int mib) {
    const std::string file = dir + "/dd.tmp";
    for (const char* flags : {"oflag=direct conv=fsync", "conv=fsync"}) {
        const std::string cmd = "dd if=/dev/zero of=" + file + " bs=1M count=" +
                                std::to_string(mib) + " " + flags + " 2>&1";
        FILE* p = popen(cmd.c_str(), "r");
        if (!p) continue;
        std::string out, last;
        char line[512];
        while (std::fgets(line, sizeof line, p)) last = line;
        const int rc = pclose(p);
        std::remove(file.c_str());
        if (rc == 0) {
            while (!last.empty() && (last.back() == '\n' || last.back() == '\r')) last.pop_back();
            return last + "  [dd bs=1M count=" + std::to_string(mib) + " " + flags + "]";
        }
    }
    return "dd failed";
}

// ---- saving during training: peak memory per rank ----

i64 status_kib(const char* key) {  // a line of /proc/self/status, in KiB (-1: absent)
    std::ifstream f("/proc/self/status");
    std::string k;
    while (f >> k) {
        if (k == key) {
            i64 v = -1;
            f >> v;
            return v;
        }
        std::getline(f, k);
    }
    return -1;
}

// Resets this process's peak resident size to its current one; false where Linux cannot.
bool reset_peak() {
    std::ofstream f("/proc/self/clear_refs");
    f << "5";
    f.flush();
    return static_cast<bool>(f) && status_kib("VmHWM:") >= 0;
}

struct SaveMemory {
    i64 per_rank_kib = -1, gather_kib = -1;  // peak growth while each path saved (-1: unknown)
    i64 staging_bytes = 0;                   // the per-rank save's largest staging buffer
    double per_rank_s = 0, gather_s = 0;     // wall time of each (for orientation only)
};

// One rank of the job: a warm-up save, then the per-rank save and the old gather path, each
// measured. `measurer`: this rank resets and reads the peak (rank 0 in-process: the process is
// shared; every rank under MPI).
SaveMemory measure_saves(const Config& cfg, comm::Communicator& world, bool measurer,
                         const std::string& gathered_path) {
    Job job(cfg, make_layout(cfg),
            RankGroups{&world, nullptr, world.size() > 1 ? &world : nullptr, nullptr});
    RunCheckpoints checkpoints(cfg, &world);
    checkpoints.after_step(job);  // warm-up: HDF5's library state, the threads' malloc arenas
    SaveMemory out;
    i64 base = -1;
    double t0 = 0;
    auto start = [&] {
        world.barrier();
        if (measurer) base = reset_peak() ? status_kib("VmRSS:") : -1;
        world.barrier();
        t0 = now_s();
    };
    auto stop = [&](i64& kib, double& secs) {
        world.barrier();
        secs = now_s() - t0;
        if (measurer && base >= 0) kib = status_kib("VmHWM:") - base;
    };
    start();
    checkpoints.after_step(job);
    stop(out.per_rank_kib, out.per_rank_s);
    out.staging_bytes = checkpoints.last_save().staging_bytes;
    start();
    {
        LogicalState s;
        s.table = ParamTable::build(cfg.model);
        gather_full(job, &s.params, &s.m, &s.v);
        if (world.rank() == 0)
            write_checkpoint(gathered_path, s, make_checkpoint_meta(cfg, 0, job.history()),
                             cfg.model);
    }
    stop(out.gather_kib, out.gather_s);
    return out;
}

// Both files hold the same tensors: every stored checksum equal. Returns the mismatches.
i64 compare_tensors(const std::string& a, const std::string& b, const ModelConfig& mc) {
    const CheckpointReader ra(a), rb(b);
    const std::vector<DatasetInfo> da = ra.datasets(), db = rb.datasets();
    i64 bad = 0;
    for (const TableEntry& e : ParamTable::build(mc).entries)
        for (int k = 0; k < 3; k++) {
            const std::string ds = dataset_of(k, e.name);
            auto find = [&](const std::vector<DatasetInfo>& d) {
                return std::find_if(d.begin(), d.end(),
                                    [&](const DatasetInfo& x) { return x.path == ds; });
            };
            const auto ia = find(da), ib = find(db);
            if (ia == da.end() || ib == db.end() || ia->checksum != ib->checksum) bad++;
        }
    return bad;
}

// Runs the measurement (4 in-process ranks, or this MPI world) and prints it on rank 0.
// Returns the wrong tensors (on rank 0; 0 elsewhere).
i64 save_memory(const std::string& dir, const comm::MpiEnvironment* mpi) {
    Config cfg = parse_config(default_config_toml(), "bench_checkpoint");
    cfg.model.vocab = 8192;
    cfg.model.seq_len = 256;
    cfg.model.layers = 2;
    cfg.model.heads = 12;
    cfg.model.hidden = 768;
    cfg.model.ffn = 3072;
    cfg.data.markov_vocab = 32;
    cfg.train.threads = 1;
    cfg.train.steps = 1;
    cfg.train.microbatches = 1;
    cfg.train.eval_every = 0;
    cfg.output.run_file = false;
    cfg.checkpoint.dir = dir + "/save_memory";
    cfg.checkpoint.every = 1;
    cfg.checkpoint.keep = 1;
    const int ranks = mpi ? mpi->size() : 4;
    cfg.layout.dp = ranks;
    cfg.layout.zero = 3;
    cfg.layout.timeout_s = 600;
    cfg.train.batch_size = ranks;
    const std::string gathered = dir + "/save_memory_gathered.h5";
    const ParamTable table = ParamTable::build(cfg.model);
    const double model_mb = 4.0 * static_cast<double>(table.num_params) / 1e6;

    std::vector<SaveMemory> got(static_cast<size_t>(ranks));
    int me = 0;
    if (mpi) {
        const std::unique_ptr<comm::Communicator> world = mpi->world(cfg.layout.timeout_s);
        me = world->rank();
        const SaveMemory m = measure_saves(cfg, *world, true, gathered);
        // Every rank's figures to rank 0.
        std::vector<i64> mine = {m.per_rank_kib, m.gather_kib, m.staging_bytes}, all(3 * ranks);
        world->all_gather(all.data(), mine.data(), 3);
        for (int r = 0; r < ranks; r++) {
            got[r].per_rank_kib = all[3 * r];
            got[r].gather_kib = all[3 * r + 1];
            got[r].staging_bytes = all[3 * r + 2];
            got[r].per_rank_s = m.per_rank_s;
            got[r].gather_s = m.gather_s;
        }
    } else {
        comm::run_ranks(ranks, cfg.layout.timeout_s, [&](comm::Communicator& world) {
            got[static_cast<size_t>(world.rank())] =
                measure_saves(cfg, world, world.rank() == 0, gathered);
        });
    }
    if (me != 0) return 0;
    const i64 wrong = compare_tensors(checkpoint_path(cfg.checkpoint.dir, 0), gathered, cfg.model);
    std::printf("save during training: dp%d·ZeRO-3, GPT-2 shapes, 2 layers, V=8192, T=256: %lld "
                "parameters (%.1f MB of weights; weights + m + v %.1f MB), %s\n",
                ranks, static_cast<long long>(table.num_params), model_mb, 3 * model_mb,
                mpi ? "one rank per process" : "in-process ranks (threads)");
    auto mb = [](i64 kib) { return static_cast<double>(kib) * 1024.0 / 1e6; };
    if (got[0].per_rank_kib < 0) {
        std::printf("  peak resident size: not measurable here (/proc/self/clear_refs)\n");
    } else if (!mpi) {
        std::printf("  peak resident growth, 4 ranks together: per-rank save %8.1f MB (%.1f MB per "
                    "rank), gather path %8.1f MB (%.1f MB per rank)\n",
                    mb(got[0].per_rank_kib), mb(got[0].per_rank_kib) / ranks,
                    mb(got[0].gather_kib), mb(got[0].gather_kib) / ranks);
    } else {
        for (int r = 0; r < ranks; r++)
            std::printf("  rank %d peak resident growth: per-rank save %8.1f MB, gather path "
                        "%8.1f MB\n",
                        r, mb(got[r].per_rank_kib), mb(got[r].gather_kib));
    }
    i64 staging = 0;
    for (const SaveMemory& m : got) staging = std::max(staging, m.staging_bytes);
    std::printf("  per-rank save: largest staging buffer on any rank %.1f MB; time %.3f s (gather "
                "path %.3f s)\n",
                static_cast<double>(staging) / 1e6, got[0].per_rank_s, got[0].gather_s);
    std::printf("  check: %s (the two files' tensors have equal checksums)\n",
                wrong == 0 ? "ok" : "FAILED");
    std::remove(gathered.c_str());
    std::filesystem::remove_all(cfg.checkpoint.dir);
    return wrong;
}

}  // namespace

int main(int argc, char** argv) {
    std::string dir;
    bool small = false, save_mem = true;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--small") small = true;
        else if (a == "--no-save-memory") save_mem = false;
        else if (a == "--help" || a == "-h") {
            std::printf("usage: bench_checkpoint DIR [--small] [--no-save-memory]  (under mpirun: "
                        "every rank writes its hyperslabs)\n");
            return 0;
        } else dir = a;
    }
    if (dir.empty()) {
        std::fprintf(stderr, "bench_checkpoint: give a folder to write the checkpoint in "
                             "(on the disk to measure)\n");
        return 2;
    }
    const bool under_mpi = std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE");
    int rank = 0, size = 1;
    std::unique_ptr<comm::MpiEnvironment> mpi;  // MPI_Init_thread; finalises when reset
    if (under_mpi) {
        mpi = std::make_unique<comm::MpiEnvironment>(&argc, &argv);
        rank = mpi->rank();
        size = mpi->size();
    }
    std::filesystem::create_directories(dir);

    ModelConfig mc;  // GPT-2 124M
    mc.vocab = small ? 8192 : 50257;
    mc.seq_len = 1024;
    mc.layers = small ? 2 : 12;
    mc.heads = 12;
    mc.hidden = 768;
    mc.ffn = 3072;
    const ParamTable table = ParamTable::build(mc);
    const double bytes = 3.0 * 4.0 * static_cast<double>(table.num_params);

    // This rank's pieces, generated before the clock starts.
    std::vector<std::vector<float>> pieces;
    for (const TableEntry& e : table.entries)
        for (int k = 0; k < 3; k++) {
            const Slab s = piece(e, rank, size);
            std::vector<float> v(static_cast<size_t>(s.rows * s.cols));
            for (i64 r = 0; r < s.rows; r++)
                fill(v.data() + r * s.cols, s.cols, k, e.id, (s.row0 + r) * e.cols + s.col0);
            pieces.push_back(std::move(v));
        }

    Config cfg;
    cfg.model = mc;
    const CheckpointMeta meta = make_checkpoint_meta(cfg, 100, {});
    const std::string path = checkpoint_path(dir, 100);
    if (under_mpi) MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_s();
    double t_created = 0, t_written = 0;
    {
        CheckpointWriter w(path, meta, mc, under_mpi ? MPI_COMM_WORLD : MPI_COMM_NULL);
        t_created = now_s();
        size_t i = 0;
        for (const TableEntry& e : table.entries)
            for (int k = 0; k < 3; k++) w.write(dataset_of(k, e.name), piece(e, rank, size), pieces[i++].data());
        t_written = now_s();
        w.commit();
    }
    const double write_s = now_s() - t0;
    pieces.clear();

    if (rank == 0) {
        std::printf("bench_checkpoint: %s, %lld parameters, %.1f MB of tensors (weights + Adam m, v), "
                    "%d writer rank%s, folder %s\n",
                    small ? "GPT-2 shapes, 2 layers, V=8192 (--small)" : "GPT-2 124M",
                    static_cast<long long>(table.num_params), bytes / 1e6, size,
                    size == 1 ? "" : "s", dir.c_str());
        std::printf("write  (create .. commit: checksums, fsync, rename): %7.3f s  %8.1f MB/s\n",
                    write_s, bytes / 1e6 / write_s);
        std::printf("       rank 0: create %.3f s, write pieces + checksums %.3f s, commit %.3f s\n",
                    t_created - t0, t_written - t_created, t0 + write_s - t_written);
        std::fflush(stdout);
    }

    // Parallel read of each rank's hyperslabs, checksums combined and compared.
    i64 wrong = 0;
    if (under_mpi) {
        if (rank == 0) drop_cache(path);
        MPI_Barrier(MPI_COMM_WORLD);
        const double a = now_s();
        CheckpointReader r(path);
        std::vector<std::uint64_t> sums;
        std::vector<float> buf;
        for (const TableEntry& e : table.entries)
            for (int k = 0; k < 3; k++) {
                const Slab s = piece(e, rank, size);
                buf.resize(static_cast<size_t>(s.rows * s.cols));
                r.read(dataset_of(k, e.name), s, buf.data());
                std::uint64_t sum = 0;
                for (i64 row = 0; row < s.rows; row++)
                    sum += checksum_f32(buf.data() + row * s.cols, s.cols,
                                        (s.row0 + row) * e.cols + s.col0);
                sums.push_back(sum);
            }
        MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T,
                      MPI_SUM, MPI_COMM_WORLD);
        MPI_Barrier(MPI_COMM_WORLD);
        const double par_s = now_s() - a;
        if (rank == 0) {
            i64 bad = 0;
            size_t i = 0;
            std::vector<DatasetInfo> infos = r.datasets();
            for (const TableEntry& e : table.entries)
                for (int k = 0; k < 3; k++) {
                    const std::string ds = dataset_of(k, e.name);
                    const auto it = std::find_if(infos.begin(), infos.end(),
                                                 [&](const DatasetInfo& d) { return d.path == ds; });
                    if (it == infos.end() || it->checksum != sums[i]) bad++;
                    i++;
                }
            std::printf("read   (%d ranks, own hyperslabs, cold, checksums all-reduced): %7.3f s  "
                        "%8.1f MB/s  [%lld checksum mismatches]\n",
                        size, par_s, bytes / 1e6 / par_s, static_cast<long long>(bad));
            wrong += bad;
        }
    }
    if (rank == 0) {
        drop_cache(path);
        const double cold = read_all(path, table, wrong);
        const double warm = read_all(path, table, wrong);
        std::printf("read   (1 process, whole file, verify every checksum, cold): %7.3f s  %8.1f MB/s\n",
                    cold, bytes / 1e6 / cold);
        std::printf("read   (1 process, whole file, verify every checksum, warm): %7.3f s  %8.1f MB/s\n",
                    warm, bytes / 1e6 / warm);
        std::vector<float> probe(1 << 24);
        const double c0 = now_s();
        const std::uint64_t sink = checksum_f32(probe.data(), i64(probe.size()));
        const double cs = now_s() - c0;
        std::printf("checksum alone: %.1f MB/s (%d threads)  [%llx]\n", 4.0 * probe.size() / 1e6 / cs,
                    static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN))),
                    static_cast<unsigned long long>(sink & 0xf));
        std::printf("disk: %s\n", run_dd(dir, small ? 256 : 1024).c_str());
        std::printf("check: %s (every value read back bit-identical, every checksum verified)\n",
                    wrong == 0 ? "ok" : "FAILED");
        std::remove(path.c_str());
    }
    if (save_mem) {
        if (rank == 0) std::fflush(stdout);
        wrong += save_memory(dir, mpi.get());
    }
    mpi.reset();
    return wrong == 0 ? 0 : 1;
}
