#include "core/train/runner.h"

#include "core/comm/run_ranks.h"
#include "core/comm/mpi.h"
#include "core/train/memory.h"
#include "core/base/error.h"
#include "core/train/rank_guards.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace px {

int world_size(const LayoutConfig& layout) {
    return layout.dp * layout.pp * layout.cp * layout.tp;  // < 2^31: validate_config
}

namespace {

// A cgroup's CPU quota in cores, rounded up; 0 when it has none. v2: "<quota|max> <period>" in
// cpu.max of the process's cgroup (the path after "0::" in /proc/self/cgroup, or the namespace's
// root); v1: cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us.
int cgroup_quota_cores() {
    auto quota_of = [](double quota, double period) {
        return quota > 0 && period > 0 ? static_cast<int>(std::ceil(quota / period)) : 0;
    };
    std::vector<std::string> v2 = {"/sys/fs/cgroup/cpu.max"};
    std::ifstream self("/proc/self/cgroup");
    for (std::string line; std::getline(self, line);)
        if (line.rfind("0::", 0) == 0 && line.size() > 4)
            v2.insert(v2.begin(), "/sys/fs/cgroup" + line.substr(3) + "/cpu.max");
    for (const std::string& path : v2) {
        std::ifstream f(path);
        std::string quota;
        double period = 0;
        if (f >> quota >> period) {
            if (quota == "max") return 0;
            return quota_of(std::strtod(quota.c_str(), nullptr), period);
        }
    }
    std::ifstream q("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), p("/sys/fs/cgroup/cpu/cpu.cfs_period_us");
    double quota = -1, period = 0;
    if (q >> quota && p >> period) return quota_of(quota, period);
    return 0;
}

}  // namespace

int usable_cores() {
    int n = static_cast<int>(std::thread::hardware_concurrency());
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
    if (const int quota = cgroup_quota_cores(); quota > 0) n = std::min(n, quota);
    return std::max(1, n);
}

int threads_per_rank(const Config& cfg, int ranks_on_node) {
    if (cfg.train.threads > 0) return static_cast<int>(cfg.train.threads);
    return std::max(1, usable_cores() / std::max(1, ranks_on_node));
}

RunHooks chain(const RunHooks& first, RunHooks then) {
    auto both = [](const std::function<void(Job&)>& a, std::function<void(Job&)> b) {
        if (!a) return b;
        if (!b) return a;
        return std::function<void(Job&)>([a, b](Job& job) {
            a(job);
            b(job);
        });
    };
    then.setup = both(first.setup, std::move(then.setup));
    then.each_step = both(first.each_step, std::move(then.each_step));
    then.inspect = both(first.inspect, std::move(then.inspect));
    if (first.wrap_group) then.wrap_group = first.wrap_group;
    if (first.wrap_ep_group) then.wrap_ep_group = first.wrap_ep_group;
    return then;
}

void Cancel::check() const {
    if (requested && requested()) throw Cancelled("cancelled by the caller after a step");
}

RunHooks Cancel::hooks() const {
    RunHooks h;
    if (requested) h.each_step = [c = *this](Job&) { c.check(); };
    return h;
}

RankRun::RankRun(const Config& cfg, comm::Communicator& world,
                 const std::vector<Observer*>& observers, const RunHooks& hooks)
    : hooks_(hooks) {
    // 1. A process of an MPI launch holds one rank; the ranks on its node share the memory.
    if (comm::launched_by_mpi()) check_memory(cfg, MemoryScope::one_rank, comm::local_ranks());
    // 2. The layout checks itself once: products, divisibility, token-tree nodes (mesh.h).
    const Layout layout = make_layout(cfg);
    const Mesh mesh(layout);
    const int n = layout.world_size();
    if (world.size() != n)
        throw ConfigError("the world has " + std::to_string(world.size()) +
                          " ranks but the layout needs layout.dp × layout.pp × layout.cp × "
                          "layout.tp = " +
                          std::to_string(layout.dp) + " × " + std::to_string(layout.pp) + " × " +
                          std::to_string(layout.cp) + " × " +
                          std::to_string(layout.tp) + " = " + std::to_string(n) +
                          "; start it with `mpirun -np " + std::to_string(n) +
                          "`, or change the layout so that the product is " +
                          std::to_string(world.size()));
    // 3. Groups: a pp group per (replica, context rank, tp rank) (pipeline order: the same tp
    //    rank of every stage), a dp group per (stage, cp rank, tp rank), a cp group per (stage,
    //    replica, tp rank), a tp group per (stage, replica, cp rank): Megatron's order, tp
    //    innermost (mesh.h). With cp > 1 also the data group (dp × cp of a stage and tp rank).
    //    Every rank splits every dimension (a collective); a group of one is dropped.
    const int r = world.rank();
    const Coord at = mesh.coord_of(r);
    const MeshDim dims[4] = {MeshDim::pp, MeshDim::dp, MeshDim::tp, MeshDim::cp};
    for (int d = 0; d < 4; d++) {
        if (mesh.size(dims[d]) == 1) continue;
        group_[d] = world.split(mesh.group_color(dims[d], r), at[dims[d]], dim_name(dims[d]));
        if (hooks.wrap_group) group_[d] = hooks.wrap_group(dims[d], std::move(group_[d]));
    }
    if (layout.cp > 1)
        data_ = world.split(mesh.data_color(r), mesh.data_index(r), "data");
    //    With ep > 1 the ep groups (consecutive dp ranks) and, when dp > ep, the expert-data
    //    groups (the dp ranks holding the same experts).
    if (layout.ep > 1) {
        ep_ = world.split(mesh.ep_color(r), at.dp % layout.ep, "ep");
        if (hooks.wrap_ep_group) ep_ = hooks.wrap_ep_group(std::move(ep_));
        if (layout.dp > layout.ep)
            expert_data_ = world.split(mesh.expert_data_color(r), at.dp / layout.ep, "edp");
    }
    // 4. The rank's job.
    job_ = std::make_unique<Job>(cfg, layout,
                                 RankGroups{&world, group_[0].get(), group_[1].get(),
                                            group_[2].get(), group_[3].get(), data_.get(),
                                            ep_.get(), expert_data_.get()});
    // 5.-6. Checkpoints (resume from the logical state any layout wrote, save every N steps)
    //    and faults (the injector, the replica check), rank_guards.h.
    guards_ = std::make_unique<RankGuards>(cfg, world, *job_);
    job_->set_after_step([this](Job& j) {
        if (guards_->after_step(j) && hooks_.each_step) hooks_.each_step(j);
    });
    if (r == 0)
        for (Observer* o : observers) job_->add_observer(o);
}

RankRun::~RankRun() = default;

void RankRun::run() {
    if (hooks_.setup) hooks_.setup(*job_);
    job_->run();
    if (hooks_.inspect) {
        job_->unshard();  // collective: before any rank's turn at inspect
        hooks_.inspect(*job_);
    }
}

void run_rank(const Config& cfg, comm::Communicator& world, const std::vector<Observer*>& observers,
              const RunHooks& hooks) {
    RankRun rank(cfg, world, observers, hooks);
    rank.run();
}

Layout make_in_process_layout(const Config& cfg) {
    // A process starts only so many threads (libgomp ends the process when it cannot).
    const int n = world_size(cfg.layout);
    const i64 threads = static_cast<i64>(n) * threads_per_rank(cfg, n);
    if (threads > kMaxThreadsPerProcess)
        throw ConfigError(cfg.source_name + ": layout.dp × layout.pp × layout.cp × layout.tp = " +
                          std::to_string(n) + " ranks run as threads of this process, each with " +
                          std::to_string(threads / n) + " OpenMP threads (train.threads = " +
                          std::to_string(cfg.train.threads) + "): " + std::to_string(threads) +
                          " threads, more than the " + std::to_string(kMaxThreadsPerProcess) +
                          " one process may start; lower train.threads (0 shares the cores out "
                          "among the ranks) or the layout, or run the ranks as processes under "
                          "mpirun");
    check_memory(cfg, MemoryScope::process);  // every rank fits, before anything is allocated
    return make_layout(cfg);
}

void run_layout(const Config& cfg, const std::vector<Observer*>& observers, const RunHooks& hooks) {
    const Layout layout = make_in_process_layout(cfg);  // before any thread starts
    const int n = layout.world_size();
    // 1. Ranks: threads; the cores are shared out so that the ranks together use them once.
    Config rank_cfg = cfg;
    rank_cfg.train.threads = threads_per_rank(cfg, n);
    std::mutex inspect_mutex;
    RunHooks rank_hooks = hooks;
    if (hooks.inspect)
        rank_hooks.inspect = [&](Job& job) {
            std::lock_guard<std::mutex> lock(inspect_mutex);
            hooks.inspect(job);
        };
    comm::run_ranks(n, cfg.layout.timeout_s, [&](comm::Communicator& world) {
        run_rank(rank_cfg, world, observers, rank_hooks);
    });
}

}  // namespace px
