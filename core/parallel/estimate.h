// The memory a rank of a layout holds at its peak, estimated from a config before anything is
// made (core/train/memory.h adds it up and checks it against the budget). The estimate reads the
// config's sizes once (MemorySizes), the model's floats per stage (StageParams) and activations
// per set, and each parallelism adds the terms it holds in its part's estimate()
// (core/parallel/<x>/part.h; precision's in core/train/precision.h), for a group of ranks that
// hold the same (MemoryGroup). Doubles throughout, so no size overflows.
//
// Index
//   MemorySizes, memory_sizes   the sizes of a config that the estimate reads
//   memory_dim                  a dimension on one tensor-parallel rank
//   StageParams, stage_params   a tp rank's floats of wte, wpe, a layer and ln_f
//   activation_set_bytes        one microbatch's activations on some layers and chunks
//   MemoryGroup                 ranks holding the same: a pipeline, or one rank
//   MemoryTerms                 the estimate's parts, as the parts add to them
#pragma once
#include "core/base/arena.h"
#include "core/base/config.h"

#include <string>

namespace px {

inline constexpr double kEstimateFloat = 4;  // bytes: weights, gradients, moments, losses (fp32)

// The sizes of a config that the estimate reads, as doubles (none of them overflows).
struct MemorySizes {
    double V, T, L, NH, C, F;  // model
    double tp, pp, v, S, dp;   // layout: S = pp · v virtual stages
    double cp;                 // context-parallel ranks: replicas of the weights, each with T/cp
                               // tokens of a sequence (estimated as whole sequences: an upper
                               // bound)
    double ep;                 // expert-parallel ranks: E/ep experts each, rows from ep ranks
    int zero;                  // effective ZeRO stage (0 with one replica)
    double M;                  // microbatches per replica and step
    double tree_buffers;       // partial gradient buffers a replica's token tree makes in a step
                               // (TreeAccumulator; core/parallel/data/token_tree.h)
    double B, micro_B, local_B, VB;
    bool recompute, microbatch_major, eval;
    std::string schedule;
    double act_bytes;  // bytes of an activation in the run's dtype
    double markov;     // bytes of one Markov source's tables (0 for token files)
    bool init_from, export_llmc;
    double fp8_state;  // floats of fp8 delayed scaling's scales and histories (every rank's)
    double E, K, FE, FS, FM;  // MoE (core/base/arena.h Dim): 0 without, FM = F
    double moe_layers;        // layers that are MoE
    double CA, KV, KVH, HS;   // attention channels, KV channels and heads, head size
    bool kv_split;            // tp ranks split the KV heads (kv_split)
    ModelConfig model;        // which tensors the architecture has (arch_holds, arch_keeps)
};

MemorySizes memory_sizes(const Config& c);

// A dimension of the model's tables (core/base/arena.h Dim) on one tensor-parallel rank (the
// vocabulary cut in rows, the first ranks taking the extra ones); B: the sequences of a batch.
double memory_dim(Dim d, const MemorySizes& s, double B);

// Floats of a tp rank's tensors, with the table's alignment: wte, wpe, ln_f, and a layer (the
// mean over the model's dense and MoE layers).
struct StageParams {
    double wte = 0, wpe = 0, layer = 0, lnf = 0;  // lnf: the head's own (with an untied lm_head)
    double head_wte = 0;                          // wte again for the head: tied, else 0
};
StageParams stage_params(const MemorySizes& s);

// Activation bytes of one microbatch on `layers` layers in `chunks` model chunks, `heads` of
// which end in the LM head.
double activation_set_bytes(const MemorySizes& s, double layers, double chunks, double heads);

// A group of `ranks` stage ranks (a whole pipeline, or one rank) holding P parameter floats,
// `layers` layers in `chunks` chunks, `heads` LM heads and `lasts` last stages, times `copies`
// (replicas × tp ranks).
struct MemoryGroup {
    double P, layers, chunks, heads, ranks, lasts, copies;
};

// The estimate's parts, in bytes per copy of a group (memory.h multiplies by the copies).
struct MemoryTerms {
    double weights = 0, gradients = 0, moments = 0, activations = 0;
    double batch = 0;        // token and loss buffers
    double validation = 0;   // validation losses
    double data = 0;         // data tables
    double bookkeeping = 0;  // schedules, token ranges, trees, tables, fp8 state
    double copies = 0;       // whole-model copies
};

}  // namespace px
