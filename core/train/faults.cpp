#include "core/train/faults.h"

#include "core/io/checkpoint.h"
#include "core/base/error.h"
#include "core/train/checkpointing.h"
#include "core/parallel/mesh.h"
#include "core/parallel/pipeline/pipeline.h"

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
        // Under ZeRO-2/3 a rank reduces only its shard of the gradient (the rest reads 0 and is
        // never used), under ZeRO-3 it keeps only its shard of the weights: a flip elsewhere
        // would change nothing.
        const bool sharded = job.data().zero_stage() >= (f_.kind == "flip_grad" ? 2 : 3);
        const Range mine = job.data().update_range();
        if (sharded && (offset_ < mine.lo || offset_ >= mine.hi)) {
            const i64 lo = std::max(mine.lo, e.offset) - e.offset;
            const i64 hi = std::min(mine.hi, e.offset + e.numel()) - e.offset;
            throw ConfigError(
                "fault.element = " + std::to_string(f_.element) + " of " + f_.tensor +
                " is outside world rank " + std::to_string(f_.rank) + "'s ZeRO-" +
                std::to_string(job.data().zero_stage()) + " shard of its " +
                (f_.kind == "flip_grad" ? "reduced gradient" : "weights") +
                (lo < hi ? ", elements " + std::to_string(lo) + ".." + std::to_string(hi - 1)
                         : ", which holds none of that tensor") +
                " (a flip outside the shard would change nothing): choose an element inside it, "
                "or another fault.rank or fault.tensor");
        }
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

// Floats hashed as 64-bit words (two floats each), each word mixed with its position (splitmix64's
// finaliser, a bijection) and the results summed, so any flipped bit changes the hash, and the
// sum splits over threads exactly (mod 2^64). Two mixes a word: half the checkpoint checksum's
// per float, since the weights are hashed at every step under ZeRO-1/2.
std::uint64_t hash_floats(const float* w, i64 n) {
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

namespace {

// A shard's weights and Adam moments (the Adam moments of a replica are not hashed: a fault in
// them reaches its weights at the next update; a shard's owner has no replica to show it).
std::uint64_t hash_shard(const ShardState& s) {
    if (s.w == nullptr) return 0;
    const i64 n = s.hi - s.lo;
    std::uint64_t h = mix64(hash_floats(s.w, n));
    h = mix64(h ^ hash_floats(s.m, n));
    return mix64(h ^ hash_floats(s.v, n)) | 1;  // never 0, which means "none"
}

std::uint64_t hash_metrics(const StepMetrics& m) {
    const double x[3] = {m.loss, m.grad_norm, m.val_loss};
    return checksum_bytes(x, sizeof x) | 1;
}

}  // namespace

std::vector<int> ReplicaCheck::Finding::ranks() const {
    std::vector<int> out;
    for (const auto& [r, w] : suspects) out.push_back(r);
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
}

ReplicaCheck::ReplicaCheck(const Config& cfg, comm::Communicator& world)
    : cfg_(cfg), world_(world), every_(cfg.validate.replica_check_every) {
    if (!enabled()) return;
    const Layout layout = make_layout(cfg);
    const Mesh mesh(layout);
    zero_ = layout.dp > 1 ? layout.zero : 0;
    dp_size_ = layout.dp;
    by_dp_.assign(static_cast<size_t>(world.size()), -1);
    for (int r = 0; r < world.size(); r++) {
        group_.push_back(mesh.group_color(MeshDim::dp, r));
        dp_.push_back(mesh.coord_of(r).dp);
        by_dp_[static_cast<size_t>(group_.back() * dp_size_ + dp_.back())] = r;
    }
}

bool ReplicaCheck::due(i64 step) const {
    // Also whenever a checkpoint is due, so that checkpoints hold checked weights, and after the
    // last step.
    return step % every_ == 0 || checkpoint_due(cfg_, step) || step == cfg_.train.steps;
}

std::vector<std::uint64_t> ReplicaCheck::gather(i64 n) {
    PX_ASSERT(static_cast<i64>(window_.size()) == n * kWords, "the window holds every step's words");
    std::vector<i64> in(window_.size()), all(window_.size() * static_cast<size_t>(world_.size()));
    std::memcpy(in.data(), window_.data(), in.size() * sizeof(i64));
    world_.all_gather(all.data(), in.data(), static_cast<i64>(in.size()));
    std::vector<std::uint64_t> out(all.size());
    std::memcpy(out.data(), all.data(), all.size() * sizeof(i64));
    return out;
}

ReplicaCheck::Finding ReplicaCheck::examine(const std::vector<std::uint64_t>& all, i64 n,
                                            i64 first_step) const {
    const int world = world_.size();
    auto word = [&](int r, i64 k, Word w) {
        return all[static_cast<size_t>((r * n + k) * kWords + w)];
    };
    std::map<int, std::vector<int>> groups;  // colour -> world ranks
    for (int r = 0; r < world; r++) groups[group_[static_cast<size_t>(r)]].push_back(r);
    // The kinds of evidence in the order a step makes them: where a fault entered comes first.
    struct Kind {
        Word replicated;  // kWords: none
        Word own, checked;
        const char *of, *shard_of;
    };
    const Kind kinds[] = {
        {grads, grads_own, grads_checked, "reduced gradients", "reduced gradient shard"},
        {weights, shard_own, shard_checked, "weights", "ZeRO shard (its weights and Adam moments)"},
        {metrics, kWords, kWords, "step metrics (loss, gradient norm)", ""},
    };
    for (i64 k = 0; k < n; k++) {
        for (const Kind& kind : kinds) {
            Finding f;
            std::vector<std::string> parts, again;
            for (const auto& [colour, ranks] : groups) {
                // A replicated hash: the majority, and those apart from it.
                std::map<std::uint64_t, int> votes;
                for (int r : ranks) votes[word(r, k, kind.replicated)]++;
                if (votes.size() > 1) {
                    std::uint64_t majority = 0;
                    bool found = false;
                    for (const auto& [value, count] : votes)
                        if (2 * count > static_cast<int>(ranks.size())) majority = value, found = true;
                    std::vector<int> bad;
                    for (int r : ranks)
                        if (!found || word(r, k, kind.replicated) != majority) {
                            bad.push_back(r);
                            f.suspects.push_back({r, kind.replicated});
                        }
                    const std::string of = std::string("the ") + kind.of + " of ";
                    if (!found) {
                        f.no_majority = true;
                        const std::string who = of + "the data-parallel replicas " + ranks_phrase(bad) + " disagree";
                        parts.push_back(who + ", with no majority to name the faulty one");
                        again.push_back(who);
                    } else {
                        parts.push_back(of + ranks_phrase(bad) +
                                        (bad.size() == 1 ? " differ from its" : " differ from their") +
                                        " data-parallel replicas'");
                        again.push_back(of + ranks_phrase(bad) + " disagree with their data-parallel replicas");
                    }
                }
                if (kind.own == kWords) continue;
                // A ZeRO shard: the owner's against the second copy the previous dp rank keeps.
                for (int owner : ranks) {
                    const int d = dp_[static_cast<size_t>(owner)];
                    const int keeper = by_dp_[static_cast<size_t>(colour * dp_size_ + (d + dp_size_ - 1) % dp_size_)];
                    if (word(owner, k, kind.own) == word(keeper, k, kind.checked)) continue;
                    f.no_majority = true;
                    f.suspects.push_back({owner, kind.own});
                    f.suspects.push_back({keeper, kind.checked});
                    const std::string own = "world rank " + std::to_string(owner) + "'s " + kind.shard_of;
                    const std::string second = "world rank " + std::to_string(keeper);
                    parts.push_back(own + " differs from the second copy of it that " + second +
                                    " keeps, with no third copy to name the faulty one");
                    again.push_back(own + " and " + second + "'s second copy of it disagree");
                }
            }
            if (f.suspects.empty()) continue;
            f.step = first_step + k;
            for (size_t i = 0; i < parts.size(); i++) {
                f.what += (i ? "; " : "") + parts[i];
                f.again += (i ? "; " : "") + again[i];
            }
            return f;
        }
    }
    return {};
}

bool ReplicaCheck::after_step(Job& job) {
    if (!enabled()) return false;
    const i64 step = job.steps_done();
    const bool checking = rerun_to_ > 0 || due(step);
    // This step's words (the gradient's from the grads hook of start()).
    std::uint64_t words[kWords] = {};
    std::copy(step_grads_, step_grads_ + 3, words + grads);
    std::fill(step_grads_, step_grads_ + 3, 0);
    if (zero_ != 3)  // ZeRO-3 holds a shard of the weights
        words[weights] = hash_floats(job.model().params(), job.model().table().total) | 1;
    words[shard_own] = hash_shard(job.data().own_shard());
    words[shard_checked] = hash_shard(job.data().checked_shard());
    words[metrics] = hash_metrics(job.history().back());
    window_.insert(window_.end(), words, words + kWords);
    if (!checking) return false;
    const i64 n = static_cast<i64>(window_.size()) / kWords;
    const std::vector<std::uint64_t> all = gather(n);
    window_.clear();
    const Finding f = examine(all, n, step - n + 1);
    const bool report = world_.rank() == 0;
    // Every rank's words of step k of the window, for naming after a re-run.
    auto words_at = [&](i64 k) {
        std::vector<std::uint64_t> out;
        for (int r = 0; r < world_.size(); r++) {
            const auto at = all.begin() + static_cast<std::ptrdiff_t>((r * n + k) * kWords);
            out.insert(out.end(), at, at + kWords);
        }
        return out;
    };

    if (rerun_to_ > 0) {  // re-running after a mismatch: every step is checked
        if (f.step != 0) {
            const std::vector<int> bad = f.ranks();
            std::string msg = "silent data corruption: " + f.again + " again at step " +
                              std::to_string(step) + " of the re-run (first seen at step " +
                              std::to_string(rerun_to_) + "), so the fault is persistent: it follows "
                              "the hardware";
            if (f.no_majority)
                msg += " (with two copies that disagree, the faulty rank among them cannot be told "
                       "apart)";
            msg += ". Take the node";
            msg += bad.size() == 1 ? "" : "s";
            msg += " of " + ranks_phrase(bad) +
                   " out of the job and restart it; checkpoint.resume = \"auto\" continues from the "
                   "newest checkpoint, whose weights were checked";
            throw CorruptionError(msg);
        }
        if (step == first_.step) rerun_words_ = words_at(0);
        if (step < rerun_to_) return false;
        // The faulty ranks: the first run's majority's outliers; without a majority, those whose
        // word at the first step that disagreed differs from the re-run's.
        std::vector<int> culprits;
        if (first_.no_majority) {
            for (const auto& [r, w] : first_.suspects) {
                const size_t at = static_cast<size_t>(r * kWords + w);
                if (first_words_[at] != rerun_words_[at]) culprits.push_back(r);
            }
            std::sort(culprits.begin(), culprits.end());
            culprits.erase(std::unique(culprits.begin(), culprits.end()), culprits.end());
        }
        if (culprits.empty()) culprits = first_.ranks();
        if (report)
            std::fprintf(stderr,
                         "parallax: replica check: the re-run of %s agrees on every replica%s, so "
                         "the fault on %s was transient; training continues from the re-run\n",
                         steps_phrase(snap_.step + 1, step).c_str(),
                         first_.no_majority ? "" : " and with the first run's majority",
                         ranks_phrase(culprits).c_str());
        rerun_to_ = 0;
        job.snapshot(snap_);
        return false;
    }
    if (f.step == 0) {
        job.snapshot(snap_);
        return false;
    }
    mismatches_++;
    if (report) {
        std::string when;
        if (f.step != step) when = " (at step " + std::to_string(f.step) + ")";
        std::fprintf(stderr,
                     "parallax: replica check at step %lld: %s%s; re-running %s from the state "
                     "checked at step %lld to tell a transient fault from a persistent one\n",
                     static_cast<long long>(step), f.what.c_str(), when.c_str(),
                     steps_phrase(snap_.step + 1, step).c_str(), static_cast<long long>(snap_.step));
        std::fflush(stderr);
    }
    first_ = f;
    first_words_ = words_at(f.step - (step - n + 1));
    rerun_words_.clear();
    rerun_to_ = step;
    job.rewind(snap_);
    return true;
}

void ReplicaCheck::start(Job& job) {
    if (!enabled()) return;
    job.data().check_updates();
    job.snapshot(snap_);
    window_.clear();
    // The reduced gradient as the update reads it, after every earlier hook (the fault injector).
    StepHooks h;
    h.grads = [this, &job](i64, float* g) {
        if (zero_ <= 1) {
            step_grads_[0] = hash_floats(g, job.model().table().total) | 1;
            return;
        }
        for (const auto& [at, s] : {std::pair{1, job.data().own_shard()}, std::pair{2, job.data().checked_shard()}})
            step_grads_[at] = s.w ? hash_floats(g + s.lo, s.hi - s.lo) | 1 : 0;
    };
    job.add_step_hooks(std::move(h));
}

}  // namespace px
