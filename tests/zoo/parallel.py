"""The layout and its communication: process groups, and the autograd functions of Megatron's
tensor and sequence parallelism (Shoeybi et al. 2019, arXiv:1909.08053, section 3; Korthikanti et
al. 2022, arXiv:2205.05198, section 4.2.2). Math lives in layers.py; this file only moves tensors.

Ranks are numbered tp fastest, then dp, then pp: rank = (pp_rank · dp + dp_rank) · tp + tp_rank,
so a tp group is a run of consecutive ranks (Megatron's order).

Index
  Layout              dp × tp × pp, sequence parallelism, microbatches; validates itself
  Groups              this rank's coordinates, the DeviceMesh, its tp, dp, pp and model-parallel
                      groups
  copy_to_tp          f: forward identity, backward all-reduce over tp
  reduce_from_tp      g: forward all-reduce over tp, backward identity
  gather_from_sp      forward all-gather of the sequence (dim 1), backward reduce-scatter
  reduce_scatter_to_sp  forward reduce-scatter of the sequence, backward all-gather
  all_reduce          an in-place all-reduce that is a no-op on a group of one
"""
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    sp: bool = False         # sequence parallelism for the norms and residuals (needs tp > 1)
    microbatches: int = 1    # per dp rank and step (gradient accumulation, GPipe's microbatches)

    @property
    def world(self):
        return self.dp * self.tp * self.pp

    def validate(self, cfg, world):
        """Raises ValueError with a sentence naming what does not fit."""
        problems = []
        if self.world != world:
            problems.append(f"dp {self.dp} × tp {self.tp} × pp {self.pp} = {self.world} ranks, "
                            f"but torchrun started {world}")
        if self.pp not in (1, 2):
            problems.append(f"pp {self.pp}: the zoo's pipeline has one or two stages")
        if cfg.layers % self.pp:
            problems.append(f"{cfg.layers} layers do not split into {self.pp} stages")
        if cfg.heads % self.tp or cfg.ffn % self.tp or cfg.moe_ffn % self.tp:
            problems.append(f"heads {cfg.heads}, ffn {cfg.ffn} and moe_ffn {cfg.moe_ffn} must "
                            f"divide by tp {self.tp}")
        if self.sp and self.tp == 1:
            problems.append("sequence parallelism shards over tp: it needs tp > 1")
        if self.sp and cfg.seq % self.tp:
            problems.append(f"sequence {cfg.seq} does not split over tp {self.tp}")
        if self.sp and cfg.moe:
            problems.append("the zoo's MoE layer runs on the whole sequence: no --sp with --moe")
        if cfg.batch % (self.dp * self.microbatches):
            problems.append(f"batch {cfg.batch} does not split into dp {self.dp} × "
                            f"{self.microbatches} microbatches")
        if problems:
            raise ValueError("layout does not fit: " + "; ".join(problems))

    def tag(self):
        parts = [f"{n}{v}" for n, v in (("dp", self.dp), ("tp", self.tp), ("pp", self.pp)) if v > 1]
        if self.sp:
            parts.append("sp")
        if self.microbatches > 1:
            parts.append(f"mb{self.microbatches}")
        return "x".join(parts) or "single"


class Groups:
    """This rank's coordinates and groups: tp, dp and pp from a DeviceMesh (pp, dp, tp) over the
    world (the recorder reads the layout from it, DTensor parameters live on its tp dimension),
    and mp, the ranks of one model replica (pp × tp), for the grad norm. A group of one rank is
    None (no communication). The pp group is the pipeline pair of a (dp, tp) coordinate:
    activations flow along it and it is the embedding group that sums the tied embedding's
    gradients (Megatron's _EMBEDDING_GROUP)."""

    def __init__(self, layout, rank):
        from torch.distributed.device_mesh import init_device_mesh
        self.layout = layout
        tp, dp, pp = layout.tp, layout.dp, layout.pp
        self.tp_rank = rank % tp
        self.dp_rank = rank // tp % dp
        self.pp_rank = rank // (tp * dp)
        self.mesh = self.tp_mesh = self.tp = self.dp = self.pp = self.mp = None
        if layout.world == 1:
            return
        # Ranks (pp, dp, tp) row-major: rank = (pp_rank · dp + dp_rank) · tp + tp_rank.
        self.mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        self.tp_mesh = self.mesh["tp"]
        for name, size in (("tp", tp), ("dp", dp), ("pp", pp)):
            setattr(self, name, self.mesh.get_group(name) if size > 1 else None)
        for d in range(dp):  # new_group is collective: every rank makes every replica's group
            ranks = [(p * dp + d) * tp + t for p in range(pp) for t in range(tp)]
            group = dist.new_group(ranks) if len(ranks) > 1 else None
            if d == self.dp_rank:
                self.mp = group
        self.prev_stage = rank - dp * tp
        self.next_stage = rank + dp * tp

    @property
    def first_stage(self):
        return self.pp_rank == 0

    @property
    def last_stage(self):
        return self.pp_rank == self.layout.pp - 1


def all_reduce(t, group, op=dist.ReduceOp.SUM):
    if group is not None:
        dist.all_reduce(t, op=op, group=group)
    return t


def _all_gather_seq(x, group):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=1)


def _reduce_scatter_seq(x, group):
    parts = [p.contiguous() for p in x.chunk(dist.get_world_size(group), dim=1)]
    out = torch.empty_like(parts[0])
    dist.reduce_scatter(out, parts, group=group)
    return out


# Y = X A, A = [A_1 ... A_p] split by columns: each rank needs all of X (forward: identity) and
# dL/dX = Σ_i dL/dY_i A_iᵀ (backward: all-reduce).
class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return all_reduce(dy.clone(), ctx.group), None


# Y = Σ_i X_i A_i, A split by rows: forward all-reduce; each X_i's gradient is dL/dY A_iᵀ, local
# (backward: identity).
class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


# Sequence parallelism: the norms' rows are split over tp along the sequence. Entering a
# column-parallel linear gathers them (the backward reduce-scatters, since every rank's
# gradient of the gathered X is partial); leaving a row-parallel linear reduce-scatters.
class _GatherFromSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_gather_seq(x, group)

    @staticmethod
    def backward(ctx, dy):
        return _reduce_scatter_seq(dy, ctx.group), None


class _ReduceScatterToSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter_seq(x, group)

    @staticmethod
    def backward(ctx, dy):
        return _all_gather_seq(dy, ctx.group), None


def copy_to_tp(x, group):
    return x if group is None else _CopyToTP.apply(x, group)


def reduce_from_tp(x, group):
    return x if group is None else _ReduceFromTP.apply(x, group)


def gather_from_sp(x, group):
    return x if group is None else _GatherFromSP.apply(x, group)


def reduce_scatter_to_sp(x, group):
    return x if group is None else _ReduceScatterToSP.apply(x, group)
