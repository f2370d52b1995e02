#include "core/model/data.h"

#include "core/base/error.h"
#include "core/base/files.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numbers>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace px {

// llm.c files are little-endian; tokens are used straight from the mapping.
static_assert(std::endian::native == std::endian::little,
              "Parallax reads llm.c files on little-endian hosts only");

const char* split_name(Split split) { return split == Split::train ? "train" : "val"; }

namespace {

constexpr i64 kMaxTableEntries = i64(1) << 24;  // V^(k+1) doubles, twice (rows and cdf)
constexpr u64 kMaxIndex = u64(1) << 32;         // steps, samples per step, tokens per window

// First i with u < cdf[i]; cdf is non-decreasing with cdf[n-1] == 1 and u in (0, 1), so the
// result is < n and never lands on a zero-probability entry.
i64 inverse_cdf(const double* cdf, i64 n, double u) {
    return std::upper_bound(cdf, cdf + n, u) - cdf;
}

void cumulate(const double* p, double* cdf, i64 n) {
    double acc = 0;
    for (i64 i = 0; i < n; i++) {
        acc += p[i];
        cdf[i] = acc;
    }
    cdf[n - 1] = 1.0;  // absorb rounding so inverse_cdf always finds an entry
}

// log of a Gamma(alpha, 1) variate (Marsaglia & Tsang 2000), from Philox uniforms only. Works in
// logs because for small alpha the boost U^(1/alpha) underflows double long before the
// normalised Dirichlet probability does. `entry` owns the 2^16 draws (entry << 16) + d.
double log_gamma_variate(double alpha, u64 seed, u64 entry) {
    u64 d = 0;
    auto uniform = [&] {
        PX_ASSERT(d < (u64(1) << 16), "Marsaglia-Tsang used more than 2^16 draws for one variate");
        return uniform_at(seed, kMarkovTableId, (entry << 16) | d++);
    };
    // alpha < 1: Gamma(alpha) = Gamma(alpha + 1) * U^(1/alpha).
    double log_boost = 0;
    const double a = alpha < 1 ? alpha + 1 : alpha;
    if (alpha < 1) log_boost = std::log(uniform()) / alpha;
    const double dd = a - 1.0 / 3.0;
    const double c = 1.0 / std::sqrt(9.0 * dd);
    for (;;) {
        // A standard normal by Box-Muller (one of the pair is enough).
        const double u1 = uniform(), u2 = uniform();
        const double x = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
        double v = 1.0 + c * x;
        if (v <= 0) continue;
        v = v * v * v;
        const double u = uniform();
        if (std::log(u) < 0.5 * x * x + dd - dd * v + dd * std::log(v))
            return std::log(dd * v) + log_boost;
    }
}

double entropy_of(const double* p, i64 n) {
    double h = 0;
    for (i64 i = 0; i < n; i++)
        if (p[i] > 0) h -= p[i] * std::log(p[i]);
    return h;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// MarkovSource

MarkovSource::MarkovSource(i64 V, i64 k, double alpha, u64 table_seed, u64 sample_seed)
    : V_(V), k_(k), S_(1), sample_seed_(sample_seed) {
    if (V < 2)
        throw ConfigError("model.vocab = " + std::to_string(V) +
                          ": the Markov data source needs at least 2 symbols");
    if (k < 1)
        throw ConfigError("data.markov_order = " + std::to_string(k) + ": the order must be >= 1");
    if (!(alpha > 0) || !std::isfinite(alpha))
        throw ConfigError("data.markov_alpha = " + std::to_string(alpha) +
                          ": the Dirichlet concentration must be a finite number > 0");
    for (i64 i = 0; i < k; i++) {
        if (S_ > kMaxTableEntries / V / V)
            throw ConfigError(
                "data.markov_order = " + std::to_string(k) +
                " with model.vocab = " + std::to_string(V) +
                " needs a transition table of V^(k+1) entries, more than the 2^24 Parallax keeps "
                "in memory; lower data.markov_order or model.vocab, or use data.source = \"bin\"");
        S_ *= V;
    }

    // Transition rows: normalised Gamma(alpha) variates are a Dirichlet(alpha) draw.
    P_.resize(S_ * V_);
    cdf_.resize(S_ * V_);
    std::vector<double> logg(V_);
    for (i64 s = 0; s < S_; s++) {
        for (i64 v = 0; v < V_; v++)
            logg[v] = log_gamma_variate(alpha, table_seed, u64(s * V_ + v));
        const double m = *std::max_element(logg.begin(), logg.end());
        double sum = 0;
        double* p = &P_[s * V_];
        for (i64 v = 0; v < V_; v++) sum += p[v] = std::exp(logg[v] - m);
        for (i64 v = 0; v < V_; v++) p[v] /= sum;
        cumulate(p, &cdf_[s * V_], V_);
    }

    // Stationary distribution of the k-gram chain by power iteration in fp64 on the lazy chain
    // (I + P) / 2: same fixed point, but aperiodic, so it converges even if rows have zeros.
    // Stops when successive iterates differ by <= 1e-14 in L1 (then |pi P - pi|_1 <= 2e-14), or
    // at the rounding floor (no progress for 200 iterations while already below 1e-11), which
    // large tables reach before 1e-14.
    pi_.assign(S_, 1.0 / double(S_));
    std::vector<double> next(S_);
    double best = std::numeric_limits<double>::infinity();
    i64 since_best = 0;
    for (i64 it = 0;; it++) {
        std::fill(next.begin(), next.end(), 0.0);
        for (i64 s = 0; s < S_; s++) {
            const double ps = pi_[s];
            if (ps == 0) continue;
            const double* p = &P_[s * V_];
            double* dst = &next[next_state(s, 0)];
            for (i64 v = 0; v < V_; v++) dst[v] += ps * p[v];
        }
        double sum = 0;
        for (i64 s = 0; s < S_; s++) sum += next[s] = 0.5 * (next[s] + pi_[s]);
        double diff = 0;
        for (i64 s = 0; s < S_; s++) {
            next[s] /= sum;
            diff += std::abs(next[s] - pi_[s]);
        }
        pi_.swap(next);
        if (diff <= 1e-14) break;
        if (diff < best) {
            best = diff;
            since_best = 0;
        } else if (++since_best >= 200 && best <= 1e-11) {
            break;
        }
        if (it >= 100000)
            throw ConfigError(
                "data.markov_alpha = " + std::to_string(alpha) +
                ": the stationary distribution of the Markov chain did not converge (L1 change " +
                std::to_string(diff) +
                " after 10^5 iterations); the chain is nearly reducible, use a larger "
                "data.markov_alpha");
    }
    pi_cdf_.resize(S_);
    cumulate(pi_.data(), pi_cdf_.data(), S_);

    rate_ = 0;
    for (i64 s = 0; s < S_; s++) rate_ += pi_[s] * entropy_of(&P_[s * V_], V_);

    // Joint entropies H_n of n consecutive stationary symbols (n <= k) from marginals of pi over
    // its oldest n symbols; then H(X_j | X_0..X_{j-1}) = H_{j+1} - H_j for j < k.
    std::vector<double> joint(k_ + 1, 0.0);
    i64 groups = 1;
    for (i64 n = 1; n <= k_; n++) {
        groups *= V_;
        std::vector<double> m(groups, 0.0);
        const i64 per = S_ / groups;  // states sharing the same oldest n symbols are contiguous
        for (i64 s = 0; s < S_; s++) m[s / per] += pi_[s];
        joint[n] = entropy_of(m.data(), groups);
    }
    head_.resize(k_ - 1);
    for (i64 j = 1; j < k_; j++) head_[j - 1] = joint[j + 1] - joint[j];
}

double MarkovSource::window_floor(i64 T) const {
    PX_ASSERT(T >= 1, "window_floor needs T >= 1");
    double sum = 0;
    const i64 head = std::min<i64>(T, k_ - 1);
    for (i64 j = 1; j <= head; j++) sum += head_[j - 1];
    sum += double(T - head) * rate_;
    return sum / double(T);
}

void MarkovSource::sample(int* tokens, i64 T, Split split, i64 step, i64 first_sample,
                          i64 count) const {
    PX_ASSERT(T >= 1 && u64(T) < kMaxIndex, "window length out of range");
    PX_ASSERT(step >= 0 && u64(step) < kMaxIndex, "step out of range for the sampler's counter");
    PX_ASSERT(first_sample >= 0 && count >= 0 && u64(first_sample + count) <= kMaxIndex,
              "sample range out of range for the sampler's counter");
    const u32 id = kMarkovWindowId + u32(split);
    i64 top = 1;  // V^(k-1), the weight of the oldest symbol of a state
    for (i64 i = 1; i < k_; i++) top *= V_;
    for (i64 i = 0; i < count; i++) {
        int* row = tokens + i * (T + 1);
        const u64 base = u64(first_sample + i) << 32;
        auto u = [&](i64 pos) { return uniform_at(sample_seed_, id, base | u64(pos), u32(step)); };
        // The first k symbols: one stationary k-gram, decoded oldest first.
        i64 s = inverse_cdf(pi_cdf_.data(), S_, u(0));
        for (i64 j = 0, w = top; j < k_; j++, w /= V_)
            if (j <= T) row[j] = int((s / w) % V_);
        for (i64 j = k_; j <= T; j++) {
            const i64 x = inverse_cdf(&cdf_[s * V_], V_, u(j));
            row[j] = int(x);
            s = next_state(s, x);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// MixtureSource

u64 mixture_table_seed(u64 seed, i64 c) {
    // A different table per chain, and none equal to a plain chain's with a nearby seed.
    const std::array<u32, 4> w = philox_at(seed, kMixtureChainId + 0x100u, u64(c));
    return (u64(w[0]) | u64(w[1]) << 32) >> 1;  // below 2^63, as data.markov_seed is
}

MixtureSource::MixtureSource(i64 V, i64 N, i64 k, double alpha, u64 table_seed, u64 sample_seed)
    : V_(V), W_(N >= 2 ? V / N : 0), sample_seed_(sample_seed) {
    if (N < 2 || W_ < 2)
        throw ConfigError("data.mixture_chains = " + std::to_string(N) + " with " +
                          std::to_string(V) +
                          " symbols: a mixture needs at least 2 chains of at least 2 symbols each");
    chains_.reserve(static_cast<size_t>(N));
    for (i64 c = 0; c < N; c++)
        chains_.emplace_back(W_, k, alpha, mixture_table_seed(table_seed, c), sample_seed);
}

i64 MixtureSource::chain_of(Split split, i64 step, i64 sample) const {
    const double u = uniform_at(sample_seed_, kMixtureChainId + u32(split), u64(sample), u32(step));
    return std::min<i64>(static_cast<i64>(u * double(chains())), chains() - 1);
}

void MixtureSource::sample(int* tokens, i64 T, Split split, i64 step, i64 first_sample,
                           i64 count) const {
    for (i64 i = 0; i < count; i++) {
        int* row = tokens + i * (T + 1);
        const i64 c = chain_of(split, step, first_sample + i);
        // The chain's own window for this sample (keyed by the sample, as every window is).
        chain(c).sample(row, T, split, step, first_sample + i, 1);
        for (i64 j = 0; j <= T; j++) row[j] += int(c * W_);
    }
}

double MixtureSource::entropy_rate() const {
    double h = 0;
    for (const MarkovSource& m : chains_) h += m.entropy_rate();
    return h / double(chains());
}

double MixtureSource::window_floor(i64 T) const {
    double f = 0;
    for (const MarkovSource& m : chains_) f += m.window_floor(T);
    return f / double(chains());
}

// ---------------------------------------------------------------------------------------------
// CopySource

CopySource::CopySource(i64 V, i64 D, u64 sample_seed) : V_(V), D_(D), sample_seed_(sample_seed) {
    if (V < 2)
        throw ConfigError("model.vocab = " + std::to_string(V) +
                          ": the copy data source needs at least 2 symbols");
    if (D < 1) throw ConfigError("data.copy_distance = " + std::to_string(D) + ": must be >= 1");
}

void CopySource::sample(int* tokens, i64 T, Split split, i64 step, i64 first_sample,
                        i64 count) const {
    PX_ASSERT(T >= 1 && u64(T) < kMaxIndex, "window length out of range");
    PX_ASSERT(step >= 0 && u64(step) < kMaxIndex, "step out of range for the sampler's counter");
    PX_ASSERT(first_sample >= 0 && count >= 0 && u64(first_sample + count) <= kMaxIndex,
              "sample range out of range for the sampler's counter");
    const u32 id = kCopyWindowId + u32(split);
    for (i64 i = 0; i < count; i++) {
        int* row = tokens + i * (T + 1);
        const u64 base = u64(first_sample + i) << 32;
        for (i64 j = 0; j <= T; j++) {
            if (j >= D_) {
                row[j] = row[j - D_];
                continue;
            }
            const double u = uniform_at(sample_seed_, id, base | u64(j), u32(step));
            row[j] = int(std::min<i64>(static_cast<i64>(u * double(V_)), V_ - 1));
        }
    }
}

double CopySource::context_floor(i64 V, i64 D, i64 T, i64 W) {
    PX_ASSERT(T >= 1 && V >= 2 && D >= 1 && W >= 0, "context_floor out of range");
    const i64 fresh = std::min(T, D - 1);    // targets 1 .. D-1
    const i64 copies = T - fresh;            // targets D .. T
    const i64 unseen = W >= D ? 0 : copies;  // copies whose source is out of sight
    return double(fresh + unseen) * std::log(double(V)) / double(T);
}

i64 copy_distance(const Config& cfg) {
    return cfg.data.copy_distance > 0 ? cfg.data.copy_distance
                                      : std::max<i64>(1, cfg.model.seq_len / 2);
}

i64 source_vocab(const Config& cfg) {
    return cfg.data.markov_vocab > 0 ? cfg.data.markov_vocab : cfg.model.vocab;
}

// ---------------------------------------------------------------------------------------------
// BinTokenSource

struct BinTokenSource::Mapped {
    std::string path;
    const std::uint16_t* tokens = nullptr;  // (n)
    i64 n = 0;
    void* map = nullptr;
    size_t map_bytes = 0;

    ~Mapped() {
        if (map) munmap(map, map_bytes);
    }
};

namespace {

std::int32_t le_i32(const unsigned char* p) {
    return std::int32_t(std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
                        std::uint32_t(p[3]) << 24);
}

// Opens, checks and maps one token file. `key` is the config key that named it.
std::unique_ptr<BinTokenSource::Mapped> open_tokens(const std::string& path, const char* key, i64 V,
                                                    i64 seq_len) {
    const std::string where = "token file " + path + " (" + key + ")";
    // Never open what is not a regular file: a FIFO would block the open until a writer comes.
    const FileKind kind = file_kind(path);
    if (kind != FileKind::regular && kind != FileKind::missing)
        throw DataError(where + " is " + file_kind_text(kind) +
                        ", not a regular file; give an llm.c .bin token file");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        throw DataError(where + ": cannot open it: " + std::strerror(errno) +
                        "; check the path (llm.c's data scripts write e.g. "
                        "dev/data/tinyshakespeare/tiny_shakespeare_train.bin)");
    struct Closer {
        int fd;
        ~Closer() { ::close(fd); }
    } closer{fd};
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        throw DataError(where + " is not a regular file; give an llm.c .bin token file");
    const i64 size = i64(st.st_size);
    const i64 header_bytes = kLlmcHeaderInts * 4;
    if (size < header_bytes)
        throw DataError(
            where + " is " + std::to_string(size) + " bytes, shorter than the " +
            std::to_string(header_bytes) +
            "-byte llm.c header; it is not an llm.c token file, or it was cut short: re-create it");
    unsigned char header[kLlmcHeaderInts * 4];
    if (pread(fd, header, sizeof header, 0) != ssize_t(sizeof header))
        throw DataError(where + ": cannot read its header: " + std::strerror(errno));
    const std::int32_t magic = le_i32(header), version = le_i32(header + 4),
                       count = le_i32(header + 8);
    if (magic == kLlmcCheckpointMagic)
        throw DataError(
            where + " has magic " + std::to_string(magic) +
            ", the llm.c GPT-2 checkpoint magic, not the token-file magic " +
            std::to_string(kLlmcTokenMagic) +
            ": it holds model weights, not tokens; load it with model.init_from and give " + key +
            " a token file");
    if (magic != kLlmcTokenMagic)
        throw DataError(
            where + " has magic number " + std::to_string(magic) +
            " but an llm.c token file starts with " + std::to_string(kLlmcTokenMagic) +
            "; is it an llm.c .bin token file? (tokenize with llm.c's dev/data scripts)");
    if (version != 1)
        throw DataError(where + " has version " + std::to_string(version) +
                        "; Parallax reads llm.c token files of version 1 (uint16 tokens)");
    if (count < 0)
        throw DataError(where + " has a negative token count " + std::to_string(count) +
                        " in its header; the file is corrupt");
    const i64 expected = header_bytes + 2 * i64(count);
    if (size < expected)
        throw DataError(where + " is truncated: its header says " + std::to_string(count) +
                        " tokens, which needs " + std::to_string(expected) +
                        " bytes, but the file has " + std::to_string(size) +
                        " bytes; re-create or re-download it");
    if (size > expected)
        throw DataError(where + " has " + std::to_string(size) + " bytes but its header says " +
                        std::to_string(count) + " tokens (" + std::to_string(expected) +
                        " bytes); the header or the file is corrupt: re-create it");
    if (i64(count) < seq_len + 1)
        throw DataError(where + " has " + std::to_string(count) +
                        " tokens, too few for one window of model.seq_len + 1 = " +
                        std::to_string(seq_len + 1) +
                        " tokens; use a larger file or a smaller model.seq_len");

    auto m = std::make_unique<BinTokenSource::Mapped>();
    m->path = path;
    m->n = count;
    m->map_bytes = size_t(size);
    void* map = mmap(nullptr, m->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
        throw DataError(where + ": cannot memory-map it: " + std::strerror(errno));
    m->map = map;
    m->tokens =
        reinterpret_cast<const std::uint16_t*>(static_cast<const char*>(map) + header_bytes);
    for (i64 i = 0; i < m->n; i++) {
        if (m->tokens[i] >= V)
            throw DataError(where + ": token " + std::to_string(m->tokens[i]) + " at position " +
                            std::to_string(i) + " is >= model.vocab = " + std::to_string(V) +
                            "; the file was tokenized with a larger vocabulary (GPT-2: 50257): "
                            "raise model.vocab to at least " +
                            std::to_string(m->tokens[i] + 1));
    }
    return m;
}

}  // namespace

BinTokenSource::BinTokenSource(const std::string& train_path, const std::string& val_path, i64 V,
                               i64 seq_len, u64 seed)
    : V_(V), seed_(seed) {
    if (V < 1 || V > 65536)
        throw ConfigError(
            "model.vocab = " + std::to_string(V) +
            ": llm.c token files hold uint16 tokens, so model.vocab must be in [1, 65536]");
    if (train_path.empty())
        throw ConfigError(
            "data.train_path is empty; data.source = \"bin\" needs an llm.c token file for "
            "training");
    train_ = open_tokens(train_path, "data.train_path", V, seq_len);
    if (!val_path.empty()) val_ = open_tokens(val_path, "data.val_path", V, seq_len);
}

BinTokenSource::~BinTokenSource() = default;

i64 BinTokenSource::num_tokens(Split split) const {
    const Mapped* m = split == Split::train ? train_.get() : val_.get();
    return m ? m->n : 0;
}

i64 BinTokenSource::window_start(i64 T, Split split, i64 step, i64 sample) const {
    const Mapped* m = split == Split::train ? train_.get() : val_.get();
    if (!m)
        throw DataError(
            "no validation data: data.val_path is not set; set it to an llm.c token file or "
            "disable validation with train.eval_every = 0");
    if (T < 1 || T + 1 > m->n)
        throw DataError("token file " + m->path + " has " + std::to_string(m->n) +
                        " tokens, too few for a window of T + 1 = " + std::to_string(T + 1));
    PX_ASSERT(step >= 0 && u64(step) < kMaxIndex, "step out of range for the sampler's counter");
    PX_ASSERT(sample >= 0 && u64(sample) < kMaxIndex,
              "sample out of range for the sampler's counter");
    const auto r = philox_at(seed_, kBinWindowId + u32(split), u64(sample), u32(step));
    const u64 bits = u64(r[0]) | u64(r[1]) << 32;
    return i64(bits % u64(m->n - T));  // starts 0 .. n-T-1: the window [start, start+T] fits
}

void BinTokenSource::sample(int* tokens, i64 T, Split split, i64 step, i64 first_sample,
                            i64 count) const {
    const Mapped* m = split == Split::train ? train_.get() : val_.get();
    for (i64 i = 0; i < count; i++) {
        const i64 start = window_start(T, split, step, first_sample + i);
        const std::uint16_t* src = m->tokens + start;
        int* row = tokens + i * (T + 1);
        for (i64 j = 0; j <= T; j++) row[j] = int(src[j]);
    }
}

// ---------------------------------------------------------------------------------------------

CorruptedSource::CorruptedSource(std::unique_ptr<TokenSource> inner, i64 batch,
                                 const std::string& kind, u64 seed)
    : inner_(std::move(inner)), batch_(batch), repeat_(kind == "repeat") {
    if (repeat_) return;
    const i64 V = inner_->vocab();
    perm_.resize(static_cast<size_t>(V));
    for (i64 i = 0; i < V; i++) perm_[static_cast<size_t>(i)] = static_cast<int>(i);
    for (i64 i = V - 1; i > 0; i--) {  // Fisher-Yates, one Philox uniform per swap
        const i64 j = std::min<i64>(i, static_cast<i64>(uniform_at(seed, kCorruptPermId, u64(i)) *
                                                        static_cast<double>(i + 1)));
        std::swap(perm_[static_cast<size_t>(i)], perm_[static_cast<size_t>(j)]);
    }
}

void CorruptedSource::sample(int* tokens, i64 T, Split split, i64 step, i64 first_sample,
                             i64 count) const {
    inner_->sample(tokens, T, split, step, first_sample, count);
    if (split != Split::train || step != batch_) return;
    for (i64 i = 0; i < count; i++) {
        int* row = tokens + i * (T + 1);
        for (i64 j = 0; j <= T; j++)
            row[j] = repeat_ ? row[0] : perm_[static_cast<size_t>(row[j])];
    }
}

namespace {
std::unique_ptr<TokenSource> make_plain_source(const Config& cfg);
}

std::unique_ptr<TokenSource> make_source(const Config& cfg) {
    std::unique_ptr<TokenSource> s = make_plain_source(cfg);
    if (cfg.data.corrupt_step > 0)
        return std::make_unique<CorruptedSource>(std::move(s), cfg.data.corrupt_step - 1,
                                                 cfg.data.corrupt_kind, cfg.train.seed);
    return s;
}

namespace {
std::unique_ptr<TokenSource> make_plain_source(const Config& cfg) {
    const DataConfig& d = cfg.data;
    if (d.source == "markov")
        return std::make_unique<MarkovSource>(d.markov_vocab > 0 ? d.markov_vocab : cfg.model.vocab,
                                              d.markov_order, d.markov_alpha,
                                              d.markov_seed, cfg.train.seed);
    if (d.source == "copy")
        return std::make_unique<CopySource>(source_vocab(cfg), copy_distance(cfg), cfg.train.seed);
    if (d.source == "mixture")
        return std::make_unique<MixtureSource>(source_vocab(cfg), d.mixture_chains, d.markov_order,
                                               d.markov_alpha, d.markov_seed, cfg.train.seed);
    if (d.source == "bin") {
        if (d.val_path.empty() && cfg.train.eval_every > 0)
            throw ConfigError("data.val_path is empty but train.eval_every = " +
                              std::to_string(cfg.train.eval_every) +
                              " asks for validation; set data.val_path to an llm.c token file or "
                              "train.eval_every = 0");
        return std::make_unique<BinTokenSource>(d.train_path, d.val_path, cfg.model.vocab,
                                                cfg.model.seq_len, cfg.train.seed);
    }
    throw ConfigError(
        "data.source = \"" + d.source +
        "\" is not a data source; use \"markov\", \"mixture\" or \"copy\" (built-in) or \"bin\" "
        "(llm.c token files)");
}
}  // namespace

void write_llmc_tokens(const std::string& path, const std::vector<std::uint16_t>& tokens) {
    if (tokens.size() > size_t(std::numeric_limits<std::int32_t>::max()))
        throw DataError("cannot write token file " + path + ": " + std::to_string(tokens.size()) +
                        " tokens do not fit the int32 count of the llm.c header; split it");
    std::int32_t header[kLlmcHeaderInts] = {};
    header[0] = kLlmcTokenMagic;
    header[1] = 1;
    header[2] = std::int32_t(tokens.size());
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) throw DataError("cannot write token file " + path + ": " + std::strerror(errno));
    bool ok = std::fwrite(header, sizeof header, 1, f) == 1;
    if (ok && !tokens.empty())
        ok = std::fwrite(tokens.data(), 2, tokens.size(), f) == tokens.size();
    ok = (std::fclose(f) == 0) && ok;
    if (!ok) throw DataError("cannot write token file " + path + ": " + std::strerror(errno));
}

}  // namespace px
