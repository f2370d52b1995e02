// Probes (core/model/probe.h, core/train/probe_recorder.h): the pattern language, the shard specs, and that a
// data-parallel run's probes, unsharded, are bit for bit the single device's at every op.
#include "core/train/runner.h"
#include "tests/support/test_util.h"
#include "core/train/probe_recorder.h"

#include <algorithm>

using namespace px;
using namespace px::test;

TEST_CASE("glob_match: * stays within a segment, ** crosses them, ? is one character") {
    CHECK(glob_match("*/bwd/*/attn.*/*", "3/bwd/2/attn.qkv/dweight"));
    CHECK(glob_match("*/bwd/*/attn.*/*", "3/bwd/2/attn.qkv/dinp"));
    CHECK_FALSE(glob_match("*/bwd/*/attn.*/*", "3/fwd/2/attn.qkv/out"));
    CHECK_FALSE(glob_match("*/bwd/*/attn.*/*", "3/bwd/2/mlp.fc/dinp"));
    CHECK(glob_match("**", "1/fwd/-/embed/out"));
    CHECK(glob_match("1/**", "1/fwd/0/ln_1/out"));
    CHECK_FALSE(glob_match("1/*", "1/fwd/0/ln_1/out"));
    CHECK(glob_match("**/out", "12/fwd/3/mlp.gelu/out"));
    CHECK(glob_match("*/fwd/-/loss/*", "7/fwd/-/loss/out"));
    CHECK_FALSE(glob_match("*/fwd/-/loss/*", "7/fwd/0/loss/out"));
    CHECK(glob_match("?/fwd/?/ln_?/out", "3/fwd/1/ln_2/out"));
    CHECK_FALSE(glob_match("?/fwd/0/ln_1/out", "13/fwd/0/ln_1/out"));
    CHECK_FALSE(glob_match("a?b", "a/b"));
    CHECK(glob_match("", ""));
    CHECK_FALSE(glob_match("", "x"));
    CHECK(glob_match("*", ""));
    CHECK(glob_match("**/mlp.*/*", "1/bwd/0/mlp.proj/dinp"));
}

TEST_CASE("ProbeKey names, and flat shards of a tensor unshard to the whole") {
    CHECK(ProbeKey{3, "fwd", 2, "attn.qkv", "out"}.name() == "3/fwd/2/attn.qkv/out");
    CHECK(ProbeKey{1, "grad", -1, "param", "wte"}.name() == "1/grad/-/param/wte");

    const std::vector<i64> shape{3, 4, 5};
    std::vector<float> whole(60);
    for (size_t i = 0; i < whole.size(); i++) whole[i] = static_cast<float>(i) * 0.5f;
    ProbeRecorder rec({"**"});
    const ProbeKey key{1, "optim", 0, "adam.m", "x"};
    // Cuts that fall mid-row and across the leading dimension.
    const i64 cuts[] = {0, 3, 7, 26, 41, 60};
    for (int r = 0; r < 5; r++) {
        const ShardSpec s = flat_shard(shape, cuts[r], cuts[r + 1]);
        CHECK(s.local_numel() == cuts[r + 1] - cuts[r]);
        CHECK_FALSE(rec.complete(key.name()));
        rec.capture(key, whole.data() + cuts[r], s);
    }
    std::vector<i64> got_shape;
    CHECK(same_bits(rec.unshard(key.name(), &got_shape), whole));
    CHECK(got_shape == shape);
    CHECK(rec.complete(key.name()));
}

TEST_CASE("ProbeRecorder names missing pieces and replicas that disagree") {
    ProbeRecorder rec({"**"});
    const ProbeKey key{2, "fwd", 0, "ln_1", "out"};
    std::vector<float> rows(6, 1.0f);
    ShardSpec s{{4, 3}, {{{0, 0}, {2, 3}}}};
    rec.capture(key, rows.data(), s);
    CHECK_THROWS_WITH(rec.unshard(key.name()), Catch::Contains("2/fwd/0/ln_1/out") &&
                                                   Catch::Contains("captured by no rank"));
    CHECK_THROWS_WITH(rec.unshard("9/fwd/0/ln_1/out"), Catch::Contains("never captured"));
    rows[4] = 2.0f;
    rec.capture(key, rows.data(), s);  // a replica of the same rows with another value
    s.pieces[0] = {{2, 0}, {4, 3}};
    rec.capture(key, rows.data(), s);
    CHECK_THROWS_WITH(rec.unshard(key.name()),
                      Catch::Contains("2/fwd/0/ln_1/out") && Catch::Contains("disagree"));
}

namespace {

// The probe names one step of the single-device job of `c` gives with pattern "**", in order.
std::vector<std::string> expected_step(const Config& c, i64 step) {
    std::vector<std::string> n;
    auto add = [&](const char* phase, int layer, const char* op, const char* tensor) {
        n.push_back(ProbeKey{step, phase, layer, op, tensor}.name());
    };
    const int L = static_cast<int>(c.model.layers);
    add("fwd", -1, "embed", "out");
    for (int l = 0; l < L; l++)
        for (const char* op : {"ln_1", "attn.qkv", "attn.core", "attn.proj", "residual_1", "ln_2",
                               "mlp.fc", "mlp.gelu", "mlp.proj", "residual_2"})
            add("fwd", l, op, "out");
    add("fwd", -1, "ln_f", "out");
    add("fwd", -1, "head", "out");
    add("fwd", -1, "loss", "out");
    add("bwd", -1, "loss", "dinp");
    add("bwd", -1, "head", "dinp");
    add("bwd", -1, "ln_f", "dinp");
    for (int l = L - 1; l >= 0; l--)
        for (const char* op : {"mlp.proj", "mlp.gelu", "mlp.fc", "ln_2", "attn.proj", "attn.core",
                               "attn.qkv", "ln_1"})
            add("bwd", l, op, "dinp");
    const ParamTable t = ParamTable::build(c.model);
    for (const char* phase_op :
         {"mgrad/param", "grad/param", "optim/param", "optim/adam.m", "optim/adam.v"}) {
        const std::string po = phase_op;
        const std::string phase = po.substr(0, po.find('/')), op = po.substr(po.find('/') + 1);
        for (const TableEntry& e : t.entries)
            add(phase.c_str(), e.layer, op.c_str(), e.short_name);
        if (po == "grad/param") add("grad", -1, "clip", "norm");  // the norm clipping sees
    }
    return n;
}

Config probe_job() {
    Config c = small_job();
    c.train.steps = 3;
    return c;
}

// Every probe of `ref` is in `got`, complete, and bit for bit equal; and no other is there.
void check_same_probes(const ProbeRecorder& ref, const ProbeRecorder& got) {
    std::vector<std::string> a = ref.names(), b = got.names();
    CHECK(a.size() == b.size());
    std::sort(b.begin(), b.end());
    int differ = 0;
    for (const std::string& name : a) {
        if (!std::binary_search(b.begin(), b.end(), name)) {
            FAIL_CHECK("missing probe " << name);
            continue;
        }
        std::vector<i64> sa, sb;
        const std::vector<float> x = ref.unshard(name, &sa), y = got.unshard(name, &sb);
        if (sa != sb || !same_bits(x, y)) {
            if (differ++ < 5) FAIL_CHECK("probe " << name << " differs from the single device's");
        }
    }
    CHECK(differ == 0);
}

}  // namespace

TEST_CASE(
    "Probes on a single device: every op of every layer, every step, in order; bits unchanged") {
    const Config c = probe_job();
    ProbeRecorder rec({"**"});
    Job job(c);
    job.set_probes(&rec);
    job.run();

    std::vector<std::string> want;
    for (i64 s = 1; s <= c.train.steps; s++) {
        const std::vector<std::string> e = expected_step(c, s);
        want.insert(want.end(), e.begin(), e.end());
    }
    CHECK(rec.names() == want);
    for (const std::string& n : rec.names()) CHECK(rec.complete(n));
    std::vector<i64> shape;
    rec.unshard("2/fwd/1/attn.qkv/out", &shape);
    CHECK(shape == std::vector<i64>{c.train.batch_size, c.model.seq_len, 3 * c.model.hidden});
    rec.unshard("1/grad/1/param/attn.c_attn.weight", &shape);
    CHECK(shape == std::vector<i64>{3 * c.model.hidden, c.model.hidden});
    rec.unshard("1/optim/-/adam.v/ln_f.bias", &shape);
    CHECK(shape == std::vector<i64>{c.model.hidden});

    // The per-token losses of a step average to the step's loss.
    const std::vector<float> losses = rec.unshard("3/fwd/-/loss/out", &shape);
    CHECK(shape == std::vector<i64>{c.train.batch_size, c.model.seq_len});
    CHECK(canonical_sum(losses.data(), static_cast<i64>(losses.size()),
                        job.model().numerics().block) /
              static_cast<float>(losses.size()) ==
          static_cast<float>(job.history()[2].loss));

    // The clipping norm's probe is the step's grad norm.
    CHECK(rec.unshard("2/grad/-/clip/norm", &shape) ==
          std::vector<float>{static_cast<float>(job.history()[1].grad_norm)});
    CHECK(shape == std::vector<i64>{1});

    // The final weights and moments with probes on are those without.
    const LogicalState off = single_device(c);
    LogicalState on;
    absorb(on, job);
    check_same_bits(off, on);
    // The last step's weights as probed are the final weights.
    const ParamTable t = ParamTable::build(c.model);
    const TableEntry& e = t.entries[static_cast<size_t>(t.layer_index(1, FCW))];
    const std::vector<float> w = rec.unshard("3/optim/1/param/mlp.c_fc.weight");
    CHECK(std::equal(w.begin(), w.end(), off.params.begin() + e.offset,
                     [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }));
}

TEST_CASE("Probes select: */fwd/1/mlp.*/* records only those, with a step stride") {
    const Config c = probe_job();
    ProbeRecorder rec({"*/fwd/1/mlp.*/*"}, 2);
    Job job(c);
    job.set_probes(&rec);
    job.run();
    CHECK(rec.names() == std::vector<std::string>{"1/fwd/1/mlp.fc/out", "1/fwd/1/mlp.gelu/out",
                                                  "1/fwd/1/mlp.proj/out", "3/fwd/1/mlp.fc/out",
                                                  "3/fwd/1/mlp.gelu/out", "3/fwd/1/mlp.proj/out"});
}

namespace {

// The probes of layout `d` (every rank's job or pipeline stage recording into one recorder)
// against the single device's on the same job, bit for bit. The single device runs as many
// microbatches as the layout has in all, so that its microbatch gradients ("mgrad") are the
// nodes the layout's ranks hold.
void check_layout_probes(const Config& c, const Config& d) {
    const std::vector<std::string> patterns{"**"};
    Config r = c;
    const int mb =
        d.layout.microbatches > 0 ? d.layout.microbatches : static_cast<int>(d.train.microbatches);
    r.train.microbatches = d.layout.dp * mb;
    ProbeRecorder ref(patterns);
    {
        Job job(r);
        job.set_probes(&ref);
        job.run();
    }
    ProbeRecorder got(patterns);
    RunHooks hooks;
    hooks.setup = [&](Job& j) { j.set_probes(&got); };
    run_layout(d, {}, hooks);
    check_same_probes(ref, got);
}

}  // namespace

TEST_CASE("Probes under data parallelism unshard to the single device's, bit for bit") {
    struct Case {
        int dp, zero, microbatches;
        i64 batch;
    };
    for (const Case k : {Case{2, 0, 1, 8}, Case{2, 0, 2, 8}, Case{2, 1, 2, 8}, Case{2, 2, 2, 8},
                         Case{2, 3, 1, 8}, Case{4, 3, 2, 16}}) {
        DYNAMIC_SECTION("dp" << k.dp << " zero" << k.zero << " microbatches " << k.microbatches) {
            Config c = probe_job();
            c.train.batch_size = k.batch;
            Config d = c;
            d.layout.dp = k.dp;
            d.layout.zero = k.zero;
            d.layout.microbatches = k.microbatches;
            check_layout_probes(c, d);
        }
    }
}

TEST_CASE("Probes under tensor, sequence and pipeline parallelism unshard to the single device's") {
    const Config c = with_tp_shapes(probe_job());
    struct Case {
        int dp, tp, pp, zero, microbatches;
        bool sp;
    };
    for (const Case k :
         {Case{1, 2, 1, 0, 0, false}, Case{1, 2, 1, 0, 0, true}, Case{1, 4, 1, 0, 0, true},
          Case{2, 2, 1, 1, 2, true}, Case{2, 2, 1, 3, 0, false}, Case{1, 2, 2, 0, 2, true},
          Case{1, 1, 2, 0, 4, false}, Case{2, 1, 2, 2, 2, false}}) {
        DYNAMIC_SECTION("dp" << k.dp << " tp" << k.tp << " pp" << k.pp << " zero" << k.zero
                             << " microbatches " << k.microbatches << (k.sp ? " +SP" : "")) {
            Config d = c;
            d.layout.dp = k.dp;
            d.layout.tp = k.tp;
            d.layout.pp = k.pp;
            d.layout.zero = k.zero;
            d.layout.microbatches = k.microbatches;
            d.layout.sequence_parallel = k.sp;
            check_layout_probes(c, d);
        }
    }
}

TEST_CASE("A tp rank's probes are its columns: qkv's three head blocks, then its ffn") {
    Config c = with_tp_shapes(probe_job());
    c.layout.tp = 2;
    c.layout.sequence_parallel = true;
    std::vector<std::unique_ptr<ProbeRecorder>> ranks;
    for (int r = 0; r < 2; r++)
        ranks.push_back(std::make_unique<ProbeRecorder>(std::vector<std::string>{
            "1/fwd/0/attn.qkv/out", "1/fwd/0/mlp.fc/out", "1/fwd/0/residual_1/out",
            "1/grad/0/param/attn.c_proj.weight"}));
    RunHooks hooks;
    hooks.setup = [&](Job& j) { j.set_probes(ranks[static_cast<size_t>(j.tp_rank())].get()); };
    run_layout(c, {}, hooks);
    const i64 B = c.train.batch_size, T = c.model.seq_len, C = c.model.hidden;
    // Rank 1's qkv: columns [32, 64), [96, 128), [160, 192) of (B, T, 3C); zeros elsewhere.
    const std::vector<float> zero(static_cast<size_t>(B * T * 3 * C), 0.0f);
    const std::vector<float> q1 = ranks[1]->overlay("1/fwd/0/attn.qkv/out", zero);
    for (i64 col = 0; col < 3 * C; col++) {
        const bool mine = (col / (C / 2)) % 2 == 1;
        bool any = false;
        for (i64 row = 0; row < B * T; row++)
            any = any || q1[static_cast<size_t>(row * 3 * C + col)] != 0.0f;
        CHECK(any == mine);
    }
    // Rank 0's residual stream under SP: the first half of the tokens only.
    const std::vector<float> res(static_cast<size_t>(B * T * C), 0.0f);
    const std::vector<float> r0 = ranks[0]->overlay("1/fwd/0/residual_1/out", res);
    CHECK(r0[static_cast<size_t>((B * T / 2 - 1) * C)] != 0.0f);
    CHECK(r0[static_cast<size_t>((B * T / 2) * C)] == 0.0f);
    // attn.c_proj (C, C) is row parallel: rank 0 holds the input columns of its heads.
    const std::vector<float> w(static_cast<size_t>(C * C), 0.0f);
    const std::vector<float> p0 = ranks[0]->overlay("1/grad/0/param/attn.c_proj.weight", w);
    for (i64 col = 0; col < C; col++) {
        bool any = false;
        for (i64 row = 0; row < C; row++)
            any = any || p0[static_cast<size_t>(row * C + col)] != 0.0f;
        CHECK(any == (col < C / 2));
    }
}
