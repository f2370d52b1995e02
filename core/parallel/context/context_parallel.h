// Context parallelism (docs/layouts.md) over a cp group: every sequence is cut into 2·cp chunks
// of T/(2·cp) tokens and cp rank r holds chunks r and 2·cp-1-r (zig-zag: under the causal mask
// each rank then has the same attention work). The model runs on a rank's T/cp tokens of every
// sequence (core/model/model.h ContextLayers); everything but attention is per token.
//
// Index
//   zigzag_runs         where cp rank r's tokens sit in their sequence
//   cp_owned_blocks     the token blocks of the batch's tree a cp rank holds of some sequences
//   CpAttention         ContextLayers over a cp group: both methods, bit-identical
//   make_cp_attention   the layers of a rank, in fixed, commented steps
//   CpCosts, cp_costs   a rank's cp traffic per step and attention memory, by formula
//
// Why exact (Mode::bitwise; the single device's attention is kernels/cpu/attention.cpp).
//   Ring. Each rank passes its keys and values (B, T/cp, 2C) around the ring, cp-1 hops, until it
//   holds every key and value of its sequences at their logical positions; while a block travels
//   on to the next rank, the rank computes its queries' scores against it (the local block
//   first). A score is one canonical dot over HS, so scores taken block by block are the single
//   device's (ops::attention_queries_scores). Once every score of a row is in, its max, softmax
//   sum (the canonical tree over key blocks, blocks past the row absent) and P·V run the very
//   loop body of attention_forward on the row at its position (ops::attention_queries_softmax):
//   in bitwise mode the softmax waits for the row's last score, since its max and its sum are
//   over every key. Backward: dq of a row reads only that row and
//   every key, so it is local. dk_j and dv_j reduce over queries t >= j in the canonical tree over
//   query blocks of the sequence; rank r's queries are its two chunks, whole blocks, whose
//   maximal tree nodes it computes (one node per chunk when 2·cp is a power of two dividing the
//   blocks), ops::attention_queries_backward. The node values of every key go to the key's owner
//   (all_to_all), which combines every rank's nodes in the tree (combine_nodes) and scales as the
//   kernel does. Keys and values are gathered again in backward rather than kept: memory is
//   a rank's share of the attention matrix (B, NH, T/cp, T), not the whole sequence's.
//   Ulysses. An all-to-all turns (B, T/cp, 3C) token rows into (B, T, 3C/cp): the whole sequence
//   for NH/cp heads. Attention is then the plain kernel on whole heads (bits per head do not
//   depend on the other heads) and a second all-to-all returns the output rows. Backward repeats
//   the first all-to-all (for q, k, v) and one for d(out), runs the plain backward and returns dqkv
//   by a third. Needs cp to divide the heads (after tp).
// Weight gradients reduce over tokens: a rank's tokens of a sequence are two ranges of whole
// blocks of the batch's flat token axis, whose maximal nodes are the trainer's token nodes
// (core/train/job.h), combined with every dp and cp rank's in the tree (tree_exchange.h).
#pragma once
#include "core/comm/comm.h"
#include "core/model/model.h"
#include "core/parallel/mesh.h"
#include "core/parallel/tree_exchange.h"

#include <functional>
#include <memory>
#include <vector>

namespace px {

// ---- the split -------------------------------------------------------------------------------

// cp rank r's runs of a sequence of T tokens (T/cp local rows): chunks r and 2cp-1-r of T/(2cp)
// tokens each, merged into one run when adjacent (r = cp-1). cp = 1: the whole sequence.
std::vector<PositionRun> zigzag_runs(i64 T, int cp, int rank);
// Logical position of each of the rank's T/cp local rows.
std::vector<i64> zigzag_positions(i64 T, int cp, int rank);

// The blocks of the batch's flat token tree (blocks of `block` tokens) that cp rank r holds of
// sequences [s_lo, s_hi): for each sequence its runs, ascending; adjacent ranges merged. T and the
// chunks must be whole blocks (validate_layout).
std::vector<Range> cp_owned_blocks(i64 T, int cp, int rank, int block, i64 s_lo, i64 s_hi);

// ---- the layers ------------------------------------------------------------------------------

class CpAttention : public ContextLayers {
public:
    // cp: the group (outlives this object). seq_len: T of the model.
    CpAttention(comm::Communicator& cp, CpMethod method, i64 seq_len, int block);

    i64 keys(i64 T) const override { return T * size_; }
    std::vector<PositionRun> runs(i64 T) const override {
        return zigzag_runs(T * size_, size_, rank_);
    }
    void attention_forward(const Numerics& nx, const Tensor& out, const Tensor& preatt,
                           const Tensor& att, const Tensor& qkv, i64 NH) const override;
    void attention_backward(const Numerics& nx, const Tensor& dqkv, const Tensor& dpreatt,
                            const Tensor& datt, const Tensor& dout, const Tensor& qkv,
                            const Tensor& att, i64 NH) const override;
    float logit_max(const Numerics& nx, const Tensor& preatt, i64 NH) const override;

    CpMethod method() const { return method_; }
    int size() const { return size_; }
    int rank() const { return rank_; }
    i64 staging_bytes() const;  // the largest staging buffers held so far

private:
    // kv_ (B, T, 3C): every rank's k and v thirds at their logical positions (q third unused);
    // arrived(owner), when given, runs for each block as it is here (kv_ holds it) and goes on.
    void ring_gather(const Tensor& qkv, const std::function<void(int)>& arrived) const;
    // a2a: local (B, Tl, 3C) rows -> heads_ (B, T, 3C/cp) (q|k|v of this rank's heads), and the
    // reverse for w = C or 3C channels laid out as groups of C/cp per rank.
    void to_heads(float* out, const float* in, i64 B, i64 Tl, i64 w, int parts) const;
    void from_heads(float* out, const float* in, i64 B, i64 Tl, i64 w, int parts) const;

    comm::Communicator& comm_;
    CpMethod method_;
    int size_ = 1, rank_ = 0, block_ = 64;
    i64 T_ = 0;
    std::vector<std::vector<i64>> pos_;      // by rank: logical position of each local row
    std::vector<std::vector<Range>> nodes_;  // by rank: its maximal nodes of the query-block tree
    mutable std::vector<float> kv_, send_, recv_, heads_, heads2_, heads3_, parts_;
};

// The context-parallel layers of cp rank cp.rank(). Steps:
//   1. the split: zig-zag chunks of every sequence (zigzag_runs), whole blocks of numerics.block;
//   2. the query nodes: each rank's maximal nodes of the tree over a sequence's blocks;
//   3. the method: ring or ulysses.
std::shared_ptr<CpAttention> make_cp_attention(comm::Communicator& cp, CpMethod method, i64 seq_len,
                                               int block);

// ---- accounting ------------------------------------------------------------------------------

// What one cp rank spends on context parallelism, from the layout (fp32 elements of 4 bytes;
// C, NH the tp shard's; B sequences per microbatch, M microbatches per step, Tl = T/cp, L the
// rank's layers, K the most query-tree nodes a rank holds):
//   ring     per layer and microbatch: forward (cp-1)·B·Tl·2C (K/V blocks around the ring);
//            backward the same again plus (cp-1)·B·Tl·K·2C (dk, dv node values to key owners)
//   ulysses  forward (cp-1)/cp·B·Tl·(3C + C) (qkv to heads, output back); backward
//            (cp-1)/cp·B·Tl·(3C + C + 3C) (qkv again, d(out), dqkv back)
// times M·L, with recompute = full one more forward. Training steps only (a validation forward
// adds its forward traffic). Attention memory per activation set: att (L, B, NH, Tl, T) kept (one
// layer's under recompute = full), and
// dpreatt, datt (B, NH, Tl, T) scratch: 1/cp of the single device's (T, T) per head.
struct CpCosts {
    double comm_bytes_per_step = 0;  // sent in the cp group
    double attention_bytes = 0;      // one activation set's att + dpreatt + datt
};
CpCosts cp_costs(const Layout& l, i64 layers, i64 micro_B);

}  // namespace px
