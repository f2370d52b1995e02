// What the workbench measures of a running job from outside it: a decorator around every
// rank's groups (RunHooks::wrap_group, the door a tracer uses) records each collective and
// message with its start and end, and step hooks mark each step's start, so the pipeline panel
// draws a measured timeline and the memory panel reads bytes and time per collective and group.
// The library knows nothing of it; the job pays one short lock per collective.
//
// Index
//   CommEvent       one collective or message of one rank: group, op, bytes, start, end
//   RankStep        one rank's last complete step: its start, end and events
//   CommTrace       the recorder: hooks() for a run; last_steps() and stat_rows() to read
//   Timeline, measured_timeline   one step of each pipeline rank as bars: compute between its
//                   messages, the waits in its receives, its dp/tp collectives
#pragma once
#include "core/comm/comm.h"
#include "core/parallel/mesh.h"
#include "core/train/runner.h"

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace px::gui {

struct CommEvent {
    MeshDim dim = MeshDim::dp;  // the group it ran in
    comm::Op op = comm::Op::barrier;
    bool async = false;     // posted with start(): t1 is the post, not the completion
    i64 bytes = 0;          // this rank's sent + received (comm::traffic)
    double t0 = 0, t1 = 0;  // seconds since the rank's step began
};

struct RankStep {
    i64 step = 0;                   // 0: none complete yet
    double seconds = 0;             // from the step's start to its update
    std::vector<CommEvent> events;  // in issue order
};

class CommTrace {
public:
    explicit CommTrace(const Mesh& mesh);
    // The hooks a run needs (setup marks steps, wrap_group wraps every group); the trace must
    // outlive the run's ranks.
    RunHooks hooks();
    // Every world rank's last complete step (copies, under the trace's lock).
    std::vector<RankStep> last_steps() const;
    // Bytes and seconds per group and op, summed over the run, of every rank (StatsBook rows).
    std::vector<comm::StatRow> stat_rows() const;
    const Mesh& mesh() const { return mesh_; }

private:
    friend class TracingGroup;
    using Clock = std::chrono::steady_clock;
    struct Rank {
        Clock::time_point start{};
        i64 step = 0;
        std::vector<CommEvent> current;
        RankStep last;
        std::vector<std::shared_ptr<comm::StatsBook>> books;
    };
    void record(int world_rank, const CommEvent& e, Clock::time_point t0, Clock::time_point t1);

    Mesh mesh_;
    mutable std::mutex mu_;
    std::vector<Rank> ranks_;
};

struct TimelineBar {
    enum Kind { forward, backward, recv_wait, send, collective };
    int lane = 0;  // the pp rank
    double t0 = 0, t1 = 0;
    Kind kind = forward;
    int microbatch = -1;
    std::string label;
};

struct Timeline {
    std::vector<std::string> lanes;  // "pp0 (rank 0)", ...
    std::vector<TimelineBar> bars;
    i64 step = 0;         // the step measured
    double makespan = 0;  // seconds from the step's start to the last compute's end
    double bubble = -1;   // 1 - compute time / (pp · makespan); -1: not measured
    std::string problem;  // why there is no timeline ("" when there is)
};

// The last complete step of dp rank 0, tp rank 0 of every pipeline stage, laid out along its
// schedule (Mesh::schedule): each send and receive is a recorded message, and each forward or
// backward runs from the end of the action before it to the start of the next message (or the
// first collective after it, or the step's update).
Timeline measured_timeline(const Mesh& mesh, const std::vector<RankStep>& steps);

}  // namespace px::gui
