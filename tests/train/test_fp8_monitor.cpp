// The FP8 drift monitor (core/train/fp8_monitor.h): its statistics of a known tensor against a
// plainly written computation (counts exactly, MSE and SQNR against fp64); its rows identical on
// every layout, bit for bit; a run with it on ends in the bits of the run with it off; its rows
// and alerts reach the run file's /fp8 and /events and the job view; and its alerts fire on a
// provoked drift (an amax history of one step and a learning-rate jump) and stay silent on the
// same run without the jump.
#include "core/base/config.h"
#include "core/base/dtype.h"
#include "core/base/error.h"
#include "core/base/rng.h"
#include "core/io/runfile.h"
#include "core/io/state.h"
#include "core/model/fp8.h"
#include "core/model/optimizer.h"
#include "core/train/job.h"
#include "core/train/job_view.h"
#include "core/train/run_file_observer.h"
#include "core/train/runner.h"
#include "tests/support/test_util.h"
#include "core/train/fp8_monitor.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

using namespace px;
using Catch::Matchers::Contains;

namespace {

// fp8 delayed over bf16 activations on shapes whose tp shares are whole tiles of 16: 3 blocks,
// every block's linears and the LM head in fp8, a short history.
Config monitor_job() {
    Config c = test::with_tp_shapes(test::small_job());
    c.model.layers = 3;
    c.train.steps = 4;
    c.precision.activations = "bf16";
    c.precision.fp8 = "delayed";
    c.precision.fp8_layers = "all";
    c.precision.fp8_lm_head = true;
    c.precision.fp8_amax_history_len = 4;
    c.precision.fp8_block_size = 16;
    c.fp8_monitor.every = 2;
    c.fp8_monitor.compare = "current,block";
    return c;
}

// What a job's observers receive (world rank 0's).
struct Collect : Observer {
    std::vector<Fp8Stat> rows;
    std::vector<RunEvent> events;
    void on_fp8(const RunView&, const std::vector<Fp8Stat>& r) override {
        rows.insert(rows.end(), r.begin(), r.end());
    }
    void on_event(const RunView&, const RunEvent& e) override { events.push_back(e); }
};

bool same_double(double a, double b) {
    return std::bit_cast<std::uint64_t>(a) == std::bit_cast<std::uint64_t>(b);
}

bool same_stat(const Fp8Stat& a, const Fp8Stat& b) {
    bool same = a.tensor == b.tensor && a.recipe == b.recipe;
    for (const Fp8IntField& f : kFp8Ints) same = same && a.*f.field == b.*f.field;
    for (const Fp8RealField& f : kFp8Reals) same = same && same_double(a.*f.field, b.*f.field);
    return same;
}

void check_same_rows(const std::vector<Fp8Stat>& ref, const std::vector<Fp8Stat>& got) {
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); i++) {
        INFO("row " << i << ": step " << ref[i].step << " " << ref[i].tensor << " ("
                    << ref[i].recipe << ") amax " << ref[i].amax << " vs " << got[i].amax
                    << ", sqnr " << ref[i].sqnr_db << " vs " << got[i].sqnr_db << ", count "
                    << ref[i].count << " vs " << got[i].count);
        CHECK(same_stat(ref[i], got[i]));
    }
}

// cfg trained on its layout with the monitor attached (stopped after `stop` steps, the
// learning-rate schedule staying train.steps'): the rows and events rank 0 reports.
Collect monitored(const Config& cfg, i64 stop = 0) {
    Collect c;
    RunHooks hooks;
    if (stop > 0) hooks.setup = [stop](Job& job) { job.stop_after(stop); };
    run_layout(cfg, {&c}, hooks);
    return c;
}

// The plain computation of a cast's statistics: one loop, long double sums.
struct Plain {
    i64 count = 0, nonfinite = 0, nonzero = 0, saturated = 0, underflow = 0;
    float amax = 0, min_nonzero = INFINITY;
    long double signal = 0, error = 0;
    void add(float x, float q, bool saturates) {
        if (!std::isfinite(x)) {
            nonfinite++;
            return;
        }
        count++;
        amax = std::max(amax, std::fabs(x));
        if (x != 0.0f) {
            nonzero++;
            min_nonzero = std::min(min_nonzero, std::fabs(x));
            if (q == 0.0f) underflow++;
        }
        if (saturates) saturated++;
        signal += static_cast<long double>(x) * x;
        error += (static_cast<long double>(x) - q) * (static_cast<long double>(x) - q);
    }
    void check(const Fp8Stat& row) const {
        CHECK(row.count == count);
        CHECK(row.nonfinite == nonfinite);
        CHECK(row.amax == amax);
        CHECK(row.saturated == static_cast<double>(saturated) / static_cast<double>(count));
        CHECK(row.underflow == static_cast<double>(underflow) / static_cast<double>(nonzero));
        CHECK(row.dynamic_range ==
              std::log2(static_cast<double>(amax)) - std::log2(static_cast<double>(min_nonzero)));
        // The monitor's sums are exact and rounded once; these long double sums are within
        // n·2^-64 of exact, so both agree far inside 1e-14.
        const double mse = static_cast<double>(error / count);
        const double sqnr = static_cast<double>(10 * std::log10(signal / error));
        CHECK(std::abs(row.mse - mse) <= 1e-14 * mse);
        CHECK(std::abs(row.sqnr_db - sqnr) <= 1e-13 * std::abs(sqnr));
    }
};

}  // namespace

TEST_CASE("ExactSum: exact in any order, cancellation included", "[fp8_monitor]") {
    std::vector<double> v;
    std::mt19937_64 gen(7);
    std::uniform_real_distribution<double> mant(0.5, 1.0);
    std::uniform_int_distribution<int> ex(-300, 250);
    for (int i = 0; i < 5000; i++) v.push_back(std::ldexp(mant(gen), ex(gen)) * (i % 3 ? 1 : -1));
    v.push_back(std::ldexp(1.0, -1074));  // the smallest subnormal
    v.push_back(1e300);
    ExactSum a, b;
    for (double x : v) a.add(x);
    std::shuffle(v.begin(), v.end(), gen);
    for (double x : v) b.add(x);
    a.normalize();
    b.normalize();
    CHECK(a.digits == b.digits);
    CHECK(same_double(a.value(), b.value()));
    ExactSum c;  // 1e300 + 2^-1074 - 1e300 = 2^-1074 exactly (a double sum gives 0)
    c.add(1e300);
    c.add(std::ldexp(1.0, -1074));
    c.add(-1e300);
    CHECK(c.value() == std::ldexp(1.0, -1074));
    ExactSum d;
    d.add(0.1);
    d.add(0.2);
    CHECK(d.value() == 0.30000000000000004);  // the exact sum of the two doubles, rounded once
}

TEST_CASE("fp8 monitor: a delayed cast's counts, MSE and SQNR against a plain computation",
          "[fp8_monitor]") {
    const Config cfg = monitor_job();
    Fp8Scaling f(cfg.model, cfg.precision);
    // Gemm 0's X scaled by 4 (a power of two: x · 4 is the same in fp32 and in the plain loop).
    std::vector<float> st = f.state();
    st[Fp8Scaling::x] = 4.0f;
    st[Fp8Scaling::dy] = 4.0f;
    f.restore(st);
    std::vector<float> x(6000);
    fill_normal(x.data(), static_cast<i64>(x.size()), 0.0f, 3.0f, 11, 0, 0);
    const std::vector<float> planted = {200.0f, -150.0f,  112.5f, 1e-6f,  -1e-6f, 0.0f,
                                        -0.0f,  INFINITY, NAN,    112.0f, 2e-3f};
    std::copy(planted.begin(), planted.end(), x.begin());
    for (const Fp8Scaling::Role role : {Fp8Scaling::x, Fp8Scaling::dy}) {
        const float fmax = role == Fp8Scaling::x ? 448.0f : 57344.0f;
        std::vector<float> q(x.size());
        f.cast(0, role, view_f32(x.data(), {static_cast<i64>(x.size())}, "x"), q.data(), false);
        Fp8Accum a;
        fp8_accumulate(a, x.data(), q.data(), static_cast<i64>(x.size()), 4.0f, fmax);
        Plain p;
        for (size_t i = 0; i < x.size(); i++) p.add(x[i], q[i], std::fabs(x[i] * 4.0f) > fmax);
        INFO((role == Fp8Scaling::x ? "e4m3" : "e5m2"));
        p.check(fp8_row(a));
        // The fast sums (binned by exponent, split among threads) are ExactSum's, digit for digit.
        ExactSum sig, err;
        for (size_t i = 0; i < x.size(); i++)
            if (std::isfinite(x[i])) {
                sig.add(static_cast<double>(x[i]) * x[i]);
                const double d = static_cast<double>(x[i]) - q[i];
                err.add(d * d);
            }
        sig.normalize();
        err.normalize();
        a.signal.normalize();
        a.error.normalize();
        CHECK(a.signal.digits == sig.digits);
        CHECK(a.error.digits == err.digits);
        if (role == Fp8Scaling::x) {  // 200, -150 and 112.5 times 4 are past 448; 112 is 448
            CHECK(p.saturated >= 3);
            CHECK(a.saturated == p.saturated);
            CHECK(q[2] == 112.0f);  // 450 saturates to 448, read back as 112
        }
        CHECK(p.nonfinite == 2);
        CHECK(q[3] == 0.0f);  // 4e-6 is below half of e4m3's and e5m2's smallest subnormals
        CHECK(p.underflow >= 2);
        CHECK(a.underflow == p.underflow);
    }
}

TEST_CASE("fp8 monitor: a block cast's tiles, each with its own scale, against a plain computation",
          "[fp8_monitor]") {
    Config cfg = monitor_job();
    cfg.precision.fp8 = "block";
    cfg.precision.fp8_block_size = 4;
    const Fp8Scaling f(cfg.model, cfg.precision);
    const i64 R = 8, K = 12, b = 4;
    std::vector<float> x(static_cast<size_t>(R * K));
    fill_normal(x.data(), R * K, 0.0f, 1.0f, 5, 0, 0);
    x[5] = 1e-6f;  // a tile whose scale 448 / amax cannot lift it: underflows
    x[13] = 0.0f;
    x[30] = 3e4f;  // a tile dominated by one value: its neighbours lose precision
    for (const i64 band : {i64{1}, b}) {
        std::vector<float> q(x.size());
        const Fp8Scaling::Role role = band == 1 ? Fp8Scaling::x : Fp8Scaling::w;
        f.cast_blocks(role, view_f32(x.data(), {R, K}, "x"), q.data());
        Fp8Accum a;
        fp8_accumulate_blocks(a, x.data(), q.data(), R, K, band, b);
        Plain p;
        for (i64 r0 = 0; r0 < R; r0 += band)
            for (i64 c0 = 0; c0 < K; c0 += b) {
                float amax = 0;
                for (i64 i = r0; i < r0 + band; i++)
                    for (i64 j = c0; j < c0 + b; j++)
                        amax = std::max(amax, std::fabs(x[i * K + j]));
                const float s = 448.0f / amax;
                for (i64 i = r0; i < r0 + band; i++)
                    for (i64 j = c0; j < c0 + b; j++)
                        p.add(x[i * K + j], q[i * K + j], std::fabs(x[i * K + j] * s) > 448.0f);
            }
        INFO("band " << band);
        p.check(fp8_row(a));
        CHECK(a.saturated == p.saturated);
        CHECK(a.underflow == p.underflow);
    }
}

TEST_CASE("fp8 monitor: alert rules, each on its threshold", "[fp8_monitor]") {
    Fp8MonitorConfig mc;
    mc.scale_jump = 4;
    mc.saturation_max = 0.01;
    mc.sqnr_min_db = 20;
    const Fp8Thresholds t(mc);
    Fp8Stat r;
    r.step = 7;
    r.tensor = "h.1.mlp.c_fc/w";
    r.recipe = "delayed";
    r.count = 1000;
    r.sqnr_db = 30;
    r.scale_ratio = 4.0;  // exactly the factor: no alert
    r.saturated = 0.01;
    std::string why;
    CHECK(judge_fp8(r, t, &why) == 0);
    CHECK(why.empty());
    r.scale_ratio = 0.2;
    CHECK(judge_fp8(r, t, &why) == kFp8ScaleJump);
    CHECK_THAT(why, Contains("fp8 h.1.mlp.c_fc/w (delayed) at step 7: the scale fell to 0.2x"));
    r.scale_ratio = NAN;  // no previous scale
    r.saturated = 0.0125;
    r.sqnr_db = 12.5;
    CHECK(judge_fp8(r, t, &why) == (kFp8Saturation | kFp8Sqnr));
    CHECK_THAT(why, Contains("1.25% of its 1000 values saturated") && Contains("SQNR 12.5 dB"));
    mc.scale_jump = 0;
    mc.saturation_max = 1;
    mc.sqnr_min_db = -1000;
    r.scale_ratio = 100;
    CHECK(judge_fp8(r, Fp8Thresholds(mc), &why) == 0);  // every alert off
}

TEST_CASE("fp8 monitor: the rows are the single device's on every layout, bit for bit",
          "[fp8_monitor]") {
    struct L {
        int dp, tp, pp, zero, microbatches;
        bool sp;
        const char* recompute;
    };
    // With an fp8 LM head and the block comparison (no tp: the vocabulary's pieces may cut tiles).
    const Config with_head = monitor_job();
    // Under tp: no fp8 head; and the block recipe compared with current scaling.
    Config no_head = monitor_job();
    no_head.precision.fp8_lm_head = false;
    Config block = no_head;
    block.precision.fp8 = "block";
    block.fp8_monitor.compare = "current";
    struct Case {
        const Config* cfg;
        std::vector<L> layouts;
    };
    const std::vector<Case> cases = {
        {&with_head,
         {{2, 1, 1, 1, 0, false, "none"},
          {1, 1, 1, 0, 2, false, "none"},
          {1, 1, 2, 0, 2, false, "none"},
          {2, 1, 2, 0, 0, false, "full"}}},
        {&no_head,
         {{1, 2, 1, 0, 0, false, "none"},
          {1, 2, 1, 0, 2, true, "none"},
          {2, 2, 1, 3, 0, false, "none"},
          {1, 2, 2, 0, 2, false, "full"}}},
        {&block, {{2, 1, 1, 0, 2, false, "none"}, {1, 2, 2, 0, 0, true, "none"}}},
    };
    for (const Case& k : cases) {
        const Collect ref = monitored(*k.cfg);
        // 2 monitored steps x (gemms x 3 roles) x (1 + comparisons) rows
        const i64 gemms = 4 * 3 + (k.cfg->precision.fp8_lm_head ? 1 : 0);
        const i64 recipes = k.cfg->fp8_monitor.compare == "current" ? 2 : 3;
        REQUIRE(static_cast<i64>(ref.rows.size()) == 2 * gemms * 3 * recipes);
        CHECK(ref.rows.front().step == 2);
        CHECK(ref.rows.back().step == 4);
        CHECK(ref.rows.front().tensor == "h.0.attn.c_attn/x");
        CHECK(ref.rows.front().recipe == k.cfg->precision.fp8);
        for (const Fp8Stat& r : ref.rows) {
            CHECK(r.count > 0);
            CHECK(r.amax > 0);
            CHECK(r.sqnr_db > 0);
        }
        for (const L& l : k.layouts) {
            Config c = *k.cfg;
            c.layout.dp = l.dp;
            c.layout.tp = l.tp;
            c.layout.pp = l.pp;
            c.layout.zero = l.zero;
            c.layout.microbatches = l.microbatches;
            c.layout.sequence_parallel = l.sp;
            c.layout.recompute = l.recompute;
            INFO(c.precision.fp8 << " compare " << c.fp8_monitor.compare << ": dp" << l.dp << " tp"
                                 << l.tp << " pp" << l.pp << " zero" << l.zero << " mb"
                                 << l.microbatches << (l.sp ? " +SP" : "") << " recompute "
                                 << l.recompute);
            check_same_rows(ref.rows, monitored(c).rows);
        }
    }
}

TEST_CASE("fp8 monitor: a run with the monitor on ends in the bits of the run with it off",
          "[fp8_monitor]") {
    Config on = monitor_job();
    on.precision.fp8_lm_head = false;
    on.fp8_monitor.every = 1;
    on.layout.tp = 2;
    on.layout.pp = 2;
    on.layout.microbatches = 2;
    Config off = on;
    off.fp8_monitor = Fp8MonitorConfig{};
    LogicalState with, without;
    std::vector<float> fp8_with, fp8_without;
    Collect got;
    run_layout(on, {&got}, test::inspecting([&](Job& job) {
                   absorb(with, job);
                   fp8_with = job.fp8()->state();
               }));
    REQUIRE(got.rows.size() == 4 * 12 * 3 * 3);  // every step
    run_layout(off, {}, test::inspecting([&](Job& job) {
                   absorb(without, job);
                   fp8_without = job.fp8()->state();
               }));
    test::check_same_bits(without, with);
    CHECK(test::same_bits(fp8_with, fp8_without));
}

TEST_CASE("fp8 monitor: a monitored job's rows reach the run file's /fp8 and the job view",
          "[fp8_monitor]") {
    Config c = monitor_job();
    c.layout.dp = 2;
    c.train.steps = 6;
    c.fp8_monitor.compare = "";
    c.fp8_monitor.sqnr_min_db = 100;  // every row alerts: the events and their evidence
    c.output.run_file = true;
    // A transient flip after step 5 (the replica check every step): step 5 runs again, and its
    // rows are replaced, not doubled.
    c.validate.replica_check_every = 1;
    c.fault.kind = "flip_weight";
    c.fault.rank = 1;
    c.fault.step = 5;
    c.fault.tensor = "wpe";
    const std::string dir = test::temp_dir("fp8_monitor_runfile");
    const std::string path = dir + "/run.h5";
    JobView view;
    RunFileObserver file(path, c);
    Collect got;
    run_layout(c, {&view, &file, &got});
    const i64 per_step = 13 * 3;
    // steps 2, 4, 6, and step 6's rows once; 5 is not monitored (every 2)
    REQUIRE(static_cast<i64>(got.rows.size()) == 3 * per_step);
    const RunSnapshot s = view.snapshot();
    check_same_rows(got.rows, s.fp8);
    const RunRecords rec = read_run_records(path);
    check_same_rows(got.rows, rec.fp8);
    i64 alerts = 0;
    for (const RunRecords::Event& e : rec.events)
        if (e.kind == "alert") {
            alerts++;
            CHECK_THAT(e.message, Contains("SQNR") && Contains("fp8_monitor.sqnr_min_db = 100 dB"));
        }
    i64 alerted_rows = 0;
    for (const Fp8Stat& r : got.rows) alerted_rows += r.alerts == kFp8Sqnr ? 1 : 0;
    CHECK(alerted_rows == 3 * per_step);  // no row has an SQNR of 100 dB
    CHECK(alerts == alerted_rows);
    i64 view_alerts = 0;
    for (const RunEvent& e : s.events) view_alerts += e.kind == EventKind::alert ? 1 : 0;
    CHECK(view_alerts == alerts);
    CHECK(got.events.size() == static_cast<size_t>(alerts));
}

TEST_CASE("fp8 monitor: a re-run step's rows replace the first run's in the view and the file",
          "[fp8_monitor]") {
    Config c = monitor_job();
    c.layout.dp = 2;
    c.train.steps = 5;
    c.fp8_monitor.every = 1;
    c.fp8_monitor.compare = "";
    c.output.run_file = true;
    c.validate.replica_check_every = 2;  // the flip after step 3 is found at step 4: 3 and 4 again
    c.fault.kind = "flip_weight";
    c.fault.rank = 1;
    c.fault.step = 3;
    c.fault.tensor = "wpe";
    const std::string path = test::temp_dir("fp8_monitor_rerun") + "/run.h5";
    JobView view;
    RunFileObserver file(path, c);
    Collect got;
    run_layout(c, {&view, &file, &got});
    const size_t per_step = 13 * 3;
    REQUIRE(got.rows.size() == 7 * per_step);  // steps 1-4, then 3 and 4 again, then 5
    // The last report of each step is what the view and the file hold, in step order.
    std::vector<Fp8Stat> last;
    for (const i64 step : {1, 2}) {
        for (size_t i = 0; i < per_step; i++) last.push_back(got.rows[(step - 1) * per_step + i]);
    }
    for (size_t k = 4; k < 7; k++)
        for (size_t i = 0; i < per_step; i++) last.push_back(got.rows[k * per_step + i]);
    CHECK(last[2 * per_step].step == 3);
    CHECK(last.back().step == 5);
    check_same_rows(last, view.snapshot().fp8);
    check_same_rows(last, read_run_records(path).fp8);
}

TEST_CASE("fp8 monitor: alerts fire on a provoked drift and stay silent on a clean run",
          "[fp8_monitor]") {
    // examples/fp8_drift.toml: an amax history of one step and a 100x learning-rate jump at
    // steps 30 and 31 (stopped after step 36, no comparisons, to run quickly).
    Config drift = load_config("examples/fp8_drift.toml");
    drift.train.eval_every = 0;
    drift.fp8_monitor.compare = "";
    drift.output.run_file = false;
    REQUIRE(drift.train.lr_jump_step == 30);
    const Collect got = monitored(drift, 36);
    REQUIRE(got.rows.size() == 36 * 8 * 3);  // blocks 1 and 2's linears, every step
    i64 fired = 0, kinds = 0, first = 0;
    for (const Fp8Stat& r : got.rows) {
        if (r.alerts == 0) continue;
        fired++;
        kinds |= r.alerts;
        if (first == 0) first = r.step;
        CHECK(r.step > 30);  // nothing before the jump's first update reaches the casts
        CHECK(r.step <= 34);
    }
    CHECK(first == 31);
    CHECK(kinds == (kFp8ScaleJump | kFp8Saturation | kFp8Sqnr));  // every kind, at the jump
    REQUIRE(static_cast<i64>(got.events.size()) == fired);
    for (const RunEvent& e : got.events) {
        CHECK(e.kind == EventKind::alert);
        CHECK_THAT(e.message, Contains("(delayed) at step " + std::to_string(e.step)));
    }
    // The evidence: at step 31 tensors saturated over 1%; then (their amaxes having grown) their
    // scales moved more than 4x in a step.
    bool saturated = false, jumped = false;
    for (const Fp8Stat& r : got.rows) {
        if (r.step == 31) saturated = saturated || r.saturated > 0.01;
        if (r.step > 30) jumped = jumped || r.scale_ratio > 4 || r.scale_ratio < 0.25;
    }
    CHECK(saturated);
    CHECK(jumped);

    // Clean: the same job without the jump, and the usual recipe (history 1024, max).
    Config clean = drift;
    clean.train.lr_jump_step = 0;
    Config usual = clean;
    usual.precision.fp8_amax_history_len = 1024;
    usual.precision.fp8_amax_compute_algo = "max";
    for (const Config* c : {&clean, &usual}) {
        INFO("history " << c->precision.fp8_amax_history_len);
        const Collect quiet = monitored(*c, 36);
        REQUIRE(quiet.rows.size() == got.rows.size());
        i64 any = 0;
        double worst_saturation = 0;
        for (const Fp8Stat& r : quiet.rows) {
            any += r.alerts != 0 ? 1 : 0;
            worst_saturation = std::max(worst_saturation, r.saturated);
        }
        CHECK(any == 0);
        CHECK(quiet.events.empty());
        CHECK(worst_saturation < 0.01);
    }
}

TEST_CASE("fp8 monitor: keys and refusals name the key", "[fp8_monitor]") {
    Config c = monitor_job();
    c.fp8_monitor.compare = "block";
    c.layout.tp = 2;  // with an fp8 LM head: the block comparison's tiles may span tp ranks
    CHECK_THAT(test::error_of<ConfigError>([&] { monitored(c); }),
               Contains("fp8_monitor.compare = \"block\" under layout.tp = 2"));
    Config off = test::small_job();
    off.fp8_monitor.every = 3;
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(off); }),
               Contains("fp8_monitor.every = 3 monitors fp8 casts, but precision.fp8 = \"off\""));
    Config same = monitor_job();
    same.fp8_monitor.compare = "current,delayed";
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(same); }),
               Contains("fp8_monitor.compare must be \"current\" or \"block\", got \"delayed\""));
    same.precision.fp8 = "block";
    same.fp8_monitor.compare = "block";
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(same); }),
               Contains("the run's own recipe"));
    Config keys = monitor_job();
    keys.fp8_monitor.scale_jump = 0.5;
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(keys); }),
               Contains("fp8_monitor.scale_jump = 0.5 is out of range"));
    keys.fp8_monitor.scale_jump = 4;
    keys.fp8_monitor.saturation_max = 2;
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(keys); }),
               Contains("fp8_monitor.saturation_max = 2 is out of range: must be in [0, 1]"));
    keys.fp8_monitor.saturation_max = 0;
    // The learning-rate jump: steps 30 and 31 (1-based; lr_at counts from 0) at 100x.
    const Config drift = load_config("examples/fp8_drift.toml");
    const TrainConfig& tc = drift.train;
    for (i64 step = 0; step < tc.steps; step++) {
        const bool jump = step + 1 == 30 || step + 1 == 31;
        CHECK(lr_at(tc, step) == (jump ? 100.0 * scheduled_lr(tc, step) : scheduled_lr(tc, step)));
    }
    keys.train.lr_jump_step = 99;
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(keys); }),
               Contains("train.lr_jump_step=99 comes after the last step"));
}
