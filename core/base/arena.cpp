#include "core/base/arena.h"

#include "core/base/error.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <span>

namespace px {

namespace {
constexpr i64 kAlignFloats = 16;  // 64 bytes
constexpr i64 kAlignBytes = 64;
i64 align_up(i64 n) { return (n + kAlignFloats - 1) / kAlignFloats * kAlignFloats; }
i64 align_up_bytes(i64 n) {
    return (n + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
}
}  // namespace

i64 resolve_dim(Dim d, const ModelConfig& mc, i64 B, i64 T) {
    switch (d) {
    case Dim::one: return 1;
    case Dim::V: return mc.vocab;
    case Dim::T: return T > 0 ? T : mc.seq_len;
    case Dim::C: return mc.hidden;
    case Dim::C3: return 3 * mc.attn_channels();
    case Dim::F: return mc.ffn;
    case Dim::L:
    case Dim::LS: return mc.layers;
    case Dim::B: return B;
    case Dim::NH: return mc.heads;
    case Dim::CA: return mc.attn_channels();
    case Dim::KV: return mc.kv_channels();
    case Dim::KVH: return mc.kv_head_count();
    case Dim::HS: return mc.head_size();
    case Dim::E: return mc.moe_experts;
    case Dim::FE: return mc.is_moe() ? mc.expert_ffn() : 0;
    case Dim::EFE: return mc.moe_experts * resolve_dim(Dim::FE, mc);
    case Dim::EC: return mc.moe_experts * mc.hidden;
    case Dim::FS: return mc.moe_shared_experts * resolve_dim(Dim::FE, mc);
    case Dim::K: return mc.is_moe() ? mc.moe_top_k : 0;
    case Dim::KFE: return resolve_dim(Dim::K, mc) * resolve_dim(Dim::FE, mc);
    case Dim::KC: return resolve_dim(Dim::K, mc) * mc.hidden;
    case Dim::EL: return mc.moe_experts;
    case Dim::RFE: return resolve_dim(Dim::KFE, mc);
    case Dim::RC: return resolve_dim(Dim::KC, mc);
    case Dim::FM: {
        // the widest plain MLP: F where a layer is dense, FS where a MoE layer has shared experts
        const bool dense = !mc.is_moe() || mc.moe_every > 1;
        return std::max(dense ? mc.ffn : 0, resolve_dim(Dim::FS, mc));
    }
    }
    return 0;
}

const char* param_name(const ModelConfig& mc, int spec) {
    const ParamSpec& s = kParams[spec];
    return mc.llama() ? s.llama : s.name;
}

bool arch_holds(const ModelConfig& mc, int spec) {
    if (param_name(mc, spec) == nullptr) return false;
    if (spec == kLmHeadSpec) return !mc.tied_head();
    if (spec - kFirstLayerSpec == QNORMW || spec - kFirstLayerSpec == KNORMW) return mc.qk_norm;
    return true;
}

bool layer_holds(const ModelConfig& mc, i64 l, int p) {
    if (!arch_holds(mc, kFirstLayerSpec + p)) return false;
    const bool routed = (p >= ROUTERW && p <= EPROJB) || p == EUPW;
    if (!mc.moe_layer(l)) return !routed;
    if ((p >= FCW && p <= FCPROJB) || p == UPW) return mc.moe_shared_experts > 0;
    return true;
}

std::string layer_prefix(const ModelConfig& mc, i64 l) {
    return (mc.llama() ? "model.layers." : "h.") + std::to_string(l) + ".";
}

bool arch_keeps(const ModelConfig& mc, const ActSpec& a) {
    return a.archs == Archs::all || (a.archs == Archs::llama) == mc.llama();
}

namespace {

// The per-layer storage order of mc's architecture.
std::span<const LayerParam> layer_order(const ModelConfig& mc) {
    if (mc.llama()) return kLlamaLayerOrder;
    return kGpt2LayerOrder;
}

}  // namespace

int ParamTable::num_tensors(const ModelConfig& mc) {
    int n = 0;
    for (int s : {0, 1, kLnfWSpec, kLnfBSpec, kLmHeadSpec}) n += arch_holds(mc, s) ? 1 : 0;
    for (i64 l = 0; l < mc.layers; l++)
        for (int p = 0; p < kNumLayerParams; p++) n += layer_holds(mc, l, p) ? 1 : 0;
    return n;
}

i64 resolve_dim(Dim d, const ModelConfig& mc, const TpDims& tp) {
    switch (d) {
    case Dim::V: return tp.vocab >= 0 ? tp.vocab : mc.vocab;
    case Dim::C3:
    case Dim::F:
    case Dim::NH:
    case Dim::CA: return resolve_dim(d, mc) / tp.tp;
    case Dim::KV:
    case Dim::KVH: return resolve_dim(d, mc) / (kv_split(mc, tp.tp) ? tp.tp : 1);
    case Dim::FM: {  // a dense layer's ffn shard, or a MoE layer's shared experts (held whole)
        const bool dense = !mc.is_moe() || mc.moe_every > 1;
        return std::max(dense ? mc.ffn / tp.tp : 0, resolve_dim(Dim::FS, mc));
    }
    case Dim::EL: return tp.experts >= 0 ? tp.experts : mc.moe_experts;
    case Dim::EFE: return resolve_dim(Dim::EL, mc, tp) * resolve_dim(Dim::FE, mc);
    case Dim::EC: return resolve_dim(Dim::EL, mc, tp) * mc.hidden;
    default: return resolve_dim(d, mc);
    }
}

TpDims ModelPart::expert_dims(TpDims tp) const {
    if (!all_experts()) {
        tp.expert_lo = expert_lo;
        tp.experts = expert_hi - expert_lo;
    }
    return tp;
}

ModelPart ModelPart::whole(const ModelConfig& mc) {
    ModelPart p;
    p.chunks = {{0, static_cast<int>(mc.layers)}};
    p.tied = mc.tied_head();
    return p;
}

ParamTable ParamTable::build(const ModelConfig& mc) { return build(mc, ModelPart::whole(mc)); }

ParamTable ParamTable::build(const ModelConfig& mc, const ModelPart& part) {
    return build(mc, part, TpDims{});
}

ParamTable ParamTable::build(const ModelConfig& mc, const ModelPart& part, const TpDims& tp_dims) {
    const TpDims tp = part.expert_dims(tp_dims);
    const int L = static_cast<int>(mc.layers);
    for (size_t c = 0; c < part.chunks.size(); c++) {
        const LayerSpan s = part.chunks[c];
        const int prev_hi = c > 0 ? part.chunks[c - 1].hi : 0;
        PX_ASSERT(s.lo >= prev_hi && s.lo <= s.hi && s.hi <= L,
                  "a model part's layer spans must be disjoint, increasing and inside the model");
    }
    PX_ASSERT(part.tied == mc.tied_head(), "a model part whose head is tied as its model's is not");
    ParamTable t;
    t.layer_first.assign(static_cast<size_t>(L), -1);
    t.layer_last.assign(static_cast<size_t>(L), -1);
    std::array<int, kNumLayerParams> none;
    none.fill(-1);
    t.layer_entry.assign(static_cast<size_t>(L), none);
    // id: the index in the whole model's table, which holds wte, wpe, then each layer's tensors
    // in the architecture's order, then ln_f and lm_head (those the architecture has).
    const std::span<const LayerParam> order = layer_order(mc);
    std::vector<int> layer_id(static_cast<size_t>(L) + 1, 0);
    layer_id[0] = (arch_holds(mc, 0) ? 1 : 0) + (arch_holds(mc, 1) ? 1 : 0);
    for (int l = 0; l < L; l++) {
        int n = 0;
        for (LayerParam p : order) n += layer_holds(mc, l, p) ? 1 : 0;
        layer_id[static_cast<size_t>(l) + 1] = layer_id[static_cast<size_t>(l)] + n;
    }
    auto id_of = [&](int spec, int layer) {
        if (layer < 0) {
            if (spec < kFirstLayerSpec) return spec == 0 ? 0 : (arch_holds(mc, 0) ? 1 : 0);
            int id = layer_id[static_cast<size_t>(L)];
            for (int g = kLnfWSpec; g < spec; g++) id += arch_holds(mc, g) ? 1 : 0;
            return id;
        }
        int id = layer_id[static_cast<size_t>(layer)];
        for (LayerParam p : order) {
            if (kFirstLayerSpec + p == spec) break;
            id += layer_holds(mc, layer, p) ? 1 : 0;
        }
        return id;
    };
    auto add = [&](int spec, int layer) {
        const ParamSpec& s = kParams[spec];
        TableEntry e;
        e.short_name = param_name(mc, spec);
        e.name = layer >= 0 ? layer_prefix(mc, layer) + e.short_name : std::string(e.short_name);
        e.spec = spec;
        e.layer = layer;
        e.id = id_of(spec, layer);
        // a MoE layer's plain MLP is its shared experts'
        const bool shared = layer >= 0 && mc.moe_layer(layer);
        const auto width = [&](Dim d) { return shared && d == Dim::F ? Dim::FS : d; };
        e.rows = resolve_dim(width(s.rows), mc, tp);
        e.cols = resolve_dim(width(s.cols), mc, tp);
        e.offset = t.total;
        t.total += align_up(e.numel());
        t.num_params += e.numel();
        t.entries.push_back(std::move(e));
        return static_cast<int>(t.entries.size()) - 1;
    };
    if (part.holds_wte()) t.wte = add(0, -1);
    if (part.embedding && arch_holds(mc, 1)) t.wpe = add(1, -1);
    for (const LayerSpan& span : part.chunks)
        for (int l = span.lo; l < span.hi; l++) {
            const size_t li = static_cast<size_t>(l);
            t.layer_first[li] = static_cast<int>(t.entries.size());
            for (LayerParam p : order)
                if (layer_holds(mc, l, p))
                    t.layer_entry[li][static_cast<size_t>(p)] = add(kFirstLayerSpec + p, l);
            t.layer_last[li] = static_cast<int>(t.entries.size()) - 1;
        }
    if (part.head) {
        t.lnfw = add(kLnfWSpec, -1);
        if (arch_holds(mc, kLnfBSpec)) t.lnfb = add(kLnfBSpec, -1);
        if (arch_holds(mc, kLmHeadSpec)) t.lm_head = add(kLmHeadSpec, -1);
    }
    return t;
}

int ParamTable::find(const std::string& name) const {
    for (size_t i = 0; i < entries.size(); i++)
        if (entries[i].name == name) return static_cast<int>(i);
    return -1;
}

void Arena::Free::operator()(std::byte* p) const {
    munmap(p, bytes);
}

Arena::Arena(i64 bytes, Pages pages) : bytes_(bytes) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t want = static_cast<size_t>(align_up_bytes(bytes > 0 ? bytes : 1));
    const size_t mapped = (want + page - 1) / page * page;
    // Anonymous private pages: zero on first touch, and only touched pages use memory; or all
    // of them faulted in here, in bulk (MAP_POPULATE).
    const int populate = pages == Pages::now ? MAP_POPULATE : 0;
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | populate,
                   -1, 0);
    if (p == MAP_FAILED)
        throw Error("out of memory: could not map " + std::to_string(mapped >> 20) +
                    " MiB for an arena; reduce the model size or batch");
    data_ = std::unique_ptr<std::byte, Free>(static_cast<std::byte*>(p), Free{mapped});
}

void Arena::decommit(i64 lo, i64 hi) {
    const i64 page = sysconf(_SC_PAGESIZE);
    lo = std::max<i64>(lo, 0);
    hi = std::min(hi, bytes_);
    const i64 a = (lo + page - 1) / page * page, b = hi / page * page;
    if (a >= b) return;
    if (madvise(data_.get() + a, static_cast<size_t>(b - a), MADV_DONTNEED) != 0)
        throw InternalError("madvise(MADV_DONTNEED) failed on an arena: " +
                            std::string(std::strerror(errno)));
}

i64 Arena::resident_bytes() const {
    if (!data_) return 0;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t pages = (data_.get_deleter().bytes + page - 1) / page;
    std::vector<unsigned char> in(pages);
    if (mincore(data_.get(), pages * page, in.data()) != 0) return -1;
    i64 n = 0;
    for (unsigned char c : in) n += c & 1;
    return n * static_cast<i64>(page);
}

void zero_bytes(void* p, i64 n) {
    std::byte* b = static_cast<std::byte*>(p);
    constexpr i64 kChunk = i64{1} << 20;
    const i64 chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (i64 c = 0; c < chunks; c++) {
        const i64 lo = c * kChunk;
        std::memset(b + lo, 0, static_cast<size_t>(std::min(kChunk, n - lo)));
    }
}

void Arena::zero() {
    if (data_) zero_bytes(data_.get(), bytes_);
}

Tensor Arena::view(DType t, i64 offset, const i64* dims, int ndim, const char* name) const {
    PX_ASSERT(ndim >= 0 && ndim <= kMaxDims, "Arena::view: too many dimensions");
    Tensor v;
    v.data = data_.get() + offset;
    v.dtype = t;
    v.device = device();
    v.ndim = ndim;
    i64 stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        v.shape[d] = dims[d];
        v.strides[d] = stride;
        stride *= dims[d];
    }
    v.name = name;
    PX_ASSERT(offset >= 0 && offset % static_cast<i64>(dtype_size(t)) == 0 &&
                  offset + bytes_of(t, v.numel()) <= bytes_,
              "Arena::view out of range or misaligned for its dtype");
    return v;
}

Tensor Arena::view(DType t, i64 offset, std::initializer_list<i64> shape, const char* name) const {
    return view(t, offset, shape.begin(), static_cast<int>(shape.size()), name);
}

i64 resolve_dim(Dim d, const ModelConfig& mc, const ActShape& shape) {
    switch (d) {
    case Dim::T: return shape.T;
    case Dim::B: return shape.B;
    case Dim::L: return shape.layers;
    case Dim::LS: return shape.recompute ? std::min(shape.layers, 1) : shape.layers;
    case Dim::V:
    case Dim::C3:
    case Dim::F:
    case Dim::FM:
    case Dim::NH:
    case Dim::CA:
    case Dim::KV:
    case Dim::KVH: return resolve_dim(d, mc, shape.tp);
    case Dim::RFE: return shape.expert_sources * resolve_dim(Dim::KFE, mc);
    case Dim::RC: return shape.expert_sources * resolve_dim(Dim::KC, mc);
    default: return resolve_dim(d, mc, shape.B, shape.T);
    }
}

ActTable ActTable::build(const ModelConfig& mc, const ActShape& shape) {
    auto size = [&](Dim d) { return resolve_dim(d, mc, shape); };
    ActTable t;
    for (int i = 0; i < kNumActs; i++) {
        const ActSpec& s = kActs[i];
        i64 n = arch_keeps(mc, s) ? size(s.d0) * size(s.d1) * size(s.d2) * size(s.d3) : 0;
        if (i == ATT) n *= shape.key_len();  // (LS,B,NH,T,keys)
        if (i == DPREATT || i == DATT) n = n / std::max<i64>(shape.T, 1) * shape.key_len();
        if (s.head && !shape.head) n = 0;
        t.dtype[i] = s.type == ActType::f32 ? DType::f32 : shape.dtype;
        t.offset[i] = t.total;
        t.numel[i] = n;
        t.total += align_up_bytes(bytes_of(t.dtype[i], n));
    }
    return t;
}

}  // namespace px
