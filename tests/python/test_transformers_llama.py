"""Parallax's llama block against Hugging Face transformers' LlamaForCausalLM, Qwen3ForCausalLM and
Qwen3MoeForCausalLM.

Four random models, every parameter perturbed so that a misplaced vector shows, saved by
save_pretrained (safetensors): a LlamaForCausalLM with grouped-query attention (hidden 64, 2 layers,
4 heads over 2 KV heads, MLP 96, 97 tokens, 32 positions, rope_theta 1e4) and an untied head; a
Llama 3.1 one (rope_type "llama3", factor 8 over 16 original positions, theta 5e5) with a tied
head; a Qwen3ForCausalLM (q and k normalised per head, head_dim 32 != hidden / heads, kv 2,
theta 1e6); a Qwen3MoeForCausalLM (layer 0 dense, layer 1 four experts of 48 channels, 2 per
token, norm_topk_prob). Each goes through `parallax convert DIR --to m.h5`; one training step of
Parallax started from it (model.init_from; the MoE dropless, without aux or z-loss, which
transformers' plain LM loss has not) gives, on the step's tokens, the loss and every parameter's
gradient of the transformers model run in float64 (model.double()) on the same tokens: the loss
within 1e-6 and each gradient within 1e-5 in relative L2 error (Parallax computes in fp32; the
names are Hugging Face's, the experts stacked in Parallax). `parallax convert m.h5 --to DIR2`
writes model.safetensors byte for byte and the config.json transformers wrote (but its version),
and from_pretrained(DIR2) gives the original model's fp32 logits bit for bit. A RoPE type or a
sliding window Parallax does not compute is refused naming the key.

torch and transformers are test dependencies only (scripts/setup.sh --all installs them); the
library never imports them. By hand: python3 -m pytest tests/python/test_transformers_llama.py
"""
import json
import os
import subprocess

import numpy as np
import pytest
from llmc_tokens import token_file

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh --all)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
parallax = pytest.importorskip("parallax", reason="the parallax module is not built/installed")

EXE = os.environ.get("PARALLAX_EXE")
V, T = 97, 32
COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, vocab_size=V, max_position_embeddings=T)

# name: (transformers class, config class, its keys, Parallax's model keys)
MODELS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(rope_theta=10000.0),
              dict(kv_heads=2, head_dim=16, norm_eps=1e-6, rope_theta=10000.0)),
    "llama31": ("LlamaForCausalLM", "LlamaConfig",
                dict(tie_word_embeddings=True, rms_norm_eps=1e-5,
                     rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=16,
                                       rope_theta=500000.0)),
                dict(kv_heads=2, head_dim=16, norm_eps=1e-5, rope_theta=500000.0, rope_factor=8.0,
                     rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                     rope_original_max_positions=16, tie_embeddings=True)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(head_dim=32, rope_theta=1e6),
              dict(kv_heads=2, head_dim=32, norm_eps=1e-6, rope_theta=1e6, qk_norm=True)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig",
                  dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
                       decoder_sparse_step=2, norm_topk_prob=True),
                  dict(kv_heads=2, head_dim=16, norm_eps=1e-6, rope_theta=10000.0, qk_norm=True,
                       moe_experts=4, moe_top_k=2, moe_ffn=48, moe_every=2, moe_norm_topk=True,
                       moe_capacity_factor=0.0, moe_aux_loss=0.0, moe_z_loss=0.0)),
}


def convert(src, dst, *extra):
    """`parallax convert SRC --to DST` (the executable when the test command gives it)."""
    if EXE:
        r = subprocess.run([EXE, "convert", str(src), "--to", str(dst), *extra],
                           capture_output=True, text=True)
        return r.returncode, r.stdout + r.stderr
    try:
        return 0, parallax.convert(src, dst)
    except parallax.DataError as e:
        return 2, str(e)


def random_model(name, seed):
    cls, config_cls, keys, _ = MODELS[name]
    torch.manual_seed(seed)
    # The experts' plain loop: grouped_mm, the default, has no float64.
    eager = dict(experts_implementation="eager") if "num_experts" in keys else {}
    config = getattr(transformers, config_cls)(**COMMON, **keys, **eager)
    model = getattr(transformers, cls)(config)
    with torch.no_grad():
        for p in model.parameters():  # the norms away from 1 and the router from 0 too
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def hf_gradients(model, fe):
    """{Parallax name: gradient}: transformers' names, its fused experts (gate_up_proj (E, 2FE, C),
    down_proj (E, C, FE)) as Parallax's stacks (E·FE, C) and (E·C, FE)."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad.numpy()
        if name.endswith("mlp.experts.gate_up_proj"):
            out[name[:-len("gate_up_proj")] + "gate_proj.weight"] = g[:, :fe].reshape(-1, g.shape[2])
            out[name[:-len("gate_up_proj")] + "up_proj.weight"] = g[:, fe:].reshape(-1, g.shape[2])
        elif name.endswith("mlp.experts.down_proj"):
            out[name + ".weight"] = g.reshape(-1, g.shape[2])
        else:
            out[name] = g
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("transformers-llama")
    token_file(d / "tokens.bin", np.random.default_rng(7).integers(0, V, size=400))
    return d


@pytest.fixture(scope="module", params=list(MODELS))
def saved(request, base):
    """The random model, its save_pretrained folder and m.h5 converted from it."""
    name = request.param
    d = base / name
    model = random_model(name, 1234)
    model.save_pretrained(d / "hf")
    assert (d / "hf" / "model.safetensors").exists()
    rc, out = convert(d / "hf", d / "m.h5")
    assert rc == 0, out
    return name, d, model


def parallax_step(base, name, init_from):
    """One step from init_from on batches of the token file: loss, {name: gradient}, tokens."""
    data = {"source": "bin", "train_path": str(base / "tokens.bin"),
            "val_path": str(base / "tokens.bin")}
    model = {"arch": "llama", "vocab": V, "seq_len": T, "layers": 2, "heads": 4, "hidden": 64,
             "ffn": 96, **MODELS[name][3], "init_from": str(init_from)}
    with parallax.Job(model=model, data=data,
                      train={"batch_size": 4, "steps": 1, "eval_every": 0, "grad_clip": 0.0,
                             "threads": 1}) as job:
        loss = job.step(1)["loss"]
        grads = {k: np.array(v, dtype=np.float64) for k, v in job.grads().items()}
        tokens = np.array(job.batch(1))
    return loss, grads, tokens


def test_loss_and_every_gradient_match_transformers_in_float64(saved, base):
    name, d, _ = saved
    loss, grads, tokens = parallax_step(base, name, d / "m.h5")

    ref = random_model(name, 1234).double()
    x = torch.tensor(tokens[:, :-1], dtype=torch.long)
    y = torch.tensor(tokens[:, 1:], dtype=torch.long)
    logits = ref(input_ids=x).logits
    ref_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
    ref_loss.backward()
    want = hf_gradients(ref, MODELS[name][2].get("moe_intermediate_size", 0))
    assert set(grads) == set(want)  # a tied head is the embedding, listed once

    loss_err = abs(loss - ref_loss.item()) / abs(ref_loss.item())
    errs = {k: np.linalg.norm(g - want[k]) / np.linalg.norm(want[k]) for k, g in grads.items()}
    worst = max(errs, key=errs.get)
    print(f"\n{name}: loss {loss:.9f} vs {ref_loss.item():.9f} (float64): relative error "
          f"{loss_err:.3g}; worst gradient {worst}: relative L2 error {errs[worst]:.3g}")
    assert loss_err <= 1e-6
    assert all(e <= 1e-5 for e in errs.values()), {k: v for k, v in errs.items() if v > 1e-5}

    # model.init_from the folder itself: the same bits.
    loss2, grads2, tokens2 = parallax_step(base, name, d / "hf")
    assert loss2 == loss and np.array_equal(tokens2, tokens)
    assert all(np.array_equal(grads2[k], grads[k]) for k in grads)


def test_back_to_transformers_byte_for_byte_and_logits_bit_for_bit(saved):
    name, d, model = saved
    rc, out = convert(d / "m.h5", d / "hf2")
    assert rc == 0, out
    assert (d / "hf2" / "model.safetensors").read_bytes() == (d / "hf" / "model.safetensors").read_bytes()
    ours = json.loads((d / "hf2" / "config.json").read_text())
    theirs = json.loads((d / "hf" / "config.json").read_text())
    theirs.pop("transformers_version")
    assert ours == theirs

    back = getattr(transformers, MODELS[name][0]).from_pretrained(d / "hf2").eval()
    assert all(p.dtype == torch.float32 for p in back.parameters())
    x = torch.tensor(np.random.default_rng(3).integers(0, V, size=(3, T)), dtype=torch.long)
    with torch.no_grad():
        assert torch.equal(back(input_ids=x).logits, model(input_ids=x).logits)


def test_bfloat16_goes_round_byte_for_byte(tmp_path):
    bf16 = random_model("qwen3", 99).to(torch.bfloat16)
    bf16.save_pretrained(tmp_path / "hf")
    rc, out = convert(tmp_path / "hf", tmp_path / "m.h5")
    assert rc == 0 and "BF16" in out, out
    rc, out = convert(tmp_path / "m.h5", tmp_path / "back")
    assert rc == 0, out
    assert ((tmp_path / "back" / "model.safetensors").read_bytes() ==
            (tmp_path / "hf" / "model.safetensors").read_bytes())
    assert json.loads((tmp_path / "back" / "config.json").read_text())["dtype"] == "bfloat16"


@pytest.mark.parametrize("config_cls,keys,key", [
    ("LlamaConfig", dict(rope_scaling=dict(rope_type="linear", factor=2.0)), "rope_type"),
    ("LlamaConfig", dict(hidden_act="gelu"), "hidden_act"),
    ("Qwen3Config", dict(head_dim=16, use_sliding_window=True, sliding_window=8),
     "use_sliding_window"),
])
def test_a_model_parallax_does_not_compute_is_refused_naming_the_key(tmp_path, config_cls, keys, key):
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**COMMON, **keys)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "hf")
    rc, out = convert(tmp_path / "hf", tmp_path / "m.h5")
    assert rc == 2, out
    assert key in out and "config.json" in out
    assert not (tmp_path / "m.h5").exists()
