// Fast-mode bf16 matmuls on oneDNN's bf16 primitive or on sgemm; the contract is in
// matmul_bf16.h.
#include "kernels/cpu/matmul_bf16.h"

#include "core/base/error.h"
#include "kernels/cpu/casts.h"
#include "kernels/cpu/cpu_kernels.h"

#include <cpuid.h>
#include <oneapi/dnnl/dnnl.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace px::cpu {

namespace {

// ---- what this CPU has ---------------------------------------------------------------------

const char* onednn_isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
        case dnnl_cpu_isa_avx512_core_amx:
            return "avx512_core_amx";
        case dnnl_cpu_isa_avx512_core_bf16:
            return "avx512_core_bf16";
        case dnnl_cpu_isa_avx512_core_vnni:
            return "avx512_core_vnni";
        case dnnl_cpu_isa_avx512_core:
            return "avx512_core";
        case dnnl_cpu_isa_avx2_vnni:
            return "avx2_vnni";
        case dnnl_cpu_isa_avx2:
            return "avx2";
        case dnnl_cpu_isa_avx:
            return "avx";
        case dnnl_cpu_isa_sse41:
            return "sse41";
        default:
            return "other";
    }
}

// cpuid leaf 7: subleaf 0 EDX bit 22 AMX-BF16, bit 24 AMX-TILE; subleaf 1 EAX bit 5 AVX512_BF16.
void cpu_bf16_flags(bool& amx, bool& avx512) {
    unsigned a, b, c, d;
    amx = avx512 = false;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) amx = (d >> 22 & 1u) && (d >> 24 & 1u);
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) avx512 = (a >> 5 & 1u) != 0;
}

dnnl::engine& engine() {
    static dnnl::engine e(dnnl::engine::kind::cpu, 0);
    return e;
}

// ---- primitives, one per shape and operand layout, made once -------------------------------

using dt = dnnl::memory::data_type;

// src (M,K) and weights (K,N) bf16 with the given strides; dst (M,N) row-major; optional fp32 bias
// (N); sum: dst += instead of dst =.
struct Shape {
    i64 M, N, K, sa0, sa1, sb0, sb1;
    dt dst;
    bool bias, sum;
    auto key() const { return std::tie(M, N, K, sa0, sa1, sb0, sb1, dst, bias, sum); }
    bool operator<(const Shape& o) const { return key() < o.key(); }
};

struct Prim {
    dnnl::matmul matmul;
    dnnl::memory::desc src, wei, dst, bias;
    size_t scratch = 0;
    std::string impl;
};

std::shared_ptr<const Prim> make_prim(const Shape& s) {
    auto p = std::make_shared<Prim>();
    p->src = dnnl::memory::desc({s.M, s.K}, dt::bf16, {s.sa0, s.sa1});
    p->wei = dnnl::memory::desc({s.K, s.N}, dt::bf16, {s.sb0, s.sb1});
    p->dst = dnnl::memory::desc({s.M, s.N}, s.dst, {s.N, 1});
    p->bias = dnnl::memory::desc({1, s.N}, dt::f32, {s.N, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // per-thread buffers, see run()
    if (s.sum) {
        dnnl::post_ops po;
        po.append_sum(1.0f);
        attr.set_post_ops(po);
    }
    const dnnl::matmul::desc d = s.bias ? dnnl::matmul::desc(p->src, p->wei, p->bias, p->dst)
                                        : dnnl::matmul::desc(p->src, p->wei, p->dst);
    const dnnl::matmul::primitive_desc pd(d, attr, engine());
    p->matmul = dnnl::matmul(pd);
    p->scratch = pd.scratchpad_desc().get_size();
    p->impl = pd.impl_info_str();
    return p;
}

// The primitive of shape s, made on first use; null when oneDNN cannot make one, or only its
// reference implementation ("ref:...", orders of magnitude slower than sgemm): the caller then
// takes another layout or the sgemm path. Ranks may run as threads: the cache is shared, under a
// mutex.
std::shared_ptr<const Prim> prim_for(const Shape& s) {
    static std::mutex mu;
    static std::map<Shape, std::shared_ptr<const Prim>> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(s);
    if (it != cache.end()) return it->second;
    std::shared_ptr<const Prim> p;
    try {
        p = make_prim(s);
        if (p->impl.rfind("ref", 0) == 0) p = nullptr;
    } catch (const dnnl::error&) {
        p = nullptr;  // remembered: no second attempt per shape
    }
    cache.emplace(s, p);
    return p;
}

// Growable per-thread buffers (a primitive's scratchpad, the rounded weights, widened operands).
template <class T>
T* grow(std::vector<T>& v, i64 n) {
    if (static_cast<i64>(v.size()) < n) v.resize(static_cast<size_t>(n));
    return v.data();
}
thread_local std::vector<std::uint8_t> tl_scratchpad;
thread_local std::vector<std::uint16_t> tl_wbf16, tl_doutT;
thread_local std::vector<float> tl_a, tl_b, tl_c, tl_w;

bool run(const Shape& s, const void* src, const void* wei, void* dst, const float* bias) {
    const std::shared_ptr<const Prim> p = prim_for(s);
    if (!p) return false;
    dnnl::engine& e = engine();
    thread_local dnnl::stream stream(engine());
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(p->src, e, const_cast<void*>(src))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(p->wei, e, const_cast<void*>(wei))},
        {DNNL_ARG_DST, dnnl::memory(p->dst, e, dst)},
    };
    if (s.bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(p->bias, e, const_cast<float*>(bias)));
    if (p->scratch > 0)
        args.emplace(DNNL_ARG_SCRATCHPAD,
                     dnnl::memory(dnnl::memory::desc({static_cast<i64>(p->scratch)}, dt::u8, {1}),
                                  e, grow(tl_scratchpad, static_cast<i64>(p->scratch))));
    p->matmul.execute(stream, args);
    stream.wait();
    return true;
}

// ---- the two paths -------------------------------------------------------------------------

bool forward_onednn(const Numerics& nx, std::uint16_t* out, const std::uint16_t* inp,
                    const float* weight, const float* bias, i64 BT, i64 C, i64 OC) {
    std::uint16_t* w = grow(tl_wbf16, OC * C);
    narrow_bf16(nx.isa, w, weight, OC * C);
    // out = inp · wᵀ: the weights operand (K=C, N=OC) is w (OC,C) read by columns.
    return run({BT, OC, C, C, 1, 1, C, dt::bf16, bias != nullptr, false}, inp, w, out, bias);
}

void forward_sgemm(const Numerics& nx, std::uint16_t* out, const std::uint16_t* inp,
                   const float* weight, const float* bias, i64 BT, i64 C, i64 OC) {
    float* x = grow(tl_a, BT * C);
    float* w = grow(tl_w, OC * C);
    float* o = grow(tl_c, BT * OC);
    widen_bf16(nx.isa, x, inp, BT * C);
    round_bf16(nx.isa, w, weight, OC * C);
    matmul_forward(nx, o, x, w, bias, BT, C, OC);
    narrow_bf16(nx.isa, out, o, BT * OC);
}

// dbias needs dout in fp32 (the canonical column sums of matmul_backward, in both modes).
void dbias_of(const Numerics& nx, float* dbias, const float* dout_f32, i64 BT, i64 C, i64 OC) {
    matmul_backward(nx, nullptr, nullptr, dbias, dout_f32, nullptr, nullptr, BT, C, OC);
}

}  // namespace

const char* bf16_path_name(Bf16Path p) {
    return p == Bf16Path::onednn ? "oneDNN bf16" : "fp32 sgemm";
}

const Bf16MatmulInfo& bf16_matmul_info() {
    static const Bf16MatmulInfo info = [] {
        Bf16MatmulInfo i;
        cpu_bf16_flags(i.amx_bf16, i.avx512_bf16);
        const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
        i.onednn_isa = onednn_isa_name(isa);
        const bool native = (static_cast<unsigned>(isa) & dnnl_cpu_isa_avx512_core_bf16) ==
                            static_cast<unsigned>(dnnl_cpu_isa_avx512_core_bf16);
        // What oneDNN would run for GPT-2's qkv forward (made, not executed).
        const std::shared_ptr<const Prim> p =
            prim_for({256, 2304, 768, 768, 1, 1, 768, dt::bf16, true, false});
        i.onednn_impl = p ? p->impl : "none";
        i.path = native && p ? Bf16Path::onednn : Bf16Path::sgemm;
        std::string cpu = i.amx_bf16 ? "amx_bf16" : "";
        if (i.avx512_bf16) cpu += cpu.empty() ? "avx512_bf16" : " avx512_bf16";
        if (cpu.empty()) cpu = "no amx_bf16 or avx512_bf16";
        if (i.path == Bf16Path::onednn)
            i.text = "oneDNN " + i.onednn_isa + " (" + i.onednn_impl + "; cpuid: " + cpu + ")";
        else
            i.text = "fp32 sgemm on bf16 values (cpuid: " + cpu + "; oneDNN " + i.onednn_isa +
                     " would emulate bf16 with " + i.onednn_impl + ", slower)";
        return i;
    }();
    return info;
}

void matmul_forward_bf16(const Numerics& nx, Bf16Path path, std::uint16_t* out,
                         const std::uint16_t* inp, const float* weight, const float* bias, i64 BT,
                         i64 C, i64 OC) {
    if (BT <= 0 || OC <= 0) return;
    if (path == Bf16Path::onednn && C > 0 && forward_onednn(nx, out, inp, weight, bias, BT, C, OC))
        return;
    forward_sgemm(nx, out, inp, weight, bias, BT, C, OC);
}

void matmul_backward_bf16(const Numerics& nx, Bf16Path path, std::uint16_t* dinp, float* dweight,
                          float* dbias, const std::uint16_t* dout, const std::uint16_t* inp,
                          const float* weight, i64 BT, i64 C, i64 OC) {
    if (BT <= 0 || OC <= 0) return;  // every sum is empty: the gradients stay as they are
    float* d = nullptr;              // dout in fp32, for dbias and the sgemm path
    auto widened_dout = [&] {
        if (d == nullptr) {
            d = grow(tl_b, BT * OC);
            widen_bf16(nx.isa, d, dout, BT * OC);
        }
        return d;
    };
    if (dbias != nullptr) dbias_of(nx, dbias, widened_dout(), BT, C, OC);
    if (C <= 0) return;
    bool dinp_done = dinp == nullptr, dweight_done = dweight == nullptr;
    if (path == Bf16Path::onednn) {
        if (!dinp_done) {
            // dinp (BT,C) += dout (BT,OC) · w (OC,C)
            std::uint16_t* w = grow(tl_wbf16, OC * C);
            narrow_bf16(nx.isa, w, weight, OC * C);
            dinp_done =
                run({BT, C, OC, OC, 1, C, 1, dt::bf16, false, true}, dout, w, dinp, nullptr);
        }
        if (!dweight_done)  // dweight (OC,C) += doutᵀ (OC,BT) · inp (BT,C)
            dweight_done =
                run({OC, C, BT, 1, OC, C, 1, dt::f32, false, true}, dout, inp, dweight, nullptr);
        if (!dweight_done) {  // no kernel for a transposed src here: transpose dout first
            std::uint16_t* dt_ = grow(tl_doutT, OC * BT);
#pragma omp parallel for schedule(static) if (BT * OC >= (i64{1} << 16))
            for (i64 o = 0; o < OC; o++)
                for (i64 t = 0; t < BT; t++) dt_[o * BT + t] = dout[t * OC + o];
            dweight_done =
                run({OC, C, BT, BT, 1, C, 1, dt::f32, false, true}, dt_, inp, dweight, nullptr);
        }
    }
    if (dinp_done && dweight_done) return;
    // sgemm: the fp32 kernels on the widened operands.
    float* di = nullptr;
    if (!dinp_done) {
        di = grow(tl_c, BT * C);
        widen_bf16(nx.isa, di, dinp, BT * C);
    }
    float* x = nullptr;
    if (!dweight_done) {
        x = grow(tl_a, BT * C);
        widen_bf16(nx.isa, x, inp, BT * C);
    }
    float* w = nullptr;
    if (!dinp_done) {
        w = grow(tl_w, OC * C);
        round_bf16(nx.isa, w, weight, OC * C);
    }
    matmul_backward(nx, di, dweight_done ? nullptr : dweight, nullptr, widened_dout(), x, w, BT, C,
                    OC);
    if (di != nullptr) narrow_bf16(nx.isa, dinp, di, BT * C);
}

}  // namespace px::cpu
