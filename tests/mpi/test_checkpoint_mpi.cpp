// HDF5 checkpoints written by 4 MPI ranks through parallel HDF5 (core/io/checkpoint.h), under
// `mpirun -np 4`: each rank writes its own hyperslabs (rows of matrices, columns of vectors, flat
// ranges of the Adam v moments) and the file equals, dataset by dataset and checksum by
// checksum, the one a single writer makes; a piece left out is refused on every rank and
// nothing is committed; ranks reading their own hyperslabs and summing partial checksums
// reproduce the stored ones.
//
// Every rank runs every test case (Catch2 with MPI initialised in main); each computes the small
// job's trained state itself (deterministic, milliseconds).
#include "core/io/checkpoint.h"
#include "tests/support/test_util.h"

#include "tests/mpi/catch_runner.h"

#include <catch2/catch.hpp>

#include <bit>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

using namespace px;
using namespace px::test;
using Catch::Matchers::Contains;
namespace fs = std::filesystem;

namespace {

constexpr int kRanks = 4;
int g_rank = 0;

const LogicalState& trained() {
    static const LogicalState s = single_device(small_job());
    return s;
}

CheckpointMeta meta_of(const LogicalState& s, i64 step) {
    CheckpointMeta m = make_checkpoint_meta(small_job(), step, s.history);
    m.created = "2026-01-01T00:00:00Z";
    return m;
}

// A folder every rank agrees on, emptied by rank 0.
std::string shared_dir(const std::string& name) {
    const std::string dir = (fs::temp_directory_path() / ("parallax_test_mpi_" + name)).string();
    if (g_rank == 0) {
        fs::remove_all(dir);
        fs::create_directories(dir);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    return dir;
}

Slab piece(const TableEntry& e, int rank) {
    if (e.rows > 1) {
        const i64 r0 = e.rows * rank / kRanks, r1 = e.rows * (rank + 1) / kRanks;
        return {r0, r1 - r0, 0, e.cols};
    }
    const i64 c0 = e.cols * rank / kRanks, c1 = e.cols * (rank + 1) / kRanks;
    return {0, 1, c0, c1 - c0};
}

// This rank's pieces of every tensor; `skip` names one dataset this rank leaves out.
void write_pieces(CheckpointWriter& w, const LogicalState& s, const std::string& skip = "") {
    for (const TableEntry& e : s.table.entries) {
        const Slab p = piece(e, g_rank);
        std::vector<float> buf(static_cast<size_t>(p.rows * p.cols));
        for (const auto& [path, base] : {std::pair{model_dataset(e.name), s.params.data()},
                                         std::pair{moment_dataset('m', e.name), s.m.data()}}) {
            if (path == skip) continue;
            for (i64 r = 0; r < p.rows; r++)
                std::memcpy(buf.data() + r * p.cols,
                            base + e.offset + (p.row0 + r) * e.cols + p.col0,
                            static_cast<size_t>(p.cols) * 4);
            w.write(path, p, buf.data());
        }
        const i64 n = e.numel(), lo = n * g_rank / kRanks, hi = n * (g_rank + 1) / kRanks;
        if (moment_dataset('v', e.name) != skip)
            w.write_range(moment_dataset('v', e.name), lo, hi - lo, s.v.data() + e.offset + lo);
    }
}

}  // namespace

TEST_CASE("4 ranks writing their hyperslabs make the single writer's file", "[checkpoint_mpi]") {
    const std::string dir = shared_dir("ckpt");
    const LogicalState& s = trained();
    const ModelConfig mc = small_job().model;
    const std::string whole = dir + "/whole.h5", parallel = checkpoint_path(dir, 5);
    if (g_rank == 0) write_checkpoint(whole, s, meta_of(s, 5), mc);
    {
        CheckpointWriter w(parallel, meta_of(s, 5), mc, MPI_COMM_WORLD);
        write_pieces(w, s);
        w.commit();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    REQUIRE(fs::exists(parallel));
    CHECK(list_checkpoints(dir).size() == 1);  // no temporary file left

    // Every rank reads the whole file back and checks it against the state and the serial file.
    const CheckpointReader a(whole), b(parallel);
    CHECK_NOTHROW(b.verify_all());
    const auto da = a.datasets(), db = b.datasets();
    REQUIRE(da.size() == db.size());
    for (size_t i = 0; i < da.size(); i++) {
        INFO(da[i].path);
        CHECK(da[i].path == db[i].path);
        CHECK(da[i].shape == db[i].shape);
        CHECK(da[i].checksum == db[i].checksum);
    }
    CheckpointMeta meta;
    check_same_bits(s, read_checkpoint(parallel, mc, &meta));
    CHECK(meta.step == 5);
    CHECK(meta.created == "2026-01-01T00:00:00Z");

    // Ranks reading their own hyperslabs: the partial checksums add up to the stored ones.
    std::vector<std::uint64_t> sums;
    std::vector<std::string> names;
    for (const TableEntry& e : s.table.entries) {
        const Slab p = piece(e, g_rank);
        std::vector<float> buf(static_cast<size_t>(p.rows * p.cols));
        for (const std::string& ds : {model_dataset(e.name), moment_dataset('m', e.name)}) {
            b.read(ds, p, buf.data());
            std::uint64_t sum = 0;
            for (i64 r = 0; r < p.rows; r++)
                sum += checksum_f32(buf.data() + r * p.cols, p.cols, (p.row0 + r) * e.cols + p.col0);
            sums.push_back(sum);
            names.push_back(ds);
        }
    }
    MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_UINT64_T, MPI_SUM,
                  MPI_COMM_WORLD);
    for (size_t i = 0; i < names.size(); i++) {
        INFO(names[i]);
        for (const DatasetInfo& d : db)
            if (d.path == names[i]) CHECK(d.checksum == sums[i]);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a rank that leaves out its piece: refused on every rank, nothing committed",
          "[checkpoint_mpi]") {
    const std::string dir = shared_dir("ckpt_missing");
    const LogicalState& s = trained();
    const ModelConfig mc = small_job().model;
    const std::string path = checkpoint_path(dir, 5);
    std::string err = "<no exception>", temp;
    try {
        CheckpointWriter w(path, meta_of(s, 5), mc, MPI_COMM_WORLD);
        temp = w.temp_path();
        write_pieces(w, s, g_rank == 2 ? "model/h.1.mlp.c_fc.weight" : "");
        w.commit();
    } catch (const CheckpointError& e) {
        err = e.what();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK_THAT(err, Contains("/model/h.1.mlp.c_fc.weight got 1920 elements written, it has 2560") &&
                        Contains("miss some"));
    CHECK(!fs::exists(path));
    CHECK(!fs::exists(temp));
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char** argv) {
    MPI_Init(&argc, &argv);
    int size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != kRanks) {
        if (g_rank == 0)
            std::fprintf(stderr, "test_checkpoint_mpi: run it under `mpirun -np %d` (got %d)\n",
                         kRanks, size);
        MPI_Finalize();
        return 1;
    }
    trained();  // every rank, before the first collective
    const int rc = px::test::run_catch(argc, argv);
    int worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return worst;
}
