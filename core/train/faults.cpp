#include "core/train/faults.h"

#include "core/io/checkpoint.h"
#include "core/base/error.h"
#include "core/train/checkpointing.h"
#include "core/parallel/mesh.h"
#include "core/parallel/pipeline.h"

#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <map>
#include <thread>

namespace px {

namespace {

using Clock = std::chrono::steady_clock;

std::string rank_list(const std::vector<int>& ranks) {
    std::string s;
    for (size_t i = 0; i < ranks.size(); i++) {
        if (i > 0) s += i + 1 == ranks.size() ? " and " : ", ";
        s += std::to_string(ranks[i]);
    }
    return s;
}

std::string steps_phrase(i64 first, i64 last) {
    std::string s = first == last ? "step " : "steps ";
    s += std::to_string(first);
    if (first != last) {
        s += "..";
        s += std::to_string(last);
    }
    return s;
}

std::string ranks_phrase(const std::vector<int>& ranks) {
    std::string s = ranks.size() == 1 ? "world rank " : "world ranks ";
    s += rank_list(ranks);
    return s;
}

}  // namespace

// ---- the injector ----------------------------------------------------------------------------

FaultInjector::FaultInjector(const Config& cfg, comm::Communicator* world)
    : f_(cfg.fault), world_(world) {
    const int ranks = world ? world->size() : 1;
    if (!f_.kind.empty() && f_.rank >= ranks)
        throw ConfigError("fault.rank=" + std::to_string(f_.rank) + " is not a rank of this run, "
                          "whose world has " + std::to_string(ranks) +
                          (ranks == 1 ? " rank" : " ranks") + " (layout.dp x layout.pp x layout.tp): "
                          "choose a rank below that");
    // A rank that waits until the others give up on it waits forever when there are none.
    const bool processes = world && world->ranks_are_processes();
    if (ranks == 1 && f_.kind == "stall" && f_.stall_s <= 0)
        throw ConfigError("fault.kind = \"stall\" with fault.stall_s = 0 stalls until the other "
                          "ranks give up on it, but this run has one rank: it would never end; "
                          "set fault.stall_s > 0, or run a layout of more ranks");
    if (ranks == 1 && f_.kind == "kill" && !processes)
        throw ConfigError("fault.kind = \"kill\" on an in-process rank silences it until the other "
                          "ranks give up on it, but this run has one rank: it would never end; "
                          "run a layout of more ranks (or one process under mpirun, which dies)");
    armed_ = !f_.kind.empty() && (world ? world->rank() : 0) == f_.rank;
}

bool FaultInjector::strikes(i64 step) {
    if (!armed_ || step != f_.step) return false;
    if (struck_ > 0 && !f_.persistent) return false;
    struck_++;
    return true;
}

void FaultInjector::attach(Job& job) {
    if (!armed_) return;
    if (f_.kind == "flip_grad" || f_.kind == "flip_weight") {
        const ParamTable& table = job.model().table();
        const int i = table.find(f_.tensor);
        if (i < 0)
            throw ConfigError("fault.tensor = \"" + f_.tensor + "\" is not a parameter held by world "
                              "rank " + std::to_string(f_.rank) + " (a pipeline stage holds only "
                              "its layers; names are GPT-2's, e.g. \"wte\", \"h.0.mlp.c_fc.weight\"): "
                              "choose a tensor of that rank, or another fault.rank");
        const TableEntry& e = table.entries[static_cast<size_t>(i)];
        if (f_.element >= e.numel())
            throw ConfigError("fault.element = " + std::to_string(f_.element) + " is outside world rank " +
                              std::to_string(f_.rank) + "'s piece of " + f_.tensor + ", which has " +
                              std::to_string(e.numel()) + " elements: choose an index below that");
        offset_ = e.offset + f_.element;
    }
    StepHooks h;
    h.before = [this](i64 step) { before(step); };
    if (f_.kind == "flip_grad")
        h.grads = [this](i64 step, float* g) { flip(step, g, "reduced gradient"); };
    if (f_.kind == "flip_weight") {
        GPT* model = &job.model();
        h.updated = [this, model](i64 step) { flip(step, model->params(), "weights"); };
    }
    job.add_step_hooks(std::move(h));
}


void FaultInjector::before(i64 step) {
    if (f_.kind != "kill" && f_.kind != "stall") return;
    if (!strikes(step)) return;
    if (f_.kind == "stall") {
        stall(step);
        return;
    }
    std::fprintf(stderr, "parallax: fault injector: world rank %d dies before step %lld\n", f_.rank,
                 static_cast<long long>(step));
    std::fflush(stderr);
    // A process dies as a crashed node would; a thread cannot, so it stops communicating.
    if (!world_ || world_->size() == 1 || world_->ranks_are_processes()) std::raise(SIGKILL);
    wait(step, 0);
}

void FaultInjector::wait(i64 step, double seconds) {
    const bool forever = seconds <= 0;
    const auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(forever ? 0.0 : seconds));
    while (forever || Clock::now() < end) {
        const std::string failure = world_ ? world_->failure() : std::string();
        if (!failure.empty())
            throw comm::CommError("world rank " + std::to_string(f_.rank) + " was " +
                                  (f_.kind == "kill" ? "killed" : "stalled") +
                                  " by the fault injector before step " + std::to_string(step) +
                                  " and the job failed without it: " + failure);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

void FaultInjector::stall(i64 step) {
    std::fprintf(stderr, "parallax: fault injector: world rank %d stalls before step %lld%s\n",
                 f_.rank, static_cast<long long>(step),
                 f_.stall_s > 0 ? "" : " until the job gives up on it");
    std::fflush(stderr);
    wait(step, f_.stall_s);
}

void FaultInjector::flip(i64 step, float* base, const char* what) {
    if (!strikes(step)) return;
    float* x = base + offset_;
    const float old = *x;
    std::uint32_t bits;
    std::memcpy(&bits, x, sizeof bits);
    bits ^= std::uint32_t{1} << f_.bit;
    std::memcpy(x, &bits, sizeof bits);
    std::fprintf(stderr,
                 "parallax: fault injector: world rank %d, step %lld: flipped bit %d of %s[%lld] "
                 "in its %s (%.9g -> %.9g)%s\n",
                 f_.rank, static_cast<long long>(step), f_.bit, f_.tensor.c_str(),
                 static_cast<long long>(f_.element), what, static_cast<double>(old),
                 static_cast<double>(*x), f_.persistent ? ", persistent" : "");
    std::fflush(stderr);
}

// ---- the replica check -----------------------------------------------------------------------

namespace {

// What a rank holds as a replica: its weights, hashed as 64-bit words (two floats each), each
// word mixed with its position (splitmix64's finaliser, a bijection) and the results summed, so
// any flipped bit changes the hash, and the sum splits over threads exactly (mod 2^64). Two mixes
// word of two floats, half the checkpoint checksum's per float, since this runs every N steps.
// The Adam moments are not hashed: a fault in them reaches the weights at the next update.
std::uint64_t replica_hash(const Job& job) {
    const GPT& model = job.model();
    const i64 n = model.table().total;
    const float* w = model.params();
    std::uint64_t h = 0;
    if (n % 2) {
        std::uint32_t last;
        std::memcpy(&last, w + n - 1, sizeof last);
        h = checksum_term(static_cast<std::uint64_t>(n), last);
    }
#pragma omp parallel for reduction(+ : h) schedule(static) if (n > (i64{1} << 18))
    for (i64 i = 0; i < n / 2; i++) {
        std::uint64_t word;
        std::memcpy(&word, w + 2 * i, sizeof word);
        h += checksum_term(static_cast<std::uint64_t>(i), word);
    }
    return h;
}

}  // namespace

ReplicaCheck::ReplicaCheck(const Config& cfg, comm::Communicator& world)
    : cfg_(cfg), world_(world), every_(cfg.validate.replica_check_every) {
    if (!enabled()) return;
    const Mesh mesh(make_layout(cfg));
    for (int r = 0; r < world.size(); r++) group_.push_back(mesh.group_color(MeshDim::dp, r));
}

bool ReplicaCheck::due(i64 step) const {
    // Also whenever a checkpoint is due, so that checkpoints hold checked weights, and after the
    // last step.
    return step % every_ == 0 || checkpoint_due(cfg_, step) || step == cfg_.train.steps;
}

std::vector<std::uint64_t> ReplicaCheck::hashes(std::uint64_t mine) {
    i64 in;
    std::memcpy(&in, &mine, sizeof in);
    std::vector<i64> all(static_cast<size_t>(world_.size()));
    world_.all_gather(all.data(), &in, 1);
    std::vector<std::uint64_t> out(all.size());
    std::memcpy(out.data(), all.data(), all.size() * sizeof(i64));
    return out;
}

std::vector<int> ReplicaCheck::outliers(const std::vector<std::uint64_t>& h, bool* no_majority) const {
    std::map<int, std::vector<int>> groups;  // colour -> world ranks
    for (int r = 0; r < static_cast<int>(h.size()); r++) groups[group_[static_cast<size_t>(r)]].push_back(r);
    std::vector<int> out;
    *no_majority = false;
    for (const auto& [colour, ranks] : groups) {
        std::map<std::uint64_t, int> votes;
        for (int r : ranks) votes[h[static_cast<size_t>(r)]]++;
        if (votes.size() == 1) continue;
        std::uint64_t majority = 0;
        bool found = false;
        for (const auto& [value, n] : votes)
            if (2 * n > static_cast<int>(ranks.size())) majority = value, found = true;
        if (!found) *no_majority = true;
        for (int r : ranks)
            if (!found || h[static_cast<size_t>(r)] != majority) out.push_back(r);
    }
    return out;
}

bool ReplicaCheck::after_step(Job& job) {
    if (!enabled()) return false;
    const i64 step = job.steps_done();
    if (rerun_to_ == 0 && !due(step)) return false;
    const std::vector<std::uint64_t> h = hashes(replica_hash(job));
    bool no_majority = false;
    const std::vector<int> bad = outliers(h, &no_majority);
    const bool report = world_.rank() == 0;

    if (rerun_to_ > 0) {  // re-running after a mismatch: every step is checked
        if (!bad.empty()) {
            std::string msg = "silent data corruption: the weights of " + ranks_phrase(bad) +
                              " disagree with their data-parallel replicas again at step " +
                              std::to_string(step) + " of the re-run (first seen at step " +
                              std::to_string(rerun_to_) + "), so the fault is persistent: it follows "
                              "the hardware";
            if (no_majority)
                msg += " (a group of replicas without a majority: the faulty rank among them cannot "
                       "be told apart)";
            msg += ". Take the node";
            msg += bad.size() == 1 ? "" : "s";
            msg += " of " + ranks_phrase(bad) +
                   " out of the job and restart it; checkpoint.resume = \"auto\" continues from the "
                   "newest checkpoint, whose weights were checked";
            throw CorruptionError(msg);
        }
        if (step < rerun_to_) return false;
        // The faulty ranks: the first run's minority. Without a majority (two replicas), those
        // whose first hash differs from the re-run's; when the check runs every step the fault
        // has not spread to the other replicas yet, so that names one rank.
        std::vector<int> culprits = first_outliers_;
        if (first_no_majority_) {
            culprits.clear();
            for (int r : first_outliers_)
                if (first_[static_cast<size_t>(r)] != h[static_cast<size_t>(r)]) culprits.push_back(r);
        }
        if (report)
            std::fprintf(stderr,
                         "parallax: replica check: the re-run of %s agrees on every replica%s, so "
                         "the fault on %s was transient; training continues from the re-run\n",
                         steps_phrase(snap_.step + 1, step).c_str(),
                         first_no_majority_ ? "" : " and with the first run's majority",
                         ranks_phrase(culprits).c_str());
        rerun_to_ = 0;
        job.snapshot(snap_);
        return false;
    }
    if (bad.empty()) {
        job.snapshot(snap_);
        return false;
    }
    mismatches_++;
    if (report) {
        std::string what = no_majority ? "the data-parallel replicas " + ranks_phrase(bad) +
                                             " disagree, with no majority to name the faulty one"
                                       : "the weights of " + ranks_phrase(bad) +
                                             (bad.size() == 1 ? " differ from its" : " differ from their") +
                                             " data-parallel replicas'";
        std::fprintf(stderr,
                     "parallax: replica check at step %lld: %s; re-running %s from the state "
                     "checked at step %lld to tell a transient fault from a persistent one\n",
                     static_cast<long long>(step), what.c_str(),
                     steps_phrase(snap_.step + 1, step).c_str(), static_cast<long long>(snap_.step));
        std::fflush(stderr);
    }
    first_ = h;
    first_outliers_ = bad;
    first_no_majority_ = no_majority;
    rerun_to_ = step;
    job.rewind(snap_);
    return true;
}

void ReplicaCheck::start(Job& job) {
    if (enabled()) job.snapshot(snap_);
}

}  // namespace px
