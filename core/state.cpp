#include "core/state.h"

#include "core/runfile.h"

#include <cstring>

namespace px {

bool LogicalState::absorb(const Job& job) {
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
