// Mixture of experts (core/model/moe.h): one expert is the dense MLP bit for bit; the gradients
// (router, experts, shared experts, auxiliary losses) agree with an fp64 model's central
// differences, for GPT-2's experts and for Llama's SwiGLU ones; capacity drops follow the
// documented order; every layout of dp, microbatches, ZeRO, pp and recomputation is
// bit-identical to the single device, router statistics included.
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/model/model.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "core/io/checkpoint.h"
#include "core/io/state.h"
#include "tests/support/test_util.h"
#include "validators/gradcheck.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

using namespace px;

namespace {

ModelConfig moe_model() {
    ModelConfig mc;
    mc.vocab = 11;
    mc.seq_len = 9;
    mc.layers = 2;
    mc.heads = 2;
    mc.hidden = 16;
    mc.ffn = 24;
    mc.moe_experts = 4;
    mc.moe_top_k = 2;
    mc.moe_ffn = 12;
    return mc;
}

std::vector<int> tokens_of(i64 n, i64 V, int a, int b) {
    std::vector<int> t;
    for (i64 i = 0; i < n; i++) t.push_back(static_cast<int>((i * a + b) % V));
    return t;
}

// The (fp32) gradient buffer of one forward and backward of `m` on B sequences of T tokens.
std::vector<float> grads_of(GPT& m, i64 B, i64 T) {
    const std::vector<int> tok = tokens_of(B * T, m.config().vocab, 7, 3);
    const std::vector<int> tgt = tokens_of(B * T, m.config().vocab, 5, 1);
    m.forward(tok.data(), tgt.data(), B, T);
    std::vector<float> g(static_cast<size_t>(m.grad_layout().total), 0.0f);
    m.backward(g.data(), tok.data(), tgt.data(), 1.0f / static_cast<float>(B * T));
    m.combine_tied_grads(g.data());
    return g;
}

bool same_floats(const float* a, const float* b, i64 n) {
    return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("one expert, top-1, dropless, without z-loss is the dense MLP bit for bit") {
    Numerics nx;
    nx.block = 4;  // several token blocks: the experts' trees have depth
    ModelConfig dense = moe_model();
    dense.moe_experts = 0;
    ModelConfig one = moe_model();
    one.moe_experts = 1;
    one.moe_top_k = 1;
    one.moe_ffn = dense.ffn;
    one.moe_z_loss = 0;  // (the load-balancing loss's gradient is exactly 0 with one expert)
    GPT a(dense, nx), b(one, nx);
    b.init_random(5, 0.4);
    // The dense model's weights are the MoE model's, its MLP the one expert's.
    for (const TableEntry& e : a.table().entries) {
        std::string name = e.name;
        if (const auto k = name.find("mlp."); k != std::string::npos)
            name.replace(k, 4, "moe.experts.");
        const float* src = b.param_ptr(name);
        REQUIRE(src != nullptr);
        std::memcpy(a.param_ptr(e.name), src, static_cast<size_t>(e.numel()) * sizeof(float));
    }
    const i64 B = 2, T = 9;
    const std::vector<float> ga = grads_of(a, B, T), gb = grads_of(b, B, T);
    CHECK(same_floats(a.losses(), b.losses(), B * T));
    for (const TableEntry& e : a.table().entries) {
        std::string name = e.name;
        if (const auto k = name.find("mlp."); k != std::string::npos)
            name.replace(k, 4, "moe.experts.");
        const int j = b.table().find(name);
        REQUIRE(j >= 0);
        INFO(e.name);
        CHECK(same_floats(ga.data() + e.offset, gb.data() + b.table().entries[static_cast<size_t>(j)].offset,
                          e.numel()));
    }
}

TEST_CASE("MoE gradients agree with central differences of an fp64 model") {
    struct Variant {
        const char* what;
        double capacity;
        i64 shared, every;
        bool norm;
    };
    for (const Variant v : {Variant{"dropless, renormalised gates", 0.0, 0, 1, true},
                            Variant{"capacity 1.0 (drops), raw gates", 1.0, 0, 1, false},
                            Variant{"a shared expert, MoE every 2nd layer", 1.25, 1, 2, true}}) {
        ModelConfig mc = moe_model();
        mc.moe_capacity_factor = v.capacity;
        mc.moe_shared_experts = v.shared;
        mc.moe_every = v.every;
        mc.moe_norm_topk = v.norm;
        mc.moe_aux_loss = 0.05;  // large enough to show in every router gradient
        mc.moe_z_loss = 0.01;
        Numerics nx;
        nx.block = 4;
        gradcheck::ModelFdOptions o;
        o.B = 2;
        o.T = 9;
        const gradcheck::ModelProbe probe = gradcheck::model_fd_samples(mc, nx, o);
        INFO(v.what);
        CHECK(std::abs(probe.loss32 - probe.loss64) <= probe.loss_bound);
        REQUIRE(probe.names.size() == GPT(mc, nx).table().entries.size());
        int router = 0;
        for (const gradcheck::ModelSample& s : probe.samples) {
            INFO(probe.names[static_cast<size_t>(s.tensor)] << " element " << s.element
                                                             << ": analytic " << s.analytic
                                                             << " fd " << s.fd);
            CHECK(s.ok());
            if (probe.names[static_cast<size_t>(s.tensor)].find("router") != std::string::npos &&
                s.fd != 0)
                router++;
        }
        CHECK(router > 0);  // the router's gradient is checked, not only zeros
    }
}

TEST_CASE("Llama MoE (SwiGLU experts) gradients agree with central differences of an fp64 model") {
    struct Variant {
        const char* what;
        double capacity;
        i64 shared, every;
        bool norm;
    };
    for (const Variant v :
         {Variant{"dropless, renormalised gates, no shared expert", 0.0, 0, 1, true},
          Variant{"capacity 1.0 (drops), raw gates, a shared expert, MoE every 2nd layer", 1.0,
                  1, 2, false}}) {
        ModelConfig mc = moe_model();
        mc.arch = "llama";
        mc.kv_heads = 1;
        mc.qk_norm = true;
        mc.rope_theta = 10000;
        mc.moe_capacity_factor = v.capacity;
        mc.moe_shared_experts = v.shared;
        mc.moe_every = v.every;
        mc.moe_norm_topk = v.norm;
        mc.moe_aux_loss = 0.05;
        mc.moe_z_loss = 0.01;
        Numerics nx;
        nx.block = 4;
        gradcheck::ModelFdOptions o;
        o.B = 2;
        o.T = 9;
        const gradcheck::ModelProbe probe = gradcheck::model_fd_samples(mc, nx, o);
        INFO(v.what);
        CHECK(std::abs(probe.loss32 - probe.loss64) <= probe.loss_bound);
        int up = 0;  // the experts' up projections are among the tensors checked
        for (const std::string& n : probe.names) up += n.find("mlp.experts.up_proj") != n.npos;
        CHECK(up == (v.every == 1 ? 2 : 1));
        for (const gradcheck::ModelSample& s : probe.samples) {
            INFO(probe.names[static_cast<size_t>(s.tensor)]
                 << " element " << s.element << ": analytic " << s.analytic << " fd " << s.fd);
            CHECK(s.ok());
        }
    }
}

TEST_CASE("capacity keeps at most ceil(cf·T·k/E) slots per expert and sequence, first choices first") {
    ModelConfig mc = moe_model();
    mc.moe_capacity_factor = 0.5;  // ceil(0.5·9·2/4) = 3 slots per expert and sequence
    Numerics nx;
    GPT m(mc, nx);
    m.init_random(3, 0.4);
    std::vector<RouterStats> st(static_cast<size_t>(mc.layers));
    for (RouterStats& s : st) s.reset(mc.moe_experts);
    m.set_router_stats(st.data());
    const i64 B = 3, T = 9;
    grads_of(m, B, T);
    for (const RouterStats& s : st) {
        CHECK(s.slots == B * T * 2);
        CHECK(s.sequences == B);
        i64 kept = 0;
        for (i64 n : s.tokens) {
            CHECK(n <= 3 * B);
            kept += n;
        }
        CHECK(kept + s.dropped == s.slots);
        CHECK(s.dropped >= s.slots - 4 * 3 * B);  // at most E·cap kept per sequence
        CHECK(router_unfixed(s.entropy) / double(s.token_count) <= std::log(4.0) + 1e-6);
    }
}

TEST_CASE("MoE configs that cannot run say which keys to change") {
    Config c = test::small_job();
    c.model.moe_experts = 4;
    c.model.moe_top_k = 5;
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(c); }),
               Catch::Contains("model.moe_top_k=5 exceeds model.moe_experts=4"));
    c.model.moe_top_k = 2;
    c.layout.tp = 2;
    c.layout.sequence_parallel = true;
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(c); }),
               Catch::Contains("set layout.sequence_parallel = false"));
    c.layout.tp = 1;
    c.layout.sequence_parallel = false;
    c.precision.activations = "bf16";
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(c); }),
               Catch::Contains("precision.activations = \"fp32\""));
    c.precision.activations = "fp32";
    c.model.moe_every = 3;
    CHECK_THAT(test::error_of<ConfigError>([&] { validate_config(c); }),
               Catch::Contains("model.moe_every=3 exceeds model.layers=2"));
}

namespace {

Config moe_job() { return test::small_moe_job(40); }

}  // namespace

TEST_CASE("MoE layouts are bit-identical to the single device, router statistics included") {
    const Config base = moe_job();
    test::ValueLog ref_values;
    LogicalState ref;
    {
        Job job(base);
        job.add_observer(&ref_values);
        job.run();
        absorb(ref, job);
    }
    REQUIRE(ref_values.got.count("moe.h.1.drop_fraction") == 1);
    REQUIRE(ref_values.got["moe.h.0.tokens.3"].size() == 5);
    struct L {
        int dp, pp, zero, mb;
        const char* recompute;
    };
    for (const L l : {L{2, 1, 0, 1, "none"}, L{2, 1, 0, 2, "none"}, L{4, 1, 3, 2, "none"},
                      L{2, 1, 2, 1, "full"}, L{1, 2, 0, 4, "none"}, L{2, 2, 1, 2, "full"}}) {
        Config c = base;
        c.layout.dp = l.dp, c.layout.pp = l.pp, c.layout.zero = l.zero;
        c.layout.microbatches = l.mb;
        c.layout.recompute = l.recompute;
        INFO("dp" << l.dp << " pp" << l.pp << " zero" << l.zero << " mb" << l.mb << " "
                  << l.recompute);
        LogicalState got;
        test::ValueLog values;
        bool agree = true;
        RunHooks h = test::inspecting([&](Job& job) { agree = absorb(got, job) && agree; });
        run_layout(c, {&values}, h);
        CHECK(agree);
        test::check_same_bits(ref, got);
        CHECK(values.got == ref_values.got);
    }
}

TEST_CASE("a MoE checkpoint resumes under another layout, bit-identical to the uninterrupted run") {
    Config c = moe_job();
    c.train.steps = 6;
    c.train.eval_every = 3;
    const LogicalState ref = test::single_device(c);
    const std::string dir = test::temp_dir("moe_resume");
    Config w = c;
    w.layout.dp = 2;
    w.layout.zero = 3;
    w.checkpoint.dir = dir;
    w.checkpoint.every = 3;
    run_layout(w);
    const std::string ckpt = checkpoint_path(dir, 3);
    REQUIRE(std::filesystem::exists(ckpt));
    Config r = c;  // dp2·ZeRO-3 -> pp2 with 2 microbatches
    r.layout.pp = 2;
    r.layout.microbatches = 2;
    r.checkpoint.resume = ckpt;
    LogicalState got;
    run_layout(r, {}, test::inspecting([&](Job& job) { absorb(got, job); }));
    REQUIRE(got.history.size() == 6);
    test::check_same_bits(ref, got);
    // A dense config cannot take the MoE checkpoint: it names the missing tensors' key.
    Config dense = c;
    dense.model.moe_experts = 0;
    dense.checkpoint.resume = ckpt;
    CHECK_THAT(test::error_of<Error>([&] { run_layout(dense); }),
               Catch::Contains("model.moe_experts"));
}
