// Loss spikes (core/train/spikes.h): a corrupted batch is caught, attributed by replay to the data,
// rolled back and skipped, and the run then equals, bit for bit, a clean run that never drew that
// batch; a transient fault is attributed to the rank it struck; the detector is silent on a clean
// run; the evidence is the same bits under every layout; a resume keeps the skipped batches.
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/io/state.h"
#include "core/model/data.h"
#include "core/train/runner.h"
#include "core/train/spikes.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>

using namespace px;
using Catch::Matchers::Contains;

namespace {

Config base() {
    Config c = test::small_job();
    c.train.steps = 60;
    c.train.lr = 3e-3;
    c.train.warmup_steps = 5;
    c.train.threads = 1;
    c.train.eval_every = 60;
    c.train.val_batches = 4;
    c.spikes.window = 30;
    c.spikes.min_history = 20;
    c.spikes.snapshot_every = 10;
    return c;
}

Config corrupted(Config c, i64 step, const std::string& kind = "repeat") {
    c.data.corrupt_step = step;
    c.data.corrupt_kind = kind;
    return c;
}

// What rank 0's observers see: events and named values by step (the last report of a step).
struct Recorder : Observer {
    std::mutex mu;
    std::vector<std::pair<i64, std::string>> spikes;  // (step, message)
    std::map<i64, std::vector<NamedValue>> values;
    std::vector<StepMetrics> rows;
    void on_values(const RunView&, i64 step, const std::vector<NamedValue>& v) override {
        std::lock_guard<std::mutex> lock(mu);
        values[step] = v;
    }
    void on_event(const RunView&, const RunEvent& e) override {
        std::lock_guard<std::mutex> lock(mu);
        if (e.kind == EventKind::spike) spikes.emplace_back(e.step, e.message);
    }
    void on_step(const RunView&, const StepMetrics& m) override {
        std::lock_guard<std::mutex> lock(mu);
        while (!rows.empty() && rows.back().step >= m.step) rows.pop_back();
        rows.push_back(m);
    }
};

// Trains c on its layout; the final logical state, and every replica must agree.
LogicalState run(const Config& c, Recorder* rec = nullptr, std::vector<i64> skip = {},
                 std::vector<i64>* skipped = nullptr) {
    LogicalState s;
    bool agree = true;
    RunHooks h = test::inspecting([&](Job& job) {
        agree = absorb(s, job) && agree;
        if (skipped) *skipped = job.skipped_batches();
    });
    h.setup = [skip](Job& job) { job.skip_batches(skip); };
    std::vector<Observer*> obs;
    if (rec) obs.push_back(rec);
    run_layout(c, obs, h);
    CHECK(agree);
    return s;
}

double final_val(const LogicalState& s) { return s.history.back().val_loss; }

}  // namespace

TEST_CASE("robust statistics: median, MAD and the z-score", "[spikes]") {
    const RobustStats s = robust_stats({1, 2, 3, 4, 100, NAN, INFINITY});
    CHECK(s.n == 5);
    CHECK(s.median == 3.0);
    CHECK(s.mad == 1.0);  // |x - 3| = 2 1 0 1 97: median 1
    CHECK(s.z(3.0 + 1.4826 * 6) == Approx(6.0).epsilon(1e-12));
    CHECK(s.z(1.0) < 0);
    CHECK(std::isinf(s.z(NAN)));
    const RobustStats even = robust_stats({1, 2, 3, 10});
    CHECK(even.median == 2.5);
    CHECK(even.mad == 1.0);  // 1.5 0.5 0.5 7.5
    const RobustStats flat = robust_stats({2, 2, 2});
    CHECK(flat.mad == 0.0);
    CHECK(flat.z(2.0) == 0.0);
    CHECK(std::isinf(flat.z(2.5)));
}

TEST_CASE("a corrupted batch: repeated or shuffled tokens in that batch only", "[spikes]") {
    Config c = base();
    c.data.corrupt_step = 4;
    const std::unique_ptr<TokenSource> plain = [&] {
        Config p = c;
        p.data.corrupt_step = 0;
        return make_source(p);
    }();
    const i64 T = 16, n = 3;
    std::vector<int> a(static_cast<size_t>(n * (T + 1))), b(a.size());
    for (const char* kind : {"repeat", "shuffle"}) {
        c.data.corrupt_kind = kind;
        const std::unique_ptr<TokenSource> bad = make_source(c);
        for (i64 batch : {2, 3, 4}) {
            plain->sample(a.data(), T, Split::train, batch, 5, n);
            bad->sample(b.data(), T, Split::train, batch, 5, n);
            if (batch != 3) {
                CHECK(a == b);
                continue;
            }
            std::vector<int> perm(static_cast<size_t>(c.model.vocab), -1);
            for (i64 i = 0; i < n; i++)
                for (i64 j = 0; j <= T; j++) {
                    const int x = a[static_cast<size_t>(i * (T + 1) + j)];
                    const int y = b[static_cast<size_t>(i * (T + 1) + j)];
                    if (std::string(kind) == "repeat") {
                        CHECK(y == a[static_cast<size_t>(i * (T + 1))]);
                    } else {  // one symbol always maps to the same one
                        CHECK((perm[static_cast<size_t>(x)] == -1 || perm[static_cast<size_t>(x)] == y));
                        perm[static_cast<size_t>(x)] = y;
                    }
                }
            CHECK(a != b);
        }
        plain->sample(a.data(), T, Split::val, 3, 0, n);  // validation windows never change
        bad->sample(b.data(), T, Split::val, 3, 0, n);
        CHECK(a == b);
    }
}

TEST_CASE("spike keys are checked, naming the key", "[spikes]") {
    for (const char* set : {"spikes.action=undo", "spikes.window=2", "spikes.window=10",
                            "spikes.min_history=40", "spikes.min_history=3",
                            "spikes.z_threshold=-1", "spikes.clip_z=0", "spikes.snapshot_every=0",
                            "spikes.rollback_to=disk", "spikes.skip=all",
                            "data.corrupt_step=61", "data.corrupt_kind=noise"}) {
        Config c = base();
        const std::string key = std::string(set).substr(0, std::string(set).find('='));
        CHECK_THROWS_WITH(apply_override(c, set), Contains(key));
    }
    Config r = base();
    r.spikes.action = "rollback";
    r.spikes.rollback_to = "checkpoint";
    CHECK_THROWS_WITH(validate_config(r), Contains("checkpoint.dir"));
    Config both = base();
    both.layout.dp = 2;
    both.validate.replica_check_every = 5;
    both.spikes.action = "log";
    CHECK_THROWS_WITH(validate_config(both), Contains("validate.replica_check_every"));
    both.spikes.replay = false;
    CHECK_NOTHROW(validate_config(both));
}

TEST_CASE("too short a history is refused, saying why and what to set", "[spikes]") {
    Config c = base();
    CHECK_THROWS_WITH(apply_override(c, "spikes.min_history=3"),
                      Contains("spikes.min_history=3 is below 20") && Contains("at least 20"));
}

TEST_CASE("the warm-up of the default job is not flagged", "[spikes]") {
    // The embedded default's first 40 steps with a fast warm-up: judged against 3 steps of
    // history (window 10) step 19 was flagged as a gradient-norm spike (z 9.1) and skipped; with
    // the history the statistics need, no normal step is.
    Config c = parse_config(default_config_toml(), "test");
    c.model.seq_len = 32;
    c.train.steps = 40;
    c.train.lr = 3e-3;
    c.train.warmup_steps = 5;
    c.train.eval_every = 0;
    c.output.run_file = false;
    c.spikes.action = "skip";
    c.spikes.window = 20;
    Recorder rec;
    run(c, &rec);
    for (const auto& [step, msg] : rec.spikes) UNSCOPED_INFO(step << ": " << msg);
    CHECK(rec.spikes.empty());
}

TEST_CASE("a clean run raises no spike, and the guard changes no bit of it", "[spikes]") {
    Config c = base();
    const LogicalState off = run(c);
    for (const char* action : {"log", "rollback"}) {
        c.spikes.action = action;
        Recorder rec;
        const LogicalState on = run(c, &rec);
        CHECK(rec.spikes.empty());
        for (const auto& [step, msg] : rec.spikes) UNSCOPED_INFO(step << ": " << msg);
        test::check_same_bits(off, on);
        REQUIRE(rec.values.count(30) == 1);
        // embed, h.0, h.1, ln_f: grad norm, update ratio, Adam eps ratio; 2 logits; 2 z-scores
        CHECK(rec.values[30].size() == 4 * 3 + 2 + 2);
    }
}

TEST_CASE("a bad batch is caught, attributed to the data by replay, rolled back and skipped",
          "[spikes]") {
    Config c = corrupted(base(), 40);
    c.spikes.action = "rollback";
    Recorder rec;
    std::vector<i64> skipped;
    const LogicalState got = run(c, &rec, {}, &skipped);
    REQUIRE(rec.spikes.size() == 1);
    const auto& [step, msg] = rec.spikes[0];
    INFO(msg);
    CHECK(step == 40);
    // A run of one repeated token is easy to predict but pulls hard on the weights: the
    // gradient norm is what spikes.
    CHECK_THAT(msg, Contains("gradient-norm spike at step 40"));
    CHECK_THAT(msg, Contains("verdict: data"));
    CHECK_THAT(msg, Contains("batch 39 (the one step 40 drew; batches count from 0) caused it"));
    CHECK_THAT(msg, Contains("rolled back to step 30, batch 39 skipped"));
    CHECK(skipped == std::vector<i64>{39});

    // The rest of the run is a clean run that never drew batch 39, bit for bit.
    Config clean = base();
    clean.spikes.action = "off";
    const LogicalState ref = run(clean, nullptr, {39});
    test::check_same_bits(ref, got);
    // And it ends where the clean run with every batch ends, within the validation noise: the
    // gap to it is smaller than the damage the same batch does when it is only logged.
    const LogicalState all = run(clean);
    Config logged = c;
    logged.spikes.action = "log";
    Recorder rec_log;
    const LogicalState hurt = run(logged, &rec_log);
    REQUIRE(rec_log.spikes.size() == 1);
    CHECK_THAT(rec_log.spikes[0].second, Contains("verdict: data"));
    CHECK_THAT(rec_log.spikes[0].second, Contains("action: logged"));
    INFO("clean " << final_val(all) << ", rolled back " << final_val(got) << ", logged "
                  << final_val(hurt));
    CHECK(std::fabs(final_val(got) - final_val(all)) < final_val(hurt) - final_val(all));
}

TEST_CASE("the replay leaves no trace: log with and without replay give the same bits",
          "[spikes]") {
    Config c = corrupted(base(), 40, "shuffle");
    c.spikes.action = "log";
    c.spikes.z_threshold = 4.5;
    Recorder a, b;
    const LogicalState with = run(c, &a);
    c.spikes.replay = false;
    const LogicalState without = run(c, &b);
    test::check_same_bits(with, without);
    REQUIRE(a.spikes.size() == 1);
    REQUIRE(b.spikes.size() == 1);
    // Shuffled symbols keep their counts but lose their transitions: the loss itself jumps.
    CHECK_THAT(a.spikes[0].second, Contains("loss and gradient-norm spike at step 40"));
    CHECK_THAT(a.spikes[0].second, Contains("verdict: data"));
    CHECK_THAT(b.spikes[0].second, Contains("not attributed (spikes.replay is off)"));
}

TEST_CASE("skip and clip act on the spike step", "[spikes]") {
    Config c = corrupted(base(), 40);
    c.spikes.action = "skip";
    Recorder rec;
    run(c, &rec);
    REQUIRE(rec.spikes.size() == 1);
    CHECK_THAT(rec.spikes[0].second, Contains("action: its update was skipped"));
    // The skipped update leaves every weight as it was: step 40's update ratio is 0.
    for (const NamedValue& v : rec.values[40])
        if (v.name.find("update_ratio") != std::string::npos) CHECK(v.value == 0.0);

    c.spikes.action = "clip";
    Recorder clip;
    run(c, &clip);
    REQUIRE(clip.spikes.size() == 1);
    CHECK_THAT(clip.spikes[0].second, Contains("clipped to norm"));
    bool found = false;
    for (const NamedValue& v : clip.values[40])
        if (v.name == "spike.clip_norm") {
            found = true;
            CHECK(v.value > 0);
            CHECK(v.value < clip.rows[39].grad_norm);  // the spike's norm was above it
        }
    CHECK(found);
}

TEST_CASE("a transient fault is not reproducible on replay, and its rank is named", "[spikes]") {
    Config c = base();
    c.layout.dp = 2;
    c.spikes.action = "rollback";
    c.fault.kind = "flip_grad";
    c.fault.rank = 1;
    c.fault.step = 40;
    c.fault.tensor = "wte";
    c.fault.element = 0;
    c.fault.bit = 30;  // the top exponent bit: a huge gradient element on rank 1 only
    Recorder rec;
    const LogicalState got = run(c, &rec);
    REQUIRE(rec.spikes.size() == 1);
    INFO(rec.spikes[0].second);
    CHECK(rec.spikes[0].first == 40);
    CHECK_THAT(rec.spikes[0].second, Contains("not reproducible"));
    CHECK_THAT(rec.spikes[0].second, Contains("world rank 1"));
    CHECK_THAT(rec.spikes[0].second, Contains("the z-scores are world rank 1's"));
    CHECK_THAT(rec.spikes[0].second, Contains("rolled back to step 30"));
    Config clean = base();
    clean.layout.dp = 2;
    const LogicalState ref = run(clean, nullptr, {39});
    test::check_same_bits(ref, got);
}

TEST_CASE("the evidence is the same bits under every layout", "[spikes]") {
    Config c = test::with_tp_shapes(corrupted(base(), 22));
    c.train.steps = 25;
    c.train.eval_every = 0;
    c.numerics.block = 16;
    c.spikes.action = "log";
    c.spikes.replay = false;
    Recorder ref;
    run(c, &ref);
    REQUIRE(ref.spikes.size() == 1);
    for (auto [dp, tp, pp, zero] : {std::array{2, 1, 1, 0}, std::array{2, 1, 1, 3},
                                    std::array{1, 2, 1, 0}, std::array{1, 1, 2, 0},
                                    std::array{2, 2, 1, 2}}) {
        Config l = c;
        l.layout.dp = dp;
        l.layout.tp = tp;
        l.layout.pp = pp;
        l.layout.zero = zero;
        INFO("dp" << dp << " tp" << tp << " pp" << pp << " zero" << zero);
        Recorder got;
        run(l, &got);
        REQUIRE(got.values.size() == ref.values.size());
        for (const auto& [step, vals] : ref.values) {
            const std::vector<NamedValue>& g = got.values[step];
            REQUIRE(g.size() == vals.size());
            for (size_t i = 0; i < vals.size(); i++) {
                INFO("step " << step << " " << vals[i].name);
                CHECK(g[i].name == vals[i].name);
                CHECK(test::same_bits(std::vector<double>{g[i].value},
                                      std::vector<double>{vals[i].value}));
            }
        }
        REQUIRE(got.spikes.size() == 1);
        CHECK(got.spikes[0].second == ref.spikes[0].second);
    }
}

TEST_CASE("a resume after a rollback keeps the skipped batches, bit for bit", "[spikes]") {
    const std::string dir = test::temp_dir("spikes-resume");
    Config c = corrupted(base(), 40);
    c.spikes.action = "rollback";
    c.checkpoint.dir = dir;
    c.checkpoint.every = 50;
    c.checkpoint.keep = 5;
    const LogicalState whole = run(c);
    Config r = c;
    r.checkpoint.resume = (std::filesystem::path(dir) / "ckpt-00000050.h5").string();
    r.layout.dp = 2;  // and under another layout
    std::vector<i64> skipped;
    const LogicalState resumed = run(r, nullptr, {}, &skipped);
    CHECK(skipped == std::vector<i64>{39});
    test::check_same_bits(whole, resumed);
}

TEST_CASE("rollback to the last checkpoint", "[spikes]") {
    const std::string dir = test::temp_dir("spikes-ckpt");
    Config c = corrupted(base(), 40);
    c.spikes.action = "rollback";
    c.spikes.rollback_to = "checkpoint";
    c.checkpoint.dir = dir;
    c.checkpoint.every = 15;
    c.checkpoint.keep = 10;
    Recorder rec;
    const LogicalState got = run(c, &rec);
    REQUIRE(rec.spikes.size() == 1);
    CHECK_THAT(rec.spikes[0].second, Contains("verdict: data"));
    CHECK_THAT(rec.spikes[0].second, Contains("rolled back to the checkpoint of step 30"));
    Config clean = base();
    const LogicalState ref = run(clean, nullptr, {39});
    test::check_same_bits(ref, got);
}
