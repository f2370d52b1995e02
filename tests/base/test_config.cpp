// The job config: defaults, exact round trips, every kind of malformed input with its intended
// message, --set overrides, and make_numerics.
#include "core/base/config.h"

#include "core/base/error.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

using namespace px;
using Catch::Matchers::Contains;

namespace {

// The message of the ConfigError that f throws ("" and a failed check when it throws nothing or
// something else).
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

std::string parse_error(const std::string& text, const std::string& source = "examples/tiny.toml") {
    return error_of([&] { parse_config(text, source); });
}

std::string set_error(const std::string& assignment) {
    Config c;
    return error_of([&] { apply_override(c, assignment); });
}

bool same_job(const Config& a, const Config& b) {
    return a.model == b.model && a.layout == b.layout && a.train == b.train && a.data == b.data &&
           a.numerics == b.numerics && a.output == b.output && a.checkpoint == b.checkpoint;
}

}  // namespace

TEST_CASE("defaults: an empty file, the embedded default job and missing sections", "[config]") {
    const Config def;
    const Config empty = parse_config("", "empty.toml");
    CHECK(same_job(empty, def));
    CHECK(empty.source_name == "empty.toml");

    const Config embedded = parse_config(default_config_toml(), "<default>");
    CHECK(same_job(embedded, def));
    CHECK(embedded == def);  // source_name "<default>" too

    // Only the keys given change.
    const Config some = parse_config("[model]\nvocab = 50\n\n[train]\nlr = 1e-3\n", "some.toml");
    CHECK(some.model.vocab == 50);
    CHECK(some.train.lr == 1e-3);
    Config want = def;
    want.model.vocab = 50;
    want.train.lr = 1e-3;
    CHECK(same_job(some, want));

    // Dotted keys and inline tables are the same TOML.
    const Config dotted = parse_config("model.vocab = 50\ntrain = { lr = 1e-3 }\n", "dotted.toml");
    CHECK(same_job(dotted, want));

    // Floats accept integers.
    CHECK(parse_config("[train]\nlr = 1\nmin_lr = 0\n", "x").train.lr == 1.0);

    // The default layout is one device.
    CHECK(def.layout.dp * def.layout.pp * def.layout.tp == 1);
    CHECK(def.layout.zero == 0);
    CHECK(def.layout.microbatches == 0);  // train.microbatches
    CHECK(def.layout.schedule == "1f1b");
    CHECK(def.layout.virtual_stages == 1);
    CHECK(def.layout.recompute == "none");
    CHECK(def.layout.comm == "auto");
    CHECK(def.layout.timeout_s == 60.0);
}

TEST_CASE("a job's config: the default job or a file, then the overrides together", "[config]") {
    const Config def = job_config("");
    CHECK(def.source_name == "<embedded default>");
    CHECK(same_job(def, parse_config(default_config_toml(), "x")));

    const Config tiny = job_config("examples/tiny.toml", {"model.heads=3", "model.hidden=96"});
    Config want = load_config("examples/tiny.toml");
    want.model.heads = 3;
    want.model.hidden = 96;
    CHECK(tiny == want);  // heads before hidden: validated after both, as apply_overrides does
    CHECK(tiny.source_name == "examples/tiny.toml");

    CHECK_THROWS_WITH(job_config("", {"train.lr=-1"}), Catch::Contains("--set train.lr=-1"));
    CHECK_THROWS_WITH(job_config("no/such.toml"), Catch::Contains("no/such.toml"));
}

TEST_CASE("the embedded default job documents every key with a comment line", "[config]") {
    const std::string text = default_config_toml();
    std::istringstream in(text);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    const auto keys = config_keys();
    CHECK(keys.size() == 120);  // 109 and the llama block's 11 (model.arch .. model.qk_norm)
    for (const auto& k : keys) {
        const std::string name = k.substr(k.find('.') + 1);
        std::string section = "[";  // built by appending: "[" + std::string&& trips GCC 12's -Wrestrict
        section.append(k, 0, k.find('.')).append("]");
        INFO(k);
        bool found = false;
        std::string current;
        for (std::size_t i = 0; i < lines.size(); i++) {
            if (!lines[i].empty() && lines[i][0] == '[') current = lines[i];
            if (current == section && lines[i].rfind(name + " = ", 0) == 0) {
                found = true;
                REQUIRE(i > 0);
                CHECK(lines[i - 1].rfind("# ", 0) == 0);
                CHECK(lines[i - 1].size() > 6);
            }
        }
        CHECK(found);
    }
}

TEST_CASE("config -> TOML -> config is exact", "[config]") {
    SECTION("defaults") {
        const Config def;
        CHECK(same_job(parse_config(config_to_toml(def), "rt"), def));
    }
    SECTION("random values, awkward strings and doubles") {
        std::mt19937_64 rng(11);
        std::uniform_real_distribution<double> unit(0.0, 1.0);
        const std::vector<std::string> strings = {
            "", "plain", "with \"quotes\"", "back\\slash", "tab\tnewline\ncr\r", "bell\x07 del\x7f",
            "unicode: caf\xc3\xa9 \xe2\x88\x91", "'single'", "# not a comment", "trailing space ",
        };
        for (int trial = 0; trial < 200; trial++) {
            Config c;
            c.model.vocab = 2 + static_cast<i64>(rng() % 50000);
            c.model.heads = 1 + static_cast<i64>(rng() % 16);
            c.model.hidden = c.model.heads * (1 + static_cast<i64>(rng() % 128));
            c.model.layers = 1 + static_cast<i64>(rng() % 48);
            c.model.seq_len = 1 + static_cast<i64>(rng() % 4096);
            c.model.ffn = 1 + static_cast<i64>(rng() % 10000);
            c.model.init_std = unit(rng) * 0.1 + 1e-9;
            c.model.init_from = strings[rng() % strings.size()];
            c.layout.dp = 1 + static_cast<int>(rng() % 64);
            c.layout.pp = 1 + static_cast<int>(rng() % 16);
            c.layout.tp = 1 + static_cast<int>(rng() % 8);
            c.layout.zero = static_cast<int>(rng() % 4);
            c.layout.microbatches = static_cast<int>(rng() % 33);
            c.layout.schedule = std::vector<std::string>{"gpipe", "1f1b", "interleaved"}[rng() % 3];
            c.layout.virtual_stages = c.layout.schedule == "interleaved" ? 2 + static_cast<int>(rng() % 4) : 1;
            c.layout.recompute = rng() % 2 ? "none" : "full";
            c.layout.timeout_s = unit(rng) * 600 + 1e-3;
            c.train.steps = 1 + static_cast<i64>(rng() % 1000000);
            c.train.microbatches = 1 + static_cast<i64>(rng() % 8);
            c.train.batch_size = c.train.microbatches * (1 + static_cast<i64>(rng() % 64));
            c.train.lr = std::ldexp(unit(rng) + 1e-3, -static_cast<int>(rng() % 30));
            c.train.min_lr = c.train.lr * unit(rng);
            c.train.warmup_steps = static_cast<i64>(rng() % 1000);
            c.train.weight_decay = unit(rng);
            c.train.beta1 = unit(rng) * 0.999;
            c.train.beta2 = unit(rng) * 0.999;
            c.train.eps = std::ldexp(1.0 + unit(rng), -static_cast<int>(rng() % 60));
            c.train.grad_clip = unit(rng) * 10;
            c.train.seed = rng() >> 1;  // < 2^63
            c.train.eval_every = static_cast<i64>(rng() % 1000);
            c.train.val_batches = 1 + static_cast<i64>(rng() % 100);
            c.train.threads = static_cast<i64>(rng() % 64);
            c.data.source = trial % 2 ? "markov" : "bin";
            c.data.markov_order = 1;
            c.data.markov_alpha = unit(rng) + 1e-6;
            c.data.markov_seed = rng() >> 1;
            c.data.train_path = trial % 2 ? strings[rng() % strings.size()] : "data/train.bin";
            c.data.val_path = strings[rng() % strings.size()];
            c.numerics.mode = trial % 3 ? Mode::bitwise : Mode::fast;
            c.layout.comm = c.numerics.mode == Mode::fast ? std::vector<std::string>{"auto", "canonical", "ring"}[rng() % 3]
                                                          : std::vector<std::string>{"auto", "canonical"}[rng() % 2];
            c.numerics.block = 1 + static_cast<int>(rng() % 1024);
            c.numerics.isa = std::vector<std::string>{"auto", "avx512", "avx2", "scalar"}[rng() % 4];
            c.output.dir = strings[rng() % strings.size()];
            c.output.run_file = rng() % 2;
            c.output.export_llmc = strings[rng() % strings.size()];
            c.output.progress = rng() % 2;
            c.checkpoint.dir = trial % 3 ? strings[rng() % strings.size()] : "runs/x/checkpoints";
            c.checkpoint.every = c.checkpoint.dir.empty() ? 0 : static_cast<i64>(rng() % 1000);
            c.checkpoint.keep = 1 + static_cast<i64>(rng() % 10);
            c.checkpoint.resume = c.checkpoint.dir.empty() ? strings[rng() % strings.size()]
                                  : rng() % 2 ? "auto" : strings[rng() % strings.size()];
            if (c.checkpoint.dir.empty() && c.checkpoint.resume == "auto") c.checkpoint.resume = "";
            c.fault.kind = std::vector<std::string>{"", "kill", "stall", "flip_grad", "flip_weight"}[rng() % 5];
            c.fault.rank = static_cast<int>(rng() % static_cast<unsigned>(c.layout.dp * c.layout.pp * c.layout.tp));
            c.fault.step = 1 + static_cast<i64>(rng() % static_cast<std::uint64_t>(c.train.steps));
            c.fault.tensor = strings[rng() % strings.size()];
            c.fault.element = static_cast<i64>(rng() % 100000);
            c.fault.bit = static_cast<int>(rng() % 32);
            c.fault.stall_s = unit(rng) * 100;
            c.fault.persistent = rng() % 2;
            c.validate.replica_check_every = c.layout.dp >= 2 && c.layout.zero <= 2 ? static_cast<i64>(rng() % 50) : 0;
            REQUIRE_NOTHROW(validate_config(c));
            const std::string text = config_to_toml(c);
            INFO(text);
            const Config back = parse_config(text, "rt");
            REQUIRE(same_job(back, c));
            CHECK(config_to_toml(back) == text);
        }
    }
    SECTION("extreme doubles") {
        for (const double x : {0.1, 1.0 / 3, 1e-300, std::numeric_limits<double>::denorm_min(),
                               std::numeric_limits<double>::min(), 123456789.125, 0.30000000000000004}) {
            Config c;
            c.train.lr = 1e300;
            c.train.min_lr = x;
            c.model.init_std = x;
            c.data.markov_alpha = x;
            INFO(x);
            const Config back = parse_config(config_to_toml(c), "rt");
            CHECK(back.train.min_lr == x);
            CHECK(back.model.init_std == x);
            CHECK(back.train.lr == 1e300);
        }
    }
    SECTION("a seed that TOML cannot hold is an error naming the key") {
        Config c;
        c.train.seed = ~0ull;
        CHECK_THAT(error_of([&] { config_to_toml(c); }), Contains("train.seed"));
        CHECK_THAT(error_of([&] { validate_config(c); }), Contains("train.seed"));
    }
}

TEST_CASE("unknown keys and sections name the key and suggest the nearest", "[config]") {
    CHECK_THAT(parse_error("[model]\nhiden = 64\n"),
               Contains("examples/tiny.toml: unknown key 'model.hiden' (did you mean 'model.hidden'?)") &&
                   Contains("line 2"));
    CHECK_THAT(parse_error("[train]\nlearning_rat = 1\n"), Contains("unknown key 'train.learning_rat'"));
    CHECK_THAT(parse_error("[train]\nvocab = 10\n"), Contains("unknown key 'train.vocab' (did you mean 'model.vocab'?)"));
    // No near key: the section's keys are listed instead.
    CHECK_THAT(parse_error("[numerics]\nzzzzzzzz = 1\n"), Contains("unknown key 'numerics.zzzzzzzz'") &&
                                                              Contains("mode, block, isa"));
    CHECK_THAT(parse_error("[trian]\nlr = 1\n"), Contains("examples/tiny.toml: unknown section [trian] (did you mean [train]?)"));
    CHECK_THAT(parse_error("[layot]\ntp = 2\n"), Contains("unknown section [layot] (did you mean [layout]?)"));
    CHECK_THAT(parse_error("[parallel]\ntp = 2\n"), Contains("unknown section [parallel]") && Contains("model, layout, train, data"));
    CHECK_THAT(parse_error("[layout]\ntp_size = 2\n"), Contains("unknown key 'layout.tp_size'"));
    CHECK_THAT(parse_error("[train]\ntp = 2\n"), Contains("unknown key 'train.tp' (did you mean 'layout.tp'?)"));
    CHECK_THAT(parse_error("vocab = 3\n"), Contains("unknown key 'vocab' at the top level") && Contains("'model.vocab'"));
    CHECK_THAT(parse_error("[model.sub]\nx = 1\n"), Contains("unknown key 'model.sub'"));
    CHECK_THAT(parse_error("model = 3\n"), Contains("model must be a table"));
    // Several problems: the first in file order is reported, with a count of the rest.
    CHECK_THAT(parse_error("[train]\nzeta = 1\nalpha = 2\n"), Contains("'train.zeta'") && Contains("1 more problem"));
}

TEST_CASE("wrong types name the key, the expected type and what was given", "[config]") {
    CHECK_THAT(parse_error("[model]\nlayers = \"two\"\n"),
               Contains("examples/tiny.toml: model.layers must be an integer, got string \"two\""));
    CHECK_THAT(parse_error("[model]\nlayers = 2.0\n"), Contains("model.layers must be an integer, got float 2.0"));
    CHECK_THAT(parse_error("[train]\nlr = \"fast\"\n"), Contains("train.lr must be a number, got string \"fast\""));
    CHECK_THAT(parse_error("[train]\nlr = true\n"), Contains("train.lr must be a number, got boolean true"));
    CHECK_THAT(parse_error("[data]\nsource = 3\n"), Contains("data.source must be a string, got integer 3"));
    CHECK_THAT(parse_error("[output]\nprogress = \"yes\"\n"), Contains("output.progress must be true or false"));
    CHECK_THAT(parse_error("[output]\nprogress = 1\n"), Contains("output.progress must be true or false, got integer 1"));
    CHECK_THAT(parse_error("[model]\nvocab = [1, 2]\n"), Contains("model.vocab must be an integer, got an array"));
    CHECK_THAT(parse_error("[model]\nvocab = 1979-05-27\n"), Contains("model.vocab must be an integer, got a date"));
    CHECK_THAT(parse_error("[numerics]\nmode = \"fastest\"\n"), Contains("numerics.mode must be \"bitwise\" or \"fast\", got \"fastest\""));
    CHECK_THAT(parse_error("[numerics]\nmode = 1\n"), Contains("numerics.mode must be a string"));
    CHECK_THAT(parse_error("[numerics]\nblock = 99999999999\n"), Contains("numerics.block = 99999999999 is out of range"));
    CHECK_THAT(parse_error("[train]\nseed = -1\n"), Contains("train.seed = -1 is out of range: must be >= 0"));
    CHECK_THAT(parse_error("[layout]\ntp = 2.0\n"), Contains("layout.tp must be an integer, got float 2.0"));
    CHECK_THAT(parse_error("[layout]\ndp = 4294967296\n"), Contains("layout.dp = 4294967296 is out of range: must fit in 32 bits"));
    CHECK_THAT(parse_error("[layout]\nschedule = 1\n"), Contains("layout.schedule must be a string, got integer 1"));
    CHECK_THAT(parse_error("[layout]\ntimeout_s = \"1m\"\n"), Contains("layout.timeout_s must be a number"));
}

TEST_CASE("values out of range name the key, the value and the rule", "[config]") {
    struct Case {
        const char* toml;
        const char* message;
    };
    const Case cases[] = {
        {"[model]\nvocab = 1", "model.vocab = 1 is out of range: must be >= 2"},
        {"[model]\nseq_len = 0", "model.seq_len = 0 is out of range: must be >= 1"},
        {"[model]\nlayers = 0", "model.layers = 0 is out of range: must be >= 1"},
        {"[model]\nheads = 0", "model.heads = 0 is out of range: must be >= 1"},
        {"[model]\nhidden = -64", "model.hidden = -64 is out of range: must be >= 1"},
        {"[model]\nffn = 0", "model.ffn = 0 is out of range: must be >= 1"},
        {"[model]\ninit_std = 0", "model.init_std = 0 is out of range: must be > 0"},
        {"[model]\ninit_std = nan", "model.init_std = nan is not a finite number"},
        {"[layout]\ndp = 0", "layout.dp = 0 is out of range: must be >= 1"},
        {"[layout]\npp = -1", "layout.pp = -1 is out of range: must be >= 1"},
        {"[layout]\ntp = 0", "layout.tp = 0 is out of range: must be >= 1"},
        {"[layout]\nzero = 4", "layout.zero = 4 is out of range: must be in 0..3"},
        {"[layout]\nzero = -1", "layout.zero = -1 is out of range: must be in 0..3"},
        {"[layout]\nmicrobatches = -1", "layout.microbatches = -1 is out of range: must be >= 0"},
        {"[layout]\nschedule = \"zb\"",
         "layout.schedule must be \"gpipe\", \"1f1b\", \"interleaved\", \"zb-h1\" or \"zbv\", got \"zb\""},
        {"[layout]\nvirtual_stages = 0", "layout.virtual_stages = 0 is out of range: must be >= 1"},
        {"[layout]\nrecompute = \"selective\"",
         "layout.recompute must be \"none\" or \"full\", got \"selective\""},
        {"[layout]\ncomm = \"tree\"",
         "layout.comm must be \"auto\", \"canonical\" or \"ring\", got \"tree\""},
        {"[layout]\ntimeout_s = 0", "layout.timeout_s = 0 is out of range: must be > 0"},
        {"[layout]\ntimeout_s = inf", "layout.timeout_s = inf is not a finite number"},
        {"[train]\nsteps = 0", "train.steps = 0 is out of range: must be >= 1"},
        {"[train]\nbatch_size = 0", "train.batch_size = 0 is out of range: must be >= 1"},
        {"[train]\nmicrobatches = 0", "train.microbatches = 0 is out of range: must be >= 1"},
        {"[train]\nlr = -1", "examples/tiny.toml: train.lr = -1 is out of range: must be > 0"},
        {"[train]\nlr = inf", "train.lr = inf is not a finite number"},
        {"[train]\nmin_lr = -0.5", "train.min_lr = -0.5 is out of range: must be >= 0"},
        {"[train]\nwarmup_steps = -1", "train.warmup_steps = -1 is out of range: must be >= 0"},
        {"[train]\nweight_decay = -0.1", "train.weight_decay = -0.1 is out of range: must be >= 0"},
        {"[train]\nbeta1 = 1", "train.beta1 = 1 is out of range: must be in [0, 1)"},
        {"[train]\nbeta2 = -0.1", "train.beta2 = -0.1 is out of range: must be in [0, 1)"},
        {"[train]\neps = 0", "train.eps = 0 is out of range: must be > 0"},
        {"[train]\ngrad_clip = -1", "train.grad_clip = -1 is out of range: must be >= 0"},
        {"[train]\neval_every = -1", "train.eval_every = -1 is out of range: must be >= 0"},
        {"[train]\nval_batches = 0", "train.val_batches = 0 is out of range: must be >= 1"},
        {"[train]\nthreads = -2", "train.threads = -2 is out of range: must be >= 0"},
        {"[train]\nthreads = 100000", "train.threads = 100000 is out of range: must be <= 1024"},
        {"[train]\nmax_memory_gib = -1", "train.max_memory_gib = -1 is out of range: must be >= 0"},
        {"[train]\nmax_memory_gib = nan", "train.max_memory_gib = nan is not a finite number"},
        {"[train]\nsteps = 4294967297",
         "train.steps = 4294967297 is out of range: must be <= 4294967296"},
        {"[train]\nbatch_size = 9223372036854775807",
         "train.batch_size = 9223372036854775807 is out of range"},
        {"[train]\nval_batches = 4294967297", "train.val_batches = 4294967297 is out of range"},
        {"[model]\nseq_len = 9223372036854775000",
         "model.seq_len = 9223372036854775000 is out of range: must be <= 4294967294"},
        {"[model]\nvocab = 2147483649",
         "model.vocab = 2147483649 is out of range: must be <= 2147483648"},
        {"[model]\nlayers = 2000000000",
         "model.layers = 2000000000 is out of range: must be <= 178956970"},
        {"[data]\nsource = \"files\"",
         "data.source must be \"markov\", \"mixture\", \"copy\" or \"bin\", got \"files\""},
        {"[data]\nmarkov_order = 0", "data.markov_order = 0 is out of range: must be >= 1"},
        {"[data]\nmarkov_alpha = 0", "data.markov_alpha = 0 is out of range: must be > 0"},
        {"[data]\nmarkov_seed = -3", "data.markov_seed = -3 is out of range: must be >= 0"},
        {"[numerics]\nblock = 0", "numerics.block = 0 is out of range: must be >= 1"},
        {"[numerics]\nisa = \"sse2\"",
         "numerics.isa must be \"auto\", \"avx512\", \"avx2\" or \"scalar\", got \"sse2\""},
        {"[checkpoint]\nevery = -1", "checkpoint.every = -1 is out of range: must be >= 0"},
        {"[checkpoint]\nkeep = 0", "checkpoint.keep = 0 is out of range: must be >= 1"},
        {"[checkpoint]\ndir = 3", "checkpoint.dir must be a string, got integer 3"},
    };
    for (const auto& c : cases) {
        INFO(c.toml);
        CHECK_THAT(parse_error(c.toml), Contains(c.message) && Contains("(line 2)"));
    }
    // Edges that are allowed.
    CHECK_NOTHROW(parse_config("[train]\nbeta1 = 0\nmin_lr = 0\nwarmup_steps = 0\neval_every = 0\ngrad_clip = 0\n"
                               "threads = 0\nweight_decay = 0\n[model]\nvocab = 2\n",
                               "edges"));
}

TEST_CASE("sizes whose products no machine holds are refused naming the keys", "[config]") {
    // Each in range alone; their product is 2^50 elements or more, which no size computed from
    // them could survive (it would overflow 64 bits further on).
    CHECK_THAT(parse_error("[train]\nbatch_size = 4294967296\n[model]\nseq_len = 4294967294\n"),
               Contains("train.batch_size=4294967296 x model.seq_len=4294967294") &&
                   Contains("more than 2^50"));
    CHECK_THAT(parse_error("[model]\nlayers = 100000000\nhidden = 100000000\nheads = 1\n"),
               Contains("model.layers=100000000 x model.hidden=100000000") && Contains("parameters"));
    CHECK_THAT(parse_error("[model]\nvocab = 2147483648\nhidden = 1048576\nheads = 1\n"),
               Contains("model.vocab=2147483648 x model.hidden=1048576") &&
                   Contains("lower model.vocab"));
    CHECK_THAT(parse_error("[model]\nseq_len = 100000000\n"), Contains("attention scores"));
    CHECK_THAT(parse_error("[layout]\ndp = 65536\ntp = 65536\n"),
               Contains("layout.dp=65536 x layout.pp=1 x layout.cp=1 x layout.tp=65536 ranks is more "
                        "than 2^31 - 1"));
    // A --set that makes the product too big is the one blamed.
    Config c;
    CHECK_THAT(error_of([&] { apply_override(c, "model.seq_len=4294967294"); }),
               Contains("--set model.seq_len=4294967294:") && Contains("model.seq_len"));
    // Large but possible: a GPT-2 XL shape.
    CHECK_NOTHROW(parse_config("[model]\nvocab = 50257\nseq_len = 1024\nlayers = 48\nheads = 25\n"
                               "hidden = 1600\nffn = 6400\n",
                               "ok"));
}

TEST_CASE("constraints across keys are sentences naming both keys", "[config]") {
    CHECK_THAT(parse_error("[model]\nheads = 3\n"), Contains("examples/tiny.toml: model.heads=3 does not divide model.hidden=64"));
    CHECK_NOTHROW(parse_config("[model]\nheads = 3\nhidden = 96\n", "ok"));
    CHECK_THAT(parse_error("[train]\nbatch_size = 8\nmicrobatches = 3\n"),
               Contains("train.microbatches=3 does not divide train.batch_size=8"));
    CHECK_THAT(parse_error("[train]\nlr = 1e-3\nmin_lr = 1e-2\n"), Contains("train.min_lr=0.01 is larger than train.lr=0.001"));
    CHECK_NOTHROW(parse_config("[train]\nlr = 1e-3\nmin_lr = 1e-3\n", "ok"));
    CHECK_THAT(parse_error("[data]\nsource = \"bin\"\n"), Contains("data.source = \"bin\" needs data.train_path"));
    CHECK_THAT(parse_error("[checkpoint]\nresume = \"auto\"\n"),
               Contains("checkpoint.resume = \"auto\" needs checkpoint.dir") && Contains("(line 2)"));
    CHECK_THAT(parse_error("[checkpoint]\nevery = 100\n"), Contains("checkpoint.every=100 needs checkpoint.dir"));
    CHECK_NOTHROW(parse_config("[checkpoint]\ndir = \"ck\"\nevery = 100\nkeep = 1\nresume = \"auto\"\n", "ok"));
    CHECK_NOTHROW(parse_config("[checkpoint]\nresume = \"runs/a/ckpt-00000100.h5\"\n", "ok"));
    CHECK_NOTHROW(parse_config("[data]\nsource = \"bin\"\ntrain_path = \"t.bin\"\n", "ok"));
    // vocab^order <= 2^22: 2^22 itself is fine, one more state is not.
    CHECK_NOTHROW(parse_config("[model]\nvocab = 2048\n[data]\nmarkov_order = 2\n", "ok"));  // 2^22
    CHECK_THAT(parse_error("[model]\nvocab = 2049\n[data]\nmarkov_order = 2\n"),
               Contains("data.markov_order=2 with 2049 symbols") && Contains("2^22"));
    // A chain over fewer symbols than the vocabulary lifts the limit, but may not exceed it.
    CHECK_NOTHROW(parse_config("[model]\nvocab = 50257\n[data]\nmarkov_vocab = 256\n", "ok"));
    CHECK_THAT(parse_error("[model]\nvocab = 32\n[data]\nmarkov_vocab = 33\n"),
               Contains("data.markov_vocab=33 exceeds model.vocab=32"));
    // A mixture's chains each need 2 symbols of their own; the error names both keys.
    CHECK_NOTHROW(parse_config(
        "[model]\nvocab = 32\n[data]\nsource = \"mixture\"\nmixture_chains = 16\n", "ok"));
    CHECK_THAT(
        parse_error("[model]\nvocab = 32\n[data]\nsource = \"mixture\"\nmixture_chains = 17\n"),
        Contains("data.mixture_chains=17 with 32 symbols") && Contains("model.vocab") &&
            Contains("at most 16 chains"));
    CHECK_THAT(parse_error("[data]\nsource = \"mixture\"\nmixture_chains = 1\n"),
               Contains("data.mixture_chains"));
    CHECK_NOTHROW(parse_config(
        "[model]\nseq_len = 32\n[data]\nsource = \"copy\"\ncopy_distance = 33\n", "ok"));
    CHECK_THAT(parse_error("[model]\nvocab = 32\n[data]\nsource = \"copy\"\nmarkov_vocab = 33\n"),
               Contains("data.markov_vocab=33") && Contains("model.vocab=32"));
    CHECK_THAT(parse_error("[model]\nvocab = 50000\n[data]\nmarkov_order = 1000000\n"), Contains("data.markov_order=1000000"));
    // One symbol has one state at any order: refused at once (counting V^k never grows; a fuzz
    // case with markov_order = 2^62 and markov_vocab = 1 used to loop for ever).
    CHECK_THAT(parse_error("[data]\nmarkov_vocab = 1\nmarkov_order = 4611686018427387904\n"),
               Contains("data.markov_vocab=1") && Contains("at least 2 symbols"));
    CHECK_THAT(parse_error("[model]\nvocab = 1\n[data]\nmarkov_order = 4611686018427387904\n"),
               Contains("vocab"));
    // Layout keys among themselves; rules that involve the model or the batch belong to px::Layout.
    CHECK_THAT(parse_error("[layout]\nvirtual_stages = 2\n"),
               Contains("layout.virtual_stages=2 needs layout.schedule = \"interleaved\", got \"1f1b\"") && Contains("(line 2)"));
    CHECK_THAT(parse_error("[layout]\nschedule = \"interleaved\"\n"),
               Contains("layout.schedule = \"interleaved\" needs layout.virtual_stages >= 2, got 1"));
    CHECK_NOTHROW(parse_config("[layout]\npp = 2\nschedule = \"interleaved\"\nvirtual_stages = 2\n", "ok"));
    CHECK_THAT(parse_error("[layout]\ncomm = \"ring\"\n"),
               Contains("layout.comm = \"ring\" breaks numerics.mode = \"bitwise\""));
    CHECK_NOTHROW(parse_config("[layout]\ncomm = \"ring\"\n[numerics]\nmode = \"fast\"\n", "ok"));
    CHECK_NOTHROW(parse_config("[layout]\ncomm = \"canonical\"\n[numerics]\nmode = \"fast\"\n", "ok"));
    CHECK_NOTHROW(parse_config("[layout]\ntp = 3\n", "ok"));  // tp vs heads: checked by px::Layout
    // The Markov limit does not apply to token files.
    CHECK_NOTHROW(parse_config("[model]\nvocab = 50257\n[data]\nsource = \"bin\"\ntrain_path = \"t.bin\"\nmarkov_order = 3\n", "ok"));
}

TEST_CASE("TOML syntax errors give line and column", "[config]") {
    CHECK_THAT(parse_error("[model]\nvocab = 32\nlayers = = 2\n"),
               Contains("examples/tiny.toml: TOML syntax error at line 3, column"));
    CHECK_THAT(parse_error("[model\n"), Contains("TOML syntax error at line 1"));
    CHECK_THAT(parse_error("[model]\nvocab = 1\nvocab = 2\n"), Contains("TOML syntax error at line 3"));
    CHECK_THAT(parse_error("[train]\nlr = 3e\n"), Contains("TOML syntax error at line 2"));
}

TEST_CASE("load_config reads a file and names it in errors", "[config]") {
    const auto dir = std::filesystem::temp_directory_path() / ("px_test_config_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string good = (dir / "good.toml").string();
    const std::string bad = (dir / "bad.toml").string();
    std::ofstream(good) << "[model]\nlayers = 3\n";
    std::ofstream(bad) << "[model]\nlayers = 0\n";
    const Config c = load_config(good);
    CHECK(c.model.layers == 3);
    CHECK(c.source_name == good);
    CHECK_THAT(error_of([&] { load_config(bad); }), Contains(bad + ": model.layers = 0 is out of range"));
    const std::string missing = (dir / "missing.toml").string();
    CHECK_THAT(error_of([&] { load_config(missing); }), Contains("cannot read config file '" + missing + "'"));
    CHECK_THAT(error_of([&] { load_config(dir.string()); }), Contains("cannot read config file") && Contains("directory"));
    std::filesystem::remove_all(dir);
}

TEST_CASE("--set overrides", "[config]") {
    SECTION("valid values of every type") {
        Config c;
        apply_override(c, "train.lr=1e-3");
        CHECK(c.train.lr == 1e-3);
        apply_override(c, "model.layers=4");
        CHECK(c.model.layers == 4);
        apply_override(c, " train.min_lr = 0 ");  // whitespace around key and value
        CHECK(c.train.min_lr == 0.0);
        apply_override(c, "output.progress=false");
        CHECK_FALSE(c.output.progress);
        apply_override(c, "numerics.mode=fast");
        CHECK(c.numerics.mode == Mode::fast);
        apply_override(c, "numerics.mode=\"bitwise\"");
        CHECK(c.numerics.mode == Mode::bitwise);
        apply_override(c, "train.seed=42");
        CHECK(c.train.seed == 42u);
        apply_override(c, "model.init_from=\"gpt2 124M.bin\"");
        CHECK(c.model.init_from == "gpt2 124M.bin");
        apply_override(c, "output.export_llmc=");
        CHECK(c.output.export_llmc.empty());
        apply_overrides(c, {"layout.dp=2", "layout.tp=2", "layout.pp=2", "layout.zero=3", "layout.microbatches=4",
                            "layout.schedule=gpipe", "layout.recompute=full", "layout.timeout_s=5"});
        CHECK(c.layout.dp == 2);
        CHECK(c.layout.tp == 2);
        CHECK(c.layout.pp == 2);
        CHECK(c.layout.zero == 3);
        CHECK(c.layout.microbatches == 4);
        CHECK(c.layout.schedule == "gpipe");
        CHECK(c.layout.recompute == "full");
        CHECK(c.layout.timeout_s == 5.0);
        apply_overrides(c, {"layout.schedule=interleaved", "layout.virtual_stages=2", "layout.comm=canonical"});
        CHECK(c.layout.schedule == "interleaved");
        CHECK(c.layout.virtual_stages == 2);
        CHECK(c.layout.comm == "canonical");
        const Config back = parse_config(config_to_toml(c), "rt");
        CHECK(back.layout == c.layout);
    }
    SECTION("values that are not TOML are strings") {
        Config c;
        apply_overrides(c, {"data.source=bin", "data.train_path=data/tiny_train.bin"});
        CHECK(c.data.source == "bin");
        CHECK(c.data.train_path == "data/tiny_train.bin");
        apply_override(c, "output.dir=runs/x y");
        CHECK(c.output.dir == "runs/x y");
        apply_override(c, "output.dir=2024");  // a string key takes the text even when it reads as TOML
        CHECK(c.output.dir == "2024");
        apply_override(c, "numerics.isa=scalar");
        CHECK(c.numerics.isa == "scalar");
        apply_override(c, "output.dir=a = b");  // '=' in the value
        CHECK(c.output.dir == "a = b");
    }
    SECTION("invalid keys") {
        CHECK_THAT(set_error("train.lerning_rate=3"), Contains("--set train.lerning_rate=3: unknown key 'train.lerning_rate'"));
        CHECK_THAT(set_error("model.hiden=3"), Contains("--set model.hiden=3: unknown key 'model.hiden' (did you mean 'model.hidden'?)"));
        CHECK_THAT(set_error("trian.lr=3"), Contains("--set trian.lr=3: unknown section [trian] (did you mean [train]?)"));
        CHECK_THAT(set_error("lr=3"), Contains("--set lr=3") && Contains("'train.lr'"));
        CHECK_THAT(set_error("train.lr"), Contains("--set train.lr: expected section.key=value"));
    }
    SECTION("invalid values, and the config is left as it was") {
        Config c;
        const Config before = c;
        CHECK_THAT(error_of([&] { apply_override(c, "model.layers=two"); }),
                   Contains("--set model.layers=two: model.layers must be an integer, got string \"two\""));
        CHECK_THAT(error_of([&] { apply_override(c, "train.lr=-1"); }),
                   Contains("--set train.lr=-1: train.lr = -1 is out of range: must be > 0"));
        CHECK_THAT(error_of([&] { apply_override(c, "model.heads=3"); }),
                   Contains("--set model.heads=3: model.heads=3 does not divide model.hidden=64"));
        CHECK_THAT(error_of([&] { apply_override(c, "data.source=bin"); }),
                   Contains("--set data.source=bin: data.source = \"bin\" needs data.train_path"));
        CHECK_THAT(error_of([&] { apply_override(c, "output.progress=yes"); }),
                   Contains("output.progress must be true or false, got string \"yes\""));
        CHECK_THAT(error_of([&] { apply_override(c, "model.vocab=[1,2]"); }), Contains("model.vocab must be an integer, got an array"));
        CHECK_THAT(error_of([&] { apply_override(c, "model.vocab=3\nmodel.layers=1"); }), Contains("model.vocab must be an integer"));
        CHECK_THAT(error_of([&] { apply_override(c, "layout.zero=5"); }),
                   Contains("--set layout.zero=5: layout.zero = 5 is out of range: must be in 0..3"));
        CHECK_THAT(error_of([&] { apply_override(c, "layout.schedule=interleaved"); }),
                   Contains("--set layout.schedule=interleaved: layout.schedule = \"interleaved\" needs layout.virtual_stages >= 2"));
        CHECK_THAT(error_of([&] { apply_override(c, "layout.comm=ring"); }),
                   Contains("--set layout.comm=ring: layout.comm = \"ring\" breaks numerics.mode = \"bitwise\""));
        CHECK(c == before);
    }
    SECTION("several --set are validated together, in either order") {
        Config a, b;
        apply_overrides(a, {"model.heads=3", "model.hidden=96"});
        apply_overrides(b, {"model.hidden=96", "model.heads=3"});
        CHECK(a.model.heads == 3);
        CHECK(a.model.hidden == 96);
        CHECK(a == b);
        // The message blames the --set that touched a key of the failing constraint.
        Config c;
        CHECK_THAT(error_of([&] { apply_overrides(c, {"train.lr=1e-3", "model.heads=5"}); }),
                   Contains("--set model.heads=5: model.heads=5 does not divide model.hidden=64"));
        // The last --set of a key wins.
        apply_overrides(c, {"model.layers=5", "model.layers=6"});
        CHECK(c.model.layers == 6);
    }
}

TEST_CASE("validate_config checks a Config built in code", "[config]") {
    Config c;
    c.source_name = "python";
    CHECK_NOTHROW(validate_config(c));
    c.model.heads = 5;
    CHECK_THAT(error_of([&] { validate_config(c); }), Contains("python: model.heads=5 does not divide model.hidden=64"));
}

TEST_CASE("make_numerics resolves the ISA", "[config]") {
    NumericsConfig nc;
    nc.mode = Mode::fast;
    nc.block = 32;
    const Numerics n = make_numerics(nc);
    CHECK(n.mode == Mode::fast);
    CHECK(n.block == 32);
    CHECK(n.isa == detect_isa());

    nc.isa = "scalar";
    CHECK(make_numerics(nc).isa == Isa::scalar);
    nc.isa = "sse";
    CHECK_THAT(error_of([&] { make_numerics(nc); }), Contains("numerics.isa"));
    // Every ISA up to the detected one can be forced; anything above it is an error naming the key.
    for (const Isa i : {Isa::scalar, Isa::avx2, Isa::avx512}) {
        nc.isa = isa_name(i);
        if (static_cast<int>(i) <= static_cast<int>(detect_isa())) {
            CHECK(make_numerics(nc).isa == i);
        } else {
            CHECK_THAT(error_of([&] { make_numerics(nc); }), Contains("numerics.isa") && Contains("not supported by this CPU"));
        }
    }
}

TEST_CASE("precision: activations fp32, bf16 or fp16, and the loss-scale keys, named when wrong", "[config]") {
    CHECK(Config{}.precision.activations == "fp32");
    CHECK(parse_config("[precision]\nactivations = \"fp32\"\n", "ok").precision.activations == "fp32");
    CHECK(activation_dtype(PrecisionConfig{}) == DType::f32);
    CHECK(parse_config("[precision]\nactivations = \"bf16\"\n", "ok").precision.activations == "bf16");
    CHECK(parse_config("[precision]\nactivations = \"fp16\"\n", "ok").precision.activations == "fp16");
    CHECK_THAT(parse_error("[precision]\nactivations = \"int8\"\n"),
               Contains("precision.activations must be \"fp32\", \"bf16\" or \"fp16\", got \"int8\""));
    Config c;
    CHECK_THROWS_WITH(apply_override(c, "precision.activations=fp12"), Contains("precision.activations"));
    CHECK(c.precision.activations == "fp32");
    apply_override(c, "precision.activations=fp16");
    CHECK(activation_dtype(c.precision) == DType::f16);
    PrecisionConfig p;
    p.activations = "bf16";
    CHECK(activation_dtype(p) == DType::bf16);
    p.activations = "e4m3";
    CHECK_THROWS_AS(activation_dtype(p), ConfigError);

    // The loss scaler's keys: defaults, and each range named with its key.
    const PrecisionConfig d;
    CHECK(d.loss_scale_init == 65536.0);
    CHECK(d.loss_scale_growth_interval == 2000);
    CHECK(d.loss_scale_growth_factor == 2.0);
    CHECK(d.loss_scale_backoff_factor == 0.5);
    const Config set = parse_config("[precision]\nactivations = \"fp16\"\nloss_scale_init = 1024\n"
                                    "loss_scale_growth_interval = 3\nloss_scale_growth_factor = 4.0\n"
                                    "loss_scale_backoff_factor = 0.25\n", "ok");
    CHECK(set.precision.loss_scale_init == 1024.0);
    CHECK(set.precision.loss_scale_growth_interval == 3);
    CHECK(set.precision.loss_scale_growth_factor == 4.0);
    CHECK(set.precision.loss_scale_backoff_factor == 0.25);
    CHECK(parse_config(config_to_toml(set), "again") == [&] { Config x = set; x.source_name = "again"; return x; }());
    CHECK_THAT(parse_error("[precision]\nloss_scale_init = 0\n"),
               Contains("precision.loss_scale_init = 0 is out of range: must be > 0"));
    CHECK_THAT(parse_error("[precision]\nloss_scale_init = 1e39\n"),
               Contains("precision.loss_scale_init = 1e+39 is out of range"));
    CHECK_THAT(parse_error("[precision]\nloss_scale_init = 1e-40\n"),
               Contains("precision.loss_scale_init = 1e-40 is out of range"));
    CHECK_THAT(parse_error("[precision]\nloss_scale_growth_interval = 0\n"),
               Contains("precision.loss_scale_growth_interval = 0 is out of range: must be >= 1"));
    CHECK_THAT(parse_error("[precision]\nloss_scale_growth_factor = 1.0\n"),
               Contains("precision.loss_scale_growth_factor = 1 is out of range: must be > 1"));
    CHECK_THAT(parse_error("[precision]\nloss_scale_backoff_factor = 1.0\n"),
               Contains("precision.loss_scale_backoff_factor = 1 is out of range: must be in (0, 1)"));
    CHECK_THAT(parse_error("[precision]\nloss_scale_backoff_factor = \"half\"\n"),
               Contains("precision.loss_scale_backoff_factor must be a number"));
}

TEST_CASE("precision: the fp8 keys, their defaults and their errors", "[config]") {
    const PrecisionConfig d;
    CHECK(d.fp8 == "off");
    CHECK(d.fp8_amax_history_len == 1024);
    CHECK(d.fp8_amax_compute_algo == "max");
    CHECK(d.fp8_margin == 0);
    CHECK(d.fp8_keep_ends_bf16);
    const Config c = parse_config("[precision]\nactivations = \"bf16\"\nfp8 = \"delayed\"\n"
                                  "fp8_amax_history_len = 16\nfp8_amax_compute_algo = \"most_recent\"\n"
                                  "fp8_margin = 2\nfp8_keep_ends_bf16 = false\n", "ok");
    CHECK(c.precision.fp8 == "delayed");
    CHECK(c.precision.fp8_amax_history_len == 16);
    CHECK(c.precision.fp8_amax_compute_algo == "most_recent");
    CHECK(c.precision.fp8_margin == 2);
    CHECK_FALSE(c.precision.fp8_keep_ends_bf16);
    CHECK_THAT(parse_error("[precision]\nactivations = \"bf16\"\nfp8 = \"e4m3\"\n"),
               Contains("precision.fp8 must be \"off\", \"delayed\" or \"block\", got \"e4m3\""));
    CHECK(parse_config("[precision]\nactivations = \"bf16\"\nfp8 = \"block\"\nfp8_block_size = 16\n", "ok")
              .precision.fp8_block_size == 16);
    CHECK(PrecisionConfig{}.fp8_block_size == 128);
    CHECK_THAT(parse_error("[precision]\nfp8_block_size = 0\n"),
               Contains("precision.fp8_block_size = 0 is out of range: must be >= 1"));
    CHECK_THAT(parse_error("[precision]\nfp8 = \"delayed\"\n"),
               Contains("precision.fp8 = \"delayed\" needs precision.activations = \"bf16\""));
    CHECK_THAT(parse_error("[precision]\nfp8_amax_history_len = 0\n"),
               Contains("precision.fp8_amax_history_len = 0 is out of range: must be >= 1"));
    CHECK_THAT(parse_error("[precision]\nfp8_amax_compute_algo = \"mean\"\n"),
               Contains("precision.fp8_amax_compute_algo must be \"max\" or \"most_recent\", got \"mean\""));
    CHECK_THAT(parse_error("[precision]\nfp8_margin = -1\n"),
               Contains("precision.fp8_margin = -1 is out of range: must be >= 0"));
    CHECK_THAT(parse_error("[precision]\nfp8_margin = 200\n"),
               Contains("precision.fp8_margin = 200 is out of range: must be <= 126"));
    CHECK_THAT(parse_error("[precision]\nfp8_keep_ends_bf16 = 1\n"),
               Contains("precision.fp8_keep_ends_bf16 must be true or false"));
}

TEST_CASE("precision: fp8_layers and fp8_lm_head choose the fp8 matmuls; bad specs name the key", "[config]") {
    PrecisionConfig p;
    CHECK(p.fp8_layers.empty());
    CHECK_FALSE(p.fp8_lm_head);
    // The default: every block but the first and the last (as fp8_keep_ends_bf16 always did).
    CHECK(fp8_block_mask(p, 4) == std::vector<bool>{false, true, true, false});
    p.fp8_keep_ends_bf16 = false;
    CHECK(fp8_block_mask(p, 4) == std::vector<bool>{true, true, true, true});
    p.fp8_keep_ends_bf16 = true;
    p.fp8_layers = "all";
    CHECK(fp8_block_mask(p, 3) == std::vector<bool>{true, true, true});
    p.fp8_layers = "none";
    CHECK(fp8_block_mask(p, 3) == std::vector<bool>{false, false, false});
    p.fp8_layers = " 0, 2-3 ,5";
    CHECK(fp8_block_mask(p, 6) == std::vector<bool>{true, false, true, true, false, true});
    p.fp8_layers = "1-1";
    CHECK(fp8_block_mask(p, 2) == std::vector<bool>{false, true});

    const Config c = parse_config("[model]\nlayers = 4\n[precision]\nactivations = \"bf16\"\n"
                                  "fp8 = \"delayed\"\nfp8_layers = \"0,3\"\nfp8_lm_head = true\n",
                                  "ok");
    CHECK(c.precision.fp8_layers == "0,3");
    CHECK(c.precision.fp8_lm_head);
    CHECK(parse_config(config_to_toml(c), "ok") == c);
    CHECK_THAT(parse_error("[model]\nlayers = 4\n[precision]\nfp8_layers = \"1-x\"\n"),
               Contains("precision.fp8_layers = \"1-x\": \"x\" is not a block index") &&
                   Contains("model.layers = 4"));
    CHECK_THAT(parse_error("[model]\nlayers = 4\n[precision]\nfp8_layers = \"2,4\"\n"),
               Contains("precision.fp8_layers = \"2,4\": block 4 is beyond the last block, 3"));
    CHECK_THAT(parse_error("[model]\nlayers = 4\n[precision]\nfp8_layers = \"3-1\"\n"),
               Contains("precision.fp8_layers = \"3-1\": the range \"3-1\" runs backwards"));
    CHECK_THAT(parse_error("[model]\nlayers = 4\n[precision]\nfp8_layers = \"1,,2\"\n"),
               Contains("precision.fp8_layers = \"1,,2\": an empty item between commas"));
    CHECK_THAT(parse_error("[model]\nlayers = 4\n[precision]\nfp8_layers = \"-1\"\n"),
               Contains("precision.fp8_layers = \"-1\": \"-1\" is not a block index"));
    CHECK_THAT(parse_error("[precision]\nfp8_layers = \"all\"\nfp8_keep_ends_bf16 = false\n"),
               Contains("precision.fp8_keep_ends_bf16 = false and precision.fp8_layers = \"all\" "
                        "both choose the fp8 blocks"));
    CHECK_THAT(parse_error("[precision]\nfp8_lm_head = \"yes\"\n"),
               Contains("precision.fp8_lm_head must be true or false"));
    // A --set that breaks the spec against model.layers is refused by name.
    Config s = parse_config("[model]\nlayers = 4\n", "ok");
    CHECK_THAT(error_of([&] { apply_override(s, "precision.fp8_layers=0-9"); }),
               Contains("--set precision.fp8_layers=0-9: precision.fp8_layers = \"0-9\": block 9 "
                        "is beyond the last block, 3"));
}
