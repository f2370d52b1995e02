#include "core/train/probe_recorder.h"

#include "core/base/error.h"

#include <cstring>

namespace px {

namespace {

std::string shape_text(const std::vector<i64>& s) {
    std::string t = "(";
    for (size_t i = 0; i < s.size(); i++) {
        if (i > 0) t += ',';
        t += std::to_string(s[i]);
    }
    t += ')';
    return t;
}

}  // namespace

ProbeRecorder::ProbeRecorder(std::vector<std::string> patterns, i64 step_stride)
    : patterns_(std::move(patterns)), stride_(step_stride < 1 ? 1 : step_stride) {}

bool ProbeRecorder::wants(const ProbeKey& key) const {
    if (key.step > 0 && (key.step - 1) % stride_ != 0) return false;
    const std::string name = key.name();
    for (const std::string& p : exclude_)
        if (glob_match(p, name)) return false;
    for (const std::string& p : patterns_)
        if (glob_match(p, name)) return true;
    return false;
}

void ProbeRecorder::capture(const ProbeKey& key, const float* local, const ShardSpec& spec) {
    const std::string name = key.name();
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, fresh] = probes_.try_emplace(name);
    Probe& p = it->second;
    if (fresh) {
        p.shape = spec.logical_shape;
        p.dtype = key.dtype;
        order_.push_back(name);
    } else if (p.shape != spec.logical_shape && p.fault.empty()) {
        p.fault = "captures give logical shapes " + shape_text(p.shape) + " and " +
                  shape_text(spec.logical_shape);
        return;
    }
    i64 at = 0;
    for (const Hyperslab& s : spec.pieces) {
        PX_ASSERT(s.lo.size() == spec.logical_shape.size() && s.hi.size() == s.lo.size(),
                  "a probe's piece with another rank than its logical shape: " + name);
        for (size_t d = 0; d < s.lo.size(); d++)
            PX_ASSERT(s.lo[d] >= 0 && s.lo[d] <= s.hi[d] && s.hi[d] <= spec.logical_shape[d],
                      "a probe's piece outside its logical shape: " + name);
        const i64 n = s.numel();
        const float* data = local + at;
        at += n;
        bool replica = false;
        for (const Piece& q : p.pieces) {
            if (q.slab != s) continue;
            replica = true;
            if (p.fault.empty() &&
                std::memcmp(q.data.data(), data, static_cast<size_t>(n) * sizeof(float)) != 0) {
                i64 e = 0;
                while (std::memcmp(&q.data[static_cast<size_t>(e)], data + e, sizeof(float)) == 0)
                    e++;
                p.fault = "two captures of the same piece disagree at its element " +
                          std::to_string(e) + " (" +
                          std::to_string(q.data[static_cast<size_t>(e)]) + " vs " +
                          std::to_string(data[e]) + ")";
            }
            break;
        }
        if (replica) continue;
        std::vector<float> buf;
        auto spare = spare_.find(n);
        if (spare != spare_.end() && !spare->second.empty()) {
            buf = std::move(spare->second.back());
            spare->second.pop_back();
            std::memcpy(buf.data(), data, static_cast<size_t>(n) * sizeof(float));
        } else {
            buf.assign(data, data + n);
        }
        p.pieces.push_back({s, std::move(buf)});
    }
}

std::vector<std::string> ProbeRecorder::names() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return order_;
}

bool ProbeRecorder::has(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return probes_.count(name) > 0;
}

DType ProbeRecorder::dtype(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = probes_.find(name);
    return it == probes_.end() ? DType::f32 : it->second.dtype;
}

std::vector<float> ProbeRecorder::overlay(const std::string& name, std::vector<float> base) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = probes_.find(name);
    std::string where = "probe ";
    where += name;
    if (it == probes_.end()) throw Error(where + " was never captured by this recorder");
    const Probe& p = it->second;
    i64 total = 1;
    for (i64 d : p.shape) total *= d;
    if (static_cast<i64>(base.size()) != total)
        throw Error(where + ": the base tensor has " + std::to_string(base.size()) +
                    " elements, the probe's logical shape " + std::to_string(total));
    for (const Piece& q : p.pieces)
        for_each_run(p.shape, q.slab, [&](i64 off, i64 local, i64 n) {
            std::memcpy(base.data() + off, q.data.data() + local,
                        static_cast<size_t>(n) * sizeof(float));
        });
    return base;
}

std::vector<float> ProbeRecorder::unshard(const std::string& name, std::vector<i64>* shape) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = probes_.find(name);
    if (it == probes_.end()) {
        std::string msg = "probe ";
        msg += name;
        msg +=
            " was never captured; check the recorder's patterns and step stride, and that the"
            " job ran that step with probes set";
        throw Error(msg);
    }
    const Probe& p = it->second;
    std::string where = "probe ";
    where += name;
    if (!p.fault.empty()) throw Error(where + ": " + p.fault + "; the ranks' copies differ");
    i64 total = 1;
    for (i64 d : p.shape) total *= d;
    std::vector<float> out(static_cast<size_t>(total), 0.0f);
    std::vector<unsigned char> have(static_cast<size_t>(total), 0);
    for (const Piece& q : p.pieces) {
        for_each_run(p.shape, q.slab, [&](i64 off, i64 local, i64 n) {
            for (i64 j = 0; j < n; j++) {
                const size_t o = static_cast<size_t>(off + j);
                const float v = q.data[static_cast<size_t>(local + j)];
                if (have[o] && std::memcmp(&out[o], &v, sizeof(float)) != 0)
                    throw Error(where + ": overlapping pieces disagree at logical element " +
                                std::to_string(off + j) + " (" + std::to_string(out[o]) + " vs " +
                                std::to_string(v) + ")");
                out[o] = v;
                have[o] = 1;
            }
        });
    }
    i64 missing = 0, first = -1;
    for (i64 i = 0; i < total; i++)
        if (!have[static_cast<size_t>(i)]) {
            if (first < 0) first = i;
            missing++;
        }
    if (missing > 0)
        throw Error(where + ": " + std::to_string(missing) + " of " + std::to_string(total) +
                    " elements of " + shape_text(p.shape) + " were captured by no rank (first: " +
                    std::to_string(first) + "); attach the recorder to every rank's job");
    if (shape) *shape = p.shape;
    return out;
}

bool ProbeRecorder::complete(const std::string& name) const {
    try {
        unshard(name);
        return true;
    } catch (const Error&) {
        return false;
    }
}

std::vector<ProbeRecorder::PieceView> ProbeRecorder::pieces(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<PieceView> out;
    auto it = probes_.find(name);
    if (it == probes_.end()) return out;
    for (const Piece& q : it->second.pieces) out.push_back({&q.slab, q.data.data()});
    return out;
}

std::vector<i64> ProbeRecorder::shape(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = probes_.find(name);
    return it == probes_.end() ? std::vector<i64>{} : it->second.shape;
}

std::string ProbeRecorder::fault(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = probes_.find(name);
    return it == probes_.end() ? std::string() : it->second.fault;
}

i64 ProbeRecorder::bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    i64 n = 0;
    for (const auto& [name, p] : probes_)
        for (const Piece& q : p.pieces) n += static_cast<i64>(q.data.size());
    return n * static_cast<i64>(sizeof(float));
}

void ProbeRecorder::clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [name, p] : probes_)
        for (Piece& q : p.pieces) {
            const i64 n = static_cast<i64>(q.data.size());
            spare_[n].push_back(std::move(q.data));
        }
    probes_.clear();
    order_.clear();
}

}  // namespace px
