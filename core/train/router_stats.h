// The MoE router statistics of a step (core/model/moe.h RouterStats): collected by the model
// during the step's forwards, summed over the dp and pp groups, and offered to the observers as
// named values per MoE layer.
//
// Index
//   router_values    the named values of the MoE layers' statistics
//   RouterStatsSum   a step's statistics: begin (the model adds into them), end (summed)
#pragma once
#include "core/model/model.h"
#include "core/parallel/part.h"
#include "core/train/run_view.h"

#include <vector>

namespace px {

// The named values of the MoE layers' router statistics, per MoE layer l:
// moe.h.<l>.drop_fraction, balance (E·Σ f_i·P_i averaged over sequences: 1 when balanced),
// aux_loss (moe_aux_loss × balance), z_loss, router_entropy (mean nats), tokens.<e>.
std::vector<NamedValue> router_values(const ModelConfig& mc, const std::vector<RouterStats>& st);

class RouterStatsSum {
public:
    // Before a step's forwards: per layer of the whole model, zeroed and handed to the model.
    // Nothing without MoE.
    void begin(GPT& model);
    // After them: taken back from the model and summed over the dp and pp groups (every count
    // and fixed-point sum is an integer below 2^53, so the sums are exact doubles in any order);
    // their named values (empty without MoE).
    std::vector<NamedValue> end(GPT& model, const RankGroups& groups);
    const std::vector<RouterStats>& stats() const { return stats_; }  // per model layer

private:
    std::vector<RouterStats> stats_;
};

}  // namespace px
