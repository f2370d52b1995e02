// The Llama / Qwen3 block (model.arch = "llama", core/model/llama_block.h) under the layouts: every
// one bit-identical to the single device (loss, grad norm and validation loss of every step, every
// weight and Adam moment), as GPT-2's are, its MoE layers (SwiGLU experts) included; and what it
// does not run on yet refused by key.
//
// The jobs: 2 layers (4 for the interleaved pipeline), C = 32, 4 query heads over 2 KV heads of 8
// channels (grouped-query attention), Qwen3's qk_norm on, an untied lm_head, T = 64 in blocks of
// 8 tokens, batch 8, 5 steps with a validation loss at the last.
#include <catch2/catch.hpp>

#include "core/base/config.h"
#include "core/io/checkpoint.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "tests/support/test_util.h"

#include <filesystem>
#include <string>

using namespace px;
using test::check_same_bits;
using test::single_device;

namespace {

Config llama_job() {
    Config c = test::small_job();
    c.model.arch = "llama";
    c.model.kv_heads = 2;
    c.model.ffn = 64;
    c.model.qk_norm = true;
    c.model.rope_theta = 10000;
    c.numerics.block = 8;
    c.train.eval_every = 5;
    c.train.val_batches = 2;
    c.train.threads = 1;
    return c;
}

std::string describe(const Config& c) {
    const LayoutConfig& l = c.layout;
    return "dp" + std::to_string(l.dp) + " tp" + std::to_string(l.tp) + " zero" + std::to_string(l.zero) + " mb" +
           std::to_string(l.microbatches) + " pp" + std::to_string(l.pp) + " " + l.schedule +
           " v" + std::to_string(l.virtual_stages) + " cp" + std::to_string(l.cp) + " " +
           l.cp_method + " recompute " + l.recompute + " " + c.precision.activations + " fp8 " +
           c.precision.fp8 + " kv_heads " + std::to_string(c.model.kv_heads) +
           (c.model.tie_embeddings ? " tied" : " untied");
}

// c's layout run against c on one device (the same model, data, precision and recompute).
void check_llama(const Config& c) {
    Config one = c;
    one.layout = LayoutConfig{};
    one.layout.timeout_s = c.layout.timeout_s;
    one.layout.recompute = c.layout.recompute;
    const LogicalState ref = single_device(one);
    bool agree = false;
    const LogicalState got = test::layout_state(c, agree);
    INFO(describe(c));
    CHECK(agree);
    check_same_bits(ref, got);
    CHECK(got.history.size() == 5);
}

}  // namespace

TEST_CASE("llama: dp2 with ZeRO-3 and two microbatches is bit-identical", "[llama]") {
    Config c = llama_job();
    c.layout.dp = 2;
    c.layout.zero = 3;
    c.layout.microbatches = 2;
    check_llama(c);
    c.layout.zero = 1;
    c.model.tie_embeddings = true;
    check_llama(c);
}

TEST_CASE("llama: pp2 under 1f1b, gpipe and interleaved is bit-identical", "[llama]") {
    Config c = llama_job();
    c.layout.pp = 2;
    c.layout.microbatches = 2;
    for (const char* schedule : {"1f1b", "gpipe"}) {
        c.layout.schedule = schedule;
        check_llama(c);
    }
    c.model.layers = 4;
    c.layout.schedule = "interleaved";
    c.layout.virtual_stages = 2;
    check_llama(c);
    c.model.tie_embeddings = true;  // the tied head's gradient crosses the pipeline
    check_llama(c);
}

TEST_CASE("llama: cp2 ring and Ulysses, RoPE at the zig-zag chunks' positions", "[llama]") {
    for (const char* method : {"ring", "ulysses"}) {
        Config c = llama_job();
        c.layout.cp = 2;
        c.layout.cp_method = method;
        check_llama(c);
    }
}

TEST_CASE("llama: dp2 x pp2 with recompute, and multi-query attention", "[llama]") {
    Config c = llama_job();
    c.layout.dp = 2;
    c.layout.pp = 2;
    c.layout.microbatches = 2;
    c.layout.recompute = "full";
    check_llama(c);
    c = llama_job();
    c.model.kv_heads = 1;
    c.model.qk_norm = false;
    c.layout.dp = 2;
    check_llama(c);
}

TEST_CASE("llama: bf16 activations and fp8 (block) matmuls keep the same bits under dp2 and pp2",
          "[llama]") {
    for (const char* fp8 : {"off", "block"}) {
        Config c = llama_job();
        if (std::string(fp8) == "off") {
            c.precision.activations = "bf16";
        } else {  // both blocks' linears and the untied lm_head in fp8
            c.precision.fp8 = fp8;
            c.precision.fp8_keep_ends_bf16 = false;
            c.precision.fp8_lm_head = true;
        }
        c.layout.dp = 2;
        check_llama(c);
        c.layout.dp = 1;
        c.layout.pp = 2;
        c.layout.microbatches = 2;
        check_llama(c);
    }
}

TEST_CASE("llama: fp16 activations (loss scaling) keep the same bits under dp2, tp2 and pp2",
          "[llama]") {
    Config c = llama_job();
    c.precision.activations = "fp16";
    c.layout.dp = 2;
    check_llama(c);
    c.layout.dp = 1;
    c.layout.tp = 2;
    check_llama(c);
    c.layout.tp = 1;
    c.layout.pp = 2;
    c.layout.microbatches = 2;
    check_llama(c);
}

TEST_CASE("llama: tp2 splits the KV heads (kv_heads 2), tp2 and tp4 replicate them (1 and 2)",
          "[llama]") {
    for (int kv : {2, 1}) {
        Config c = llama_job();
        c.model.kv_heads = kv;
        c.layout.tp = 2;
        check_llama(c);
    }
    Config c = llama_job();
    c.layout.tp = 4;  // 2 KV heads over 4 ranks: every rank holds both, its query heads' sums
    check_llama(c);   // gathered
}

TEST_CASE("llama: tp with dp, pp, cp, ZeRO-3, a tied head, bf16 and fp8 (block)", "[llama]") {
    Config c = llama_job();
    c.layout.dp = 2;
    c.layout.tp = 2;
    c.layout.pp = 2;
    c.layout.microbatches = 2;
    check_llama(c);
    for (const char* method : {"ring", "ulysses"}) {
        c = llama_job();
        c.layout.cp = 2;
        c.layout.tp = 2;
        c.layout.cp_method = method;
        check_llama(c);
    }
    c = llama_job();
    c.model.tie_embeddings = true;
    c.layout.dp = 2;
    c.layout.tp = 2;
    c.layout.zero = 3;
    check_llama(c);
    c = llama_job();
    c.layout.tp = 2;
    c.precision.activations = "bf16";
    check_llama(c);
    c = llama_job();
    c.layout.tp = 2;
    c.precision.fp8 = "block";
    c.precision.fp8_keep_ends_bf16 = false;  // every block's linears in fp8 (the head's tiles
    c.precision.fp8_block_size = 16;         // may not span tp ranks' vocabulary: bf16)
    // k_proj's 16 rows over 2 ranks would cut a 16-tile between them: refused by key
    CHECK_THROWS_WITH(check_llama(c), Catch::Contains("model.kv_heads") &&
                                          Catch::Contains("precision.fp8_block_size = 16"));
    c.precision.fp8_block_size = 8;  // tiles of 8: each rank's 8 key/value rows whole
    check_llama(c);
    c.model.kv_heads = 1;  // one KV head, whole on both ranks
    check_llama(c);
}

// A Qwen3-MoE-shaped job: every layer MoE, four SwiGLU experts of 32 channels, top-2 with
// capacity 1 (tokens drop), one shared expert (DeepSeek's; Qwen3-MoE has none), token blocks
// of 16, both auxiliary losses.
Config llama_moe_job() {
    Config c = llama_job();
    c.model.moe_experts = 4;
    c.model.moe_top_k = 2;
    c.model.moe_ffn = 32;
    c.model.moe_capacity_factor = 1.0;
    c.model.moe_shared_experts = 1;
    c.model.moe_aux_loss = 0.01;
    c.model.moe_z_loss = 0.001;
    c.numerics.block = 16;
    return c;
}

TEST_CASE("llama MoE: SwiGLU experts are bit-identical under dp2, ep2, pp2 and recompute",
          "[llama]") {
    {  // the job does route and drop: a router statistic per MoE layer, some slots dropped
        test::ValueLog values;
        Job job(llama_moe_job());
        job.add_observer(&values);
        job.run();
        REQUIRE(values.got.count("moe.h.1.drop_fraction") == 1);
        double dropped = 0;
        for (double v : values.got["moe.h.0.drop_fraction"]) dropped += v;
        CHECK(dropped > 0);
    }
    Config c = llama_moe_job();
    c.layout.dp = 2;
    check_llama(c);
    c.layout.ep = 2;  // each rank holds two experts; rows cross the ep group both ways
    check_llama(c);
    c.layout.microbatches = 2;
    c.layout.recompute = "full";
    check_llama(c);
    c = llama_moe_job();
    c.layout.pp = 2;
    c.layout.microbatches = 2;
    check_llama(c);
    // Qwen3-MoE's own shape: no shared expert; here MoE every second layer (a dense SwiGLU MLP
    // of model.ffn beside them), untied head, under dp2·ep2
    c = llama_moe_job();
    c.model.moe_shared_experts = 0;
    c.model.moe_every = 2;
    c.layout.dp = 2;
    c.layout.ep = 2;
    check_llama(c);
}

TEST_CASE("llama: sequence parallelism (RMSNorms on a rank's tokens) under tp2, tp4, pp, cp",
          "[llama]") {
    for (int tp : {2, 4}) {  // KV heads split at tp2, whole (k, v's dX scattered by tokens) at tp4
        Config c = llama_job();
        c.layout.tp = tp;
        c.layout.sequence_parallel = true;
        check_llama(c);
    }
    Config c = llama_job();
    c.layout.dp = 2;
    c.layout.tp = 2;
    c.layout.pp = 2;
    c.layout.microbatches = 2;
    c.layout.sequence_parallel = true;
    check_llama(c);
    c = llama_job();
    c.layout.cp = 2;
    c.layout.tp = 2;
    c.layout.sequence_parallel = true;
    check_llama(c);
}

TEST_CASE("llama: a checkpoint resumes under another layout, bit-identical (HF names inside)",
          "[llama]") {
    struct Pair {
        int dp, tp, pp, zero;
        int dp2, tp2, pp2, zero2;
    };
    // dp2·tp2 (KV heads split) -> tp4 (KV heads whole); pp2 -> dp2·ZeRO-3; tp2·pp2 -> one device
    for (const Pair& p : {Pair{2, 2, 1, 0, 1, 4, 1, 0}, Pair{1, 1, 2, 0, 2, 1, 1, 3},
                          Pair{1, 2, 2, 0, 1, 1, 1, 0}}) {
        INFO("dp" << p.dp << " tp" << p.tp << " pp" << p.pp << " zero" << p.zero << " -> dp"
                  << p.dp2 << " tp" << p.tp2 << " pp" << p.pp2 << " zero" << p.zero2);
        Config c = llama_job();
        c.train.steps = 6;
        c.train.eval_every = 3;
        c.train.val_batches = 1;
        c.numerics.block = 4;  // tp4's shards of the 32 attention channels are whole blocks
        const LogicalState ref = single_device(c);
        const std::string dir = test::temp_dir("llama_resume");
        Config w = c;
        w.layout.dp = p.dp, w.layout.tp = p.tp, w.layout.pp = p.pp, w.layout.zero = p.zero;
        w.layout.microbatches = p.pp > 1 ? 2 : 0;
        w.checkpoint.dir = dir;
        w.checkpoint.every = 3;
        bool agree = false;
        test::layout_state(w, agree);
        const std::string ckpt = checkpoint_path(dir, 3);
        REQUIRE(std::filesystem::exists(ckpt));
        Config r = c;
        r.layout.dp = p.dp2, r.layout.tp = p.tp2, r.layout.pp = p.pp2, r.layout.zero = p.zero2;
        r.checkpoint.resume = ckpt;
        const LogicalState got = test::layout_state(r, agree);
        REQUIRE(got.history.size() == 6);
        check_same_bits(ref, got);
        const LogicalState last = read_checkpoint(checkpoint_path(dir, 6), c.model);
        CHECK(test::same_bits(ref.params, last.params));
    }
}

TEST_CASE("llama: the replica check, the spike guard and the FP8 monitor change no bit", "[llama]") {
    Config c = llama_job();
    c.layout.dp = 2;
    c.validate.replica_check_every = 1;
    c.precision.fp8 = "delayed";
    c.precision.fp8_keep_ends_bf16 = false;
    c.fp8_monitor.every = 1;
    c.spikes.action = "log";
    check_llama(c);
}

TEST_CASE("llama: impossible keys are refused naming them", "[llama]") {
    Config c = llama_moe_job();
    CHECK_NOTHROW(validate_config(c));
    c.precision.activations = "bf16";  // as for GPT-2: the experts' gathered matmuls are fp32
    CHECK_THROWS_WITH(validate_config(c), Catch::Contains("model.moe_experts") &&
                                              Catch::Contains("precision.activations"));
    c = llama_job();
    c.model.kv_heads = 3;
    CHECK_THROWS_WITH(validate_config(c),
                      Catch::Contains("model.kv_heads=3") && Catch::Contains("model.heads=4"));
    c = llama_job();
    c.model.head_dim = 7;
    CHECK_THROWS_WITH(validate_config(c), Catch::Contains("model.head_dim") && Catch::Contains("odd"));
}
