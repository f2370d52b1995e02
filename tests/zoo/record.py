"""The zoo's model under Parallax's probe names: the name map (module -> probes, as
parallax.torch's LLAMA_MAP, plus the loss module and the MoE layer) and the shard map (where a
rank's local activation sits in the logical tensor), for parallax.torch.record.

A rank's local activation is one of: the residual stream (B, T, C), whole or, under sequence
parallelism, rows [r·T/tp, (r+1)·T/tp) of the sequence; features (B, T, F), columns
[r·F, (r+1)·F) of a tp-sharded dimension (the head's logits: its vocabulary rows); or whole (the
per-token losses, the MoE layer's tensors). Parameters are placed by the recorder from their
DTensor placements (layers.tp_param).
"""
import parallax.torch as pxt

DENSE_MAP = {
    "model.embed_tokens": {"out": "embed"},
    "model.layers.{l}.input_layernorm": "ln_1",  # din: the block's input
    "model.layers.{l}.self_attn.q_proj": {"din": "attn.qkv"},  # din: ln_1's output (q, k, v)
    "model.layers.{l}.self_attn.o_proj": {"in": "attn.core", "out": "attn.proj",
                                          "din": "attn.proj"},
    "model.layers.{l}.post_attention_layernorm": {"in": "residual_1", "out": "ln_2",
                                                  "din": "ln_2"},
    "model.layers.{l}": {"out": "residual_2"},
    "model.norm": "ln_f",  # din: the last block's output
    "lm_head": {"out": "head", "din": "head"},
    "loss": {"out": "loss", "din": "loss"},  # the per-token losses; din: d loss / d logits
}
MLP_MAP = {
    "model.layers.{l}.mlp.gate_proj": {"out": "mlp.gate", "din": "mlp.fc"},  # din: ln_2's output
    "model.layers.{l}.mlp.up_proj": {"out": "mlp.up"},
    "model.layers.{l}.mlp.act": "mlp.swiglu",  # din: gate_proj's output
    "model.layers.{l}.mlp.down_proj": {"out": "mlp.proj", "din": "mlp.proj"},
}
# Parallax's MoE probes (core/model/moe.cpp): the router's logits, their softmax, the combined
# expert output, and the gradient of the logits as moe.router's dinp.
MOE_MAP = {
    "model.layers.{l}.mlp.gate": {"out": "moe.router"},
    "model.layers.{l}.mlp.softmax": {"out": "moe.softmax", "din": "moe.router"},
    "model.layers.{l}.mlp.experts": {"out": "moe.combine"},
}

# Where a rank's piece of each probe sits: module glob -> {side: cut}, a cut "seq" (the residual
# stream: rows of the sequence under SP) or "feat" (columns over tp); a side not named is whole.
# The recorder takes the first glob that matches, so model.layers.* comes last.
CUTS = {
    "model.embed_tokens": {"out": "seq"},
    "model.layers.*.input_layernorm": {"out": "seq", "din": "seq"},
    "model.layers.*.self_attn.q_proj": {"din": "seq"},
    "model.layers.*.self_attn.o_proj": {"in": "feat", "din": "feat", "out": "seq"},
    "model.layers.*.post_attention_layernorm": {"in": "seq", "out": "seq", "din": "seq"},
    "model.layers.*.mlp.gate_proj": {"out": "feat", "din": "seq"},
    "model.layers.*.mlp.up_proj": {"out": "feat"},
    "model.layers.*.mlp.act": {"out": "feat", "din": "feat"},
    "model.layers.*.mlp.down_proj": {"out": "seq", "din": "feat"},
    "model.layers.*.mlp.gate": {},
    "model.layers.*.mlp.softmax": {},
    "model.layers.*.mlp.experts": {},
    "model.norm": {"out": "seq", "din": "seq"},
    "lm_head": {"out": "feat", "din": "seq"},
    "loss": {"din": "feat"},
    "model.layers.*": {"out": "seq"},
}


def shard_map(layout, groups):
    """{module glob: fn(side, local tensor) -> {dim: (lo, logical size)}} for the recorder."""
    tp, r = layout.tp, groups.tp_rank

    def placer(cuts):
        def fn(side, t):
            cut = cuts.get(side)
            if cut == "seq" and layout.sp:
                return {1: (r * t.shape[1], t.shape[1] * tp)}
            if cut == "feat" and tp > 1:
                return {2: (r * t.shape[2], t.shape[2] * tp)}
            return {}
        return fn

    return {glob: placer(cuts) for glob, cuts in CUTS.items()}


def recorder(stage, opt, path, cfg, layout, groups):
    """parallax.torch.record of a zoo run (a context manager). Gradients are not rescaled: the
    loss is already the step's (a sum over its tokens over their count), the dp gradients summed."""
    name_map = dict(DENSE_MAP, **(MOE_MAP if cfg.moe else MLP_MAP))
    return pxt.record(stage, path, optimizer=opt, name_map=name_map, mesh=groups.mesh,
                      shard_map=shard_map(layout, groups), dinp_scale=1.0)
