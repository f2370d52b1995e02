// The scalar table: the vecmath templates on one float at a time. Also vecmath(isa), the
// dispatcher, which is generic code.
#define PX_VECMATH_IMPL
#include "kernels/cpu/vecmath.h"

#include "core/base/error.h"

#include <string>

namespace px::cpu {
namespace scalar {
namespace {

// Scalar arithmetic from core/base/mathfun.h plus the memory operations of the vecmath templates.
struct Ops : mathfun::ScalarOps {
    static F load(const float* p) { return *p; }
    static void store(float* p, F v) { *p = v; }
    static F load_n(const float* p, i64 k) { return k > 0 ? *p : 0.0f; }
    static void store_n(float* p, F v, i64 k) {
        if (k > 0) *p = v;
    }
    static I iload(const int32_t* p) { return static_cast<uint32_t>(*p); }
    static M igt(I a, I b) { return static_cast<int32_t>(a) > static_cast<int32_t>(b); }
    static F gather(const float* base, I idx) { return base[static_cast<int32_t>(idx)]; }
    static F mask_gather(const float* base, I idx, M m) {
        return m ? base[static_cast<int32_t>(idx)] : 0.0f;
    }
    static void transpose(F* /*r*/) {}  // one lane
};

}  // namespace

const VecMath table = impl::make_table<Ops>(Isa::scalar);

}  // namespace scalar

const VecMath& vecmath(Isa isa) {
    static const Isa best = detect_isa();
    if (static_cast<int>(isa) > static_cast<int>(best))
        throw Error(std::string("numerics.isa = ") + isa_name(isa) +
                    " is not supported by this CPU (best: " + isa_name(best) + "); choose " +
                    isa_name(best) + " or scalar");
    switch (isa) {
        case Isa::avx2:
            return avx2::table;
        case Isa::avx512:
            return avx512::table;
        case Isa::scalar:
            break;
    }
    return scalar::table;
}

}  // namespace px::cpu
