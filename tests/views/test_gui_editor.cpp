// The job bar's config editor without a window (views/config_editor.h): an error is the
// library's message beside the key it names, every bad key has its message at once and a fixed
// one loses it, every key a panel tells the user to set is offered, and the llama block's keys
// are offered and marked ignored while model.arch is gpt2; and the Events panel's
// folding of repeats (views/spike_model.h).
#include "views/config_editor.h"
#include "views/spike_model.h"
#include "tests/support/test_util.h"

#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

using namespace px;
using namespace px::views;
using namespace px::test;

TEST_CASE("Config editor: an error is the library's message, beside the key it names", "[gui]") {
    ConfigEditor e(small_job());
    REQUIRE(e.field("layout.tp"));
    CHECK(e.field("layout.tp")->text == "1");
    CHECK(e.build().has_value());

    e.set("layout.tp", "3");
    CHECK(!e.build().has_value());
    CHECK(e.field("layout.tp")->error.find("layout.tp") != std::string::npos);
    CHECK(e.field("model.heads")->error.empty());

    e.set("layout.tp", "1");
    e.set("model.hidden", "abc");
    CHECK(!e.build().has_value());
    CHECK(e.field("model.hidden")->error.find("model.hidden") != std::string::npos);
    CHECK(e.field("layout.tp")->error.empty());

    e.set("model.hidden", "64");
    e.set("model.ffn", "128");
    e.set("layout.tp", "2");
    e.set("numerics.block", "16");
    const std::optional<Config> c = e.build();
    INFO(e.general_error());
    REQUIRE(c.has_value());
    CHECK(c->layout.tp == 2);
    CHECK(!e.has_error());
}

TEST_CASE("Config editor: every bad key has its message at once; a fixed one loses it",
          "[gui][editor]") {
    ConfigEditor e(small_job());
    e.set("model.hidden", "abc");
    e.set("train.lr", "-1");
    e.set("layout.schedule", "foo");
    e.set("spikes.action", "zz");
    CHECK(!e.build().has_value());
    CHECK(e.error_count() == 4);
    for (const char* key : {"model.hidden", "train.lr", "layout.schedule", "spikes.action"}) {
        const std::string& msg = e.field(key)->error;
        INFO(key << ": " << msg);
        // One form: the problem, naming its key, without the "--set ...:" or "<source>:" prefix.
        CHECK(msg.rfind(key, 0) == 0);
        CHECK(msg.find("--set") == std::string::npos);
        CHECK(msg.find("more problem") == std::string::npos);
    }
    CHECK(e.field("model.hidden")->error.find("abc") != std::string::npos);
    CHECK(e.general_error().empty());

    e.set("model.hidden", "32");  // fixed: its message goes, the others stay
    CHECK(!e.build().has_value());
    CHECK(e.field("model.hidden")->error.empty());
    CHECK(e.error_count() == 3);

    // A layout problem is judged with the edits that are fine: tp = 3 does not divide 4 heads.
    e.set("layout.tp", "3");
    CHECK(!e.build().has_value());
    CHECK(e.error_count() == 4);
    CHECK(e.field("layout.tp")->error.rfind("layout.tp=3 does not divide model.heads=4", 0) == 0);
    // Keys that must agree are judged together (model.heads=8 with model.hidden=64, either order).
    for (const char* k : {"train.lr", "layout.schedule", "spikes.action", "layout.tp"})
        e.set(k, e.field(k)->base);
    e.set("model.heads", "8");
    e.set("model.hidden", "64");
    e.set("model.ffn", "128");
    e.set("numerics.block", "16");
    const std::optional<Config> c = e.build();
    INFO(e.general_error());
    REQUIRE(c.has_value());
    CHECK(c->model.heads == 8);
    CHECK(e.error_count() == 0);
}

TEST_CASE("Config editor: every key a panel tells the user to set is offered", "[gui][editor]") {
    // The panels' "set X" hints: panel_fp8 (precision.fp8, fp8_monitor.every), panel_spikes and
    // the loss panel (spikes.action), router_view (model.moe_experts, moe_top_k, moe_every).
    ConfigEditor e(small_job());
    for (const char* key : {"precision.fp8", "fp8_monitor.every", "spikes.action",
                            "model.moe_experts", "model.moe_top_k", "model.moe_every"}) {
        INFO(key);
        REQUIRE(e.field(key));
        CHECK(e.field(key)->text == value_text(small_job(), key));
    }
    CHECK(e.field("precision.fp8")->text == "off");
    e.set("precision.fp8", "delayed");
    e.set("fp8_monitor.every", "1");
    e.set("spikes.action", "log");
    CHECK(!e.build().has_value());  // fp8 needs bf16 activations; the monitor, fp8
    CHECK(e.field("precision.fp8")->error.find("precision.activations") != std::string::npos);
    CHECK(!e.field("fp8_monitor.every")->error.empty());
    e.set("precision.activations", "bf16");
    const std::optional<Config> c = e.build();
    INFO(e.general_error());
    REQUIRE(c.has_value());
    CHECK(c->precision.fp8 == "delayed");
    CHECK(c->fp8_monitor.every == 1);
    CHECK(c->spikes.action == "log");
}

TEST_CASE("Events: repeats of one kind at one step fold into one line", "[gui][events]") {
    std::vector<RunEvent> ev;
    ev.push_back({10, EventKind::checkpoint, "checkpoint at step 10", {}});
    for (int i = 0; i < 12; i++) {
        const std::string after = std::to_string(31 + i);
        ev.push_back({31, EventKind::rerun, "step 31 was run again after step " + after, {}});
    }
    ev.push_back({31, EventKind::fault, "replica check failed", {}});
    ev.push_back({32, EventKind::rerun, "step 32 was run again after step 33", {}});
    const std::vector<EventLine> lines = fold_events(ev);
    REQUIRE(lines.size() == 4);
    CHECK(lines[0].count == 1);
    CHECK(lines[0].last.empty());
    CHECK(lines[1].step == 31);
    CHECK(lines[1].kind == EventKind::rerun);
    CHECK(lines[1].count == 12);
    CHECK(lines[1].index == 1);
    CHECK(lines[1].first == "step 31 was run again after step 31");
    CHECK(lines[1].last == "step 31 was run again after step 42");
    CHECK(lines[2].kind == EventKind::fault);
    CHECK(lines[2].index == 13);
    CHECK(lines[3].step == 32);  // another step: a line of its own
    CHECK(fold_events({}).empty());
}

TEST_CASE("Config editor: cp, its attention and ep are keys; ep needs experts", "[gui]") {
    ConfigEditor e(small_job());
    REQUIRE(e.field("layout.cp"));
    REQUIRE(e.field("layout.ep"));
    REQUIRE(e.field("model.moe_ffn"));
    CHECK(e.field("layout.cp_method")->text == "ring");  // a string, without quotes
    e.set("layout.cp", "2");
    e.set("layout.cp_method", "ulysses");
    e.set("numerics.block", "16");
    std::optional<Config> c = e.build();
    INFO(e.general_error());
    REQUIRE(c.has_value());
    CHECK(c->layout.cp == 2);
    CHECK(c->layout.cp_method == "ulysses");

    e.set("layout.cp", "1");
    e.set("layout.dp", "2");
    e.set("layout.ep", "2");  // a dense model: no experts to share out
    CHECK(!e.build().has_value());
    CHECK(e.field("layout.ep")->error.find("layout.ep") != std::string::npos);

    e.set("model.moe_experts", "4");
    e.set("model.moe_top_k", "2");
    e.set("model.moe_ffn", "32");
    c = e.build();
    INFO(e.general_error());
    REQUIRE(c.has_value());
    CHECK(c->layout.ep == 2);
    CHECK(c->model.moe_ffn == 32);
    CHECK(!e.has_error());
}

TEST_CASE("Config editor: the llama block's keys are offered, ignored while arch is gpt2",
          "[gui][editor]") {
    ConfigEditor e(small_job());
    const char* llama_keys[] = {"model.kv_heads",
                                "model.head_dim",
                                "model.norm_eps",
                                "model.rope_theta",
                                "model.rope_factor",
                                "model.rope_low_freq_factor",
                                "model.rope_high_freq_factor",
                                "model.rope_original_max_positions",
                                "model.tie_embeddings",
                                "model.qk_norm"};
    REQUIRE(e.field("model.arch"));
    CHECK(e.field("model.arch")->text == "gpt2");  // a string, without quotes
    CHECK(!e.field("model.arch")->llama_only);
    CHECK(!e.ignored(*e.field("model.arch")));
    for (const char* key : llama_keys) {
        INFO(key);
        REQUIRE(e.field(key));
        CHECK(e.field(key)->text == value_text(small_job(), key));
        CHECK(e.field(key)->llama_only);  // from the registry's "llama:" sentence
        CHECK(e.field(key)->doc.rfind("llama:", 0) == 0);
        CHECK(e.ignored(*e.field(key)));
    }
    CHECK(!e.field("model.heads")->llama_only);
    CHECK(!e.field("model.heads")->doc.empty());
    CHECK(e.field("model.tie_embeddings")->text == "false");

    // The llama keys are contiguous after the sizes, so the panel can fold them as one group.
    const std::vector<EditorField>& f = e.fields();
    size_t first = f.size(), last = 0;
    for (size_t i = 0; i < f.size(); i++)
        if (f[i].llama_only) first = std::min(first, i), last = std::max(last, i);
    CHECK(last - first + 1 == std::size(llama_keys));

    // Typed arch = llama: the keys count, and a GQA job builds from the editor alone.
    e.set("model.arch", "llama");
    for (const char* key : llama_keys) CHECK(!e.ignored(*e.field(key)));
    e.set("model.kv_heads", "2");
    e.set("model.qk_norm", "true");
    e.set("model.rope_theta", "10000");
    e.set("model.ffn", "64");
    e.set("layout.tp", "2");
    e.set("numerics.block", "8");  // a tp rank's 1 KV head of 8 channels is one block
    std::optional<Config> c = e.build();
    INFO(e.general_error());
    REQUIRE(c.has_value());
    CHECK(c->model.llama());
    CHECK(c->model.kv_heads == 2);
    CHECK(c->model.qk_norm);
    CHECK(c->model.rope_theta == 10000);
    // A bad llama key gets its message beside it, as every key does.
    e.set("model.kv_heads", "3");
    CHECK(!e.build().has_value());
    CHECK(e.field("model.kv_heads")->error.find("model.kv_heads") != std::string::npos);
    e.set("model.arch", "bert");
    e.set("model.kv_heads", "2");
    CHECK(!e.build().has_value());
    CHECK(e.field("model.arch")->error.find("model.arch") != std::string::npos);
}
