// The job config: one table of keys drives parsing, validation messages, --set, the embedded
// default job and writing a config back out, so a key is added in one place (kKeys below).
#include "core/base/config.h"

#include "core/base/config_checks.h"
#include "core/base/error.h"
#include "core/base/files.h"

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <climits>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <variant>

namespace px {

using namespace config_checks;

namespace {

// ---- the key table ----

using FieldRef = std::variant<i64*, int*, double*, std::uint64_t*, std::string*, bool*, Mode*>;

struct KeyDef {
    const char* section;
    const char* name;
    FieldRef (*field)(Config&);
    const char* doc;  // one line, for the embedded default job
};

struct SectionDef {
    const char* name;
    const char* doc;
};

constexpr std::array<SectionDef, 12> kSections = {{
    {"model", "The GPT: sizes and initialisation."},
    {"layout", "The parallel layout: dp x pp x tp ranks, ZeRO, microbatches, pipeline schedule (DESIGN.md section 3)."},
    {"train", "Optimisation: steps, batch, AdamW and the learning-rate schedule."},
    {"data", "Where tokens come from."},
    {"numerics", "How reductions are computed (see DESIGN.md section 2)."},
    {"precision", "The dtypes tensors are kept in (DESIGN.md section 5); master weights, gradients and optimizer state are always fp32."},
    {"output", "What the run writes."},
    {"checkpoint", "Checkpoints: logical, layout-free HDF5 files to resume from under any layout."},
    {"validate", "Checks beside training: silent data corruption across data-parallel replicas."},
    {"fault", "Fault injection, to prove that failures are caught and named (off unless kind is set)."},
    {"spikes", "Loss spikes: detected by a robust z-score, recorded with per-layer evidence, attributed by replay, and logged, skipped, clipped or rolled back (off unless action is set)."},
    {"fp8_monitor", "The FP8 drift monitor: per fp8-scaled tensor statistics every N steps, and alerts (off unless every is set)."},
}};

#define PX_KEY(sec, key, doc) \
    KeyDef { #sec, #key, [](Config& c) -> FieldRef { return &c.sec.key; }, doc }

const std::array kKeys = {
    PX_KEY(model, vocab, "V, tokens in the vocabulary (>= 2)"),
    PX_KEY(model, seq_len, "maximum T, tokens per sequence (rows of wpe); the data's sequence length"),
    PX_KEY(model, layers, "L, transformer blocks"),
    PX_KEY(model, heads, "NH, attention heads; must divide hidden"),
    PX_KEY(model, hidden, "C, hidden size"),
    PX_KEY(model, ffn, "F, MLP inner size (GPT-2: 4 * hidden)"),
    PX_KEY(model, init_std, "std of the normal init of weights (residual projections scaled by 1/sqrt(2L))"),
    PX_KEY(model, init_from, "weights to start from instead of random init: an llm.c GPT-2 checkpoint (.bin) or a Parallax checkpoint (.h5; its weights only: step 0, fresh optimizer); the model keys must match the file's; \"\" for none"),
    PX_KEY(model, moe_experts, "E, experts of a mixture-of-experts feed-forward; 0: every layer a dense MLP"),
    PX_KEY(model, moe_top_k, "k, the experts each token is routed to (1 <= k <= moe_experts), by the router's softmax"),
    PX_KEY(model, moe_ffn, "inner size of one expert's MLP; 0: model.ffn"),
    PX_KEY(model, moe_shared_experts, "experts every token goes to besides its top k (DeepSeek's shared experts: one MLP of moe_shared_experts x moe_ffn channels); 0: none"),
    PX_KEY(model, moe_every, "MoE on every n-th layer: layer l (0-based) is MoE when (l + 1) % moe_every == 0, the others dense"),
    PX_KEY(model, moe_capacity_factor, "tokens an expert takes per sequence: ceil(factor * seq tokens * k / E); the rest are dropped, first choices first, in token order; 0: dropless"),
    PX_KEY(model, moe_norm_topk, "gates: the chosen experts' router probabilities renormalised to sum to 1 (Mixtral); false: the probabilities as they are (Switch)"),
    PX_KEY(model, moe_aux_loss, "load-balancing loss coefficient: E * sum_i f_i * P_i per sequence (f_i the share of its routed slots, P_i the mean router probability of expert i), averaged over sequences and summed over MoE layers"),
    PX_KEY(model, moe_z_loss, "router z-loss coefficient: the mean over tokens of logsumexp(router logits)^2, summed over MoE layers"),
    PX_KEY(layout, dp, "data-parallel replicas; world size = dp * pp * cp * tp"),
    PX_KEY(layout, pp, "pipeline stages, each a contiguous run of layers (at most model.layers)"),
    PX_KEY(layout, tp, "tensor-parallel ranks; must divide model.heads and model.ffn"),
    PX_KEY(layout, cp, "context-parallel ranks: each holds chunks r and 2cp-1-r of every sequence cut into 2cp (zig-zag, causal load balance); the chunks must be whole blocks of numerics.block"),
    PX_KEY(layout, cp_method, "context-parallel attention: \"ring\" (K/V blocks around the ring) or \"ulysses\" (all-to-all to whole heads; cp must divide model.heads / layout.tp)"),
    PX_KEY(layout, ep, "expert-parallel ranks: each group of ep consecutive data-parallel ranks shares out every MoE layer's experts (E/ep each) and sends each routed token to its expert's rank and back (all-to-all); must divide layout.dp and model.moe_experts"),
    PX_KEY(layout, zero, "ZeRO stage over the dp ranks: 0 none, 1 optimizer state, 2 also gradients, 3 also parameters"),
    PX_KEY(layout, microbatches, "microbatches per step on each dp rank; when > 0 overrides train.microbatches (0: use it); dp * microbatches must divide train.batch_size"),
    PX_KEY(layout, schedule, "pipeline schedule: \"gpipe\", \"1f1b\" or \"interleaved\""),
    PX_KEY(layout, virtual_stages, "v, model chunks per pipeline rank; >= 2 exactly when schedule = \"interleaved\""),
    PX_KEY(layout, recompute, "activation recomputation: \"none\" or \"full\" (each block's forward again in its backward)"),
    PX_KEY(layout, sequence_parallel, "with tp > 1, keep the residual stream and the LayerNorms sharded by tokens (Megatron sequence parallelism: all-gather before and reduce-scatter after the tp linears instead of all-reduce); batch tokens per microbatch must give each tp rank whole blocks"),
    PX_KEY(layout, comm, "reducing collectives: \"auto\" (canonical in bitwise mode, ring in fast), \"canonical\" or \"ring\""),
    PX_KEY(layout, timeout_s, "seconds a collective waits for its peers before the job fails (> 0)"),
    PX_KEY(train, steps, "optimizer steps"),
    PX_KEY(train, batch_size, "sequences per optimizer step (global batch)"),
    PX_KEY(train, microbatches, "gradient-accumulation microbatches per step (per dp rank); must divide batch_size"),
    PX_KEY(train, lr, "peak learning rate"),
    PX_KEY(train, min_lr, "learning rate at the end of the cosine decay (0 <= min_lr <= lr)"),
    PX_KEY(train, warmup_steps, "linear warm-up steps"),
    PX_KEY(train, weight_decay, "AdamW decoupled weight decay (not applied to biases and norms)"),
    PX_KEY(train, beta1, "AdamW first-moment decay, in [0, 1)"),
    PX_KEY(train, beta2, "AdamW second-moment decay, in [0, 1)"),
    PX_KEY(train, eps, "AdamW epsilon (> 0)"),
    PX_KEY(train, grad_clip, "global-norm clipping threshold; 0 disables"),
    PX_KEY(train, seed, "init and sampling seed (0 .. 2^63-1)"),
    PX_KEY(train, eval_every, "validation loss every N steps (and at the last step); 0 disables"),
    PX_KEY(train, val_batches, "validation batches of batch_size sequences"),
    PX_KEY(train, threads, "OpenMP threads per rank, at most 1024; 0 means all cores"),
    PX_KEY(train, max_memory_gib, "memory (GiB) this process may use, checked against an estimate before anything is allocated; 0: what the machine has available (MemAvailable, the cgroup's limit)"),
    PX_KEY(train, lr_jump_step, "provoke drift: from this step (1-based) the learning rate is multiplied by lr_jump_factor for lr_jump_steps steps; 0: off"),
    PX_KEY(train, lr_jump_factor, "the learning-rate jump's factor (> 0)"),
    PX_KEY(train, lr_jump_steps, "steps the learning-rate jump lasts (>= 1)"),
    PX_KEY(data, source, "\"markov\", \"mixture\" or \"copy\" (built-in, need no files) or \"bin\" (llm.c token files)"),
    PX_KEY(data, markov_order, "k, the order of the Markov chain (vocab^k states, at most 2^22)"),
    PX_KEY(data, markov_alpha, "concentration of the random transition rows (smaller: lower entropy)"),
    PX_KEY(data, markov_seed, "seed of the transition table (0 .. 2^63-1)"),
    PX_KEY(data, markov_vocab, "symbols of the chain (<= model.vocab); 0 means model.vocab"),
    PX_KEY(data, mixture_chains, "mixture: Markov chains, each over its own markov_vocab / N symbols, one drawn per sequence"),
    PX_KEY(data, copy_distance, "copy: each window repeats its first D tokens (0: model.seq_len / 2; D > seq_len: no copy in sight, the short-context baseline)"),
    PX_KEY(data, train_path, "llm.c .bin token file for training (source = \"bin\")"),
    PX_KEY(data, val_path, "llm.c .bin token file for validation (source = \"bin\"); \"\": none"),
    PX_KEY(data, corrupt_step, "provoke a loss spike: the training batch first drawn at this step (1-based) is corrupted; 0: none"),
    PX_KEY(data, corrupt_kind, "how the batch of data.corrupt_step is corrupted: \"repeat\" (each sequence one token repeated) or \"shuffle\" (its tokens through a random permutation of the vocabulary)"),
    PX_KEY(numerics, mode, "\"bitwise\" (equal to the single-device reference, bit for bit) or \"fast\""),
    PX_KEY(numerics, block, "canonical reduction block size"),
    PX_KEY(numerics, isa, "vector path: \"auto\", \"avx512\", \"avx2\" or \"scalar\""),
    PX_KEY(precision, activations, "dtype of the activations: \"fp32\", \"bf16\" or \"fp16\" (fp16 with dynamic loss scaling)"),
    PX_KEY(precision, loss_scale_init, "fp16: the loss scale of the first step (> 0)"),
    PX_KEY(precision, loss_scale_growth_interval, "fp16: steps in a row without inf/NaN gradients before the loss scale grows (>= 1)"),
    PX_KEY(precision, loss_scale_growth_factor, "fp16: what the loss scale is multiplied by when it grows (> 1)"),
    PX_KEY(precision, loss_scale_backoff_factor, "fp16: what the loss scale is multiplied by when a step is skipped for inf/NaN gradients (in (0, 1))"),
    PX_KEY(precision, fp8, "FP8 matmuls over bf16 activations: \"off\", \"delayed\" (per-tensor delayed scaling: e4m3 inputs and weights, e5m2 output gradients) or \"block\" (current scaling per 1 x fp8_block_size activation tile and fp8_block_size^2 weight block, e4m3); needs activations = \"bf16\""),
    PX_KEY(precision, fp8_block_size, "fp8 block: the edge of the activation tiles and weight blocks (>= 1; DeepSeek-V3: 128)"),
    PX_KEY(precision, fp8_amax_history_len, "fp8 delayed: steps of amax history per tensor (>= 1)"),
    PX_KEY(precision, fp8_amax_compute_algo, "fp8 delayed: the amax a scale is made from: \"max\" of the history or \"most_recent\""),
    PX_KEY(precision, fp8_margin, "fp8 delayed: scale = fp8_max / amax / 2^margin (>= 0)"),
    PX_KEY(precision, fp8_keep_ends_bf16, "fp8: the first and last blocks' matmuls stay in bf16 (when fp8_layers is \"\")"),
    PX_KEY(precision, fp8_layers, "fp8: the blocks whose linears run in fp8: \"\" (as fp8_keep_ends_bf16 says), \"all\", \"none\", or 0-based block indices and inclusive ranges, e.g. \"1-4,6\""),
    PX_KEY(precision, fp8_lm_head, "fp8: the LM head's matmul (ln_f output times wte) in fp8 too; the embedding (a lookup) never is"),
    PX_KEY(precision, fp8_accumulator_promote, "fp8: N > 0 emulates Hopper's FP8 accumulator: products summed in 13 mantissa bits (truncated) and promoted to fp32 every N products (DeepSeek-V3: 128; at most numerics.block); 0: fp32 sums"),
    PX_KEY(output, dir, "where run.h5 and exports go (--out overrides)"),
    PX_KEY(output, run_file, "write <dir>/run.h5"),
    PX_KEY(output, export_llmc, "if set, write the final weights as an llm.c checkpoint here"),
    PX_KEY(output, progress, "progress bar on a terminal"),
    PX_KEY(checkpoint, dir, "folder of the checkpoints (ckpt-<step>.h5); \"\" turns checkpoints off"),
    PX_KEY(checkpoint, every, "write a checkpoint every N steps and at the end; 0: only at the end"),
    PX_KEY(checkpoint, keep, "keep the newest K checkpoints (>= 1); older ones are deleted after a new one is committed"),
    PX_KEY(checkpoint, resume, "\"\": start fresh; \"auto\": resume from the newest valid checkpoint in checkpoint.dir (fresh if none); else a checkpoint file to resume from"),
    PX_KEY(validate, replica_check_every, "each step the data-parallel replicas hash their reduced gradient, weights and metrics, and every N steps (and before each checkpoint) compare them; under ZeRO each rank also keeps a second copy of the next rank's shard to compare with its owner's; a mismatch re-runs the steps since the last check to tell a transient fault from a persistent one; needs layout.dp >= 2; 0: off"),
    PX_KEY(fault, kind, "\"\": none; \"kill\": the rank dies; \"stall\": it stops for fault.stall_s; \"flip_grad\" / \"flip_weight\": one bit of its reduced gradient / its weights flips"),
    PX_KEY(fault, rank, "the world rank the fault strikes"),
    PX_KEY(fault, step, "the step (1-based) the fault strikes in: before it (kill, stall), before its update (flip_grad) or after it (flip_weight)"),
    PX_KEY(fault, tensor, "flip_*: the parameter whose element flips (GPT-2 name, e.g. \"h.0.attn.c_attn.weight\")"),
    PX_KEY(fault, element, "flip_*: index of the element in the rank's piece of fault.tensor (its tensor-parallel shard)"),
    PX_KEY(fault, bit, "flip_*: the bit that flips, 0 (lowest mantissa bit) .. 31 (sign)"),
    PX_KEY(fault, stall_s, "stall: seconds the rank stops for; 0: until the other ranks give up on it (layout.timeout_s)"),
    PX_KEY(fault, persistent, "flip_*: strike again whenever the step is re-run (a faulty unit); false: once (a transient upset)"),
    PX_KEY(spikes, action, "\"off\"; \"log\": record spikes; \"skip\": and skip their update; \"clip\": clip every gradient to an adaptive norm (ZClip); \"rollback\": go back to a snapshot and skip the batch"),
    PX_KEY(spikes, window, "trailing steps whose median and MAD of the loss and grad norm a step is judged against (>= 20, and >= min_history)"),
    PX_KEY(spikes, min_history, "steps in the window before anything is judged (20 .. window: fewer make chance spikes)"),
    PX_KEY(spikes, z_threshold, "robust z-score, (x - median) / (1.4826 MAD), above which the loss or the grad norm is a spike (> 0)"),
    PX_KEY(spikes, clip_z, "clip: the gradient is clipped to the norm median + clip_z * 1.4826 MAD of the window (> 0)"),
    PX_KEY(spikes, snapshot_every, "in-memory snapshot of every rank's state every N steps: where a rollback and a replay start (>= 1)"),
    PX_KEY(spikes, rollback_to, "rollback: \"memory\" (the newest snapshot before the spike) or \"checkpoint\" (the newest checkpoint before it; needs checkpoint.dir)"),
    PX_KEY(spikes, skip, "rollback: the batches not drawn again: \"spike\" (the spike step's) or \"since_snapshot\" (every batch after the state rolled back to, as PaLM did)"),
    PX_KEY(spikes, replay, "attribute a spike by re-running its step from the snapshot (same bits: data or state, else a named rank) and with a neighbour's batch (data or state)"),
    PX_KEY(fp8_monitor, every, "statistics of every fp8-scaled tensor (amax, scale and its change, saturated and underflowed fractions, dynamic range, MSE, SQNR) every N steps, to the run file's /fp8 and the job view; 0: off"),
    PX_KEY(fp8_monitor, compare, "other recipes measured on the same tensors: \"\", \"current\" (per-tensor current scaling from the step's amax), \"block\" (1 x fp8_block_size tiles, fp8_block_size^2 weight blocks) or \"current,block\"; the run's own recipe is always measured"),
    PX_KEY(fp8_monitor, scale_jump, "alert when a tensor's scale changed by more than this factor from the step before (> 1; 0: off)"),
    PX_KEY(fp8_monitor, saturation_max, "alert when a tensor's fraction of saturated values is above this (0 .. 1)"),
    PX_KEY(fp8_monitor, sqnr_min_db, "alert when a tensor's quantisation SQNR is below this many dB"),
};

#undef PX_KEY

std::string full_name(const KeyDef& d) { return std::string(d.section) + "." + d.name; }

const KeyDef* find_key(std::string_view section, std::string_view name) {
    for (const auto& d : kKeys)
        if (section == d.section && name == d.name) return &d;
    return nullptr;
}

bool is_section(std::string_view s) {
    return std::any_of(kSections.begin(), kSections.end(), [&](const SectionDef& d) { return s == d.name; });
}

bool is_string_like(const FieldRef& f) {
    return std::holds_alternative<std::string*>(f) || std::holds_alternative<Mode*>(f);
}

// ---- formatting values ----

std::string format_double(double x) {
    if (std::isnan(x)) return std::signbit(x) ? "-nan" : "nan";
    if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, x);  // shortest text that reads back exactly
    std::string s(buf, r.ptr);
    const auto e = s.find('e');
    if (e == std::string::npos) {
        if (s.find('.') == std::string::npos) s += ".0";  // TOML floats need a point or an exponent
    } else {
        // "3e-04" -> "3e-4": TOML allows either; the short one reads better.
        std::size_t z = e + 1 + (s[e + 1] == '-' || s[e + 1] == '+');
        while (z + 1 < s.size() && s[z] == '0') s.erase(z, 1);
    }
    return s;
}

// The TOML text of a field's value.
std::string format_field(const FieldRef& f, const std::string& key) {
    return std::visit(
        [&](auto* p) -> std::string {
            using T = std::remove_pointer_t<decltype(p)>;
            if constexpr (std::is_same_v<T, double>) {
                return format_double(*p);
            } else if constexpr (std::is_same_v<T, std::uint64_t>) {
                if (*p > static_cast<std::uint64_t>(INT64_MAX))
                    throw ConfigError(key + " = " + std::to_string(*p) +
                                      " cannot be written as TOML (integers are signed 64-bit): "
                                      "use a value below 2^63");
                return std::to_string(*p);
            } else if constexpr (std::is_same_v<T, std::string>) {
                return quote(*p);
            } else if constexpr (std::is_same_v<T, bool>) {
                return *p ? "true" : "false";
            } else if constexpr (std::is_same_v<T, Mode>) {
                return quote(mode_name(*p));
            } else {
                return std::to_string(*p);
            }
        },
        f);
}

// "string \"two\"", "integer 3", ... for type errors.
std::string describe(const toml::node& n) {
    switch (n.type()) {
    case toml::node_type::string: return "string " + quote(n.as_string()->get());
    case toml::node_type::integer: return "integer " + std::to_string(n.as_integer()->get());
    case toml::node_type::floating_point: return "float " + format_double(n.as_floating_point()->get());
    case toml::node_type::boolean: return std::string("boolean ") + (n.as_boolean()->get() ? "true" : "false");
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
    }
}

// ---- setting a field from a TOML value ----

Problem type_problem(const std::string& key, const char* want, const toml::node& n) {
    return {{key}, key + " must be " + want + ", got " + describe(n)};
}

i64 need_integer(const std::string& key, const toml::node& n) {
    if (const auto* v = n.as_integer()) return v->get();
    throw type_problem(key, "an integer", n);
}

void set_field(const KeyDef& d, Config& cfg, const toml::node& n) {
    const std::string key = full_name(d);
    const FieldRef f = d.field(cfg);
    if (auto* p = std::get_if<i64*>(&f)) {
        **p = need_integer(key, n);
    } else if (auto* p = std::get_if<int*>(&f)) {
        const i64 v = need_integer(key, n);
        if (v < INT_MIN || v > INT_MAX)
            throw Problem{{key}, key + " = " + std::to_string(v) + " is out of range: must fit in 32 bits"};
        **p = static_cast<int>(v);
    } else if (auto* p = std::get_if<std::uint64_t*>(&f)) {
        const i64 v = need_integer(key, n);
        if (v < 0) throw Problem{{key}, key + " = " + std::to_string(v) + " is out of range: must be >= 0"};
        **p = static_cast<std::uint64_t>(v);
    } else if (auto* p = std::get_if<double*>(&f)) {
        if (const auto* i = n.as_integer()) **p = static_cast<double>(i->get());
        else if (const auto* x = n.as_floating_point()) **p = x->get();
        else throw type_problem(key, "a number", n);
    } else if (auto* p = std::get_if<std::string*>(&f)) {
        const auto* s = n.as_string();
        if (!s) throw type_problem(key, "a string", n);
        **p = s->get();
    } else if (auto* p = std::get_if<bool*>(&f)) {
        const auto* b = n.as_boolean();
        if (!b) throw type_problem(key, "true or false", n);
        **p = b->get();
    } else if (auto* p = std::get_if<Mode*>(&f)) {
        const auto* s = n.as_string();
        if (!s) throw type_problem(key, "a string", n);
        if (s->get() == "bitwise") **p = Mode::bitwise;
        else if (s->get() == "fast") **p = Mode::fast;
        else throw Problem{{key}, key + " must be \"bitwise\" or \"fast\", got " + quote(s->get())};
    }
}

// ---- suggestions ----

// Edit distance with adjacent transpositions (optimal string alignment): "trian" -> "train" is 1.
std::size_t edit_distance(std::string_view a, std::string_view b) {
    std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
    for (std::size_t i = 0; i <= a.size(); i++) d[i][0] = i;
    for (std::size_t j = 0; j <= b.size(); j++) d[0][j] = j;
    for (std::size_t i = 1; i <= a.size(); i++) {
        for (std::size_t j = 1; j <= b.size(); j++) {
            const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
            d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
                d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
    }
    return d[a.size()][b.size()];
}

// The candidate nearest to `word`, if within `limit` edits (default: a plausible typo of word).
std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& candidates,
                                   std::size_t limit = 0) {
    std::optional<std::string> best;
    std::size_t best_d = SIZE_MAX;
    for (const auto& c : candidates) {
        const std::size_t dist = edit_distance(word, c);
        if (dist < best_d) best_d = dist, best = c;
    }
    if (limit == 0) limit = std::max<std::size_t>(2, word.size() / 3);
    if (best && best_d <= limit) return best;
    return std::nullopt;
}

std::vector<std::string> section_names() {
    std::vector<std::string> v;
    for (const auto& s : kSections) v.push_back(s.name);
    return v;
}

std::vector<std::string> keys_of(std::string_view section) {
    std::vector<std::string> v;
    for (const auto& d : kKeys)
        if (section == d.section) v.push_back(d.name);
    return v;
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (std::size_t i = 0; i < v.size(); i++) s += (i ? ", " : "") + v[i];
    return s;
}

// "unknown key 'model.hiden' (did you mean 'model.hidden'?)"
std::string unknown_key_text(std::string_view section, std::string_view name) {
    const std::string key = std::string(section) + "." + std::string(name);
    std::string text = "unknown key '" + key + "'";
    for (const auto& d : kKeys)  // the right name in the wrong section
        if (name == d.name) return text + " (did you mean '" + full_name(d) + "'?)";
    if (const auto s = nearest(name, keys_of(section)))
        return text + " (did you mean '" + std::string(section) + "." + *s + "'?)";
    std::vector<std::string> all;
    for (const auto& d : kKeys) all.push_back(full_name(d));
    if (const auto s = nearest(key, all, std::max<std::size_t>(2, name.size() / 3)))
        return text + " (did you mean '" + *s + "'?)";
    return text + " (keys in [" + std::string(section) + "]: " + join(keys_of(section)) + ")";
}

std::string unknown_section_text(std::string_view section) {
    std::string text = "unknown section [" + std::string(section) + "]";
    if (const auto s = nearest(section, section_names())) return text + " (did you mean [" + *s + "]?)";
    return text + " (sections: " + join(section_names()) + ")";
}

// "unknown key 'vocab' at the top level": keys belong in sections.
std::string top_level_key_text(std::string_view name) {
    std::string text = "unknown key '" + std::string(name) + "' at the top level: keys belong in a section";
    for (const auto& d : kKeys)
        if (name == d.name) return text + " (did you mean '" + full_name(d) + "' under [" + d.section + "]?)";
    return text + " (sections: " + join(section_names()) + ")";
}

// ---- validation ----

constexpr i64 kMaxMarkovStates = i64{1} << 22;

// Sizes no machine holds. Counters and ids have fixed widths; and no product of sizes may reach
// 2^50 elements (4 PiB of fp32), so that every size computed from them fits in 64 bits with room
// to spare. (Whether a job fits this machine is judged later, from a memory estimate.)
void check_limits(const Config& c) {
    const ModelConfig& m = c.model;
    const TrainConfig& t = c.train;
    constexpr i64 k32 = i64{1} << 32;
    at_most("model.vocab", m.vocab, i64{1} << 31, "tokens are 32-bit integers");
    const char* sampler = "the data sampler's counters are 32 bits";
    at_most("model.seq_len", m.seq_len, k32 - 2, sampler);
    at_most("model.layers", m.layers, (INT_MAX - 4) / 12, "tensor ids are 32-bit integers");
    at_most("train.steps", t.steps, k32, sampler);
    at_most("train.batch_size", t.batch_size, k32, sampler);
    at_most("train.val_batches", t.val_batches, k32, sampler);
    at_most("train.threads", t.threads, 1024, "OpenMP threads per rank; 0 uses all cores");
    const LayoutConfig& l = c.layout;
    if (double(l.dp) * double(l.pp) * double(l.cp) * double(l.tp) > double(INT_MAX))
        throw Problem{{"layout.dp", "layout.pp", "layout.cp", "layout.tp"},
                      "layout.dp=" + std::to_string(l.dp) + " x layout.pp=" + std::to_string(l.pp) +
                          " x layout.cp=" + std::to_string(l.cp) +
                          " x layout.tp=" + std::to_string(l.tp) +
                          " ranks is more than 2^31 - 1 (ranks are 32-bit integers)"};
    const double kMax = std::ldexp(1.0, 50);
    struct Factor {
        const char* key;
        i64 value;
    };
    auto product = [&](const char* what, std::initializer_list<Factor> factors, double extra = 1) {
        double n = extra;
        for (const Factor& f : factors) n *= static_cast<double>(f.value);
        if (n < kMax) return;
        Problem p;
        std::string terms;
        const Factor* largest = factors.begin();
        for (const Factor& f : factors) {
            p.keys.emplace_back(f.key);
            terms += (terms.empty() ? "" : " x ") + std::string(f.key) + "=" +
                     std::to_string(f.value);
            if (f.value > largest->value) largest = &f;
        }
        p.text = terms + " gives " + number(n) + " " + what +
                 ", more than 2^50 (no machine holds that many); lower " + largest->key;
        throw p;
    };
    const Factor L{"model.layers", m.layers}, C{"model.hidden", m.hidden}, F{"model.ffn", m.ffn},
        V{"model.vocab", m.vocab}, T{"model.seq_len", m.seq_len}, NH{"model.heads", m.heads},
        B{"train.batch_size", t.batch_size}, VB{"train.val_batches", t.val_batches};
    product("parameters in attention weights", {L, C, C}, 4);
    product("parameters in MLP weights", {L, C, F}, 2);
    product("embedding parameters", {V, C});
    product("position embedding parameters", {T, C});
    product("validation tokens", {VB, B, T});
    product("logits per step", {B, T, V});
    product("activations per step", {L, B, T, C}, 8);
    product("activations per step", {L, B, T, F}, 2);
    product("attention scores per step", {L, B, NH, T, T});
}

// Throws the first problem: single keys in table order, then constraints across keys.
void check(const Config& c) {
    const ModelConfig& m = c.model;
    const LayoutConfig& l = c.layout;
    const TrainConfig& t = c.train;
    const DataConfig& d = c.data;
    const NumericsConfig& n = c.numerics;

    at_least("model.vocab", m.vocab, 2);
    at_least("model.seq_len", m.seq_len, 1);
    at_least("model.layers", m.layers, 1);
    at_least("model.heads", m.heads, 1);
    at_least("model.hidden", m.hidden, 1);
    at_least("model.ffn", m.ffn, 1);
    positive("model.init_std", m.init_std);
    check_moe_keys(m);

    at_least("layout.dp", l.dp, 1);
    at_least("layout.pp", l.pp, 1);
    at_least("layout.tp", l.tp, 1);
    at_least("layout.cp", l.cp, 1);
    at_least("layout.ep", l.ep, 1);
    one_of("layout.cp_method", l.cp_method, {"ring", "ulysses"});
    if (l.zero < 0 || l.zero > 3) throw out_of_range("layout.zero", std::to_string(l.zero), "in 0..3");
    at_least("layout.microbatches", l.microbatches, 0);
    one_of("layout.schedule", l.schedule, {"gpipe", "1f1b", "interleaved"});
    at_least("layout.virtual_stages", l.virtual_stages, 1);
    one_of("layout.recompute", l.recompute, {"none", "full"});
    one_of("layout.comm", l.comm, {"auto", "canonical", "ring"});
    positive("layout.timeout_s", l.timeout_s);

    at_least("train.steps", t.steps, 1);
    at_least("train.batch_size", t.batch_size, 1);
    at_least("train.microbatches", t.microbatches, 1);
    positive("train.lr", t.lr);
    non_negative("train.min_lr", t.min_lr);
    at_least("train.warmup_steps", t.warmup_steps, 0);
    non_negative("train.weight_decay", t.weight_decay);
    finite("train.beta1", t.beta1);
    if (!(t.beta1 >= 0 && t.beta1 < 1)) throw out_of_range("train.beta1", number(t.beta1), "in [0, 1)");
    finite("train.beta2", t.beta2);
    if (!(t.beta2 >= 0 && t.beta2 < 1)) throw out_of_range("train.beta2", number(t.beta2), "in [0, 1)");
    positive("train.eps", t.eps);
    non_negative("train.grad_clip", t.grad_clip);
    below_2_63("train.seed", t.seed);
    at_least("train.eval_every", t.eval_every, 0);
    at_least("train.val_batches", t.val_batches, 1);
    at_least("train.threads", t.threads, 0);
    non_negative("train.max_memory_gib", t.max_memory_gib);
    at_least("train.lr_jump_step", t.lr_jump_step, 0);
    positive("train.lr_jump_factor", t.lr_jump_factor);
    at_least("train.lr_jump_steps", t.lr_jump_steps, 1);

    one_of("data.source", d.source, {"markov", "mixture", "copy", "bin"});
    at_least("data.markov_order", d.markov_order, 1);
    positive("data.markov_alpha", d.markov_alpha);
    below_2_63("data.markov_seed", d.markov_seed);
    at_least("data.markov_vocab", d.markov_vocab, 0);
    at_least("data.mixture_chains", d.mixture_chains, 2);
    at_least("data.copy_distance", d.copy_distance, 0);

    at_least("numerics.block", n.block, 1);
    check_precision_keys(c.precision);

    at_least("checkpoint.every", c.checkpoint.every, 0);
    at_least("checkpoint.keep", c.checkpoint.keep, 1);
    one_of("numerics.isa", n.isa, {"auto", "avx512", "avx2", "scalar"});
    at_least("validate.replica_check_every", c.validate.replica_check_every, 0);
    one_of("fault.kind", c.fault.kind, {"", "kill", "stall", "flip_grad", "flip_weight"});
    at_least("fault.rank", c.fault.rank, 0);
    at_least("fault.step", c.fault.step, 1);
    at_least("fault.element", c.fault.element, 0);
    if (c.fault.bit < 0 || c.fault.bit > 31)
        throw out_of_range("fault.bit", std::to_string(c.fault.bit), "in 0..31");
    non_negative("fault.stall_s", c.fault.stall_s);
    at_least("data.corrupt_step", d.corrupt_step, 0);
    one_of("data.corrupt_kind", d.corrupt_kind, {"repeat", "shuffle"});
    check_spikes_keys(c.spikes);
    check_fp8_monitor_keys(c.fp8_monitor);

    check_limits(c);

    if (m.hidden % m.heads != 0)
        throw Problem{{"model.heads", "model.hidden"},
                      "model.heads=" + std::to_string(m.heads) + " does not divide model.hidden=" +
                          std::to_string(m.hidden) + ": choose heads that divide hidden (head size = hidden / heads)"};
    if (t.batch_size % t.microbatches != 0)
        throw Problem{{"train.microbatches", "train.batch_size"},
                      "train.microbatches=" + std::to_string(t.microbatches) + " does not divide train.batch_size=" +
                          std::to_string(t.batch_size) + ": every microbatch must hold the same number of sequences"};
    if (l.virtual_stages > 1 && l.schedule != "interleaved")
        throw Problem{{"layout.virtual_stages", "layout.schedule"},
                      "layout.virtual_stages=" + std::to_string(l.virtual_stages) + " needs layout.schedule = " +
                          "\"interleaved\", got " + quote(l.schedule) +
                          ": only the interleaved schedule gives a pipeline rank several model chunks"};
    if (l.schedule == "interleaved" && l.virtual_stages < 2)
        throw Problem{{"layout.schedule", "layout.virtual_stages"},
                      "layout.schedule = \"interleaved\" needs layout.virtual_stages >= 2, got " +
                          std::to_string(l.virtual_stages) +
                          ": with one model chunk per rank use layout.schedule = \"1f1b\""};
    if (l.comm == "ring" && n.mode == Mode::bitwise)
        throw Problem{{"layout.comm", "numerics.mode"},
                      "layout.comm = \"ring\" breaks numerics.mode = \"bitwise\": a ring all-reduce sums in ring "
                      "order, not the canonical tree; use layout.comm = \"auto\" or \"canonical\", or "
                      "numerics.mode = \"fast\""};
    check_precision_across(c.precision, n);
    check_moe_across(c);
    check_fp8_layers(c.precision, m.layers);
    check_fp8_monitor_across(c.fp8_monitor, c.precision);
    if (c.checkpoint.resume == "auto" && c.checkpoint.dir.empty())
        throw Problem{{"checkpoint.resume", "checkpoint.dir"},
                      "checkpoint.resume = \"auto\" needs checkpoint.dir: set it to the folder the "
                      "checkpoints are in, or give checkpoint.resume a checkpoint file"};
    if (c.checkpoint.every > 0 && c.checkpoint.dir.empty())
        throw Problem{{"checkpoint.every", "checkpoint.dir"},
                      "checkpoint.every=" + std::to_string(c.checkpoint.every) +
                          " needs checkpoint.dir: set it to a folder for the checkpoints, or "
                          "checkpoint.every = 0"};
    if (c.validate.replica_check_every > 0 && l.dp < 2)
        throw Problem{{"validate.replica_check_every", "layout.dp"},
                      "validate.replica_check_every=" + std::to_string(c.validate.replica_check_every) +
                          " compares data-parallel replicas, but layout.dp = " + std::to_string(l.dp) +
                          ": use layout.dp >= 2, or validate.replica_check_every = 0"};
    if (!c.fault.kind.empty() && c.fault.step > t.steps)
        throw Problem{{"fault.step", "train.steps"},
                      "fault.step=" + std::to_string(c.fault.step) + " comes after the last step (train.steps=" +
                          std::to_string(t.steps) + "), so the fault would never strike: choose a step in 1.." +
                          std::to_string(t.steps)};
    if (d.corrupt_step > t.steps)
        throw Problem{{"data.corrupt_step", "train.steps"},
                      "data.corrupt_step=" + std::to_string(d.corrupt_step) + " comes after the last step (train.steps=" +
                          std::to_string(t.steps) + "), so no batch would be corrupted: choose a step in 1.." +
                          std::to_string(t.steps) + ", or 0 for none"};
    if (c.spikes.action == "rollback" && c.spikes.rollback_to == "checkpoint" && c.checkpoint.dir.empty())
        throw Problem{{"spikes.rollback_to", "checkpoint.dir"},
                      "spikes.rollback_to = \"checkpoint\" needs checkpoint.dir (and checkpoint.every) "
                      "so that there is a checkpoint to go back to: set them, or spikes.rollback_to = \"memory\""};
    if (c.spikes.action != "off" && (c.spikes.action != "log" || c.spikes.replay) &&
        c.validate.replica_check_every > 0)
        throw Problem{{"spikes.action", "validate.replica_check_every"},
                      "spikes.action = " + quote(c.spikes.action) + (c.spikes.replay ? " with spikes.replay" : "") +
                          " changes or re-runs steps, and so does the replica check "
                          "(validate.replica_check_every=" + std::to_string(c.validate.replica_check_every) +
                          "): run one of them at a time (spikes.action = \"log\" with spikes.replay = false "
                          "works beside it)"};
    if (t.lr_jump_step > t.steps)
        throw Problem{{"train.lr_jump_step", "train.steps"},
                      "train.lr_jump_step=" + std::to_string(t.lr_jump_step) +
                          " comes after the last step (train.steps=" + std::to_string(t.steps) +
                          "), so the learning rate would never jump: choose a step in 1.." +
                          std::to_string(t.steps) + ", or 0 for none"};
    if (t.min_lr > t.lr)
        throw Problem{{"train.min_lr", "train.lr"},
                      "train.min_lr=" + number(t.min_lr) + " is larger than train.lr=" + number(t.lr) +
                          ": the cosine decay must end at or below the peak learning rate"};
    if (d.source == "bin" && d.train_path.empty())
        throw Problem{{"data.train_path", "data.source"},
                      "data.source = \"bin\" needs data.train_path: set it to an llm.c .bin token file, "
                      "or use data.source = \"markov\""};
    if (d.source == "copy" && (d.markov_vocab > m.vocab || d.markov_vocab == 1))
        throw Problem{{"data.markov_vocab", "model.vocab"},
                      "data.markov_vocab=" + std::to_string(d.markov_vocab) +
                          ": the copy source draws from 2..model.vocab=" + std::to_string(m.vocab) +
                          " symbols (0 means model.vocab)"};
    if (d.source == "markov" || d.source == "mixture") {
        if (d.markov_vocab > m.vocab)
            throw Problem{{"data.markov_vocab", "model.vocab"},
                          "data.markov_vocab=" + std::to_string(d.markov_vocab) + " exceeds model.vocab=" +
                              std::to_string(m.vocab) + ": the model must be able to emit every symbol"};
        if (d.markov_vocab == 1)
            throw Problem{{"data.markov_vocab"},
                          "data.markov_vocab=1: a Markov chain needs at least 2 symbols (0 means "
                          "model.vocab)"};
        i64 V = d.markov_vocab > 0 ? d.markov_vocab : m.vocab;
        if (d.source == "mixture") {
            if (d.mixture_chains > V / 2)
                throw Problem{{"data.mixture_chains",
                               d.markov_vocab > 0 ? "data.markov_vocab" : "model.vocab"},
                              "data.mixture_chains=" + std::to_string(d.mixture_chains) + " with " +
                                  std::to_string(V) + " symbols (" +
                                  (d.markov_vocab > 0 ? "data.markov_vocab" : "model.vocab") +
                                  ") leaves a chain fewer than 2 symbols of its own: use at most " +
                                  std::to_string(V / 2) + " chains, or more symbols"};
            V /= d.mixture_chains;  // each chain's own symbols
        }
        i64 states = 1;  // V^k, counted only until it passes the limit (V = 1 stays 1: no loop)
        for (i64 k = 0; V >= 2 && k < d.markov_order && states <= kMaxMarkovStates; k++)
            states *= V;
        if (states > kMaxMarkovStates)
            throw Problem{{"data.markov_order", "data.markov_vocab"},
                          "data.markov_order=" + std::to_string(d.markov_order) + " with " +
                              std::to_string(V) + " symbols needs " + std::to_string(V) + "^" +
                              std::to_string(d.markov_order) + " Markov states, " +
                              "more than the limit of 2^22 = " + std::to_string(kMaxMarkovStates) +
                              ": lower data.markov_order, or set data.markov_vocab below model.vocab"};
    }
}

// ---- parsing ----

std::string location(const toml::source_region& r) {
    if (r.begin.line == 0) return "";
    return " (line " + std::to_string(r.begin.line) + ")";
}

struct Located {
    std::size_t line;
    std::string text;
};

// Reads every known key from a parsed document into cfg. Returns the problems found (unknown
// keys, wrong types), and records the line of every key that was set.
std::vector<Located> read_document(const toml::table& root, Config& cfg, std::map<std::string, std::size_t>& lines) {
    std::vector<Located> problems;
    auto add = [&](const toml::source_region& r, const std::string& text) {
        problems.push_back({r.begin.line, text + location(r)});
    };
    for (const auto& [skey, snode] : root) {
        const std::string_view section = skey.str();
        if (!snode.is_table()) {
            if (is_section(section))
                add(snode.source(), std::string(section) + " must be a table ([" + std::string(section) + "]), got " +
                                        describe(snode));
            else
                add(snode.source(), top_level_key_text(section));
            continue;
        }
        if (!is_section(section)) {
            add(snode.source(), unknown_section_text(section));
            continue;
        }
        for (const auto& [kkey, knode] : *snode.as_table()) {
            const KeyDef* d = find_key(section, kkey.str());
            if (d == nullptr) {
                add(knode.source(), unknown_key_text(section, kkey.str()));
                continue;
            }
            try {
                set_field(*d, cfg, knode);
                lines[full_name(*d)] = knode.source().begin.line;
            } catch (const Problem& p) {
                add(knode.source(), p.text);
            }
        }
    }
    return problems;
}

// Validates cfg; a problem is reported as "<prefix>: <text>", with the line of its first key if
// `lines` knows it.
void validate_or_throw(const Config& cfg, const std::string& prefix, const std::map<std::string, std::size_t>* lines) {
    try {
        check(cfg);
    } catch (const Problem& p) {
        std::string where;
        if (lines)
            for (const auto& k : p.keys)
                if (const auto it = lines->find(k); it != lines->end() && it->second > 0) {
                    where = " (line " + std::to_string(it->second) + ")";
                    break;
                }
        throw ConfigError(prefix + ": " + p.text + where);
    }
}

std::string trim(std::string_view s) {
    const auto b = s.find_first_not_of(" \t\r\n");
    if (b == std::string_view::npos) return "";
    const auto e = s.find_last_not_of(" \t\r\n");
    return std::string(s.substr(b, e - b + 1));
}

// Applies one "section.key=value" to cfg (no validation); returns the key's full name.
std::string assign(Config& cfg, const std::string& assignment) {
    const std::string where = "--set " + assignment;
    const auto eq = assignment.find('=');
    if (eq == std::string::npos)
        throw ConfigError(where + ": expected section.key=value (for example --set train.lr=1e-3)");
    const std::string lhs = trim(std::string_view(assignment).substr(0, eq));
    const std::string value = trim(std::string_view(assignment).substr(eq + 1));
    const auto dot = lhs.find('.');
    if (dot == std::string::npos) throw ConfigError(where + ": " + top_level_key_text(lhs));
    const std::string section = lhs.substr(0, dot), name = lhs.substr(dot + 1);
    if (!is_section(section)) throw ConfigError(where + ": " + unknown_section_text(section));
    const KeyDef* d = find_key(section, name);
    if (d == nullptr) throw ConfigError(where + ": " + unknown_key_text(section, name));

    // The value as TOML, or as a string when it is not TOML (bin, runs/x) or the key wants a string.
    std::optional<toml::table> doc;
    try {
        const std::string text = "v = " + value + "\n";
        doc = toml::parse(std::string_view(text), std::string_view("--set"));
    } catch (const toml::parse_error&) {
        doc.reset();
    }
    const toml::node* node = nullptr;
    if (doc && doc->size() == 1) node = doc->get("v");
    const bool as_text = node == nullptr || (is_string_like(d->field(cfg)) && !node->is_string());
    toml::value<std::string> text_node(value);
    try {
        set_field(*d, cfg, as_text ? static_cast<const toml::node&>(text_node) : *node);
    } catch (const Problem& p) {
        throw ConfigError(where + ": " + p.text);
    }
    return full_name(*d);
}

std::string to_toml(const Config& cfg_in, bool comments) {
    Config cfg = cfg_in;  // field accessors take a mutable Config
    std::string out;
    if (comments) {
        out += "# Parallax job config: the embedded default job, a tiny GPT on the built-in Markov source\n"
               "# (needs no files). Every key is optional: a missing key keeps the value shown here.\n";
    }
    for (const auto& s : kSections) {
        if (!out.empty()) out += "\n";
        if (comments) out += std::string("# ") + s.doc + "\n";
        out += std::string("[") + s.name + "]\n";
        for (const auto& d : kKeys) {
            if (std::strcmp(d.section, s.name) != 0) continue;
            if (comments) out += std::string("# ") + d.doc + "\n";
            out += std::string(d.name) + " = " + format_field(d.field(cfg), full_name(d)) + "\n";
        }
    }
    return out;
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& source_name) {
    toml::table root;
    try {
        root = toml::parse(std::string_view(toml_text), std::string_view(source_name));
    } catch (const toml::parse_error& e) {
        const auto& b = e.source().begin;
        throw ConfigError(source_name + ": TOML syntax error at line " + std::to_string(b.line) + ", column " +
                          std::to_string(b.column) + ": " + std::string(e.description()));
    }
    Config cfg;
    cfg.source_name = source_name;
    std::map<std::string, std::size_t> lines;
    auto problems = read_document(root, cfg, lines);
    if (!problems.empty()) {
        // Report the first in file order (tables iterate by name); unlocated ones last.
        const auto first = std::min_element(problems.begin(), problems.end(), [](const Located& a, const Located& b) {
            return (a.line == 0 ? SIZE_MAX : a.line) < (b.line == 0 ? SIZE_MAX : b.line);
        });
        std::string text = source_name + ": " + first->text;
        if (problems.size() > 1) text += " (and " + std::to_string(problems.size() - 1) + " more problem" +
                                         (problems.size() > 2 ? "s" : "") + ")";
        throw ConfigError(text);
    }
    validate_or_throw(cfg, source_name, &lines);
    return cfg;
}

Config load_config(const std::string& path) {
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec))
        throw ConfigError("cannot read config file '" + path + "': it is a directory; give a .toml file");
    // Reading a FIFO would wait for a writer; a device is no config.
    if (const FileKind k = file_kind(path); k != FileKind::regular && k != FileKind::missing)
        throw ConfigError("cannot read config file '" + path + "': it is " + file_kind_text(k) +
                          ", not a regular file; give a .toml file");
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        throw ConfigError("cannot read config file '" + path + "': " + std::strerror(errno) + "; check the path");
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) throw ConfigError("cannot read config file '" + path + "': read error");
    return parse_config(ss.str(), path);
}

void apply_override(Config& cfg, const std::string& assignment) { apply_overrides(cfg, {assignment}); }

void apply_overrides(Config& cfg, const std::vector<std::string>& assignments) {
    Config next = cfg;
    std::map<std::string, std::string> set_by;  // key -> the last assignment that set it
    for (const auto& a : assignments) set_by[assign(next, a)] = a;
    try {
        check(next);
    } catch (const Problem& p) {
        // Blame the --set that touched a key of the problem; if none did, the config was already bad.
        for (const auto& k : p.keys)
            if (const auto it = set_by.find(k); it != set_by.end())
                throw ConfigError("--set " + it->second + ": " + p.text);
        throw ConfigError(cfg.source_name + ": " + p.text);
    }
    cfg = std::move(next);
}

void validate_config(const Config& cfg) { validate_or_throw(cfg, cfg.source_name, nullptr); }

std::vector<std::string> config_keys() {
    std::vector<std::string> v;
    for (const auto& d : kKeys) v.push_back(full_name(d));
    return v;
}

const char* default_config_toml() {
    static const std::string text = to_toml(Config{}, true);
    return text.c_str();
}

std::string config_to_toml(const Config& cfg) { return to_toml(cfg, false); }

DType activation_dtype(const PrecisionConfig& pc) {
    try {
        return check_activations(pc.activations);
    } catch (const Problem& p) {
        throw ConfigError(p.text);
    }
}

std::vector<bool> fp8_block_mask(const PrecisionConfig& pc, i64 layers) {
    try {
        return fp8_blocks(pc, layers);
    } catch (const Problem& p) {
        throw ConfigError(p.text);
    }
}

Numerics make_numerics(const NumericsConfig& nc) {
    if (nc.block < 1)
        throw ConfigError("numerics.block = " + std::to_string(nc.block) + " is out of range: must be >= 1");
    Numerics n;
    n.mode = nc.mode;
    n.block = nc.block;
    const Isa best = detect_isa();
    if (nc.isa == "auto") {
        n.isa = best;
        return n;
    }
    std::optional<Isa> want;
    for (const Isa i : {Isa::scalar, Isa::avx2, Isa::avx512})
        if (nc.isa == isa_name(i)) want = i;
    if (!want)
        throw ConfigError("numerics.isa must be \"auto\", \"avx512\", \"avx2\" or \"scalar\", got " + quote(nc.isa));
    if (static_cast<int>(*want) > static_cast<int>(best))
        throw ConfigError("numerics.isa = " + quote(nc.isa) + " is not supported by this CPU (the best it has is " +
                          isa_name(best) + "): use numerics.isa = \"auto\" or \"" + isa_name(best) + "\"");
    n.isa = *want;
    return n;
}

}  // namespace px
