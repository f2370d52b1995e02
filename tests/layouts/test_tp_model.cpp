// Tensor parallelism applied to the whole model (core/parallel/tensor/tp_model.h) against the
// single-device run: 5 steps, then loss, grad norm and validation loss histories, every logical
// weight and every Adam moment compared bit for bit.
#include "core/base/config.h"
#include "core/comm/run_ranks.h"
#include "core/parallel/tensor/tp_model.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "core/io/state.h"
#include "tests/support/test_util.h"
#include "validators/validate.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using namespace px;

namespace {

using test::check_same_bits;
using test::series;
using test::single_device;

// Shapes whose tp shares are whole blocks of 16 for tp = 2 and 4 (tests/support/test_util.h).
Config tp_job() {
    Config c = test::with_tp_shapes(test::small_job());
    c.train.eval_every = 5;
    c.train.val_batches = 2;
    c.train.threads = 1;
    return c;
}

void check_layout(Config c, int dp, int tp, int zero = 0, int microbatches = 0, bool sp = false) {
    const LogicalState ref = single_device(c);
    c.layout.sequence_parallel = sp;
    c.layout.dp = dp;
    c.layout.tp = tp;
    c.layout.zero = zero;
    c.layout.microbatches = microbatches;
    LogicalState got;
    bool agree = true;
    int ranks = 0;
    run_layout(c, {}, test::inspecting([&](Job& job) {
        agree = absorb(got, job) && agree;
        ranks++;
    }));
    INFO("dp" << dp << " tp" << tp << " zero" << zero << " microbatches " << microbatches
              << (sp ? " +SP" : ""));
    CHECK(ranks == dp * tp);
    CHECK(agree);
    CHECK(got.complete());
    CHECK(ref.history.size() == 5);
    check_same_bits(ref, got);
}

}  // namespace

TEST_CASE("tp2 and tp4 are bit-identical to the single device") {
    check_layout(tp_job(), 1, 2);
    check_layout(tp_job(), 1, 4);
}

TEST_CASE("tp2 with two microbatches is bit-identical to the single device") {
    check_layout(tp_job(), 1, 2, 0, 2);
}

TEST_CASE("tp3 (whole blocks per rank, vocabulary cut unevenly) is bit-identical") {
    // C = 96 and F = 192 over 3 ranks: 32 and 64 per rank, whole blocks of 16; 6 heads, 2 per
    // rank. V = 80: 5 vocabulary blocks over 3 ranks, so the softmax sum needs the general
    // tree exchange.
    Config c = tp_job();
    c.model.hidden = 96;
    c.model.heads = 6;
    c.model.ffn = 192;
    c.model.vocab = 80;
    check_layout(c, 1, 3);
    check_layout(c, 2, 3, 2);
}

TEST_CASE("tp4 over a vocabulary of two blocks: ranks without vocabulary rows still train") {
    Config c = tp_job();
    c.model.vocab = 32;  // blocks [0,16) and [16,32): ranks 2 and 3 hold no rows of wte
    check_layout(c, 1, 4);
}

TEST_CASE("dp2 x tp2 is bit-identical to the single device, every ZeRO stage") {
    for (int zero : {0, 1, 2, 3}) check_layout(tp_job(), 2, 2, zero);
}

TEST_CASE("dp2 x tp2 with microbatches, and dp2 x tp4 under ZeRO-3, are bit-identical") {
    check_layout(tp_job(), 2, 2, 1, 2);
    check_layout(tp_job(), 2, 4, 3, 2);
}

TEST_CASE("sequence parallelism: tp2+SP and tp4+SP are bit-identical to the single device") {
    check_layout(tp_job(), 1, 2, 0, 0, true);
    check_layout(tp_job(), 1, 4, 0, 0, true);
}

TEST_CASE("sequence parallelism: dp2 x tp2+SP, with microbatches and ZeRO, is bit-identical") {
    check_layout(tp_job(), 2, 2, 0, 0, true);
    check_layout(tp_job(), 2, 2, 1, 2, true);
    // Token slices that are not tree nodes: tp3 over 4 token blocks per microbatch.
    Config c = tp_job();
    c.model.hidden = 96;
    c.model.heads = 6;
    c.model.ffn = 192;
    c.model.vocab = 80;
    c.model.seq_len = 16;
    check_layout(c, 1, 3, 0, 2, true);
}

TEST_CASE("dp3 x tp, with and without SP, over replicas whose tokens are not tree nodes") {
    // Batch 6 of 32 tokens in blocks of 16: 12 blocks, replica 1 owns [4,8), not a node; each
    // node's weight gradients are taken over its rows (under SP the tp ranks' token slices
    // inside each node combine in the node's tree; some ranks hold none of a node).
    Config c = tp_job();
    c.train.batch_size = 6;
    check_layout(c, 3, 2);
    check_layout(c, 3, 2, 3, 2);
    check_layout(c, 3, 4, 0, 0, true);
    check_layout(c, 3, 2, 2, 2, true);
}

TEST_CASE("layout.sequence_parallel needs whole token blocks per tp rank") {
    Config c = tp_job();
    c.layout.tp = 4;
    c.layout.sequence_parallel = true;
    c.train.batch_size = 1;
    c.model.seq_len = 32;  // 32 tokens = 2 blocks of 16 for 4 ranks
    CHECK_THROWS_WITH(run_layout(c, {}), Catch::Contains("layout.sequence_parallel") &&
                                             Catch::Contains("numerics.block"));
}

TEST_CASE("a precision the tensor-parallel layers do not carry is refused before allocating") {
    // The tp:: routines compute in fp32 and carry fp32, bf16 and fp16 activations by widening
    // them; fp8 needs scales, so its activations are refused by name, on every rank, when the
    // model is made.
    const Config c = tp_job();
    const Numerics nx = make_numerics(c.numerics);
    const ModelPart whole = ModelPart::whole(c.model);
    std::vector<std::string> errors(2);
    comm::run_ranks(2, 20, [&](comm::Communicator& tp) {
        auto layers = std::make_shared<TpLayers>(tp, nx, c.model);
        CHECK(layers->carries(DType::f32));
        CHECK(layers->carries(DType::bf16));
        CHECK_FALSE(layers->carries(DType::e4m3));
        try {
            GPT model(c.model, nx, whole, layers, DType::e4m3);
        } catch (const ConfigError& e) {
            errors[static_cast<size_t>(tp.rank())] = e.what();
        }
    });
    for (const std::string& e : errors) {
        CHECK(e.find("precision.activations") != std::string::npos);
        CHECK(e.find("e4m3") != std::string::npos);
    }
}

TEST_CASE("the initial tp shards are the slices of the single device's initialisation") {
    Config c = tp_job();
    c.train.steps = 0;
    c.train.eval_every = 0;
    const LogicalState ref = single_device(c);
    c.layout.tp = 4;
    LogicalState got;
    bool agree = true;
    run_layout(c, {}, test::inspecting([&](Job& job) { agree = absorb(got, job) && agree; }));
    CHECK(agree);
    CHECK(test::same_bits(ref.params, got.params));
}

namespace {
std::vector<char> file_bytes(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(f), {});
}
}  // namespace

TEST_CASE("llm.c checkpoints: tp2 exports the single device's file and starts from one") {
    const std::string dir = test::temp_dir("tp_model_llmc");
    Config c = tp_job();
    c.model.ffn = 256;  // the llm.c format needs ffn = 4·hidden; 128 per rank, whole blocks
    c.output.export_llmc = dir + "/single.bin";
    single_device(c);
    c.layout.tp = 2;
    c.output.export_llmc = dir + "/tp2.bin";
    run_layout(c, {});
    const std::vector<char> a = file_bytes(dir + "/single.bin"), b = file_bytes(dir + "/tp2.bin");
    CHECK(!a.empty());
    CHECK(test::same_bits(a, b));

    Config d = tp_job();
    d.model.ffn = 256;
    d.model.init_from = dir + "/single.bin";
    check_layout(d, 1, 2);
}

// A matrix shard of one row (one ffn column, one vocabulary row per rank) is still a matrix: a
// rank holding a single MLP column once had its (1, C) weight taken for a vector of C, computed
// nothing and diverged at the first op. The smallest shapes the layout check accepts, with
// numerics.block = 1, must match the single device bit for bit.
TEST_CASE("shards of one row (one ffn column, one head, one channel per rank) are exact") {
    struct Case {
        const char* what;
        i64 hidden, heads, ffn;
        const char* layout;
    };
    for (const Case k : {Case{"tp2, ffn = 2", 32, 4, 2, "tp2"},
                         Case{"tp3, ffn = 3, three heads", 24, 3, 3, "tp3"},
                         Case{"tp4, C = F = 4", 4, 4, 4, "tp4"},
                         Case{"dp2 × tp4 × ZeRO-3, C = F = 4", 4, 4, 4, "dp2xtp4xz3"},
                         Case{"one device, ffn = 1", 32, 4, 1, "dp2"}}) {
        DYNAMIC_SECTION(k.what) {
            Config c = test::small_job();
            c.model.hidden = k.hidden;
            c.model.heads = k.heads;
            c.model.ffn = k.ffn;
            c.numerics.block = 1;
            c.train.steps = 2;
            const ValidationReport rep = validate_layouts(c, {parse_layout(k.layout)}, 2);
            REQUIRE(rep.layouts.size() == 1);
            INFO(rep.table());
            CHECK(rep.layouts[0].verdict == "match");
        }
    }
}
