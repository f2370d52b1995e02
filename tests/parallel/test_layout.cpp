// The parallel layout: mesh coordinates and groups, stage -> layer assignment, the validation
// sentences, token ranges as nodes of the canonical tree, and the pipeline schedules (complete,
// deadlock-free, dependency-respecting, their memory and bubble, their text).
#include "core/parallel/mesh.h"
#include "core/parallel/pipeline/schedule.h"

#include "core/base/error.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

using namespace px;
using Catch::Matchers::Contains;

namespace {

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const ConfigError& e) {
        return e.what();
    } catch (const std::exception& e) {
        FAIL("threw something other than ConfigError: " << e.what());
    }
    FAIL("did not throw");
    return "";
}

// The default model (L=2, NH=4, C=64, F=256), batch 8 of T=128, blocks of 64, one device.
Layout base() {
    return Layout{};
}

Layout mesh_layout(int dp, int pp, int tp) {
    Layout l = base();
    l.dp = dp;
    l.pp = pp;
    l.tp = tp;
    l.layers = 8;
    l.block = 16;  // tensor-parallel shares of C = 64 and F = 256 stay whole blocks up to tp = 4
    return l;
}

// Whether the canonical tree over owners [lo, hi) (split at tree_mid, as comm::Algo::canonical
// does over ranks) visits only nodes of the block tree: then combining the owners' partials in
// owner order is exactly the single-device sum.
bool owner_tree_matches(const std::vector<std::pair<i64, i64>>& owned, i64 nb, i64 lo, i64 hi) {
    if (!is_tree_node(nb, owned[lo].first, owned[hi - 1].second)) return false;
    if (hi - lo == 1) return true;
    const i64 mid = tree_mid(lo, hi);
    return owner_tree_matches(owned, nb, lo, mid) && owner_tree_matches(owned, nb, mid, hi);
}

}  // namespace

// ---- mesh ------------------------------------------------------------------------------------

TEST_CASE("mesh 2x2x2: coordinates, groups and split colors", "[layout]") {
    const Mesh mesh(mesh_layout(2, 2, 2));
    REQUIRE(mesh.world_size() == 8);
    // rank = (pp·dp + dp_rank)·tp + tp_rank
    CHECK(mesh.coord_of(5) == Coord{1, 0, 1});
    CHECK(mesh.rank_of({1, 0, 1}) == 5);
    CHECK(mesh.coord_of(6) == Coord{1, 1, 0});
    for (int r = 0; r < 8; r++) CHECK(mesh.rank_of(mesh.coord_of(r)) == r);

    CHECK(mesh.tp_group(5) == std::vector<int>{4, 5});
    CHECK(mesh.dp_group(5) == std::vector<int>{5, 7});
    CHECK(mesh.pp_group(5) == std::vector<int>{1, 5});
    CHECK(mesh.groups(MeshDim::tp) == std::vector<std::vector<int>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
    CHECK(mesh.groups(MeshDim::dp) == std::vector<std::vector<int>>{{0, 2}, {1, 3}, {4, 6}, {5, 7}});
    CHECK(mesh.groups(MeshDim::pp) == std::vector<std::vector<int>>{{0, 4}, {1, 5}, {2, 6}, {3, 7}});
    CHECK(mesh.pp_peer(5, 0) == 1);
    CHECK(mesh.pp_peer(1, 1) == 5);

    for (const MeshDim d : {MeshDim::pp, MeshDim::dp, MeshDim::tp}) {
        INFO(dim_name(d));
        // A rank sits in group_color's group at its own coordinate, and the groups partition the
        // world.
        std::vector<int> seen(8, 0);
        const auto gs = mesh.groups(d);
        for (int r = 0; r < 8; r++) {
            const auto& g = gs[static_cast<size_t>(mesh.group_color(d, r))];
            CHECK(g[static_cast<size_t>(mesh.coord_of(r)[d])] == r);
            CHECK(g == mesh.group(d, r));
        }
        for (const auto& g : gs)
            for (const int r : g) seen[static_cast<size_t>(r)]++;
        CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    }
    CHECK_THAT(mesh.describe(), Contains("8 ranks = pp 2 × dp 2 × tp 2") &&
                                    Contains("rank 5: pp 1, dp 0, tp 1, layers [4,8)"));
}

TEST_CASE("mesh 3x1x1, 1x4x1 and 1x1x4", "[layout]") {
    Layout l = base();
    l.dp = 3;
    l.batch_size = 3;
    l.seq_len = 64;  // one block per sequence: 3 blocks, [0,1) [1,2) [2,3) are nodes
    const Mesh dp3(l);
    CHECK(dp3.world_size() == 3);
    for (int r = 0; r < 3; r++) CHECK(dp3.coord_of(r) == Coord{0, r, 0});
    CHECK(dp3.groups(MeshDim::dp) == std::vector<std::vector<int>>{{0, 1, 2}});
    CHECK(dp3.groups(MeshDim::tp) == std::vector<std::vector<int>>{{0}, {1}, {2}});
    CHECK(dp3.groups(MeshDim::pp) == std::vector<std::vector<int>>{{0}, {1}, {2}});

    const Mesh pp4(mesh_layout(1, 4, 1));
    CHECK(pp4.pp_group(2) == std::vector<int>{0, 1, 2, 3});
    CHECK(pp4.coord_of(3) == Coord{3, 0, 0});

    const Mesh tp4(mesh_layout(1, 1, 4));
    CHECK(tp4.tp_group(2) == std::vector<int>{0, 1, 2, 3});
    CHECK(tp4.dp_group(2) == std::vector<int>{2});

    CHECK_THAT(error_of([&] { pp4.require_world_size(2); }),
               Contains("the layout needs layout.pp × layout.dp × layout.cp × layout.tp = "
                        "4 × 1 × 1 × 1 = 4 ranks, but 2 were started"));
    CHECK_NOTHROW(pp4.require_world_size(4));
}

TEST_CASE("pipeline stages own contiguous layers", "[layout]") {
    SECTION("even split") {
        const Mesh m(mesh_layout(1, 4, 1));  // 8 layers
        for (int p = 0; p < 4; p++) CHECK(m.layers(p) == LayerRange{2 * p, 2 * p + 2});
    }
    SECTION("uneven: earlier stages take the extra layers") {
        Layout l = base();
        l.pp = 3;
        l.layers = 5;
        const Mesh m(l);
        CHECK(m.layers(0) == LayerRange{0, 2});
        CHECK(m.layers(1) == LayerRange{2, 4});
        CHECK(m.layers(2) == LayerRange{4, 5});
        l.pp = 2;
        l.layers = 3;
        CHECK(Mesh(l).layers(0) == LayerRange{0, 2});
        CHECK(Mesh(l).layers(1) == LayerRange{2, 3});
    }
    SECTION("interleaved: chunk c of rank p is virtual stage c·pp + p") {
        Layout l = base();
        l.pp = 2;
        l.layers = 8;
        l.schedule = ScheduleKind::interleaved;
        l.virtual_stages = 2;
        l.microbatches = 2;  // a multiple of pp
        const Mesh m(l);
        CHECK(m.layers(0, 0) == LayerRange{0, 2});
        CHECK(m.layers(1, 0) == LayerRange{2, 4});
        CHECK(m.layers(0, 1) == LayerRange{4, 6});
        CHECK(m.layers(1, 1) == LayerRange{6, 8});
    }
    SECTION("every layer once, in virtual-stage order, for many shapes") {
        for (int L = 1; L <= 12; L++) {
            for (int pp = 1; pp <= L; pp++) {
                Layout l = base();
                l.layers = L;
                l.pp = pp;
                const Mesh m(l);
                int next = 0;
                for (int p = 0; p < pp; p++) {
                    const LayerRange r = m.layers(p);
                    CHECK(r.lo == next);
                    CHECK(r.size() >= 1);
                    CHECK(r.size() <= m.layers(0).size());  // no stage larger than the first
                    next = r.hi;
                }
                CHECK(next == L);
            }
        }
    }
}

// ---- layouts from configs --------------------------------------------------------------------

TEST_CASE("make_layout resolves the [layout] keys", "[layout]") {
    Config c;
    apply_overrides(c, {"layout.dp=2", "layout.tp=2", "layout.pp=2", "layout.zero=3",
                        "layout.microbatches=4", "layout.schedule=1f1b", "numerics.block=16"});
    const Layout l = make_layout(c);
    CHECK(l.world_size() == 8);
    CHECK(l.zero == 3);
    CHECK(l.microbatches == 4);
    CHECK(l.microbatches_key == "layout.microbatches");
    CHECK(l.microbatch_size() == 1);
    CHECK(l.schedule == ScheduleKind::one_f_one_b);
    CHECK(l.algo == comm::Algo::canonical);
    CHECK(l.recompute == Recompute::none);
    CHECK(l.timeout_s == 60.0);
    CHECK(Mesh(l).schedule().pp == 2);

    // layout.microbatches = 0 takes train.microbatches; "auto" collectives are ring in fast mode.
    Config d;
    apply_overrides(d, {"train.microbatches=2", "numerics.mode=fast", "layout.recompute=full"});
    const Layout m = make_layout(d);
    CHECK(m.microbatches == 2);
    CHECK(m.microbatches_key == "train.microbatches");
    CHECK(m.algo == comm::Algo::ring);
    CHECK(m.recompute == Recompute::full);
    apply_override(d, "layout.comm=canonical");
    CHECK(make_layout(d).algo == comm::Algo::canonical);

    // Errors name the config's source.
    Config e;
    e.source_name = "job.toml";
    e.layout.tp = 3;
    CHECK_THAT(error_of([&] { make_layout(e); }),
               Contains("job.toml: layout.tp=3 does not divide model.heads=4"));
    // ZeRO with one dp rank is allowed: the shard is the whole state.
    Config z;
    z.layout.zero = 3;
    CHECK_NOTHROW(make_layout(z));
}

TEST_CASE("each validation error is a sentence naming the keys", "[layout]") {
    struct Case {
        const char* what;
        std::function<void(Layout&)> set;
        std::vector<std::string> message;
    };
    const std::vector<Case> cases = {
        {"tp vs heads", [](Layout& l) { l.tp = 3; }, {"layout.tp=3 does not divide model.heads=4"}},
        {"tp vs hidden",
         [](Layout& l) {
             l.tp = 4;
             l.hidden = 66;
         },
         {"layout.tp=4 does not divide model.hidden=66"}},
        {"tp vs ffn",
         [](Layout& l) {
             l.tp = 4;
             l.ffn = 250;
         },
         {"layout.tp=4 does not divide model.ffn=250"}},
        {"pp vs layers",
         [](Layout& l) { l.pp = 4; },
         {"layout.pp=4 is more than model.layers=2 (each pipeline stage needs at least one "
          "layer)"}},
        {"dp x microbatches vs batch",
         [](Layout& l) { l.dp = 3; },
         {"layout.dp=3 × train.microbatches=1 = 3 does not divide train.batch_size=8"}},
        {"layout.microbatches named",
         [](Layout& l) {
             l.dp = 2;
             l.microbatches = 3;
             l.microbatches_key = "layout.microbatches";
         },
         {"layout.dp=2 × layout.microbatches=3 = 6 does not divide train.batch_size=8"}},
        {"interleaved layers",
         [](Layout& l) {
             l.layers = 6;
             l.pp = 2;
             l.schedule = ScheduleKind::interleaved;
             l.virtual_stages = 2;
         },
         {"model.layers divisible by layout.pp × layout.virtual_stages = 2 × 2 = 4, got "
          "model.layers=6"}},
        {"interleaved microbatches",
         [](Layout& l) {
             l.layers = 4;
             l.pp = 2;
             l.schedule = ScheduleKind::interleaved;
             l.virtual_stages = 2;
             l.microbatches = 3;
             l.batch_size = 6;
             l.microbatches_key = "layout.microbatches";
         },
         {"the interleaved schedule needs layout.microbatches=3 divisible by layout.pp=2"}},
        {"virtual stages without interleaving",
         [](Layout& l) { l.virtual_stages = 2; },
         {"layout.virtual_stages=2 needs layout.schedule = \"interleaved\", got \"1f1b\""}},
        {"interleaved with one chunk",
         [](Layout& l) { l.schedule = ScheduleKind::interleaved; },
         {"layout.schedule = \"interleaved\" needs layout.virtual_stages >= 2"}},
        {"ring in bitwise mode",
         [](Layout& l) { l.algo = comm::Algo::ring; },
         {"layout.comm = \"ring\" breaks numerics.mode = \"bitwise\""}},
        {"zero",
         [](Layout& l) { l.zero = 4; },
         {"layout.zero = 4 is out of range: must be in 0..3"}},
        {"dp", [](Layout& l) { l.dp = 0; }, {"layout.dp = 0 is out of range: must be >= 1"}},
        {"microbatches",
         [](Layout& l) { l.microbatches = 0; },
         {"train.microbatches = 0 is out of range: must be >= 1"}},
        {"timeout", [](Layout& l) { l.timeout_s = 0; }, {"layout.timeout_s", "must be > 0"}},
        {"cp chunks",
         [](Layout& l) { l.cp = 2; },
         {"layout.cp=2", "model.seq_len=128", "numerics.block=64", "zig-zag chunks"}},
        {"cp ulysses heads",
         [](Layout& l) {
             l.cp = 8;
             l.seq_len = 1024;
             l.cp_method = CpMethod::ulysses;
         },
         {"layout.cp_method = \"ulysses\"", "model.heads=4"}},
        {"token range inside a block",
         [](Layout& l) {
             l.dp = 2;
             l.microbatches = 2;
             l.seq_len = 48;
         },
         {"layout.dp=2 × train.microbatches=2 with train.batch_size=8, model.seq_len=48 and "
          "numerics.block=64",
          "dp rank 0, microbatch 0 starts or ends at token 96, inside a block of 64 tokens"}},
    };
    for (const auto& c : cases) {
        INFO(c.what);
        Layout l = base();
        c.set(l);
        const std::string msg = error_of([&] { Mesh m(l); });
        for (const auto& part : c.message) CHECK_THAT(msg, Contains(part));
        CHECK_THAT(error_of([&] { validate_layout(l); }), Contains(c.message.front()));
    }
    // Ranges that are not tree nodes are allowed (dp rank 1 owns blocks [2,4) of 6), with tp
    // and sequence parallelism too.
    for (int tp : {1, 2}) {
        Layout odd = base();
        odd.dp = 3;
        odd.batch_size = 6;
        odd.seq_len = 64;
        odd.tp = tp;
        odd.hidden = 128;
        odd.sequence_parallel = tp > 1;
        CHECK_NOTHROW(Mesh(odd));
        odd.microbatches = 2;
        CHECK_NOTHROW(Mesh(odd));
    }
    // Edges that are allowed: 1F1B and GPipe take fewer microbatches than stages; ZeRO with dp = 1.
    Layout ok = mesh_layout(1, 4, 1);
    ok.microbatches = 1;
    CHECK_NOTHROW(Mesh(ok));
    ok.schedule = ScheduleKind::gpipe;
    ok.zero = 2;
    CHECK_NOTHROW(Mesh(ok));
}

// ---- token ranges ----------------------------------------------------------------------------

TEST_CASE("token ranges are nodes of the canonical tree", "[layout]") {
    SECTION("dp=2, microbatches=2, batch 8 of 64 tokens, block 64") {
        Layout l = base();
        l.dp = 2;
        l.microbatches = 2;
        l.seq_len = 64;
        const auto r = token_ranges(l);
        const std::vector<TokenRange> want = {
            {0, 0, 0, 2, 0, 2}, {0, 1, 2, 4, 2, 4}, {1, 0, 4, 6, 4, 6}, {1, 1, 6, 8, 6, 8}};
        CHECK(r == want);
    }
    SECTION("dp=3: batch 3 gives nodes; batch 6 ranges that are not") {
        Layout l = base();
        l.dp = 3;
        l.seq_len = 64;
        l.batch_size = 3;
        const auto r = token_ranges(l);
        REQUIRE(r.size() == 3);
        CHECK(r[1].block_lo == 1);
        CHECK(r[1].block_hi == 2);
        l.batch_size = 6;
        const auto r6 = token_ranges(l);  // [2,4) of 6: the nodes [2,3) and [3,4)
        REQUIRE(r6.size() == 3);
        CHECK(r6[1].block_lo == 2);
        CHECK(r6[1].block_hi == 4);
    }
    SECTION("ZeRO-2/3 cut by microbatch only when every range and piece is a node") {
        Layout l = base();
        l.seq_len = 64;
        l.zero = 2;
        l.dp = 2;
        l.microbatches = 2;
        CHECK(l.microbatch_major());
        l.dp = 3;
        l.batch_size = 6;
        l.microbatches = 1;
        CHECK_FALSE(l.microbatch_major());  // pieces [2,4) of 6: dp-major instead
        CHECK(token_ranges(l)[1].sample_lo == 2);
        l.batch_size = 3;
        CHECK(l.microbatch_major());  // pieces [0,1) [1,2) [2,3) of 3, range [0,3): nodes
    }
    SECTION("an unvalidated layout is checked too") {
        Layout l = base();
        l.dp = 3;
        CHECK_THAT(
            error_of([&] { token_ranges(l); }),
            Contains("layout.dp=3 × train.microbatches=1 = 3 does not divide train.batch_size=8"));
    }
    SECTION("a partial last block belongs to the last range") {
        Layout l = base();
        l.seq_len = 40;
        l.batch_size = 3;  // 120 tokens: blocks [0,64) [64,120)
        const auto r = token_ranges(l);
        REQUIRE(r.size() == 1);
        CHECK(r[0].block_hi == 2);
        l.dp = 3;
        CHECK_THAT(error_of([&] { token_ranges(l); }),
                   Contains("starts or ends at token 40, inside a block of 64 tokens"));
    }
    SECTION("sequences shorter than a block: microbatches of whole blocks") {
        Layout l = base();
        l.seq_len = 32;
        l.dp = 2;
        l.microbatches = 2;  // 2 sequences = 64 tokens each
        const auto r = token_ranges(l);
        REQUIRE(r.size() == 4);
        for (size_t i = 0; i < 4; i++) CHECK(r[i].block_hi - r[i].block_lo == 1);
        l.microbatches = 4;  // 1 sequence = half a block
        CHECK_THAT(error_of([&] { token_ranges(l); }), Contains("inside a block of 64 tokens"));
    }
    SECTION("only a block cut between owners is refused; where ranges are nodes, the owners' "
            "tree is the block tree") {
        int valid = 0, invalid = 0, nodes = 0;
        for (int dp = 1; dp <= 8; dp++)
            for (int M = 1; M <= 8; M++)
                for (i64 B = 1; B <= 24; B++)
                    for (const i64 T : {16, 32, 48, 64, 100})
                        for (const int block : {16, 64}) {
                            if (B % (dp * M) != 0) continue;
                            Layout l = base();
                            l.dp = dp;
                            l.microbatches = M;
                            l.batch_size = B;
                            l.seq_len = T;
                            l.block = block;
                            // A range that is not one node is computed as its nodes.
                            std::vector<TokenRange> r;
                            try {
                                r = token_ranges(l);
                            } catch (const ConfigError& e) {
                                CHECK_THAT(e.what(), Contains("inside a block"));
                                invalid++;
                                continue;
                            }
                            valid++;
                            INFO("dp=" << dp << " M=" << M << " B=" << B << " T=" << T
                                       << " block=" << block);
                            const i64 nb = l.token_blocks();
                            // The ranges tile the batch in order.
                            REQUIRE(r.size() == static_cast<size_t>(dp * M));
                            CHECK(r.front().sample_lo == 0);
                            CHECK(r.back().sample_hi == B);
                            CHECK(r.front().block_lo == 0);
                            CHECK(r.back().block_hi == nb);
                            for (size_t i = 1; i < r.size(); i++) {
                                CHECK(r[i].sample_lo == r[i - 1].sample_hi);
                                CHECK(r[i].block_lo == r[i - 1].block_hi);
                            }
                            // Over dp ranks (canonical all-reduce) and over each rank's
                            // microbatches.
                            std::vector<std::pair<i64, i64>> ranks, all;
                            for (int d = 0; d < dp; d++)
                                ranks.push_back({r[d * M].block_lo, r[d * M + M - 1].block_hi});
                            for (const auto& t : r) all.push_back({t.block_lo, t.block_hi});
                            bool all_nodes = true;
                            for (const auto& [lo, hi] : ranks) all_nodes &= is_tree_node(nb, lo, hi);
                            for (const auto& [lo, hi] : all) all_nodes &= is_tree_node(nb, lo, hi);
                            if (!all_nodes) continue;
                            nodes++;
                            CHECK(owner_tree_matches(ranks, nb, 0, dp));
                            for (int d = 0; d < dp; d++)
                                CHECK(owner_tree_matches(all, nb, d * M, d * M + M));
                        }
        CHECK(valid > 200);
        CHECK(invalid > 50);
        CHECK(nodes > 100);
        CHECK(valid - nodes > 50);  // ranges that are not nodes: exact all the same
    }
}

// ---- schedules -------------------------------------------------------------------------------

namespace {

// Independent of the simulator's own checks: per rank, each (microbatch, chunk) forward and
// backward exactly once; from the simulated start slots, a forward starts after the previous
// stage's forward ended, a backward after its own forward and the next stage's backward.
void check_work_and_dependencies(const Schedule& s, const SimResult& r,
                                 const SimOptions& opt = {}) {
    const int S = s.num_stages();
    // (stage, microbatch) -> start slot of its forward, its backward (or B), its W
    std::map<std::pair<int, int>, int> fwd, bwd, wgt;
    for (int p = 0; p < s.pp; p++) {
        for (size_t i = 0; i < s.ranks[p].size(); i++) {
            const Action& a = s.ranks[p][i];
            if (!a.is_compute()) continue;
            auto& table = a.kind == Action::forward           ? fwd
                          : a.kind == Action::backward_weight ? wgt
                                                              : bwd;
            const auto key =
                std::make_pair(stage_of(p, a.chunk, s.pp, s.placement()), a.microbatch);
            CHECK(table.count(key) == 0);
            table[key] = r.start[p][i];
        }
    }
    const size_t cells = static_cast<size_t>(S * s.microbatches);
    REQUIRE(fwd.size() == cells);
    REQUIRE(bwd.size() == cells);
    REQUIRE(wgt.size() == (s.splits() ? cells : 0));
    // A backward's own time: B alone when split, else B and W (SimOptions).
    const int b_slots = opt.backward_slots + (s.splits() ? 0 : opt.weight_slots);
    for (int k = 0; k < S; k++) {
        for (int m = 0; m < s.microbatches; m++) {
            INFO("stage " << k << " microbatch " << m);
            if (k > 0) CHECK(fwd[{k, m}] >= fwd[{k - 1, m}] + opt.forward_slots);
            CHECK(bwd[{k, m}] >= fwd[{k, m}] + opt.forward_slots);
            if (k < S - 1) CHECK(bwd[{k, m}] >= bwd[{k + 1, m}] + b_slots);
            if (s.splits()) CHECK(wgt[{k, m}] >= bwd[{k, m}] + b_slots);
        }
    }
}

int count_comm(const Schedule& s) {
    int n = 0;
    for (const auto& list : s.ranks)
        for (const Action& a : list) n += !a.is_compute();
    return n;
}

}  // namespace

TEST_CASE("GPipe and 1F1B: complete, deadlock-free, their memory and bubble",
          "[layout][schedule]") {
    for (const int pp : {1, 2, 3, 4}) {
        for (const int m : {1, 2, 4, 8}) {
            INFO("pp=" << pp << " m=" << m);
            const double bubble = static_cast<double>(pp - 1) / (m + pp - 1);
            const Schedule g = gpipe(pp, m);
            const SimResult rg = check_schedule(g);
            REQUIRE(rg.problem == "");
            check_work_and_dependencies(g, rg);
            CHECK(rg.makespan == 2 * (m + pp - 1));
            CHECK(rg.bubble == Approx(bubble));
            CHECK(rg.peak_in_flight[0] == m);  // GPipe holds every microbatch

            const Schedule f = one_f_one_b(pp, m);
            const SimResult rf = check_schedule(f);
            REQUIRE(rf.problem == "");
            check_work_and_dependencies(f, rf);
            CHECK(rf.makespan == 2 * (m + pp - 1));
            CHECK(rf.bubble == Approx(bubble));
            for (int p = 0; p < pp; p++)
                CHECK(rf.peak_in_flight[p] == std::min(pp - p, m));  // at most pp on stage 0

            // The same with backward twice as long as forward (or with full recomputation).
            const SimOptions slow{1, 2, false};
            const SimResult r2 = check_schedule(f, slow);
            REQUIRE(r2.ok());
            check_work_and_dependencies(f, r2, slow);
            CHECK(r2.bubble == Approx(bubble));

            // Messages: one activation and one gradient per microbatch and stage boundary.
            CHECK(count_comm(f) == 4 * m * (pp - 1));
            CHECK(count_comm(g) == 4 * m * (pp - 1));
        }
    }
}

TEST_CASE("interleaved 1F1B: complete, deadlock-free, smaller bubble", "[layout][schedule]") {
    for (const int pp : {1, 2, 3, 4}) {
        for (const int m : {1, 2, 3, 4, 6, 8}) {
            if (m % pp != 0) continue;
            for (const int v : {2, 3}) {
                INFO("pp=" << pp << " m=" << m << " v=" << v);
                const Schedule s = interleaved_1f1b(pp, m, v);
                const SimResult r = check_schedule(s);
                REQUIRE(r.problem == "");
                check_work_and_dependencies(s, r);
                // Unit slots are chunk-forwards: the fill and drain cost pp-1 slots each, out of
                // v·m.
                CHECK(r.bubble == Approx(static_cast<double>(pp - 1) / (v * m + pp - 1)));
                if (pp > 1) CHECK(r.bubble < check_schedule(one_f_one_b(pp, m)).bubble);
            }
        }
    }
    CHECK_THAT(error_of([] { interleaved_1f1b(2, 3, 2); }),
               Contains("the interleaved schedule needs microbatches divisible by layout.pp") &&
                   Contains("microbatches=3, layout.pp=2"));
}

// The zero-bubble paper's claims, executed: with every F, B and W one slot (1F1B's whole
// backward two), the idle time per unit of work is (p-1)/m for 1F1B, (p-1)/(3m) for ZB-H1 and,
// for ZBV (chunks of half a stage, so 6m slots of work per rank), only the first microbatch's
// way down the V: p-1 slots, (p-1)/(6m).
TEST_CASE("zero-bubble schedules: the bubble of each at unit costs, exactly",
          "[layout][schedule]") {
    const SimOptions unit{1, 1, false, 1};  // F = B = W = 1 slot
    for (const int pp : {2, 4}) {
        for (const int m : {4, 8}) {
            INFO("pp=" << pp << " m=" << m);
            const double p1 = pp - 1;
            const Schedule f1b = one_f_one_b(pp, m), h1 = zb_h1(pp, m), v = zbv(pp, m);
            const SimResult r1 = check_schedule(f1b, unit), rh = check_schedule(h1, unit),
                            rv = check_schedule(v, unit);
            REQUIRE(r1.ok());
            REQUIRE(rh.ok());
            REQUIRE(rv.ok());
            CHECK(r1.makespan == 3 * (m + pp - 1));
            CHECK(r1.bubble_rate == Approx(p1 / m).epsilon(1e-12));
            CHECK(rh.makespan == 3 * m + pp - 1);
            CHECK(rh.bubble_rate == Approx(p1 / (3 * m)).epsilon(1e-12));
            CHECK(rv.makespan == 6 * m + pp - 1);
            CHECK(rv.bubble_rate == Approx(p1 / (6 * m)).epsilon(1e-12));
            check_work_and_dependencies(h1, rh, unit);
            check_work_and_dependencies(v, rv, unit);
            // Memory: ZB-H1 holds 1F1B's pp microbatches on rank 0 (and pp on every rank until
            // their W); ZBV at most 2·pp chunk activations (pp microbatches of half a stage).
            CHECK(rh.peak_in_flight[0] == r1.peak_in_flight[0]);
            for (int p = 0; p < pp; p++) {
                CHECK(rh.peak_in_flight[p] <= pp);
                CHECK(rv.peak_in_flight[p] <= 2 * pp);
                CHECK(r1.peak_pending_w[p] == 0);
            }
            CHECK(rh.peak_pending_w[pp - 1] == pp);  // the last rank defers the most Ws
            // The V: virtual stages 0 and 2pp-1 (the embedding and the loss) on rank 0.
            CHECK(rank_of_stage(0, pp, v.placement()) == 0);
            CHECK(rank_of_stage(2 * pp - 1, pp, v.placement()) == 0);
            CHECK(rank_of_stage(pp, pp, v.placement()) == pp - 1);
        }
    }
    // At the defaults (no weight_slots) a split schedule's W takes B's time, an unsplit backward
    // B's alone: 1F1B's text grids stay as they were.
    CHECK(check_schedule(zb_h1(2, 4)).makespan == 13);
    CHECK(check_schedule(one_f_one_b(2, 4)).makespan == 10);
    // Any pp and m: complete, dependencies kept, no deadlock with asynchronous sends.
    for (const int pp : {1, 2, 3, 5})
        for (const int m : {1, 2, 3, 7})
            for (const Schedule& s : {zb_h1(pp, m), zbv(pp, m)}) {
                INFO(schedule_name(s.kind) << " pp=" << pp << " m=" << m);
                const SimResult r = check_schedule(s, unit);
                REQUIRE(r.ok());
                check_work_and_dependencies(s, r, unit);
            }
}

TEST_CASE("zero-bubble schedules: lists, text and what check_schedule refuses",
          "[layout][schedule]") {
    CHECK(parse_schedule("zb-h1") == ScheduleKind::zb_h1);
    CHECK(parse_schedule("zbv") == ScheduleKind::zbv);
    CHECK_THAT(error_of([] { parse_schedule("zb-h2"); }),
               Catch::Contains("\"zb-h1\" or \"zbv\", got \"zb-h2\""));
    CHECK(make_schedule(ScheduleKind::zbv, 2, 4, 2).virtual_stages == 2);
    CHECK_THAT(error_of([] { make_schedule(ScheduleKind::zbv, 2, 4, 1); }),
               Catch::Contains("runs 2 model chunks per rank"));
    // ZB-H1 on two ranks: rank 1 (last) sends B0 back before any W, and closes with its W.
    CHECK(actions_text(zb_h1(2, 2)) ==
          "rank 0: F0 >A0:1 F1 >A1:1 <G0:1 B0 W0 <G1:1 B1 W1\n"
          "rank 1: <A0:0 F0 B0 >G0:0 <A1:0 F1 B1 >G1:0 W0 W1\n");
    const SimOptions unit{1, 1, false, 1};
    CHECK(to_text(zb_h1(2, 2), unit) ==
          "zb-h1, pp=2, microbatches=2: 7 slots, bubble 14.3%\n"
          "rank 0 | F0 F1 .  B0 W0 B1 W1\n"
          "rank 1 | .  F0 B0 F1 B1 W0 W1\n");
    // Whole backwards in a split schedule, B and W in 1F1B: named.
    Schedule mixed = zb_h1(2, 1);
    for (Action& a : mixed.ranks[0])
        if (a.kind == Action::backward_input) a.kind = Action::backward;
    CHECK_THAT(check_schedule(mixed).problem,
               Catch::Contains("runs B and W apart"));
    // W before its B.
    Schedule early = zb_h1(2, 1);
    auto& r1 = early.ranks[1];
    const auto w = std::find_if(r1.begin(), r1.end(),
                                [](const Action& a) { return a.kind == Action::backward_weight; });
    std::rotate(r1.begin() + 1, w, w + 1);
    CHECK_THAT(check_schedule(early).problem,
               Catch::Contains("runs before backward_input(m=0, chunk 0)"));
}

TEST_CASE("blocking sends deadlock 1F1B; asynchronous sends do not", "[layout][schedule]") {
    const SimOptions rendezvous{1, 1, true};
    const SimResult r = check_schedule(one_f_one_b(2, 2), rendezvous);
    CHECK_THAT(
        r.problem,
        Contains("deadlock: rank 0 waits in send_act(m=1, chunk 0) to rank 1; rank 1 waits in "
                 "send_grad(m=0, chunk 0) to rank 0"));
    CHECK(check_schedule(one_f_one_b(2, 2)).ok());
    // GPipe's sends all go one way per phase, so it survives blocking sends too.
    for (const int pp : {2, 3, 4}) CHECK(check_schedule(gpipe(pp, 4), rendezvous).ok());
}

TEST_CASE("check_schedule names what is wrong", "[layout][schedule]") {
    const Schedule good = one_f_one_b(2, 2);
    // rank 0: F0 >A0:1 F1 >A1:1 <G0:1 B0 <G1:1 B1
    // rank 1: <A0:0 F0 B0 >G0:0 <A1:0 F1 B1 >G1:0
    SECTION("missing work") {
        Schedule s = good;
        s.ranks[1].erase(s.ranks[1].begin() + 6);  // B1
        CHECK_THAT(check_schedule(s).problem, Contains("rank 1 never runs backward(m=1, chunk 0)"));
    }
    SECTION("duplicate work") {
        Schedule s = good;
        s.ranks[0].push_back(s.ranks[0][0]);
        CHECK_THAT(check_schedule(s).problem, Contains("rank 0 runs forward(m=0, chunk 0) twice"));
    }
    SECTION("a backward before its forward") {
        Schedule s = good;
        std::swap(s.ranks[1][1], s.ranks[1][2]);  // B0 before F0
        CHECK_THAT(check_schedule(s).problem,
                   Contains("rank 1's backward(m=0, chunk 0) runs before forward(m=0, chunk 0)"));
    }
    SECTION("a forward before its input arrived") {
        Schedule s = good;
        std::swap(s.ranks[1][0], s.ranks[1][1]);  // F0 before <A0
        CHECK_THAT(check_schedule(s).problem,
                   Contains("rank 1's forward(m=0, chunk 0) runs before its input arrived"));
    }
    SECTION("a wrong peer") {
        Schedule s = good;
        s.ranks[0][1].peer = 0;
        CHECK_THAT(check_schedule(s).problem, Contains("virtual stage 1 is on the same rank") ||
                                                  Contains("names the wrong peer"));
        Schedule t = one_f_one_b(3, 1);
        t.ranks[0][1].peer = 2;
        CHECK_THAT(check_schedule(t).problem,
                   Contains("rank 0's send_act(m=0, chunk 0) to rank 2 names the wrong peer: "
                            "virtual stage 1 is on rank 1"));
    }
    SECTION("messages received out of order") {
        Schedule s = gpipe(2, 2);
        // rank 1: <A0 F0 <A1 F1 ...: receive microbatch 1 first.
        auto& r1 = s.ranks[1];
        std::swap(r1[0], r1[2]);
        std::swap(r1[1], r1[3]);
        CHECK_THAT(check_schedule(s).problem,
                   Contains("rank 1's recv_act(m=1, chunk 0) from rank 0 would receive "
                            "send_act(m=0, chunk 0) to rank 1 instead"));
    }
    SECTION("a deadlock") {
        Schedule s = good;
        // rank 0 waits for the gradient of microbatch 0 before sending its activation.
        s.ranks[0] = {{Action::forward, 0, 0, -1},  {Action::recv_grad, 0, 0, 1},
                      {Action::send_act, 0, 0, 1},  {Action::forward, 1, 0, -1},
                      {Action::send_act, 1, 0, 1},  {Action::backward, 0, 0, -1},
                      {Action::recv_grad, 1, 0, 1}, {Action::backward, 1, 0, -1}};
        CHECK_THAT(check_schedule(s).problem,
                   Contains("deadlock: rank 0 waits in recv_grad(m=0, chunk 0) from rank 1; "
                            "rank 1 waits in recv_act(m=0, chunk 0) from rank 0"));
    }
    SECTION("a list for every rank") {
        Schedule s = good;
        s.ranks.pop_back();
        CHECK_THAT(check_schedule(s).problem, Contains("lists for 1 ranks but pp=2"));
    }
}

TEST_CASE("schedules as text", "[layout][schedule]") {
    CHECK(to_text(one_f_one_b(2, 2)) ==
          "1f1b, pp=2, microbatches=2: 6 slots, bubble 33.3%\n"
          "rank 0 | F0 F1 .  B0 .  B1\n"
          "rank 1 | .  F0 B0 F1 B1 .\n");
    CHECK(to_text(gpipe(2, 2)) ==
          "gpipe, pp=2, microbatches=2: 6 slots, bubble 33.3%\n"
          "rank 0 | F0 F1 .  .  B0 B1\n"
          "rank 1 | .  F0 F1 B0 B1 .\n");
    CHECK(to_text(interleaved_1f1b(2, 2, 2)) ==
          "interleaved, pp=2, microbatches=2, v=2: 10 slots, bubble 20.0%\n"
          "rank 0 | F0a F1a F0b F1b .   B0b .   B1b B0a B1a\n"
          "rank 1 | .   F0a F1a F0b B0b F1b B1b B0a B1a .\n");
    CHECK(actions_text(one_f_one_b(2, 2)) ==
          "rank 0: F0 >A0:1 F1 >A1:1 <G0:1 B0 <G1:1 B1\n"
          "rank 1: <A0:0 F0 B0 >G0:0 <A1:0 F1 B1 >G1:0\n");
    // A failing schedule shows the problem and the lists.
    CHECK_THAT(
        to_text(one_f_one_b(2, 2), {1, 1, true}),
        Contains("1f1b, pp=2, microbatches=2: deadlock") && Contains("rank 1: <A0:0 F0 B0 >G0:0"));
    // pp = 1: plain gradient accumulation, no messages.
    CHECK(to_text(one_f_one_b(1, 2)) ==
          "1f1b, pp=1, microbatches=2: 4 slots, bubble 0.0%\nrank 0 | F0 B0 F1 B1\n");
    CHECK(count_comm(interleaved_1f1b(1, 2, 3)) == 0);
}

TEST_CASE("message tags match across ranks and are unique in a step", "[layout][schedule]") {
    for (const Schedule& s :
         {one_f_one_b(4, 8), gpipe(3, 2), interleaved_1f1b(2, 4, 3), interleaved_1f1b(4, 4, 2)}) {
        std::multiset<std::tuple<int, int, int>> sends, recvs;  // (src, dst, tag)
        std::set<int> tags;
        for (int p = 0; p < s.pp; p++) {
            for (const Action& a : s.ranks[p]) {
                if (a.is_send()) {
                    sends.insert({p, a.peer, message_tag(s, p, a)});
                    CHECK(tags.insert(message_tag(s, p, a)).second);
                }
                if (a.is_recv()) recvs.insert({a.peer, p, message_tag(s, p, a)});
            }
        }
        CHECK(sends == recvs);
        CHECK(!sends.empty());
    }
}

TEST_CASE("make_schedule and the layout's schedule", "[layout][schedule]") {
    CHECK(make_schedule(ScheduleKind::gpipe, 2, 4).kind == ScheduleKind::gpipe);
    CHECK(make_schedule(ScheduleKind::interleaved, 2, 4, 2).virtual_stages == 2);
    CHECK_THAT(
        error_of([] { make_schedule(ScheduleKind::one_f_one_b, 2, 4, 2); }),
        Contains("layout.virtual_stages=2 does not fit layout.schedule = \"1f1b\""));
    CHECK_THAT(error_of([] { make_schedule(ScheduleKind::gpipe, 0, 4); }),
               Contains("layout.pp = 0 is out of range"));
    CHECK_THAT(error_of([] { one_f_one_b(2, 0); }), Contains("microbatches = 0 is out of range"));
    CHECK(parse_schedule("1f1b") == ScheduleKind::one_f_one_b);
    CHECK_THAT(error_of([] { parse_schedule("zb-h2"); }), Contains("layout.schedule must be"));

    Layout l = base();
    l.pp = 2;
    l.layers = 4;
    l.microbatches = 4;
    l.schedule = ScheduleKind::interleaved;
    l.virtual_stages = 2;
    const Schedule s = Mesh(l).schedule();
    CHECK(s.kind == ScheduleKind::interleaved);
    CHECK(s.microbatches == 4);
    CHECK(check_schedule(s).ok());
}

TEST_CASE("layout: tensor-parallel shares must be whole canonical blocks in bitwise mode",
          "[layout]") {
    Config c = parse_config(default_config_toml(), "test");
    c.model.hidden = 96;
    c.model.heads = 4;
    c.model.ffn = 384;
    c.layout.tp = 4;  // 24 channels per rank, blocks of 64
    c.numerics.block = 64;
    CHECK_THROWS_WITH(make_layout(c), Catch::Contains("not whole blocks of numerics.block=64"));
    c.numerics.block = 8;  // 3 blocks per rank: fine
    CHECK_NOTHROW(make_layout(c));
    c.numerics.block = 64;
    c.numerics.mode = Mode::fast;  // fast mode may cut anywhere
    CHECK_NOTHROW(make_layout(c));
}
