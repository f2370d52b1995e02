// What the workbench measures of a running job from outside it: a decorator around every
// rank's groups (RunHooks::wrap_group, the door a tracer uses) records each collective and
// message with its start and end, and step hooks mark each step's start and time each forward
// and backward of a microbatch (StepHooks::compute, around the stage's work), so the pipeline
// panel draws a measured timeline and the memory panel reads bytes and time per collective and
// group, and every rank's memory after its step (a rank is its world rank: cp and ep ranks too).
// The library knows nothing of it; the job pays one short lock per collective and per
// microbatch's forward or backward.
//
// Index
//   CommEvent       one collective or message of one rank: group, op, bytes, start, end
//   ComputeSpan     one forward or backward of one microbatch (and chunk) of one rank
//   RankStep        one rank's last complete step: its start, end, events and compute spans
//   CommTrace       the recorder: hooks() for a run; last_steps() and stat_rows() to read
//   Timeline, measured_timeline   one step of every rank as bars: each microbatch's forward and
//                   backward as measured, the waits in its receives, its sends, its dp/tp
//                   collectives; idle is what no bar covers
#pragma once
#include "core/comm/comm.h"
#include "core/parallel/mesh.h"
#include "core/train/runner.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace px::views {

struct CommEvent {
    MeshDim dim = MeshDim::dp;  // the group it ran in (ep: dp, whose ranks it reuses)
    const char* group = "dp";   // its name: "pp", "dp", "cp", "tp" or "ep"
    comm::Op op = comm::Op::barrier;
    bool async = false;     // posted with start(): t1 is the post, not the completion
    i64 bytes = 0;          // this rank's sent + received (comm::traffic)
    double t0 = 0, t1 = 0;  // seconds since the rank's step began
};

struct ComputeSpan {
    bool forward = true;    // else a backward (or B)
    bool weight = false;    // W of a zero-bubble schedule (forward false)
    int microbatch = 0;     // of this dp rank's share of the step
    int chunk = 0;          // the model chunk (interleaved schedules: virtual stages)
    double t0 = 0, t1 = 0;  // seconds since the rank's step began
};

struct RankStep {
    i64 step = 0;                      // 0: none complete yet
    double start = 0;                  // seconds since the trace was made, when the step began
    double seconds = 0;                // from the step's start to its update
    std::vector<CommEvent> events;     // in issue order
    std::vector<ComputeSpan> compute;  // in the order the schedule ran them
    MemoryStats memory;                // the rank's memory after the step (Job::memory)
};

class CommTrace {
public:
    explicit CommTrace(const Mesh& mesh);
    // The hooks a run needs (setup marks steps, wrap_group and wrap_ep_group wrap the groups);
    // the trace must outlive the run's ranks.
    RunHooks hooks();
    // Every world rank's last complete step (copies, under the trace's lock).
    std::vector<RankStep> last_steps() const;
    // Bytes and seconds per group and op, summed over the run, of every rank (StatsBook rows).
    std::vector<comm::StatRow> stat_rows() const;
    // Every world rank's memory after its last complete step; empty until each rank has one.
    std::vector<MemoryStats> memory() const;
    const Mesh& mesh() const { return mesh_; }

private:
    friend class TracingGroup;
    using Clock = std::chrono::steady_clock;
    struct Rank {
        Clock::time_point start{};
        i64 step = 0;
        std::vector<CommEvent> current;
        std::vector<ComputeSpan> spans;  // the current step's, the last one still open
        RankStep last;
        std::vector<std::shared_ptr<comm::StatsBook>> books;
    };
    void record(int world_rank, const CommEvent& e, Clock::time_point t0, Clock::time_point t1);
    std::unique_ptr<comm::Communicator> wrap(std::unique_ptr<comm::Communicator> g, MeshDim d,
                                             const char* name);

    Mesh mesh_;
    Clock::time_point made_ = Clock::now();
    mutable std::mutex mu_;
    std::vector<Rank> ranks_;
};

struct TimelineBar {
    enum Kind { forward, backward, recv_wait, send, collective, weight };  // weight: W
    int lane = 0;  // index into Timeline::lanes
    double t0 = 0, t1 = 0;
    Kind kind = forward;
    int microbatch = -1;
    std::string label;
};

struct Timeline {
    std::vector<std::string> lanes;  // "rank 0: pp0 dp0 tp0", ("cp1" too when cp > 1)
    std::vector<int> lane_pp;        // each lane's pipeline stage
    std::vector<TimelineBar> bars;
    i64 step = 0;         // the step measured
    double makespan = 0;  // seconds from the first rank's step start to the last compute's end
    double bubble = -1;   // 1 - compute time / (lanes · makespan); -1: not measured
    std::string problem;  // why there is no timeline ("" when there is)
};

// Which ranks get a lane.
enum class TimelineRanks {
    all,           // every world rank, in world-rank order
    first_replica  // dp rank 0, tp rank 0 of every stage
};

// The last complete step of the chosen ranks, as measured: each forward and backward of a
// microbatch from its ComputeSpan, each pipeline message from its recorded send or receive (a
// receive's bar is the time waited in it), the dp and tp collectives as bars of their own. The
// ranks' clocks are the trace's, so lanes line up when every rank's last step is the same step
// (else each lane starts at its own step's start). pp = 1 is one stage: the same forward,
// backward and collectives without messages. The collectives of the ep group show as "ep".
Timeline measured_timeline(const Mesh& mesh, const std::vector<RankStep>& steps,
                           TimelineRanks ranks = TimelineRanks::all);

}  // namespace px::views
