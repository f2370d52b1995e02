// The ops of kernels/ops.h, each declared once: the op and the activation dtypes its kernels
// serve, then one line per entry (a direction a backend provides: matmul has a forward and a
// backward, gemm a single entry) with its signature. Generated from this list: the Op enum and
// op_name (ops.h), the members of Backend, Backend::has (an op is there when all its entries
// are), op_serves and backend_from, which fills a backend's table from functions named after the
// entries, for the ops its activation dtype is served (backend.h), so ops::supports answers from
// here.
//
// Index
//   PX_OP(op, acts)                        an op of the Op enum, by the name reports give it, and
//                                          the activations it serves: any (every backend has it)
//                                          or f32 (only fp32 activations' backends)
//   PX_ENTRY(op, entry, return, (params))  one of op's entries: its signature is that of the
//                                          public function of the same name in ops.h (checked
//                                          at compile time, ops.cpp); the names only document
//
// An X-macro list: a use defines PX_OP, PX_ENTRY or both, then includes this file, which expands
// every line through them (one left undefined expands to nothing) and undefines both. So it has
// no include guard, and is included where the expansion goes: inside an enum, a struct, a
// function.

#ifndef PX_OP
#define PX_OP(op, acts)
#endif
#ifndef PX_ENTRY
#define PX_ENTRY(op, entry, ret, params)
#endif

PX_OP(matmul, any)
PX_ENTRY(matmul, matmul_forward, void,
         (const Numerics&, const Tensor& out, const Tensor& inp, const Tensor& weight,
          const Tensor* bias))
PX_ENTRY(matmul, matmul_backward, void,
         (const Numerics&, const Tensor* dinp, const Tensor* dweight, const Tensor* dbias,
          const Tensor& dout, const Tensor& inp, const Tensor& weight))

PX_OP(gemm, any)
PX_ENTRY(gemm, gemm, void,
         (const Numerics&, const Tensor& c, const Tensor& a, const Tensor& b, bool accumulate))

PX_OP(layernorm, any)
PX_ENTRY(layernorm, layernorm_forward, void,
         (const Numerics&, const Tensor& out, const Tensor& mean, const Tensor& rstd,
          const Tensor& inp, const Tensor& weight, const Tensor& bias))
PX_ENTRY(layernorm, layernorm_backward, void,
         (const Numerics&, const Tensor* dinp, const Tensor* dweight, const Tensor* dbias,
          const Tensor& dout, const Tensor& inp, const Tensor& weight, const Tensor& mean,
          const Tensor& rstd))

PX_OP(rmsnorm, any)
PX_ENTRY(rmsnorm, rmsnorm_forward, void,
         (const Numerics&, const Tensor& out, const Tensor& rstd, const Tensor& inp,
          const Tensor& weight, float eps))
PX_ENTRY(rmsnorm, rmsnorm_backward, void,
         (const Numerics&, const Tensor* dinp, const Tensor* dweight, const Tensor& dout,
          const Tensor& inp, const Tensor& weight, const Tensor& rstd))

PX_OP(gelu, any)
PX_ENTRY(gelu, gelu_forward, void, (const Numerics&, const Tensor& out, const Tensor& inp))
PX_ENTRY(gelu, gelu_backward, void,
         (const Numerics&, const Tensor& dinp, const Tensor& inp, const Tensor& dout))

PX_OP(swiglu, any)
PX_ENTRY(swiglu, swiglu_forward, void,
         (const Numerics&, const Tensor& out, const Tensor& gate, const Tensor& up))
PX_ENTRY(swiglu, swiglu_backward, void,
         (const Numerics&, const Tensor& dgate, const Tensor& dup, const Tensor& gate,
          const Tensor& up, const Tensor& dout))

PX_OP(rope, any)
PX_ENTRY(rope, rope_table, void,
         (const Numerics&, const Tensor& cos, const Tensor& sin, double theta,
          const ops::RopeScaling& scaling))
PX_ENTRY(rope, rope_forward, void,
         (const Numerics&, const Tensor& out, const Tensor& inp, const Tensor& cos,
          const Tensor& sin, const i64* pos))
PX_ENTRY(rope, rope_backward, void,
         (const Numerics&, const Tensor& dinp, const Tensor& dout, const Tensor& cos,
          const Tensor& sin, const i64* pos))

PX_OP(attention, any)
PX_ENTRY(attention, attention_forward, void,
         (const Numerics&, const Tensor& out, const Tensor& preatt, const Tensor& att,
          const Tensor& qkv, i64 NH))
PX_ENTRY(attention, attention_backward, void,
         (const Numerics&, const Tensor& dqkv, const Tensor& dpreatt, const Tensor& datt,
          const Tensor& dout, const Tensor& qkv, const Tensor& att, i64 NH))

PX_OP(attention_queries, f32)  // context parallelism runs fp32 activations for now
PX_ENTRY(attention_queries, attention_queries_scores, void,
         (const Numerics&, const Tensor& preatt, const Tensor& q, const Tensor& kv, const i64* pos,
          i64 key_lo, i64 key_hi, i64 NH))
PX_ENTRY(attention_queries, attention_queries_softmax, void,
         (const Numerics&, const Tensor& out, const Tensor& preatt, const Tensor& att,
          const Tensor& kv, const i64* pos, i64 NH))
PX_ENTRY(attention_queries, attention_queries_backward, void,
         (const Numerics&, const Tensor& dq, const Tensor& parts, const Tensor& dpreatt,
          const Tensor& datt, const Tensor& dout, const Tensor& q, const Tensor& kv,
          const Tensor& att, const i64* pos, const i64* node_lo, const i64* node_hi, i64 K, i64 NH))

PX_OP(residual, any)
PX_ENTRY(residual, residual_forward, void,
         (const Numerics&, const Tensor& out, const Tensor& a, const Tensor& b))
PX_ENTRY(residual, residual_backward, void,
         (const Numerics&, const Tensor& da, const Tensor& db, const Tensor& dout))

PX_OP(embedding, any)
PX_ENTRY(embedding, embedding_forward, void,
         (const Numerics&, const Tensor& out, const int* tokens, const Tensor& wte,
          const Tensor& wpe))
PX_ENTRY(embedding, embedding_backward, void,
         (const Numerics&, const Tensor* dwte, const Tensor* dwpe, const Tensor& dout,
          const int* tokens, i64 row_lo, i64 row_hi))

PX_OP(crossentropy, any)
PX_ENTRY(crossentropy, crossentropy_forward, void,
         (const Numerics&, const Tensor& losses, const Tensor& probs, const Tensor& logits,
          const int* targets))
PX_ENTRY(crossentropy, crossentropy_backward, void,
         (const Numerics&, const Tensor& dlogits, const Tensor& probs, const int* targets,
          float dloss))

PX_OP(row_max, any)
PX_ENTRY(row_max, row_max, void, (const Numerics&, const Tensor& out, const Tensor& x))

PX_OP(exp_sub, any)
PX_ENTRY(exp_sub, exp_sub, void,
         (const Numerics&, const Tensor& out, const Tensor& x, const Tensor& shift))

PX_OP(row_sum, any)
PX_ENTRY(row_sum, row_sum, void, (const Numerics&, const Tensor& out, const Tensor& x))

PX_OP(adamw, f32)  // on the fp32 master weights and moments, whatever the activations
PX_ENTRY(adamw, adamw_update, void,
         (const Numerics&, const Tensor& param, const Tensor& m, const Tensor& v,
          const Tensor& grad, const ops::AdamWStep& s))

PX_OP(sum_squares, f32)  // of fp32 gradients and weights
PX_ENTRY(sum_squares, sum_squares, float, (const Numerics&, const Tensor& x))
PX_ENTRY(sum_squares, sum_squares_blocks, void,
         (const Numerics&, const Tensor& part, const Tensor& x))

#undef PX_OP
#undef PX_ENTRY
