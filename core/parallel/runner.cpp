#include "core/parallel/runner.h"

#include "core/comm/inproc.h"
#include "core/error.h"
#include "core/parallel/mesh.h"
#include "core/parallel/pipeline.h"
#include "core/parallel/rank_guards.h"

#include <omp.h>

#include <algorithm>
#include <mutex>
#include <string>
#include <thread>

namespace px {

int world_size(const LayoutConfig& layout) {
    return layout.dp * layout.pp * layout.tp;
}

int threads_per_rank(const Config& cfg, int ranks_on_node) {
    if (cfg.train.threads > 0) return static_cast<int>(cfg.train.threads);
    const int hw = static_cast<int>(std::thread::hardware_concurrency());
    return std::max(1, hw / std::max(1, ranks_on_node));
}

void run_rank(const Config& cfg, comm::Communicator& world, const std::vector<Observer*>& observers,
              const std::function<void(Job&)>& inspect,
              const std::function<void(PipelineJob&)>& inspect_stage,
              const std::function<void(Job&)>& each_step,
              const std::function<void(PipelineJob&)>& each_stage_step,
              const std::function<void(Job&)>& setup,
              const std::function<void(PipelineJob&)>& setup_stage) {
    const LayoutConfig& l = cfg.layout;
    // The layout checks itself first: products, divisibility, token-tree nodes (mesh.h).
    const Layout layout = make_layout(cfg);
    const int n = layout.world_size();
    if (world.size() != n)
        throw ConfigError(
            "the world has " + std::to_string(world.size()) +
            " ranks but the layout needs layout.dp × layout.pp × layout.tp = " +
            std::to_string(l.dp) + " × " + std::to_string(l.pp) + " × " + std::to_string(l.tp) +
            " = " + std::to_string(n) + "; start it with `mpirun -np " + std::to_string(n) +
            "`, or change the layout so that the product is " + std::to_string(world.size()));
    if (l.pp > 1) {  // 4. pipeline parallelism: stages of layers, a schedule of actions (with
                     //    dp and tp inside, run_pipeline_rank splits the groups)
        run_pipeline_rank(cfg, world, observers, inspect_stage, each_stage_step, setup_stage);
        return;
    }
    // 2. Data parallelism: with tp = pp = 1 the whole world is the dp group.
    ReplicaContext replica{&world, l.zero, layout.algo};
    // 5. Tensor parallelism: the world splits into tp groups (neighbouring ranks, Mesh's
    //    colors) and dp groups across them; each replica is a tp group holding one shard of
    //    the model per rank (tp_model.h), and its gradients combine over the dp group.
    std::unique_ptr<comm::Communicator> dp_group, tp_group;
    if (l.tp > 1) {
        const Mesh mesh(layout);
        const int r = world.rank();
        const Coord c = mesh.coord_of(r);
        dp_group = world.split(mesh.group_color(MeshDim::dp, r), c.dp, "dp");
        tp_group = world.split(mesh.group_color(MeshDim::tp, r), c.tp, "tp");
        replica.dp = dp_group.get();
        replica.tp = tp_group.get();
    }
    Job job(cfg, replica);
    // 6.-7. Checkpoints (resume from the logical state any layout wrote, save every N steps)
    //    and faults (the injector, the replica check), rank_guards.h.
    RankGuards guards(cfg, world, job);
    if (setup) setup(job);
    job.set_after_step([&](Job& j) {
        if (guards.after_step(j) && each_step) each_step(j);
    });
    if (world.rank() == 0)
        for (Observer* o : observers) job.add_observer(o);
    job.run();
    if (inspect) inspect(job);
}

void run_layout(const Config& cfg, const std::vector<Observer*>& observers,
                const std::function<void(Job&)>& inspect,
                const std::function<void(Job&)>& each_step,
                const std::function<void(PipelineJob&)>& each_stage_step,
                const std::function<void(Job&)>& setup,
                const std::function<void(PipelineJob&)>& setup_stage) {
    const Layout layout = make_layout(cfg);  // validates before any thread starts
    if (cfg.layout.pp > 1) {
        run_pipeline(cfg, observers, {}, each_stage_step, setup_stage);
        return;
    }
    const int n = layout.world_size();
    // 1. Ranks: threads; the cores are shared out so that the ranks together use them once.
    Config rank_cfg = cfg;
    rank_cfg.train.threads = threads_per_rank(cfg, n);
    std::mutex inspect_mutex;
    comm::run_ranks(n, cfg.layout.timeout_s, [&](comm::Communicator& world) {
        run_rank(
            rank_cfg, world, observers,
            [&](Job& job) {
                if (!inspect) return;
                std::lock_guard<std::mutex> lock(inspect_mutex);
                inspect(job);
            },
            {}, each_step, {}, setup);
    });
}

}  // namespace px
