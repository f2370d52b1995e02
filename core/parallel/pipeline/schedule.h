// Pipeline schedules (docs/layouts.md): plain functions that produce, for every pipeline rank,
// the list of actions it executes in order. The runtime executes the lists (one thread or
// process per rank), the workbench and `parallax schedule` draw them, and check_schedule
// simulates them to prove they are complete and cannot deadlock.
//
// Index
//   ScheduleKind, schedule_name, parse_schedule   gpipe | 1f1b | interleaved | zb-h1 | zbv
//   Placement, placement_of, splits_backward      looped or V-shaped stages; B/W split or not
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
// Zero-bubble schedules (Qi et al., arXiv 2401.10241) split a backward in two actions:
//   backward_input(m, c)   B: the input gradient (what the previous stage waits for), with the
//                          same inputs as backward; its weight-gradient half is kept for W.
//   backward_weight(m, c)  W: the weight gradients of (m, c), from what B kept; after B on this
//                          rank, anywhere later in its list. Nothing is sent for W.
// A schedule uses either backward or B and W (splits_backward). W being deferred changes when
// a weight gradient is computed, never its value: a microbatch's weight gradients combine in the
// token tree whatever order they arrive in (core/parallel/data/token_tree.h).
//
// Placement. Looped (every schedule but zbv): virtual stage k = chunk · pp + rank. V-shaped
// (zbv, two chunks): chunk 0 runs down the ranks, chunk 1 back up: stage k is on rank k for
// k < pp and on rank 2pp-1-k after, so the last stage (the loss) is on rank 0, next to the first.
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

enum class ScheduleKind : std::uint8_t { gpipe, one_f_one_b, interleaved, zb_h1, zbv };
inline constexpr ScheduleKind kScheduleKinds[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b,
                                                  ScheduleKind::interleaved, ScheduleKind::zb_h1,
                                                  ScheduleKind::zbv};
const char* schedule_name(ScheduleKind kind);  // "gpipe", "1f1b", "interleaved", "zb-h1", "zbv"
ScheduleKind parse_schedule(const std::string& name);  // inverse; ConfigError naming the key

enum class Placement : std::uint8_t { looped, vee };
inline Placement placement_of(ScheduleKind k) {
    return k == ScheduleKind::zbv ? Placement::vee : Placement::looped;
}
// Whether the schedule runs B and W apart (backward_input, backward_weight).
inline bool splits_backward(ScheduleKind k) {
    return k == ScheduleKind::zb_h1 || k == ScheduleKind::zbv;
}
// Model chunks per rank the schedule needs: zbv two; interleaved at least two; others one.
int chunks_required(ScheduleKind k);  // 0: any count >= 2 (interleaved)

// ---- actions ---------------------------------------------------------------------------------

struct Action {
    enum Kind : std::uint8_t {
        forward,
        backward,
        send_act,
        recv_act,
        send_grad,
        recv_grad,
        backward_input,   // B of a zero-bubble schedule
        backward_weight,  // W of a zero-bubble schedule
    };
    Kind kind = forward;
    int microbatch = 0;  // 0 .. microbatches-1, within this dp rank's share of the step
    int chunk = 0;       // this rank's model chunk, 0 .. v-1 (virtual stage chunk · pp + rank)
    int peer = -1;       // send/recv: the other pp rank; compute: -1

    bool is_compute() const {
        return kind == forward || kind == backward || kind == backward_input ||
               kind == backward_weight;
    }
    // A backward that computes the input gradient (and sends it back): backward or B.
    bool is_input_backward() const { return kind == backward || kind == backward_input; }
    bool is_send() const { return kind == send_act || kind == send_grad; }
    bool is_recv() const { return kind == recv_act || kind == recv_grad; }
    bool operator==(const Action&) const = default;
};
inline constexpr const char* kActionNames[] = {
    "forward",   "backward",  "send_act",       "recv_act",
    "send_grad", "recv_grad", "backward_input", "backward_weight"};
static_assert(std::size(kActionNames) == Action::backward_weight + 1,
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
    Placement placement() const { return placement_of(kind); }
    bool splits() const { return splits_backward(kind); }
};

// Virtual stage of a rank's chunk, and back (Placement above).
inline int stage_of(int rank, int chunk, int pp, Placement pl) {
    if (pl == Placement::vee) return chunk == 0 ? rank : 2 * pp - 1 - rank;
    return chunk * pp + rank;
}
inline int rank_of_stage(int stage, int pp, Placement pl) {
    if (pl == Placement::vee) return stage < pp ? stage : 2 * pp - 1 - stage;
    return stage % pp;
}
inline int chunk_of_stage(int stage, int pp) { return stage / pp; }  // either placement

// Each takes pp >= 1 and microbatches >= 1 (interleaved: v >= 1 and microbatches a multiple of
// pp) and throws ConfigError otherwise. The result includes the sends and recvs.
Schedule gpipe(int pp, int microbatches);
Schedule one_f_one_b(int pp, int microbatches);
Schedule interleaved_1f1b(int pp, int microbatches, int virtual_stages);
// ZB-H1: 1F1B's warm-up, then B without W on rank p for its first p microbatches, then F B W;
// the p deferred Ws close the list. With F = B = W in time the bubble is (pp-1)/(3m) of the
// work (1F1B's is (pp-1)/m), at 1F1B's peak of pp microbatches in flight on rank 0.
Schedule zb_h1(int pp, int microbatches);
// ZBV: two chunks per rank in a V (Placement::vee); each rank's list is a greedy unit-time
// list schedule (B first, then F, then W to fill), holding at most 2·pp chunk activations
// (1F1B's memory). With F = B = W per chunk its only idle time is the first microbatch's way
// down the V: pp-1 chunk slots, (pp-1)/(6m) of the work, for m >= pp.
Schedule zbv(int pp, int microbatches);
Schedule make_schedule(ScheduleKind kind, int pp, int microbatches, int virtual_stages = 1);

// The tag of the message a send or recv action moves: equal on both sides, distinct for every
// message of one step (it encodes direction, microbatch and receiving virtual stage).
int message_tag(const Schedule& s, int rank, const Action& a);

// ---- simulation ------------------------------------------------------------------------------

struct SimOptions {
    int forward_slots = 1;    // time of one forward of one chunk
    int backward_slots = 1;   // time of B, the input-gradient part of a backward (recompute:
                              // add a forward)
    bool rendezvous = false;  // sends block until the peer's recv is posted (blocking send)
    int weight_slots = 0;     // time of W, the weight-gradient part; a backward that is not
                              // split takes backward_slots + weight_slots. 0 for a schedule that
                              // splits: W takes backward_slots (the ZB paper's T_B = T_W).
    int weight_time() const { return weight_slots > 0 ? weight_slots : backward_slots; }
};

struct SimResult {
    std::string problem;  // "" when the schedule is correct; else one sentence saying what fails
    bool ok() const { return problem.empty(); }
    int makespan = 0;   // slots until the last rank finishes (communication takes no time)
    double bubble = 0;  // idle fraction: 1 - busy slots / (pp · makespan)
    // Idle per work, as the Megatron-LM and zero-bubble papers state bubbles: (pp · makespan -
    // busy) / busy. 1F1B: (pp-1)/m; ZB-H1: (pp-1)/(3m) with F = B = W.
    double bubble_rate = 0;
    // Per rank: the most Bs whose W was pending at once (weight-gradient inputs kept).
    std::vector<int> peak_pending_w;
    // Per rank: the most (microbatch, chunk) forwards that were waiting for their backward
    // (split: for their W; their activations are held until then).
    std::vector<int> peak_in_flight;
    // Per rank, per chunk: the same for that chunk's forwards (a chunk's sets are its own).
    std::vector<std::vector<int>> peak_chunk_in_flight;
    // Per rank, per action: the slot it started in (-1: never ran).
    std::vector<std::vector<int>> start;
};

// The slots a compute action takes under opt (0 for communication).
int slots_of(const Action& a, const SimOptions& opt);
// F = B = W = one slot, a whole backward two: how the papers compare schedules.
inline constexpr SimOptions kUnitFBW{1, 1, false, 1};

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
// Cells: F<m> / B<m> / W<m> (with v > 1 the chunk as a letter: F3a, F3b, ...), "." idle; a compute of
// several slots continues with "=". A schedule that fails check_schedule is shown as its lists,
// after the problem.
std::string to_text(const Schedule& s, const SimOptions& opt = {});
// Each rank's list, communication included: "rank 0: F0 >A0:1 F1 >A1:1 <G0:1 B0 ..." where
// >A0:1 sends microbatch 0's activation to rank 1 and <G0:1 receives its gradient from rank 1.
std::string actions_text(const Schedule& s);

}  // namespace px
