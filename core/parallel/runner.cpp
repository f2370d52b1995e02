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

void run_layout(const Config& cfg, const std::vector<Observer*>& observers,
                const std::function<void(Job&)>& inspect) {
    const LayoutConfig& l = cfg.layout;
    // The layout checks itself first: products, divisibility, token-tree nodes (mesh.h).
    const Layout layout = make_layout(cfg);
    const int n = layout.world_size();
    if (l.pp > 1) {  // 4. pipeline parallelism: stages of layers, a schedule of actions (with
                     //    dp and tp inside, run_pipeline splits the groups)
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
    const Mesh mesh(layout);
    comm::run_ranks(n, l.timeout_s, [&](comm::Communicator& world) {
        // 2. Data parallelism: with tp = pp = 1 the whole world is the dp group.
        ReplicaContext replica{&world, l.zero, layout.algo};
        // 5. Tensor parallelism: the world splits into tp groups (neighbouring ranks, Mesh's
        //    colors) and dp groups across them; each replica is a tp group holding one shard of
        //    the model per rank (tp_model.h), and its gradients combine over the dp group.
        std::unique_ptr<comm::Communicator> dp_group, tp_group;
        if (l.tp > 1) {
            const int r = world.rank();
            const Coord c = mesh.coord_of(r);
            dp_group = world.split(mesh.group_color(MeshDim::dp, r), c.dp, "dp");
            tp_group = world.split(mesh.group_color(MeshDim::tp, r), c.tp, "tp");
            replica.dp = dp_group.get();
            replica.tp = tp_group.get();
        }
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
