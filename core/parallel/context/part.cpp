// Context parallelism's part of a rank's trainer (part.h).
#include "core/parallel/context/part.h"

#include "core/base/error.h"
#include "core/parallel/context/context_parallel.h"
#include "core/parallel/pipeline/part.h"

namespace px {

ContextParallel::ContextParallel(const RankSetup& rank, const PipelineParallel& pipeline)
    : rank_(rank), pipeline_(pipeline) {}

ContextParallel::~ContextParallel() = default;

void ContextParallel::attach(GPT& model) {
    model_ = &model;
    if (model.activation_dtype() != DType::f32)
        throw ConfigError("layout.cp=" + std::to_string(rank_.layout.cp) +
                          " runs fp32 activations only for now; set precision.activations = "
                          "\"fp32\" or layout.cp = 1");
    attention_ = make_cp_attention(*rank_.groups.cp, rank_.layout.cp_method, rank_.T,
                                   rank_.nx.block);
    model.set_context(attention_);
}

double ContextParallel::bytes_sent() const {
    double b = 0;
    for (const comm::StatRow& r : rank_.groups.cp->stats_book()->rows())
        if (r.group == "cp") b += static_cast<double>(r.bytes_sent);
    return b;
}

void ContextParallel::begin_step() {
    sent0_ = bytes_sent();
}

void ContextParallel::end_step() {
    sent_ += bytes_sent() - sent0_;
    steps_++;
}

// The ring's or the all-to-alls' staging (whole-sequence K/V, head rows).
void ContextParallel::memory(MemoryStats& m) const {
    m.comm += attention_->staging_bytes();
}

void ContextParallel::stats(PartStats& s) const {
    CpStats& c = s.cp;
    c.cp = rank_.layout.cp;
    c.method = cp_method_name(rank_.layout.cp_method);
    c.comm_bytes_per_step = steps_ > 0 ? sent_ / static_cast<double>(steps_) : 0;
    i64 layers = 0;
    for (int k = 0; k < model_->num_chunks(); k++) layers += model_->part().chunks[k].size();
    const CpCosts f = cp_costs(rank_.layout, layers, rank_.micro_B);
    c.comm_bytes_formula = f.comm_bytes_per_step;
    c.attention_bytes_formula = f.attention_bytes;
    if (const Activations* a = pipeline_.first_activations())
        for (int t : {ATT, DPREATT, DATT}) {
            const Tensor x = a->tensor(t);
            c.attention_bytes += static_cast<double>(bytes_of(x.dtype, x.numel()));
        }
}

}  // namespace px
