// The backend table behind kernels/ops.h. Not for use outside kernels/.
//
// Index
//   Backend           the kernels of one backend: one entry per op direction (kernels/op_list.h),
//                     null where it has none
//   Acts, op_serves   the activation dtypes an op's kernels serve (op_list.h)
//   backend_from      a Backend whose entries are the static functions of a class, by name
//   op_of             the op an entry serves
//   Role, Operands    the part an operand plays in an op, and the dtype a backend wants for each
//   find_backend      the backend registered for a device, dtype and numerics mode (null: none)
//   last_dim, rows, row_stride   sizes read from an operand
//   cpu::f32_backend  the CPU fp32 backend (kernels/cpu/backend.cpp)
//   cpu::bf16_backend bf16 activations computed by the fp32 kernels (kernels/cpu/bf16_backend.cpp)
//   cpu::f16_backend  fp16 activations, the same template (kernels/cpu/bf16_backend.cpp)
//   cpu::bf16_fast_backend  bf16 in fast mode: oneDNN's bf16 matmuls or sgemm (matmul_bf16.h)
//
// ops.cpp checks every operand (shapes, device, dtype, layout) before it calls an entry, so an
// entry only reads its sizes from the tensors and runs. A backend is keyed by the dtype of its
// activations; its other operands may differ (bf16 activations with fp32 LayerNorm statistics and
// weight gradients), as its Operands say. A backend serves any set of (device, dtype, mode) keys:
// the CPU fp32 kernels handle both modes themselves; a cuBLAS backend would register for fast
// mode only. Adding a backend or a dtype is a class with one static function per entry of
// op_list.h whose op serves its activation dtype, its Backend value from backend_from, and its
// lines in kRegistry (backend.cpp). The members of Backend come from op_list.h, so a new op
// adds no line here (the steps: kernels/ops.h).
#pragma once
#include "kernels/ops.h"

#include <string>
#include <type_traits>

namespace px::ops {

// The dtype a backend wants for each role an operand plays (ops.cpp tags every operand):
//   act     activations and their gradients (the dtype of the key: precision.activations)
//   weight  parameters read by the forward and backward (master weights, or a cast copy)
//   grad    weight gradients, accumulated over microbatches (fp32 under the numerics contract)
//   acc     sums kept in fp32 whatever the activations: LayerNorm statistics, losses, a
//           softmax's row statistics, gemm partials of a canonical tree
//   master  optimizer state and the master weights it updates
enum class Role : std::uint8_t { act, weight, grad, acc, master };
const char* role_name(Role r);
struct Operands {
    DType act = DType::f32, weight = DType::f32, grad = DType::f32, acc = DType::f32,
          master = DType::f32;
    DType of(Role r) const;
};

// The activation dtypes an op's kernels serve (op_list.h): every backend's, or fp32's only.
enum class Acts : std::uint8_t { any, f32 };
inline constexpr Acts kOpActs[] = {
#define PX_OP(op, acts) Acts::acts,
#include "kernels/op_list.h"
};
constexpr bool op_serves(Op op, DType act) {
    return kOpActs[static_cast<size_t>(op)] == Acts::any || act == DType::f32;
}

struct Backend {
    const char* name;   // "cpu f32"
    Operands operands;  // the dtype of each role; a backend's key dtype is operands.act
    // One function pointer per entry of op_list.h, named after it:
    //   void (*matmul_forward)(const Numerics&, const Tensor& out, ...);
#define PX_ENTRY(op, entry, ret, params) ret(*entry) params = nullptr;
#include "kernels/op_list.h"
    // Which kernel runs the matmuls in nx's mode, on which hardware path (ops::matmul_path).
    std::string (*matmul_path)(const Numerics&) = nullptr;

    bool has(Op op) const;  // every entry of op is there
};

// The Backend whose entries are K's static functions named after them, for every op that serves
// K's activation dtype (op_serves; the others' are null), with K::operands and K::matmul_path. A
// K lacking an entry of an op it serves does not compile: each backend says.
template <class K>
constexpr Backend backend_from(const char* name) {
    Backend b{.name = name, .operands = K::operands};
#define PX_ENTRY(op, entry, ret, params) \
    if constexpr (op_serves(Op::op, K::operands.act)) b.entry = K::entry;
#include "kernels/op_list.h"
    b.matmul_path = K::matmul_path;
    return b;
}

// The op an entry serves: op_of(&Backend::gelu_backward) is Op::gelu (Op::kCount for none).
template <class Fn>
constexpr Op op_of(Fn Backend::*entry) {
    // Only entries of entry's type compare with it.
#define PX_ENTRY(op, name, ret, params)              \
    if constexpr (std::is_same_v<Fn, ret(*) params>) \
        if (entry == &Backend::name) return Op::op;
#include "kernels/op_list.h"
    return Op::kCount;
}

const Backend* find_backend(Device device, DType dtype, Mode mode);

inline i64 last_dim(const Tensor& t) {
    return t.shape[t.ndim - 1];
}
// The product of the leading dimensions (BT), also when the last one is empty.
inline i64 rows(const Tensor& t) {
    i64 n = 1;
    for (int d = 0; d + 1 < t.ndim; d++) n *= t.shape[d];
    return n;
}
// The distance, in elements, between the rows of t that its first `lead` dimensions make (the
// other dimensions contiguous within a row, the rows one stride apart: ops.cpp checks): the
// stride of the innermost of those dimensions that has more than one element; a row's size when
// there is one row. A contiguous tensor's is its row size; a column slice's, the whole row's.
inline i64 row_stride(const Tensor& t, int lead) {
    for (int d = lead - 1; d >= 0; d--)
        if (t.shape[d] > 1) return t.strides[d];
    i64 n = 1;
    for (int d = lead; d < t.ndim; d++) n *= t.shape[d];
    return n;
}

}  // namespace px::ops

namespace px::cpu {
extern const ops::Backend f32_backend;
extern const ops::Backend bf16_backend;  // bf16 activations on the fp32 kernels
extern const ops::Backend f16_backend;   // fp16 activations on the fp32 kernels
extern const ops::Backend bf16_fast_backend;  // bf16, fast mode: oneDNN bf16 or sgemm matmuls
}  // namespace px::cpu
