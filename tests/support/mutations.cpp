#include "tests/support/mutations.h"

#include "core/base/error.h"
#include "core/train/job.h"
#include "core/base/numerics.h"
#include "core/parallel/tensor/tp_model.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <utility>

namespace px::test::mutation {

namespace {

// flip_grad and drop_microbatch where a microbatch's gradient leaves backward: floats [lo, hi)
// of `grads` (laid out as the job's table) hold local microbatch `microbatch` of `step`.
void strike_gradient(const Mutation& m, const Job& job, i64 step, int microbatch, float* grads,
                     i64 lo, i64 hi) {
    if (step != m.step || job.dp_rank() != m.rank || microbatch != m.microbatch) return;
    if (m.kind == Kind::drop_microbatch) {
        std::fill(grads + lo, grads + hi, 0.0f);
        return;
    }
    const ParamTable& table = job.model().table();
    const int i = table.find(m.tensor);
    if (i < 0) return;  // a part of the model without it (another pipeline stage)
    const TableEntry& e = table.entries[static_cast<size_t>(i)];
    PX_ASSERT(m.element >= 0 && m.element < e.numel(), "flip_grad: element out of range");
    const i64 at = e.offset + m.element;
    if (at < lo || at >= hi) return;  // another chunk's or unit's
    std::uint32_t bits = 0;
    std::memcpy(&bits, grads + at, sizeof bits);
    bits ^= 1u;  // the lowest mantissa bit
    std::memcpy(grads + at, &bits, sizeof bits);
}

// tp_offset: TpLayers whose mlp.fc forward reads block `layer`'s weight shard one row off while
// `active` (the training forwards of the step it strikes, on its tp rank).
class OffsetFc : public TpLayers {
public:
    OffsetFc(const TpLayers& layers, int layer, std::shared_ptr<bool> active)
        : TpLayers(layers),
          name_("h." + std::to_string(layer) + ".mlp.c_fc.weight"),
          active_(std::move(active)) {}

    void linear_forward(const Numerics& nx, Linear l, const Tensor& out, const Tensor& inp,
                        const Tensor& weight, const Tensor* bias) const override {
        if (l != Linear::fc || !*active_ || name_ != weight.name) {
            TpLayers::linear_forward(nx, l, out, inp, weight, bias);
            return;
        }
        const i64 rows = weight.shape[0], cols = weight.shape[1];
        std::vector<float> off(weight.f32() + cols, weight.f32() + rows * cols);  // rows 1..
        off.insert(off.end(), weight.f32(), weight.f32() + cols);                 // then row 0
        TpLayers::linear_forward(nx, l, out, inp, view_f32(off.data(), {rows, cols}), bias);
    }

private:
    std::string name_;
    std::shared_ptr<bool> active_;
};

// The dp group's decorator of the rank whose job is being set up: wrap_group runs on the rank's
// thread just before its job is made, setup right after.
thread_local SwapPartials* t_swap = nullptr;

}  // namespace

SwapPartials::SwapPartials(std::unique_ptr<comm::Communicator> inner, int a, int b)
    : Decorator(std::move(inner)), a_(a), b_(b) {}

void SwapPartials::run(comm::Request& req) {
    if (req.op != comm::Op::all_reduce || req.dtype != comm::Dtype::f32 || req.n != n_ ||
        req.algo != comm::Algo::canonical) {
        Decorator::run(req);
        return;
    }
    const int p = size();
    PX_ASSERT(a_ < p && b_ < p && a_ != b_, "swap_partials needs two different ranks of the group");
    const i64 n = req.n;
    std::vector<float> rows(static_cast<size_t>(n * p));
    inner().all_gather(rows.data(), static_cast<const float*>(req.in), n);
    std::swap_ranges(rows.begin() + a_ * n + lo_, rows.begin() + a_ * n + hi_,
                     rows.begin() + b_ * n + lo_);
    tree_combine_rows(rows.data(), p, n);
    std::copy(rows.begin(), rows.begin() + n, static_cast<float*>(req.out));
}

RunHooks plant(const Mutation& m) {
    RunHooks h;
    if (m.kind == Kind::swap_partials) {
        h.wrap_group =
            [m](MeshDim d,
                std::unique_ptr<comm::Communicator> g) -> std::unique_ptr<comm::Communicator> {
            if (d != MeshDim::dp) return g;
            auto swap = std::make_unique<SwapPartials>(std::move(g), m.rank, m.other);
            t_swap = swap.get();
            return swap;
        };
        h.setup = [m](Job& job) {
            SwapPartials* swap = std::exchange(t_swap, nullptr);
            if (swap == nullptr) return;  // no dp group
            const ParamTable& table = job.model().table();
            const int i = table.find(m.tensor);
            PX_ASSERT(i >= 0, "a mutation names no parameter of the model: " + m.tensor);
            const TableEntry& e = table.entries[static_cast<size_t>(i)];
            const i64 total = job.model().grad_layout().total;
            StepHooks hooks;
            hooks.before = [swap, m, e, total](i64 step) {
                if (step == m.step)
                    swap->arm(e.offset, e.offset + e.numel(), total);
                else
                    swap->disarm();
            };
            job.add_step_hooks(std::move(hooks));
        };
        return h;
    }
    if (m.kind == Kind::tp_offset) {
        h.setup = [m](Job& job) {
            if (job.tp_size() == 1 || job.tp_rank() != m.rank) return;
            auto active = std::make_shared<bool>(false);
            job.model().wrap_parallel_layers([&](std::shared_ptr<const ParallelLayers> layers) {
                const auto* tp = dynamic_cast<const TpLayers*>(layers.get());
                PX_ASSERT(tp != nullptr, "tp_offset needs TpLayers");
                return std::make_shared<const OffsetFc>(*tp, m.layer, active);
            });
            StepHooks hooks;  // the step's forwards (and recomputing backwards) only
            hooks.before = [active, m](i64 step) { *active = step == m.step; };
            hooks.grads = [active](i64, float*) { *active = false; };
            job.add_step_hooks(std::move(hooks));
        };
        return h;
    }
    h.setup = [m](Job& job) {  // flip_grad, drop_microbatch
        if (job.dp_size() == 1) return;
        StepHooks hooks;
        const Job* j = &job;
        hooks.microbatch_grad = [m, j](i64 step, int microbatch, float* grads, i64 lo, i64 hi) {
            strike_gradient(m, *j, step, microbatch, grads, lo, hi);
        };
        job.add_step_hooks(std::move(hooks));
    };
    return h;
}

void FlipFirstReceived::run(comm::Request& req) {
    comm::Decorator::run(req);
    if (done_ || rank() != rank_ || !hits_(req)) return;
    done_ = true;
    std::uint32_t bits;
    std::memcpy(&bits, req.out, sizeof bits);
    bits ^= 1u << 20;
    std::memcpy(req.out, &bits, sizeof bits);
}

}  // namespace px::test::mutation
