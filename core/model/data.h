// Training data: token windows drawn by a deterministic sampler.
//
// Index
//   Split               train or val
//   TokenSource         the interface the trainer sees: sample(...) writes windows of T+1 tokens
//   MarkovSource        built-in order-k Markov chain with a closed-form entropy rate and loss
//                       floor
//   MixtureSource       several Markov chains over disjoint symbols, one drawn per sequence
//   CopySource          windows that repeat their first D tokens: reachable only with context D
//   BinTokenSource      llm.c .bin token files (uint16 tokens after a 256-int32 header)
//   CorruptedSource     another source with one training batch corrupted (data.corrupt_step)
//   make_source         the source a Config asks for
//   write_llmc_tokens   writes an llm.c token file (tests and tools)
//
// Determinism. Window i of step s of a split is a pure function of (seed, split, s, i): it
// never depends on which other windows were drawn, in which order, or by whom. A microbatch or
// a data-parallel rank that takes the sample range [first, first+count) gets exactly the rows the
// single run gets at those indices (docs/numerics.md). All draws come from Philox
// (core/base/rng.h), keyed as follows (the tensor ids are far above the model's parameter ids):
//   Markov windows   uniform_at(seed, kMarkovWindowId + split, (sample << 32) | position, step)
//   Markov table     uniform_at(markov_seed, kMarkovTableId, (entry << 16) | draw)
//   copy windows     uniform_at(seed, kCopyWindowId + split, (sample << 32) | position, step)
//   mixture chain    uniform_at(seed, kMixtureChainId + split, sample, step); chain c's table
//                    is a Markov table with seed mixture_table_seed(markov_seed, c)
//   bin window start philox_at(seed, kBinWindowId + split, sample, step): words 0-1 as 64 bits,
//                                  mod (ntokens - T)
// so a step is at most 2^32 - 1, a step has at most 2^32 samples and a window 2^32 tokens.
#pragma once
#include "core/base/config.h"
#include "core/base/rng.h"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace px {

enum class Split { train, val };
const char* split_name(Split split);  // "train", "val"

inline constexpr u32 kMarkovWindowId = 0x4D4B0000u;  // + split
inline constexpr u32 kMarkovTableId = 0x4D4B0100u;
inline constexpr u32 kMixtureChainId = 0x4D580000u;  // + split
inline constexpr u32 kCopyWindowId = 0x43500000u;    // + split
inline constexpr u32 kBinWindowId = 0x42490000u;  // + split
inline constexpr u32 kCorruptPermId = 0x43520000u;  // CorruptedSource's vocabulary permutation

inline constexpr std::int32_t kLlmcTokenMagic = 20240520;       // header[0] of a token file
inline constexpr std::int32_t kLlmcCheckpointMagic = 20240326;  // header[0] of a GPT-2 checkpoint
inline constexpr int kLlmcHeaderInts = 256;                     // header size in int32

class TokenSource {
public:
    virtual ~TokenSource() = default;
    virtual i64 vocab() const = 0;  // V; every token is in [0, V)
    // tokens (count, T+1): row i is sample first_sample + i of (split, step);
    // inputs are row[0..T), targets row[1..T].
    virtual void sample(int* tokens, i64 T, Split split, i64 step, i64 first_sample,
                        i64 count) const = 0;
    // The source under any decorators (CorruptedSource): where the entropy rate comes from.
    virtual const TokenSource& base() const { return *this; }
    // Nats per token of the process, and the minimal expected cross-entropy per target of a
    // window of T+1 tokens for a predictor that sees only the window; -1 where unknown (files).
    virtual double entropy_rate() const { return -1; }
    virtual double window_floor(i64 /*T*/) const { return -1; }
};

// An order-k Markov chain over V symbols. The state is the last k symbols, encoded base V with
// the oldest symbol most significant: s = x[t-k+1]*V^(k-1) + ... + x[t]. Each of the V^k states
// has a row P(.|s) drawn from a symmetric Dirichlet(alpha). Windows start in the stationary
// distribution of the k-gram chain, so every position of a window is stationary.
class MarkovSource : public TokenSource {
public:
    // V symbols, order k >= 1, Dirichlet concentration alpha > 0; `table_seed` draws the
    // transition table, `sample_seed` the windows. Throws ConfigError naming the key when V,
    // k or alpha are out of range or the table would not fit (V^(k+1) <= 2^24 entries).
    MarkovSource(i64 V, i64 k, double alpha, u64 table_seed, u64 sample_seed);

    i64 vocab() const override { return V_; }
    void sample(int* tokens, i64 T, Split split, i64 step, i64 first_sample,
                i64 count) const override;

    i64 order() const { return k_; }
    i64 states() const { return S_; }                               // V^k
    const double* row(i64 state) const { return &P_[state * V_]; }  // P(.|state), (V)
    i64 next_state(i64 state, i64 symbol) const { return (state % (S_ / V_)) * V_ + symbol; }
    const std::vector<double>& stationary() const { return pi_; }  // pi over states, (V^k)

    // Nats per token: H = sum_s pi(s) H(P(.|s)).
    double entropy_rate() const override { return rate_; }
    // Expected minimal cross-entropy per target of a window of T+1 tokens when the predictor
    // sees only the window: target j (row[j], j = 1..T) sees the j tokens before it. For j >= k
    // that is the entropy rate; for j < k it is H(X_j | X_0..X_{j-1}) under the stationary
    // k-gram distribution, which is higher. The true floor a model can reach on these windows.
    double window_floor(i64 T) const override;

private:
    i64 V_, k_, S_;
    u64 sample_seed_;
    std::vector<double> P_;       // (S, V) transition rows
    std::vector<double> cdf_;     // (S, V) cumulative rows, last entry exactly 1
    std::vector<double> pi_;      // (S) stationary distribution
    std::vector<double> pi_cdf_;  // (S) cumulative pi, last entry exactly 1
    double rate_ = 0;
    std::vector<double> head_;  // (k-1) H(X_j | X_0..X_{j-1}) for j = 1..k-1
};

// N order-k Markov chains over disjoint symbols, chain c over [c·W, (c+1)·W) with W = V / N
// (symbols from N·W on are never drawn), each with its own Dirichlet(alpha) table. Every
// sequence draws one chain, uniformly, and is a window of it: text in N languages with their
// own scripts, for experts to specialise on. The first token names the chain, and targets start
// at the second, so the floor is exact: a window's floor is the mean of the chains' window
// floors, and so is the entropy rate.
class MixtureSource : public TokenSource {
public:
    // V symbols in all, N >= 2 chains of V / N >= 2 symbols each; the rest as MarkovSource.
    // Throws ConfigError naming the key when N does not fit V.
    MixtureSource(i64 V, i64 N, i64 k, double alpha, u64 table_seed, u64 sample_seed);

    i64 vocab() const override { return V_; }
    void sample(int* tokens, i64 T, Split split, i64 step, i64 first_sample,
                i64 count) const override;
    double entropy_rate() const override;
    double window_floor(i64 T) const override;

    i64 chains() const { return static_cast<i64>(chains_.size()); }
    i64 symbols_per_chain() const { return W_; }
    const MarkovSource& chain(i64 c) const { return chains_[static_cast<size_t>(c)]; }
    // The chain that sample `sample` of (split, step) is drawn from.
    i64 chain_of(Split split, i64 step, i64 sample) const;

private:
    i64 V_, W_;
    u64 sample_seed_;
    std::vector<MarkovSource> chains_;
};

// The seed of chain c's transition table in a mixture whose data.markov_seed is `seed`.
u64 mixture_table_seed(u64 seed, i64 c);

// A long-range source: window position i < D is a uniform draw from V symbols, and every later
// position repeats the token D before it (x_i = x_{i-D}), so each window is its first D tokens
// over and over. Target j (1..T) of a window is new for j < D (ln V nats whatever the model
// sees) and a copy for j >= D: free for a predictor that sees D tokens back, ln V for one that
// sees fewer (what it sees is independent of the copied token). Both floors are exact, and
// their gap is what only the whole context can win: the long-context example's margin.
class CopySource : public TokenSource {
public:
    // V >= 2 symbols, distance D >= 1; throws ConfigError naming the key otherwise.
    CopySource(i64 V, i64 D, u64 sample_seed);

    i64 vocab() const override { return V_; }
    void sample(int* tokens, i64 T, Split split, i64 step, i64 first_sample,
                i64 count) const override;
    double window_floor(i64 T) const override { return context_floor(V_, D_, T, T); }
    i64 distance() const { return D_; }
    // The floor per target of windows of T+1 for a predictor that sees at most the W tokens
    // before each target (W >= T: the whole window).
    static double context_floor(i64 V, i64 D, i64 T, i64 W);

private:
    i64 V_, D_;
    u64 sample_seed_;
};

// data.copy_distance as the copy source uses it (0: model.seq_len / 2, at least 1), and the
// symbols of the built-in sources (data.markov_vocab, or model.vocab when that is 0).
i64 copy_distance(const Config& cfg);
i64 source_vocab(const Config& cfg);

// llm.c token files: 256 int32 little-endian header (magic 20240520, version 1, token count),
// then uint16 tokens. Files are memory-mapped and validated once on open: every token < V, and
// enough tokens for one window of seq_len+1. Windows start at a Philox draw mod (ntokens - T).
class BinTokenSource : public TokenSource {
public:
    // `val_path` may be empty: then sampling Split::val throws DataError.
    BinTokenSource(const std::string& train_path, const std::string& val_path, i64 V, i64 seq_len,
                   u64 seed);
    ~BinTokenSource() override;
    BinTokenSource(const BinTokenSource&) = delete;
    BinTokenSource& operator=(const BinTokenSource&) = delete;

    i64 vocab() const override { return V_; }
    void sample(int* tokens, i64 T, Split split, i64 step, i64 first_sample,
                i64 count) const override;

    i64 num_tokens(Split split) const;  // tokens in that split's file (0 when absent)
    // Where window `sample` of (split, step) starts in that split's file, for windows of T+1.
    i64 window_start(i64 T, Split split, i64 step, i64 sample) const;

    struct Mapped;  // a memory-mapped, validated token file

private:
    i64 V_;
    u64 seed_;
    std::unique_ptr<Mapped> train_, val_;
};

// A provoked loss spike (data.corrupt_step, data.corrupt_kind): the windows of `inner` except the
// training batch of step index `batch` (0-based: the batch first drawn at step batch + 1),
// every sequence of which is corrupted:
//   "repeat"   the window's first token, repeated T+1 times (a degenerate run, as a broken
//              document or a de-duplication bug makes);
//   "shuffle"  each token x becomes perm[x], perm a permutation of the source's vocabulary drawn
//              from Philox keyed by (seed, kCorruptPermId) (a tokenizer mix-up: the symbols'
//              statistics stay, their meaning goes).
// The corruption belongs to the batch, not the step: a run that skips that batch never sees it.
class CorruptedSource : public TokenSource {
public:
    CorruptedSource(std::unique_ptr<TokenSource> inner, i64 batch, const std::string& kind,
                    u64 seed);
    i64 vocab() const override { return inner_->vocab(); }
    const TokenSource& base() const override { return inner_->base(); }
    void sample(int* tokens, i64 T, Split split, i64 step, i64 first_sample,
                i64 count) const override;

private:
    std::unique_ptr<TokenSource> inner_;
    i64 batch_;
    bool repeat_;
    std::vector<int> perm_;  // "shuffle"
};

// Builds the source cfg.data.source names ("markov", "mixture", "copy": V = source_vocab(cfg);
// "bin": the token files).
std::unique_ptr<TokenSource> make_source(const Config& cfg);

// Writes an llm.c token file (version 1). Throws DataError if the file cannot be written.
void write_llmc_tokens(const std::string& path, const std::vector<std::uint16_t>& tokens);

}  // namespace px
