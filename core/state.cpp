#include "core/state.h"

#include "core/error.h"
#include "core/parallel/tp_model.h"
#include "core/runfile.h"

#include <algorithm>
#include <cstring>

namespace px {

bool LogicalState::absorb(const Job& job) {
    if (job.model().parallel_layers()) return absorb_tp(job);
    const GPT& model = job.model();
    const i64 n = model.table().total;
    if (params.empty()) {
        table = model.table();
        params.assign(model.params(), model.params() + n);
        m.assign(static_cast<size_t>(n), 0.0f);
        v.assign(static_cast<size_t>(n), 0.0f);
        history = job.history();
    }
    const bool agree = std::memcmp(params.data(), model.params(), static_cast<size_t>(n) * sizeof(float)) == 0;
    const AdamW& opt = job.optimizer();
    std::memcpy(m.data() + opt.lo(), opt.m(), static_cast<size_t>(opt.size()) * sizeof(float));
    std::memcpy(v.data() + opt.lo(), opt.v(), static_cast<size_t>(opt.size()) * sizeof(float));
    return agree;
}

namespace {

bool same_history(const std::vector<StepMetrics>& a, const std::vector<StepMetrics>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++)
        if (std::memcmp(&a[i].loss, &b[i].loss, sizeof(double)) != 0 ||
            std::memcmp(&a[i].grad_norm, &b[i].grad_norm, sizeof(double)) != 0 ||
            std::memcmp(&a[i].val_loss, &b[i].val_loss, sizeof(double)) != 0)
            return false;
    return true;
}

}  // namespace

bool LogicalState::absorb_tp(const Job& job) {
    const GPT& model = job.model();
    const auto* tpl = dynamic_cast<const TpLayers*>(model.parallel_layers());
    PX_ASSERT(tpl != nullptr, "LogicalState: a model with parallel layers other than TpLayers");
    bool agree = true;
    if (params.empty()) {
        table = ParamTable::build(job.config().model);
        params.assign(static_cast<size_t>(table.total), 0.0f);
        m = v = params;
        filled_.assign(params.size(), 0);
        history = job.history();
    } else if (!same_history(history, job.history())) {
        agree = false;
    }
    const AdamW& opt = job.optimizer();
    for (const TableEntry& e : model.table().entries) {
        const i64 dst0 = table.entries[static_cast<size_t>(e.id)].offset;
        const std::vector<i64> idx = logical_indices(*tpl, e, job.config().model);
        for (i64 j = 0; j < e.numel(); j++) {
            const size_t dst = static_cast<size_t>(dst0 + idx[static_cast<size_t>(j)]);
            const i64 src = e.offset + j;
            const float w = model.params()[src];
            if (filled_[dst] && std::memcmp(&params[dst], &w, sizeof(float)) != 0) agree = false;
            params[dst] = w;
            filled_[dst] = 1;
            if (src >= opt.lo() && src < opt.hi()) {  // this rank's ZeRO-1 slice
                m[dst] = opt.m()[src - opt.lo()];
                v[dst] = opt.v()[src - opt.lo()];
            }
        }
    }
    return agree;
}

bool LogicalState::absorb_shards(const GPT& model, const AdamW& opt,
                                 const std::vector<StepMetrics>& hist, const ModelConfig& mc) {
    const auto* tpl = dynamic_cast<const TpLayers*>(model.parallel_layers());
    PX_ASSERT(tpl != nullptr, "LogicalState: a model with parallel layers other than TpLayers");
    bool agree = true;
    if (params.empty()) {
        table = ParamTable::build(mc);
        params.assign(static_cast<size_t>(table.total), 0.0f);
        m = v = params;
        filled_.assign(params.size(), 0);
        history = hist;
    } else if (!same_history(history, hist)) {
        agree = false;
    }
    for (const TableEntry& e : model.table().entries) {
        const i64 dst0 = table.entries[static_cast<size_t>(e.id)].offset;
        const std::vector<i64> idx = logical_indices(*tpl, e, mc);
        for (i64 j = 0; j < e.numel(); j++) {
            const size_t dst = static_cast<size_t>(dst0 + idx[static_cast<size_t>(j)]);
            const i64 src = e.offset + j;
            const float w = model.params()[src];
            if (filled_[dst] && std::memcmp(&params[dst], &w, sizeof(float)) != 0) agree = false;
            params[dst] = w;
            filled_[dst] = 1;
            if (src >= opt.lo() && src < opt.hi()) {
                m[dst] = opt.m()[src - opt.lo()];
                v[dst] = opt.v()[src - opt.lo()];
            }
        }
    }
    return agree;
}

bool LogicalState::absorb(const PipelineJob& stage) {
    if (stage.model().parallel_layers())
        return absorb_shards(stage.model(), stage.optimizer(), stage.history(),
                             stage.config().model);
    bool agree = true;
    if (params.empty()) {
        table = ParamTable::build(stage.config().model);
        params.assign(static_cast<size_t>(table.total), 0.0f);
        m = v = params;
        seen_.assign(table.entries.size(), 0);
        history = stage.history();
    } else if (!same_history(history, stage.history())) {
        agree = false;
    }
    const GPT& model = stage.model();
    for (const TableEntry& e : model.table().entries) {
        const size_t id = static_cast<size_t>(e.id);
        const i64 dst = table.entries[id].offset;
        const size_t bytes = static_cast<size_t>(e.numel()) * sizeof(float);
        const float* src[3] = {model.params() + e.offset, stage.optimizer().m() + e.offset,
                               stage.optimizer().v() + e.offset};
        float* out[3] = {params.data() + dst, m.data() + dst, v.data() + dst};
        for (int k = 0; k < 3; k++) {
            if (seen_[id] && std::memcmp(out[k], src[k], bytes) != 0) agree = false;
            std::memcpy(out[k], src[k], bytes);
        }
        seen_[id] = 1;
    }
    return agree;
}

bool LogicalState::complete() const {
    if (!filled_.empty()) return std::find(filled_.begin(), filled_.end(), 0) == filled_.end();
    if (seen_.empty()) return !params.empty();
    for (char x : seen_)
        if (!x) return false;
    return true;
}

void write_dump(const std::string& path, const LogicalState& state, const Config& cfg) {
    RunFile file(path, config_to_toml(cfg));
    for (const TableEntry& e : state.table.entries) {
        const std::vector<i64> shape =
            e.rows == 1 ? std::vector<i64>{e.cols} : std::vector<i64>{e.rows, e.cols};
        file.write_array("weights/" + e.name, state.params.data() + e.offset, shape);
        file.write_array("adam/m/" + e.name, state.m.data() + e.offset, shape);
        file.write_array("adam/v/" + e.name, state.v.data() + e.offset, shape);
    }
    const i64 steps = static_cast<i64>(state.history.size());
    std::vector<double> step(steps), loss(steps), norm(steps), val(steps);
    for (i64 i = 0; i < steps; i++) {
        step[i] = static_cast<double>(state.history[i].step);
        loss[i] = state.history[i].loss;
        norm[i] = state.history[i].grad_norm;
        val[i] = state.history[i].val_loss;
    }
    file.write_array("steps/step", step.data(), {steps});
    file.write_array("steps/loss", loss.data(), {steps});
    file.write_array("steps/grad_norm", norm.data(), {steps});
    file.write_array("steps/val_loss", val.data(), {steps});
    file.flush();
}

}  // namespace px
