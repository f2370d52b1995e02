#include "core/arena.h"

#include "core/error.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace px {

namespace {
constexpr i64 kAlignFloats = 16;  // 64 bytes
i64 align_up(i64 n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }
}  // namespace

i64 resolve_dim(Dim d, const ModelConfig& mc, i64 B, i64 T) {
    switch (d) {
    case Dim::one: return 1;
    case Dim::V: return mc.vocab;
    case Dim::T: return T > 0 ? T : mc.seq_len;
    case Dim::C: return mc.hidden;
    case Dim::C3: return 3 * mc.hidden;
    case Dim::F: return mc.ffn;
    case Dim::L: return mc.layers;
    case Dim::B: return B;
    case Dim::NH: return mc.heads;
    }
    return 0;
}

ParamTable ParamTable::build(const ModelConfig& mc) {
    ParamTable t;
    auto add = [&](int spec, int layer) {
        const ParamSpec& s = kGpt2Params[spec];
        TableEntry e;
        e.name = layer >= 0 ? "h." + std::to_string(layer) + "." + s.name : std::string(s.name);
        e.spec = spec;
        e.layer = layer;
        e.rows = resolve_dim(s.rows, mc);
        e.cols = resolve_dim(s.cols, mc);
        e.offset = t.total;
        t.total += align_up(e.numel());
        t.num_params += e.numel();
        t.entries.push_back(std::move(e));
    };
    for (int s = 0; s < kFirstLayerSpec; s++) add(s, -1);
    for (int l = 0; l < mc.layers; l++)
        for (int p = 0; p < kNumLayerParams; p++) add(kFirstLayerSpec + p, l);
    for (int s = kFirstLayerSpec + kNumLayerParams; s < kNumParamSpecs; s++) add(s, -1);
    t.lnfw = static_cast<int>(t.entries.size()) - 2;
    t.lnfb = static_cast<int>(t.entries.size()) - 1;
    return t;
}

int ParamTable::find(const std::string& name) const {
    for (size_t i = 0; i < entries.size(); i++)
        if (entries[i].name == name) return static_cast<int>(i);
    return -1;
}

void Arena::Free::operator()(float* p) const { std::free(p); }

Arena::Arena(i64 floats) : size_(floats) {
    const size_t bytes = static_cast<size_t>(align_up(floats > 0 ? floats : 1)) * sizeof(float);
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr)
        throw Error("out of memory: could not allocate " + std::to_string(bytes >> 20) +
                    " MiB for an arena; reduce the model size or batch");
    data_.reset(static_cast<float*>(p));
    std::memset(p, 0, bytes);
}

void Arena::zero() {
    // Arenas run to hundreds of MiB (GPT-2's gradients are 650 MiB): clear them on every core.
    float* p = data_.get();
    if (!p) return;
    constexpr i64 kChunk = 1 << 18;
    const i64 chunks = (size_ + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (i64 c = 0; c < chunks; c++) {
        const i64 lo = c * kChunk;
        std::memset(p + lo, 0, static_cast<size_t>(std::min(kChunk, size_ - lo)) * sizeof(float));
    }
}

ActTable ActTable::build(const ModelConfig& mc, i64 B, i64 T) {
    ActTable t;
    for (int i = 0; i < kNumActs; i++) {
        const ActSpec& s = kGpt2Acts[i];
        i64 n = resolve_dim(s.d0, mc, B, T) * resolve_dim(s.d1, mc, B, T) *
                resolve_dim(s.d2, mc, B, T) * resolve_dim(s.d3, mc, B, T);
        if (i == ATT) n *= T;  // (L,B,NH,T,T)
        t.offset[i] = t.total;
        t.numel[i] = n;
        t.total += align_up(n);
    }
    return t;
}

}  // namespace px
