#include "core/model/model.h"

#include "core/model/block.h"
#include "core/model/layer_ops.h"
#include "core/model/model_rows.h"

#include "core/base/error.h"
#include "core/base/rng.h"
#include "core/base/widened.h"
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace px {

namespace {

i64 align16(i64 n) {
    return (n + 15) / 16 * 16;
}

}  // namespace

// ---- parameters ------------------------------------------------------------------------------

GPT::GPT(const ModelConfig& mc, const Numerics& nx) : GPT(mc, nx, ModelPart::whole(mc)) {}

GPT::GPT(const ModelConfig& mc, const Numerics& nx, const ModelPart& part)
    : GPT(mc, nx, part, nullptr) {}

GPT::GPT(const ModelConfig& mc, const Numerics& nx, const ModelPart& part,
         std::shared_ptr<const ParallelLayers> layers, DType activations)
    : mc_(mc),
      nx_(nx),
      part_(part),
      layers_(std::move(layers)),
      sp_(layers_ && layers_->sequence_parallel()),
      dims_(part.expert_dims(layers_ ? layers_->dims() : TpDims{})),
      act_dtype_(activations),
      table_(ParamTable::build(mc, part, dims_)) {
    PX_ASSERT(!part_.chunks.empty(), "a model part needs at least one chunk of layers");
    if (layers_ && !layers_->carries(act_dtype_))
        throw ConfigError(std::string("precision.activations: the parallel layers of this layout "
                                      "do not carry ") +
                          dtype_name(act_dtype_) + " activations; use fp32");
    glayout_.head_offset = table_.total;
    glayout_.total = table_.total +
                     (part_.head_region() ? align16(resolve_dim(Dim::V, mc, dims_) * mc.hidden) : 0);
    params_ = Arena(bytes_of(DType::f32, table_.total));
    if (mc_.llama()) {  // RoPE's table, once: the same bits on every rank (core/base/mathfun.h)
        const i64 h = mc_.head_size() / 2;
        rope_.assign(static_cast<size_t>(2 * mc_.seq_len * h), 0.0f);
        ops::RopeScaling scaling;
        scaling.factor = mc_.rope_factor;
        scaling.low_freq_factor = mc_.rope_low_freq_factor;
        scaling.high_freq_factor = mc_.rope_high_freq_factor;
        scaling.original_max_position_embeddings =
            static_cast<double>(mc_.rope_original_max_positions);
        ops::rope_table(nx_, rope_cos(), rope_sin(), mc_.rope_theta, scaling);
    }
}

Tensor GPT::rope_cos() const {
    const i64 h = mc_.head_size() / 2;
    return view_f32(rope_.data(), {mc_.seq_len, h}, "rope_cos");
}

Tensor GPT::rope_sin() const {
    const i64 h = mc_.head_size() / 2;
    return view_f32(rope_.data() + mc_.seq_len * h, {mc_.seq_len, h}, "rope_sin");
}

void GPT::set_experts(std::shared_ptr<const ExpertLayers> experts) {
    PX_ASSERT(!experts || (mc_.is_moe() && !part_.all_experts() &&
                           mc_.moe_experts / experts->size() == dims_.experts &&
                           part_.expert_lo == experts->rank() * dims_.experts),
              "expert layers need a MoE model part holding its rank's share of the experts");
    experts_ = std::move(experts);
}

bool GPT::expert_tensor(const TableEntry& e) {
    const int p = e.spec - kFirstLayerSpec;
    return e.layer >= 0 && ((p >= EFCW && p <= EPROJB) || p == EUPW);
}

i64 GPT::expert_row_offset(const TableEntry& e) const {
    if (!expert_tensor(e) || part_.all_experts()) return 0;
    return part_.expert_lo * (e.rows / dims_.experts);
}

void GPT::wrap_parallel_layers(const LayersWrap& wrap) {
    layers_ = wrap(layers_);
    PX_ASSERT(layers_ != nullptr && (sp_ == layers_->sequence_parallel()),
              "a wrap of the parallel layers must delegate to them");
}

Tensor GPT::param(int i) const {
    const TableEntry& e = table_.entries[i];
    Tensor t = e.is_vector() ? view_f32(params_.f32() + e.offset, {e.cols})
                             : view_f32(params_.f32() + e.offset, {e.rows, e.cols});
    t.name = e.name.c_str();
    t.id = e.id;
    return t;
}

Tensor GPT::grad(float* grads, int i) const {
    Tensor t = param(i);
    t.data = grads + table_.entries[i].offset;
    return t;
}

Tensor GPT::grad_head(float* grads) const {
    PX_ASSERT(part_.holds_wte(), "grad_head of a model part without wte");
    return view_f32(grads + glayout_.head_offset, {resolve_dim(Dim::V, mc_, dims_), mc_.hidden},
                    "lm_head(wte)");
}

Tensor GPT::head_weight() const {
    return param(part_.tied ? table_.wte : table_.lm_head);
}

float* GPT::param_ptr(const std::string& name) const {
    const int i = table_.find(name);
    return i < 0 ? nullptr : params_.f32() + table_.entries[i].offset;
}

void GPT::init_random(std::uint64_t seed, double init_std) {
    // GPT-2: weights N(0, std), residual projections N(0, std/sqrt(2L)), biases 0, norms 1.
    const double residual_std = init_std / std::sqrt(2.0 * static_cast<double>(mc_.layers));
    for (const TableEntry& e : table_.entries) {
        float* p = params_.f32() + e.offset;
        const u32 id = static_cast<u32>(e.id);
        // A shard draws its slice of the whole tensor's numbers (same ids, logical indices).
        auto normal = [&](double std) {
            if (expert_tensor(e))  // experts are never tp-split: rows of the stacked tensor
                fill_normal(p, e.numel(), 0.0f, static_cast<float>(std), seed, id,
                            static_cast<u64>(expert_row_offset(e) * e.cols));
            else if (layers_)
                layers_->fill_normal(p, e, static_cast<float>(std), seed);
            else
                fill_normal(p, e.numel(), 0.0f, static_cast<float>(std), seed, id, 0);
        };
        switch (kParams[e.spec].init) {
            case ParamSpec::normal:
                normal(init_std);
                break;
            case ParamSpec::residual_normal:
                normal(residual_std);
                break;
            case ParamSpec::zeros:
                std::fill(p, p + e.numel(), 0.0f);
                break;
            case ParamSpec::ones:
                std::fill(p, p + e.numel(), 1.0f);
                break;
        }
    }
}

// ---- chunks ----------------------------------------------------------------------------------

Activations GPT::make_activations(int chunk, i64 B, i64 T, bool recompute) const {
    PX_ASSERT(chunk >= 0 && chunk < num_chunks(), "chunk out of range");
    if (T > mc_.seq_len)
        throw ConfigError("a sequence of " + std::to_string(T) +
                          " tokens exceeds model.seq_len = " + std::to_string(mc_.seq_len));
    ActShape shape;
    shape.B = B;
    shape.T = T;
    shape.layers = part_.chunks[static_cast<size_t>(chunk)].size();
    shape.head = has_head(chunk);
    shape.recompute = recompute;
    shape.tp = dims_;
    shape.expert_sources = experts_ ? experts_->size() : 1;
    shape.dtype = act_dtype_;
    if (context_) shape.keys = context_->keys(T);
    return Activations(mc_, shape);
}

namespace {
// Entries first..last of a table (consecutive), with the padding after the last.
GradSpan entry_span(const ParamTable& t, int first, int last) {
    const TableEntry& e = t.entries[static_cast<size_t>(last)];
    return {t.entries[static_cast<size_t>(first)].offset, e.offset + align16(e.numel())};
}
}  // namespace

std::vector<GradSpan> GPT::unit_params(Unit u) const {
    switch (u.kind) {
        case Unit::embedding:
            return {entry_span(table_, table_.wte, table_.embedding_last())};
        case Unit::head:
            if (!part_.tied) return {entry_span(table_, table_.lnfw, table_.head_last())};
            return {entry_span(table_, table_.wte, table_.wte),
                    entry_span(table_, table_.lnfw, table_.head_last())};
        default:
            break;
    }
    PX_ASSERT(table_.has_layer(u.layer), "a block this model part does not hold");
    const size_t l = static_cast<size_t>(u.layer);
    return {entry_span(table_, table_.layer_first[l], table_.layer_last[l])};
}

std::vector<GradSpan> GPT::unit_grads(Unit u) const {
    if (u.kind != Unit::head || !part_.tied) return unit_params(u);
    return {entry_span(table_, table_.lnfw, table_.head_last()),
            {glayout_.head_offset, glayout_.total}};
}

GradSpan GPT::grad_span(int chunk) const {
    PX_ASSERT(chunk >= 0 && chunk < num_chunks(), "chunk out of range");
    // A chunk's tensors are consecutive entries of the table (embedding, its layers, ln_f).
    const LayerSpan layers = part_.chunks[static_cast<size_t>(chunk)];
    int first = has_embedding(chunk) ? table_.wte : -1, last = -1;
    if (layers.size() > 0) {
        if (first < 0) first = table_.layer_first[static_cast<size_t>(layers.lo)];
        last = table_.layer_last[static_cast<size_t>(layers.hi - 1)];
    }
    if (has_embedding(chunk)) last = std::max(last, table_.embedding_last());
    if (has_head(chunk)) {
        if (first < 0) first = table_.lnfw;
        last = table_.head_last();
    }
    GradSpan s;
    if (first < 0) return s;  // an empty chunk
    const TableEntry& e = table_.entries[static_cast<size_t>(last)];
    s.lo = table_.entries[static_cast<size_t>(first)].offset;
    s.hi = e.offset + align16(e.numel());
    if (has_head(chunk) && part_.tied) s.hi = glayout_.total;  // and the LM head's part of dwte
    return s;
}

// Context parallelism: each run of a sequence's rows is a sequence of its own whose positions
// start at the run's (a view of wpe from there), so the kernels, which take position t from the
// row, see logical positions. Without it, the whole tensor at once.
void GPT::embedding_forward(const Tensor& out, const int* tokens) const {
    // Llama has no wpe: a tensor without data (ops::embedding_forward adds no position)
    const Tensor wte = param(table_.wte), wpe = table_.wpe >= 0 ? param(table_.wpe) : Tensor{};
    auto run = [&](const Tensor& o, const int* tok, const Tensor& pe) {
        if (layers_)
            layers_->embedding_forward(o, tok, wte, pe);
        else
            ops::embedding_forward(nx_, o, tok, wte, pe);
    };
    if (!context_) return run(out, tokens, wpe);
    const i64 B = out.shape[0], T = out.shape[1], C = out.shape[2];
    for (i64 b = 0; b < B; b++)
        for (const PositionRun& r : context_->runs(T)) {
            const i64 n = r.hi - r.lo, row = b * T + r.lo;
            run(subview(out, row * C, {1, n, C}), tokens + row,
                wpe.data ? subview(wpe, r.pos * C, {n, C}) : wpe);
        }
}

// Over the rows [row_lo, row_hi) of one token node. Under context parallelism the node is a range
// [L0, L1) of the batch's flat tokens (it may run from one sequence's last chunk into the next
// one's first): its rows are placed at their flat places in whole sequences of scratch, so the
// kernel reads each token's logical position and sums the node's blocks as the single device.
void GPT::embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                             const int* tokens, i64 row_lo, i64 row_hi) const {
    auto run = [&](const Tensor& d, const int* tok, i64 lo, i64 hi) {
        if (layers_)
            layers_->embedding_backward(dwte, dwpe, d, tok, lo, hi);
        else
            ops::embedding_backward(nx_, &dwte, dwpe.data ? &dwpe : nullptr, d, tok, lo, hi);
    };
    if (!context_) return run(dout, tokens, row_lo, row_hi);
    const i64 Tl = dout.shape[1], C = dout.shape[2], T = context_->keys(Tl);
    const std::vector<PositionRun> runs = context_->runs(Tl);
    auto flat = [&](i64 row) {  // the row's token index in the microbatch's logical (B, T)
        const i64 b = row / Tl, w = row % Tl;
        for (const PositionRun& r : runs)
            if (w >= r.lo && w < r.hi) return b * T + r.pos + (w - r.lo);
        PX_ASSERT(false, "a row outside the context-parallel runs");
        return i64{0};
    };
    const i64 first = flat(row_lo), base = first / T * T, n = row_hi - row_lo;
    const i64 seqs = (first + n - base + T - 1) / T;
    std::vector<float> d(static_cast<size_t>(seqs * T * C), 0.0f);
    std::vector<int> tok(static_cast<size_t>(seqs * T), 0);
    for (i64 i = row_lo; i < row_hi; i++) {
        const i64 at = flat(i) - base;
        PX_ASSERT(at == first - base + (i - row_lo), "a token node that is not a flat token range");
        std::memcpy(d.data() + at * C, dout.f32() + i * C, static_cast<size_t>(C) * sizeof(float));
        tok[static_cast<size_t>(at)] = tokens[i];
    }
    run(view_f32(d.data(), {seqs, T, C}, "dencoded"), tok.data(), first - base, first - base + n);
}

LayerOps GPT::layer_ops(WeightGradQueue* defer) const {
    return LayerOps(*this, {.dims = dims_,
                            .layers = layers_.get(),
                            .sp = sp_,
                            .context = context_.get(),
                            .fp8 = fp8_.get(),
                            .probes = probes_,
                            .probe_ctx = probe_ctx_,
                            .defer = defer});
}

void GPT::forward(Activations& a, int chunk, const int* tokens, const int* targets) const {
    const Numerics& nx = nx_;
    const LayerOps ops = layer_ops();
    const MoeLayer moe(ops, experts_.get(), router_stats_);
    const std::unique_ptr<Block> block = make_block(ops, moe, logit_max_);
    const LayerSpan layers = part_.chunks[static_cast<size_t>(chunk)];
    PX_ASSERT(a.shape().layers == layers.size() && a.shape().head == has_head(chunk),
              "activations made for another chunk");
    if (has_embedding(chunk)) {
        before_forward({Unit::embedding});
        embedding_forward(a.tensor(ENCODED), tokens);
        ops.probe("fwd", -1, "embed", "out", a.tensor(ENCODED));
        after_forward({Unit::embedding});
    }
    for (int l = layers.lo; l < layers.hi; l++) {
        before_forward({Unit::block, l});
        block->forward(a, l, l - layers.lo);
        after_forward({Unit::block, l});
    }
    if (!has_head(chunk)) return;
    before_forward({Unit::head});
    const Tensor last = a.output();
    if (mc_.llama())
        ops.rmsnorm_forward(a.tensor(LNF), a.tensor(LNF_RSTD), last, param(table_.lnfw));
    else
        ops.layernorm_forward(a.tensor(LNF), a.tensor(LNF_MEAN), a.tensor(LNF_RSTD), last,
                              param(table_.lnfw), param(table_.lnfb));
    ops.sp_gather(a.tensor(LNF));
    ops.probe("fwd", -1, "ln_f", "out", a.tensor(LNF));
    // LM head: logits (B,T,V) = lnf · Wᵀ (W: wte when tied, else lm_head), written into probs,
    // then softmax in place.
    const Tensor probs = a.tensor(PROBS), head_w = head_weight();
    if (fp8_ && fp8_->head_gemm() >= 0)
        ops.fp8_linears().head_logits(probs, a.tensor(LNF), head_w);
    else if (layers_)
        layers_->head_logits(probs, a.tensor(LNF), head_w);
    else
        ops::matmul_forward(nx, probs, a.tensor(LNF), head_w, nullptr);
    // The logits, before softmax runs in place.
    ops.probe("fwd", -1, "head", "out", probs, ProbeSplit::vocabulary);
    if (layers_)
        layers_->head_loss(a.tensor(LOSSES), probs, targets);
    else
        ops::crossentropy_forward(nx, a.tensor(LOSSES), probs, probs, targets);
    ops.probe("fwd", -1, "loss", "out", a.tensor(LOSSES));
    after_forward({Unit::head});
}

void GPT::backward(Activations& a, int chunk, float* grads, const int* tokens, const int* targets,
                   float dloss) const {
    const TokenNode whole{0, a.shape().B * a.shape().T, grads};
    backward(a, chunk, std::span<const TokenNode>(&whole, 1), tokens, targets, dloss);
}

void GPT::backward(Activations& a, int chunk, std::span<const TokenNode> nodes, const int* tokens,
                   const int* targets, float dloss, WeightGradQueue* defer) const {
    const Numerics& nx = nx_;
    PX_ASSERT(!defer || (!hooks_ && defer->empty()),
              "a deferring backward under unit hooks, or on a queue not yet run");
    if (defer) defer->keep_inputs = a.shape().recompute;
    const LayerOps ops = layer_ops(defer);
    const MoeLayer moe(ops, experts_.get(), router_stats_);
    const std::unique_ptr<Block> block = make_block(ops, moe, logit_max_);
    const LayerSpan layers = part_.chunks[static_cast<size_t>(chunk)];
    PX_ASSERT(a.shape().layers == layers.size() && a.shape().head == has_head(chunk),
              "activations made for another chunk");
    const i64 BT = a.shape().B * a.shape().T;
    PX_ASSERT(!nodes.empty() && nodes.front().lo == 0 && nodes.back().hi == BT,
              "a microbatch's token nodes must cover its rows");
    for (size_t n = 1; n < nodes.size(); n++)
        PX_ASSERT(nodes[n].lo == nodes[n - 1].hi && nodes[n].lo < nodes[n].hi,
                  "a microbatch's token nodes must be ascending and adjacent");
    PX_ASSERT(nodes.size() == 1 || !hooks_, "a microbatch of several token nodes under unit hooks");
    float* const grads = nodes[0].grads;
    const Tensor dresidual = a.tensor(DRESIDUAL);

    if (has_head(chunk)) {
        before_backward({Unit::head}, grads);
        const Tensor probs = a.tensor(PROBS), dbuf_c = a.tensor(DBUF_C);
        // LM head: dlnf = dlogits · W, and its W gradient: a tied wte's kept apart (see
        // GradLayout), an untied lm_head's its own.
        const Tensor head = part_.tied ? grad_head(grads) : grad(grads, table_.lm_head);
        zero(dbuf_c);
        if (layers_)
            layers_->head_dlogits(probs, targets, dloss);
        else
            ops::crossentropy_backward(nx, probs, probs, targets, dloss);  // probs: dlogits
        ops.probe("bwd", -1, "loss", "dinp", probs, ProbeSplit::vocabulary);
        // An fp8 LM head: the same on the casts of dlogits, lnf and wte, dlnf summed in fp32 and
        // rounded once (as an fp8 linear's dinp).
        const bool head8 = fp8_ && fp8_->head_gemm() >= 0;
        std::vector<float> casts[3];
        Tensor dlogits = probs, lnf = a.tensor(LNF), wte = head_weight();
        if (head8) ops.fp8_linears().head_casts(casts, dlogits, lnf, wte);
        const Widened dl(head8 ? &dbuf_c : nullptr);
        const Tensor dlnf = head8 ? *dl : dbuf_c;
        // dlnf over all rows; the head's dwte over each node's rows (all rows when one node).
        auto head_backward = [&](const Tensor* di, const Tensor* dwte_head, const Tensor& p,
                                 const Tensor& x) {
            if (layers_)
                layers_->head_dinp(di, dwte_head, p, x, wte);
            else
                ops::matmul_backward(nx, di, dwte_head, nullptr, p, x, wte);
        };
        if (nodes.size() == 1) {
            head_backward(&dlnf, &head, dlogits, lnf);
        } else {
            head_backward(&dlnf, nullptr, dlogits, lnf);
            for (size_t n = 0; n < nodes.size(); n++) {
                const Tensor h = in_node(head, nodes, n);
                head_backward(nullptr, &h, node_rows(dlogits, nodes[n].lo, nodes[n].hi, BT),
                              node_rows(lnf, nodes[n].lo, nodes[n].hi, BT));
            }
        }
        if (head8) dl.store();
        ops.probe("bwd", -1, "head", "dinp", dbuf_c, ProbeSplit::tokens);
        zero(dresidual);
        const Tensor last = a.output();
        if (mc_.llama())
            ops.rmsnorm_backward(nodes, dresidual, grad(grads, table_.lnfw), dbuf_c, last,
                                 param(table_.lnfw), a.tensor(LNF_RSTD));
        else
            ops.layernorm_backward(nodes, dresidual, grad(grads, table_.lnfw),
                                   grad(grads, table_.lnfb), dbuf_c, last, param(table_.lnfw),
                                   a.tensor(LNF_MEAN), a.tensor(LNF_RSTD));
        ops.probe("bwd", -1, "ln_f", "dinp", dresidual, ProbeSplit::tokens);
        after_backward({Unit::head}, grads);
    }
    for (int l = layers.hi - 1; l >= layers.lo; l--) {
        before_backward({Unit::block, l}, grads);
        // Recompute: the block's internals were not kept; its forward from the kept input
        // refills them bit for bit (its output, written again, is unchanged).
        if (a.shape().recompute) block->forward(a, l, l - layers.lo, false);
        block->backward(a, nodes, l, l - layers.lo, dloss);
        after_backward({Unit::block, l}, grads);
    }
    if (has_embedding(chunk)) {
        before_backward({Unit::embedding}, grads);
        ops.sp_gather(dresidual);  // sequence parallelism: d(encoded) of every token
        for (size_t n = 0; n < nodes.size(); n++) {
            const Tensor dwte = in_node(grad(grads, table_.wte), nodes, n);
            const Tensor dwpe =
                table_.wpe >= 0 ? in_node(grad(grads, table_.wpe), nodes, n) : Tensor{};
            embedding_backward(dwte, dwpe, dresidual, tokens, nodes[n].lo, nodes[n].hi);
        }
        after_backward({Unit::embedding}, grads);
    }
}

// ---- the whole model on one device -----------------------------------------------------------

void GPT::forward(const int* tokens, const int* targets, i64 B, i64 T) {
    PX_ASSERT(num_chunks() == 1 && part_.embedding && part_.head,
              "the single-device forward needs the whole model");
    prepare(B, T);
    forward(acts_, 0, tokens, targets);
}

void GPT::prepare(i64 B, i64 T) {
    ops::warm_up_matmul(nx_);
    const ActShape& s = acts_.shape();
    if (acts_.bytes() == 0 || s.B != B || s.T != T) acts_ = make_activations(0, B, T);
}

void GPT::backward(float* grads, const int* tokens, const int* targets, float dloss) {
    PX_ASSERT(acts_.bytes() > 0, "backward before forward");
    backward(acts_, 0, grads, tokens, targets, dloss);
}

void GPT::combine_tied_grads(float* grads) const {
    if (!part_.tied) return;  // an untied lm_head's gradient is its own
    PX_ASSERT(part_.holds_wte(), "combine_tied_grads on a model part without wte");
    const TableEntry& e = table_.entries[table_.wte];
    float* dwte = grads + e.offset;
    const float* head = grads + glayout_.head_offset;
    const i64 n = e.numel();
#pragma omp parallel for schedule(dynamic, 1 << 16)
    for (i64 i = 0; i < n; i++) dwte[i] = dwte[i] + head[i];
}

void GPT::probe_params(ProbeSink& sink, i64 step, const char* phase, const char* op,
                       const float* data, i64 lo, i64 hi, i64 node, i64 nodes) const {
    for (const TableEntry& e : table_.entries) {
        const ProbeKey key{step, phase, e.layer, op, e.short_name};
        const i64 a = std::max(lo, e.offset), b = std::min(hi, e.offset + e.numel());
        if (a >= b || !sink.wants(key)) continue;
        ShardSpec whole;
        if (layers_ && !expert_tensor(e)) {
            whole = layers_->param_shard(e);
        } else {
            std::vector<i64> shape{e.cols};
            if (kParams[e.spec].rows != Dim::one) shape.insert(shape.begin(), e.rows);
            whole = flat_shard(shape, 0, e.numel());
            if (expert_tensor(e) && !part_.all_experts())  // rows of the (E·R, cols) tensor
                offset_rows(whole, expert_row_offset(e), e.rows / dims_.experts * mc_.moe_experts);
        }
        ShardSpec spec = slice(whole, a - e.offset, b - e.offset);
        if (node >= 0) {  // one row of (nodes, ...)
            spec.logical_shape.insert(spec.logical_shape.begin(), nodes);
            for (Hyperslab& p : spec.pieces) {
                p.lo.insert(p.lo.begin(), node);
                p.hi.insert(p.hi.begin(), node + 1);
            }
        }
        sink.capture(key, data + (a - lo), spec);
    }
}

}  // namespace px
