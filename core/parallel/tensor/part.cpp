// Tensor parallelism's part of a rank's trainer (part.h).
#include "core/parallel/tensor/part.h"

#include "core/base/error.h"
#include "core/io/checkpoint_llmc.h"
#include "core/parallel/tensor/tp_model.h"

#include <memory>
#include <vector>

namespace px {

void TensorParallel::estimate(const MemorySizes& s, const StageParams& p, const MemoryGroup& g,
                              MemoryTerms& t) {
    if (s.init_from)
        t.copies += g.ranks * kEstimateFloat * (p.wte + p.wpe + s.L * p.layer + p.lnf) * s.tp;
}

void TensorParallel::plan(ModelPlan& plan) {
    plan.layers = std::make_shared<const TpLayers>(*rank_.groups.tp, rank_.nx, rank_.cfg.model,
                                                   rank_.cfg.layout.sequence_parallel);
}

const TpLayers& TensorParallel::layers(const GPT& model) {
    const auto* tpl = dynamic_cast<const TpLayers*>(model.parallel_layers());
    PX_ASSERT(tpl != nullptr, "a tensor-parallel model runs on TpLayers");
    return *tpl;
}

// The logical tensors whole, then this shard's slices.
bool TensorParallel::load_weights(GPT& model, const ParamTable& full) {
    std::vector<float> buf(static_cast<size_t>(full.total));
    read_init_weights(rank_.cfg.model.init_from, rank_.cfg.model, [&](const std::string& name) {
        const int i = full.find(name);
        return i < 0 ? nullptr : buf.data() + full.entries[static_cast<size_t>(i)].offset;
    });
    load_logical(layers(model), model, full, buf.data());
    return true;
}

void TensorParallel::entry_sums(const float* g, EntrySums& s) {
    s.sums = tp_sum_squares(layers(*model_), *model_, g, s.group, s.group ? s.lo : 0,
                            s.group ? s.hi : -1);
    s.done = true;
}

bool TensorParallel::writes(const TableEntry& e) const {
    return layers(*model_).sharded(e) || e.id % rank_.layout.tp == rank_.at.tp;
}

}  // namespace px
