"""The zoo's model: a tiny Llama (RMSNorm, rotary positions, SwiGLU, a tied embedding), or with
--moe a top-k mixture of experts in place of every MLP, built as one pipeline stage of tensor-
parallel layers (layers.py). Module names follow Hugging Face's LlamaForCausalLM
(model.embed_tokens, model.layers.<l>.self_attn.q_proj, ..., model.norm, lm_head), with <l> the
global layer index on every stage; the MoE layer follows Qwen3-MoE (mlp.gate is the router).

Index
  Config          sizes and switches of the model
  padded_vocab    the vocabulary padded to a multiple of 32 (Megatron's
                  make_vocab_size_divisible_by): 96 rows in every layout, the single device's
                  too, so that every trace holds the same logical shapes
  init_full       every full, unsharded initial tensor from a seed, the same for every layout
  DropoutMasks    attention dropout masks as a function of logical position (step, layer, row, head)
  Microbatch      what a layer cannot know: the step and the microbatch's first global row
  LlamaStage      the layers of one pipeline stage; forward: tokens or hidden -> hidden or loss
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from layers import (
    ColumnParallelLinear,
    LMHead,
    RMSNorm,
    RowParallelLinear,
    VocabParallelCrossEntropy,
    VocabParallelEmbedding,
    local,
    tp_param,
)
from parallel import copy_to_tp, reduce_from_tp


@dataclass(frozen=True)
class Config:
    vocab: int = 93          # real tokens; the tables hold padded_vocab rows
    seq: int = 32
    batch: int = 8           # the global batch, every dp rank and microbatch
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    ffn: int = 128
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    init_std: float = 0.02
    dropout: float = 0.0     # attention-probability dropout
    moe: bool = False        # every MLP a mixture of experts
    experts: int = 4
    top_k: int = 2
    moe_ffn: int = 32
    aux_coef: float = 0.1    # the load-balancing loss's weight


def padded_vocab(cfg):
    return (cfg.vocab + 31) // 32 * 32


def init_full(cfg, seed):
    """name -> full initial tensor, drawn in a fixed order from `seed` (the padded embedding
    rows from a second generator). Padded rows are never looked up and their logits are masked
    out of the loss: they stay out of every result."""
    g = torch.Generator().manual_seed(seed)
    C, E = cfg.hidden, cfg.experts

    def normal(*shape, std=cfg.init_std):
        return torch.randn(*shape, generator=g) * std

    out_std = cfg.init_std / math.sqrt(2 * cfg.layers)
    w = {"model.embed_tokens.weight": normal(cfg.vocab, C)}
    vp = padded_vocab(cfg)
    if vp > cfg.vocab:
        pad = torch.Generator().manual_seed(seed + 1_000_003)
        w["model.embed_tokens.weight"] = torch.cat(
            [w["model.embed_tokens.weight"],
             torch.randn(vp - cfg.vocab, C, generator=pad) * cfg.init_std])
    for layer in range(cfg.layers):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = torch.ones(C)
        for n in ("q_proj", "k_proj", "v_proj"):
            w[p + f"self_attn.{n}.weight"] = normal(C, C)
        w[p + "self_attn.o_proj.weight"] = normal(C, C, std=out_std)
        w[p + "post_attention_layernorm.weight"] = torch.ones(C)
        if cfg.moe:
            w[p + "mlp.gate.weight"] = normal(E, C)
            w[p + "mlp.experts.gate_proj.weight"] = normal(E, cfg.moe_ffn, C)
            w[p + "mlp.experts.up_proj.weight"] = normal(E, cfg.moe_ffn, C)
            w[p + "mlp.experts.down_proj.weight"] = normal(E, C, cfg.moe_ffn, std=out_std)
        else:
            w[p + "mlp.gate_proj.weight"] = normal(cfg.ffn, C)
            w[p + "mlp.up_proj.weight"] = normal(cfg.ffn, C)
            w[p + "mlp.down_proj.weight"] = normal(C, cfg.ffn, std=out_std)
    w["model.norm.weight"] = torch.ones(C)
    return w


class Microbatch:
    """Set by the schedule before each microbatch's forward and backward."""

    def __init__(self):
        self.step = 0
        self.row_lo = 0   # the microbatch's first sequence in the step's global batch


class DropoutMasks:
    """The keep-mask of attention dropout for a layer and step is one draw over the logical
    (B, H, T, T) tensor, seeded by (seed, step, layer); a rank takes its rows and heads, so
    every layout drops what the single device drops. same_heads_on_every_tp_rank is the bug of
    tp ranks whose RNG was not forked: every rank draws the heads of rank 0."""

    def __init__(self, cfg, seed, mb, same_heads_on_every_tp_rank=False):
        self.cfg, self.seed, self.mb = cfg, seed, mb
        self.same_heads = same_heads_on_every_tp_rank

    def keep(self, layer, rows, head_lo, heads):
        c = self.cfg
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.mb.step * 1009 + layer)
        full = torch.rand(c.batch, c.heads, c.seq, c.seq, generator=g) >= c.dropout
        h0 = 0 if self.same_heads else head_lo
        return full[self.mb.row_lo:self.mb.row_lo + rows, h0:h0 + heads]


def rope_tables(cfg):
    hs = cfg.hidden // cfg.heads
    inv = 1.0 / cfg.rope_theta ** (torch.arange(0, hs, 2, dtype=torch.float32) / hs)
    f = torch.outer(torch.arange(cfg.seq, dtype=torch.float32), inv)
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Attention(nn.Module):
    # x (B,T,C) (B,T/tp,C under SP) -> (B,T,C); a rank holds heads [head_lo, head_lo + Hl)
    def __init__(self, w, p, cfg, groups, layer, masks, col_reduce_input_grad=True):
        super().__init__()
        for n in ("q_proj", "k_proj", "v_proj"):
            setattr(self, n, ColumnParallelLinear(w[p + n + ".weight"], groups,
                                                  reduce_input_grad=col_reduce_input_grad))
        self.o_proj = RowParallelLinear(w[p + "o_proj.weight"], groups)
        self.heads, self.hs = cfg.heads // groups.layout.tp, cfg.hidden // cfg.heads
        self.head_lo = groups.tp_rank * self.heads
        self.layer, self.masks, self.dropout = layer, masks, cfg.dropout
        cos, sin = rope_tables(cfg)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        B, T, _ = q.shape
        q, k, v = (t.view(B, T, self.heads, self.hs).transpose(1, 2) for t in (q, k, v))
        q = q * self.cos + rotate_half(q) * self.sin
        k = k * self.cos + rotate_half(k) * self.sin
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hs)
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.masked_fill(causal, float("-inf")).softmax(dim=-1)
        if self.dropout > 0:
            keep = self.masks.keep(self.layer, B, self.head_lo, self.heads)
            att = att * keep / (1.0 - self.dropout)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.heads * self.hs)
        return self.o_proj(y)


class SwiGLU(nn.Module):
    def forward(self, gate, up):
        return F.silu(gate) * up


class MLP(nn.Module):
    def __init__(self, w, p, groups, row_reduce_output=True):
        super().__init__()
        self.gate_proj = ColumnParallelLinear(w[p + "gate_proj.weight"], groups)
        self.up_proj = ColumnParallelLinear(w[p + "up_proj.weight"], groups)
        self.act = SwiGLU()
        self.down_proj = RowParallelLinear(w[p + "down_proj.weight"], groups,
                                           reduce_output=row_reduce_output)

    def forward(self, x):
        return self.down_proj(self.act(self.gate_proj(x), self.up_proj(x)))


class Router(nn.Module):
    # x (B,T,C), weight (E,C), replicated on every tp rank -> logits (B,T,E)
    def __init__(self, weight):
        super().__init__()
        self.weight = nn.Parameter(weight.clone())

    def forward(self, x):
        return F.linear(x, self.weight)


class Softmax(nn.Module):
    def forward(self, logits):
        return logits.softmax(dim=-1)


class Weight(nn.Module):
    def __init__(self, param):
        super().__init__()
        self.weight = param


class Experts(nn.Module):
    """Every expert a SwiGLU MLP whose moe_ffn channels are split over tp (gate and up by
    rows, column-parallel; down by columns, row-parallel; each expert's output all-reduced
    before the combine, so the router's gradient is whole on every rank). Every token runs
    through every expert and the combine weights are zero off its top-k: the dense form of a
    dropless dispatch, the same sums on every layout."""

    def __init__(self, w, p, groups):
        super().__init__()
        self.gate_proj = Weight(tp_param(w[p + "gate_proj.weight"], 1, groups))  # (E,F,C)
        self.up_proj = Weight(tp_param(w[p + "up_proj.weight"], 1, groups))      # (E,F,C)
        self.down_proj = Weight(tp_param(w[p + "down_proj.weight"], 2, groups))  # (E,C,F)
        self.group = groups.tp

    def forward(self, x, combine):
        # x (B,T,C), combine (B,T,E) -> (B,T,C)
        x = copy_to_tp(x, self.group)
        gate, up, down = (local(m.weight) for m in (self.gate_proj, self.up_proj, self.down_proj))
        h = F.silu(torch.einsum("btc,efc->btef", x, gate)) * torch.einsum("btc,efc->btef", x, up)
        y = reduce_from_tp(torch.einsum("btef,ecf->btec", h, down), self.group)
        return (combine.unsqueeze(-1) * y).sum(dim=2)


class MoE(nn.Module):
    """probs = softmax(router(x)); each token's top-k experts, gates renormalised over them.
    Keeps, per forward (microbatch), the router statistics of the load-balancing loss
    E · Σ_e f_e · P_e (Switch Transformer, Fedus et al. 2021, eq. 4): tokens routed to each
    expert (f, counted, no gradient) and the sum of each expert's probability (P, with
    gradient). train.py turns them into the loss over the step's tokens."""

    def __init__(self, w, p, cfg, groups):
        super().__init__()
        self.gate = Router(w[p + "gate.weight"])
        self.softmax = Softmax()
        self.experts = Experts(w, p + "experts.", groups)
        self.top_k, self.n_experts = cfg.top_k, cfg.experts
        self.stats = []  # per microbatch of the step: (counts (E,), prob sums (E,), tokens)

    def forward(self, x):
        probs = self.softmax(self.gate(x))
        top, idx = probs.topk(self.top_k, dim=-1)
        combine = torch.zeros_like(probs).scatter(-1, idx, top / top.sum(-1, keepdim=True))
        counts = F.one_hot(idx, self.n_experts).sum(dim=(0, 1, 2)).to(probs.dtype)
        self.stats.append((counts, probs.sum(dim=(0, 1)), probs.shape[0] * probs.shape[1]))
        return self.experts(x, combine)


class DecoderLayer(nn.Module):
    def __init__(self, w, cfg, groups, layer, masks, bugs):
        super().__init__()
        p = f"model.layers.{layer}."
        self.input_layernorm = RMSNorm(w[p + "input_layernorm.weight"], cfg.norm_eps)
        self.self_attn = Attention(w, p + "self_attn.", cfg, groups, layer, masks,
                                   col_reduce_input_grad="col_bwd_no_allreduce" not in bugs)
        self.post_attention_layernorm = RMSNorm(w[p + "post_attention_layernorm.weight"],
                                                cfg.norm_eps)
        if cfg.moe:
            self.mlp = MoE(w, p + "mlp.", cfg, groups)
        else:
            self.mlp = MLP(w, p + "mlp.", groups,
                           row_reduce_output="row_fwd_no_allreduce" not in bugs)

    def forward(self, x):
        h = x + self.self_attn(self.input_layernorm(x))
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaStage(nn.Module):
    """Pipeline stage groups.pp_rank of the model: the embedding on the first stage, layers
    [lo, hi), the final norm, the tied head and the loss on the last. forward: the first
    stage takes tokens, the others the previous stage's hidden state; the last returns the
    per-token losses (B,T), the others their hidden state. The last stage of a pipeline holds
    its own copy of the embedding for the head (Megatron's shared embedding on the last stage),
    under the same name."""

    def __init__(self, cfg, seed, groups, masks, bugs=()):
        super().__init__()
        lay = groups.layout
        w = init_full(cfg, seed)
        per = cfg.layers // lay.pp
        self.lo, self.hi = groups.pp_rank * per, (groups.pp_rank + 1) * per
        self.first, self.last = groups.first_stage, groups.last_stage
        self.model = nn.Module()
        if self.first or self.last:
            self.model.embed_tokens = VocabParallelEmbedding(w["model.embed_tokens.weight"],
                                                             groups)
        self.model.layers = nn.ModuleDict(
            {str(i): DecoderLayer(w, cfg, groups, i, masks, bugs) for i in range(self.lo, self.hi)})
        if self.last:
            self.model.norm = RMSNorm(w["model.norm.weight"], cfg.norm_eps)
            self.lm_head = LMHead(self.model.embed_tokens, groups)
            self.loss = VocabParallelCrossEntropy(self.model.embed_tokens.lo, cfg.vocab, groups.tp,
                                                  mask_padding="vocab_pad_unmasked" not in bugs)

    def moe_layers(self):
        return [m for m in self.modules() if isinstance(m, MoE)]

    def forward(self, x, labels=None):
        if self.first:
            x = self.model.embed_tokens(x)
        for layer in self.model.layers.values():
            x = layer(x)
        if not self.last:
            return x
        return self.loss(self.lm_head(self.model.norm(x)), labels)
