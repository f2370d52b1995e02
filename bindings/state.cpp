// A job's state as numpy arrays: the logical (layout-free) weights, gradients and Adam moments,
// each rank's own pieces, and the shard map that says which piece of which tensor a rank holds.
//
// No copy where the memory allows: on a single device a logical tensor is the job's own memory
// (a view into the parameter, gradient or moment arena, whose base is the parallax.Job that owns
// it, so the job outlives the array and the array sees every later update). Under a parallel
// layout no rank holds a logical tensor whole in one place (tp shards, ZeRO shards, stages), so
// the logical tensors are assembled, copied, from every rank's pieces (each logical element from
// the one rank that checkpoints write it from: core/parallel/state_slices.h), with no
// communication; the copies are read-only as the views are. A rank's own pieces are views again.
#include "bindings/state.h"

#include "core/base/error.h"
#include "core/parallel/state_slices.h"
#include "core/parallel/tensor/tp_model.h"

#include <algorithm>

namespace px::py_bind {

namespace {

py::array view(const float* data, const std::vector<i64>& shape, const py::handle& owner) {
    std::vector<py::ssize_t> dims(shape.begin(), shape.end());
    py::array a(py::dtype::of<float>(), dims, {}, data, owner);
    // Read-only: the job writes these arrays, and a write from Python would not reach the other
    // ranks' copies of a replicated tensor.
    py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
    return a;
}

// Where the floats of `what` live on a rank: local float i of the table, for i in [lo, hi), is
// at base[i - lo].
struct Local {
    const float* base = nullptr;
    i64 lo = 0, hi = 0;
};

Local local_of(Job& job, const RankState& s, What what) {
    switch (what) {
        case What::weights: return {s.params + s.weights.lo, s.weights.lo, s.weights.hi};
        // A replica holds the reduced gradient where it writes the state (its ZeRO-2/3 shard).
        case What::grads: return {job.data().grads() + s.writes.lo, s.writes.lo, s.writes.hi};
        case What::adam_m: return {s.m, s.moments.lo, s.moments.hi};
        case What::adam_v: return {s.v, s.moments.lo, s.moments.hi};
    }
    return {};
}

const TpLayers* tp_layers(const Job& job) {
    return dynamic_cast<const TpLayers*>(job.model().parallel_layers());
}

// "0:32" or "0:32,64:96": sorted indices as ranges.
std::string ranges_text(std::vector<i64> v, i64 whole) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    if (static_cast<i64>(v.size()) == whole) return ":";
    std::string s;
    for (size_t i = 0; i < v.size();) {
        size_t j = i;
        while (j + 1 < v.size() && v[j + 1] == v[j] + 1) j++;
        if (!s.empty()) s += ",";
        s += std::to_string(v[i]) + ":" + std::to_string(v[j] + 1);
        i = j + 1;
    }
    return s;
}

}  // namespace

const char* what_name(What w) {
    switch (w) {
        case What::weights: return "weights";
        case What::grads: return "grads";
        case What::adam_m: return "adam_m";
        case What::adam_v: return "adam_v";
    }
    return "?";
}

py::dict logical_tensors(SteppedRun& run, What what, const py::handle& owner) {
    const ParamTable full = ParamTable::build(run.config().model);
    py::dict out;
    if (run.world_size() == 1) {
        Job& job = run.job(0);
        const RankState s = job.rank_state();
        const Local l = local_of(job, s, what);
        for (const TableEntry& e : job.model().table().entries)
            out[py::str(e.name)] = view(l.base + (e.offset - l.lo), e.shape(), owner);
        return out;
    }
    std::vector<py::array_t<float>> arrays;
    std::vector<float*> data;
    for (const TableEntry& e : full.entries) {
        std::vector<py::ssize_t> dims;
        for (const i64 d : e.shape()) dims.push_back(d);
        arrays.emplace_back(dims);
        data.push_back(arrays.back().mutable_data());
        std::fill(data.back(), data.back() + e.numel(), 0.0f);
    }
    for (int r = 0; r < run.world_size(); r++) {
        Job& job = run.job(r);
        const RankState s = job.rank_state();
        const Local l = local_of(job, s, what);
        const ParamTable& t = job.model().table();
        for (size_t i = 0; i < t.entries.size(); i++) {
            const TableEntry& e = t.entries[i];
            if (!s.writes_entry[i]) continue;
            const i64 a = std::max({e.offset, s.writes.lo, l.lo});
            const i64 b = std::min({e.offset + e.numel(), s.writes.hi, l.hi});
            if (a >= b) continue;
            const std::vector<i64> idx = logical_indices(job.model(), e);  // tp, ep, whole
            float* dst = data[static_cast<size_t>(e.id)];
            for (i64 k = a; k < b; k++)
                dst[idx[static_cast<size_t>(k - e.offset)]] = l.base[k - l.lo];
        }
    }
    // Read-only like the single device's views, so that code written against one layout runs
    // under every other: a write would change only this copy, never the job (arr.copy() for one
    // to change).
    for (size_t i = 0; i < full.entries.size(); i++) {
        auto* proxy = py::detail::array_proxy(arrays[i].ptr());
        proxy->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
        out[py::str(full.entries[i].name)] = arrays[i];
    }
    return out;
}

py::dict rank_view(SteppedRun& run, int rank, const py::handle& owner) {
    Job& job = run.job(rank);
    const RankState s = job.rank_state();
    const Coord c = run.mesh().coord_of(rank);
    py::dict out;
    out["rank"] = rank;
    out["pp"] = c.pp;
    out["dp"] = c.dp;
    out["tp"] = c.tp;
    out["cp"] = c.cp;
    const ModelPart& part = job.model().part();
    if (job.config().model.is_moe())  // the experts of every MoE layer it holds, [lo, hi)
        out["experts"] = py::make_tuple(part.expert_lo, part.all_experts()
                                                            ? job.config().model.moe_experts
                                                            : part.expert_hi);
    py::list layers;
    for (int ch = 0; ch < run.layout().virtual_stages; ch++) {
        const LayerRange lr = run.mesh().layers(c.pp, ch);
        layers.append(py::make_tuple(lr.lo, lr.hi));
    }
    out["layers"] = layers;
    for (const What w : {What::weights, What::grads, What::adam_m, What::adam_v}) {
        const Local l = local_of(job, s, w);
        py::dict d;
        for (const TableEntry& e : job.model().table().entries)
            if (l.lo <= e.offset && e.offset + e.numel() <= l.hi)
                d[py::str(e.name)] = view(l.base + (e.offset - l.lo), e.shape(), owner);
        out[what_name(w)] = d;
        // The whole of what the rank holds, as one flat view, and which floats of its table.
        out[(std::string(what_name(w)) + "_flat").c_str()] =
            view(l.base, {l.hi - l.lo}, owner);
        out[(std::string(what_name(w)) + "_range").c_str()] = py::make_tuple(l.lo, l.hi);
    }
    return out;
}

py::list shard_map(SteppedRun& run) {
    const ModelConfig& mc = run.config().model;
    const ParamTable full = ParamTable::build(mc);
    py::list rows;
    for (int r = 0; r < run.world_size(); r++) {
        Job& job = run.job(r);
        const RankState s = job.rank_state();
        const Coord c = run.mesh().coord_of(r);
        const TpLayers* tpl = tp_layers(job);
        const ParamTable& t = job.model().table();
        for (size_t i = 0; i < t.entries.size(); i++) {
            const TableEntry& e = t.entries[i];
            const TableEntry& whole = full.entries[static_cast<size_t>(e.id)];
            std::vector<i64> rws, cls;
            if (tpl || job.model().expert_share(e)) {  // a tp shard, an ep rank's experts
                for (const i64 k : logical_indices(job.model(), e)) {
                    rws.push_back(k / whole.cols);
                    cls.push_back(k % whole.cols);
                }
            } else {
                for (i64 k = 0; k < whole.rows; k++) rws.push_back(k);
                for (i64 k = 0; k < whole.cols; k++) cls.push_back(k);
            }
            std::string slice = e.name + "[";
            if (!whole.is_vector()) slice += ranges_text(rws, whole.rows) + ", ";
            slice += ranges_text(cls, whole.cols) + "]";
            py::dict row;
            row["rank"] = r;
            row["pp"] = c.pp;
            row["dp"] = c.dp;
            row["tp"] = c.tp;
            row["tensor"] = e.name;
            row["shape"] = py::tuple(py::cast(whole.shape()));
            row["local_shape"] = py::tuple(py::cast(e.shape()));
            row["slice"] = slice;
            const auto held = [&](Range g) {
                return std::max<i64>(0, std::min(e.offset + e.numel(), g.hi) - std::max(e.offset, g.lo));
            };
            row["weights"] = held(s.weights);        // elements of its weights held between steps
            row["moments"] = held(s.moments);        // elements of its Adam moments held
            row["writes"] = s.writes_entry[i] ? held(s.writes) : 0;  // checkpointed by this rank
            rows.append(row);
        }
    }
    return rows;
}

}  // namespace px::py_bind
