// Pipeline schedules (docs/layouts.md): plain functions that produce, for every pipeline rank,
// the list of actions it executes in order. The runtime executes the lists (one thread or
// process per rank), the workbench and `parallax schedule` draw them, and check_schedule
// simulates them to prove they are complete and cannot deadlock.
//
// Index
//   ScheduleKind, schedule_name, parse_schedule   gpipe | 1f1b | interleaved, and their names
//   Action, action_text                           one step of one rank; "recv_act(m=1, chunk 0)
//   from rank 0" Schedule                                      per pp rank, its actions in
//   execution order stage_of, rank_of_stage, chunk_of_stage       virtual stage k = chunk · pp +
//   rank gpipe                                         all forwards, then all backwards one_f_one_b
//   warm-up forwards, one forward / one backward, cool-down interleaved_1f1b 1F1B over v model
//   chunks per rank (Megatron) make_schedule                                 by kind; throws
//   ConfigError naming layout keys message_tag                                   a tag unique to
//   each message of a step SimOptions, SimResult, check_schedule         unit-time simulation:
//   deadlock, missing or
//                                                 duplicate work, dependencies, makespan, bubble
//   to_text, actions_text                         per-rank timeline grid ("F0 F1 B0 ..."); raw
//   lists
//
// The pipeline. The model's layers are cut into S = pp · v contiguous virtual stages; virtual
// stage k is model chunk c = k / pp of pp rank p = k % pp (v = 1: stage p is rank p). Forward
// runs k = 0 .. S-1 (stage 0 embeds the tokens), the loss sits at the end of stage S-1, and
// backward runs k = S-1 .. 0. With v > 1 the activation leaving rank pp-1 goes back to rank 0
// for its next chunk.
//
// What an action means (the contract with the runtime):
//   forward(m, c)     run chunk c on microbatch m. Its input: the tokens (virtual stage 0), the
//                     activation of an earlier recv_act(m, c) on this rank, or, when the previous
//                     virtual stage is on this rank (pp = 1), the output of forward(m, c-1).
//   backward(m, c)    the backward of chunk c for microbatch m: needs this rank's forward(m, c)
//                     (its saved, or recomputed, activations) and the gradient of its output:
//                     from the loss (last virtual stage), an earlier recv_grad(m, c), or a local
//                     backward(m, c+1) (pp = 1).
//   send_act(m, c)    send the output of forward(m, c) to `peer`, the rank of the next virtual
//                     stage. POSTED ASYNCHRONOUSLY (Communicator::send_async): it never blocks the
//                     list. The runtime keeps the handle and waits for it before the buffer is
//                     reused, at the latest at the end of the step.
//   recv_act(m, c)    blocking receive (Communicator::recv) of the input of forward(m, c) from
//                     `peer`, the rank of the previous virtual stage.
//   send_grad(m, c)   send the input gradient of backward(m, c) to the previous stage's rank
//                     (asynchronously, as send_act).
//   recv_grad(m, c)   blocking receive of the output gradient of backward(m, c) from the next
//                     stage's rank.
// A recv sits right before the compute that consumes it, a send right after the compute that
// produces it. `chunk` is always this rank's own chunk; `peer` is a pp rank (0 .. pp-1), which
// Mesh maps to a world rank.
//
// Why sends are asynchronous. Communicator::send is a rendezvous (it returns when the receiver
// has the data, like NCCL). With blocking sends 1F1B deadlocks in its steady state: stage s sends
// the activation of microbatch m+1 to stage s+1 while s+1 sends the gradient of m to s, and each
// waits for the other to post its recv (check_schedule with SimOptions::rendezvous shows it).
// Megatron avoids this by batching each send with the following recv (batch_isend_irecv); posting
// every send asynchronously and receiving in list order is the same remedy, one action at a time.
// With asynchronous sends a list can only block in a recv, and a recv only waits for a send that
// follows the compute it depends on, so no deadlock is possible when the dependencies are acyclic
// — which check_schedule verifies by running the lists.
//
// Message order. On each channel (source rank, destination rank, activation or gradient) the
// receiver's recvs come in the order of the sender's sends (check_schedule verifies it), so a
// runtime may use one tag per channel; message_tag gives each message its own tag as well.
#pragma once
#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

namespace px {

// ---- kinds -----------------------------------------------------------------------------------

enum class ScheduleKind : std::uint8_t { gpipe, one_f_one_b, interleaved };
const char* schedule_name(ScheduleKind kind);          // "gpipe", "1f1b", "interleaved"
ScheduleKind parse_schedule(const std::string& name);  // inverse; ConfigError naming the key

// ---- actions ---------------------------------------------------------------------------------

struct Action {
    enum Kind : std::uint8_t { forward, backward, send_act, recv_act, send_grad, recv_grad };
    Kind kind = forward;
    int microbatch = 0;  // 0 .. microbatches-1, within this dp rank's share of the step
    int chunk = 0;       // this rank's model chunk, 0 .. v-1 (virtual stage chunk · pp + rank)
    int peer = -1;       // send/recv: the other pp rank; compute: -1

    bool is_compute() const { return kind == forward || kind == backward; }
    bool is_send() const { return kind == send_act || kind == send_grad; }
    bool is_recv() const { return kind == recv_act || kind == recv_grad; }
    bool operator==(const Action&) const = default;
};
inline constexpr const char* kActionNames[] = {"forward",  "backward",  "send_act",
                                               "recv_act", "send_grad", "recv_grad"};
static_assert(std::size(kActionNames) == Action::recv_grad + 1,
              "kActionNames and Action::Kind are out of sync");

// "forward(m=2, chunk 0)", "send_act(m=2, chunk 0) to rank 1", for messages.
std::string action_text(const Action& a);

// ---- schedules -------------------------------------------------------------------------------

struct Schedule {
    ScheduleKind kind = ScheduleKind::one_f_one_b;
    int pp = 1;                              // pipeline ranks
    int microbatches = 1;                    // per step (on each dp rank)
    int virtual_stages = 1;                  // v, model chunks per rank
    std::vector<std::vector<Action>> ranks;  // ranks[p]: rank p's actions, in execution order

    int num_stages() const { return pp * virtual_stages; }  // S, virtual stages
};

// clang-format off
inline int stage_of(int rank, int chunk, int pp) { return chunk * pp + rank; }
inline int rank_of_stage(int stage, int pp) { return stage % pp; }
inline int chunk_of_stage(int stage, int pp) { return stage / pp; }
// clang-format on

// Each takes pp >= 1 and microbatches >= 1 (interleaved: v >= 1 and microbatches a multiple of
// pp) and throws ConfigError otherwise. The result includes the sends and recvs.
Schedule gpipe(int pp, int microbatches);
Schedule one_f_one_b(int pp, int microbatches);
Schedule interleaved_1f1b(int pp, int microbatches, int virtual_stages);
Schedule make_schedule(ScheduleKind kind, int pp, int microbatches, int virtual_stages = 1);

// The tag of the message a send or recv action moves: equal on both sides, distinct for every
// message of one step (it encodes direction, microbatch and receiving virtual stage).
int message_tag(const Schedule& s, int rank, const Action& a);

// ---- simulation ------------------------------------------------------------------------------

struct SimOptions {
    int forward_slots = 1;    // time of one forward of one chunk
    int backward_slots = 1;   // time of one backward of one chunk (recompute: add a forward)
    bool rendezvous = false;  // sends block until the peer's recv is posted (blocking send)
};

struct SimResult {
    std::string problem;  // "" when the schedule is correct; else one sentence saying what fails
    bool ok() const { return problem.empty(); }
    int makespan = 0;   // slots until the last rank finishes (communication takes no time)
    double bubble = 0;  // idle fraction: 1 - busy slots / (pp · makespan)
    // Per rank: the most (microbatch, chunk) forwards that were waiting for their backward.
    std::vector<int> peak_in_flight;
    // Per rank, per action: the slot it started in (-1: never ran).
    std::vector<std::vector<int>> start;
};

// Runs every rank's list in order under the rules above (recv blocks until the matching send
// was posted; compute takes its slots; communication none) and checks: every rank runs the
// forward and the backward of every (microbatch, chunk) exactly once; every message the pipeline
// needs is sent and received exactly once, between the right ranks, in channel order; no compute
// runs before its inputs exist; and the lists finish (no deadlock). With unit slots GPipe and
// 1F1B take 2(m + pp - 1) slots: bubble (pp-1)/(m+pp-1).
SimResult check_schedule(const Schedule& s, const SimOptions& opt = {});

// The simulated timeline as a grid, one row per rank, one column per slot:
//     1f1b, pp=2, microbatches=2: 6 slots, bubble 33.3%
//     rank 0 | F0 F1 .  B0 .  B1
//     rank 1 | .  F0 B0 F1 B1 .
// Cells: F<m> / B<m> (with v > 1 the chunk as a letter: F3a, F3b, ...), "." idle; a compute of
// several slots continues with "=". A schedule that fails check_schedule is shown as its lists,
// after the problem.
std::string to_text(const Schedule& s, const SimOptions& opt = {});
// Each rank's list, communication included: "rank 0: F0 >A0:1 F1 >A1:1 <G0:1 B0 ..." where
// >A0:1 sends microbatch 0's activation to rank 1 and <G0:1 receives its gradient from rank 1.
std::string actions_text(const Schedule& s);

}  // namespace px
