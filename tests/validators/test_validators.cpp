// The gradient, determinism and resume validators (validators/gradcheck.h, determinism.h): they
// pass on correct code, and they fail, naming what is wrong, on deliberately wrong inputs.
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/io/state.h"
#include "tests/support/test_util.h"
#include "validators/determinism.h"
#include "validators/validate.h"
#include "validators/gradcheck.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

using namespace px;
using namespace px::gradcheck;

namespace {

Numerics bitwise() {
    Numerics nx;
    nx.isa = detect_isa();
    return nx;
}

// The test_model fixture's model: 2 layers, C = 16, 2 heads, F = 24, V = 11, T = 9.
ModelConfig tiny_model() {
    ModelConfig mc;
    mc.vocab = 11;
    mc.seq_len = 9;
    mc.layers = 2;
    mc.heads = 2;
    mc.hidden = 16;
    mc.ffn = 24;
    return mc;
}

// A job of a few steps whose tp2 shards are whole blocks (hidden 32, ffn 80: blocks of 8).
Config tiny_job() {
    Config c = test::small_job();
    c.train.steps = 4;
    c.train.threads = 1;
    c.numerics.block = 8;
    return c;
}

bool contains(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("gradcheck passes on every op, in both numerics modes", "[validators]") {
    for (Mode mode : {Mode::bitwise, Mode::fast}) {
        Numerics nx = bitwise();
        nx.mode = mode;
        for (const std::string& name : op_names()) {
            const auto rows = gradcheck_op(name, nx);
            REQUIRE(!rows.empty());
            for (const GradcheckRow& r : rows) {
                INFO(mode_name(mode) << ": " << r.text());
                CHECK(r.pass());
                CHECK(r.checked == r.size);  // small shapes: every element
                CHECK(r.op == name);
            }
        }
    }
}

TEST_CASE("gradcheck passes on a tiny model and names every parameter tensor", "[validators]") {
    const auto rows = gradcheck_model(tiny_model(), bitwise());
    REQUIRE(rows.size() == 1 + 2 + 2 * 12 + 2);  // loss, wte, wpe, 12 per layer, ln_f
    CHECK(rows[0].tensor == "loss");
    CHECK(rows[1].tensor == "wte");
    CHECK(rows.back().tensor == "ln_f.bias");
    for (const GradcheckRow& r : rows) {
        INFO(r.text());
        CHECK(r.pass());
        CHECK(r.checked >= 1);
    }
    GradcheckReport report;
    report.rows = rows;
    CHECK(report.pass());
    CHECK(contains(report.to_json(), "\"tensor\": \"h.1.mlp.c_proj.weight\""));
}

TEST_CASE("gradcheck fails a backward that is off by 1e-3 on one element, naming it",
          "[validators]") {
    OpProblem p = find_op("layernorm").make(find_op("layernorm").small);
    // A test-local wrong backward: the kernels' dweight with its largest element scaled.
    i64 wrong = -1;
    const auto right = p.run;
    p.run = [right, &wrong](const Numerics& nx) {
        Named out = right(nx);
        for (auto& [name, v] : out)
            if (name == "dweight") {
                wrong = 0;
                for (size_t i = 1; i < v.size(); i++)
                    if (std::fabs(v[i]) > std::fabs(v[wrong])) wrong = i64(i);
                v[wrong] *= 1.0f + 1e-3f;
            }
        return out;
    };
    const auto rows = check_problem(p, make_numerics_for(p, Mode::bitwise, detect_isa()));
    REQUIRE(wrong >= 0);
    bool seen = false;
    for (const GradcheckRow& r : rows) {
        INFO(r.text());
        if (r.tensor == "dweight") {
            seen = true;
            CHECK_FALSE(r.pass());
            CHECK(r.failing == 1);
            CHECK(r.worst == wrong);
            CHECK(r.ratio > 1);
            const std::string t = r.text();
            CHECK(contains(t, "layernorm dweight"));
            std::string at = "[";
            at += std::to_string(wrong);
            at += "]";
            CHECK(contains(t, at));
            CHECK(contains(t, "FAIL"));
        } else {
            CHECK(r.pass());
        }
    }
    CHECK(seen);
    GradcheckReport report;
    report.rows = rows;
    CHECK_FALSE(report.pass());
    CHECK(contains(report.table(), "1 of 3 checks FAIL"));
}

TEST_CASE("gradcheck: an unknown op is refused, naming the known ones", "[validators]") {
    try {
        find_op("softmax");
        FAIL("no error");
    } catch (const ConfigError& e) {
        const std::string m = e.what();
        CHECK(contains(m, "softmax"));
        for (const std::string& n : op_names()) CHECK(contains(m, n));
    }
}

TEST_CASE("gradcheck: a large model is scaled down, and says so", "[validators]") {
    ModelConfig big;
    big.layers = 12;
    big.hidden = 768;
    big.heads = 12;
    big.ffn = 3072;
    big.vocab = 50257;
    big.seq_len = 1024;
    std::string note;
    const ModelConfig s = scaled_model(big, &note);
    CHECK(s.layers == 2);
    CHECK(s.hidden == 32);
    CHECK(s.hidden % s.heads == 0);
    CHECK(s.vocab == 64);
    CHECK(contains(note, "layers 12 -> 2"));
    CHECK(scaled_model(tiny_model(), &note) == tiny_model());
    CHECK(note.empty());
}

TEST_CASE("determinism: a dp2 job run twice ends in the same bits", "[validators]") {
    Config c = tiny_job();
    c.layout.dp = 2;
    const StateCheck r = check_determinism(c);
    INFO(r.text());
    CHECK(r.equal());
    CHECK(r.differing().empty());
    CHECK(r.comparisons.size() == 3 * 28 + 2);  // weights, m, v per tensor; loss; grad norm
}

TEST_CASE("resume: single device -> dp2·tp2 continues bit for bit", "[validators]") {
    const Config c = tiny_job();
    Config to = c;
    to = with_layout(to, parse_layout("dp2xtp2"));
    CHECK(to.layout.dp == 2);
    CHECK(to.layout.tp == 2);
    const std::string dir = test::temp_dir("validators_resume");
    const StateCheck r = check_resume(c, 2, to, dir);
    INFO(r.text());
    CHECK(r.equal());
    CHECK(!std::filesystem::exists(dir));  // the scratch folder is removed
}

TEST_CASE("resume: a resumed run with another learning rate is reported as differing",
          "[validators]") {
    const Config c = tiny_job();
    Config to = c;
    to.train.lr = c.train.lr * 0.5;
    const StateCheck r = check_resume(c, 2, to);
    INFO(r.text());
    CHECK_FALSE(r.equal());
    const auto diff = r.differing();
    REQUIRE(!diff.empty());
    bool weights = false;
    for (const Comparison* d : diff) weights = weights || d->name == "params/wte";
    CHECK(weights);
    CHECK(contains(r.text(), "DIFFER"));
    CHECK(contains(r.text(), "params/wte"));
}

TEST_CASE(
    "resume: a checkpoint step outside 1 .. steps-1, another step count and bad layout "
    "specs are refused",
    "[validators]") {
    const Config c = tiny_job();
    CHECK_THROWS_AS(check_resume(c, 4), ConfigError);
    CHECK_THROWS_AS(check_resume(c, -1), ConfigError);
    CHECK_THROWS_AS(check_resume(c, 0), ConfigError);  // a checkpoint before any step
    Config longer = c;
    longer.train.steps = 6;
    CHECK_THROWS_AS(check_resume(c, 2, longer), ConfigError);
    Config to = c;
    CHECK_THROWS_AS(parse_layout("dp2xq3"), ConfigError);
    CHECK_THROWS_AS(parse_layout("dp"), ConfigError);
    CHECK_THROWS_AS(parse_layout(""), ConfigError);
    CHECK_THROWS_AS(with_layout(to, parse_layout("dp3")), ConfigError);  // 3 does not divide the batch
    to = with_layout(to, parse_layout("pp2xdp2xz1"));
    CHECK(to.layout.pp == 2);
    CHECK(to.layout.dp == 2);
    CHECK(to.layout.tp == 1);
    CHECK(to.layout.zero == 1);
}

TEST_CASE("validate's layouts: z0 turns ZeRO off whatever the config says", "[validators]") {
    const LayoutSpec z0 = parse_layout("dp2xz0");
    CHECK(z0.dp == 2);
    CHECK(z0.zero == 0);
    Config c = test::small_job();
    c.layout.zero = 2;
    c.train.steps = 2;
    const ValidationReport rep = validate_layouts(c, {z0, parse_layout("dp2")}, 2);
    REQUIRE(rep.layouts.size() == 2);
    CHECK(rep.layouts[0].verdict == "match");
    CHECK(rep.layouts[1].verdict == "match");
    CHECK_THROWS_WITH(parse_layout("dp0"), Catch::Contains("\"dp0\" must be at least 1"));
    CHECK_THROWS_WITH(parse_layout("tp0"), Catch::Contains("\"tp0\" must be at least 1"));
}
