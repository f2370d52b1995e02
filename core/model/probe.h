// Probes (docs/validation.md): named capture points on the tensors of a training step. A probe
// names a tensor at a point, `step/phase/layer/op/tensor` (e.g. "3/bwd/2/attn.qkv/dinp"), and comes
// with the tensor's logical shape and the shard spec that maps this rank's local piece back into
// it, so that a harness can gather the pieces of every rank and compare logical tensors across
// layouts. The model and the Job call a ProbeSink; they never store anything themselves, and a
// run without a sink costs one null-pointer test per op (the bits never change either way).
//
// Probed: the single device, data parallelism (ZeRO-0..3), pipeline stages, and tensor and
// sequence parallelism (a tp rank's columns of qkv, heads, ffn and vocabulary; an SP rank's token
// rows of the residual stream; its shards of the parameters). Every layout unshards to the single
// device's probes bit for bit.
//
// Phases:
//   fwd    an op's output activation, per microbatch (tensor "out")
//   bwd    an op's input gradient, per microbatch (tensor "dinp")
//   mgrad  a parameter's gradient from one microbatch, as backward leaves it, before it joins the
//          others (under ZeRO-2/3 before its reduce-scatter; in a pipeline, each stage's own
//          parameters): logical shape (microbatches of the step, ...), one row per microbatch
//          in batch order. These are the nodes of the token tree that the ranks reduce, so they
//          depend on the microbatch cut: a reference must run with the layout's microbatch count
//          (dp × microbatches) to have the same ones. wte holds the embedding's part only (the
//          LM head's part joins after the reduction)
//   grad   a parameter's complete, reduced gradient of the step, before clipping and the update;
//          and "grad/-/clip/norm" (shape (1)), the global gradient norm that clipping sees
//   optim  after the update: the weight (op "param"), Adam's moments (ops "adam.m", "adam.v")
//
// Index
//   ProbeKey      step/phase/layer/op/tensor; name() is the string form
//   Hyperslab     a hyperslab [lo, hi) of a logical tensor
//   ShardSpec     a logical shape and the slabs whose concatenation is the local tensor
//   flat_shard    the slabs of a flat element range [a, b) of a row-major logical tensor
//   slice         the pieces of a spec's local elements [a, b) (a ZeRO shard of a tp shard)
//   offset_rows   a spec placed at rows [lo, lo + n) of a taller logical tensor (batch rows)
//   ProbeContext  what the model cannot know: the step, which rows of the batch it holds
//   ProbeSink     receives captures; wants() first, so unselected probes cost no copy
//   glob_match    the pattern language of probe selections
#pragma once
#include "core/base/dtype.h"
#include "core/base/shapes.h"  // i64

#include <string>
#include <string_view>
#include <vector>

namespace px {

// A capture point. The strings are literals (or the parameter table's names): never owned.
struct ProbeKey {
    i64 step = 0;              // 1-based step being run (0: outside a Job)
    const char* phase = "";    // "fwd", "bwd", "mgrad", "grad" or "optim"
    int layer = -1;            // the block; -1 for the embedding, the head, ln_f, the loss
    const char* op = "";       // e.g. "attn.qkv", "mlp.gelu", "param", "adam.m"
    const char* tensor = "";   // "out", "dinp", or a parameter's GPT-2 name
    // The dtype the library holds the tensor in (precision.activations): the floats a sink is
    // given are its values, widened exactly.
    DType dtype = DType::f32;
    std::string name() const;  // "3/fwd/2/attn.qkv/out"; layer -1 prints "-"
};

// Elements [lo[d], hi[d]) in every dimension d of a logical tensor (N-dimensional; checkpoints
// have their own 2-D Slab, core/io/checkpoint.h).
struct Hyperslab {
    std::vector<i64> lo, hi;
    i64 numel() const;  // product of hi - lo
    bool operator==(const Hyperslab&) const = default;  // the same slab
};

// The local tensor, row-major, is the concatenation of `pieces`, each a slab of the logical
// tensor in row-major order (one piece for dp's batch rows; several later for tp's qkv blocks).
struct ShardSpec {
    std::vector<i64> logical_shape;
    std::vector<Hyperslab> pieces;
    i64 local_numel() const;  // the sum of the pieces' elements
};

// The slabs of elements [a, b) of a row-major tensor of `shape` seen flat (a ZeRO shard of a
// parameter): at most a partial first row, whole rows, and a partial last row, in that order.
ShardSpec flat_shard(const std::vector<i64>& shape, i64 a, i64 b);

// The spec of local elements [a, b) of a tensor whose whole local spec is `s`: the part of each
// piece that falls in [a, b), cut into slabs as flat_shard cuts a tensor.
ShardSpec slice(const ShardSpec& s, i64 a, i64 b);

// s describes a tensor whose leading dimension is a block of `total` rows starting at `lo` of
// the logical tensor (a microbatch in the step's batch): shifts every piece's rows by lo and
// makes the logical leading dimension `total`.
void offset_rows(ShardSpec& s, i64 lo, i64 total);

// Set by the Job before each microbatch's forward and backward: the model knows neither the
// step nor where its microbatch sits in the global batch.
struct ProbeContext {
    i64 step = 0;         // 1-based step being run
    i64 batch_lo = 0;     // the microbatch's first sequence in the step's batch
    i64 batch_total = 0;  // sequences in the step's batch (0: the microbatch's own B)
};

// Receives probes. Called from every rank's thread at once when ranks are threads: capture must
// be thread-safe. `local` holds spec.local_numel() floats, valid only during the call.
class ProbeSink {
public:
    virtual ~ProbeSink();
    virtual bool wants(const ProbeKey& key) const = 0;  // asked first; false: nothing is copied
    virtual void capture(const ProbeKey& key, const float* local, const ShardSpec& spec) = 0;
};

// Whether `name` matches `pattern` in full. `*` matches any run of characters except '/',
// `**` any run including '/', `?` one character other than '/'; everything else matches itself.
// "*/bwd/*/attn.*/*" matches "3/bwd/2/attn.qkv/dinp"; "**" matches every probe;
// "*/fwd/-/loss/*" the per-token losses of every step.
bool glob_match(std::string_view pattern, std::string_view name);

}  // namespace px
