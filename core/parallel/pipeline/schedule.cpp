// Pipeline schedules: each generator lists the compute of every rank (warm-up / steady /
// cool-down), then add_p2p puts a recv before each compute whose input lives on another rank and
// a send after each compute whose output does. check_schedule runs the lists in unit time.
#include "core/parallel/pipeline/schedule.h"

#include "core/base/error.h"

#include <algorithm>
#include <array>
#include <optional>
#include <cstdio>
#include <deque>
#include <map>
#include <tuple>

namespace px {

const char* schedule_name(ScheduleKind kind) {
    switch (kind) {
        case ScheduleKind::gpipe:
            return "gpipe";
        case ScheduleKind::one_f_one_b:
            return "1f1b";
        case ScheduleKind::interleaved:
            return "interleaved";
        case ScheduleKind::zb_h1:
            return "zb-h1";
        case ScheduleKind::zbv:
            return "zbv";
    }
    return "?";
}

int chunks_required(ScheduleKind k) {
    if (k == ScheduleKind::zbv) return 2;
    return k == ScheduleKind::interleaved ? 0 : 1;
}

ScheduleKind parse_schedule(const std::string& name) {
    for (const ScheduleKind k : kScheduleKinds)
        if (name == schedule_name(k)) return k;
    throw ConfigError(
        "layout.schedule must be \"gpipe\", \"1f1b\", \"interleaved\", \"zb-h1\" or \"zbv\", got "
        "\"" +
        name + "\"");
}

std::string action_text(const Action& a) {
    if (a.kind > Action::backward_weight) return "an action of unknown kind";
    std::string s = std::string(kActionNames[a.kind]) + "(m=" + std::to_string(a.microbatch) +
                    ", chunk " + std::to_string(a.chunk) + ")";
    if (a.is_send()) s += " to rank " + std::to_string(a.peer);
    if (a.is_recv()) s += " from rank " + std::to_string(a.peer);
    return s;
}

namespace {

Action compute(Action::Kind kind, int microbatch, int chunk) {
    return Action{kind, microbatch, chunk, -1};
}

void check_args(int pp, int microbatches, int virtual_stages) {
    if (pp < 1)
        throw ConfigError("layout.pp = " + std::to_string(pp) + " is out of range: must be >= 1");
    if (microbatches < 1)
        throw ConfigError("microbatches = " + std::to_string(microbatches) +
                          " is out of range: a pipeline step needs at least one microbatch "
                          "(layout.microbatches, or train.microbatches when it is 0)");
    if (virtual_stages < 1)
        throw ConfigError("layout.virtual_stages = " + std::to_string(virtual_stages) +
                          " is out of range: must be >= 1");
}

// Inserts the point-to-point actions around the compute of every rank: the input of a compute
// is received right before it, its output sent right after it, whenever the neighbouring virtual
// stage is on another rank. (With pp = 1 every stage is local and nothing is sent.)
void add_p2p(Schedule& s) {
    const int pp = s.pp, S = s.num_stages();
    const Placement pl = s.placement();
    for (int p = 0; p < pp; p++) {
        std::vector<Action> out;
        for (const Action& a : s.ranks[p]) {
            const int k = stage_of(p, a.chunk, pp, pl);
            const bool prev_remote = k > 0 && rank_of_stage(k - 1, pp, pl) != p;
            const bool next_remote = k < S - 1 && rank_of_stage(k + 1, pp, pl) != p;
            if (a.kind == Action::forward) {
                if (prev_remote)
                    out.push_back(
                        {Action::recv_act, a.microbatch, a.chunk, rank_of_stage(k - 1, pp, pl)});
                out.push_back(a);
                if (next_remote)
                    out.push_back(
                        {Action::send_act, a.microbatch, a.chunk, rank_of_stage(k + 1, pp, pl)});
            } else if (a.kind == Action::backward_weight) {
                out.push_back(a);  // W: nothing comes in or goes out
            } else {
                if (next_remote)
                    out.push_back(
                        {Action::recv_grad, a.microbatch, a.chunk, rank_of_stage(k + 1, pp, pl)});
                out.push_back(a);
                if (prev_remote)
                    out.push_back(
                        {Action::send_grad, a.microbatch, a.chunk, rank_of_stage(k - 1, pp, pl)});
            }
        }
        s.ranks[p] = std::move(out);
    }
}

Schedule empty_schedule(ScheduleKind kind, int pp, int microbatches, int virtual_stages) {
    Schedule s;
    s.kind = kind;
    s.pp = pp;
    s.microbatches = microbatches;
    s.virtual_stages = virtual_stages;
    s.ranks.resize(static_cast<size_t>(pp));
    return s;
}

}  // namespace

// GPipe (Huang et al. 2019; picotron's all-forward-all-backward): every rank runs the forward of
// every microbatch, then the backwards in the same order. Simple, and it holds the activations of
// all m microbatches at once. Unit time: 2(m + pp - 1) slots, bubble (pp-1)/(m+pp-1).
Schedule gpipe(int pp, int microbatches) {
    check_args(pp, microbatches, 1);
    Schedule s = empty_schedule(ScheduleKind::gpipe, pp, microbatches, 1);
    for (int p = 0; p < pp; p++) {
        auto& list = s.ranks[p];
        // Warm-up: every forward (the pipeline fills). There is no steady state.
        for (int m = 0; m < microbatches; m++) list.push_back(compute(Action::forward, m, 0));
        // Cool-down: every backward (the pipeline drains).
        for (int m = 0; m < microbatches; m++) list.push_back(compute(Action::backward, m, 0));
    }
    add_p2p(s);
    return s;
}

// 1F1B (PipeDream-Flush; Megatron's forward_backward_pipelining_without_interleaving): the same
// bubble as GPipe, but rank p holds at most pp - p microbatches in flight instead of m, because
// it starts backwards as soon as the first gradient can reach it.
Schedule one_f_one_b(int pp, int microbatches) {
    check_args(pp, microbatches, 1);
    Schedule s = empty_schedule(ScheduleKind::one_f_one_b, pp, microbatches, 1);
    for (int p = 0; p < pp; p++) {
        auto& list = s.ranks[p];
        // Warm-up: the forwards that fill the stages after this one; the first gradient comes
        // back once microbatch 0 has passed the pp - p - 1 later stages.
        const int warmup = std::min(pp - p - 1, microbatches);
        for (int m = 0; m < warmup; m++) list.push_back(compute(Action::forward, m, 0));
        // Steady state: one forward, then the backward of the oldest microbatch in flight.
        const int steady = microbatches - warmup;
        for (int i = 0; i < steady; i++) {
            list.push_back(compute(Action::forward, warmup + i, 0));
            list.push_back(compute(Action::backward, i, 0));
        }
        // Cool-down: the backwards of the microbatches still in flight.
        for (int m = steady; m < microbatches; m++) list.push_back(compute(Action::backward, m, 0));
    }
    add_p2p(s);
    return s;
}

// Interleaved 1F1B (Narayanan et al. 2021; Megatron's forward_backward_pipelining_with_
// interleaving): each rank holds v model chunks, so a microbatch crosses every rank v times and
// the fill and drain cost 1/v of a stage's work: bubble (pp-1)/(v·m + pp-1) in chunk-slots.
// Microbatches run in groups of pp; within a group the rank does chunk 0 for all pp of them,
// then chunk 1, ... Virtual microbatch j of a rank is chunk (j mod pp·v) / pp of microbatch
// (j / (pp·v))·pp + j mod pp; backwards visit the chunks in reverse order. Hence m must be a
// multiple of pp (Megatron requires the same).
Schedule interleaved_1f1b(int pp, int microbatches, int virtual_stages) {
    check_args(pp, microbatches, virtual_stages);
    if (microbatches % pp != 0)
        throw ConfigError(
            "the interleaved schedule needs microbatches divisible by layout.pp (it runs "
            "microbatches in groups of pp, as Megatron's does): microbatches=" +
            std::to_string(microbatches) + ", layout.pp=" + std::to_string(pp) +
            "; choose layout.microbatches as a multiple of layout.pp");
    const int v = virtual_stages, group = pp * v, total = microbatches * v;
    Schedule s = empty_schedule(ScheduleKind::interleaved, pp, microbatches, v);
    auto microbatch_of = [&](int j) { return (j / group) * pp + j % pp; };
    auto forward_chunk = [&](int j) { return (j % group) / pp; };
    auto backward_chunk = [&](int j) { return v - 1 - (j % group) / pp; };
    for (int p = 0; p < pp; p++) {
        auto& list = s.ranks[p];
        // Warm-up: the forwards of all earlier chunks of the first group, plus two per later rank
        // (Megatron's count: the first backward of the last chunk needs the first microbatch to
        // traverse the (pp - p - 1) later ranks once, with one forward each way in between).
        const int warmup = std::min(2 * (pp - p - 1) + (v - 1) * pp, total);
        for (int j = 0; j < warmup; j++)
            list.push_back(compute(Action::forward, microbatch_of(j), forward_chunk(j)));
        // Steady state: virtual forward warmup + i, then virtual backward i.
        const int steady = total - warmup;
        for (int i = 0; i < steady; i++) {
            const int j = warmup + i;
            list.push_back(compute(Action::forward, microbatch_of(j), forward_chunk(j)));
            list.push_back(compute(Action::backward, microbatch_of(i), backward_chunk(i)));
        }
        // Cool-down: the remaining backwards.
        for (int j = steady; j < total; j++)
            list.push_back(compute(Action::backward, microbatch_of(j), backward_chunk(j)));
    }
    add_p2p(s);
    return s;
}

// ZB-H1 (Qi et al. 2024, section 2.1): rank p keeps 1F1B's warm-up of pp-p-1 forwards, then
// runs p rounds of F and B with W left out (the gradient goes back a W earlier than 1F1B
// would send it, so the ranks before it start their backwards sooner), then F B W until the
// forwards are done, B W until the backwards are, and the p deferred Ws last, where the
// ranks before it would otherwise wait for the final gradients. Rank 0 holds pp microbatches,
// as in 1F1B; rank p holds pp-p until B and p more until their W.
Schedule zb_h1(int pp, int microbatches) {
    check_args(pp, microbatches, 1);
    Schedule s = empty_schedule(ScheduleKind::zb_h1, pp, microbatches, 1);
    const int M = microbatches;
    for (int p = 0; p < pp; p++) {
        auto& list = s.ranks[p];
        int f = 0, b = 0, w = 0;
        auto F = [&] { list.push_back(compute(Action::forward, f++, 0)); };
        auto B = [&] { list.push_back(compute(Action::backward_input, b++, 0)); };
        auto W = [&] { list.push_back(compute(Action::backward_weight, w++, 0)); };
        while (f < std::min(pp - p - 1, M)) F();
        for (int i = 0; i < p && f < M; i++) F(), B();
        while (f < M) F(), B(), W();
        while (b < M) B(), W();
        while (w < M) W();
    }
    add_p2p(s);
    return s;
}

// ZBV (Qi et al., the V schedule of the zero-bubble work): the lists come from running the
// pipeline in unit time and letting each free rank take, in order of preference, a B whose
// gradient is there (chunk 0 first: it is nearer the end of the backward chain), a forward
// (chunk 1 first: it carries microbatches to the loss) while the rank holds fewer than 2·pp
// chunk activations (until their W), or else a W. Each rank runs its chunks' microbatches in
// increasing order.
Schedule zbv(int pp, int microbatches) {
    check_args(pp, microbatches, 2);
    Schedule s = empty_schedule(ScheduleKind::zbv, pp, microbatches, 2);
    const int M = microbatches, S = 2 * pp;
    const Placement pl = Placement::vee;
    constexpr int kNever = -1;
    // Per (stage, microbatch): the slot its F and its B ended (kNever: not yet).
    std::vector<int> f_end(static_cast<size_t>(S * M), kNever), b_end = f_end;
    auto at = [&](int k, int m) { return static_cast<size_t>(k * M + m); };
    auto done = [](int end, int t) { return end != kNever && end <= t; };
    // Per rank and chunk: the next microbatch of each of F, B, W.
    std::vector<std::array<int, 2>> nf(static_cast<size_t>(pp), {0, 0}), nb = nf, nw = nf;
    std::vector<int> held(static_cast<size_t>(pp), 0);
    const int total = 3 * S * M;
    int scheduled = 0;
    for (int t = 0; scheduled < total; t++) {
        PX_ASSERT(t < 4 * total + 4 * S, "zbv: the list schedule does not finish");
        std::vector<std::pair<int, Action>> chosen;
        for (int p = 0; p < pp; p++) {
            const size_t r = static_cast<size_t>(p);
            std::optional<Action> pick;
            for (const int c : {0, 1}) {  // B: chunk 0 first
                const int m = nb[r][c], k = stage_of(p, c, pp, pl);
                if (pick || m >= M || !done(f_end[at(k, m)], t)) continue;
                if (k == S - 1 || done(b_end[at(k + 1, m)], t))
                    pick = compute(Action::backward_input, m, c);
            }
            for (const int c : {1, 0}) {  // F: chunk 1 first
                const int m = nf[r][c], k = stage_of(p, c, pp, pl);
                if (pick || m >= M || held[r] >= S) continue;
                if (k == 0 || done(f_end[at(k - 1, m)], t)) pick = compute(Action::forward, m, c);
            }
            for (const int c : {0, 1}) {  // W: whatever is pending
                const int m = nw[r][c];
                if (pick || m >= nb[r][c]) continue;
                if (done(b_end[at(stage_of(p, c, pp, pl), m)], t))
                    pick = compute(Action::backward_weight, m, c);
            }
            if (pick) chosen.push_back({p, *pick});
        }
        for (const auto& [p, a] : chosen) {  // all ranks decided at t; their work ends at t+1
            const size_t r = static_cast<size_t>(p);
            const int k = stage_of(p, a.chunk, pp, pl);
            if (a.kind == Action::forward) {
                f_end[at(k, a.microbatch)] = t + 1;
                nf[r][a.chunk]++;
                held[r]++;
            } else if (a.kind == Action::backward_input) {
                b_end[at(k, a.microbatch)] = t + 1;
                nb[r][a.chunk]++;
            } else {
                nw[r][a.chunk]++;
                held[r]--;
            }
            s.ranks[r].push_back(a);
            scheduled++;
        }
    }
    add_p2p(s);
    return s;
}

Schedule make_schedule(ScheduleKind kind, int pp, int microbatches, int virtual_stages) {
    if (chunks_required(kind) > 0 && virtual_stages != chunks_required(kind))
        throw ConfigError("layout.virtual_stages=" + std::to_string(virtual_stages) +
                          " does not fit layout.schedule = \"" + schedule_name(kind) + "\": it runs " +
                          std::to_string(chunks_required(kind)) + " model chunk" +
                          (chunks_required(kind) == 1 ? "" : "s") +
                          " per rank (interleaved runs several)");
    switch (kind) {
        case ScheduleKind::gpipe:
            return gpipe(pp, microbatches);
        case ScheduleKind::one_f_one_b:
            return one_f_one_b(pp, microbatches);
        case ScheduleKind::interleaved:
            return interleaved_1f1b(pp, microbatches, virtual_stages);
        case ScheduleKind::zb_h1:
            return zb_h1(pp, microbatches);
        case ScheduleKind::zbv:
            return zbv(pp, microbatches);
    }
    throw InternalError("make_schedule: unknown schedule kind");
}

int message_tag(const Schedule& s, int rank, const Action& a) {
    PX_ASSERT(a.is_send() || a.is_recv(), "message_tag of a compute action");
    const int k = stage_of(rank, a.chunk, s.pp, s.placement());
    const bool grad = a.kind == Action::send_grad || a.kind == Action::recv_grad;
    const int k_dst = a.kind == Action::send_act ? k + 1 : a.kind == Action::send_grad ? k - 1 : k;
    return (a.microbatch * s.num_stages() + k_dst) * 2 + (grad ? 1 : 0);
}

}  // namespace px
