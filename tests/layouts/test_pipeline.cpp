// Pipeline parallelism on in-process ranks against the single-device run: 5 steps, then loss,
// grad norm and validation loss histories, every weight and every Adam moment compared bit for
// bit, for GPipe, 1F1B and interleaved 1F1B, several pp degrees (pp3 too) and microbatch
// counts, and full recomputation. Also: the tree accumulator against sequential accumulation,
// the schedules' backward order, activation memory, the llm.c export, and refused layouts.
// dp × pp: dp2 × pp2 (GPipe, 1F1B; 1, 2, 4 microbatches per replica; ZeRO 0-3), dp2 × pp3,
// dp2 × interleaved pp2 with recomputation, dp4 × pp2 (and a ring sum over dp breaking the bits).
// tp × pp: tp2 × pp2 and dp2 × tp2 × pp2 (GPipe, 1F1B; 2 and 4 microbatches; ZeRO 0-3), the
// logical state from tp-sharded stages (LogicalState, gather_full), run_layout and llm.c files;
// with sequence parallelism, tp2 × pp2+SP (1F1B; 2 and 4 microbatches; GPipe; interleaved with
// recomputation), dp2 × tp2 × pp2+SP (ZeRO-1), tp4 × pp2+SP and dp2 × tp2 × pp3+SP (ZeRO-2).
#include "core/comm/run_ranks.h"
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/train/job.h"
#include "core/parallel/data/token_tree.h"
#include "core/parallel/pipeline/pipeline.h"
#include "core/train/runner.h"
#include "core/base/rng.h"
#include "core/io/state.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <string>
#include <vector>

using namespace px;
using test::same_bits;

namespace {

using test::check_same_bits;
using test::series;
using test::single_device;

Config small_job(int layers = 4) {
    Config c = test::small_job();
    c.model.layers = layers;
    c.train.eval_every = 5;  // validation loss compared too
    c.train.val_batches = 2;
    c.train.threads = 1;
    c.train.weight_decay = 0.1;  // decay on matrices only: the per-tensor rule is exercised
    return c;
}

using State = LogicalState;

// Each stage's tensors go to the whole model's arena by their tensor id (this does not use
// gather_full, which a test below checks separately). Tensors held by two stages
// (wte) must agree, every tensor must be on some stage, and every rank's metrics agree.
State pipeline(const Config& c, bool& stages_agree) {
    State s;
    stages_agree = true;
    run_layout(c, {}, test::inspecting([&](Job& job) { stages_agree = absorb(s, job) && stages_agree; }));
    stages_agree = stages_agree && s.complete();
    return s;
}

Config with_layout(Config c, int pp, const std::string& schedule, int microbatches, int v = 1,
                   const std::string& recompute = "none") {
    c.layout.pp = pp;
    c.layout.schedule = schedule;
    c.layout.microbatches = microbatches;
    c.layout.virtual_stages = v;
    c.layout.recompute = recompute;
    return c;
}

// Histories, weights and moments of a pipeline run equal the single device's, bit for bit.
void check_same(const State& ref, const State& got, bool agree) {
    CHECK(agree);
    check_same_bits(ref, got);
}

// The pipeline run of `base` under the given layout equals the single-device `ref` bit for bit.
void check_pipeline(const Config& base, const State& ref, int pp, const std::string& schedule,
                    int microbatches, int v = 1, const std::string& recompute = "none") {
    bool agree = false;
    const State got = pipeline(with_layout(base, pp, schedule, microbatches, v, recompute), agree);
    INFO("pp" << pp << " " << schedule << " v=" << v << ", " << microbatches
              << " microbatches, recompute " << recompute);
    check_same(ref, got, agree);
}

}  // namespace

TEST_CASE("a model part initialises exactly the single device's numbers, under the same names") {
    const Config c = small_job(6);
    GPT whole(c.model, Numerics{});
    whole.init_random(7, 0.02);
    ModelPart part;
    part.chunks = {{1, 3}, {4, 6}};
    part.embedding = false;
    part.head = true;
    GPT stage(c.model, Numerics{}, part);
    stage.init_random(7, 0.02);
    CHECK(stage.table().wte == 0);  // the head needs wte
    CHECK(stage.table().wpe == -1);
    CHECK_FALSE(stage.table().has_layer(0));
    CHECK(stage.table().has_layer(4));
    CHECK(stage.table().entries.size() == static_cast<size_t>(1 + 4 * 12 + 2));
    for (const TableEntry& e : stage.table().entries) {
        const TableEntry& w = whole.table().entries[static_cast<size_t>(e.id)];
        CHECK(w.name == e.name);
        CHECK(std::memcmp(whole.params() + w.offset, stage.params() + e.offset,
                          static_cast<size_t>(e.numel()) * sizeof(float)) == 0);
    }
    // The whole model is the part with everything: ids are table indices.
    for (size_t i = 0; i < whole.table().entries.size(); i++)
        CHECK(whole.table().entries[i].id == static_cast<int>(i));
    // Chunk spans of a part are disjoint and cover its gradient buffer after wte.
    const GradSpan s0 = stage.grad_span(0), s1 = stage.grad_span(1);
    CHECK(s0.lo == stage.table().entries[1].offset);
    CHECK(s0.hi == s1.lo);
    CHECK(s1.hi == stage.grad_layout().total);
}

TEST_CASE("a pipeline message of bf16 or fp8 activations arrives bit for bit") {
    const i64 n = 6;
    for (DType t : {DType::bf16, DType::e4m3, DType::f32}) {
        std::vector<std::vector<std::byte>> got(2);
        const std::size_t bytes = static_cast<std::size_t>(bytes_of(t, n));
        auto pattern = [&](std::size_t i) { return static_cast<std::byte>(0xA5 ^ (i * 29)); };
        comm::run_ranks(2, 20, [&](comm::Communicator& pp) {
            std::vector<std::byte> buf(bytes);
            if (pp.rank() == 0)
                for (std::size_t i = 0; i < bytes; i++) buf[i] = pattern(i);
            const Tensor msg = view_of(t, buf.data(), {2, n / 2}, "act");
            if (pp.rank() == 0)
                send_message(pp, msg, 1, 3).wait();
            else
                recv_message(pp, msg, 0, 3);
            got[static_cast<std::size_t>(pp.rank())] = buf;
        });
        INFO(dtype_name(t));
        REQUIRE(got[1].size() == bytes);
        for (std::size_t i = 0; i < bytes; i++) CHECK(got[1][i] == pattern(i));
    }
}

TEST_CASE("the tree accumulator combines microbatches in the token tree, in any order") {
    // Eight microbatch gradients of one chunk, with values whose sum depends on the order.
    const int M = 8;
    const i64 n = 64;
    std::vector<std::vector<float>> leaf(M, std::vector<float>(n));
    for (int k = 0; k < M; k++) fill_normal(leaf[k].data(), n, 0.0f, 1.0f + 1e3f * k, 99, k, 0);

    // The canonical tree over leaves: ((0+1)+(2+3))+((4+5)+(6+7)).
    std::vector<float> tree(n), sequential(n, 0.0f);
    for (i64 i = 0; i < n; i++) {
        float p[M];
        for (int k = 0; k < M; k++) p[k] = leaf[k][i];
        tree[i] = tree_sum(p, M);
        for (int k = 0; k < M; k++) sequential[i] += leaf[k][i];
    }
    REQUIRE_FALSE(same_bits(tree, sequential));  // the data tells the two orders apart

    auto accumulate = [&](const std::vector<int>& order) {
        std::vector<float> result(n + 16, -1.0f);
        TreeAccumulator acc(M, 2, result.data(), n + 16, GradSpan{8, 8 + n});
        for (int k : order) {
            float* g = acc.begin(k).front();
            for (i64 i = 0; i < n; i++) g[8 + i] += leaf[k][i];
            acc.end(k);
        }
        CHECK(acc.complete());
        CHECK(result[0] == -1.0f);  // outside the span: untouched
        return std::vector<float>(result.begin() + 8, result.begin() + 8 + n);
    };
    const std::vector<float> in_order = accumulate({0, 1, 2, 3, 4, 5, 6, 7});
    CHECK(same_bits(in_order, tree));
    CHECK_FALSE(same_bits(in_order, sequential));
    CHECK(same_bits(accumulate({7, 3, 0, 5, 1, 6, 2, 4}), tree));  // any order, same bits
    CHECK(same_bits(accumulate({4, 5, 6, 7, 0, 1, 2, 3}), tree));

    // In order it is Job's stack: log2(8) partials besides the result.
    std::vector<float> result(n);
    TreeAccumulator acc(M, 1, result.data(), n, GradSpan{0, n});
    for (int k = 0; k < M; k++) {
        acc.begin(k);
        acc.end(k);
    }
    CHECK(acc.buffers() == 3);
}

TEST_CASE("every schedule runs a chunk's backwards in increasing microbatch order") {
    // Not needed for the bits (TreeAccumulator takes any order), but it keeps the partials to
    // log2(m)+1 per chunk, as Job's stack.
    auto check = [](const Schedule& s) {
        for (int p = 0; p < s.pp; p++) {
            std::vector<int> next(static_cast<size_t>(s.virtual_stages), 0);
            for (const Action& a : s.ranks[static_cast<size_t>(p)])
                if (a.is_input_backward()) CHECK(a.microbatch == next[a.chunk]++);
        }
    };
    for (int pp : {2, 3, 4})
        for (int m : {1, 2, 4, 8}) {
            check(gpipe(pp, m));
            check(one_f_one_b(pp, m));
        }
    for (int m : {2, 4, 8}) check(interleaved_1f1b(2, m, 2));
    check(interleaved_1f1b(4, 8, 2));
    for (int m : {1, 4, 8}) {
        check(zb_h1(4, m));
        check(zbv(4, m));
    }
}

TEST_CASE("GPipe and 1F1B at pp2 and pp4 are bit-identical to the single device") {
    const Config base = small_job(4);
    const State ref = single_device(base);
    for (const char* schedule : {"gpipe", "1f1b"})
        for (int pp : {2, 4})
            for (int m : {1, 2, 4, 8}) check_pipeline(base, ref, pp, schedule, m);
}

TEST_CASE("microbatches whose token ranges are not tree nodes are bit-identical in a pipeline") {
    // 6 blocks in 3 microbatches of 2: [2,4) is not a node ([0,6) splits into [0,3) and [3,6)),
    // so microbatch 1 is two nodes, [2,3) and [3,4), accumulated apart on every stage.
    Config six = small_job(4);
    six.train.batch_size = 6;
    const State ref = single_device(six);
    check_pipeline(six, ref, 2, "1f1b", 3);
    check_pipeline(six, ref, 2, "gpipe", 6);
    six.numerics.block = 32;  // two blocks per sequence: nodes end inside sequences
    check_pipeline(six, single_device(six), 2, "1f1b", 3);
}

TEST_CASE("the tree accumulator takes microbatches of several nodes and leaves each target apart") {
    // 10 blocks; microbatches [0,3) [3,5) [5,10) of the tree [0,5) [5,10) ([0,5): [0,3) [3,5);
    // [5,10): [5,8) [8,10)); the last microbatch is two nodes. A replica owning [1,7) of the
    // same tree has targets [1,2) [2,3) [3,5) [5,7): leaves [1,2),[2,3) | [3,5) | [5,7).
    const i64 n = 16;
    auto value = [&](i64 lo, i64 hi) {  // a leaf's partial: distinct per block range
        std::vector<float> v(n);
        fill_normal(v.data(), n, 0.0f, 1.0f + 100.0f * static_cast<float>(lo * 10 + hi), 5, lo, hi);
        return v;
    };
    // Microbatch k's backward: each of its leaves gets its partial.
    auto feed = [&](TreeAccumulator& acc, const std::vector<std::vector<Range>>& leaves, int k) {
        const std::vector<float*> bufs = acc.begin(k);
        REQUIRE(bufs.size() == leaves[static_cast<size_t>(k)].size());
        for (size_t i = 0; i < bufs.size(); i++) {
            const Range r = leaves[static_cast<size_t>(k)][i];
            const std::vector<float> v = value(r.lo, r.hi);
            for (i64 j = 0; j < n; j++) bufs[i][j] += v[static_cast<size_t>(j)];
        }
        acc.end(k);
    };
    std::vector<std::vector<Range>> leaves = {{{0, 3}}, {{3, 5}}, {{5, 8}, {8, 10}}};
    std::vector<float> result(n, -1.0f);
    TreeAccumulator acc(10, leaves, result.data(), n, GradSpan{0, n});
    REQUIRE(acc.targets() == std::vector<Range>{{0, 10}});
    for (int k : {2, 0, 1}) feed(acc, leaves, k);
    REQUIRE(acc.complete());
    // The same nodes combined by the tree exchange's local combine.
    std::vector<Range> nodes = {{0, 3}, {3, 5}, {5, 8}, {8, 10}};
    std::vector<float> rows;
    for (const Range& r : nodes) {
        const std::vector<float> v = value(r.lo, r.hi);
        rows.insert(rows.end(), v.begin(), v.end());
    }
    REQUIRE(combine_nodes(10, nodes, rows.data(), n));
    CHECK(same_bits(result, std::vector<float>(rows.begin(), rows.begin() + n)));

    // Several targets: each ends in its own buffer, the first in `result`.
    std::vector<std::vector<Range>> part = {{{1, 2}, {2, 3}}, {{3, 5}}, {{5, 7}}};
    std::fill(result.begin(), result.end(), -1.0f);
    TreeAccumulator acc2(10, part, result.data(), n, GradSpan{0, n});
    REQUIRE(acc2.targets() == std::vector<Range>{{1, 2}, {2, 3}, {3, 5}, {5, 7}});
    for (int k = 0; k < 3; k++) feed(acc2, part, k);
    REQUIRE(acc2.complete());
    CHECK(acc2.target_buffer(0) == result.data());
    for (size_t t = 0; t < 4; t++) {
        const Range r = acc2.targets()[t];
        const std::vector<float> v = value(r.lo, r.hi);
        CHECK(same_bits(std::vector<float>(acc2.target_buffer(t), acc2.target_buffer(t) + n), v));
    }
    CHECK_THROWS_WITH(TreeAccumulator(10, {{{1, 3}}}, result.data(), n, GradSpan{0, n}),
                      Catch::Contains("not one node"));
}

TEST_CASE("pp3, a degree that is not a power of two, is bit-identical to the single device") {
    const Config six = small_job(6);  // two layers per stage
    const State ref6 = single_device(six);
    for (int m : {1, 2, 4, 8}) check_pipeline(six, ref6, 3, "1f1b", m);
    check_pipeline(six, ref6, 3, "gpipe", 4);
    const Config four = small_job(4);  // uneven stages: layers [0,2) [2,3) [3,4)
    check_pipeline(four, single_device(four), 3, "1f1b", 2);
}

TEST_CASE("interleaved 1F1B with two chunks per rank is bit-identical to the single device") {
    const Config base = small_job(4);  // four virtual stages of one layer
    const State ref = single_device(base);
    for (int m : {2, 4, 8}) check_pipeline(base, ref, 2, "interleaved", m, 2);
    const Config eight = small_job(8);
    check_pipeline(eight, single_device(eight), 4, "interleaved", 4, 2);
}

TEST_CASE("full recomputation is bit-identical to the single device, with less memory") {
    const Config base = small_job(4);
    const State ref = single_device(base);
    check_pipeline(base, ref, 2, "1f1b", 1, 1, "full");
    check_pipeline(base, ref, 2, "1f1b", 4, 1, "full");
    check_pipeline(base, ref, 2, "gpipe", 8, 1, "full");
    check_pipeline(base, ref, 2, "interleaved", 4, 2, "full");

    // Memory: per microbatch in flight, recompute keeps each block's input, not its internals.
    Config c = with_layout(base, 2, "1f1b", 4);
    c.train.eval_every = 0;
    c.train.steps = 1;
    std::vector<i64> bytes(2, 0);
    for (int r = 0; r < 2; r++) {
        c.layout.recompute = r ? "full" : "none";
        run_layout(c, {}, test::inspecting([&](Job& job) {
            if (job.pp_rank() == 0) bytes[r] = job.pipeline().activation_bytes();
        }));
    }
    CHECK(bytes[1] < bytes[0]);
}

TEST_CASE("1F1B holds at most pp microbatches in flight on the first stage, GPipe all of them") {
    Config c = small_job(4);
    c.train.eval_every = 0;  // validation forwards would add sets of their own
    c.train.steps = 2;
    for (const char* schedule : {"gpipe", "1f1b"}) {
        const Config pc = with_layout(c, 4, schedule, 8);
        const SimResult sim = check_schedule(make_schedule(parse_schedule(schedule), 4, 8));
        REQUIRE(sim.ok());
        int sets = -1;
        run_layout(pc, {}, test::inspecting([&](Job& job) {
            if (job.pp_rank() == 0) sets = job.pipeline().activation_sets(0);
        }));
        INFO(schedule);
        CHECK(sets == sim.peak_in_flight[0]);
        CHECK(sets == (std::string(schedule) == "gpipe" ? 8 : 4));
    }
}

TEST_CASE("a step reports the bytes its rank sent: activations, the tied gradient, the norms") {
    Config c = with_layout(small_job(4), 2, "1f1b", 4);
    c.train.steps = 2;
    c.train.eval_every = 0;
    struct Sent : Observer {
        std::vector<double> bytes;
        void on_step(const RunView&, const StepMetrics& m) override {
            bytes.push_back(m.comm_bytes);
        }
    } observer;
    run_layout(c, {&observer});
    const std::vector<double>& sent = observer.bytes;
    // Rank 0 sends every microbatch's hidden state (the batch's B·T·C floats) and the
    // embedding's dwte (V·C); its part of the norm gather is a few hundred bytes.
    const double acts = 8.0 * 64 * 32 * 4, tied = 32.0 * 32 * 4;
    REQUIRE(sent.size() == 2);
    for (double b : sent) {
        CHECK(b >= acts + tied);
        CHECK(b < acts + tied + 1024);
    }
}

TEST_CASE("gather_full assembles the stages into the single device's state") {
    const Config base = small_job(4);
    const State ref = single_device(base);
    const Config c = with_layout(base, 2, "interleaved", 4, 2);
    std::vector<float> params, m, v;
    std::mutex mu;
    comm::run_ranks(2, 30, [&](comm::Communicator& world) {
        Job job(c, make_layout(c), RankGroups{&world, &world, nullptr, nullptr});
        job.run();
        std::vector<float> p, mm, vv;
        gather_full(job, &p, &mm, &vv);
        std::lock_guard<std::mutex> lock(mu);
        if (world.rank() == 1) {
            params = p;
            m = mm;
            v = vv;
        }
    });
    CHECK(same_bits(ref.params, params));
    CHECK(same_bits(ref.m, m));
    CHECK(same_bits(ref.v, v));
}

TEST_CASE("a pipeline exports and loads llm.c checkpoints like the single device") {
    namespace fs = std::filesystem;
    const fs::path dir = test::temp_dir("pipeline_llmc");
    auto read = [](const fs::path& p) {
        std::ifstream f(p, std::ios::binary);
        return std::vector<char>(std::istreambuf_iterator<char>(f), {});
    };
    Config c = small_job(4);
    c.model.ffn = 4 * c.model.hidden;  // llm.c's format fixes the MLP at 4·C
    c.train.steps = 2;
    c.output.export_llmc = (dir / "single.bin").string();
    Job single(c);
    single.run();
    Config pc = with_layout(c, 2, "1f1b", 2);
    pc.output.export_llmc = (dir / "pipeline.bin").string();
    run_layout(pc);
    const std::vector<char> a = read(dir / "single.bin"), b = read(dir / "pipeline.bin");
    CHECK(!a.empty());
    CHECK(a == b);

    // Start from that checkpoint: the pipeline's stages each read their part of it.
    Config from = c;
    from.model.init_from = (dir / "single.bin").string();
    from.output.export_llmc.clear();
    const State ref = single_device(from);
    bool agree = false;
    const State got = pipeline(with_layout(from, 2, "gpipe", 4), agree);
    check_same(ref, got, agree);
    fs::remove_all(dir);
}

TEST_CASE("pipeline layouts that cannot work are refused with a sentence naming the keys") {
    Config c = small_job(4);
    CHECK_THROWS_WITH(run_layout(with_layout(c, 5, "1f1b", 1)),
                      Catch::Contains("layout.pp=5") && Catch::Contains("model.layers=4"));
    CHECK_THROWS_WITH(run_layout(with_layout(small_job(8), 4, "interleaved", 2, 2)),
                      Catch::Contains("divisible by layout.pp=4"));
    CHECK_THROWS_WITH(run_layout(with_layout(small_job(6), 2, "interleaved", 4, 2)),
                      Catch::Contains("model.layers") && Catch::Contains("layout.virtual_stages"));
    CHECK_THROWS_WITH(run_layout(with_layout(c, 2, "1f1b", 3)),
                      Catch::Contains("train.batch_size"));
    Config tp = with_layout(c, 2, "1f1b", 2);
    tp.layout.tp = 2;
    tp.numerics.block = 8;                                   // whole blocks per tp rank
    comm::run_ranks(2, 30, [&](comm::Communicator& world) {  // a stage without its tp group
        CHECK_THROWS_WITH(Job(tp, make_layout(tp), RankGroups{&world, &world, nullptr, nullptr}),
                          Catch::Contains("layout.tp = 2"));
    });
}

namespace {

// dp × pp on in-process ranks, grouped as run_pipeline groups them; every rank assembles the
// whole model with gather_full (which also gathers ZeRO-1's moment shards over dp). Every rank
// must assemble the same bits and report the same loss, grad norm and validation loss.
State dp_pipeline(const Config& c, bool& ranks_agree, comm::Algo algo = comm::Algo::canonical) {
    const Mesh mesh(make_layout(c));
    const Layout& l = mesh.layout();
    std::vector<State> per_rank(static_cast<size_t>(mesh.world_size()));
    comm::run_ranks(mesh.world_size(), 30, [&](comm::Communicator& world) {
        const int r = world.rank();
        const Coord at = mesh.coord_of(r);
        auto pp = world.split(mesh.group_color(MeshDim::pp, r), at.pp, "pp");
        auto dp = world.split(mesh.group_color(MeshDim::dp, r), at.dp, "dp");
        auto tp = world.split(mesh.group_color(MeshDim::tp, r), at.tp, "tp");
        Layout with_algo = l;
        with_algo.algo = algo;
        Job job(c, with_algo,
                RankGroups{&world, pp.get(), l.dp > 1 ? dp.get() : nullptr,
                           l.tp > 1 ? tp.get() : nullptr});
        CHECK(job.pp_rank() == at.pp);
        CHECK(job.dp_rank() == at.dp);
        CHECK(job.tp_rank() == at.tp);
        job.run();
        State& s = per_rank[static_cast<size_t>(r)];
        gather_full(job, &s.params, &s.m, &s.v);
        s.history = job.history();
    });
    ranks_agree = true;
    for (const State& s : per_rank)
        ranks_agree =
            ranks_agree && same_bits(s.params, per_rank[0].params) &&
            same_bits(s.m, per_rank[0].m) && same_bits(s.v, per_rank[0].v) &&
            same_bits(series(s, &StepMetrics::loss), series(per_rank[0], &StepMetrics::loss)) &&
            same_bits(series(s, &StepMetrics::grad_norm),
                      series(per_rank[0], &StepMetrics::grad_norm)) &&
            same_bits(series(s, &StepMetrics::val_loss),
                      series(per_rank[0], &StepMetrics::val_loss));
    return per_rank[0];
}

}  // namespace

TEST_CASE("dp2 × pp2 with GPipe and 1F1B, ZeRO 0-3, is bit-identical to the single device") {
    const Config base = small_job(4);
    const State ref = single_device(base);
    for (const char* schedule : {"gpipe", "1f1b"})
        for (int m : {1, 2, 4})
            for (int zero : {0, 1, 2, 3}) {
                Config c = with_layout(base, 2, schedule, m);
                c.layout.dp = 2;
                c.layout.zero = zero;
                bool agree = false;
                const State got = dp_pipeline(c, agree);
                INFO("dp2 pp2 " << schedule << ", " << m << " microbatches per replica, ZeRO-"
                                << zero);
                check_same(ref, got, agree);
            }
}

TEST_CASE("dp2 × pp3 (a middle stage without wte, ZeRO 1-3) and dp2 × interleaved pp2 are exact") {
    const Config six = small_job(6);
    const State ref6 = single_device(six);
    Config c = with_layout(six, 3, "1f1b", 2);
    c.layout.dp = 2;
    bool agree = false;
    State got;
    for (int zero : {1, 2, 3}) {
        c.layout.zero = zero;
        got = dp_pipeline(c, agree);
        INFO("dp2 pp3 ZeRO-" << zero);
        check_same(ref6, got, agree);
    }

    const Config four = small_job(4);
    const State ref4 = single_device(four);
    c = with_layout(four, 2, "interleaved", 2, 2, "full");
    c.layout.dp = 2;
    got = dp_pipeline(c, agree);
    check_same(ref4, got, agree);

    // dp4 × pp2: the replicas' gradients must meet in the canonical tree; a ring sum over dp
    // (which runs, and agrees on every rank) changes the bits.
    c = with_layout(four, 2, "1f1b", 2);
    c.layout.dp = 4;
    got = dp_pipeline(c, agree);
    check_same(ref4, got, agree);
    got = dp_pipeline(c, agree, comm::Algo::ring);
    CHECK(agree);
    CHECK_FALSE(same_bits(ref4.params, got.params));
}

TEST_CASE("run_pipeline and run_layout start dp × pp layouts with the single device's state") {
    const Config base = small_job(4);
    const State ref = single_device(base);
    Config c = with_layout(base, 2, "1f1b", 2);
    c.layout.dp = 2;
    for (int zero : {0, 1, 3}) {  // ZeRO: inspect sees the stages unsharded
        c.layout.zero = zero;
        bool agree = false;
        const State got = pipeline(c, agree);  // both replicas' stages absorbed: they must agree
        INFO("ZeRO-" << zero);
        check_same(ref, got, agree);
    }

    // run_layout dispatches pp > 1 to run_pipeline: rank 0's metrics reach the observers.
    struct Losses : Observer {
        std::vector<double> loss;
        void on_step(const RunView& run, const StepMetrics& m) override {
            CHECK(run.dp_size() == 2);
            loss.push_back(m.loss);
        }
    } observer;
    c.layout.zero = 1;
    c.layout.schedule = "gpipe";
    run_layout(c, {&observer});
    CHECK(same_bits(series(ref, &StepMetrics::loss), observer.loss));
}

TEST_CASE("dp × pp layouts that cannot work are refused with a sentence naming the keys") {
    Config c = with_layout(small_job(4), 2, "1f1b", 2);
    c.layout.dp = 3;  // 8 sequences over 3 replicas
    CHECK_THROWS_WITH(run_layout(c),
                      Catch::Contains("layout.dp") && Catch::Contains("train.batch_size"));
    c.layout.dp = 2;
    c.layout.microbatches = 8;  // 8 sequences: half a sequence per microbatch
    CHECK_THROWS_WITH(run_layout(c),
                      Catch::Contains("layout.dp") && Catch::Contains("train.batch_size"));
    c.layout.microbatches = 2;
    comm::run_ranks(2, 30, [&](comm::Communicator& world) {  // a job started on a wrong group
        CHECK_THROWS_WITH(Job(c, make_layout(c), RankGroups{&world, &world, nullptr, nullptr}),
                          Catch::Contains("layout.dp = 2"));
    });
}

namespace {

// Shapes whose tp shares are whole blocks of 16 at tp = 2 (as tests/layouts/test_tp_model.cpp): C = 64,
// 4 heads, F = 128, V = 64; 4 layers, T = 32, so 16 token blocks per batch of 8.
Config tp_pp_job() {
    return test::with_tp_shapes(small_job(4));
}

Config tp_pp(const Config& base, int dp, const std::string& schedule, int microbatches,
             int zero = 0) {
    Config c = with_layout(base, 2, schedule, microbatches);
    c.layout.dp = dp;
    c.layout.tp = 2;
    c.layout.zero = zero;
    return c;
}

}  // namespace

TEST_CASE("tp2 × pp2 (GPipe, 1F1B; 2 and 4 microbatches) is bit-identical to the single device") {
    const Config base = tp_pp_job();
    const State ref = single_device(base);
    for (const char* schedule : {"gpipe", "1f1b"})
        for (int m : {2, 4}) {
            bool agree = false;
            const State got = pipeline(tp_pp(base, 1, schedule, m), agree);  // LogicalState
            INFO("tp2 pp2 " << schedule << ", " << m << " microbatches");
            check_same(ref, got, agree);
        }
}

TEST_CASE("dp2 × tp2 × pp2 with GPipe and 1F1B, ZeRO 0-3, is bit-identical to the single device") {
    const Config base = tp_pp_job();
    const State ref = single_device(base);
    for (const char* schedule : {"gpipe", "1f1b"})
        for (int m : {2, 4})
            for (int zero : {0, 1, 2, 3}) {
                bool agree = false;
                const State got = dp_pipeline(tp_pp(base, 2, schedule, m, zero), agree);
                INFO("dp2 tp2 pp2 " << schedule << ", " << m << " microbatches per replica, ZeRO-"
                                    << zero);
                check_same(ref, got, agree);
            }
}

TEST_CASE("sequence parallelism in pipelines: tp2 × pp2+SP and dp2 × tp2 × pp2+SP are exact") {
    // Each stage boundary carries a tp rank's token rows of the hidden state, to the same tp
    // rank of the next stage (pipeline.h, 10.); 4 microbatches of 2 sequences: 4 token blocks
    // per microbatch, 2 per tp rank.
    const Config base = tp_pp_job();
    const State ref = single_device(base);
    for (int m : {2, 4}) {
        Config c = tp_pp(base, 1, "1f1b", m);
        c.layout.sequence_parallel = true;
        bool agree = false;
        const State got = pipeline(c, agree);
        INFO("tp2 pp2 + SP 1f1b, " << m << " microbatches");
        check_same(ref, got, agree);
    }
    Config c = tp_pp(base, 2, "1f1b", 2, 1);
    c.layout.sequence_parallel = true;
    bool agree = false;
    {
        INFO("dp2 tp2 pp2 + SP 1f1b, 2 microbatches per replica, ZeRO-1");
        const State got = dp_pipeline(c, agree);
        check_same(ref, got, agree);
    }
    // The stages really run sequence-parallel layers.
    int sp_ranks = 0;
    run_layout(c, {}, test::inspecting([&](Job& job) {
        CHECK(job.model().parallel_layers() != nullptr);
        if (job.model().parallel_layers()->sequence_parallel()) sp_ranks++;
    }));
    CHECK(sp_ranks == 8);
    // A microbatch of one sequence is 2 token blocks: too few for 4 tp ranks.
    c = tp_pp(base, 2, "1f1b", 4);
    c.layout.tp = 4;
    c.layout.sequence_parallel = true;
    CHECK_THROWS_WITH(run_layout(c), Catch::Contains("layout.sequence_parallel") &&
                                           Catch::Contains("numerics.block"));
}

TEST_CASE("sequence parallelism in pipelines: GPipe, interleaved with recomputation, pp3, tp4") {
    const Config base = tp_pp_job();
    const State ref = single_device(base);
    bool agree = false;
    Config c = tp_pp(base, 1, "gpipe", 4);
    c.layout.sequence_parallel = true;
    {
        INFO("tp2 pp2 + SP gpipe, 4 microbatches");
        const State got = pipeline(c, agree);
        check_same(ref, got, agree);
    }
    c = tp_pp(base, 1, "interleaved", 4);
    c.layout.virtual_stages = 2;
    c.layout.recompute = "full";
    c.layout.sequence_parallel = true;
    {
        INFO("tp2 interleaved pp2 v2 + SP, recompute full");
        const State got = pipeline(c, agree);
        check_same(ref, got, agree);
    }
    c = tp_pp(base, 1, "1f1b", 2);
    c.layout.tp = 4;  // 8 token blocks per microbatch, 2 per tp rank
    c.layout.sequence_parallel = true;
    {
        INFO("tp4 pp2 + SP");
        const State got = pipeline(c, agree);
        check_same(ref, got, agree);
    }
    Config six = tp_pp_job();
    six.model.layers = 6;
    const State ref6 = single_device(six);
    c = tp_pp(six, 2, "1f1b", 2, 2);
    c.layout.pp = 3;
    c.layout.sequence_parallel = true;
    {
        INFO("dp2 tp2 pp3 + SP, ZeRO-2 (a middle stage receives and sends slices)");
        const State got = dp_pipeline(c, agree);
        check_same(ref6, got, agree);
    }
}

TEST_CASE("tp × pp: pp3 (a middle stage without wte), interleaved with recomputation, tp4 × pp2") {
    Config six = tp_pp_job();
    six.model.layers = 6;
    const State ref6 = single_device(six);
    Config c = tp_pp(six, 2, "1f1b", 2, 2);
    c.layout.pp = 3;
    bool agree = false;
    {
        INFO("dp2 tp2 pp3 ZeRO-2");
        const State got = dp_pipeline(c, agree);
        check_same(ref6, got, agree);
    }
    const Config base = tp_pp_job();
    const State ref = single_device(base);
    c = tp_pp(base, 1, "interleaved", 4);
    c.layout.virtual_stages = 2;
    c.layout.recompute = "full";
    {
        INFO("tp2 interleaved pp2 v2, recompute full");
        const State got = pipeline(c, agree);
        check_same(ref, got, agree);
    }
    c = tp_pp(base, 1, "1f1b", 2);
    c.layout.tp = 4;  // one vocabulary block and 16 channels per rank
    {
        INFO("tp4 pp2");
        const State got = pipeline(c, agree);
        check_same(ref, got, agree);
    }
    Config two_blocks = base;
    two_blocks.model.vocab = 32;  // tp ranks 2 and 3 hold no rows of wte: empty tied exchange
    const State ref32 = single_device(two_blocks);
    c = tp_pp(two_blocks, 1, "gpipe", 2);
    c.layout.tp = 4;
    {
        INFO("tp4 pp2 over a vocabulary of two blocks");
        const State got = pipeline(c, agree);
        check_same(ref32, got, agree);
    }
}

TEST_CASE("run_layout starts dp2 × tp2 × pp2; inspect sees the stages' shards, unsharded") {
    const Config base = tp_pp_job();
    const State ref = single_device(base);
    const Config c = tp_pp(base, 2, "1f1b", 2, 1);
    bool agree = false;
    const State got = pipeline(c, agree);  // every rank's shard absorbed: copies must agree
    check_same(ref, got, agree);
    int shards = 0;
    run_layout(c, {}, test::inspecting([&](Job& job) {
        CHECK(job.tp_size() == 2);
        CHECK(job.model().parallel_layers() != nullptr);
        CHECK(job.model().num_params() < ParamTable::build(c.model, job.model().part()).num_params);
        shards++;
    }));
    CHECK(shards == 8);

    struct Losses : Observer {
        std::vector<double> loss;
        void on_step(const RunView&, const StepMetrics& m) override { loss.push_back(m.loss); }
    } observer;
    run_layout(c, {&observer});
    CHECK(same_bits(series(ref, &StepMetrics::loss), observer.loss));
}

TEST_CASE("tp2 × pp2 exports the single device's llm.c file and starts from one") {
    namespace fs = std::filesystem;
    const fs::path dir = test::temp_dir("tp_pipeline_llmc");
    auto read = [](const fs::path& p) {
        std::ifstream f(p, std::ios::binary);
        return std::vector<char>(std::istreambuf_iterator<char>(f), {});
    };
    Config c = tp_pp_job();
    c.model.ffn = 4 * c.model.hidden;  // llm.c's format fixes the MLP at 4·C
    c.train.steps = 2;
    c.train.eval_every = 0;
    c.output.export_llmc = (dir / "single.bin").string();
    Job single(c);
    single.run();
    Config pc = tp_pp(c, 1, "1f1b", 2);
    pc.output.export_llmc = (dir / "tp_pp.bin").string();
    run_layout(pc);
    const std::vector<char> a = read(dir / "single.bin"), b = read(dir / "tp_pp.bin");
    CHECK(!a.empty());
    CHECK(a == b);

    Config from = c;
    from.model.init_from = (dir / "single.bin").string();
    from.output.export_llmc.clear();
    const State ref = single_device(from);
    bool agree = false;
    const State got = pipeline(tp_pp(from, 1, "gpipe", 2), agree);
    check_same(ref, got, agree);
    fs::remove_all(dir);
}

// ---- zero-bubble schedules --------------------------------------------------------------------

// ZB-H1 and ZBV defer each microbatch's weight gradients (W) past later microbatches' input
// gradients (B). The bits hold because a microbatch's W lands in its own token nodes and the
// nodes combine in the token tree, whatever order the Ws come in: with m >= 3 an accumulation in
// arrival order ((w0 + w1) + w2) would differ from the tree's ((w0 + w1) + (w2 + w3)) and fail.
TEST_CASE("zero-bubble schedules (ZB-H1, ZBV) are bit-identical to the single device") {
    const Config four = small_job(4), eight = small_job(8);
    const State ref4 = single_device(four), ref8 = single_device(eight);
    for (int m : {1, 2, 4, 8}) check_pipeline(four, ref4, 2, "zb-h1", m);
    for (int m : {2, 4}) check_pipeline(eight, ref8, 4, "zb-h1", m);
    for (int m : {1, 2, 4, 8}) check_pipeline(four, ref4, 2, "zbv", m);  // V: 2·2 chunks of 1 layer
    check_pipeline(eight, ref8, 4, "zbv", 4);
    check_pipeline(four, ref4, 2, "zb-h1", 4, 1, "full");  // W from kept copies of the inputs
    check_pipeline(four, ref4, 2, "zbv", 4, 2, "full");
    // dp2 × pp2 × tp2 with ZeRO-1 and several microbatches per replica.
    const Config tp = tp_pp_job();
    const State ref_tp = single_device(tp);
    for (const char* schedule : {"zb-h1", "zbv"})
        for (int m : {2, 4}) {
            bool agree = false;
            const State got = dp_pipeline(tp_pp(tp, 2, schedule, m, 1), agree);
            INFO("dp2 tp2 pp2 " << schedule << ", " << m << " microbatches per replica, ZeRO-1");
            check_same(ref_tp, got, agree);
        }
}

TEST_CASE("ZB-H1 holds 1F1B's activation sets on the first stage, each until its W") {
    Config c = with_layout(small_job(4), 4, "zb-h1", 8);
    c.train.eval_every = 0;
    c.train.steps = 1;
    std::vector<int> sets(4, 0);
    run_layout(c, {}, test::inspecting([&](Job& job) {
        sets[static_cast<size_t>(job.pp_rank())] = job.pipeline().activation_sets(0);
    }));
    const SimResult sim = check_schedule(zb_h1(4, 8));
    REQUIRE(sim.ok());
    for (int p = 0; p < 4; p++) {
        INFO("rank " << p);
        // a set per microbatch between its forward and its W (plus one whose gradient was still
        // being sent when the next forward needed a set)
        CHECK(sets[static_cast<size_t>(p)] >= sim.peak_in_flight[static_cast<size_t>(p)]);
        CHECK(sets[static_cast<size_t>(p)] <= sim.peak_in_flight[static_cast<size_t>(p)] + 1);
    }
    CHECK(sets[0] == 4);  // 1F1B's pp on the first stage
}

TEST_CASE("zero-bubble layouts that cannot work are refused with a sentence naming the keys") {
    Config c = with_layout(small_job(4), 2, "zbv", 4, 3);
    CHECK_THROWS_WITH(run_layout(c), Catch::Contains("layout.virtual_stages=3") &&
                                         Catch::Contains("set it to 2"));
    c = with_layout(small_job(6), 4, "zbv", 4);
    CHECK_THROWS_WITH(run_layout(c), Catch::Contains("2 × layout.pp = 8 chunks, more than "
                                                     "model.layers=6"));
    c = with_layout(small_job(4), 2, "zb-h1", 4);
    c.layout.dp = 2;
    c.layout.zero = 2;
    CHECK_THROWS_WITH(run_layout(c), Catch::Contains("defers weight gradients, which ZeRO-2"));
}
