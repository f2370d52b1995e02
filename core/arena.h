// Arenas: one allocation each for parameters, gradients, optimizer state and activations,
// carved into named tensors by tables generated from one constexpr list.
//
// Index
//   Dim, ParamSpec, kGpt2Params    the GPT-2 parameter list (the only place it is written)
//   LayerParam, GlobalParam        indices into that list, checked against it by static_assert
//   ParamTable                     the list expanded for a config: names, shapes, offsets, ids
//   Arena                          a 64-byte aligned float allocation carved by a table
//   ActSpec, kGpt2Acts, ActTable   the same for the activations of one microbatch
#pragma once
#include "core/config.h"
#include "core/tensor.h"

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace px {

// The symbolic size of one tensor dimension, resolved against a ModelConfig.
enum class Dim : std::uint8_t { one, V, T, C, C3, F, L, B, NH };

struct ParamSpec {
    const char* name;  // GPT-2 name; per-layer names get the prefix "h.{i}."
    bool per_layer;
    Dim rows, cols;    // (rows, cols); vectors use rows = Dim::one
    bool decay;        // AdamW weight decay applies (matrices yes; biases and norms no)
    enum Init : std::uint8_t { normal, residual_normal, zeros, ones } init;
};

// Order = storage order = llm.c's per-layer order, and the tensor ids that key the RNG.
inline constexpr ParamSpec kGpt2Params[] = {
    {"wte", false, Dim::V, Dim::C, true, ParamSpec::normal},
    {"wpe", false, Dim::T, Dim::C, true, ParamSpec::normal},
    {"ln_1.weight", true, Dim::one, Dim::C, false, ParamSpec::ones},
    {"ln_1.bias", true, Dim::one, Dim::C, false, ParamSpec::zeros},
    {"attn.c_attn.weight", true, Dim::C3, Dim::C, true, ParamSpec::normal},
    {"attn.c_attn.bias", true, Dim::one, Dim::C3, false, ParamSpec::zeros},
    {"attn.c_proj.weight", true, Dim::C, Dim::C, true, ParamSpec::residual_normal},
    {"attn.c_proj.bias", true, Dim::one, Dim::C, false, ParamSpec::zeros},
    {"ln_2.weight", true, Dim::one, Dim::C, false, ParamSpec::ones},
    {"ln_2.bias", true, Dim::one, Dim::C, false, ParamSpec::zeros},
    {"mlp.c_fc.weight", true, Dim::F, Dim::C, true, ParamSpec::normal},
    {"mlp.c_fc.bias", true, Dim::one, Dim::F, false, ParamSpec::zeros},
    {"mlp.c_proj.weight", true, Dim::C, Dim::F, true, ParamSpec::residual_normal},
    {"mlp.c_proj.bias", true, Dim::one, Dim::C, false, ParamSpec::zeros},
    {"ln_f.weight", false, Dim::one, Dim::C, false, ParamSpec::ones},
    {"ln_f.bias", false, Dim::one, Dim::C, false, ParamSpec::zeros},
};
inline constexpr int kNumParamSpecs = sizeof(kGpt2Params) / sizeof(kGpt2Params[0]);

// Per-layer parameters, in list order starting at kFirstLayerSpec.
enum LayerParam : int {
    LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB,
    kNumLayerParams
};
inline constexpr int kFirstLayerSpec = 2;
static_assert(kGpt2Params[kFirstLayerSpec + FCPROJB].per_layer &&
                  !kGpt2Params[kFirstLayerSpec + kNumLayerParams].per_layer &&
                  !kGpt2Params[kFirstLayerSpec - 1].per_layer,
              "LayerParam must list the per-layer entries of kGpt2Params in order");

i64 resolve_dim(Dim d, const ModelConfig& mc, i64 B = 1, i64 T = 0);

struct TableEntry {
    std::string name;
    int spec;      // index into the spec list
    int layer;     // -1 for global tensors
    i64 rows, cols;
    i64 offset;    // in floats, 16-float aligned
    i64 numel() const { return rows * cols; }
};

// The parameter list expanded for one config: wte, wpe, h.0.*, ..., h.{L-1}.*, ln_f.*.
struct ParamTable {
    std::vector<TableEntry> entries;
    i64 total = 0;     // floats, including alignment padding
    i64 num_params = 0;  // true parameter count
    int wte = 0, wpe = 1, lnfw = -1, lnfb = -1;

    static ParamTable build(const ModelConfig& mc);
    int layer_index(int layer, LayerParam p) const { return 2 + layer * kNumLayerParams + p; }
    int find(const std::string& name) const;  // -1 if absent
};

// One 64-byte aligned float allocation, zero-initialised.
class Arena {
public:
    Arena() = default;
    explicit Arena(i64 floats);
    float* data() const { return data_.get(); }
    i64 size() const { return size_; }
    void zero();

private:
    struct Free {
        void operator()(float* p) const;
    };
    std::unique_ptr<float, Free> data_;
    i64 size_ = 0;
};

// Activations of one microbatch (B sequences of T tokens). Per-layer tensors have a leading L.
struct ActSpec {
    const char* name;
    Dim d0, d1, d2, d3;  // Dim::one pads unused dimensions
};
inline constexpr ActSpec kGpt2Acts[] = {
    {"encoded", Dim::B, Dim::T, Dim::C, Dim::one},        // (B,T,C)
    {"ln1", Dim::L, Dim::B, Dim::T, Dim::C},              // (L,B,T,C)
    {"ln1_mean", Dim::L, Dim::B, Dim::T, Dim::one},       // (L,B,T)
    {"ln1_rstd", Dim::L, Dim::B, Dim::T, Dim::one},       // (L,B,T)
    {"qkv", Dim::L, Dim::B, Dim::T, Dim::C3},             // (L,B,T,3C)
    {"atty", Dim::L, Dim::B, Dim::T, Dim::C},             // (L,B,T,C)
    {"att", Dim::L, Dim::B, Dim::NH, Dim::T},             // (L,B,NH,T,T): last T folded in
    {"residual2", Dim::L, Dim::B, Dim::T, Dim::C},        // (L,B,T,C)
    {"ln2", Dim::L, Dim::B, Dim::T, Dim::C},              // (L,B,T,C)
    {"ln2_mean", Dim::L, Dim::B, Dim::T, Dim::one},       // (L,B,T)
    {"ln2_rstd", Dim::L, Dim::B, Dim::T, Dim::one},       // (L,B,T)
    {"fch", Dim::L, Dim::B, Dim::T, Dim::F},              // (L,B,T,F)
    {"fch_gelu", Dim::L, Dim::B, Dim::T, Dim::F},         // (L,B,T,F)
    {"residual3", Dim::L, Dim::B, Dim::T, Dim::C},        // (L,B,T,C)
    {"lnf", Dim::B, Dim::T, Dim::C, Dim::one},            // (B,T,C)
    {"lnf_mean", Dim::B, Dim::T, Dim::one, Dim::one},     // (B,T)
    {"lnf_rstd", Dim::B, Dim::T, Dim::one, Dim::one},     // (B,T)
    {"probs", Dim::B, Dim::T, Dim::V, Dim::one},          // (B,T,V): logits, then probs, then dlogits
    {"losses", Dim::B, Dim::T, Dim::one, Dim::one},       // (B,T)
    // backward scratch, one layer's worth, reused layer after layer
    {"dresidual", Dim::B, Dim::T, Dim::C, Dim::one},      // (B,T,C)
    {"dbuf_c", Dim::B, Dim::T, Dim::C, Dim::one},         // (B,T,C)
    {"dbuf_c3", Dim::B, Dim::T, Dim::C3, Dim::one},       // (B,T,3C)
    {"dbuf_f", Dim::B, Dim::T, Dim::F, Dim::one},         // (B,T,F)
    {"dbuf_f2", Dim::B, Dim::T, Dim::F, Dim::one},        // (B,T,F)
    {"dpreatt", Dim::B, Dim::NH, Dim::T, Dim::T},         // (B,NH,T,T)
    {"datt", Dim::B, Dim::NH, Dim::T, Dim::T},            // (B,NH,T,T)
};
enum ActIndex : int {
    ENCODED, LN1, LN1_MEAN, LN1_RSTD, QKV, ATTY, ATT, RESIDUAL2, LN2, LN2_MEAN, LN2_RSTD, FCH,
    FCH_GELU, RESIDUAL3, LNF, LNF_MEAN, LNF_RSTD, PROBS, LOSSES, DRESIDUAL, DBUF_C, DBUF_C3,
    DBUF_F, DBUF_F2, DPREATT, DATT, kNumActs
};
static_assert(kNumActs == sizeof(kGpt2Acts) / sizeof(kGpt2Acts[0]),
              "ActIndex must list kGpt2Acts in order");

struct ActTable {
    i64 offset[kNumActs];
    i64 numel[kNumActs];
    i64 total = 0;
    static ActTable build(const ModelConfig& mc, i64 B, i64 T);
};

}  // namespace px
