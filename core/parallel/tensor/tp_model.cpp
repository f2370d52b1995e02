#include "core/parallel/tensor/tp_model.h"

#include "core/base/widened.h"

#include "core/base/error.h"
#include "core/base/rng.h"
#include "kernels/ops.h"

#include <algorithm>
#include <cmath>

namespace px {

namespace {

// Local index -> logical index along a dimension of n elements split by s (identity when null).
std::vector<i64> index_map(const tp::DimSplit* s, int rank, i64 n) {
    std::vector<i64> m;
    if (!s) {
        m.resize(static_cast<size_t>(n));
        for (i64 i = 0; i < n; i++) m[static_cast<size_t>(i)] = i;
        return m;
    }
    for (const Range& r : s->ranges[static_cast<size_t>(rank)])
        for (i64 i = r.lo; i < r.hi; i++) m.push_back(i);
    return m;
}

// The product of the leading dimensions (B·T), also when the last one is empty (a rank past
// the last vocabulary block).
i64 rows_of(const Tensor& t) {
    i64 n = 1;
    for (int d = 0; d + 1 < t.ndim; d++) n *= t.shape[d];
    return n;
}

}  // namespace

TpLayers::TpLayers(comm::Communicator& tp, const Numerics& nx, const ModelConfig& mc,
                   bool sequence_parallel)
    : comm_(tp),
      nx_(nx),
      mc_(mc),
      rank_(tp.rank()),
      shards_(tp::make_tp_shards(nx, mc.hidden, mc.heads, mc.ffn, mc.vocab, tp.size(),
                                 mc.head_size(), mc.kv_head_count())),
      sp_(sequence_parallel) {}

// ---- sequence parallelism --------------------------------------------------------------------

TokenRows TpLayers::token_rows(i64 BT) const {
    if (!sequence_parallel()) return {0, BT};
    const tp::DimSplit s = tp::token_split(nx_, BT, shards_.tp);
    const Range& r = s.ranges[static_cast<size_t>(rank_)].front();
    return {r.lo, r.hi};
}

void TpLayers::sp_gather(const Tensor& t) const {
    if (!sequence_parallel()) return;
    const i64 w = t.shape[t.ndim - 1], BT = rows_of(t);
    const tp::DimSplit tokens = tp::token_split(nx_, BT, shards_.tp);
    const i64 lo = tokens.ranges[static_cast<size_t>(rank_)].front().lo;
    const Widened x(&t);
    tp::sp_all_gather(comm_, x.f32(), x.f32() + lo * w, tokens, w);
    x.store();
}

void TpLayers::layernorm_backward(const Tensor* dinp, const Tensor* dweight, const Tensor* dbias,
                                  const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, i64 row_lo,
                                  i64 row_hi) const {
    const i64 C = inp.shape[inp.ndim - 1], BT = rows_of(inp);
    if (row_hi < 0) row_hi = BT;
    PX_ASSERT(sequence_parallel() || (row_lo == 0 && row_hi == BT),
              "a LayerNorm's rows without sequence parallelism (the model slices them itself)");
    const bool rms = mean.data == nullptr;  // Llama's RMSNorm: no mean, no bias
    if (!sequence_parallel()) {
        if (rms)
            ops::rmsnorm_backward(nx_, dinp, dweight, dout, inp, weight, rstd);
        else
            ops::layernorm_backward(nx_, dinp, dweight, dbias, dout, inp, weight, mean, rstd);
        return;
    }
    auto mean_at = [&](i64 lo) { return rms ? nullptr : mean.f32() + lo; };
    const tp::DimSplit tokens = tp::token_split(nx_, BT, shards_.tp);
    const Range mine = tokens.ranges[static_cast<size_t>(rank_)].front();
    const Widened di(dinp), d(&dout), i(&inp);
    float* dw = dweight ? dweight->f32() : nullptr;
    float* db = dbias ? dbias->f32() : nullptr;
    if (row_lo == 0 && row_hi == BT) {  // the microbatch is one node: its own token split
        const i64 lo = mine.lo;
        tp::sp_layernorm_backward(comm_, nx_, dinp ? di.f32() + lo * C : nullptr, dw, db,
                                  d.f32() + lo * C, i.f32() + lo * C, weight.f32(), mean_at(lo),
                                  rstd.f32() + lo, tokens, C);
        di.store();
        return;
    }
    PX_ASSERT(dinp == nullptr, "a LayerNorm's dinp over a node's rows");
    // One node of the batch's tree, rows [row_lo, row_hi): each rank's token rows inside it,
    // counted from row_lo, form the node's split; their partials combine in the node's tree.
    std::vector<std::vector<Range>> in_node(static_cast<size_t>(shards_.tp));
    for (int r = 0; r < shards_.tp; r++) {
        const Range t = tokens.ranges[static_cast<size_t>(r)].front();
        const i64 a = std::max(t.lo, row_lo), b = std::min(t.hi, row_hi);
        if (a < b) in_node[static_cast<size_t>(r)].push_back({a - row_lo, b - row_lo});
    }
    const tp::DimSplit node = tp::make_split("tokens", row_hi - row_lo, nx_.block, in_node);
    const i64 lo = std::clamp(mine.lo, row_lo, row_hi);  // this rank's first row in the node
    tp::sp_layernorm_backward(comm_, nx_, nullptr, dw, db, d.f32() + lo * C, i.f32() + lo * C,
                              weight.f32(), mean_at(lo), rstd.f32() + lo, node, C);
}

// A MoE layer's MLP tensors (shared experts, router, experts) are held whole by every tp rank.
bool TpLayers::whole_moe(const TableEntry& e) const {
    const int p = e.spec - kFirstLayerSpec;
    const bool mlp = (p >= FCW && p <= EPROJB) || p == UPW || p == EUPW;
    return e.layer >= 0 && mc_.moe_layer(e.layer) && mlp;
}

const tp::DimSplit* TpLayers::row_split(const TableEntry& e) const {
    if (e.spec == 0 || e.spec == kLmHeadSpec) return &shards_.vocabulary;  // wte, lm_head
    if (e.layer < 0 || whole_moe(e)) return nullptr;
    switch (e.spec - kFirstLayerSpec) {
        case QKVW:
            return &shards_.qkv;
        case QW:
            return &shards_.channels;
        case KW:
        case VW:  // whole on every rank where tp does not divide the KV heads
            return shards_.kv_split ? &shards_.kv : nullptr;
        case FCW:
        case UPW:
            return &shards_.ffn;
        default:
            return nullptr;
    }
}

const tp::DimSplit* TpLayers::col_split(const TableEntry& e) const {
    if (e.layer < 0 || whole_moe(e)) return nullptr;
    switch (e.spec - kFirstLayerSpec) {
        case QKVB:
            return &shards_.qkv;  // vectors are (1, n)
        case ATTPROJW:
            return &shards_.channels;
        case FCB:
        case FCPROJW:
            return &shards_.ffn;
        default:
            return nullptr;
    }
}

const tp::DimSplit& TpLayers::out_split(Linear l) const {
    switch (l) {
        case Linear::qkv:
            return shards_.qkv;
        case Linear::q:
            return shards_.channels;
        case Linear::kv:
            return shards_.kv;
        default:
            return shards_.ffn;
    }
}

void TpLayers::gather_heads(const Tensor& full, const Tensor& local) const {
    const i64 B = local.shape[0], T = local.shape[1], H = local.shape[2], HS = local.shape[3];
    const int p = shards_.tp;
    PX_ASSERT(full.shape[2] == H * p && full.shape[3] == HS, "gather_heads shapes");
    const Widened l(&local), f(&full);
    const i64 n = B * T * H * HS;
    std::vector<float> all(static_cast<size_t>(n * p));
    comm_.all_gather(all.data(), l.f32(), n);
    float* out = f.f32();
    for (int r = 0; r < p; r++)
        for (i64 bt = 0; bt < B * T; bt++)
            std::copy_n(all.data() + r * n + bt * H * HS, H * HS,
                        out + (bt * p + r) * H * HS);
    f.store();
}

TpDims TpLayers::dims() const {
    return TpDims{shards_.tp, shards_.vocabulary.local(rank_)};
}

void TpLayers::fill_normal(float* p, const TableEntry& e, float std, std::uint64_t seed) const {
    const ParamSpec& s = kParams[e.spec];
    const i64 cols = col_split(e) ? resolve_dim(s.cols, mc_) : e.cols;
    const std::vector<i64> rows = index_map(row_split(e), rank_, e.rows);
    const std::vector<i64> cmap = index_map(col_split(e), rank_, e.cols);
    const u32 id = static_cast<u32>(e.id);
    for (i64 lr = 0; lr < e.rows; lr++) {
        // Runs of consecutive logical columns, each one fill of the logical elements there.
        for (i64 c = 0; c < e.cols;) {
            i64 d = c + 1;
            while (d < e.cols &&
                   cmap[static_cast<size_t>(d)] == cmap[static_cast<size_t>(d) - 1] + 1)
                d++;
            px::fill_normal(p + lr * e.cols + c, d - c, 0.0f, std, seed, id,
                            static_cast<u64>(rows[static_cast<size_t>(lr)] * cols +
                                             cmap[static_cast<size_t>(c)]));
            c = d;
        }
    }
}

// Column parallel (qkv, fc): Y_r = X W_rᵀ + b_r, dX = Σ_r dY_r W_r (tree exchange).
// Row parallel (attn_proj, fc_proj): Y = Σ_r X_r W_rᵀ + b (tree exchange), dX_r, dW_r local.
void TpLayers::linear_forward(const Numerics& nx, Linear l, const Tensor& out, const Tensor& inp,
                              const Tensor& weight, const Tensor* bias) const {
    const float* b = bias ? bias->f32() : nullptr;
    const i64 BT = rows_of(inp);
    const Widened o(&out), i(&inp), w(&weight, inp.dtype);
    switch (l) {
        case Linear::qkv:
        case Linear::fc:
        case Linear::q:
        case Linear::kv:
            if (l == Linear::kv && !shards_.kv_split) {  // k, v whole on every rank
                ops::matmul_forward(nx, *o, *i, *w, bias);
                break;
            }
            tp::column_parallel_forward(comm_, nx, o.f32(), i.f32(), w.f32(), b, out_split(l), BT,
                                        weight.shape[1]);
            break;
        case Linear::attn_proj:
        case Linear::fc_proj: {
            const tp::DimSplit& k = l == Linear::attn_proj ? shards_.channels : shards_.ffn;
            const i64 OC = weight.shape[0];
            if (sequence_parallel()) {  // reduce-scatter: this rank's token rows of out
                const tp::DimSplit tokens = tp::token_split(nx, BT, shards_.tp);
                const i64 lo = tokens.ranges[static_cast<size_t>(rank_)].front().lo;
                tp::row_parallel_forward_sp(comm_, nx, o.f32() + lo * OC, i.f32(), w.f32(), b, k,
                                            tokens, BT, OC);
                break;
            }
            tp::row_parallel_forward(comm_, nx, o.f32(), i.f32(), w.f32(), b, k, BT, OC);
            break;
        }
    }
    o.store();
}

void TpLayers::linear_backward(const Numerics& nx, Linear l, const Tensor* dinp,
                               const Tensor* dweight, const Tensor* dbias, const Tensor& dout,
                               const Tensor& inp, const Tensor& weight) const {
    float* db = dbias ? dbias->f32() : nullptr;
    float* dw = dweight ? dweight->f32() : nullptr;
    const i64 BT = rows_of(inp);
    const Widened di(dinp), d(&dout), i(&inp), w(&weight, inp.dtype);
    switch (l) {
        case Linear::qkv:
        case Linear::fc:
        case Linear::q:
        case Linear::kv: {
            const i64 C = weight.shape[1];
            if (l == Linear::kv && !shards_.kv_split) {  // k, v whole: every rank the same
                if (!sequence_parallel() || dinp == nullptr) {
                    ops::matmul_backward(nx, di.get(), dweight, dbias, *d, *i, *w);
                    break;
                }
                // dX whole on every rank (0 + the sum, exact), then this rank's token rows of it
                // added, as a reduce-scatter would give them
                std::vector<float> full(static_cast<size_t>(BT * C), 0.0f);
                const Tensor fx = view_f32(full.data(), {BT, C});
                ops::matmul_backward(nx, &fx, dweight, dbias, *d, *i, *w);
                const Range mine = tp::token_split(nx, BT, shards_.tp)
                                       .ranges[static_cast<size_t>(rank_)].front();
                for (i64 j = mine.lo * C; j < mine.hi * C; j++) di.f32()[j] += full[static_cast<size_t>(j)];
                break;
            }
            const tp::DimSplit& oc = out_split(l);
            if (sequence_parallel() && dinp != nullptr) {  // dX reduce-scattered: this rank's rows
                const tp::DimSplit tokens = tp::token_split(nx, BT, shards_.tp);
                const i64 lo = tokens.ranges[static_cast<size_t>(rank_)].front().lo;
                tp::column_parallel_backward_sp(comm_, nx, di.f32() + lo * C, dw, db, d.f32(),
                                                i.f32(), w.f32(), oc, tokens, BT, C);
                break;
            }
            tp::column_parallel_backward(comm_, nx, di.f32(), dw, db, d.f32(), i.f32(), w.f32(), oc,
                                         BT, C);
            break;
        }
        case Linear::attn_proj:
        case Linear::fc_proj:
            tp::row_parallel_backward(comm_, nx, di.f32(), dw, db, d.f32(), i.f32(), w.f32(),
                                      l == Linear::attn_proj ? shards_.channels : shards_.ffn, BT,
                                      weight.shape[0]);
            break;
    }
    di.store();
}

void TpLayers::embedding_forward(const Tensor& out, const int* tokens, const Tensor& wte,
                                 const Tensor& wpe) const {
    const Widened o(&out);
    tp::vocab_embedding_forward(comm_, nx_, o.f32(), tokens, wte.f32(), wpe.f32(),
                                shards_.vocabulary, out.shape[0], out.shape[1], out.shape[2]);
    o.store();
}

void TpLayers::embedding_backward(const Tensor& dwte, const Tensor& dwpe, const Tensor& dout,
                                  const int* tokens, i64 row_lo, i64 row_hi) const {
    const Widened d(&dout);
    tp::vocab_embedding_backward(comm_, nx_, dwte.f32(), dwpe.f32(), d.f32(), tokens,
                                 shards_.vocabulary, dout.shape[0], dout.shape[1], dout.shape[2],
                                 row_lo, row_hi);
}

// LM head: logits_r = lnf wte_rᵀ (column parallel over the vocabulary, no bias), then the
// vocabulary-parallel cross-entropy; backward the same in reverse (dlnf by the tree exchange).
void TpLayers::head_logits(const Tensor& probs, const Tensor& lnf, const Tensor& wte) const {
    const Widened p(&probs), l(&lnf), w(&wte, lnf.dtype);
    tp::column_parallel_forward(comm_, nx_, p.f32(), l.f32(), w.f32(), nullptr, shards_.vocabulary,
                                rows_of(lnf), mc_.hidden);
    p.store();
}

void TpLayers::head_loss(const Tensor& losses, const Tensor& probs, const int* targets) const {
    const Widened p(&probs);
    tp::vocab_crossentropy_forward(comm_, nx_, losses.f32(), p.f32(), p.f32(), targets,
                                   shards_.vocabulary, rows_of(probs));
    p.store();
}

void TpLayers::head_dlogits(const Tensor& probs, const int* targets, float dloss) const {
    const Widened p(&probs);
    tp::vocab_crossentropy_backward(comm_, nx_, p.f32(), p.f32(), targets, dloss,
                                    shards_.vocabulary, rows_of(probs));
    p.store();
}

void TpLayers::head_dinp(const Tensor* dlnf, const Tensor* dwte_head, const Tensor& probs,
                         const Tensor& lnf, const Tensor& wte) const {
    const i64 BT = rows_of(lnf);
    const Widened dl(dlnf), p(&probs), l(&lnf), w(&wte, lnf.dtype);
    float* dh = dwte_head ? dwte_head->f32() : nullptr;
    if (sequence_parallel() && dlnf != nullptr) {  // dlnf reduce-scattered: this rank's rows
        const tp::DimSplit tokens = tp::token_split(nx_, BT, shards_.tp);
        const i64 lo = tokens.ranges[static_cast<size_t>(rank_)].front().lo;
        tp::column_parallel_backward_sp(comm_, nx_, dl.f32() + lo * mc_.hidden, dh, nullptr,
                                        p.f32(), l.f32(), w.f32(), shards_.vocabulary, tokens, BT,
                                        mc_.hidden);
    } else {
        tp::column_parallel_backward(comm_, nx_, dl.f32(), dh, nullptr, p.f32(), l.f32(), w.f32(),
                                     shards_.vocabulary, BT, mc_.hidden);
    }
    dl.store();
}

// ---- probes ----------------------------------------------------------------------------------

ColumnShard TpLayers::probe_columns(ProbeSplit s) const {
    const tp::DimSplit* d = nullptr;
    switch (s) {
        case ProbeSplit::qkv:
            d = &shards_.qkv;
            break;
        case ProbeSplit::channels:
            d = &shards_.channels;
            break;
        case ProbeSplit::ffn:
            d = &shards_.ffn;
            break;
        case ProbeSplit::vocabulary:
            d = &shards_.vocabulary;
            break;
        case ProbeSplit::whole:
        case ProbeSplit::tokens:
            break;
    }
    PX_ASSERT(d, "probe_columns asked for a split that is not by columns");
    ColumnShard c;
    c.n = d->n;
    for (const Range& r : d->ranges[static_cast<size_t>(rank_)]) c.ranges.push_back({r.lo, r.hi});
    return c;
}

// The local tensor is the row ranges' rows, each holding the column ranges' columns, back to
// back: one slab per row range when there is one column range, else one per row and range.
ShardSpec TpLayers::param_shard(const TableEntry& e) const {
    const ParamSpec& ps = kParams[e.spec];
    const bool vector = ps.rows == Dim::one;
    // (a tensor held whole has its local shape: a MoE layer's are FS or expert-parallel wide)
    const i64 R = vector ? 1 : row_split(e) ? resolve_dim(ps.rows, mc_) : e.rows;
    const i64 C = col_split(e) ? resolve_dim(ps.cols, mc_) : e.cols;
    auto ranges = [&](const tp::DimSplit* d, i64 n) {
        return d ? d->ranges[static_cast<size_t>(rank_)] : std::vector<Range>{Range{0, n}};
    };
    const std::vector<Range> rows = ranges(row_split(e), R), cols = ranges(col_split(e), C);
    ShardSpec s;
    s.logical_shape = vector ? std::vector<i64>{C} : std::vector<i64>{R, C};
    auto add = [&](i64 r0, i64 r1, const Range& c) {
        if (vector)
            s.pieces.push_back({{c.lo}, {c.hi}});
        else
            s.pieces.push_back({{r0, c.lo}, {r1, c.hi}});
    };
    for (const Range& r : rows) {
        if (cols.size() == 1) {
            add(r.lo, r.hi, cols.front());
            continue;
        }
        for (i64 i = r.lo; i < r.hi; i++)
            for (const Range& c : cols) add(i, i + 1, c);
    }
    PX_ASSERT(s.local_numel() == e.numel(), "a tp parameter's pieces do not cover its shard");
    return s;
}

std::unique_ptr<GPT> make_tp_model(comm::Communicator& tp, const Numerics& nx,
                                   const ModelConfig& mc, bool sequence_parallel) {
    // 1.-2. The splits, and the parallel layers over them (4.: with sequence parallelism).
    auto layers = std::make_shared<const TpLayers>(tp, nx, mc, sequence_parallel);
    // 3. The model over those layers: local shapes, the whole model's names and ids.
    return std::make_unique<GPT>(mc, nx, ModelPart::whole(mc), std::move(layers));
}

std::vector<i64> logical_indices(const TpLayers& tp, const TableEntry& e, const ModelConfig& mc,
                                 int rank) {
    if (rank < 0) rank = tp.rank();
    const i64 cols = tp.col_split(e) ? resolve_dim(kParams[e.spec].cols, mc) : e.cols;
    const std::vector<i64> rows = index_map(tp.row_split(e), rank, e.rows);
    const std::vector<i64> cmap = index_map(tp.col_split(e), rank, e.cols);
    std::vector<i64> out(static_cast<size_t>(e.numel()));
    for (i64 r = 0; r < e.rows; r++)
        for (i64 c = 0; c < e.cols; c++)
            out[static_cast<size_t>(r * e.cols + c)] =
                rows[static_cast<size_t>(r)] * cols + cmap[static_cast<size_t>(c)];
    return out;
}

std::vector<i64> logical_indices(const GPT& model, const TableEntry& e) {
    if (const auto* tpl = dynamic_cast<const TpLayers*>(model.parallel_layers());
        tpl && !GPT::expert_tensor(e))
        return logical_indices(*tpl, e, model.config());
    std::vector<i64> out(static_cast<size_t>(e.numel()));
    const i64 at = model.expert_row_offset(e) * e.cols;
    for (i64 j = 0; j < e.numel(); j++) out[static_cast<size_t>(j)] = at + j;
    return out;
}

void load_logical(const TpLayers& tp, GPT& model, const ParamTable& table, const float* full,
                  float* local) {
    for (const TableEntry& e : model.table().entries) {
        const float* src = full + table.entries[static_cast<size_t>(e.id)].offset;
        float* dst = (local ? local : model.params()) + e.offset;
        const std::vector<i64> idx = logical_indices(tp, e, model.config());
        for (i64 j = 0; j < e.numel(); j++) dst[j] = src[idx[static_cast<size_t>(j)]];
    }
}

void gather_logical(const TpLayers& tp, const GPT& model, const ParamTable& table, float* full,
                    const float* local) {
    const ModelConfig& mc = model.config();
    const int p = tp.size();
    std::vector<ParamTable> tables;
    std::vector<i64> counts;
    for (int r = 0; r < p; r++) {
        const TpDims d{p, tp.shards().vocabulary.local(r)};
        tables.push_back(ParamTable::build(mc, ModelPart::whole(mc), d));
        counts.push_back(tables.back().total);
    }
    i64 all = 0;
    for (i64 n : counts) all += n;
    std::vector<float> gathered(static_cast<size_t>(all));
    tp.comm().all_gather_v(gathered.data(), local ? local : model.params(), counts);
    i64 base = 0;
    for (int r = 0; r < p; r++) {
        for (const TableEntry& e : tables[static_cast<size_t>(r)].entries) {
            float* dst = full + table.entries[static_cast<size_t>(e.id)].offset;
            const float* src = gathered.data() + base + e.offset;
            const std::vector<i64> idx = logical_indices(tp, e, mc, r);
            for (i64 j = 0; j < e.numel(); j++) dst[idx[static_cast<size_t>(j)]] = src[j];
        }
        base += counts[static_cast<size_t>(r)];
    }
}

std::vector<float> tp_sum_squares(const TpLayers& tp, const GPT& model, const float* grads,
                                  comm::Communicator* dp, i64 lo, i64 hi) {
    const Numerics& nx = model.numerics();
    const ModelConfig& mc = model.config();
    const auto& entries = model.table().entries;
    const int block = nx.block;
    if (hi < 0) hi = model.table().total;
    const bool zero_sharded = dp != nullptr && dp->size() > 1;
    // Which tensors go through block vectors: the tp-sharded ones, and under ZeRO-2/3 all.
    // Vectors are in logical block order, back to back: first the tp-sharded tensors (summed over
    // tp), then the replicated ones (over dp only).
    std::vector<i64> first(entries.size(), -1), nblocks(entries.size(), 0);
    i64 n_sharded = 0, total = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < entries.size(); i++) {
            const TableEntry& e = entries[i];
            const bool sharded = tp.sharded(e);
            if (pass == 0 ? !sharded : (sharded || !zero_sharded)) continue;
            const ParamSpec& s = kParams[e.spec];
            first[i] = total;
            nblocks[i] = num_blocks(resolve_dim(s.rows, mc) * resolve_dim(s.cols, mc), block);
            total += nblocks[i];
        }
        if (pass == 0) n_sharded = total;
    }
    std::vector<float> blocks(static_cast<size_t>(total), 0.0f), part;
    for (size_t i = 0; i < entries.size(); i++) {
        if (first[i] < 0) continue;
        const TableEntry& e = entries[i];
        // Every logical block lies whole on one tp rank and is contiguous in its local storage
        // (shard edges are block multiples of rows and columns whose length is whole blocks);
        // local block k starts at local element k·block. Under ZeRO this rank owns the local
        // blocks inside [lo, hi).
        const std::vector<i64> idx = logical_indices(tp, e, mc);
        const i64 nb = num_blocks(e.numel(), block);
        const i64 k0 = std::clamp<i64>((lo - e.offset + block - 1) / block, 0, nb);
        const i64 k1 = std::clamp<i64>(num_blocks(std::max<i64>(0, hi - e.offset), block), 0, nb);
        if (k1 <= k0) continue;
        const i64 n = std::min(e.numel(), k1 * block) - k0 * block;
        part.assign(static_cast<size_t>(k1 - k0), 0.0f);
        ops::sum_squares_blocks(nx, view_f32(part.data(), {k1 - k0}),
                                view_f32(grads + e.offset + k0 * block, {n}));
        for (i64 k = k0; k < k1; k++)
            blocks[static_cast<size_t>(first[i] + idx[static_cast<size_t>(k * block)] / block)] =
                part[static_cast<size_t>(k - k0)];
    }
    if (zero_sharded && total > 0) dp->all_reduce(blocks.data(), total, comm::Algo::canonical);
    if (n_sharded > 0) tp.comm().all_reduce(blocks.data(), n_sharded, comm::Algo::canonical);
    std::vector<float> per_tensor(entries.size());
    for (size_t i = 0; i < entries.size(); i++)
        per_tensor[i] =
            first[i] < 0
                ? ops::sum_squares(nx, model.grad(const_cast<float*>(grads), static_cast<int>(i)))
            : nblocks[i] == 0 ? 0.0f
                              : tree_sum(blocks.data() + first[i], nblocks[i]);
    return per_tensor;
}

float tp_grad_norm(const TpLayers& tp, const GPT& model, const float* grads, comm::Communicator* dp,
                   i64 lo, i64 hi) {
    const std::vector<float> per_tensor = tp_sum_squares(tp, model, grads, dp, lo, hi);
    float sum = 0.0f;
    if (model.numerics().mode == Mode::bitwise) {
        sum = tree_sum(per_tensor.data(), static_cast<i64>(per_tensor.size()));
    } else {
        for (float x : per_tensor) sum += x;
    }
    return std::sqrt(sum);
}

}  // namespace px
