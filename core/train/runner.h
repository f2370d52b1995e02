// Running a job under its layout: on in-process ranks (threads sharing memory), or as this
// process's rank of an MPI world (core/comm/mpi.h; `mpirun -np N parallax train`).
//
// Index
//   world_size        dp × pp × tp of a config's layout
//   usable_cores      the cores this process may run on: its affinity mask, under its cgroup's
//                     CPU quota
//   threads_per_rank  OpenMP threads of one rank: train.threads, else the usable cores shared out
//   RunHooks          what a caller does with each rank's job: setup, each step, inspect, and
//                     decorators around the rank's groups
//   chain             two RunHooks as one (a caller's decorators around a harness's hooks)
//   Cancel            a caller's request to stop long work after a step (throws Cancelled)
//   RankRun           one rank's part of a run, held: its groups and job outlive the run
//   run_rank          one rank's part of a run, on whatever communicator it is given
//   run_layout        trains a config on its in-process ranks; observers see rank 0
//
// Parallelism is applied in fixed steps, each commented where it happens:
//   1. ranks: one thread per rank of the mesh (run_layout), or one process per rank (MPI), with
//      the OpenMP threads divided among the ranks of a node;
//   2. the layout: made and validated once (mesh.h make_layout), then only read;
//   3. groups: the world splits into pipeline, data- and tensor-parallel groups by the mesh's
//      colors (a group of one is none);
//   4. the rank's job (core/train/job.h): its stage's layers (pipeline parallelism, pipeline.h), cut
//      over its tp group (tensor parallelism, tp_model.h), one replica of its dp group (data
//      parallelism: a canonical all-reduce of the gradients, or ZeRO, zero.h), executing its
//      pipeline rank's schedule;
//   5. checkpoints: resume from the logical state, save every N steps (checkpointing.h);
//   6. faults: the fault injector and the replica check of silent data corruption (faults.h);
//      5 and 6 together: RankGuards (rank_guards.h).
#pragma once
#include "core/comm/comm.h"
#include "core/base/config.h"
#include "core/train/job.h"
#include "core/parallel/mesh.h"

#include <functional>
#include <memory>
#include <vector>

namespace px {

class PipelineJob;
class RankGuards;

int world_size(const LayoutConfig& layout);  // dp × pp × tp of a config's layout

// Threads one process may run: its in-process ranks times their OpenMP threads (run_layout
// refuses more, naming train.threads and the layout, before starting any).
inline constexpr i64 kMaxThreadsPerProcess = 4096;

// The CPUs in this thread's affinity mask (taskset, srun's CPU binding, a cpuset), capped by
// the CPU quota of the process's cgroup rounded up (a container's --cpus: cgroup v2 cpu.max or
// v1 cfs_quota_us / cfs_period_us); at least 1. More threads than this only queue behind each
// other at every barrier.
int usable_cores();

// train.threads when set, else the usable cores divided by the ranks on this node (at least 1):
// the ranks of a node together use its cores once.
int threads_per_rank(const Config& cfg, int ranks_on_node);

// What a caller does with each rank's job, on that rank's thread; every member may be empty.
struct RunHooks {
    // Before the first step (after a resume): probes, step hooks (Job::add_step_hooks).
    std::function<void(Job&)> setup;
    // After each step and its checkpoint (not after a step the replica check re-runs): every
    // rank calls it at the same step, so collectives are allowed (parallax validate gathers
    // the logical state there).
    std::function<void(Job&)> each_step;
    // After the last step and Job::unshard (collective), so each rank holds its whole state;
    // run_layout calls it one rank at a time (tests read every rank's weights and moments).
    std::function<void(Job&)> inspect;
    // A group as the rank's job will use it, given the group the mesh made (a tracer, a test's
    // planted bug around the collectives); empty: the group as it is. Groups of one rank are
    // not made, so never wrapped.
    std::function<std::unique_ptr<comm::Communicator>(MeshDim, std::unique_ptr<comm::Communicator>)>
        wrap_group;
    // The same for the ep group (layout.ep > 1), which is not a mesh dimension of its own.
    std::function<std::unique_ptr<comm::Communicator>(std::unique_ptr<comm::Communicator>)>
        wrap_ep_group;
};

// `first`'s hooks run before `then`'s at each point; the group decorator is first's.
RunHooks chain(const RunHooks& first, RunHooks then);

// A caller's way to stop long work (validate_layouts, record_trace) between steps: the work asks
// `requested` after every step of every run it makes, on the thread that runs the step (a rank's
// thread under a layout: several at once, so it must be thread-safe), and throws Cancelled when it
// answers true. Under a layout the rank that sees it first leaves and the others' collectives fail
// at once; run_layout then throws the Cancelled (comm::cause_of). Empty: never asked.
struct Cancel {
    std::function<bool()> requested;
    void check() const;      // throws Cancelled when requested() is true
    RunHooks hooks() const;  // each_step: check() (empty hooks when nothing is asked)
};

// One rank's part of training cfg, as run_rank runs it, in two parts: the constructor makes the
// layout, the rank's groups, its job and its guards (steps 2-6 below: a resume happens here),
// run() calls hooks.setup, trains and inspects. A caller that holds it keeps the job and its
// groups alive after run() returns or throws (core/train/stepped_run.h, whose callers may still
// be reading the job's memory).
class RankRun {
public:
    RankRun(const Config& cfg, comm::Communicator& world, const std::vector<Observer*>& observers,
            const RunHooks& hooks = {});
    ~RankRun();
    RankRun(const RankRun&) = delete;
    RankRun& operator=(const RankRun&) = delete;
    Job& job() { return *job_; }
    void run();

private:
    RunHooks hooks_;
    std::unique_ptr<comm::Communicator> group_[4];  // pp, dp, tp, cp; null: a group of one
    std::unique_ptr<comm::Communicator> data_;      // dp × cp when cp > 1 (RankGroups::data)
    std::unique_ptr<comm::Communicator> ep_, expert_data_;  // ep > 1 (RankGroups::ep, ...)
    std::unique_ptr<Job> job_;
    std::unique_ptr<RankGuards> guards_;
};

// One rank's part of training cfg: `world` is this rank's world communicator (a thread under
// comm::run_ranks, or this process under MPI) and must have the layout's dp × pp × tp ranks,
// else a ConfigError naming both numbers. cfg.train.threads is this rank's OpenMP threads (see
// threads_per_rank). `observers` are attached on world rank 0 only.
void run_rank(const Config& cfg, comm::Communicator& world, const std::vector<Observer*>& observers,
              const RunHooks& hooks = {});

// The layout of a run on in-process ranks, made (make_layout) once the process is known to hold
// them: ConfigError, naming the keys, when the ranks' threads would be more than
// kMaxThreadsPerProcess or the memory estimate more than the budget (core/train/memory.h).
// run_layout and SteppedRun call it before any thread starts or anything is allocated.
Layout make_in_process_layout(const Config& cfg);

// Trains cfg for train.steps steps on the layout's dp × pp × tp in-process ranks. `observers`
// receive rank 0's metrics.
void run_layout(const Config& cfg, const std::vector<Observer*>& observers = {},
                const RunHooks& hooks = {});

}  // namespace px
