// The memory estimate (core/train/memory.h) against what the ranks of a run hold, and the check
// that refuses a job too big for its budget before anything is allocated, naming the key.
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/train/job.h"
#include "core/train/memory.h"
#include "core/train/runner.h"
#include "core/train/stepped_run.h"
#include "tests/support/test_util.h"

#include <catch2/catch.hpp>

#include <mutex>
#include <string>

using namespace px;
using Catch::Matchers::Contains;

namespace {

Config job() {
    Config c = test::small_job();
    c.train.steps = 1;
    c.train.eval_every = 0;
    c.train.threads = 1;
    c.output.run_file = false;
    return c;
}

double item(const MemoryEstimate& e, const std::string& what) {
    for (const MemoryItem& i : e.items)
        if (i.what == what) return i.bytes;
    FAIL("no item " << what);
    return 0;
}

// What the ranks of the run hold after a step, summed over them (Job::memory: measured).
MemoryStats measured(const Config& c) {
    MemoryStats sum;
    std::mutex m;
    run_layout(c, {}, test::inspecting([&](Job& job) {
                   const MemoryStats s = job.memory();
                   std::lock_guard<std::mutex> lock(m);
                   sum.params += s.peak_params;
                   sum.grads += s.peak_grads;
                   sum.optimizer += s.optimizer;
                   sum.activations += s.activations;
               }));
    return sum;
}

std::string error_of(const Config& c, MemoryScope scope = MemoryScope::process) {
    try {
        check_memory(c, scope);
    } catch (const ConfigError& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("the estimate follows what the ranks of a layout hold", "[memory]") {
    struct Layout {
        const char* name;
        int dp, pp, tp, zero, microbatches;
        const char* schedule;
        int ep = 1;
    };
    const Layout layouts[] = {
        {"single device", 1, 1, 1, 0, 1, "1f1b"},  {"dp2", 2, 1, 1, 0, 1, "1f1b"},
        {"dp2 zero1", 2, 1, 1, 1, 1, "1f1b"},      {"dp2 zero3 mb2", 2, 1, 1, 3, 2, "1f1b"},
        {"dp2 mb4", 2, 1, 1, 0, 4, "1f1b"},        {"pp2 1f1b mb4", 1, 2, 1, 0, 4, "1f1b"},
        {"pp2 gpipe mb4", 1, 2, 1, 0, 4, "gpipe"}, {"tp2", 1, 1, 2, 0, 1, "1f1b"},
        {"dp2 ep2", 2, 1, 1, 0, 1, "1f1b", 2},     {"dp4 ep4 mb2", 4, 1, 1, 0, 2, "1f1b", 4},
        {"dp2 ep2 tp2", 2, 1, 2, 0, 1, "1f1b", 2},  {"dp4 ep2 zero1", 4, 1, 1, 1, 1, "1f1b", 2},
        {"pp2 zb-h1 mb4", 1, 2, 1, 0, 4, "zb-h1"}, {"pp2 zbv mb4", 1, 2, 1, 0, 4, "zbv"},
    };
    // The dense model under every layout but ep, and a MoE one (4 experts, top-2, a shared
    // expert, MoE every 2nd layer) under every layout.
    std::vector<std::pair<bool, Layout>> runs;
    for (const Layout& l : layouts)
        if (l.ep == 1) runs.push_back({false, l});
    for (const Layout& l : layouts) runs.push_back({true, l});
    for (const auto& [moe, l] : runs) {
        Config c = job();
        if (moe) {
            c.model.moe_experts = 4;
            c.model.moe_top_k = 2;
            c.model.moe_ffn = 64;
            c.model.moe_shared_experts = 1;
            c.model.moe_every = 2;
        }
        c.numerics.block = 8;  // tp2 gives each rank whole blocks of hidden and ffn
        c.layout.dp = l.dp;
        c.layout.pp = l.pp;
        c.layout.tp = l.tp;
        c.layout.zero = l.zero;
        c.layout.microbatches = l.microbatches;
        c.layout.schedule = l.schedule;
        c.layout.ep = l.ep;
        if (std::string(l.schedule) == "zbv") c.model.layers = 4;  // 2 × pp chunks
        const MemoryEstimate e = estimate_memory(c, MemoryScope::process);
        const MemoryStats m = measured(c);
        INFO((moe ? "MoE " : "") << l.name << ": estimated weights " << item(e, "weights")
                                 << ", gradients " << item(e, "gradients") << ", moments "
                                 << item(e, "AdamW moments") << ", activations "
                                 << item(e, "activations") << "; measured " << m.params << ", "
                                 << m.grads << ", " << m.optimizer << ", " << m.activations);
        CHECK(e.ranks == l.dp * l.pp * l.tp);
        // Each part within a factor of two of what the ranks hold (the estimate leaves out
        // alignment and counts a ZeRO-3 step's gathered weights, which are mapped only while it
        // runs), and the whole no less than the parts measured.
        auto near = [](double est, double got) { return est >= 0.5 * got && est <= 2.0 * got; };
        CHECK(near(item(e, "weights"), double(m.params)));
        CHECK(near(item(e, "gradients"), double(m.grads)));
        CHECK(near(item(e, "AdamW moments"), double(m.optimizer)));
        CHECK(near(item(e, "activations"), double(m.activations)));
        CHECK(e.total >= 0.9 * double(m.params + m.grads + m.optimizer + m.activations));
    }
}

TEST_CASE("a job over its budget is refused naming the key and a value that fits", "[memory]") {
    Config c = job();
    c.train.max_memory_gib = 1;
    const double budget = 1024.0 * 1024 * 1024;
    CHECK(error_of(c).empty());  // the small job fits a GiB

    SECTION("train.batch_size = 1e8") {
        c.train.batch_size = 100000000;
        const std::string err = error_of(c);
        CHECK_THAT(err, Contains("train.batch_size = 100000000 makes it too big") &&
                            Contains("train.max_memory_gib = 1") && Contains("activations") &&
                            Contains(c.source_name));
        // The value it names is the largest that fits.
        const auto at = err.find("train.batch_size <= ");
        REQUIRE(at != std::string::npos);
        const i64 fits = std::stoll(err.substr(at + 20));
        Config ok = c;
        ok.train.batch_size = fits;
        CHECK(estimate_memory(ok, MemoryScope::process).total <= budget);
        ok.train.batch_size = fits + 1;
        CHECK(estimate_memory(ok, MemoryScope::process).total > budget);
    }
    SECTION("train.val_batches = 1e9, with validation on") {
        c.train.val_batches = 1000000000;
        c.train.eval_every = 1;
        CHECK_THAT(error_of(c), Contains("train.val_batches = 1000000000 makes it too big") &&
                                    Contains("validation losses"));
        c.train.eval_every = 0;  // never validated: nothing held
        CHECK(error_of(c).empty());
    }
    SECTION("model.layers") {
        c.model.layers = 10000000;
        CHECK_THAT(error_of(c), Contains("model.layers = 10000000 makes it too big") &&
                                    Contains("weights") && Contains("AdamW moments"));
    }
    SECTION("replicas in one process add up; a process of one rank holds one") {
        c.layout.dp = 4;
        c.train.max_memory_gib = 1.5 * estimate_memory(c, MemoryScope::one_rank).total / budget;
        CHECK_THAT(error_of(c), Contains("4 ranks"));
        CHECK(error_of(c, MemoryScope::one_rank).empty());
    }
    SECTION("no single key is enough") {
        c.train.max_memory_gib = 1e-5;
        CHECK_THAT(error_of(c), Contains("would not fit"));
    }
}

TEST_CASE("training refuses a job too big before it allocates anything", "[memory]") {
    Config c = job();
    c.train.batch_size = 100000000;  // terabytes of activations: refused whatever the machine
    c.train.max_memory_gib = 0;      // the machine's own budget
    try {
        run_layout(c);
        FAIL("a job of terabytes ran");
    } catch (const ConfigError& e) {
        CHECK_THAT(std::string(e.what()),
                   Contains("train.batch_size = 100000000 makes it too big") &&
                       (Contains("MemAvailable") || Contains("cgroup")));
    }
    CHECK_THROWS_AS(Job(c), ConfigError);  // the single-device job too
}

TEST_CASE("a stepped run (the Python module's) is refused the same way, before any thread starts",
          "[memory]") {
    Config c = job();
    c.train.batch_size = 100000000;
    CHECK_THROWS_WITH(SteppedRun(c), Contains("train.batch_size = 100000000 makes it too big"));
    c = job();
    c.layout.dp = 8;
    c.train.threads = 1024;  // 8 ranks of 1024 threads
    CHECK_THROWS_WITH(SteppedRun(c), Contains("8192 threads") && Contains("train.threads = 1024"));
}

TEST_CASE("memory_budget: the key, else what the machine reports", "[memory]") {
    Config c = job();
    c.train.max_memory_gib = 2.5;
    MemoryBudget b = memory_budget(c);
    CHECK(b.bytes == 2.5 * 1024 * 1024 * 1024);
    CHECK(b.source == "train.max_memory_gib = 2.5");
    c.train.max_memory_gib = 0;
    b = memory_budget(c);
    CHECK(b.bytes > 0);
    CHECK((b.source.find("MemAvailable") != std::string::npos ||
           b.source.find("cgroup") != std::string::npos));
    const MemoryBudget shared = memory_budget(c, 4);
    CHECK(shared.bytes <= b.bytes / 4 * 1.01);  // the machine may have freed memory meanwhile
    CHECK_THAT(shared.source, Contains("4 processes"));
}

TEST_CASE("format_bytes", "[memory]") {
    CHECK(format_bytes(512) == "512 B");
    CHECK(format_bytes(1536) == "1.5 KiB");
    CHECK(format_bytes(3.0 * 1024 * 1024 * 1024) == "3 GiB");
}
