#include "core/io/state.h"

#include "core/base/error.h"
#include "core/io/runfile.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

namespace px {

namespace {

bool same_history(const std::vector<StepMetrics>& a, const std::vector<StepMetrics>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++)
        if (std::memcmp(&a[i].loss, &b[i].loss, sizeof(double)) != 0 ||
            std::memcmp(&a[i].grad_norm, &b[i].grad_norm, sizeof(double)) != 0 ||
            std::memcmp(&a[i].val_loss, &b[i].val_loss, sizeof(double)) != 0)
            return false;
    return true;
}

}  // namespace

void LogicalState::allocate(const ModelConfig& mc) {
    table = ParamTable::build(mc);
    params.assign(static_cast<size_t>(table.total), 0.0f);
    m = v = params;
}

bool LogicalState::begin_part(const ModelConfig& mc, const std::vector<StepMetrics>& hist) {
    if (params.empty()) {
        allocate(mc);
        filled_.assign(params.size(), 0);
        history = hist;
        init_masks();
        return true;
    }
    return same_history(history, hist);
}

bool LogicalState::put(int id, i64 n, const i64* idx, const float* w, const float* mm,
                       const float* vv) {
    auto differ = [](float a, float b) { return std::memcmp(&a, &b, sizeof(float)) != 0; };
    const i64 base = table.entries[static_cast<size_t>(id)].offset;
    bool agree = true;
    for (i64 j = 0; j < n; j++) {
        const size_t dst = static_cast<size_t>(base + (idx ? idx[j] : j));
        if (filled_[dst] && differ(params[dst], w[j])) agree = false;
        params[dst] = w[j];
        filled_[dst] = 1;
        has_w_[dst] = 1;
        if (!mm) continue;
        if (has_mv_[dst] && (differ(m[dst], mm[j]) || differ(v[dst], vv[j]))) agree = false;
        m[dst] = mm[j];
        v[dst] = vv[j];
        has_mv_[dst] = 1;
    }
    return agree;
}

bool LogicalState::complete() const {
    if (filled_.empty()) return !params.empty();  // a state read back from a file
    return std::find(filled_.begin(), filled_.end(), 0) == filled_.end();
}

void LogicalState::init_masks() {
    has_w_.assign(params.size(), 0);
    has_mv_.assign(params.size(), 0);
}

bool LogicalState::absorb(const LogicalState& o) {
    if (o.params.empty()) return true;
    if (params.empty()) {
        *this = o;
        return true;
    }
    if (o.params.size() != params.size()) return false;
    bool agree = same_history(history, o.history);
    for (size_t i = 0; i < params.size(); i++) {
        if (o.has_w_[i]) {
            if (has_w_[i] && std::memcmp(&params[i], &o.params[i], sizeof(float)) != 0)
                agree = false;
            params[i] = o.params[i];
            has_w_[i] = 1;
        }
        if (o.has_mv_[i]) {
            if (has_mv_[i] && (std::memcmp(&m[i], &o.m[i], sizeof(float)) != 0 ||
                               std::memcmp(&v[i], &o.v[i], sizeof(float)) != 0))
                agree = false;
            m[i] = o.m[i];
            v[i] = o.v[i];
            has_mv_[i] = 1;
        }
    }
    // What complete() reads: the elements absorbed anywhere.
    if (filled_.size() == o.filled_.size())
        for (size_t i = 0; i < filled_.size(); i++) filled_[i] = filled_[i] || o.filled_[i];
    return agree;
}

namespace {

constexpr i64 kStateMagic = 0x50584c53;  // "PXLS"
constexpr i64 kStateVersion = 2;

// Bytes appended to / read from a word stream (each array starts on a word).
struct Words {
    std::vector<i64> w;
    size_t at = 0;
    void put(const void* data, size_t bytes) {
        const size_t n = (bytes + 7) / 8, base = w.size();
        w.resize(base + n, 0);
        if (bytes) std::memcpy(w.data() + base, data, bytes);
    }
    template <class T>
    void put_vec(const std::vector<T>& v) {
        w.push_back(static_cast<i64>(v.size()));
        put(v.data(), v.size() * sizeof(T));
    }
    void get(void* data, size_t bytes) {
        const size_t n = (bytes + 7) / 8;
        if (at + n > w.size())
            throw DataError("LogicalState::deserialize: the words end early (" +
                            std::to_string(w.size()) +
                            " words); the sender and this process "
                            "must run the same build of Parallax");
        if (bytes) std::memcpy(data, w.data() + at, bytes);
        at += n;
    }
    template <class T>
    void get_vec(std::vector<T>& v) {
        i64 n = 0;
        get(&n, sizeof n);
        if (n < 0 || static_cast<size_t>(n) > w.size() * 8)
            throw DataError("LogicalState::deserialize: an array length of " + std::to_string(n) +
                            " is impossible; the words are corrupt");
        v.resize(static_cast<size_t>(n));
        get(v.data(), v.size() * sizeof(T));
    }
};

}  // namespace

std::vector<i64> LogicalState::serialize() const {
    Words s;
    s.w = {kStateMagic, kStateVersion};
    s.put_vec(params);
    s.put_vec(m);
    s.put_vec(v);
    s.put_vec(has_w_);
    s.put_vec(has_mv_);
    s.put_vec(filled_);
    s.put_vec(history);  // StepMetrics is plain data
    return s.w;
}

LogicalState LogicalState::deserialize(const std::vector<i64>& words, const ModelConfig& mc) {
    if (words.size() < 2 || words[0] != kStateMagic || words[1] != kStateVersion)
        throw DataError("LogicalState::deserialize: not a serialized LogicalState of version " +
                        std::to_string(kStateVersion) +
                        "; every rank must run the same build of Parallax");
    Words s;
    s.w = words;
    s.at = 2;
    LogicalState st;
    s.get_vec(st.params);
    s.get_vec(st.m);
    s.get_vec(st.v);
    s.get_vec(st.has_w_);
    s.get_vec(st.has_mv_);
    s.get_vec(st.filled_);
    s.get_vec(st.history);
    if (!st.params.empty()) st.table = ParamTable::build(mc);
    if (st.m.size() != st.params.size() || st.v.size() != st.params.size() ||
        st.has_w_.size() != st.params.size() || st.has_mv_.size() != st.params.size() ||
        (!st.params.empty() && static_cast<i64>(st.params.size()) != st.table.total))
        throw DataError("LogicalState::deserialize: array sizes do not match the model config (" +
                        std::to_string(st.params.size()) +
                        " weights); every rank must run the "
                        "same config");
    return st;
}

bool gather_state(LogicalState& state, comm::Communicator& world, const ModelConfig& mc) {
    bool agree = true;
    if (world.rank() == 0) {
        for (int k = 1; k < world.size(); k++) {
            i64 n = 0;
            world.recv(&n, 1, k);
            std::vector<i64> words(static_cast<size_t>(n));
            world.recv(words.data(), n, k);
            agree = state.absorb(LogicalState::deserialize(words, mc)) && agree;
        }
    } else {
        const std::vector<i64> words = state.serialize();
        const i64 n = static_cast<i64>(words.size());
        world.send(&n, 1, 0);
        world.send(words.data(), n, 0);
    }
    return agree;
}

void write_dump(const std::string& path, const LogicalState& state, const Config& cfg) {
    try {
        RunFile file(path, config_to_toml(cfg), "dump");
        for (const TableEntry& e : state.table.entries) {
            const std::vector<i64> shape = e.shape();
            file.write_array("weights/" + e.name, state.params.data() + e.offset, shape);
            file.write_array("adam/m/" + e.name, state.m.data() + e.offset, shape);
            file.write_array("adam/v/" + e.name, state.v.data() + e.offset, shape);
        }
        const i64 steps = static_cast<i64>(state.history.size());
        std::vector<double> step(steps), loss(steps), norm(steps), val(steps);
        for (i64 i = 0; i < steps; i++) {
            step[i] = static_cast<double>(state.history[i].step);
            loss[i] = state.history[i].loss;
            norm[i] = state.history[i].grad_norm;
            val[i] = state.history[i].val_loss;
        }
        file.write_array("steps/step", step.data(), {steps});
        file.write_array("steps/loss", loss.data(), {steps});
        file.write_array("steps/grad_norm", norm.data(), {steps});
        file.write_array("steps/val_loss", val.data(), {steps});
        file.flush();
    } catch (...) {
        std::remove(path.c_str());  // a half-written dump is no dump
        throw;
    }
}

}  // namespace px
