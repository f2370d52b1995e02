"""The zoo's training script: a tiny Llama (model.py) with hand-written Megatron-style tensor and
sequence parallelism, a two-stage GPipe pipeline with the embedding tied across the stages, and
data parallelism with gradient accumulation, over torch.distributed's gloo backend on the CPU.

    torchrun --nproc-per-node 4 tests/zoo/train.py --dp 2 --tp 2 --seeds 1,2 --out DIR
    torchrun --nproc-per-node 2 tests/zoo/train.py --tp 2 --bug row_fwd_no_allreduce --out DIR
    python tests/zoo/train.py --out DIR            (one process: the reference)

Every layout starts from the same weights (the full model drawn from the seed on every rank, then
sliced) and trains on the same global batch each step (data.py), with AdamW (LLaMA's betas and
epsilon) and global-norm clipping that clips. Each run is recorded by parallax.torch under
Parallax's probe names (record.py) to DIR/<layout>[-moe][-dropout]-<bug>-s<seed>.h5, so that
`parallax compare REF.h5 RUN.h5` judges a layout against the one-process run of the same seed.
One launch runs every seed × bug given (or the --runs list).

A step, in order:
  1. the rank's rows of the global batch, cut into microbatches
  2. the GPipe schedule (pipeline.py): forwards, the MoE's load-balancing loss over the step's
     routing, backwards; each microbatch's loss is its tokens' summed loss over the step's count
  3. gradients: all-reduce over dp; the sequence-parallel norms' over tp; the tied embedding's
     over the first and last stage
  4. the global grad norm over the model-parallel ranks, each parameter counted once; clipping
  5. AdamW
"""
import argparse
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist

from bugs import BUGS
from data import IGNORE, MarkovSource
from layers import local
from model import Config, DropoutMasks, LlamaStage, Microbatch, RMSNorm, Router
from parallel import Groups, Layout, all_reduce
from pipeline import gpipe, run_schedule


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--sp", action="store_true", help="sequence parallelism (tp > 1)")
    p.add_argument("--microbatches", type=int, default=1, help="per dp rank and step")
    p.add_argument("--moe", action="store_true", help="a mixture of experts in every layer")
    p.add_argument("--dropout", type=float, default=0.0, help="attention dropout")
    p.add_argument("--seeds", default="1", help="comma-separated; one run per seed and bug")
    p.add_argument("--bug", default="none", help="comma-separated bug names (bugs.py), or none")
    p.add_argument("--runs", default=None,
                   help="BUG@SEED,... : these runs in one launch (instead of --seeds × --bug)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--adam-eps", type=float, default=1e-5, help="LLaMA's")
    p.add_argument("--max-norm", type=float, default=0.25, help="clip the global grad norm")
    p.add_argument("--out", default=None, help="folder of the traces (none: not recorded)")
    a = p.parse_args(argv)
    if a.runs:
        pairs = [r.split("@") for r in a.runs.split(",")]
        if any(len(r) != 2 or not r[1].isdigit() for r in pairs):
            p.error(f"--runs {a.runs!r}: each run is BUG@SEED, e.g. none@1,dp_same_data@1")
        a.runs = [(b, int(s)) for b, s in pairs]
    else:
        a.runs = [(b, int(s)) for s in a.seeds.split(",") for b in a.bug.split(",")]
    for b, _ in a.runs:
        if b != "none" and b not in BUGS:
            p.error(f"unknown bug {b!r}; known: {', '.join(BUGS)}")
    return a


def replicated(module):
    """Whether the module's parameters are whole on every tp rank (Megatron: not
    tensor_model_parallel)."""
    return isinstance(module, (RMSNorm, Router))


def param_table(stage):
    """(name, parameter, module) for every parameter of the stage, each once."""
    seen, rows = set(), []
    for mname, mod in stage.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                rows.append((f"{mname}.{pname}" if mname else pname, p, mod))
    return rows


def moe_aux_losses(stage, cfg, layout, groups, n_mb, bugs):
    """Per microbatch, the load-balancing loss terms of the stage's MoE layers:
    aux_coef · E · Σ_e f_e · P_e with f_e the share of the step's k·N routing choices that
    chose e (every dp rank and microbatch, all-reduced) and P_e the step's mean probability of
    e; a microbatch contributes its tokens' part of P. The bug: f and P of the microbatch alone,
    the losses averaged over microbatches and dp ranks."""
    layers = stage.moe_layers()
    if not layers:
        return [None] * n_mb
    E, k = cfg.experts, cfg.top_k
    terms = [0.0] * n_mb
    for moe in layers:
        stats, moe.stats = moe.stats, []
        if "moe_aux_per_microbatch" in bugs:
            for m, (counts, psum, ntok) in enumerate(stats):
                f, P = counts / (ntok * k), psum / ntok
                terms[m] = terms[m] + cfg.aux_coef * E * (f * P).sum() / (n_mb * layout.dp)
        else:
            n = cfg.batch * cfg.seq
            f = all_reduce(sum(c for c, _, _ in stats), groups.dp) / (n * k)
            for m, (_, psum, _) in enumerate(stats):
                terms[m] = terms[m] + cfg.aux_coef * E * (f * psum).sum() / n
    return terms


def finish_grads(params, stage, layout, groups, bugs):
    """Step 3: every reduction that makes each gradient the whole step's."""
    for _, p, _ in params:
        all_reduce(local(p.grad), groups.dp)
    norms = [p for _, p, mod in params if isinstance(mod, RMSNorm)]
    # Sequence parallelism: each tp rank's norms saw T/tp rows, so their gradients are partial.
    if layout.sp and "sp_norm_grad_no_allreduce" not in bugs:
        for p in norms:
            all_reduce(p.grad, groups.tp)
    if not layout.sp and "norm_grad_double_reduce" in bugs:
        for p in norms:
            all_reduce(p.grad, groups.tp)
    # The tied embedding: the first stage's lookup gradient plus the last stage's head gradient.
    if layout.pp > 1 and "tied_embed_grad_no_allreduce" not in bugs:
        all_reduce(local(stage.model.embed_tokens.weight.grad), groups.pp)


def grad_norm(params, stage, layout, groups, bugs):
    """Step 4: sqrt of Σ g² over the model, each element once: tp-sharded parameters on every tp
    rank, replicated ones on tp rank 0, the tied head's copy not on the last stage; summed over
    the model-parallel ranks (dp replicas hold the same gradients)."""
    sq = torch.zeros((), dtype=torch.float64)
    for _, p, mod in params:
        if not stage.first and p is stage.model.embed_tokens.weight:
            continue
        if replicated(mod) and groups.tp_rank != 0 and "clip_norm_tp_replicated" not in bugs:
            continue
        sq += local(p.grad).double().pow(2).sum()
    return all_reduce(sq, groups.mp).sqrt()


def train_step(stage, opt, params, cfg, layout, groups, ctx, source, seed, step, bugs, rec,
               max_norm):
    """One step; returns the step's mean loss over its trained tokens (on the last stage)."""
    ctx.step = step
    tokens, labels = source.batch(seed, step, cfg.batch, cfg.seq)
    n_mb, per = layout.microbatches, cfg.batch // layout.dp
    rows = per // n_mb
    # 1. This rank's rows: where they sit in the global batch (what the recorder and the
    # dropout masks see), and which rows of the data it reads (the same unless dp_same_data).
    home = groups.dp_rank * per
    read = 0 if "dp_same_data" in bugs else home
    mbs = [(tokens[read + m * rows:read + (m + 1) * rows],
            labels[read + m * rows:read + (m + 1) * rows], home + m * rows) for m in range(n_mb)]
    counts = [(lab != IGNORE).sum().double() for _, lab, _ in mbs]
    step_tokens = all_reduce(sum(counts), groups.dp)

    def loss_of(m, per_token):
        total = per_token.sum()
        if "ga_loss_per_microbatch" in bugs:
            return total / counts[m] / (n_mb * layout.dp)
        return total / step_tokens

    # 2. The schedule.
    seq = cfg.seq // layout.tp if layout.sp else cfg.seq
    actions = gpipe(groups.pp_rank, layout.pp, n_mb)
    losses = run_schedule(actions, stage, groups, mbs, ctx, (rows, seq, cfg.hidden), loss_of,
                          lambda: moe_aux_losses(stage, cfg, layout, groups, n_mb, bugs))
    # 3-5.
    finish_grads(params, stage, layout, groups, bugs)
    if rec is not None:
        rec.grads_ready()
    norm = grad_norm(params, stage, layout, groups, bugs)
    if rec is not None:
        rec.scalar("grad/-/clip/norm", norm.float())
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0).float()
    for _, p, _ in params:
        local(p.grad).mul_(coef)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if not stage.last:
        return None, norm.item()
    # Each microbatch's loss is its share of the step's (the bug's: of its mean of means).
    mean = all_reduce(sum(x.detach().double() for x in losses.values()), groups.dp)
    return mean.item(), norm.item()


def run(cfg, layout, groups, seed, bugs, args, path):
    ctx = Microbatch()
    masks = DropoutMasks(cfg, seed, ctx,
                         same_heads_on_every_tp_rank="dropout_rng_not_forked" in bugs)
    stage = LlamaStage(cfg, seed, groups, masks, bugs)
    params = param_table(stage)
    opt = torch.optim.AdamW([p for _, p, _ in params], lr=args.lr, betas=(0.9, 0.95),
                            eps=args.adam_eps, weight_decay=0.01, foreach=False)
    source = MarkovSource(cfg.vocab)
    history = []
    if path is None:
        opened = contextlib.nullcontext()
    else:
        import record  # parallax.torch: only a recorded run needs parallax
        opened = record.recorder(stage, opt, path, cfg, layout, groups)
    with opened as rec:
        for step in range(1, args.steps + 1):
            history.append(train_step(stage, opt, params, cfg, layout, groups, ctx, source, seed,
                                      step, bugs, rec, args.max_norm))
    return history


def main(argv=None):
    args = parse(argv)
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:  # one process without torchrun (the reference): an in-process store, no port
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = Config(moe=args.moe, dropout=args.dropout)
    layout = Layout(args.dp, args.tp, args.pp, args.sp, args.microbatches)
    try:
        layout.validate(cfg, world)
    except ValueError as e:
        if rank == 0:
            print(f"train.py: {e}", file=sys.stderr)
        dist.destroy_process_group()
        return 2
    groups = Groups(layout, rank)
    if args.out and rank == 0:
        os.makedirs(args.out, exist_ok=True)
    for bug, seed in args.runs:
        bugs = set() if bug == "none" else {bug}
        model = "-moe" * cfg.moe + "-dropout" * (cfg.dropout > 0)
        path = (os.path.join(args.out, f"{layout.tag()}{model}-{bug}-s{seed}.h5") if args.out
                else None)
        t0 = time.perf_counter()
        history = run(cfg, layout, groups, seed, bugs, args, path)
        if groups.last_stage and groups.tp_rank == 0 and groups.dp_rank == 0:
            losses = " ".join(f"{x:.4f}" for x, _ in history)
            norms = " ".join(f"{n:.3f}" for _, n in history)
            print(f"{layout.tag()}{model} {bug} seed {seed}: loss {losses} | grad norm {norms} "
                  f"| {time.perf_counter() - t0:.2f} s | trace {path}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
