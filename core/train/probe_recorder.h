// Recording probes (core/model/probe.h) and putting their pieces back together: a run-time
// feature beside the spike guard and the FP8 drift monitor. A ProbeRecorder is the ProbeSink a
// test, the harness or a front end attaches to every rank's job (in-process ranks are threads
// sharing one recorder): it keeps the probes its patterns select, piece by piece as each rank
// captured them, and unshards a probe into its logical tensor, which can then be compared with
// the single device's (validators/compare.h).
//
// Pieces. Each capture brings the slabs of the logical tensor this rank holds. Replicas of the
// same slab (dp replicas all hold the whole reduced gradient) are kept once: a replica that
// disagrees with the first, bit for bit, is a fault that unshard() reports, naming the probe and
// the element. A probe is complete when its slabs cover the logical tensor; slabs that overlap
// must agree on the overlap.
//
// Index
//   ProbeRecorder   patterns, a step stride; names() in capture order; unshard(); complete();
//                   overlay() (its pieces over a reference tensor); pieces() (the pieces as held)
#pragma once
#include "core/model/probe.h"

#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace px {

// Calls f(logical_offset, local_offset, n) for each run of contiguous elements of `slab` (along
// the last dimension of a row-major tensor of `shape`), in row-major order: the slab's elements
// [local_offset, +n) sit at the logical tensor's [logical_offset, +n).
template <class F>
void for_each_run(const std::vector<i64>& shape, const Hyperslab& slab, F&& f) {
    const size_t nd = shape.size();
    if (nd == 0) {
        f(0, 0, 1);
        return;
    }
    if (slab.numel() == 0) return;
    const i64 run = slab.hi[nd - 1] - slab.lo[nd - 1];
    std::vector<i64> idx(slab.lo.begin(), slab.lo.end());
    for (i64 local = 0;; local += run) {
        i64 off = 0;
        for (size_t d = 0; d < nd; d++) off = off * shape[d] + idx[d];
        f(off, local, run);
        // Next index over the leading dimensions (odometer).
        size_t d = nd - 1;
        while (d-- > 0) {
            if (++idx[d] < slab.hi[d]) break;
            idx[d] = slab.lo[d];
        }
        if (d == static_cast<size_t>(-1)) return;
    }
}

class ProbeRecorder : public ProbeSink {
public:
    // Records the probes whose name matches one of `patterns` (glob_match), at steps 1,
    // 1 + stride, 1 + 2·stride, ... (probes outside a Job, step 0, always pass the stride).
    explicit ProbeRecorder(std::vector<std::string> patterns, i64 step_stride = 1);

    // Probes matching one of `patterns` are not recorded even when selected (golden traces leave
    // out "*/mgrad/**": microbatch gradients depend on the layout's microbatch cut).
    void exclude(std::vector<std::string> patterns) { exclude_ = std::move(patterns); }

    bool wants(const ProbeKey& key) const override;
    void capture(const ProbeKey& key, const float* local, const ShardSpec& spec) override;

    std::vector<std::string> names() const;   // every probe recorded, by first capture
    bool has(const std::string& name) const;  // whether the probe was captured at all
    // The dtype the library held the probe's tensor in (its floats are that dtype's values);
    // f32 for a probe never captured.
    DType dtype(const std::string& name) const;
    // The logical tensor of a probe from all its pieces, row-major; *shape its logical shape.
    // Throws px::Error naming the probe when it was never captured, when pieces are missing,
    // when overlapping pieces or replicas disagree, or when ranks gave different shapes.
    std::vector<float> unshard(const std::string& name, std::vector<i64>* shape = nullptr) const;
    bool complete(const std::string& name) const;  // unshard() would succeed
    // `base` (a logical tensor of the probe's shape, e.g. the reference's) with every piece this
    // recorder holds written over it: compared with base, it shows where this recorder's pieces
    // differ, in logical coordinates (one recorder per rank names the rank). Throws px::Error
    // when the probe was never captured or base has another size.
    std::vector<float> overlay(const std::string& name, std::vector<float> base) const;
    // A probe's pieces as this recorder holds them, each its slab of the logical tensor and the
    // slab's elements (row-major), without a copy: valid until the probe is captured again or
    // the recorder cleared (read a recorder the job has stopped writing). Empty when the probe
    // was never captured.
    struct PieceView {
        const Hyperslab* slab;
        const float* data;
    };
    std::vector<PieceView> pieces(const std::string& name) const;
    std::vector<i64> shape(const std::string& name) const;  // logical; empty if never captured
    // The first disagreement between this recorder's own captures of a probe (two captures of
    // one piece, or two logical shapes); empty when there is none.
    std::string fault(const std::string& name) const;
    i64 bytes() const;  // floats held, in bytes
    // Forgets every probe (patterns stay). Their buffers are kept and reused by the next
    // captures of the same sizes, so that a recorder cleared after every step (validate's
    // per-step gradients, bench_probes) does not ask the system for fresh pages each step.
    void clear();

private:
    struct Piece {
        Hyperslab slab;
        std::vector<float> data;  // the slab's elements, row-major
    };
    struct Probe {
        std::vector<i64> shape;  // logical
        DType dtype = DType::f32;  // as the library holds it
        std::vector<Piece> pieces;
        std::string fault;  // the first disagreement between captures; empty: none
    };

    std::vector<std::string> patterns_, exclude_;
    i64 stride_ = 1;
    mutable std::mutex mutex_;  // guards everything below
    std::unordered_map<std::string, Probe> probes_;
    std::vector<std::string> order_;
    std::unordered_map<i64, std::vector<std::vector<float>>> spare_;  // cleared buffers, by size
};

}  // namespace px
