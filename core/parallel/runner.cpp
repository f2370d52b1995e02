#include "core/parallel/runner.h"

#include "core/comm/inproc.h"
#include "core/parallel/mesh.h"
#include "core/parallel/pipeline.h"
#include "core/error.h"

#include <omp.h>

#include <algorithm>
#include <mutex>
#include <thread>

namespace px {

int world_size(const LayoutConfig& layout) { return layout.dp * layout.pp * layout.tp; }

namespace {

void refuse_unavailable(const LayoutConfig& l) {
    if (l.tp > 1)
        throw ConfigError("layout.tp = " + std::to_string(l.tp) +
                          ": tensor parallelism is not in this build yet; use layout.tp = 1 "
                          "(data parallelism with ZeRO 0-3 and pipeline parallelism are available)");
    if (l.pp > 1)
        throw ConfigError("layout.pp = " + std::to_string(l.pp) +
                          ": pipeline parallelism is not in this build yet; use layout.pp = 1 "
                          "(data parallelism with ZeRO 0-3 and pipeline parallelism are available)");
}

}  // namespace

void run_layout(const Config& cfg, const std::vector<Observer*>& observers,
                const std::function<void(Job&)>& inspect) {
    const LayoutConfig& l = cfg.layout;
    // The layout checks itself first: products, divisibility, token-tree nodes (mesh.h).
    const Layout layout = make_layout(cfg);
    refuse_unavailable(l);
    const int n = layout.world_size();
    if (l.pp > 1) {  // 4. pipeline parallelism: stages of layers, a schedule of actions
        run_pipeline(cfg, observers);
        return;
    }

    // 1. Ranks: threads; the cores are shared out so that the ranks together use them once.
    const int threads = cfg.train.threads > 0
                            ? static_cast<int>(cfg.train.threads)
                            : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / n);
    Config rank_cfg = cfg;
    rank_cfg.train.threads = threads;

    std::mutex inspect_mutex;
    comm::run_ranks(n, l.timeout_s, [&](comm::Communicator& world) {
        // 2. Data parallelism: with tp = pp = 1 the whole world is the dp group.
        ReplicaContext replica{&world, l.zero, layout.algo};
        Job job(rank_cfg, replica);
        if (world.rank() == 0)
            for (Observer* o : observers) job.add_observer(o);
        job.run();
        if (inspect) {
            std::lock_guard<std::mutex> lock(inspect_mutex);
            inspect(job);
        }
    });
}

}  // namespace px
