#include "core/train/fp8_monitor.h"

#include "core/base/dtype.h"
#include "core/base/error.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>

namespace px {

// ---- ExactSum --------------------------------------------------------------------------------

// v · 2^(p - 1074) added (or taken away) into digits p/32 .. p/32 + 2, each part < 2^32, so 2^31
// adds cannot overflow a digit between normalisations.
void ExactSum::add_at(std::uint64_t v, int p, bool negative) {
    const unsigned __int128 w = static_cast<unsigned __int128>(v) << (p % 32);
    const i64 d[3] = {static_cast<i64>(w & 0xffffffffu), static_cast<i64>((w >> 32) & 0xffffffffu),
                      static_cast<i64>(w >> 64)};
    const size_t at = static_cast<size_t>(p / 32);
    if (negative) {
        for (size_t k = 0; k < 3; k++) digits[at + k] -= d[k];
    } else {
        for (size_t k = 0; k < 3; k++) digits[at + k] += d[k];
    }
    if (++pending_ >= (1 << 30)) normalize();
}

// A finite double is m · 2^(p - 1074) with m < 2^53 and p >= 0 (p = 0 for subnormals), read from
// its bits.
void ExactSum::add(double x) {
    const std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
    const int e = static_cast<int>((bits >> 52) & 0x7ff);
    std::uint64_t m = bits & ((std::uint64_t{1} << 52) - 1);
    PX_ASSERT(e != 0x7ff, "ExactSum::add of an inf or a NaN");
    if (e != 0) m |= std::uint64_t{1} << 52;
    if (m != 0) add_at(m, e != 0 ? e - 1 : 0, (bits >> 63) != 0);
}

void ExactSum::normalize() {
    for (size_t i = 0; i + 1 < digits.size(); i++) {
        const i64 carry = digits[i] >> 32;  // floor(d / 2^32), also for a negative d
        digits[i] -= carry * (i64{1} << 32);
        digits[i + 1] += carry;
    }
    pending_ = 0;
}

void ExactSum::merge(ExactSum& other) {
    normalize();
    other.normalize();
    for (size_t i = 0; i < digits.size(); i++) digits[i] += other.digits[i];
    normalize();
}

double ExactSum::value() const {
    ExactSum n = *this;
    n.normalize();
    double r = 0;
    for (int i = kDigits - 1; i >= 0; i--)
        r += std::ldexp(static_cast<double>(n.digits[static_cast<size_t>(i)]), 32 * i - 1074);
    return r;
}

// ---- accumulating --------------------------------------------------------------------------

namespace {

// Nonnegative finite doubles summed exactly and quickly: each term's significand goes into the
// 128-bit bin of its binary exponent (2^75 terms before a bin could overflow); fold() then adds
// every bin into an ExactSum at its exponent's place. The sum is the same as ExactSum::add's.
struct ExactBins {
    std::vector<unsigned __int128> bin = std::vector<unsigned __int128>(2048);
    int lo = 2048, hi = -1;  // the bins in use

    void add(double t) {
        const std::uint64_t bits = std::bit_cast<std::uint64_t>(t);
        const int e = static_cast<int>(bits >> 52);  // t >= 0: no sign bit
        std::uint64_t m = bits & ((std::uint64_t{1} << 52) - 1);
        if (e != 0) m |= std::uint64_t{1} << 52;
        bin[static_cast<size_t>(e)] += m;
        lo = std::min(lo, e);
        hi = std::max(hi, e);
    }
    void fold(ExactSum& into) const {
        for (int e = lo; e <= hi; e++) {
            const unsigned __int128 v = bin[static_cast<size_t>(e)];
            if (v == 0) continue;
            const int p = e != 0 ? e - 1 : 0;
            into.add_at(static_cast<std::uint64_t>(v), p, false);
            if (const std::uint64_t high = static_cast<std::uint64_t>(v >> 64); high != 0)
                into.add_at(high, p + 64, false);
        }
    }
};

void merge(Fp8Accum& into, Fp8Accum& a) {
    into.count += a.count;
    into.nonfinite += a.nonfinite;
    into.nonzero += a.nonzero;
    into.saturated += a.saturated;
    into.underflow += a.underflow;
    into.amax = std::max(into.amax, a.amax);
    into.min_nonzero = std::min(into.min_nonzero, a.min_nonzero);
    into.signal.merge(a.signal);
    into.error.merge(a.error);
}

// One part's accumulation: counts in acc, the two sums in bins until done.
struct Part {
    Fp8Accum acc;
    ExactBins signal, error;

    // One element x read back as q after a cast with scale s (fp32, as the cast computes x · s).
    void add(float x, float q, float s, float fp8_max) {
        if (!std::isfinite(x)) {
            acc.nonfinite++;
            return;
        }
        acc.count++;
        const float m = std::fabs(x);
        acc.amax = std::max(acc.amax, m);
        if (m != 0.0f) {
            acc.nonzero++;
            acc.min_nonzero = std::min(acc.min_nonzero, m);
            if (q == 0.0f) acc.underflow++;
        }
        if (std::fabs(x * s) > fp8_max) acc.saturated++;
        const double d = static_cast<double>(x) - static_cast<double>(q);
        signal.add(static_cast<double>(x) * static_cast<double>(x));
        error.add(d * d);
    }
    void done_into(Fp8Accum& a) {
        signal.fold(acc.signal);
        error.fold(acc.error);
        merge(a, acc);
    }
};

// Runs body(part, lo, hi) over [0, n) split among the threads, each into its own part, merged
// after: every sum is exact, so the result does not depend on the split.
template <class Body>
void in_parallel(Fp8Accum& a, i64 n, Body body) {
    const int threads =
        std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(n / 4096)));
    std::vector<Part> part(static_cast<size_t>(threads));
    if (threads == 1) {
        body(part[0], 0, n);
    } else {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int t = 0; t < threads; t++)
            body(part[static_cast<size_t>(t)], n * t / threads, n * (t + 1) / threads);
    }
    for (Part& p : part) p.done_into(a);
}

}  // namespace

void fp8_accumulate(Fp8Accum& a, const float* x, const float* q, i64 n, float s, float fp8_max) {
    in_parallel(a, n, [&](Part& part, i64 lo, i64 hi) {
        for (i64 i = lo; i < hi; i++) part.add(x[i], q[i], s, fp8_max);
    });
}

void fp8_accumulate_blocks(Fp8Accum& a, const float* x, const float* q, i64 rows, i64 K, i64 band,
                           i64 b) {
    const i64 bands = (rows + band - 1) / band, tiles = (K + b - 1) / b;
    in_parallel(a, bands * tiles, [&](Part& part, i64 lo, i64 hi) {
        for (i64 t = lo; t < hi; t++) {
            const i64 r0 = (t / tiles) * band, r1 = std::min(rows, r0 + band);
            const i64 c0 = (t % tiles) * b, c1 = std::min(K, c0 + b);
            float amax = 0.0f;
            bool finite = true;
            for (i64 i = r0; i < r1; i++)
                for (i64 j = c0; j < c1; j++) {
                    const float m = std::fabs(x[i * K + j]);
                    finite = finite && std::isfinite(m);
                    amax = std::max(amax, m);
                }
            const float s = Fp8Scaling::block_scale(amax, finite);
            for (i64 i = r0; i < r1; i++)
                for (i64 j = c0; j < c1; j++) part.add(x[i * K + j], q[i * K + j], s, kE4M3Max);
        }
    });
}

Fp8Stat fp8_row(const Fp8Accum& a) {
    Fp8Stat r;
    r.count = a.count;
    r.nonfinite = a.nonfinite;
    r.amax = a.amax;
    r.saturated = a.count > 0 ? static_cast<double>(a.saturated) / static_cast<double>(a.count) : 0;
    r.underflow =
        a.nonzero > 0 ? static_cast<double>(a.underflow) / static_cast<double>(a.nonzero) : 0;
    r.dynamic_range = a.nonzero > 0 ? std::log2(static_cast<double>(a.amax)) -
                                          std::log2(static_cast<double>(a.min_nonzero))
                                    : 0;
    const double sig = a.signal.value(), err = a.error.value();
    r.mse = a.count > 0 ? err / static_cast<double>(a.count) : 0;
    r.sqnr_db = err > 0 ? 10.0 * std::log10(sig / err) : INFINITY;
    return r;
}

// ---- alerts ----------------------------------------------------------------------------------

namespace {

std::string fmt(const char* f, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v);
    return buf;
}

}  // namespace

i64 judge_fp8(const Fp8Stat& row, const Fp8Thresholds& t, std::string* evidence) {
    i64 bits = 0;
    std::string why;
    auto add = [&](const std::string& s) { why += (why.empty() ? "" : "; ") + s; };
    const double r = row.scale_ratio;
    if (t.scale_jump > 0 && std::isfinite(r) && r > 0 &&
        (r > t.scale_jump || r < 1 / t.scale_jump)) {
        bits |= kFp8ScaleJump;
        add(std::string("the scale ") + (r > 1 ? "rose " : "fell to ") + fmt("%.3g", r) +
            "x the step before's (fp8_monitor.scale_jump = " + fmt("%g", t.scale_jump) + ")");
    }
    if (row.count > 0 && row.saturated > t.saturation_max) {
        bits |= kFp8Saturation;
        add(fmt("%.3g", 100 * row.saturated) + "% of its " + std::to_string(row.count) +
            " values saturated (fp8_monitor.saturation_max = " + fmt("%g", 100 * t.saturation_max) +
            "%)");
    }
    if (row.count > 0 && row.sqnr_db < t.sqnr_min_db) {
        bits |= kFp8Sqnr;
        add("SQNR " + fmt("%.3g", row.sqnr_db) +
            " dB (fp8_monitor.sqnr_min_db = " + fmt("%g", t.sqnr_min_db) + " dB)");
    }
    if (bits != 0 && evidence) {  // the fired rules, then the row's other fields
        std::string rest = "amax " + fmt("%.4g", row.amax) + ", scale " + fmt("%.4g", row.scale);
        if (!(bits & kFp8ScaleJump) && std::isfinite(r))
            rest += " (" + fmt("%.3g", r) + "x the step before's)";
        if (!(bits & kFp8Saturation))
            rest += ", saturated " + fmt("%.3g", 100 * row.saturated) + "%";
        rest += ", underflow " + fmt("%.3g", 100 * row.underflow) + "%";
        if (!(bits & kFp8Sqnr)) rest += ", SQNR " + fmt("%.3g", row.sqnr_db) + " dB";
        *evidence = "fp8 " + row.tensor + " (" + row.recipe + ") at step " +
                    std::to_string(row.step) + ": " + why + "; " + rest;
    }
    return bits;
}

// ---- the monitor -----------------------------------------------------------------------------

namespace {

Fp8Scaling& fp8_of(Job& job) {
    Fp8Scaling* f = job.model().fp8();
    if (f == nullptr || f->gemms() == 0)
        throw ConfigError(
            "fp8_monitor.every = " + std::to_string(job.config().fp8_monitor.every) +
            " monitors fp8 casts, but this job has no fp8 matmul (precision.fp8 = \"" +
            job.config().precision.fp8 +
            "\"): set precision.fp8 and precision.fp8_layers or fp8_lm_head, or "
            "fp8_monitor.every = 0");
    return *f;
}

std::vector<std::string> split_list(const std::string& s) {
    std::vector<std::string> out;
    size_t at = 0;
    while (at <= s.size() && !s.empty()) {
        const size_t comma = std::min(s.find(',', at), s.size());
        std::string item = s.substr(at, comma - at);
        const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
        if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
        at = comma + 1;
    }
    return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The "current" comparison's cast: x · s to e4m3 (or e5m2), read back with 1 / s, as
// Fp8Scaling::cast computes it.
void cast_with(float* q, const float* x, i64 n, float s, bool e5m2) {
    const float inv = 1.0f / s;
#pragma omp parallel for schedule(static)
    for (i64 i = 0; i < n; i++)
        q[i] = e5m2 ? e5m2_to_f32(f32_to_e5m2(x[i] * s)) * inv
                    : e4m3_to_f32(f32_to_e4m3(x[i] * s)) * inv;
}

// Current scaling's scale from a tensor's amax (the delayed update's guards, no margin).
float current_scale(float amax, bool e5m2) {
    const float s = (e5m2 ? kE5M2Max : kE4M3Max) / amax;
    return amax > 0.0f && std::isfinite(amax) && std::isfinite(s) && s > 0.0f ? s : 1.0f;
}

}  // namespace

struct Fp8Monitor::Kept {
    int gemm = 0;
    Fp8Scaling::Role role = Fp8Scaling::x;
    std::vector<float> x;  // the cast's values
};

Fp8Monitor::Fp8Monitor(Job& job, const Fp8MonitorConfig& cfg)
    : job_(job), fp8_(fp8_of(job)), cfg_(cfg) {
    recipes_.push_back(fp8_.delayed() ? "delayed" : "block");
    for (const std::string& c : split_list(cfg.compare)) {
        if (c == recipes_.front()) continue;  // measured anyway (the config refuses it)
        if (c == "current") current_ = static_cast<int>(recipes_.size());
        if (c == "block") block_ = static_cast<int>(recipes_.size());
        recipes_.push_back(c);
    }
    const int tp = job.tp_size();
    const i64 b = job.config().precision.fp8_block_size;
    const ModelConfig& mc = job.config().model;
    if (block_ >= 0 && tp > 1 &&
        ((mc.hidden / tp) % b != 0 || (mc.ffn / tp) % b != 0 || fp8_.head_gemm() >= 0))
        throw ConfigError(
            "fp8_monitor.compare = \"" + cfg.compare +
            "\" under layout.tp = " + std::to_string(tp) +
            ": the block comparison's tiles of precision.fp8_block_size = " + std::to_string(b) +
            " must not span tp ranks (each rank's share of model.hidden and model.ffn whole "
            "tiles, and no fp8 LM head, whose vocabulary pieces tiles may span); choose "
            "another block size, drop \"block\" from fp8_monitor.compare, or layout.tp = 1");
    const size_t slots = static_cast<size_t>(fp8_.gemms()) * Fp8Scaling::kRoles * recipes_.size();
    acc_.resize(slots);
    monitored_scale_.resize(slots);
    w_seen_.assign(static_cast<size_t>(fp8_.gemms()), 0);
}

Fp8Monitor::~Fp8Monitor() {
    if (active_) fp8_.set_cast_observer(nullptr);
}

std::shared_ptr<Fp8Monitor> Fp8Monitor::attach(Job& job, const Fp8MonitorConfig& cfg) {
    auto m = std::make_shared<Fp8Monitor>(job, cfg);
    StepHooks h;
    h.before = [m](i64 step) { m->before(step); };
    h.updated = [m](i64 step) { m->updated(step); };
    job.add_step_hooks(std::move(h));
    return m;
}

bool Fp8Monitor::counted_here(int gemm, Fp8Scaling::Role r) {
    const bool column = fp8_.gemm(gemm).column_parallel();
    switch (r) {
        case Fp8Scaling::w:  // the same weights on every replica, cast once per microbatch
            if (job_.dp_rank() != 0 || w_seen_[static_cast<size_t>(gemm)]) return false;
            w_seen_[static_cast<size_t>(gemm)] = 1;
            return true;
        case Fp8Scaling::x:  // a column-parallel layer's input is whole on every tp rank
            return !column || job_.tp_rank() == 0;
        case Fp8Scaling::dy:  // a row-parallel layer's output gradient is whole on every tp rank
            return column || job_.tp_rank() == 0;
    }
    return false;
}

void Fp8Monitor::on_cast(const Fp8Scaling& fp8, int gemm, Fp8Scaling::Role r, const Tensor& src,
                         const float* dst) {
    if (!active_ || !counted_here(gemm, r)) return;
    const auto t0 = std::chrono::steady_clock::now();
    const i64 n = src.numel();
    std::vector<float> x(static_cast<size_t>(n));
    convert(x.data(), DType::f32, src.data, src.dtype, static_cast<size_t>(n));  // exact
    const i64 b = fp8.block_size();
    const i64 K = src.ndim > 0 ? src.shape[src.ndim - 1] : 1;
    const i64 rows = K > 0 ? n / K : 0;
    const i64 band = r == Fp8Scaling::w ? b : 1;
    if (fp8.delayed())
        fp8_accumulate(acc_[slot(gemm, r, 0)], x.data(), dst, n, fp8.scale(gemm, r),
                       fp8.fp8_max(r));
    else
        fp8_accumulate_blocks(acc_[slot(gemm, r, 0)], x.data(), dst, rows, K, band, b);
    if (block_ >= 0) {
        std::vector<float> q(static_cast<size_t>(n));
        fp8.cast_blocks(r, src, q.data());
        fp8_accumulate_blocks(acc_[slot(gemm, r, block_)], x.data(), q.data(), rows, K, band, b);
    }
    if (current_ >= 0) kept_.push_back({gemm, r, std::move(x)});
    seconds_ += seconds_since(t0);
}

void Fp8Monitor::before(i64 step) {
    const auto t0 = std::chrono::steady_clock::now();
    step_ = step;
    if (fp8_.delayed()) {  // the scales this step casts with, for the next step's ratio
        std::vector<float>& s = scales_at_[step];
        std::vector<char>& from = from_amax_at_[step];
        s.clear();
        from.clear();
        for (int g = 0; g < fp8_.gemms(); g++)
            for (int r = 0; r < Fp8Scaling::kRoles; r++) {
                const auto role = static_cast<Fp8Scaling::Role>(r);
                s.push_back(fp8_.scale(g, role));
                from.push_back(fp8_.newest_amax(g, role) > 0.0f ? 1 : 0);
            }
        while (!scales_at_.empty() && scales_at_.begin()->first < step - 1024) {
            from_amax_at_.erase(scales_at_.begin()->first);
            scales_at_.erase(scales_at_.begin());
        }
    }
    active_ = cfg_.every > 0 && step % cfg_.every == 0;
    if (active_) {
        for (Fp8Accum& a : acc_) a = Fp8Accum{};
        std::fill(w_seen_.begin(), w_seen_.end(), 0);
        kept_.clear();
        fp8_.set_cast_observer(this);
    }
    seconds_ += seconds_since(t0);
}

// The accumulators of slots first, first + stride, ... summed (counts, digits), maxed (amax)
// and minned (smallest nonzero) over the tensor-, data- and pipeline-parallel groups: every
// rank ends with the whole tensor's statistics.
void Fp8Monitor::reduce(std::vector<Fp8Accum>& acc, size_t first, size_t stride) {
    constexpr size_t kInts = 5 + 2 * ExactSum::kDigits;
    std::vector<i64> ints;
    std::vector<float> maxes;
    for (size_t k = first; k < acc.size(); k += stride) {
        Fp8Accum& a = acc[k];
        a.signal.normalize();
        a.error.normalize();
        ints.insert(ints.end(), {a.count, a.nonfinite, a.nonzero, a.saturated, a.underflow});
        ints.insert(ints.end(), a.signal.digits.begin(), a.signal.digits.end());
        ints.insert(ints.end(), a.error.digits.begin(), a.error.digits.end());
        maxes.push_back(a.amax);
        maxes.push_back(-a.min_nonzero);
    }
    const RankGroups& g = job_.groups();
    for (comm::Communicator* c : {g.tp, g.dp, g.pp})
        if (c && !ints.empty()) {
            c->all_reduce(ints.data(), static_cast<i64>(ints.size()));
            c->all_reduce_max(maxes.data(), static_cast<i64>(maxes.size()));
        }
    size_t i = 0, j = 0;
    for (size_t k = first; k < acc.size(); k += stride, i += kInts, j += 2) {
        Fp8Accum& a = acc[k];
        a.count = ints[i];
        a.nonfinite = ints[i + 1];
        a.nonzero = ints[i + 2];
        a.saturated = ints[i + 3];
        a.underflow = ints[i + 4];
        std::copy_n(ints.begin() + static_cast<std::ptrdiff_t>(i + 5), ExactSum::kDigits,
                    a.signal.digits.begin());
        std::copy_n(ints.begin() + static_cast<std::ptrdiff_t>(i + 5 + ExactSum::kDigits),
                    ExactSum::kDigits, a.error.digits.begin());
        a.signal.normalize();
        a.error.normalize();
        a.amax = maxes[j];
        a.min_nonzero = -maxes[j + 1];
    }
}

void Fp8Monitor::updated(i64 step) {
    if (!active_) return;
    const auto t0 = std::chrono::steady_clock::now();
    fp8_.set_cast_observer(nullptr);
    active_ = false;
    const size_t R = recipes_.size();
    // The run's recipe and the block comparison, reduced over the ranks.
    for (size_t k = 0; k < R; k++)
        if (static_cast<int>(k) != current_) reduce(acc_, k, R);
    // Current scaling: each tensor cast with the scale of its whole step's amax (the run's rows'
    // amax), then reduced in turn.
    std::vector<float> cur_scale(static_cast<size_t>(fp8_.gemms()) * Fp8Scaling::kRoles, 1.0f);
    if (current_ >= 0) {
        for (int g = 0; g < fp8_.gemms(); g++)
            for (int r = 0; r < Fp8Scaling::kRoles; r++)
                cur_scale[static_cast<size_t>(g * Fp8Scaling::kRoles + r)] =
                    current_scale(acc_[slot(g, r, 0)].amax, r == Fp8Scaling::dy);
        for (const Kept& k : kept_) {
            const float s = cur_scale[static_cast<size_t>(k.gemm * Fp8Scaling::kRoles + k.role)];
            const bool e5m2 = k.role == Fp8Scaling::dy;
            const i64 n = static_cast<i64>(k.x.size());
            std::vector<float> q(k.x.size());
            cast_with(q.data(), k.x.data(), n, s, e5m2);
            fp8_accumulate(acc_[slot(k.gemm, k.role, current_)], k.x.data(), q.data(), n, s,
                           e5m2 ? kE5M2Max : kE4M3Max);
        }
        kept_.clear();
        kept_.shrink_to_fit();
        reduce(acc_, static_cast<size_t>(current_), R);
    }

    const Fp8Thresholds limits(cfg_);
    const auto at = scales_at_.find(step), before_at = scales_at_.find(step - 1);
    rows_.clear();
    std::vector<RunEvent> alerts;
    for (int g = 0; g < fp8_.gemms(); g++)
        for (int r = 0; r < Fp8Scaling::kRoles; r++)
            for (size_t k = 0; k < R; k++) {
                const size_t s = slot(g, r, static_cast<int>(k));
                const size_t gr = static_cast<size_t>(g * Fp8Scaling::kRoles + r);
                Fp8Stat row = fp8_row(acc_[s]);
                row.step = step;
                row.tensor = fp8_.gemm(g).name + "/" + Fp8Scaling::kRoleNames[r];
                row.recipe = recipes_[k];
                bool initial = false;  // cast with delayed scaling's initial scale
                if (k == 0 && fp8_.delayed()) {
                    PX_ASSERT(at != scales_at_.end(), "a monitored step without its scales");
                    row.scale = at->second[gr];
                    initial = !from_amax_at_[step][gr];
                    if (!initial && before_at != scales_at_.end() && from_amax_at_[step - 1][gr])
                        row.scale_ratio = row.scale / before_at->second[gr];
                } else {
                    row.scale = static_cast<int>(k) == current_
                                    ? cur_scale[gr]
                                    : Fp8Scaling::block_scale(static_cast<float>(row.amax), true);
                    std::map<i64, double>& seen = monitored_scale_[s];
                    seen[step] = row.scale;
                    while (seen.size() > 4) seen.erase(seen.begin());
                    const auto prev = seen.find(step);
                    if (prev != seen.begin()) row.scale_ratio = row.scale / std::prev(prev)->second;
                }
                if (k == 0 && !initial) {
                    std::string why;
                    row.alerts = judge_fp8(row, limits, &why);
                    if (row.alerts != 0) alerts.push_back({step, EventKind::alert, why});
                }
                rows_.push_back(std::move(row));
            }
    seconds_ += seconds_since(t0);
    job_.report_fp8(rows_);
    for (const RunEvent& e : alerts) job_.report_event(e);
}

}  // namespace px
