// The job config's sections: one struct per TOML section, one field per key, and Config, the
// whole job. The defaults below are the embedded default job (a tiny GPT on the built-in Markov
// source, which needs no files). Every key is documented in its registry
// (core/base/config_registry.h); reading, writing and validating a Config: core/base/config.h.
//
// Index
//   ModelConfig .. ValidateConfig  one struct per section, one field per key
//                                 (LayoutConfig: the parallel layout, docs/layouts.md)
//   kSpikeMinHistory              the floor of spikes.min_history
//   Config                        the whole job
#pragma once
#include "core/base/numerics.h"
#include "core/base/shapes.h"

#include <cstdint>
#include <string>

namespace px {

struct ModelConfig {
    // The block: "gpt2" (LayerNorm, GELU MLP, learned positions, head tied to wte) or "llama"
    // (RMSNorm, SwiGLU MLP, rotary positions, grouped-query attention; Qwen3 with qk_norm).
    std::string arch = "gpt2";
    i64 vocab = 32;           // V, tokens in the vocabulary
    i64 seq_len = 128;        // maximum T (rows of wpe); the data's sequence length
    i64 layers = 4;           // L
    i64 heads = 4;            // NH; must divide hidden
    i64 hidden = 64;          // C
    i64 ffn = 256;            // F, MLP inner size (GPT-2: 4*hidden)
    double init_std = 0.02;   // std of the normal init of weights (residual projections scaled by 1/sqrt(2L))
    std::string init_from;    // weights to load instead of random init: llm.c .bin, Parallax .h5, HF folder
    // llama only (the keys are ignored by gpt2, whose head is always tied to wte):
    i64 kv_heads = 0;         // KV heads of grouped-query attention, dividing heads; 0: heads
    i64 head_dim = 0;         // channels of one head; 0: hidden / heads
    double norm_eps = 1e-5;   // RMSNorm's epsilon
    double rope_theta = 500000;  // RoPE base
    double rope_factor = 0;      // Llama 3.1 frequency scaling: factor (0: off) and its parameters
    double rope_low_freq_factor = 1;
    double rope_high_freq_factor = 4;
    i64 rope_original_max_positions = 8192;
    bool tie_embeddings = false;  // the LM head is wte (else its own lm_head)
    bool qk_norm = false;         // Qwen3: RMSNorm of each head's q and k before RoPE
    // Mixture of experts (core/model/moe.h): a MoE layer's feed-forward is a router over
    // moe_experts expert MLPs of moe_ffn channels (0: ffn), each token going to its moe_top_k
    // best, plus moe_shared_experts experts every token goes to (one MLP of shared x moe_ffn).
    i64 moe_experts = 0;              // E; 0: every layer dense
    i64 moe_top_k = 2;                // k, experts per token
    i64 moe_ffn = 0;                  // F_e, inner size of one expert (0: model.ffn)
    i64 moe_shared_experts = 0;       // S, experts every token goes to
    i64 moe_every = 1;                // layer l is MoE when (l + 1) % moe_every == 0
    double moe_capacity_factor = 0;   // tokens per expert per sequence: ceil(cf·T·k/E); 0 dropless
    bool moe_norm_topk = true;        // gates: the top-k probabilities renormalised to sum to 1
    double moe_aux_loss = 0.01;       // load-balancing loss coefficient (per sequence)
    double moe_z_loss = 0.001;        // router z-loss coefficient

    bool is_moe() const { return moe_experts > 0; }
    bool moe_layer(i64 l) const { return is_moe() && (l + 1) % moe_every == 0; }
    i64 expert_ffn() const { return moe_ffn > 0 ? moe_ffn : ffn; }
    bool llama() const { return arch == "llama"; }
    i64 kv_head_count() const { return llama() && kv_heads > 0 ? kv_heads : heads; }
    i64 head_size() const { return llama() && head_dim > 0 ? head_dim : hidden / heads; }
    i64 attn_channels() const { return heads * head_size(); }       // NH·HS (q, attention out)
    i64 kv_channels() const { return kv_head_count() * head_size(); }  // KV·HS (k, v)
    // The LM head is wte: always for gpt2, by tie_embeddings for llama.
    bool tied_head() const { return !llama() || tie_embeddings; }

    bool operator==(const ModelConfig&) const = default;
};

// The parallel layout as written in the job. Validation here covers each key's range and the rules
// among layout keys (and layout.comm against numerics.mode); the rules that involve the model
// and the batch (tp divides heads, pp <= layers, dp * microbatches divides batch_size, token
// ranges are nodes of the canonical tree, ...) are checked when a px::Layout is built from the
// config (core/parallel/mesh.h), with a sentence naming the keys. The defaults are one device.
struct LayoutConfig {
    int dp = 1;                      // data-parallel replicas; world size = dp * pp * cp * tp
    int pp = 1;                      // pipeline stages, each a contiguous run of layers
    int tp = 1;                      // tensor-parallel ranks (Megatron column/row parallel)
    int cp = 1;                      // context-parallel ranks: each holds 2 zig-zag chunks of
                                     // every sequence
    std::string cp_method = "ring";  // context-parallel attention: "ring" or "ulysses"
    int ep = 1;                      // expert-parallel ranks: groups of ep consecutive dp ranks
                                     // share out each MoE layer's experts
    int zero = 0;                    // ZeRO stage 0..3 over the dp ranks
    int microbatches = 0;            // per dp rank and step; when > 0 overrides train.microbatches
    std::string schedule = "1f1b";   // pipeline schedule: gpipe, 1f1b, interleaved, zb-h1, zbv
    int virtual_stages = 1;          // v, model chunks per pp rank; >= 2 with interleaved, zbv 2
    std::string recompute = "none";  // activation recomputation: "none" or "full" (per block)
    bool sequence_parallel = false;  // tp > 1: residual stream and LayerNorms sharded by tokens
                                     // (all-gather / reduce-scatter around the tp linears)
    std::string comm = "auto";       // reducing collectives: "auto", "canonical" or "ring"
    double timeout_s = 60.0;         // seconds a collective waits for its peers before failing

    bool operator==(const LayoutConfig&) const = default;
};

struct TrainConfig {
    i64 steps = 600;          // optimizer steps
    i64 batch_size = 8;       // sequences per optimizer step (global batch)
    i64 microbatches = 1;     // gradient-accumulation microbatches per step; must divide batch_size
                              // (per dp rank under a layout; layout.microbatches > 0 overrides it)
    double lr = 3e-3;         // peak learning rate
    double min_lr = 3e-4;     // learning rate at the end of the cosine decay
    i64 warmup_steps = 30;    // linear warm-up steps
    double weight_decay = 0.0;  // AdamW decoupled weight decay (not applied to biases and norms)
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double grad_clip = 1.0;   // global-norm clipping threshold; 0 disables
    std::uint64_t seed = 1337;  // init and sampling seed
    i64 eval_every = 100;     // validation loss every N steps (and at the last step); 0 disables
    i64 val_batches = 8;      // validation batches of batch_size sequences
    i64 threads = 0;          // OpenMP threads per rank (at most 1024); 0 means all cores
    double max_memory_gib = 0;  // memory (GiB) this process may use; 0: what the machine has
    // A learning-rate jump, to provoke FP8 scale drift (and loss spikes) on purpose: steps
    // lr_jump_step .. lr_jump_step + lr_jump_steps - 1 (1-based) run at lr_jump_factor times the
    // schedule's rate. 0: off.
    i64 lr_jump_step = 0;
    double lr_jump_factor = 10.0;
    i64 lr_jump_steps = 1;

    bool operator==(const TrainConfig&) const = default;
};

struct DataConfig {
    std::string source = "markov";  // "markov", "mixture", "copy" (built-in) or "bin" (llm.c files)
    i64 markov_order = 1;           // k, the order of the Markov chain
    double markov_alpha = 0.25;     // concentration of the random transition rows (smaller: lower entropy)
    std::uint64_t markov_seed = 7;  // seed of the transition table
    i64 markov_vocab = 0;           // symbols of the chain; 0 means model.vocab
    // source = "mixture": this many Markov chains, each over its own markov_vocab / N symbols,
    // one drawn per sequence (core/model/data.h MixtureSource).
    i64 mixture_chains = 4;
    // source = "copy": every window repeats its first copy_distance tokens (uniform draws); 0
    // means model.seq_len / 2 (core/model/data.h CopySource).
    i64 copy_distance = 0;
    std::string train_path;         // llm.c .bin token file for training (source = "bin")
    std::string val_path;           // llm.c .bin token file for validation (source = "bin")
    // A corrupted training batch, to provoke a loss spike (core/model/data.h CorruptedSource):
    // the batch first drawn at step corrupt_step (1-based; 0: none) is replaced, every sequence
    // of it, by "repeat" (its first token repeated) or "shuffle" (its tokens sent through a
    // random permutation of the vocabulary).
    i64 corrupt_step = 0;
    std::string corrupt_kind = "repeat";

    bool operator==(const DataConfig&) const = default;
};

struct NumericsConfig {
    Mode mode = Mode::bitwise;  // "bitwise" or "fast"
    int block = 16;             // canonical reduction block size
    std::string isa = "auto";   // "auto", "avx512", "avx2" or "scalar"

    bool operator==(const NumericsConfig&) const = default;
};

// The dtypes tensors are kept in (docs/precision.md). Master weights, gradients and optimizer state
// are fp32 whatever this says.
struct PrecisionConfig {
    std::string activations = "fp32";  // the activations' dtype: "fp32", "bf16" or "fp16"
    // Dynamic loss scaling (fp16 activations only; core/train/loss_scaler.h): the loss gradient
    // is multiplied by the scale, the weight gradients divided by it; a step whose gradients hold
    // an inf or a NaN on any rank is skipped and the scale multiplied by the backoff factor; after
    // growth_interval good steps in a row it is multiplied by the growth factor.
    double loss_scale_init = 65536.0;     // the scale of the first step (> 0)
    i64 loss_scale_growth_interval = 2000;  // good steps in a row before the scale grows (>= 1)
    double loss_scale_growth_factor = 2.0;  // > 1
    double loss_scale_backoff_factor = 0.5;  // in (0, 1)
    // FP8 matmuls (core/model/fp8.h), over bf16 activations: "off", "delayed" (Transformer
    // Engine's per-tensor delayed scaling, e4m3 forward, e5m2 gradients) or "block" (DeepSeek-V3's
    // current scaling of 1 x block activation tiles and block x block weight blocks, e4m3).
    std::string fp8 = "off";
    i64 fp8_block_size = 128;                // "block": the tile and block edge
    i64 fp8_amax_history_len = 1024;         // amaxes of the last N steps a scale is made from
    std::string fp8_amax_compute_algo = "max";  // "max" of the history, or its "most_recent"
    i64 fp8_margin = 0;                      // scale = fp8_max / amax / 2^margin
    bool fp8_keep_ends_bf16 = true;          // the first and last blocks' matmuls stay bf16
    // Which blocks' linears run in fp8: "" (as fp8_keep_ends_bf16 says), "all", "none", or block
    // indices and inclusive ranges, 0-based: "1-4,6" (fp8_block_mask).
    std::string fp8_layers;
    bool fp8_lm_head = false;  // the LM head's matmul (ln_f output · wteᵀ) in fp8 too
    // N > 0: the fp8 matmuls sum products in Hopper's narrow accumulator (13 mantissa bits,
    // truncated), promoted to fp32 every N products (DeepSeek-V3: 128); 0: fp32 throughout
    i64 fp8_accumulator_promote = 0;

    bool operator==(const PrecisionConfig&) const = default;
};

struct OutputConfig {
    std::string dir = "runs/default";  // where run.h5 and exports go (--out overrides)
    bool run_file = true;              // write <dir>/run.h5
    std::string export_llmc;           // if set, write the final weights as an llm.c checkpoint here
    bool progress = true;              // progress bar on a terminal

    bool operator==(const OutputConfig&) const = default;
};

// Checkpoints (core/io/checkpoint.h): where, how often, how many, and whether to resume.
struct CheckpointConfig {
    std::string dir;       // folder of ckpt-<step>.h5 files; "" turns checkpoints off
    i64 every = 0;         // write every N steps (and at the end); 0: only at the end
    i64 keep = 3;          // keep the newest K checkpoints, delete older ones after a commit
    std::string resume;    // "": start fresh; "auto": the newest valid one in dir; else a file

    bool operator==(const CheckpointConfig&) const = default;
};

// Fault injection (core/train/faults.h): one fault, on one rank, in one step, to prove that
// the job's failure handling catches and names it. Off while kind is "".
struct FaultConfig {
    std::string kind;            // "", "kill", "stall", "flip_grad" or "flip_weight"
    int rank = 0;                // the world rank it strikes
    i64 step = 1;                // the step (1-based) it strikes in
    std::string tensor = "wte";  // flip_*: the parameter (GPT-2 name) whose element flips
    i64 element = 0;             // flip_*: index into the rank's piece of it (its tp shard)
    int bit = 20;                // flip_*: bit of the float32, 0 (lowest mantissa) .. 31 (sign)
    double stall_s = 0;          // stall: seconds; 0: until the other ranks give up on it
    bool persistent = false;     // flip_*: strike again when the step is re-run (a faulty unit)

    bool operator==(const FaultConfig&) const = default;
};

// The fewest steps of history a spike may be judged against (spikes.min_history's floor; the
// rule and its false-alarm rates are in core/train/spikes.h).
inline constexpr i64 kSpikeMinHistory = 20;

// Loss spikes (core/train/spikes.h): detection by a robust z-score of the loss and of the global
// gradient norm over a trailing window, per-layer evidence every step, and what to do about one.
struct SpikesConfig {
    std::string action = "off";  // "off", "log", "skip", "clip" or "rollback"
    i64 window = 50;             // trailing steps the median and MAD are taken over
    i64 min_history = 20;        // steps in the window before anything is judged (at least 20)
    double z_threshold = 6.0;    // robust z above which the loss or the grad norm is a spike
    double clip_z = 2.5;         // "clip": the grad norm is clipped to median + clip_z * 1.4826 MAD
    i64 snapshot_every = 10;     // in-memory snapshot every N steps (rollback and replay start)
    std::string rollback_to = "memory";  // "memory" (the newest snapshot) or "checkpoint"
    std::string skip = "spike";  // after a rollback: skip the "spike" step's batch, or every batch
                                 // "since_snapshot"
    bool replay = true;          // attribute each spike by replaying its step from the snapshot

    bool operator==(const SpikesConfig&) const = default;
};

// The FP8 drift monitor (core/train/fp8_monitor.h): statistics of every fp8-scaled tensor every
// N steps, and alerts when a scale jumps, saturation climbs or the cast's SQNR falls.
struct Fp8MonitorConfig {
    i64 every = 0;            // monitor every N steps (steps N, 2N, ...); 0: off
    std::string compare;      // other recipes measured on the same tensors: "", "current", "block"
                              // or both, comma-separated
    double scale_jump = 4.0;  // alert: a scale changed by more than this factor in a step; 0: off
    double saturation_max = 0.01;  // alert: a fraction of saturated values above this
    double sqnr_min_db = 10.0;     // alert: a cast's SQNR below this (dB)

    bool operator==(const Fp8MonitorConfig&) const = default;
};

// Checks that run beside training.
struct ValidateConfig {
    i64 replica_check_every = 0;  // every N steps dp replicas compare weight checksums; 0: off

    bool operator==(const ValidateConfig&) const = default;
};

struct Config {
    ModelConfig model;
    LayoutConfig layout;
    TrainConfig train;
    DataConfig data;
    NumericsConfig numerics;
    PrecisionConfig precision;
    OutputConfig output;
    CheckpointConfig checkpoint;
    ValidateConfig validate;
    FaultConfig fault;
    SpikesConfig spikes;
    Fp8MonitorConfig fp8_monitor;
    std::string source_name = "<default>";  // where it came from, for error messages

    bool operator==(const Config&) const = default;  // every field, source_name included
};

}  // namespace px
