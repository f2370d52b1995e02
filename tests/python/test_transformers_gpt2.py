"""Parallax's GPT-2 against Hugging Face transformers' GPT2LMHeadModel.

A random GPT2LMHeadModel (n_embd 64, 2 layers of 4 heads, 32 positions, 97 tokens, every
parameter perturbed so that a misplaced vector shows) saved by save_pretrained goes through
`parallax convert DIR --to m.h5`. One training step of Parallax started from it (model.init_from)
gives, on the step's tokens, the loss and every parameter's gradient of transformers' model run in
float64 on the same tokens: the loss within 1e-6 and each gradient within 1e-5 in relative L2
error (Parallax computes in fp32; the names mapped by hand, Conv1D weights transposed). Starting
from the folder itself gives the same bits. `parallax convert m.h5 --to DIR2` writes
model.safetensors byte for byte, and from_pretrained(DIR2) gives the original model's fp32 logits
bit for bit; a bfloat16 model goes round byte for byte too; a model Parallax does not compute is
refused naming the key.

torch and transformers are test dependencies only (scripts/setup.sh --all installs them); the
library never imports them. By hand: python3 -m pytest tests/python/test_transformers_gpt2.py
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
SIZES = dict(n_embd=64, n_layer=2, n_head=4, n_positions=32, vocab_size=97)
MODEL_KEYS = {"vocab": 97, "seq_len": 32, "layers": 2, "heads": 4, "hidden": 64, "ffn": 256}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


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


def hf_name(name):
    """A Parallax parameter's name in GPT2LMHeadModel's state dict."""
    return "transformer." + name + (".weight" if name in ("wte", "wpe") else "")


def hf_layout(name, a):
    """A Parallax tensor as transformers holds it: Conv1D keeps (in, out), Parallax (out, in)."""
    return a.T if name.endswith(CONV1D) else a


def random_model(seed):
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SIZES))
    with torch.no_grad():
        for p in model.parameters():  # LayerNorms and biases away from 1 and 0 too
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The random model, its save_pretrained folder, m.h5 converted from it, and a token file."""
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("transformers")
    model = random_model(1234)
    model.save_pretrained(d / "hf")
    assert (d / "hf" / "model.safetensors").exists()
    rc, out = convert(d / "hf", d / "m.h5")
    assert rc == 0, out
    token_file(d / "tokens.bin", np.random.default_rng(7).integers(0, 97, size=400))
    return d, model


def parallax_step(d, init_from):
    """One step from init_from on batches of the token file: loss, {name: gradient}, tokens."""
    data = {"source": "bin", "train_path": str(d / "tokens.bin"), "val_path": str(d / "tokens.bin")}
    with parallax.Job(model={**MODEL_KEYS, "init_from": str(init_from)}, data=data,
                      train={"batch_size": 4, "steps": 1, "eval_every": 0, "grad_clip": 0.0,
                             "threads": 1}) as job:
        loss = job.step(1)["loss"]
        grads = {k: np.array(v, dtype=np.float64) for k, v in job.grads().items()}
        tokens = np.array(job.batch(1))
    return loss, grads, tokens


def test_loss_and_every_gradient_match_transformers_in_float64(saved):
    d, model = saved
    loss, grads, tokens = parallax_step(d, d / "m.h5")

    ref = random_model(1234).double()
    x = torch.tensor(tokens[:, :-1], dtype=torch.long)
    y = torch.tensor(tokens[:, 1:], dtype=torch.long)
    logits = ref(input_ids=x).logits
    ref_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, SIZES["vocab_size"]),
                                                 y.reshape(-1))
    ref_loss.backward()
    params = dict(ref.named_parameters())  # the tied lm_head is wte, listed once
    assert {hf_name(n) for n in grads} == set(params)

    loss_err = abs(loss - ref_loss.item()) / abs(ref_loss.item())
    errs = {}
    for name, g in grads.items():
        want = params[hf_name(name)].grad.numpy()
        errs[name] = np.linalg.norm(hf_layout(name, g) - want) / np.linalg.norm(want)
    worst = max(errs, key=errs.get)
    print(f"\nloss {loss:.9f} vs {ref_loss.item():.9f} (float64): relative error {loss_err:.3g}; "
          f"worst gradient {worst}: relative L2 error {errs[worst]:.3g}")
    assert loss_err <= 1e-6
    assert all(e <= 1e-5 for e in errs.values()), {k: v for k, v in errs.items() if v > 1e-5}

    # model.init_from the folder itself: the same bits.
    loss2, grads2, tokens2 = parallax_step(d, d / "hf")
    assert loss2 == loss and np.array_equal(tokens2, tokens)
    assert all(np.array_equal(grads2[k], grads[k]) for k in grads)


def test_back_to_transformers_byte_for_byte_and_logits_bit_for_bit(saved):
    d, model = saved
    rc, out = convert(d / "m.h5", d / "hf2")
    assert rc == 0, out
    assert (d / "hf2" / "model.safetensors").read_bytes() == (d / "hf" / "model.safetensors").read_bytes()
    cfg = json.loads((d / "hf2" / "config.json").read_text())
    assert {k: cfg[k] for k in SIZES} == SIZES and cfg["architectures"] == ["GPT2LMHeadModel"]

    back = transformers.GPT2LMHeadModel.from_pretrained(d / "hf2").eval()
    assert all(p.dtype == torch.float32 for p in back.parameters())
    x = torch.tensor(np.random.default_rng(3).integers(0, 97, size=(3, 32)), dtype=torch.long)
    with torch.no_grad():
        assert torch.equal(back(input_ids=x).logits, model(input_ids=x).logits)


def test_bfloat16_goes_round_byte_for_byte(saved, tmp_path):
    d, model = saved
    bf16 = random_model(99).to(torch.bfloat16)
    bf16.save_pretrained(tmp_path / "hf")
    rc, out = convert(tmp_path / "hf", tmp_path / "m.h5")
    assert rc == 0 and "BF16" in out, out
    rc, out = convert(tmp_path / "m.h5", tmp_path / "back")
    assert rc == 0, out
    assert ((tmp_path / "back" / "model.safetensors").read_bytes() ==
            (tmp_path / "hf" / "model.safetensors").read_bytes())
    assert json.loads((tmp_path / "back" / "config.json").read_text())["dtype"] == "bfloat16"
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "back").eval()
    x = torch.tensor([[1, 5, 96, 0, 42]], dtype=torch.long)
    with torch.no_grad():
        assert torch.equal(back.to(torch.bfloat16)(input_ids=x).logits, bf16(input_ids=x).logits)


def test_a_model_parallax_does_not_compute_is_refused_naming_the_key(tmp_path):
    torch.manual_seed(0)
    relu = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SIZES, activation_function="relu"))
    relu.save_pretrained(tmp_path / "hf")
    rc, out = convert(tmp_path / "hf", tmp_path / "m.h5")
    assert rc == 2, out
    assert "activation_function" in out and "gelu_new" in out and "config.json" in out
    assert not (tmp_path / "m.h5").exists()
