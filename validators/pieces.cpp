#include "validators/pieces.h"

#include "core/base/error.h"
#include "core/model/fp8.h"
#include "core/train/faults.h"  // hash_floats
#include "core/train/job.h"

#include <algorithm>
#include <cstring>

namespace px {

// ---- StepProbes ------------------------------------------------------------------------------

StepProbes::StepProbes(std::vector<std::string> patterns)
    : filter_(patterns), patterns_(std::move(patterns)) {}

bool StepProbes::wants(const ProbeKey& key) const { return filter_.wants(key); }

void StepProbes::capture(const ProbeKey& key, const float* local, const ShardSpec& spec) {
    ProbeRecorder* rec = nullptr;
    {
        std::lock_guard lk(mu_);
        std::unique_ptr<ProbeRecorder>& slot = steps_[key.step];
        if (!slot) {
            if (!spare_.empty()) {
                slot = std::move(spare_.back());
                spare_.pop_back();
            } else {
                slot = std::make_unique<ProbeRecorder>(patterns_);
            }
        }
        rec = slot.get();  // stable: only take() removes it, after the rank's step
    }
    rec->capture(key, local, spec);
}

std::unique_ptr<ProbeRecorder> StepProbes::take(i64 step) {
    std::lock_guard lk(mu_);
    auto it = steps_.find(step);
    if (it == steps_.end()) return std::make_unique<ProbeRecorder>(patterns_);
    std::unique_ptr<ProbeRecorder> rec = std::move(it->second);
    steps_.erase(it);
    return rec;
}

void StepProbes::recycle(std::unique_ptr<ProbeRecorder> rec) {
    rec->clear();
    std::lock_guard lk(mu_);
    spare_.push_back(std::move(rec));
}

// ---- PieceCheck ------------------------------------------------------------------------------

const RankPieces* PieceCheck::first_differing() const {
    for (const RankPieces& h : holders)
        if (!h.cmp.equal()) return &h;
    return nullptr;
}

std::int64_t PieceCheck::worst_ulp() const {
    std::int64_t w = 0;
    for (const RankPieces& h : holders) w = worse_ulp(w, h.cmp.max_ulp);
    return w;
}

namespace {

i64 numel_of(const std::vector<i64>& shape) {
    i64 n = 1;
    for (i64 d : shape) n *= d;
    return n;
}

bool disjoint(const Hyperslab& a, const Hyperslab& b) {
    for (size_t d = 0; d < a.lo.size(); d++)
        if (a.hi[d] <= b.lo[d] || b.hi[d] <= a.lo[d]) return true;
    return false;
}

// Whether a rank's pieces hold exactly the reference's bits, run by run.
bool pieces_equal(const std::vector<i64>& shape, const std::vector<ProbeRecorder::PieceView>& ps,
                  const float* want) {
    bool same = true;
    for (const ProbeRecorder::PieceView& p : ps) {
        for_each_run(shape, *p.slab, [&](i64 off, i64 local, i64 n) {
            same = same && std::memcmp(want + off, p.data + local,
                                       static_cast<size_t>(n) * sizeof(float)) == 0;
        });
        if (!same) return false;
    }
    return true;
}

// Elements of the logical tensor that no piece covers (and the first of them). Distinct slabs
// that are pairwise disjoint and add up to the tensor cover it without a pass over its elements
// (shards and replicas, the layouts' cuts); anything else is counted element by element.
i64 uncovered(const std::vector<i64>& shape,
              const std::vector<std::vector<ProbeRecorder::PieceView>>& all, i64* first) {
    const i64 total = numel_of(shape);
    std::vector<const Hyperslab*> distinct;
    for (const auto& ps : all)
        for (const ProbeRecorder::PieceView& p : ps) {
            bool seen = false;
            for (const Hyperslab* d : distinct) seen = seen || *d == *p.slab;
            if (!seen) distinct.push_back(p.slab);
        }
    i64 sum = 0;
    bool apart = true;
    for (size_t i = 0; i < distinct.size(); i++) {
        sum += distinct[i]->numel();
        for (size_t j = 0; j < i && apart; j++) apart = disjoint(*distinct[i], *distinct[j]);
    }
    *first = -1;
    if (apart && sum == total) return 0;
    std::vector<unsigned char> have(static_cast<size_t>(total), 0);
    for (const Hyperslab* s : distinct)
        for_each_run(shape, *s, [&](i64 off, i64, i64 n) {
            std::fill(have.begin() + off, have.begin() + off + n, 1);
        });
    i64 missing = 0;
    for (i64 i = 0; i < total; i++)
        if (!have[static_cast<size_t>(i)]) {
            if (*first < 0) *first = i;
            missing++;
        }
    return missing;
}

// Replicas of one piece that differ from their twins: per distinct slab held by several ranks,
// the ranks whose copy is not the majority's (without a majority, not the lowest rank's).
void find_odd_replicas(const std::vector<int>& ranks,
                       const std::vector<std::vector<ProbeRecorder::PieceView>>& all,
                       PieceCheck& out) {
    struct Copy {
        int rank;
        std::uint64_t hash;
    };
    std::vector<std::pair<const Hyperslab*, std::vector<Copy>>> groups;
    for (size_t k = 0; k < all.size(); k++)
        for (const ProbeRecorder::PieceView& p : all[k]) {
            const std::uint64_t h = hash_floats(p.data, p.slab->numel());
            auto it = std::find_if(groups.begin(), groups.end(),
                                   [&](const auto& g) { return *g.first == *p.slab; });
            if (it == groups.end()) {
                groups.push_back({p.slab, {}});
                it = groups.end() - 1;
            }
            it->second.push_back({ranks[k], h});
        }
    for (const auto& [slab, copies] : groups) {
        if (copies.size() < 2) continue;
        std::map<std::uint64_t, int> votes;
        for (const Copy& c : copies) votes[c.hash]++;
        if (votes.size() == 1) continue;
        std::uint64_t keep = copies.front().hash;
        for (const auto& [h, n] : votes)
            if (2 * n > static_cast<int>(copies.size())) keep = h;
        int twin = -1;
        for (const Copy& c : copies)
            if (c.hash == keep && twin < 0) twin = c.rank;
        for (const Copy& c : copies)
            if (c.hash != keep) {
                if (out.odd_replicas.empty() || c.rank < out.odd_replicas.front()) out.odd_twin = twin;
                out.odd_replicas.push_back(c.rank);
            }
    }
    std::sort(out.odd_replicas.begin(), out.odd_replicas.end());
    out.odd_replicas.erase(std::unique(out.odd_replicas.begin(), out.odd_replicas.end()),
                           out.odd_replicas.end());
}

}  // namespace

PieceCheck check_pieces(const std::string& name, const std::string& probe,
                        std::span<const float> want, const std::vector<i64>& shape,
                        const std::vector<const ProbeRecorder*>& ranks, bool twins) {
    const i64 total = numel_of(shape);
    PX_ASSERT(static_cast<i64>(want.size()) == total,
              "check_pieces: the reference of " + name + " has another size than its shape");
    PieceCheck out;
    std::vector<std::vector<ProbeRecorder::PieceView>> all;
    std::vector<int> holder_ranks;
    for (size_t k = 0; k < ranks.size(); k++) {
        if (ranks[k] == nullptr) continue;
        std::vector<ProbeRecorder::PieceView> ps = ranks[k]->pieces(probe);
        if (ps.empty()) continue;
        const int rank = static_cast<int>(k);
        if (ranks[k]->shape(probe) != shape)
            throw InternalError("world rank " + std::to_string(rank) + " offers " + probe +
                                " in another logical shape than the reference's");
        const std::string fault = ranks[k]->fault(probe);
        if (!fault.empty() && out.fault_rank < 0) {
            out.fault_rank = rank;
            out.fault = fault;
        }
        RankPieces h;
        h.rank = rank;
        i64 held = 0;
        for (const ProbeRecorder::PieceView& p : ps) held += p.slab->numel();
        if (pieces_equal(shape, ps, want.data())) {
            h.cmp.name = name;
            h.cmp.shape = shape;
        } else {  // only now element by element: its pieces over the reference
            std::vector<float> got = ranks[k]->overlay(probe, {want.begin(), want.end()});
            h.cmp = compare(name, want, got, shape);
            out.differing.push_back(rank);
        }
        h.cmp.count = held;
        out.holders.push_back(std::move(h));
        all.push_back(std::move(ps));
        holder_ranks.push_back(rank);
    }
    out.uncovered = total > 0 ? uncovered(shape, all, &out.first_uncovered) : 0;
    if (twins) find_odd_replicas(holder_ranks, all, out);
    return out;
}

void assemble(std::span<float> out, const std::string& probe,
              const std::vector<const ProbeRecorder*>& ranks) {
    for (size_t k = ranks.size(); k-- > 0;) {
        if (ranks[k] == nullptr) continue;
        const std::vector<i64> shape = ranks[k]->shape(probe);
        for (const ProbeRecorder::PieceView& p : ranks[k]->pieces(probe))
            for_each_run(shape, *p.slab, [&](i64 off, i64 local, i64 n) {
                std::memcpy(out.data() + off, p.data + local, static_cast<size_t>(n) * sizeof(float));
            });
    }
}

// ---- Holdings --------------------------------------------------------------------------------

Holdings::Holdings(const Job& job) {
    const GPT& model = job.model();
    const ParamTable& table = model.table();
    const Range all{0, table.total}, mine = job.data().update_range();
    const int zero = job.data().zero_stage();
    const Range grads = zero >= 2 ? mine : all, weights = zero == 3 ? mine : all;
    auto held = [](const TableEntry& e, Range r) {
        return std::max<i64>(0, std::min(r.hi, e.offset + e.numel()) - std::max(r.lo, e.offset));
    };
    for (const TableEntry& e : table.entries) {
        const std::string at =
            (e.layer < 0 ? std::string("-") : std::to_string(e.layer)) + "/";
        const std::string tensor = e.short_name;
        const std::pair<std::string, i64> rows[] = {
            {"grad/" + at + "param/" + tensor, held(e, grads)},
            {"optim/" + at + "param/" + tensor, held(e, weights)},
            {"optim/" + at + "adam.m/" + tensor, held(e, mine)},
            {"optim/" + at + "adam.v/" + tensor, held(e, mine)},
        };
        for (const auto& [probe, n] : rows)
            if (n > 0) elements[probe] = n;
    }
    if (const Fp8Scaling* f = job.fp8(); f && f->delayed() && f->gemms() > 0) {
        const i64 slots = static_cast<i64>(f->gemms()) * Fp8Scaling::kRoles;
        elements["optim/-/fp8/scale"] = slots;
        elements["optim/-/fp8/amax_history"] = slots * f->history_len();
    }
    if (job.loss_scaler().dynamic()) elements["optim/-/loss_scaler/state"] = 2;
}

std::string missing_pieces(const Holdings& held, const ProbeRecorder& rec, i64 step, int rank) {
    const std::string at = std::to_string(step) + "/";
    for (const auto& [probe, want] : held.elements) {
        i64 got = 0;
        for (const ProbeRecorder::PieceView& p : rec.pieces(at + probe)) got += p.slab->numel();
        if (got != want)
            return "world rank " + std::to_string(rank) + " holds " + std::to_string(want) +
                   " elements of " + at + probe + " but offered " + std::to_string(got) +
                   " to the comparison: its pieces would be left out";
    }
    return {};
}

}  // namespace px
