// Per-rank checkpoints with ranks as processes (core/train/checkpointing.h under
// `mpirun -np 4`): a dp2·tp2 run saves through parallel HDF5, every process writing its own
// hyperslabs, and the files equal the in-process run's, tensor by tensor and byte by byte (and
// the history's deterministic columns); every process then resumes by reading only its own
// hyperslabs, under the same layout and under another (dp4·ZeRO-3), and ends bit-identical to
// the uninterrupted single-device run.
//
// Every rank runs every test case (Catch2, MPI initialised in main by MpiEnvironment). References
// that need no MPI (the in-process run, the single device) are computed by rank 0 while the
// others wait in a barrier, which polls and sleeps, so oversubscribed ranks leave it the cores.
#include "core/io/checkpoint.h"
#include "core/comm/mpi.h"
#include "core/base/config.h"
#include "core/parallel/pipeline/pipeline.h"
#include "core/train/runner.h"
#include "core/io/state.h"
#include "tests/support/test_util.h"

#include <hdf5.h>
#include "tests/mpi/catch_runner.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

using namespace px;
namespace fs = std::filesystem;

namespace {

const comm::MpiEnvironment* g_mpi = nullptr;
constexpr int kRanks = 4;

// test_resume.cpp's job: 6 steps, validation every 3, shapes that tp = 4 cuts in whole blocks.
Config job(const std::vector<std::string>& sets) {
    Config c = test::small_job();
    c.train.steps = 6;
    c.train.threads = 1;
    c.train.eval_every = 3;
    c.train.val_batches = 1;
    c.model.ffn = 128;
    c.numerics.block = 8;
    c.layout.timeout_s = 120;
    apply_overrides(c, sets);
    return c;
}

// A folder every rank agrees on, emptied by rank 0.
std::string shared_dir(comm::Communicator& world, const std::string& name) {
    const std::string dir = (fs::temp_directory_path() / ("parallax_test_mpi_" + name)).string();
    if (world.rank() == 0) {
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    world.barrier();
    return dir;
}

// One dataset as stored: raw bytes (its own HDF5 type) and the stored checksum.
struct Stored {
    std::vector<char> bytes;
    std::uint64_t checksum = 0;
};

std::map<std::string, Stored> stored_datasets(const std::string& path) {
    std::vector<DatasetInfo> infos;
    {
        const CheckpointReader r(path);
        infos = r.datasets();
    }
    std::map<std::string, Stored> out;
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    REQUIRE(f >= 0);
    for (const DatasetInfo& d : infos) {
        const std::string name = "/" + d.path;
        const hid_t ds = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
        REQUIRE(ds >= 0);
        const hid_t type = H5Dget_type(ds);
        Stored s;
        s.bytes.resize(static_cast<size_t>(d.numel()) * H5Tget_size(type));
        if (!s.bytes.empty())
            CHECK(H5Dread(ds, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, s.bytes.data()) >= 0);
        s.checksum = d.checksum;
        H5Tclose(type);
        H5Dclose(ds);
        out.emplace(d.path, std::move(s));
    }
    H5Fclose(f);
    return out;
}

// The MPI run's file equals the in-process run's: every tensor (bytes and checksum) and the
// history's columns that do not depend on timing.
void check_same_state_file(const std::string& mpi_file, const std::string& inproc_file) {
    INFO(mpi_file << " vs " << inproc_file);
    const auto a = stored_datasets(mpi_file), b = stored_datasets(inproc_file);
    CHECK(a.size() == b.size());
    for (const auto& [name, x] : a) {
        const bool timing = name == "history/tokens_per_s" || name == "history/step_ms" ||
                            name == "history/comm_bytes";
        if (timing) continue;
        INFO("dataset /" << name);
        const auto it = b.find(name);
        REQUIRE(it != b.end());
        CHECK(x.bytes == it->second.bytes);
        CHECK(x.checksum == it->second.checksum);
    }
}

// Runs cfg on the MPI world; rank 0 returns the whole logical state (the others, theirs).
LogicalState run_mpi(const Config& cfg, comm::Communicator& world) {
    LogicalState s;
    bool agree = true;
    run_rank(cfg, world, {}, test::inspecting([&](Job& j) { agree = absorb(s, j) && agree; }));
    agree = gather_state(s, world, cfg.model) && agree;
    if (world.rank() == 0) {
        CHECK(agree);
        CHECK(s.complete());
    }
    return s;
}

}  // namespace

TEST_CASE(
    "4 processes save per rank (dp2·tp2): the in-process run's file; each resumes from "
    "its own hyperslabs") {
    auto world = g_mpi->world(120);
    const std::string dir = shared_dir(*world, "resume");
    Config w = job({"layout.dp=2", "layout.tp=2"});
    w.checkpoint.dir = dir + "/mpi";
    w.checkpoint.every = 3;
    run_mpi(w, *world);
    world->barrier();
    if (world->rank() == 0) {
        REQUIRE(list_checkpoints(w.checkpoint.dir).size() == 2);  // no temporary file left
        Config in = w;
        in.checkpoint.dir = dir + "/inproc";
        run_layout(in, {});
        for (i64 step : {3, 6})
            check_same_state_file(checkpoint_path(w.checkpoint.dir, step),
                                  checkpoint_path(in.checkpoint.dir, step));
    }
    world->barrier();

    // Resume from step 3: each process reads only the hyperslabs it holds.
    const LogicalState ref = world->rank() == 0 ? test::single_device(job({})) : LogicalState{};
    for (const std::vector<std::string>& layout :
         {std::vector<std::string>{"layout.dp=2", "layout.tp=2"},
          std::vector<std::string>{"layout.dp=4", "layout.zero=3"}}) {
        Config r = job(layout);
        r.checkpoint.resume = checkpoint_path(w.checkpoint.dir, 3);
        const LogicalState got = run_mpi(r, *world);
        if (world->rank() == 0) {
            INFO("resumed under " << layout[0] << " " << layout[1]);
            CHECK(got.history.size() == 6);
            test::check_same_bits(ref, got);
        }
        world->barrier();
    }
}

int main(int argc, char** argv) {
    std::unique_ptr<comm::MpiEnvironment> mpi;
    try {
        mpi = std::make_unique<comm::MpiEnvironment>(&argc, &argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "test_resume_mpi: %s\n", e.what());
        return 1;
    }
    g_mpi = mpi.get();
    if (g_mpi->size() != kRanks) {
        if (g_mpi->rank() == 0)
            std::fprintf(stderr, "test_resume_mpi: run it under `mpirun -np %d` (got %d ranks)\n",
                         kRanks, g_mpi->size());
        return 1;
    }
    return px::test::run_catch(argc, argv);
}
