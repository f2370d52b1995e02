// Pipeline schedules, simulated (schedule.h): the unit-time run of every rank's list that checks
// a schedule and measures its bubble, and the schedules as text.
#include "core/parallel/pipeline/schedule.h"

#include "core/base/error.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace px {

// ---- simulation ------------------------------------------------------------------------------

int slots_of(const Action& a, const SimOptions& opt) {
    switch (a.kind) {
        case Action::forward:
            return opt.forward_slots;
        case Action::backward:
            return opt.backward_slots + opt.weight_slots;
        case Action::backward_input:
            return opt.backward_slots;
        case Action::backward_weight:
            return opt.weight_time();
        default:
            return 0;
    }
}

namespace {

struct Message {
    int microbatch;
    int dst_stage;  // the virtual stage that consumes it
    int time;       // slot at which it was posted
    int index;      // the send's index in its rank's list
};

class Simulator {
public:
    Simulator(const Schedule& s, const SimOptions& opt)
        : s_(s), opt_(opt), pl_(s.placement()) {}

    SimResult run() {
        const int pp = s_.pp;
        r_.start.resize(s_.ranks.size());
        for (size_t p = 0; p < s_.ranks.size(); p++) r_.start[p].assign(s_.ranks[p].size(), -1);
        r_.peak_in_flight.assign(s_.ranks.size(), 0);
        r_.peak_pending_w.assign(s_.ranks.size(), 0);
        r_.peak_chunk_in_flight.assign(s_.ranks.size(),
                                       std::vector<int>(std::max(s_.virtual_stages, 0), 0));
        chunk_in_flight_ = r_.peak_chunk_in_flight;
        if (!check_shape() || !check_actions() || !check_counts()) return r_;

        const size_t cells =
            static_cast<size_t>(s_.num_stages()) * static_cast<size_t>(s_.microbatches);
        fwd_end_.assign(cells, -1);
        bwd_end_.assign(cells, -1);
        got_act_.assign(cells, -1);
        got_grad_.assign(cells, -1);
        clock_.assign(pp, 0);
        pc_.assign(pp, 0);
        in_flight_.assign(pp, 0);
        pending_w_.assign(pp, 0);

        // Advance every rank as far as it can go, until nobody can.
        for (bool progress = true; progress;) {
            progress = false;
            for (int p = 0; p < pp; p++) {
                while (pc_[p] < s_.ranks[p].size()) {
                    const Step st = step(p);
                    if (st == Step::failed) return r_;
                    if (st == Step::blocked) break;
                    progress = true;
                }
            }
        }
        std::string waits;
        for (int p = 0; p < pp; p++) {
            if (pc_[p] == s_.ranks[p].size()) continue;
            waits += std::string(waits.empty() ? "" : "; ") + "rank " + std::to_string(p) +
                     " waits in " + action_text(s_.ranks[p][pc_[p]]);
        }
        if (!waits.empty())
            return fail("deadlock: " + waits +
                        (opt_.rendezvous
                             ? " (blocking sends wait for their recv: post sends asynchronously)"
                             : ""));
        for (const auto& [key, queue] : channels_) {
            if (queue.empty()) continue;
            const auto& [src, dst, grad] = key;
            return fail("rank " + std::to_string(src) + "'s " +
                        action_text(s_.ranks[src][queue.front().index]) +
                        " is never received by rank " + std::to_string(dst));
        }
        int busy = 0;
        for (int p = 0; p < pp; p++) {
            r_.makespan = std::max(r_.makespan, clock_[p]);
            for (const Action& a : s_.ranks[p])
                if (a.is_compute()) busy += duration(a);
        }
        if (r_.makespan > 0)
            r_.bubble = 1.0 - static_cast<double>(busy) / (static_cast<double>(pp) * r_.makespan);
        if (busy > 0)
            r_.bubble_rate =
                (static_cast<double>(pp) * r_.makespan - static_cast<double>(busy)) / busy;
        return r_;
    }

private:
    enum class Step { ran, blocked, failed };

    int duration(const Action& a) const { return slots_of(a, opt_); }
    size_t cell(int stage, int microbatch) const {
        return static_cast<size_t>(stage) * static_cast<size_t>(s_.microbatches) +
               static_cast<size_t>(microbatch);
    }

    SimResult fail(std::string problem) {
        r_.problem = std::move(problem);
        return r_;
    }
    bool failed(std::string problem) {
        r_.problem = std::move(problem);
        return false;
    }
    std::string at(int p, const Action& a) const {
        return "rank " + std::to_string(p) + "'s " + action_text(a);
    }

    bool check_shape() {
        if (s_.pp < 1 || s_.microbatches < 1 || s_.virtual_stages < 1)
            return failed("the schedule has pp=" + std::to_string(s_.pp) +
                          ", microbatches=" + std::to_string(s_.microbatches) +
                          ", virtual_stages=" + std::to_string(s_.virtual_stages) +
                          ": each must be >= 1");
        if (static_cast<int>(s_.ranks.size()) != s_.pp)
            return failed("the schedule has lists for " + std::to_string(s_.ranks.size()) +
                          " ranks but pp=" + std::to_string(s_.pp) +
                          ": every pipeline rank needs its list");
        if (opt_.forward_slots < 1 || opt_.backward_slots < 1 || opt_.weight_slots < 0)
            return failed(
                "SimOptions: forward_slots and backward_slots must be >= 1, weight_slots >= 0");
        return true;
    }

    // Every action names a microbatch and chunk that exist, and a send or recv the right peer.
    bool check_actions() {
        const int pp = s_.pp, S = s_.num_stages();
        for (int p = 0; p < pp; p++) {
            for (const Action& a : s_.ranks[p]) {
                if (a.kind > Action::backward_weight)
                    return failed("rank " + std::to_string(p) + " has an action of unknown kind");
                const bool split_kind =
                    a.kind == Action::backward_input || a.kind == Action::backward_weight;
                if (a.kind == Action::backward && s_.splits())
                    return failed(at(p, a) + ": " + schedule_name(s_.kind) +
                                  " runs B and W apart (backward_input, backward_weight)");
                if (split_kind && !s_.splits())
                    return failed(at(p, a) + ": " + schedule_name(s_.kind) +
                                  " runs whole backwards; only zb-h1 and zbv split them");
                if (a.microbatch < 0 || a.microbatch >= s_.microbatches || a.chunk < 0 ||
                    a.chunk >= s_.virtual_stages)
                    return failed(at(p, a) +
                                  " names a microbatch or chunk outside the schedule's " +
                                  std::to_string(s_.microbatches) + " microbatches and " +
                                  std::to_string(s_.virtual_stages) + " chunks");
                if (a.is_compute()) continue;
                const int k = stage_of(p, a.chunk, pp, pl_);
                const bool towards_next = a.kind == Action::send_act || a.kind == Action::recv_grad;
                const int other = towards_next ? k + 1 : k - 1;
                if (other < 0 || other >= S)
                    return failed(at(p, a) + " does not fit the pipeline: virtual stage " +
                                  std::to_string(k) +
                                  (other < 0 ? " is the first (its input is the tokens)"
                                             : " is the last (the loss consumes its output)"));
                const int want = rank_of_stage(other, pp, pl_);
                if (want == p)
                    return failed(at(p, a) + " does not fit the pipeline: virtual stage " +
                                  std::to_string(other) +
                                  " is on the same rank, so nothing is sent");
                if (a.peer != want)
                    return failed(at(p, a) + " names the wrong peer: virtual stage " +
                                  std::to_string(other) + " is on rank " + std::to_string(want));
            }
        }
        return true;
    }

    // Every forward and backward exactly once; every message the pipeline needs sent and received
    // exactly once (check_actions has rejected any it does not need).
    bool check_counts() {
        const int pp = s_.pp, S = s_.num_stages(), M = s_.microbatches, V = s_.virtual_stages;
        constexpr int kinds = Action::backward_weight + 1;
        std::vector<int> count(static_cast<size_t>(pp) * kinds * M * V, 0);
        auto slot = [&](int p, int kind, int m, int c) {
            return ((static_cast<size_t>(p) * kinds + kind) * M + m) * V + c;
        };
        for (int p = 0; p < pp; p++) {
            for (const Action& a : s_.ranks[p]) {
                if (++count[slot(p, a.kind, a.microbatch, a.chunk)] == 2)
                    return failed("rank " + std::to_string(p) + " runs " + action_text(a) +
                                  " twice: every forward, backward, send and recv of the pipeline "
                                  "runs exactly once");
            }
        }
        for (int p = 0; p < pp; p++) {
            for (int c = 0; c < V; c++) {
                const int k = stage_of(p, c, pp, pl_);
                const bool prev_remote = k > 0 && rank_of_stage(k - 1, pp, pl_) != p;
                const bool next_remote = k < S - 1 && rank_of_stage(k + 1, pp, pl_) != p;
                for (int m = 0; m < M; m++) {
                    auto need = [&](Action::Kind kind, bool needed, int peer) {
                        if (!needed || count[slot(p, kind, m, c)] == 1) return true;
                        return failed("rank " + std::to_string(p) + " never runs " +
                                      action_text({kind, m, c, peer}) +
                                      ": every (microbatch, chunk) needs its forward, its backward "
                                      "and the messages "
                                      "between its stages");
                    };
                    const bool split = s_.splits();
                    if (!need(Action::forward, true, -1) || !need(Action::backward, !split, -1) ||
                        !need(Action::backward_input, split, -1) ||
                        !need(Action::backward_weight, split, -1) ||
                        !need(Action::recv_act, prev_remote,
                              prev_remote ? rank_of_stage(k - 1, pp, pl_) : -1) ||
                        !need(Action::send_act, next_remote,
                              next_remote ? rank_of_stage(k + 1, pp, pl_) : -1) ||
                        !need(Action::recv_grad, next_remote,
                              next_remote ? rank_of_stage(k + 1, pp, pl_) : -1) ||
                        !need(Action::send_grad, prev_remote,
                              prev_remote ? rank_of_stage(k - 1, pp, pl_) : -1))
                        return false;
                }
            }
        }
        return true;
    }

    // Runs rank p's next action if it can.
    Step step(int p) {
        const int pp = s_.pp, S = s_.num_stages();
        const size_t index = pc_[p];
        const Action& a = s_.ranks[p][index];
        const int k = stage_of(p, a.chunk, pp, pl_);
        const size_t me = cell(k, a.microbatch);
        switch (a.kind) {
            case Action::forward: {
                if (k > 0) {
                    const bool local = rank_of_stage(k - 1, pp, pl_) == p;
                    if (local && fwd_end_[cell(k - 1, a.microbatch)] < 0)
                        return fail_step(at(p, a) +
                                         " runs before forward(m=" + std::to_string(a.microbatch) +
                                         ", chunk " + std::to_string(a.chunk - 1) +
                                         "), which computes its input on this rank");
                    if (!local && got_act_[me] < 0)
                        return fail_step(at(p, a) + " runs before its input arrived: recv_act(m=" +
                                         std::to_string(a.microbatch) + ", chunk " +
                                         std::to_string(a.chunk) + ") must come first");
                }
                run_compute(p, a, index);
                fwd_end_[me] = clock_[p];
                r_.peak_in_flight[p] = std::max(r_.peak_in_flight[p], ++in_flight_[p]);
                int& peak = r_.peak_chunk_in_flight[p][a.chunk];
                peak = std::max(peak, ++chunk_in_flight_[p][a.chunk]);
                return Step::ran;
            }
            case Action::backward_weight: {
                if (bwd_end_[me] < 0)
                    return fail_step(at(p, a) + " runs before backward_input(m=" +
                                     std::to_string(a.microbatch) + ", chunk " +
                                     std::to_string(a.chunk) + ") on this rank");
                run_compute(p, a, index);
                in_flight_[p]--;
                chunk_in_flight_[p][a.chunk]--;
                pending_w_[p]--;
                return Step::ran;
            }
            case Action::backward_input:
            case Action::backward: {
                if (fwd_end_[me] < 0)
                    return fail_step(at(p, a) +
                                     " runs before forward(m=" + std::to_string(a.microbatch) +
                                     ", chunk " + std::to_string(a.chunk) + ") on this rank");
                if (k < S - 1) {
                    const bool local = rank_of_stage(k + 1, pp, pl_) == p;
                    if (local && bwd_end_[cell(k + 1, a.microbatch)] < 0)
                        return fail_step(at(p, a) +
                                         " runs before backward(m=" + std::to_string(a.microbatch) +
                                         ", chunk " + std::to_string(a.chunk + 1) +
                                         "), which computes its output gradient on this rank");
                    if (!local && got_grad_[me] < 0)
                        return fail_step(at(p, a) +
                                         " runs before its output gradient arrived: recv_grad(m=" +
                                         std::to_string(a.microbatch) + ", chunk " +
                                         std::to_string(a.chunk) + ") must come first");
                }
                run_compute(p, a, index);
                bwd_end_[me] = clock_[p];
                if (a.kind == Action::backward) {
                    in_flight_[p]--;
                    chunk_in_flight_[p][a.chunk]--;
                } else {
                    r_.peak_pending_w[p] = std::max(r_.peak_pending_w[p], ++pending_w_[p]);
                }
                return Step::ran;
            }
            case Action::send_act:
            case Action::send_grad: {
                const bool grad = a.kind == Action::send_grad;
                if ((grad ? bwd_end_[me] : fwd_end_[me]) < 0)
                    return fail_step(at(p, a) + " runs before " + (grad ? "backward" : "forward") +
                                     "(m=" + std::to_string(a.microbatch) + ", chunk " +
                                     std::to_string(a.chunk) + ") produced what it sends");
                const int dst_stage = grad ? k - 1 : k + 1;
                if (opt_.rendezvous) return rendezvous(p, a.peer, grad, a.microbatch, dst_stage);
                channels_[{p, a.peer, grad}].push_back(
                    {a.microbatch, dst_stage, clock_[p], static_cast<int>(index)});
                r_.start[p][index] = clock_[p];
                pc_[p]++;
                return Step::ran;
            }
            case Action::recv_act:
            case Action::recv_grad: {
                const bool grad = a.kind == Action::recv_grad;
                if (opt_.rendezvous) return rendezvous(a.peer, p, grad, a.microbatch, k);
                auto it = channels_.find({a.peer, p, grad});
                if (it == channels_.end() || it->second.empty()) return Step::blocked;
                const Message msg = it->second.front();
                if (msg.microbatch != a.microbatch || msg.dst_stage != k)
                    return fail_step(
                        at(p, a) + " would receive " + action_text(s_.ranks[a.peer][msg.index]) +
                        " instead: messages between two ranks arrive in the order they were sent");
                it->second.pop_front();
                deliver(p, grad, me, std::max(clock_[p], msg.time), index);
                return Step::ran;
            }
        }
        return fail_step("rank " + std::to_string(p) + " has an action of unknown kind");
    }

    // Blocking send from src meets blocking recv on dst: both must be at the head of their lists.
    Step rendezvous(int src, int dst, bool grad, int microbatch, int dst_stage) {
        if (pc_[src] >= s_.ranks[src].size() || pc_[dst] >= s_.ranks[dst].size())
            return Step::blocked;
        const Action& snd = s_.ranks[src][pc_[src]];
        const Action& rcv = s_.ranks[dst][pc_[dst]];
        const auto send_kind = grad ? Action::send_grad : Action::send_act;
        const auto recv_kind = grad ? Action::recv_grad : Action::recv_act;
        if (snd.kind != send_kind || rcv.kind != recv_kind || snd.peer != dst || rcv.peer != src)
            return Step::blocked;
        if (snd.microbatch != microbatch || rcv.microbatch != microbatch) return Step::blocked;
        const int snd_stage = stage_of(src, snd.chunk, s_.pp, pl_);
        if ((grad ? snd_stage - 1 : snd_stage + 1) != dst_stage ||
            stage_of(dst, rcv.chunk, s_.pp, pl_) != dst_stage)
            return Step::blocked;
        // A send whose data is not computed yet waits here; step(src) reports it on its turn.
        if ((grad ? bwd_end_ : fwd_end_)[cell(snd_stage, microbatch)] < 0) return Step::blocked;
        const int t = std::max(clock_[src], clock_[dst]);
        r_.start[src][pc_[src]] = t;
        clock_[src] = t;
        pc_[src]++;
        deliver(dst, grad, cell(dst_stage, microbatch), t, pc_[dst]);
        return Step::ran;
    }

    void deliver(int p, bool grad, size_t me, int t, size_t index) {
        (grad ? got_grad_ : got_act_)[me] = t;
        r_.start[p][index] = t;
        clock_[p] = t;
        pc_[p]++;
    }

    void run_compute(int p, const Action& a, size_t index) {
        r_.start[p][index] = clock_[p];
        clock_[p] += duration(a);
        pc_[p]++;
    }

    Step fail_step(std::string problem) {
        r_.problem = std::move(problem);
        return Step::failed;
    }

    const Schedule& s_;
    const SimOptions& opt_;
    Placement pl_;
    SimResult r_;
    std::vector<int> fwd_end_,
        bwd_end_;  // per (virtual stage, microbatch): slot its compute ended, -1 not yet
    std::vector<int> got_act_,
        got_grad_;            // per (virtual stage, microbatch): slot its input / gradient arrived
    std::vector<int> clock_;  // per rank: the slot at which its next action may start
    std::vector<size_t> pc_;  // per rank: index of its next action
    std::vector<int> in_flight_;  // per rank: forwards without their backward (split: W) yet
    std::vector<int> pending_w_;  // per rank: Bs without their W yet
    std::vector<std::vector<int>> chunk_in_flight_;  // per rank, per chunk: as in_flight_
    std::map<std::tuple<int, int, bool>, std::deque<Message>>
        channels_;  // (src, dst, grad) -> posted sends
};

std::string chunk_suffix(const Schedule& s, int chunk) {
    if (s.virtual_stages == 1) return "";
    if (chunk < 26) return std::string(1, static_cast<char>('a' + chunk));
    std::string suffix(1, '.');
    suffix += std::to_string(chunk);
    return suffix;
}

std::string compute_label(const Schedule& s, const Action& a) {
    std::string label(1, a.kind == Action::forward           ? 'F'
                         : a.kind == Action::backward_weight ? 'W'
                                                             : 'B');
    label += std::to_string(a.microbatch);
    label += chunk_suffix(s, a.chunk);
    return label;
}

std::string header(const Schedule& s) {
    std::string h = std::string(schedule_name(s.kind)) + ", pp=" + std::to_string(s.pp) +
                    ", microbatches=" + std::to_string(s.microbatches);
    if (s.virtual_stages > 1) h += ", v=" + std::to_string(s.virtual_stages);
    return h;
}

std::string rank_label(int p, int pp) {
    std::string n = std::to_string(p);
    const size_t w = std::to_string(std::max(pp - 1, 0)).size();
    return "rank " + std::string(w - std::min(w, n.size()), ' ') + n;
}

void rstrip(std::string& line) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
}

}  // namespace

SimResult check_schedule(const Schedule& s, const SimOptions& opt) {
    return Simulator(s, opt).run();
}

std::string actions_text(const Schedule& s) {
    std::string out;
    for (size_t p = 0; p < s.ranks.size(); p++) {
        std::string line = rank_label(static_cast<int>(p), static_cast<int>(s.ranks.size())) + ":";
        for (const Action& a : s.ranks[p]) {
            line += ' ';
            if (a.is_compute()) {
                line += compute_label(s, a);
                continue;
            }
            const bool grad = a.kind == Action::send_grad || a.kind == Action::recv_grad;
            line += std::string(a.is_send() ? ">" : "<") + (grad ? "G" : "A") +
                    std::to_string(a.microbatch) + chunk_suffix(s, a.chunk) + ":" +
                    std::to_string(a.peer);
        }
        out += line + "\n";
    }
    return out;
}

std::string to_text(const Schedule& s, const SimOptions& opt) {
    const SimResult r = check_schedule(s, opt);
    if (!r.ok()) return header(s) + ": " + r.problem + "\n" + actions_text(s);
    char bubble[32];
    std::snprintf(bubble, sizeof bubble, "%.1f%%", 100.0 * r.bubble);
    std::string out =
        header(s) + ": " + std::to_string(r.makespan) + " slots, bubble " + bubble + "\n";

    std::vector<std::vector<std::string>> grid(s.ranks.size(),
                                               std::vector<std::string>(r.makespan, "."));
    size_t width = 1;
    for (size_t p = 0; p < s.ranks.size(); p++) {
        for (size_t i = 0; i < s.ranks[p].size(); i++) {
            const Action& a = s.ranks[p][i];
            if (!a.is_compute()) continue;
            const int t = r.start[p][i];
            const int d = slots_of(a, opt);
            grid[p][t] = compute_label(s, a);
            width = std::max(width, grid[p][t].size());
            for (int j = 1; j < d; j++) grid[p][t + j].assign(1, '=');
        }
    }
    for (size_t p = 0; p < s.ranks.size(); p++) {
        std::string line = rank_label(static_cast<int>(p), s.pp) + " |";
        for (const auto& cell : grid[p]) {
            line += ' ';
            line += cell;
            line.append(width - cell.size(), ' ');
        }
        rstrip(line);
        out += line + "\n";
    }
    return out;
}

}  // namespace px
