// Mutation tests: the harness proven on known bugs (tests/support/mutations.h). Each test plants one
// deliberate bug in the layout's ranks (decorators around its groups, layers and hooks), runs parallax validate's harness (validate_layouts) on a
// layout, and checks that it names exactly the step, the op, the rank and, where there is one,
// the element the bug acts on, and (for a multi-axis layout) the parallelism.
#include "core/parallel/mesh.h"
#include "tests/support/test_util.h"
#include "tests/support/mutations.h"
#include "validators/validate.h"

#include <cstring>

using namespace px;
using namespace px::test;

namespace {

// Shapes whose tp shares are whole blocks (tests/support/test_util.h): C = 64, F = 128.
Config mutation_job() {
    Config c = with_tp_shapes(small_job());
    c.train.batch_size = 8;
    c.train.steps = 4;
    return c;
}

LayoutResult validate_one(const Config& c, const std::string& layout, const mutation::Mutation& m) {
    const ValidationReport rep =
        validate_layouts(c, {parse_layout(layout)}, c.train.steps, nullptr, mutation::plant(m));
    REQUIRE(rep.layouts.size() == 1);
    const LayoutResult r = rep.layouts[0];
    INFO(rep.table());
    CHECK(r.verdict == "diverged");
    CHECK(r.first_op_note == "");
    return r;
}

// The world rank at mesh coordinates `at` of `layout` run on c.
int rank_at(const Config& c, const std::string& layout, Coord at) {
    return Mesh(make_layout(with_layout(c, parse_layout(layout)))).rank_of(at);
}

std::uint32_t bits_of(float x) {
    std::uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return b;
}

}  // namespace

TEST_CASE("Unmutated, the harness finds nothing", "[mutations]") {
    const Config c = mutation_job();
    const ValidationReport rep =
        validate_layouts(c, parse_layouts("dp4,dp2xmb2,dp2xtp2"), c.train.steps);
    for (const LayoutResult& r : rep.layouts) CHECK(r.verdict == "match");
}

TEST_CASE("Two partials swapped in one all-reduce: named at that reduction, on every rank",
          "[mutations]") {
    mutation::Mutation m;
    m.kind = mutation::Kind::swap_partials;
    m.step = 2;
    m.rank = 1;
    m.other = 2;
    m.tensor = "h.0.mlp.c_fc.weight";
    const LayoutResult r = validate_one(mutation_job(), "dp4", m);
    CHECK(r.first_step == 2);
    // Every microbatch gradient agrees (the inputs of the reduction); its output, the reduced
    // gradient of that tensor, differs, and every rank holds the same wrong sum.
    CHECK(r.first_op.name == "2/grad/0/param/mlp.c_fc.weight");
    CHECK(r.first_op_ranks == std::vector<int>{0, 1, 2, 3});
    CHECK(r.first_op.first_index.size() == 2);
    CHECK(bits_of(r.first_op.first_reference) != bits_of(r.first_op.first_candidate));
}

TEST_CASE("The lowest bit of one rank's gradient flipped: named with rank, microbatch, element",
          "[mutations]") {
    mutation::Mutation m;
    m.kind = mutation::Kind::flip_grad;
    m.step = 3;
    m.rank = 1;
    m.microbatch = 1;
    m.tensor = "h.1.attn.c_proj.weight";
    m.element = 6;
    // A flip that the sums after it round away leaves every bit of the run unchanged, and no
    // harness can see it: of elements 0..12 of this tensor, the reductions (this rank's two
    // microbatches, then the two ranks) keep the flip of 1, 4, 6 and 11. Element 6's survives
    // into the reduced gradient, which validate compares after every step.
    const LayoutResult r = validate_one(mutation_job(), "dp2xmb2", m);
    CHECK(r.first_step == 3);
    CHECK(r.differing.front().name == "grad/1/param/attn.c_proj.weight");
    CHECK(r.first_op.name == "3/mgrad/1/param/attn.c_proj.weight");
    CHECK(r.first_op_ranks == std::vector<int>{1});
    // Rank 1's local microbatch 1 is the step's microbatch 3 (batch rows 6..8); element 6 of
    // the (64, 64) tensor is [0, 6]; the two values differ in the lowest bit only.
    CHECK(r.first_op.first_index == std::vector<i64>{3, 0, 6});
    CHECK((bits_of(r.first_op.first_reference) ^ bits_of(r.first_op.first_candidate)) == 1u);
}

TEST_CASE("A flipped bit in one rank's expert gradient (MoE) is named with rank, microbatch, element",
          "[mutations]") {
    Config c = mutation_job();
    c.model.moe_experts = 4;
    c.model.moe_top_k = 2;
    c.model.moe_ffn = 64;
    c.model.moe_capacity_factor = 1.0;
    mutation::Mutation m;
    m.kind = mutation::Kind::flip_grad;
    m.step = 3;
    m.rank = 1;
    m.microbatch = 1;
    m.tensor = "h.1.moe.experts.c_fc.weight";  // (E·moe_ffn, C) = (256, 64): expert 0's row 0
    m.element = 6;
    const LayoutResult r = validate_one(c, "dp2xmb2", m);
    CHECK(r.first_step == 3);
    CHECK(r.differing.front().name == "grad/1/param/moe.experts.c_fc.weight");
    CHECK(r.first_op.name == "3/mgrad/1/param/moe.experts.c_fc.weight");
    CHECK(r.first_op_ranks == std::vector<int>{1});
    CHECK(r.first_op.first_index == std::vector<i64>{3, 0, 6});
    CHECK((bits_of(r.first_op.first_reference) ^ bits_of(r.first_op.first_candidate)) == 1u);
}

TEST_CASE("A flipped bit in a replica whose tokens are not one tree node is named as well",
          "[mutations]") {
    // dp3 over 12 token blocks: replica 1 owns [4,8), not a node of the tree; its microbatch 0,
    // blocks [4,6), is two nodes ([4,5) and [5,6)), each with its own gradient buffer. The flip
    // strikes the first (the hooks and the "mgrad" probe see a microbatch's first node), and the
    // reference cut into six microbatches computes the same node for its microbatch 2.
    Config c = mutation_job();
    c.train.batch_size = 6;
    mutation::Mutation m;
    m.kind = mutation::Kind::flip_grad;
    m.step = 2;
    m.rank = 1;
    m.microbatch = 0;
    m.tensor = "h.1.attn.c_proj.weight";
    // Of elements 0..39 only element 13's flip survives the sums after it (the rest round away).
    m.element = 13;
    const LayoutResult r = validate_one(c, "dp3xmb2", m);
    CHECK(r.first_step == 2);
    CHECK(r.first_op.name == "2/mgrad/1/param/attn.c_proj.weight");
    CHECK(r.first_op_ranks == std::vector<int>{1});
    CHECK(r.first_op.first_index == std::vector<i64>{2, 0, 13});
    CHECK((bits_of(r.first_op.first_reference) ^ bits_of(r.first_op.first_candidate)) == 1u);
}

TEST_CASE("A dropped microbatch: named with its rank and its place in the batch", "[mutations]") {
    mutation::Mutation m;
    m.kind = mutation::Kind::drop_microbatch;
    m.step = 2;
    m.rank = 0;
    m.microbatch = 1;
    // Where replica 0's microbatch 1 sits in the step's batch (4 microbatches of 2 sequences):
    // rows 2..4 with plain accumulation; under ZeRO-2 microbatch k of replica r is piece r of
    // batch range k, rows 4..6.
    struct Case {
        const char* layout;
        i64 node;
    };
    for (const Case k : {Case{"dp2xmb2", 1}, Case{"dp2xz2xmb2", 2}, Case{"dp2xpp2xmb2", 1}}) {
        DYNAMIC_SECTION(k.layout) {
            const LayoutResult r = validate_one(mutation_job(), k.layout, m);
            CHECK(r.first_step == 2);
            // Forward and backward ran; the microbatch's gradient never joined: its first
            // parameter (wte) is zero where the reference's is not.
            CHECK(r.first_op.name == "2/mgrad/-/param/wte");
            CHECK(r.first_op_ranks == std::vector<int>{0});
            REQUIRE(r.first_op.first_index.size() == 3);
            CHECK(r.first_op.first_index[0] == k.node);
            CHECK(r.first_op.first_candidate == 0.0f);
            CHECK(r.first_op.first_reference != 0.0f);
        }
    }
}

TEST_CASE(
    "A wrong tp shard offset in one layer: named at that layer's op, on that tp rank, and "
    "the parallelism is tp",
    "[mutations]") {
    const Config c = mutation_job();
    mutation::Mutation m;
    m.kind = mutation::Kind::tp_offset;
    m.step = 3;
    m.rank = 1;
    m.layer = 1;
    const LayoutResult r = validate_one(c, "dp2xtp2", m);
    CHECK(r.first_step == 3);
    // ln_2's output (the op's input) agrees; mlp.fc's output differs in tp rank 1's columns,
    // in both dp replicas.
    CHECK(r.first_op.name == "3/fwd/1/mlp.fc/out");
    CHECK(r.first_op_ranks == std::vector<int>{rank_at(c, "dp2xtp2", Coord{0, 0, 1}),
                                               rank_at(c, "dp2xtp2", Coord{0, 1, 1})});
    REQUIRE(r.first_op.first_index.size() == 3);
    CHECK(r.first_op.first_index[2] >= c.model.ffn / 2);
    // Split into its single-axis parts: tp2 alone diverges at the same step, dp2 matches.
    REQUIRE(r.axes.size() == 2);
    CHECK(r.axes[0].layout == "dp2");
    CHECK(r.axes[0].verdict == "match");
    CHECK(r.axes[1].layout == "tp2");
    CHECK(r.axes[1].verdict == "diverged");
    CHECK(r.axes[1].first_step == 3);
    // As the reports show it.
    ValidationReport rep;
    rep.layouts = {r};
    CHECK_THAT(rep.table(), Catch::Contains("first op: 3/fwd/1/mlp.fc/out on ranks ") &&
                                Catch::Contains("; parallelism: tp2 (dp2 match)"));
    CHECK_THAT(rep.to_markdown(), Catch::Contains("- alone, dp2: match\n") &&
                                      Catch::Contains("- alone, tp2: diverged from step 3\n"));
    CHECK_THAT(rep.to_json(), Catch::Contains(R"("axes": [)") &&
                                  Catch::Contains(R"("layout": "tp2",)") &&
                                  Catch::Contains(R"("first_op_where": "pp0 dp0 tp1")"));
}

TEST_CASE("single_axis_parts: each parallelism alone, with its own options", "[mutations]") {
    auto names = [](const std::string& l) {
        std::vector<std::string> n;
        for (const LayoutSpec& p : single_axis_parts(parse_layout(l))) n.push_back(p.name);
        return n;
    };
    CHECK(names("dp2xtp2xpp2") == std::vector<std::string>{"dp2", "tp2", "pp2"});
    CHECK(names("dp4xz3xtp2xsp") == std::vector<std::string>{"dp4xz3", "tp2xsp"});
    CHECK(names("dp2xmb2xpp2") == std::vector<std::string>{"dp2xmb2", "pp2xmb2"});
    CHECK(names("dp2").empty());
    CHECK(names("tp2xsp").empty());
}

TEST_CASE("In a pipeline, one rank's flipped gradient bit is named on the stage that holds it",
          "[mutations]") {
    const Config c = mutation_job();
    mutation::Mutation m;
    m.kind = mutation::Kind::flip_grad;
    m.step = 2;
    m.rank = 1;  // dp rank: replica 1
    m.microbatch = 1;
    m.tensor = "h.1.mlp.c_fc.weight";  // layer 1: the second stage
    m.element = 9;
    // As above, most lowest-bit flips are rounded away by the sums after them: of elements 0..24
    // the flips of 0..8, 12, 13, 20 and 23 leave no trace; element 9's survives.
    const LayoutResult r = validate_one(c, "dp2xpp2xmb2", m);
    CHECK(r.first_step == 2);
    CHECK(r.first_op.name == "2/mgrad/1/param/mlp.c_fc.weight");
    CHECK(r.first_op_ranks == std::vector<int>{rank_at(c, "dp2xpp2xmb2", Coord{1, 1, 0})});
    CHECK(r.first_op_where == "pp1 dp1 tp0");
    // Replica 1's microbatch 1 is the step's microbatch 3; element 9 is [0, 9].
    CHECK(r.first_op.first_index == std::vector<i64>{3, 0, 9});
    CHECK((bits_of(r.first_op.first_reference) ^ bits_of(r.first_op.first_candidate)) == 1u);
}
