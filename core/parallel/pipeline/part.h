// Pipeline parallelism's part of a rank's trainer (core/parallel/part.h): which layers this
// pipeline rank holds and which stage owns each tensor, the rank's schedule of actions run with
// the activation sets of the microbatches in flight and the messages between stages, the tied
// embedding's two gradient halves exchanged between the first and the last stage, and the
// losses and gradient-norm parts that only one stage holds, made known to every stage. With
// pp = 1 it is the single device's trivial schedule: forward, backward, for each microbatch.
// Why every bit equals the single device's: pipeline.h.
//
// Index
//   StageWork          the trainer's work at a compute action (forward, backward of a chunk)
//   PipelineParallel   the part: stage ownership, run (one step's actions), forward_only
//                      (validation), the tied exchange, the last stage's values to every stage
#pragma once
#include "core/parallel/estimate.h"
#include "core/parallel/part.h"
#include "core/parallel/pipeline/pipeline.h"
#include "core/parallel/pipeline/schedule.h"
#include "core/model/weight_grads.h"

#include <functional>
#include <memory>
#include <vector>

namespace px {

// What the trainer computes at a compute action of the schedule, on the action's activation
// set: a forward (`last`: the chunk ends the model, so its losses are the microbatch's), or a
// backward (the gradient arrived in acts.dresidual() when the chunk does not end the model).
// Under a zero-bubble schedule `backward` runs B with a queue to keep the weight gradients in,
// and `weight` runs W from that queue (null for a whole backward).
struct StageWork {
    std::function<void(const Action& a, Activations& acts, bool last)> forward;
    std::function<void(const Action& a, Activations& acts, WeightGradQueue* defer)> backward;
    std::function<void(const Action& a, WeightGradQueue& defer)> weight;
};

class PipelineParallel final : public TrainerPart {
public:
    explicit PipelineParallel(const RankSetup& rank);
    ~PipelineParallel() override;
    const char* name() const override { return "pipeline"; }
    // The memory estimate's terms (core/parallel/estimate.h): what a rank of group g holds for
    // the schedule: the activation sets of the microbatches in flight on its
    // chunks, and the schedule's actions, from the config's sizes alone, before anything is made.
    static void estimate(const MemorySizes& s, const StageParams& p, const MemoryGroup& g,
                         MemoryTerms& t);

    const Schedule& schedule() const { return schedule_; }
    ModelPart stage_part() const { return parts_[static_cast<size_t>(rank_.at.pp)]; }
    const std::vector<ModelPart>& stage_parts() const { return parts_; }  // every pp rank's
    int owner(int tensor_id) const { return owner_[static_cast<size_t>(tensor_id)]; }
    // Per entry of model's table: whether this stage owns the tensor (wte: the first stage).
    std::vector<char> owned_entries(const GPT& model) const;

    // One step's actions on this rank, in order, with sends posted asynchronously and recvs
    // blocking (schedule.h); returns when every send has landed.
    void run(const StageWork& work);
    // Validation: one microbatch forward through this rank's chunks, the stages' messages tagged
    // apart from training's; the last stage copies its losses to `losses` (micro_B·Tl floats).
    void forward_only(const int* tokens, const int* targets, float* losses);
    void wait_sends();  // every message posted so far has landed
    // The last stage's value to every stage (a broadcast over the pp group).
    double from_last_stage(double value) const;
    // Per tensor id of the whole model: the owning stage's entry of `entry_sums` (per entry of
    // model's table), gathered over the pp group.
    std::vector<float> by_tensor(const GPT& model, const std::vector<float>& entry_sums) const;

    // Activation sets made for chunk c: the most (microbatch, chunk) forwards held at once (plus
    // any whose outgoing message was still in flight), e.g. min(pp, m) on 1F1B's first stage.
    int activation_sets(int chunk) const;
    i64 activation_bytes() const;  // the sets, with what B kept for W
    const Activations* first_activations() const;  // chunk 0's first set (null: none yet)

    void attach(GPT& model) override;
    void reduce_grads(StepGrads& grads) override;  // dwte = embedding + LM head
    bool writes(const TableEntry& e) const override { return owner(e.id) == rank_.at.pp; }
    void memory(MemoryStats& m) const override { m.activations = activation_bytes(); }

private:
    struct Slot {  // one microbatch's activations on one chunk, and its outgoing message
        Activations acts;
        comm::Handle pending;
        WeightGradQueue deferred;  // B's kept weight gradients, until W (zero-bubble schedules)
    };
    Slot* acquire(int chunk);
    void release(int chunk, Slot* s);
    bool is_last_virtual(int chunk) const;
    Slot* local_stage(int k, int m) const;
    void copy_message(const Tensor& from, const Tensor& to) const;
    Tensor message(const Tensor& state) const { return subview(state, msg_lo_, {msg_n_}); }

    const RankSetup& rank_;
    Schedule schedule_;
    Placement placement_;
    std::vector<ModelPart> parts_;  // every pp rank's
    std::vector<int> owner_;        // per tensor id of the whole model: the pp rank owning it
    GPT* model_ = nullptr;
    i64 msg_lo_ = 0, msg_n_ = 0;  // a message: elements [msg_lo_, +msg_n_) of a (B,T,C) state
    std::vector<std::vector<std::unique_ptr<Slot>>> slots_;  // per chunk: every set made
    std::vector<std::vector<Slot*>> free_;                   // per chunk: sets not in use
    std::vector<std::vector<Slot*>> live_;                   // per chunk, per microbatch
};

}  // namespace px
