// Arenas: one allocation each for parameters, gradients, optimizer state and activations,
// carved into named tensors by tables generated from one constexpr list.
//
// Index
//   Dim, ParamSpec, kParams         the parameter list of every architecture (the only place it is
//                                   written): each spec's GPT-2 and Llama name, shape and init
//   LayerParam, kLayerOrder         indices into that list, checked against it by static_assert,
//                                   and each architecture's per-layer storage order
//   param_name, arch_holds          a spec's name in a config's architecture, and whether it has it
//   LayerSpan, ModelPart            which layers, and whether the embedding and the LM head, a
//                                   model holds (the whole model, or one pipeline stage)
//   ParamTable                      the list expanded for a config and a part: names, shapes,
//                                   offsets, and the tensor ids of the whole model
//   Arena                           a 64-byte aligned allocation of bytes carved by a table, on a
//                                   device; view() makes its typed tensors, f32() reads fp32 ones
//   ActSpec, kActs, ActTable        the same for the activations of one microbatch on a run of
//                                   layers, each with its dtype and architectures, sized in bytes
#pragma once
#include "core/base/config.h"
#include "core/base/tensor.h"

#include <array>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace px {

// The symbolic size of one tensor dimension, resolved against a ModelConfig (and, for
// activations, a microbatch). L is the layers of the run an activation table covers; LS the
// layers whose block internals it keeps: L, or 1 when blocks are recomputed in backward.
// CA is the channels of the attention heads a model holds: C, or C/tp in a tensor-parallel shard
// (where C3, F, NH and V are the shard's too; see TpDims).
// Mixture of experts (model.moe_*): E experts of FE channels each (EFE = E·FE rows of the
// experts' stacked c_fc, EC = E·C of their stacked c_proj), FS the shared experts' channels
// (moe_shared_experts·FE; a MoE layer's mlp.* tensors are the shared MLP, absent without one),
// K the experts a token goes to, KFE and KC a token's K routed slots of FE or C values, and FM
// the widest plain MLP of any layer (F of the dense layers, FS of the MoE ones) that the MLP
// activations hold. Without MoE, E..KC are 0 and FM is F. Under expert parallelism a rank holds
// EL of the E experts (TpDims::experts): the stacked expert tensors are EL experts long (EFE, EC
// and the biases' EL rows), while the router still scores all E; an expert's rows arrive from
// every rank of the ep group, so RFE and RC (a token's routed slots of FE or C values, times the
// ep ranks that may send them: ActShape::expert_sources) size the expert side's buffers.
// Llama (model.arch = "llama"): CA is the query heads' channels NH·HS (HS = model.head_size(), which
// may differ from C/NH) and C3 three times that; KV the KV heads' channels KVH·HS (split over tp
// where tp divides the KV heads, else whole on every rank: kv_split), KVH the KV heads,
// HS one head's channels.
enum class Dim : std::uint8_t {
    one, V, T, C, C3, F, L, LS, B, NH, CA, E, FE, EFE, EC, FS, K, KFE, KC, FM, EL, RFE, RC,
    KV, KVH, HS
};

// Which architectures a parameter or activation exists in.
enum class Archs : std::uint8_t { all, gpt2, llama };

struct ParamSpec {
    const char* name;   // GPT-2 name; per-layer names get the prefix "h.{i}." (null: not GPT-2's)
    const char* llama;  // Hugging Face LlamaForCausalLM name; per-layer ones get "model.layers.{i}."
    bool per_layer;
    Dim rows, cols;    // (rows, cols); vectors use rows = Dim::one
    bool decay;        // AdamW weight decay applies (matrices yes; biases and norms no)
    enum Init : std::uint8_t { normal, residual_normal, zeros, ones } init;
};

// One list for every architecture: a spec is a role (the attention's output projection is
// ATTPROJW in both), named in each architecture that has it. GPT-2's order is its storage order
// (llm.c's per-layer order); Llama's per-layer order is kLayerOrder's. The tensor ids that key
// the RNG count the tensors a model holds in its storage order.
inline constexpr ParamSpec kParams[] = {
    {"wte", "model.embed_tokens.weight", false, Dim::V, Dim::C, true, ParamSpec::normal},
    {"wpe", nullptr, false, Dim::T, Dim::C, true, ParamSpec::normal},
    {"ln_1.weight", "input_layernorm.weight", true, Dim::one, Dim::C, false, ParamSpec::ones},
    {"ln_1.bias", nullptr, true, Dim::one, Dim::C, false, ParamSpec::zeros},
    {"attn.c_attn.weight", nullptr, true, Dim::C3, Dim::C, true, ParamSpec::normal},
    {"attn.c_attn.bias", nullptr, true, Dim::one, Dim::C3, false, ParamSpec::zeros},
    {"attn.c_proj.weight", "self_attn.o_proj.weight", true, Dim::C, Dim::CA, true,
     ParamSpec::residual_normal},
    {"attn.c_proj.bias", nullptr, true, Dim::one, Dim::C, false, ParamSpec::zeros},
    {"ln_2.weight", "post_attention_layernorm.weight", true, Dim::one, Dim::C, false,
     ParamSpec::ones},
    {"ln_2.bias", nullptr, true, Dim::one, Dim::C, false, ParamSpec::zeros},
    {"mlp.c_fc.weight", "mlp.gate_proj.weight", true, Dim::F, Dim::C, true, ParamSpec::normal},
    {"mlp.c_fc.bias", nullptr, true, Dim::one, Dim::F, false, ParamSpec::zeros},
    {"mlp.c_proj.weight", "mlp.down_proj.weight", true, Dim::C, Dim::F, true,
     ParamSpec::residual_normal},
    {"mlp.c_proj.bias", nullptr, true, Dim::one, Dim::C, false, ParamSpec::zeros},
    // MoE layers only (core/model/moe.h): the router, and the experts' MLPs stacked by expert
    // (expert e's c_fc rows [e·FE, (e+1)·FE), its c_proj rows [e·C, (e+1)·C)).
    {"moe.router.weight", "mlp.gate.weight", true, Dim::E, Dim::C, true, ParamSpec::normal},
    {"moe.experts.c_fc.weight", "mlp.experts.gate_proj.weight", true, Dim::EFE, Dim::C, true,
     ParamSpec::normal},
    {"moe.experts.c_fc.bias", nullptr, true, Dim::EL, Dim::FE, false, ParamSpec::zeros},
    {"moe.experts.c_proj.weight", "mlp.experts.down_proj.weight", true, Dim::EC, Dim::FE, true,
     ParamSpec::residual_normal},
    {"moe.experts.c_proj.bias", nullptr, true, Dim::EL, Dim::C, false, ParamSpec::zeros},
    // Llama's own: q, k and v apart (grouped-query attention: k and v have KV heads), Qwen3's
    // per-head norms of q and k, SwiGLU's up projection (gate is mlp.c_fc's role, down c_proj's),
    // and the experts' stacked up projections.
    {nullptr, "self_attn.q_proj.weight", true, Dim::CA, Dim::C, true, ParamSpec::normal},
    {nullptr, "self_attn.k_proj.weight", true, Dim::KV, Dim::C, true, ParamSpec::normal},
    {nullptr, "self_attn.v_proj.weight", true, Dim::KV, Dim::C, true, ParamSpec::normal},
    {nullptr, "self_attn.q_norm.weight", true, Dim::one, Dim::HS, false, ParamSpec::ones},
    {nullptr, "self_attn.k_norm.weight", true, Dim::one, Dim::HS, false, ParamSpec::ones},
    {nullptr, "mlp.up_proj.weight", true, Dim::F, Dim::C, true, ParamSpec::normal},
    {nullptr, "mlp.experts.up_proj.weight", true, Dim::EFE, Dim::C, true, ParamSpec::normal},
    {"ln_f.weight", "model.norm.weight", false, Dim::one, Dim::C, false, ParamSpec::ones},
    {"ln_f.bias", nullptr, false, Dim::one, Dim::C, false, ParamSpec::zeros},
    // Llama's untied LM head (model.tie_embeddings = false)
    {nullptr, "lm_head.weight", false, Dim::V, Dim::C, true, ParamSpec::normal},
};
inline constexpr int kNumParamSpecs = sizeof(kParams) / sizeof(kParams[0]);

// Per-layer parameters, in list order starting at kFirstLayerSpec. A dense layer holds those of
// its architecture before ROUTERW and from QW; a MoE layer holds its norms and attention, the
// plain MLP (FCW..FCPROJB, UPW) only with shared experts (sized FS), and ROUTERW..EPROJB, EUPW.
enum LayerParam : int {
    LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB,
    ROUTERW, EFCW, EFCB, EPROJW, EPROJB,
    QW, KW, VW, QNORMW, KNORMW, UPW, EUPW,
    kNumLayerParams
};
inline constexpr int kFirstLayerSpec = 2;
// The global specs after the layers'.
inline constexpr int kLnfWSpec = kFirstLayerSpec + kNumLayerParams, kLnfBSpec = kLnfWSpec + 1,
                     kLmHeadSpec = kLnfWSpec + 2;
// The per-layer storage order of each architecture (GPT-2: list order; Llama: Hugging Face's).
inline constexpr LayerParam kGpt2LayerOrder[] = {
    LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB,
    ROUTERW, EFCW, EFCB, EPROJW, EPROJB};
inline constexpr LayerParam kLlamaLayerOrder[] = {
    LN1W, QW, KW, VW, QNORMW, KNORMW, ATTPROJW, LN2W, FCW, UPW, FCPROJW, ROUTERW, EFCW, EUPW,
    EPROJW};
// The name of spec `spec` in mc's architecture (without a layer's prefix); null where the
// architecture has no such tensor.
const char* param_name(const ModelConfig& mc, int spec);
// Whether mc's architecture has spec `spec` at all (a global one: wpe and ln_f.bias are
// GPT-2's, lm_head llama's when untied).
bool arch_holds(const ModelConfig& mc, int spec);
// Whether layer l of mc holds parameter p (and, for a MoE layer's mlp.*, at width FS).
bool layer_holds(const ModelConfig& mc, i64 l, int p);
// The prefix of layer l's names: "h.{l}." (GPT-2) or "model.layers.{l}." (Llama).
std::string layer_prefix(const ModelConfig& mc, i64 l);
static_assert(kParams[kFirstLayerSpec + EPROJB].per_layer &&
                  kParams[kFirstLayerSpec + EUPW].per_layer &&
                  !kParams[kLnfWSpec].per_layer && !kParams[kFirstLayerSpec - 1].per_layer &&
                  kLmHeadSpec + 1 == kNumParamSpecs,
              "LayerParam must list the per-layer entries of kParams in order");

// A dimension's size for a config (and B sequences of T tokens; T = 0: model.seq_len). L and
// LS are model.layers here; an activation table resolves them for its run (below).
i64 resolve_dim(Dim d, const ModelConfig& mc, i64 B = 1, i64 T = 0);

// The local sizes of a tensor-parallel shard (core/parallel/tensor/tp_model.h): with tp ranks a
// model holds 3C/tp rows of qkv (C3), C/tp attention channels (CA), NH/tp heads, F/tp ffn rows and
// `vocab` rows of wte (Llama: CA = NH·HS/tp, and KV·HS/tp KV channels where tp divides the KV
// heads, all of them otherwise). The default is the whole model. Expert parallelism
// (core/parallel/expert/expert_parallel.h) holds experts [expert_lo, expert_lo + experts) of each
// MoE layer (ModelPart::experts; ParamTable::build and GPT fill these two in from the part).
struct TpDims {
    int tp = 1;
    i64 vocab = -1;      // rows of wte held; -1: model.vocab
    i64 expert_lo = 0;   // the first expert held
    i64 experts = -1;    // experts held; -1: model.moe_experts
};
// A dimension's size in such a shard (T = model.seq_len, B = 1 as above).
i64 resolve_dim(Dim d, const ModelConfig& mc, const TpDims& tp);
// Llama: whether tp ranks split the KV heads (tp divides them); else each holds all of them.
inline bool kv_split(const ModelConfig& mc, int tp) { return mc.kv_head_count() % tp == 0; }

// Layers [lo, hi) of the model.
struct LayerSpan {
    int lo = 0, hi = 0;
    int size() const { return hi - lo; }
    bool operator==(const LayerSpan&) const = default;
};

// The part of the model one GPT object holds. The whole model is one chunk of all layers with
// the embedding and the head. A pipeline stage holds one chunk per model chunk it runs (layer
// spans in increasing order), the embedding when it runs the first layers, the head when it
// runs the last ones. The embedding precedes chunk 0; the head follows the last chunk.
struct ModelPart {
    std::vector<LayerSpan> chunks;  // disjoint, increasing
    bool embedding = true;          // wte (token) and wpe (position) embeddings
    bool head = true;               // ln_f and the LM head
    bool tied = true;               // the LM head is wte (model.tied_head()), else lm_head
    // The experts of every MoE layer held, [expert_lo, expert_hi) (expert parallelism: an ep
    // rank's share); expert_hi < 0: all of them.
    int expert_lo = 0, expert_hi = -1;

    static ModelPart whole(const ModelConfig& mc);  // {[0, L)}, embedding, head
    bool holds_wte() const { return embedding || (head && tied); }
    // A gradient buffer keeps the tied head's wte gradient apart (GPT::grad_head).
    bool head_region() const { return tied && holds_wte(); }
    bool all_experts() const { return expert_hi < 0; }
    // The part's experts in TpDims terms: tp with expert_lo and experts set.
    TpDims expert_dims(TpDims tp) const;
    bool operator==(const ModelPart&) const = default;
};

struct TableEntry {
    std::string name;
    const char* short_name;  // the spec's name in the architecture, without the layer's prefix
    int spec;      // index into the spec list
    int layer;     // -1 for global tensors
    int id;        // index of this tensor in the whole model's table: keys the RNG, orders norms
    i64 rows, cols;
    i64 offset;  // in floats (parameters and gradients are fp32), 16-float aligned
    i64 numel() const { return rows * cols; }
    // A vector (a bias, a LayerNorm's weight) by its spec, never by its size: a matrix may have
    // one row (model.ffn = 1, or a tensor-parallel shard of one row) and is still (rows, cols).
    bool is_vector() const { return kParams[spec].rows == Dim::one; }
    std::vector<i64> shape() const {
        return is_vector() ? std::vector<i64>{cols} : std::vector<i64>{rows, cols};
    }
};

// The parameter list expanded for one config and one part, in the whole model's order: wte,
// wpe, h.0.*, ..., h.{L-1}.*, ln_f.* (Llama: embed_tokens, layers, norm, lm_head), keeping only
// what the part holds (wte with the embedding or the tied head). For the whole model, entry i
// has id i, and offsets are those of the single device.
struct ParamTable {
    std::vector<TableEntry> entries;
    i64 total = 0;       // floats, including alignment padding (master weights are fp32)
    i64 num_params = 0;  // true parameter count
    // entry indices; -1 where the part lacks them
    int wte = -1, wpe = -1, lnfw = -1, lnfb = -1, lm_head = -1;
    int head_last() const { return lm_head >= 0 ? lm_head : lnfb >= 0 ? lnfb : lnfw; }
    int embedding_last() const { return wpe >= 0 ? wpe : wte; }
    std::vector<int> layer_first;  // per model layer: its first entry, -1 where not held
    std::vector<int> layer_last;   // per model layer: its last entry, -1 where not held
    // per model layer and LayerParam: its entry, -1 where not held (or the layer has none)
    std::vector<std::array<int, kNumLayerParams>> layer_entry;

    static ParamTable build(const ModelConfig& mc);  // the whole model
    static ParamTable build(const ModelConfig& mc, const ModelPart& part);
    // A tensor-parallel shard of the part: local shapes, the whole model's ids and names.
    static ParamTable build(const ModelConfig& mc, const ModelPart& part, const TpDims& tp);
    static int num_tensors(const ModelConfig& mc);  // entries of the whole model's table
    bool has_layer(int layer) const { return layer_first[static_cast<size_t>(layer)] >= 0; }
    int layer_index(int layer, LayerParam p) const {  // -1 where the layer has no such tensor
        return layer_entry[static_cast<size_t>(layer)][static_cast<size_t>(p)];
    }
    int find(const std::string& name) const;  // -1 if absent
};

// One page-aligned allocation of bytes, zero-initialised, mapped from the operating system so
// that parts of it can be handed back and taken again: decommit() returns the whole pages of a
// range to the system (their contents read as zero afterwards, and a later write maps fresh
// zero pages), which is how ZeRO-3 frees the weights it does not own and ZeRO-2 the gradients
// it has reduced (core/parallel/data/zero.h). resident_bytes() measures what is actually mapped.
// The arena has no element type: its tables say what lives where, and view() types each piece.
class Arena {
public:
    // Whether the pages are mapped now (one bulk fault-in: every page is used from the first
    // step, so its first touch is not paid one fault at a time inside that step) or on first
    // touch (an arena only parts of which may ever be used, or whose parts are handed back).
    enum class Pages : std::uint8_t { on_touch, now };
    Arena() = default;
    explicit Arena(i64 bytes, Pages pages = Pages::on_touch);
    void* data() const { return data_.get(); }
    // The arena as floats, for arenas whose table holds fp32 data only (master weights,
    // gradients, optimizer moments, fp32 scratch).
    float* f32() const { return static_cast<float*>(data()); }
    i64 bytes() const { return bytes_; }
    Device device() const { return Device::cpu; }  // host memory; device arenas come with CUDA
    // A contiguous tensor of dtype t over bytes [offset, offset + its bytes), on this device.
    Tensor view(DType t, i64 offset, std::initializer_list<i64> shape, const char* name = "") const;
    Tensor view(DType t, i64 offset, const i64* dims, int ndim, const char* name = "") const;
    void zero();  // every byte, on every core (zero_bytes)
    // Bytes [lo, hi): the whole pages inside it go back to the system and read as zero; the
    // partial pages at its ends keep their contents.
    void decommit(i64 lo, i64 hi);
    i64 resident_bytes() const;  // bytes of this arena's pages that are mapped now

private:
    struct Free {
        Free() : bytes(0) {}
        explicit Free(size_t n) : bytes(n) {}
        size_t bytes;
        void operator()(std::byte* p) const;
    };
    std::unique_ptr<std::byte, Free> data_;
    i64 bytes_ = 0;
};

// n bytes from p set to zero on every core: gradient buffers run to hundreds of MiB (GPT-2's
// are 650 MiB), more than one core's stores can fill at memory speed.
void zero_bytes(void* p, i64 n);

// Floats [lo, hi) of an arena that holds fp32 data (weights, gradients): decommit of their bytes.
inline void decommit_f32(Arena& a, i64 lo, i64 hi) {
    a.decommit(bytes_of(DType::f32, lo), bytes_of(DType::f32, hi));
}

// Activations of one microbatch (B sequences of T tokens) on a run of L layers (a model chunk;
// the whole model on one device). `encoded` is the run's input hidden state (the embedding's
// output, or one received from the previous pipeline stage) and residual3 of layer i is block
// i's output, so encoded, residual3[0..L) is the residual stream: each block's input and output.
// A block's internals (ln1 .. fch_gelu) have a leading LS: L when every block keeps its own, 1
// when blocks are recomputed in backward (then only the residual stream is kept per microbatch).
// Head tensors exist only on a run that ends in the LM head; probs holds the logits, then the
// probabilities, then dlogits. att is (LS,B,NH,T,T): its last T is folded in by the table.
// An activation's dtype is the run's activation dtype (precision.activations), except for the
// LayerNorm statistics and the per-token losses: reductions that stay fp32 in every precision.
enum class ActType : std::uint8_t { act, f32 };
struct ActSpec {
    const char* name;
    Dim d0, d1, d2, d3;  // Dim::one pads unused dimensions
    bool head;           // kept only by a run that ends in the LM head
    ActType type;
    Archs archs = Archs::all;  // the architectures that keep it (empty in the others)
};
// GPT-2's names; Llama keeps its RMSNorms' outputs and rstd in ln1, ln2, lnf (no mean), the
// SwiGLU gate in fch, up in fch_up and silu(gate)·up in fch_gelu, and the attention's q, k and v,
// after RoPE, in qkv with each KV head repeated for the query heads it serves (the kernel's
// multi-head layout), the raw q and k (before the norms of qk_norm) in q_raw and k_raw.
inline constexpr ActSpec kActs[] = {
    {"encoded", Dim::B, Dim::T, Dim::C, Dim::one, false, ActType::act},    // (B,T,C)
    {"ln1", Dim::LS, Dim::B, Dim::T, Dim::C, false, ActType::act},         // (LS,B,T,C)
    {"ln1_mean", Dim::LS, Dim::B, Dim::T, Dim::one, false, ActType::f32, Archs::gpt2},
    {"ln1_rstd", Dim::LS, Dim::B, Dim::T, Dim::one, false, ActType::f32},  // (LS,B,T)
    {"qkv", Dim::LS, Dim::B, Dim::T, Dim::C3, false, ActType::act},        // (LS,B,T,3C)
    {"atty", Dim::LS, Dim::B, Dim::T, Dim::CA, false, ActType::act},       // (LS,B,T,C)
    {"att", Dim::LS, Dim::B, Dim::NH, Dim::T, false, ActType::act},        // (LS,B,NH,T,T)
    {"residual2", Dim::LS, Dim::B, Dim::T, Dim::C, false, ActType::act},   // (LS,B,T,C)
    {"ln2", Dim::LS, Dim::B, Dim::T, Dim::C, false, ActType::act},         // (LS,B,T,C)
    {"ln2_mean", Dim::LS, Dim::B, Dim::T, Dim::one, false, ActType::f32, Archs::gpt2},
    {"ln2_rstd", Dim::LS, Dim::B, Dim::T, Dim::one, false, ActType::f32},  // (LS,B,T)
    {"fch", Dim::LS, Dim::B, Dim::T, Dim::FM, false, ActType::act},        // (LS,B,T,F)
    {"fch_gelu", Dim::LS, Dim::B, Dim::T, Dim::FM, false, ActType::act},   // (LS,B,T,F)
    {"residual3", Dim::L, Dim::B, Dim::T, Dim::C, false, ActType::act},    // (L,B,T,C)
    {"lnf", Dim::B, Dim::T, Dim::C, Dim::one, true, ActType::act},         // (B,T,C)
    {"lnf_mean", Dim::B, Dim::T, Dim::one, Dim::one, true, ActType::f32, Archs::gpt2},
    {"lnf_rstd", Dim::B, Dim::T, Dim::one, Dim::one, true, ActType::f32},  // (B,T)
    {"probs", Dim::B, Dim::T, Dim::V, Dim::one, true, ActType::act},       // (B,T,V)
    {"losses", Dim::B, Dim::T, Dim::one, Dim::one, true, ActType::f32},    // (B,T)
    // backward scratch, one layer's worth, reused layer after layer; dresidual holds the
    // gradient of the residual stream: of the run's output before its blocks, of its input after
    {"dresidual", Dim::B, Dim::T, Dim::C, Dim::one, false, ActType::act},  // (B,T,C)
    {"dbuf_c", Dim::B, Dim::T, Dim::C, Dim::one, false, ActType::act},     // (B,T,C)
    {"dbuf_c3", Dim::B, Dim::T, Dim::C3, Dim::one, false, ActType::act},   // (B,T,3C)
    {"dbuf_f", Dim::B, Dim::T, Dim::FM, Dim::one, false, ActType::act},    // (B,T,F)
    {"dbuf_f2", Dim::B, Dim::T, Dim::FM, Dim::one, false, ActType::act},   // (B,T,F)
    {"dpreatt", Dim::B, Dim::NH, Dim::T, Dim::T, false, ActType::act},     // (B,NH,T,T)
    {"datt", Dim::B, Dim::NH, Dim::T, Dim::T, false, ActType::act},        // (B,NH,T,T)
    // MoE layers (core/model/moe.h; empty without MoE): the router's probabilities and the
    // logsumexp of its logits, the gates of a token's K slots, per routed row of the experts held
    // (expert order; K per token at most, from each of the RFE/KFE ep ranks that may send rows)
    // the expert's c_fc output and its GELU, and per slot this rank routed its expert's output.
    {"router_probs", Dim::LS, Dim::B, Dim::T, Dim::E, false, ActType::f32},  // (LS,B,T,E)
    {"router_lse", Dim::LS, Dim::B, Dim::T, Dim::one, false, ActType::f32},  // (LS,B,T)
    {"moe_gates", Dim::LS, Dim::B, Dim::T, Dim::K, false, ActType::f32},     // (LS,B,T,K)
    {"efch", Dim::LS, Dim::B, Dim::T, Dim::RFE, false, ActType::act},        // (LS,ep·B·T·K,FE)
    {"efch_gelu", Dim::LS, Dim::B, Dim::T, Dim::RFE, false, ActType::act},   // (LS,ep·B·T·K,FE)
    {"eout", Dim::LS, Dim::B, Dim::T, Dim::KC, false, ActType::act},         // (LS,B·T·K,C)
    // scratch: the experts' gathered input rows (and their gradients), FE-wide gradients, and
    // the router's (B,T,E) gradients
    {"ebuf_c", Dim::B, Dim::T, Dim::RC, Dim::one, false, ActType::act},      // (ep·B·T·K,C)
    {"ebuf_c2", Dim::B, Dim::T, Dim::RC, Dim::one, false, ActType::act},     // (ep·B·T·K,C)
    {"ebuf_f", Dim::B, Dim::T, Dim::RFE, Dim::one, false, ActType::act},     // (ep·B·T·K,FE)
    {"ebuf_f2", Dim::B, Dim::T, Dim::RFE, Dim::one, false, ActType::act},    // (ep·B·T·K,FE)
    {"router_d", Dim::B, Dim::T, Dim::E, Dim::one, false, ActType::f32},     // (B,T,E)
    // Llama: the raw q and k (their norms' inputs), the norms' rstd per head, SwiGLU's up, and
    // scratch: one microbatch's k or v (and their gradients) and q-wide gradients
    {"q_raw", Dim::LS, Dim::B, Dim::T, Dim::CA, false, ActType::act, Archs::llama},
    {"k_raw", Dim::LS, Dim::B, Dim::T, Dim::KV, false, ActType::act, Archs::llama},
    {"q_rstd", Dim::LS, Dim::B, Dim::T, Dim::NH, false, ActType::f32, Archs::llama},
    {"k_rstd", Dim::LS, Dim::B, Dim::T, Dim::KVH, false, ActType::f32, Archs::llama},
    {"fch_up", Dim::LS, Dim::B, Dim::T, Dim::FM, false, ActType::act, Archs::llama},
    {"dbuf_kv", Dim::B, Dim::T, Dim::KV, Dim::one, false, ActType::act, Archs::llama},
    {"dbuf_kv2", Dim::B, Dim::T, Dim::KV, Dim::one, false, ActType::act, Archs::llama},
    {"dbuf_q", Dim::B, Dim::T, Dim::CA, Dim::one, false, ActType::act, Archs::llama},
    {"dbuf_q2", Dim::B, Dim::T, Dim::CA, Dim::one, false, ActType::act, Archs::llama},
    {"dbuf_f3", Dim::B, Dim::T, Dim::FM, Dim::one, false, ActType::act, Archs::llama},
    // Llama's MoE layers: the SwiGLU experts' up projection per routed row (efch holds their
    // gate, efch_gelu silu(gate)·up), and its gradient's scratch
    {"efch_up", Dim::LS, Dim::B, Dim::T, Dim::RFE, false, ActType::act, Archs::llama},
    {"ebuf_f3", Dim::B, Dim::T, Dim::RFE, Dim::one, false, ActType::act, Archs::llama},
};
enum ActIndex : int {
    ENCODED, LN1, LN1_MEAN, LN1_RSTD, QKV, ATTY, ATT, RESIDUAL2, LN2, LN2_MEAN, LN2_RSTD, FCH,
    FCH_GELU, RESIDUAL3, LNF, LNF_MEAN, LNF_RSTD, PROBS, LOSSES, DRESIDUAL, DBUF_C, DBUF_C3,
    DBUF_F, DBUF_F2, DPREATT, DATT, ROUTER_PROBS, ROUTER_LSE, MOE_GATES, EFCH, EFCH_GELU, EOUT,
    EBUF_C, EBUF_C2, EBUF_F, EBUF_F2, ROUTER_D, Q_RAW, K_RAW, Q_RSTD, K_RSTD, FCH_UP, DBUF_KV,
    DBUF_KV2, DBUF_Q, DBUF_Q2, DBUF_F3, EFCH_UP, EBUF_F3, kNumActs
};
static_assert(kNumActs == sizeof(kActs) / sizeof(kActs[0]), "ActIndex must list kActs in order");
// Whether mc's architecture keeps activation spec a.
bool arch_keeps(const ModelConfig& mc, const ActSpec& a);

// The sizes an activation table is built for.
struct ActShape {
    i64 B = 1, T = 1;        // sequences and tokens of the microbatch
    DType dtype = DType::f32;  // the activation dtype (ActType::act)
    int layers = 0;          // L, layers of the run
    bool head = true;        // the run ends in the LM head
    bool recompute = false;  // keep one block's internals (LS = 1), recomputed in backward
    TpDims tp;               // a tensor-parallel shard's local sizes (default: the whole model)
    int expert_sources = 1;  // ranks whose routed rows a MoE layer's experts take (ep)
    // Keys a query row attends over, the last dimension of att, dpreatt and datt: 0 is T; under
    // context parallelism the whole sequence while T is the rank's tokens of it.
    i64 keys = 0;
    i64 key_len() const { return keys > 0 ? keys : T; }
};

// An activation's size along one dimension, in a table built for `shape`.
i64 resolve_dim(Dim d, const ModelConfig& mc, const ActShape& shape);

struct ActTable {
    i64 offset[kNumActs];  // bytes, 64-byte aligned
    i64 numel[kNumActs];   // elements
    DType dtype[kNumActs];
    i64 total = 0;  // bytes, including alignment padding
    static ActTable build(const ModelConfig& mc, const ActShape& shape);
};

}  // namespace px
