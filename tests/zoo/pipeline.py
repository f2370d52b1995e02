"""The pipeline: a schedule is a plain list of actions (picotron's train_step_pipeline_*, Megatron's
get_forward_backward_func), and one function runs a list on a stage. With one stage the same
schedule is gradient accumulation.

GPipe (Huang et al. 2019, arXiv:1811.06965): every microbatch's forward first (warm-up), no
steady one-forward-one-backward phase, then every microbatch's backward (cool-down). Running all
forwards first also lets the load-balancing loss see the whole step's routing before any
backward.

Index
  gpipe           the actions of one stage: ("recv_fwd" | "forward" | "send_fwd" | "recv_bwd" |
                  "backward" | "send_bwd", microbatch)
  run_schedule    runs them on a stage; the last stage's losses and every stage's extra loss terms
                  (the MoE's) come from callbacks
"""
import torch
import torch.distributed as dist


def gpipe(stage, stages, microbatches):
    first, last = stage == 0, stage == stages - 1
    actions = []
    # Warm-up: forwards in order, each sent on as soon as it is done.
    for m in range(microbatches):
        if not first:
            actions.append(("recv_fwd", m))
        actions.append(("forward", m))
        if not last:
            actions.append(("send_fwd", m))
    # Cool-down: backwards in the same order, each input gradient sent back at once.
    for m in range(microbatches):
        if not last:
            actions.append(("recv_bwd", m))
        actions.append(("backward", m))
        if not first:
            actions.append(("send_bwd", m))
    return actions


def run_schedule(actions, stage, groups, microbatches, ctx, hidden_shape, loss_of, extra_losses):
    """microbatches[m] = (tokens, labels, row_lo); ctx (model.Microbatch) is set before each
    microbatch's forward and backward. loss_of(m, per_token_losses) -> the scalar the last stage
    backpropagates for m; extra_losses() -> per microbatch a scalar or None, called once after
    the warm-up (before the first backward)."""
    inputs, outputs, losses, extra = {}, {}, {}, None
    for kind, m in actions:
        tokens, labels, row_lo = microbatches[m]
        ctx.row_lo = row_lo
        if kind == "recv_fwd":
            x = torch.empty(hidden_shape)
            dist.recv(x, groups.prev_stage)
            inputs[m] = x.requires_grad_()
        elif kind == "forward":
            x = inputs[m] if not stage.first else tokens
            outputs[m] = stage(x, labels)
            if stage.last:
                losses[m] = loss_of(m, outputs[m])
        elif kind == "send_fwd":
            dist.send(outputs[m].detach().contiguous(), groups.next_stage)
        elif kind == "recv_bwd":
            g = torch.empty(hidden_shape)
            dist.recv(g, groups.next_stage)
            outputs[m] = (outputs[m], g)
        elif kind == "backward":
            if extra is None:
                extra = extra_losses()
            tensors, grads = [], []
            if stage.last:
                tensors.append(losses[m] if extra[m] is None else losses[m] + extra[m])
                grads.append(None)
            else:
                out, g = outputs[m]
                tensors.append(out)
                grads.append(g)
                if extra[m] is not None:
                    tensors.append(extra[m])
                    grads.append(None)
            torch.autograd.backward(tensors, grads)
        elif kind == "send_bwd":
            dist.send(inputs[m].grad.contiguous(), groups.prev_stage)
    return losses
