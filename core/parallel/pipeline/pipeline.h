// Pipeline parallelism (docs/layouts.md) on the pp group: each pp rank holds the layers of its
// virtual stages as one GPT over a ModelPart (core/model/model.h) and runs its schedule's action
// list (core/parallel/pipeline/schedule.h) with point-to-point messages (the trainer,
// core/train/job.h, executes it; with pp = 1 the list is the single device's: forward, backward,
// for each microbatch); with dp > 1 each data-parallel replica is one pipeline, and a stage's
// gradient is all-reduced over its dp group. With tp > 1 each stage is cut over its tp group
// (tp_model.h's TpLayers on the stage's part).
//
// Index
//   stage_part         the ModelPart of a pp rank: its chunks' layers, embedding, head
//   send_message, recv_message  a message between stages: an activation, typed by its dtype
//
// The math. Virtual stage k computes h_k = f_k(h_{k-1}) on each microbatch (h_{-1}: the tokens,
// f_0 starts with the embedding; the last stage ends in ln_f, the LM head and the per-token
// losses). Forward: recv h_{k-1}, compute, send h_k. Backward: recv dL/dh_k, compute the chunk's
// weight gradients and dL/dh_{k-1}, send it back (the last stage starts from dL/dloss_t = 1/N,
// N = the tokens of the whole batch). Messages are (B,T,C) hidden states in the activation dtype
// (under sequence parallelism a tp rank's token rows of them, 10.), copied bit for bit.
//
// Why every bit equals the single device's (docs/numerics.md):
//   1. A stage runs the single device's kernels on the single device's inputs: messages move
//      bits, they never add. Recompute "full" reruns a block's forward from its kept input:
//      same inputs, same kernels, same bits.
//   2. Each chunk combines its microbatch gradients in the token tree (TreeAccumulator,
//      data/token_tree.h) exactly as the single device does: node = left + right over the same
//      leaves.
//   3. Tied wte: the first stage holds the embedding's part of dwte, the last stage the LM head's
//      (GradLayout's head region). They swap them, and both form dwte = embedding + head
//      (GPT::combine_tied_grads), so both hold the same gradient and apply the same AdamW update
//      to their copy of wte.
//   4. Loss: the last stage holds every token's loss; canonical_sum / N there, then broadcast.
//   5. Grad norm: each tensor's canonical sum of squares on the stage that owns it (wte: the
//      first stage), gathered over the pp group, then the tree over tensors in the whole model's
//      table order, as global_grad_norm.
//   6. AdamW is elementwise, with the global norm's clip scale: each stage updates its tensors.
//   7. Data parallelism (dp × pp): replica d runs its pipeline on sequences [d·B/dp, (d+1)·B/dp)
//      of the batch, one node of the token tree (token_ranges), its microbatches the nodes below.
//      After the backwards each stage all-reduces its gradient buffer (the LM head's part of
//      dwte included) over its dp group with the canonical algorithm: the nodes above the
//      replicas', as the single device forms them. Only then the tied exchange, the norm and AdamW,
//      in the single device's order. Loss: the last stages gather their replicas' per-token losses
//      over dp (token order is dp-rank-major), then 4.
//   8. ZeRO over a stage's dp group: each replica keeps the Adam moments of one block-aligned
//      shard of its stage's parameters and updates that shard (AdamW is elementwise: the same
//      bits as unsharded), then the replicas all-gather the weights (ZeRO-1). ZeRO-2 reduce-
//      scatters the gradient instead of all-reducing it (wte's two parts stay whole: the first
//      and last stages cut their tables differently and swap them whole); the norm's per-tensor
//      trees are formed from the shards' canonical blocks, gathered (zero.h's argument). ZeRO-3
//      also drops the weights outside the shard between steps and gathers them before use.
//   9. Tensor parallelism (tp × pp): a stage is a tp group, each rank holding its shard of the
//      stage's layers (TpLayers), whose layers give the single device's bits (tp_model.h).
//      Messages (B,T,C) are replicated over the stage's tp ranks, so tp rank t of stage s talks
//      to tp rank t of stage s±1 (the pp group is the ranks sharing dp and tp coordinates). wte
//      is vocabulary-parallel with the same row shard on the first and the last stage: tied
//      exchange between the same tp ranks, of the local rows. Norm: each owned tensor's
//      canonical Σg² over its logical blocks (tp_sum_squares: exact partials over tp, and over
//      dp under ZeRO-2/3), then 5. Gradients are all-reduced over dp only (replicated tensors
//      get the same bits on every tp rank).
//  10. Sequence parallelism (tp × pp with layout.sequence_parallel): within a stage tp rank t
//      holds only its token rows tp::token_split(micro_B·T)[t] of the residual stream, and that
//      is all a stage boundary needs: a chunk's last block writes only those rows of its output
//      (and its backward only those rows of d(input)), a chunk's first block reads only those
//      rows of its input (and its backward all-gathers d(output) from them). So each message is
//      tp rank t's token slice, sent to tp rank t of the next (previous) stage, which holds the
//      same rows (every stage cuts the same microbatch alike): 1/tp of the (B,T,C) bytes, moved
//      bit for bit. The embedding writes every row and the head all-gathers ln_f first, as on a
//      whole tp model; the LayerNorm gradients are the same bits on every tp rank (tp_model.h).
//
// Messages. Sends are posted asynchronously and recvs block, as the schedule's contract says
// (so no rank can deadlock on a send); each send's Handle stays with the activations it reads and
// is completed before they are written again, at the latest at the end of the step. Tags:
// message_tag of the action in a step; fixed tags above their range for the tied-wte exchange
// and for validation forwards.
#pragma once
#include "core/base/arena.h"
#include "core/comm/comm.h"
#include "core/model/model.h"
#include "core/parallel/mesh.h"
#include "core/parallel/tree_exchange.h"

#include <vector>

namespace px {

// Pipeline rank p holds the virtual stages k = c·pp + p (chunk c = 0 .. v-1), with the layers
// Mesh::layers gives them; the embedding if it holds stage 0, the head if it holds stage S-1.
ModelPart stage_part(const Mesh& mesh, int pp_rank, const ModelConfig& mc);

// A message is a piece of an activation (a hidden state or its gradient): it moves as many
// elements of the activation's dtype as the tensor holds. The communicators carry fp32 elements
// today; a message of another dtype is refused with its name until core/comm carries that type.
[[nodiscard]] comm::Handle send_message(comm::Communicator& pp, const Tensor& msg, int peer,
                                        int tag);
void recv_message(comm::Communicator& pp, const Tensor& msg, int peer, int tag);

}  // namespace px
