// Low precision from Python: the library's narrow dtypes as numpy dtypes (bf16, fp8 e4m3 and e5m2
// through ml_dtypes; fp16 is numpy's own), its casts (core/base/dtype.h), the fp8 casts of the
// two recipes with their codes and scales (core/model/fp8.h), and the fp8 scaling state.
//
// What the library holds narrow, and so what comes back narrow: activations and their gradients
// under precision.activations = "bf16" or "fp16" (probes of them, Job.probe). Master weights,
// gradients, Adam moments, scales and amax histories are fp32. No fp8 byte is kept anywhere: an
// fp8 cast is read back to fp32 at once (core/model/fp8.h), so the fp8 arrays here are the codes
// behind a cast, made by the library's own encoder beside the read-back it computes.
#include "bindings/common.h"

#include "core/base/error.h"
#include "core/io/checkpoint.h"
#include "kernels/ops.h"

#include <cstring>

namespace px::py_bind {

namespace {

py::module_ ml_dtypes() {
    try {
        return py::module_::import("ml_dtypes");
    } catch (py::error_already_set&) {
        throw Error("bf16 and fp8 arrays need the Python package ml_dtypes: pip install ml_dtypes");
    }
}

DType dtype_named(const py::handle& name_or_dtype) {
    std::string name =
        py::isinstance<py::str>(name_or_dtype)
            ? name_or_dtype.cast<std::string>()
            : py::str(py::dtype::from_args(py::reinterpret_borrow<py::object>(name_or_dtype))
                          .attr("name"))
                  .cast<std::string>();
    if (name == "float32" || name == "fp32") return DType::f32;
    if (name == "bfloat16") return DType::bf16;
    if (name == "float16" || name == "fp16") return DType::f16;
    if (name == "float8_e4m3fn") return DType::e4m3;
    if (name == "float8_e5m2") return DType::e5m2;
    if (const std::optional<DType> t = dtype_from_name(name)) return *t;
    throw ConfigError("dtype \"" + name +
                      "\" is not one of the library's: f32 (float32), bf16 (bfloat16), f16 "
                      "(float16), e4m3 (float8_e4m3fn), e5m2 (float8_e5m2)");
}

Fp8Scaling::Role role_named(const std::string& role) {
    for (int r = 0; r < Fp8Scaling::kRoles; r++)
        if (role == Fp8Scaling::kRoleNames[r]) return static_cast<Fp8Scaling::Role>(r);
    throw ConfigError("role = \"" + role +
                      "\": write \"x\" (an input), \"w\" (a weight) or \"dy\" " +
                      "(an output gradient)");
}

std::vector<py::ssize_t> dims_of(const std::vector<i64>& shape) {
    return std::vector<py::ssize_t>(shape.begin(), shape.end());
}

py::array_t<float> floats(const std::vector<float>& v, const std::vector<i64>& shape) {
    py::array_t<float> a(dims_of(shape));
    std::copy(v.begin(), v.end(), a.mutable_data());
    return a;
}

}  // namespace

py::dtype numpy_dtype(DType t) {
    switch (t) {
        case DType::f32:
            return py::dtype::of<float>();
        case DType::f16:
            return py::dtype("float16");
        case DType::bf16:
            return py::dtype::from_args(ml_dtypes().attr("bfloat16"));
        case DType::e4m3:
            return py::dtype::from_args(ml_dtypes().attr("float8_e4m3fn"));
        case DType::e5m2:
            return py::dtype::from_args(ml_dtypes().attr("float8_e5m2"));
    }
    throw InternalError("numpy_dtype of an unknown dtype");
}

py::array narrowed(const float* v, const std::vector<i64>& shape, DType t) {
    py::array a(numpy_dtype(t), dims_of(shape));
    convert(a.mutable_data(), t, v, DType::f32, static_cast<size_t>(a.size()));
    return a;
}

py::dict fp8_cast_dict(const float* x, const std::vector<i64>& shape, bool delayed,
                       Fp8Scaling::Role role, float scale, i64 block) {
    i64 n = 1;
    for (const i64 d : shape) n *= d;
    const i64 K = shape.empty() ? 1 : shape.back(), R = K > 0 ? n / K : 0;
    Tensor src;
    src.data = const_cast<float*>(x);
    src.ndim = 2;
    src.shape = {R, K, 0, 0};
    src.strides = {K, 1, 0, 0};
    const Numerics nx;  // this CPU's vector path: the bits of every path (kernels/ops.h)
    std::vector<float> values(static_cast<size_t>(n));
    std::vector<std::uint8_t> q(static_cast<size_t>(n));
    py::dict d;
    if (delayed) {
        const DType t = role == Fp8Scaling::dy ? DType::e5m2 : DType::e4m3;
        if (!(scale > 0.0f) || !std::isfinite(scale))
            throw ConfigError("fp8_cast: scale = " + std::to_string(scale) +
                              " must be finite and > 0");
        const float inv = 1.0f / scale;
        bool nan = false;
        const float amax = ops::fake_quant(nx, values.data(), src, t, scale, inv, &nan);
        fp8_encode(q.data(), x, n, t, scale);
        py::array codes(numpy_dtype(t), dims_of(shape));
        std::memcpy(codes.mutable_data(), q.data(), q.size());
        d["q"] = codes;
        d["scale"] = py::array_t<float>(std::vector<py::ssize_t>{}, &scale);
        d["scale_inv"] = py::array_t<float>(std::vector<py::ssize_t>{}, &inv);
        d["amax"] = amax;
        d["nan"] = nan;
    } else {
        if (block < 1)
            throw ConfigError("fp8_cast: block_size = " + std::to_string(block) +
                              " must be at least 1");
        const i64 band = role == Fp8Scaling::w ? block : 1;
        ops::fake_quant_tiles(nx, values.data(), src, band, block);
        const i64 tr = (R + band - 1) / band, tk = (K + block - 1) / block;
        py::array_t<float> scales({static_cast<py::ssize_t>(tr), static_cast<py::ssize_t>(tk)});
        py::array_t<float> inv({static_cast<py::ssize_t>(tr), static_cast<py::ssize_t>(tk)});
        fp8_encode_tiles(q.data(), scales.mutable_data(), x, R, K, band, block);
        for (py::ssize_t i = 0; i < scales.size(); i++)
            inv.mutable_data()[i] = 1.0f / scales.data()[i];
        py::array codes(numpy_dtype(DType::e4m3), dims_of(shape));
        std::memcpy(codes.mutable_data(), q.data(), q.size());
        d["q"] = codes;
        d["scale"] = scales;
        d["scale_inv"] = inv;
        d["tile"] = py::make_tuple(band, block);
    }
    d["values"] = floats(values, shape);
    return d;
}

py::object fp8_state_dict(const Fp8Scaling* f, const py::handle& owner) {
    if (!f) return py::none();
    py::dict d;
    py::list names;
    for (int g = 0; g < f->gemms(); g++) names.append(f->gemm(g).name);
    d["recipe"] = f->delayed() ? "delayed" : "block";
    d["gemms"] = names;
    d["roles"] = py::make_tuple("x", "w", "dy");
    py::list dtypes;
    py::array_t<float> maxes(Fp8Scaling::kRoles);
    for (int r = 0; r < Fp8Scaling::kRoles; r++) {
        const auto role = static_cast<Fp8Scaling::Role>(r);
        dtypes.append(
            numpy_dtype(f->delayed() && role == Fp8Scaling::dy ? DType::e5m2 : DType::e4m3));
        maxes.mutable_data()[r] = f->fp8_max(role);
    }
    d["dtypes"] = py::tuple(dtypes);
    d["fp8_max"] = maxes;
    d["block_size"] = f->block_size();
    if (!f->delayed()) {
        d["scale"] = py::none();
        d["amax_history"] = py::none();
        return d;
    }
    const auto g = static_cast<py::ssize_t>(f->gemms()),
               H = static_cast<py::ssize_t>(f->history_len());
    auto view = [&](const std::vector<float>& v, std::vector<py::ssize_t> dims) {
        py::array a(py::dtype::of<float>(), dims, {}, v.data(), owner);
        py::detail::array_proxy(a.ptr())->flags &= ~py::detail::npy_api::NPY_ARRAY_WRITEABLE_;
        return a;
    };
    d["history_len"] = f->history_len();
    d["scale"] = view(f->scales(), {g, Fp8Scaling::kRoles});
    d["amax_history"] = view(f->histories(), {g, Fp8Scaling::kRoles, H});
    return d;
}

py::object fp8_checkpoint_dict(const CheckpointMeta& m, const Config* cfg) {
    if (m.fp8_gemms == 0) return py::none();
    py::dict d;
    const auto g = static_cast<py::ssize_t>(m.fp8_gemms),
               H = static_cast<py::ssize_t>(m.fp8_history_len);
    py::array_t<float> scale({g, static_cast<py::ssize_t>(Fp8Scaling::kRoles)});
    py::array_t<float> hist({g, static_cast<py::ssize_t>(Fp8Scaling::kRoles), H});
    std::copy(m.fp8_scale.begin(), m.fp8_scale.end(), scale.mutable_data());
    std::copy(m.fp8_history.begin(), m.fp8_history.end(), hist.mutable_data());
    py::list names;
    if (cfg) {
        const Fp8Scaling f(cfg->model, cfg->precision);
        if (f.gemms() == m.fp8_gemms)
            for (int k = 0; k < f.gemms(); k++) names.append(f.gemm(k).name);
    }
    d["gemms"] = names;
    d["roles"] = py::make_tuple("x", "w", "dy");
    d["history_len"] = m.fp8_history_len;
    d["scale"] = scale;
    d["amax_history"] = hist;
    return d;
}

void bind_precision(py::module_& m) {
    m.def(
        "numpy_dtype",
        [](const std::string& name) { return numpy_dtype(dtype_named(py::str(name))); },
        py::arg("name"), R"doc(
The numpy dtype of one of the library's dtypes: "f32" float32, "bf16" ml_dtypes.bfloat16, "f16"
float16, "e4m3" ml_dtypes.float8_e4m3fn, "e5m2" ml_dtypes.float8_e5m2.)doc");

    m.def(
        "cast",
        [](const py::array& x, const py::object& dtype) {
            const DType from = dtype_named(x.dtype()), to = dtype_named(dtype);
            const py::array src = py::array::ensure(x, py::array::c_style);
            std::vector<py::ssize_t> dims(src.shape(), src.shape() + src.ndim());
            py::array out(numpy_dtype(to), dims);
            convert(out.mutable_data(), to, src.data(), from, static_cast<size_t>(src.size()));
            return out;
        },
        py::arg("x"), py::arg("dtype"), R"doc(
x cast to dtype by the library's own conversions (core/base/dtype.h), as a new array of that
numpy dtype: x and dtype are any of float32, bfloat16, float16, float8_e4m3fn, float8_e5m2
(numpy dtypes or the names "f32", "bf16", "f16", "e4m3", "e5m2"). Narrowing rounds to nearest even,
once (through the exact fp32 value); widening is exact. Where the rules differ from ml_dtypes'
astype: e4m3 and e5m2 saturate (a finite value beyond the largest, or an infinity, becomes
±448 or ±57344) where ml_dtypes gives NaN (e4m3fn) or ±inf (e5m2); bf16 and fp16 overflow to
±inf as ml_dtypes does, and for every other value the bits are ml_dtypes'.)doc");

    m.def(
        "fp8_cast",
        [](const py::array_t<float, py::array::c_style | py::array::forcecast>& x,
           const std::string& recipe, const std::string& role, float scale, i64 block_size) {
            if (recipe != "delayed" && recipe != "block")
                throw ConfigError("recipe = \"" + recipe + "\": write \"delayed\" or \"block\"");
            if (recipe == "block" && x.ndim() == 0)
                throw ConfigError(
                    "fp8_cast: a block-wise cast needs an array of at least one dimension");
            std::vector<i64> shape(x.shape(), x.shape() + x.ndim());
            return fp8_cast_dict(x.data(), shape, recipe == "delayed", role_named(role), scale,
                                 block_size);
        },
        py::arg("x"), py::kw_only(), py::arg("recipe") = "delayed", py::arg("role") = "x",
        py::arg("scale") = 1.0f, py::arg("block_size") = 128, R"doc(
x (any float array; bf16 widens exactly) cast to fp8 as the library's fp8 matmuls cast it
(core/model/fp8.h). A dict:
  q          the fp8 codes, x's shape: ml_dtypes.float8_e4m3fn, or float8_e5m2 for a delayed
             output gradient (role "dy")
  scale      the scale x was multiplied by before the cast (float32): delayed, a 0-d array (the
             one given: Job.fp8_state()["scale"][gemm, role] is the next step's); block, one per
             tile, shape (ceil(R / band), ceil(K / block_size)) for x seen as (R, K), K its last
             dimension: tiles of 1 × block_size (role "x" or "dy") or block_size × block_size
             (role "w"), each scaled by 448 / amax(tile) (1 for a tile of zeros or holding an inf
             or a NaN)
  scale_inv  1 / scale in fp32, the factor the cast is read back with
  values     the library's read-back, float32: what the matmul computes with, q · scale_inv bit
             for bit (the library's vector cast, kernels/ops.h fake_quant)
  amax       delayed: max |x| over values that are not NaN (what the step's amax records);
  nan        whether x holds a NaN (its scale would be kept)
  tile       block: (band, block_size)
The codes round to nearest even and saturate (OCP): a product beyond the largest finite value,
or an infinity, gives ±448 (e4m3) or ±57344 (e5m2), where ml_dtypes' astype gives NaN or ±inf.
The library keeps no fp8 bytes: this shows the codes behind its read-back.)doc");
}

}  // namespace px::py_bind
