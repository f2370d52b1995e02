"""Megatron-style tensor-parallel layers, written out by hand (Megatron-LM
megatron/core/tensor_parallel/layers.py and cross_entropy.py are the model). Shapes: B batch, T
sequence (T/tp rows under sequence parallelism), C hidden, F a tp rank's columns of a sharded
dimension, V the padded vocabulary, Vl = V/tp a rank's rows of it.

Each layer takes its full, unsharded initial weight and keeps its rank's slice, so every layout
starts from the same model. A sliced weight is stored as a DTensor on the tp mesh (its placement
says which slice a rank holds, for the recorder); the layers compute on its local tensor and do
every collective themselves (parallel.py). The switches named after bugs (bugs.py) remove one
collective each; they default to the correct layer.

Index
  tp_param                a parameter holding rank's slice of a full tensor along a dimension
  local                   a DTensor's local tensor (a plain tensor as it is)
  RMSNorm                 y = x / rms(x) · w, replicated weight
  ColumnParallelLinear    Y = X A, A's output rows split over tp: f (or the SP gather), then matmul
  RowParallelLinear       Y = Σ_i X_i A_i, A's input columns split: matmul, then g (or the SP
                          reduce-scatter)
  VocabParallelEmbedding  a rank's vocabulary rows; tokens outside them give zero rows; then g
  LMHead                  logits of a rank's vocabulary rows, with the embedding's weight (tied)
  VocabParallelCrossEntropy  per-token loss from vocabulary-sharded logits
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, Shard

from data import IGNORE
from parallel import all_reduce, copy_to_tp, gather_from_sp, reduce_from_tp, reduce_scatter_to_sp


def tp_param(full, dim, groups):
    """nn.Parameter of groups' tp rank's contiguous slice of `full` along `dim`: a DTensor
    (Shard(dim) on the tp mesh) when tp > 1."""
    tp = groups.layout.tp
    piece = full.chunk(tp, dim=dim)[groups.tp_rank].clone().contiguous()
    if tp == 1:
        return nn.Parameter(piece)
    return nn.Parameter(DTensor.from_local(piece, groups.tp_mesh, [Shard(dim)], run_check=False))


def local(t):
    return t.to_local() if isinstance(t, DTensor) else t


class RMSNorm(nn.Module):
    # x (B,T,C), weight (C,)
    def __init__(self, weight, eps):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class ColumnParallelLinear(nn.Module):
    """Y = X A, A = [A_1 ... A_p] split by output rows (nn.Linear's (out, in)); forward: identity
    (all-gather of the sequence under SP), backward: all-reduce (reduce-scatter under SP).
    reduce_input_grad=False is the bug of an f without its backward all-reduce."""

    def __init__(self, weight, groups, reduce_input_grad=True):
        super().__init__()
        self.weight = tp_param(weight, 0, groups)
        self.group, self.sp = groups.tp, groups.layout.sp
        self.reduce_input_grad = reduce_input_grad

    def forward(self, x):
        # x (B,T,C) (B,T/tp,C under SP), weight (F,C) -> (B,T,F)
        if self.sp:
            x = gather_from_sp(x, self.group)
        elif self.reduce_input_grad:
            x = copy_to_tp(x, self.group)
        return F.linear(x, local(self.weight))


class RowParallelLinear(nn.Module):
    """Y = Σ_i X_i A_i, A split by input columns; forward: all-reduce (reduce-scatter of the
    sequence under SP), backward: identity. reduce_output=False is the bug of a row-parallel
    linear without its forward all-reduce."""

    def __init__(self, weight, groups, reduce_output=True):
        super().__init__()
        self.weight = tp_param(weight, 1, groups)
        self.group, self.sp = groups.tp, groups.layout.sp
        self.reduce_output = reduce_output

    def forward(self, x):
        # x (B,T,F), weight (C,F) -> (B,T,C) (B,T/tp,C under SP)
        y = F.linear(x, local(self.weight))
        if self.sp:
            return reduce_scatter_to_sp(y, self.group)
        return reduce_from_tp(y, self.group) if self.reduce_output else y


class VocabParallelEmbedding(nn.Module):
    # tokens (B,T), weight (Vl,C) rows [lo, lo + Vl) of the padded vocabulary -> (B,T,C)
    def __init__(self, weight, groups):
        super().__init__()
        self.weight = tp_param(weight, 0, groups)
        self.rows = weight.shape[0] // groups.layout.tp
        self.lo = groups.tp_rank * self.rows
        self.group, self.sp = groups.tp, groups.layout.sp

    def forward(self, tokens):
        outside = (tokens < self.lo) | (tokens >= self.lo + self.rows)
        ids = (tokens - self.lo).masked_fill(outside, 0)
        y = F.embedding(ids, local(self.weight)).masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sp:
            return reduce_scatter_to_sp(y, self.group)
        return reduce_from_tp(y, self.group)


class LMHead(nn.Module):
    """Logits of this rank's vocabulary rows: a column-parallel linear whose weight is the
    embedding's (tied; on a pipeline's last stage a copy, kept equal by summing the two copies'
    gradients over the embedding group). Not a parameter of its own: the embedding module
    holds it."""

    def __init__(self, embedding, groups):
        super().__init__()
        self.embedding = [embedding]  # a list: not a submodule
        self.group, self.sp = groups.tp, groups.layout.sp

    def forward(self, x):
        # x (B,T,C) (B,T/tp,C under SP), weight (Vl,C) -> (B,T,Vl)
        x = gather_from_sp(x, self.group) if self.sp else copy_to_tp(x, self.group)
        return F.linear(x, local(self.embedding[0].weight))


class _VocabParallelCE(torch.autograd.Function):
    """loss_t = log Σ_v exp(z_tv) − z_t,label, the sums over the whole vocabulary: a max, the
    label's logit and the exponentials' sum each all-reduced over tp (Megatron's
    _VocabParallelCrossEntropy). Columns at or past `real` are padding: masked to −inf unless
    mask_padding is False (the bug), when they join the softmax."""

    @staticmethod
    def forward(ctx, logits, labels, lo, real, group, mask_padding):
        # logits (B,T,Vl) columns [lo, lo + Vl), labels (B,T) -> loss (B,T), 0 where ignored
        vl = logits.shape[-1]
        z = logits.clone()
        if mask_padding and lo + vl > real:
            z[..., max(real - lo, 0):] = float("-inf")
        zmax = all_reduce(z.max(dim=-1).values, group, dist.ReduceOp.MAX)
        z -= zmax.unsqueeze(-1)
        valid = labels != IGNORE
        mine = valid & (labels >= lo) & (labels < lo + vl)
        idx = (labels - lo).masked_fill(~mine, 0)
        picked = z.gather(-1, idx.unsqueeze(-1)).squeeze(-1).masked_fill(~mine, 0.0)
        picked = all_reduce(picked, group)
        e = z.exp()
        sum_e = all_reduce(e.sum(dim=-1), group)
        loss = (sum_e.log() - picked).masked_fill(~valid, 0.0)
        ctx.save_for_backward(e / sum_e.unsqueeze(-1), idx, mine, valid)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        softmax, idx, mine, valid = ctx.saved_tensors
        d = softmax.clone()
        d.scatter_add_(-1, idx.unsqueeze(-1), -mine.to(d.dtype).unsqueeze(-1))
        d *= (dloss * valid).unsqueeze(-1)
        return d, None, None, None, None, None


class VocabParallelCrossEntropy(nn.Module):
    def __init__(self, lo, real, group, mask_padding=True):
        super().__init__()
        self.lo, self.real, self.group, self.mask_padding = lo, real, group, mask_padding

    def forward(self, logits, labels):
        return _VocabParallelCE.apply(logits, labels, self.lo, self.real, self.group,
                                      self.mask_padding)
