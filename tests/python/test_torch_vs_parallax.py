"""A PyTorch layout of transformers' LlamaForCausalLM against Parallax's bitwise reference of the
same weights and tokens, judged by `parallax compare` (docs/validation.md, comparing traces).

The model (R's tiny Llama of test_torch_recorder.py: hidden 64, 2 layers, 4 heads over 2 KV heads,
every weight perturbed) is saved by save_pretrained; `parallax.record_trace` runs Parallax's
single device from that folder (model.init_from) on a token file, fp32 bitwise, 3 steps of AdamW
at PyTorch's defaults (lr 1e-3, eps 1e-8; betas 0.9/0.95, no weight decay, clipping at norm 1).
PyTorch trains the same model on the same tokens (Parallax's own batches, job.batch) on one device
and, on 2 gloo processes, under FSDP2 (fully_shard, each rank half the batch) and DTensor tensor
parallelism (q/k/v, gate/up colwise, o/down rowwise), each recorded by parallax.torch. Every
trace is consistent with rounding against Parallax's; the largest ratio per op is printed. A
planted bug, the DTensor tp run with o_proj's all-reduce left out (a rowwise linear whose output
stays partial: each rank's half of the sum), is named at block 0's attention output, step 1.

torch and transformers are test dependencies only. By hand:
python3 -m pytest -s tests/python/test_torch_vs_parallax.py
"""
import os
import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh --all)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
parallax = pytest.importorskip("parallax", reason="the parallax module is not built/installed")
import parallax.torch as pxt  # noqa: E402
from llmc_tokens import token_file  # noqa: E402
from test_torch_recorder import PARALLAX_MODEL, V, T, grad_norm, hf_model, tp_llama  # noqa: E402

B, STEPS = 4, 3
ADAM = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)  # PyTorch's lr and eps
CLIP = 1.0


def tokens_of(folder):
    return [np.load(os.path.join(folder, f"batch{s}.npy")) for s in range(1, STEPS + 1)]


def train(model, opt, folder, rec, rows=slice(None)):
    """STEPS steps on Parallax's batches (rows of each), cross-entropy over the rows' tokens,
    clipping at CLIP; the norm clipping sees recorded as grad/-/clip/norm."""
    for t in tokens_of(folder):
        x = torch.tensor(t[rows, :-1].astype(np.int64))
        y = torch.tensor(t[rows, 1:].astype(np.int64))
        logits = model(input_ids=x).logits
        torch.nn.functional.cross_entropy(logits.reshape(-1, V).float(), y.reshape(-1)).backward()
        rec.grads_ready()
        norm = grad_norm(model.parameters())
        rec.scalar("grad/-/clip/norm", norm)
        # clip_grad_norm_'s rule by hand: its foreach kernels refuse tp's mix of DTensor and
        # plain gradients (the norms' and the embedding's).
        coef = min(1.0, CLIP / (float(norm) + 1e-6))
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(coef)
        opt.step()
        opt.zero_grad()


def _fsdp(rank, folder):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",))
    model = hf_model("llama")
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), **ADAM)
    with pxt.record(model, os.path.join(folder, "fsdp2.h5"), optimizer=opt, mesh=mesh) as rec:
        train(model, opt, folder, rec, rows=slice(2 * rank, 2 * rank + 2))


def _tp(rank, folder, bug=False):
    model, mesh = tp_llama()
    if bug:  # block 0's o_proj output replaced by this rank's partial product: no all-reduce
        def partial(module, args, out):
            x = args[0].to_local() if hasattr(args[0], "to_local") else args[0]
            return torch.nn.functional.linear(x, module.weight.to_local())
        model.model.layers[0].self_attn.o_proj.register_forward_hook(partial)
    opt = torch.optim.AdamW(model.parameters(), **ADAM)
    name = "tp2_bug.h5" if bug else "tp2.h5"
    with pxt.record(model, os.path.join(folder, name), optimizer=opt, mesh=mesh) as rec:
        train(model, opt, folder, rec)


def _worker(rank, port, folder):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    try:
        _fsdp(rank, folder)
        _tp(rank, folder)
        _tp(rank, folder, bug=True)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Parallax's reference trace, PyTorch's one-device trace, and the 2-process layouts'."""
    import torch.multiprocessing as mp
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("torch-vs-parallax")
    token_file(d / "tokens.bin", np.random.default_rng(11).integers(0, V, size=4000))
    hf_model("llama").save_pretrained(d / "hf")
    data = {"source": "bin", "train_path": str(d / "tokens.bin"), "val_path": str(d / "tokens.bin")}
    model = {"vocab": V, "seq_len": T, "layers": 2, "heads": 4, "hidden": 64,
             **PARALLAX_MODEL["llama"], "init_from": str(d / "hf")}
    train_cfg = {"batch_size": B, "steps": STEPS, "eval_every": 0, "grad_clip": CLIP,
                 "threads": 1, "lr": ADAM["lr"], "min_lr": ADAM["lr"], "warmup_steps": 0,
                 "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.95, "eps": ADAM["eps"]}
    parallax.record_trace(d / "parallax.h5", steps=STEPS, model=model, data=data, train=train_cfg)
    with parallax.Job(model=model, data=data, train=train_cfg) as job:
        for s in range(1, STEPS + 1):
            np.save(d / f"batch{s}.npy", np.array(job.batch(s)))
    net = hf_model("llama")
    opt = torch.optim.AdamW(net.parameters(), **ADAM)
    with pxt.record(net, d / "one.h5", optimizer=opt) as rec:
        train(net, opt, str(d), rec)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(d)), nprocs=2)
    return d


def largest_per_op(report):
    """{op without its step: (largest ratio, its step)} in the reference's order."""
    out = {}
    for row in report["rows"]:
        op = row["op"] if row["rank"] < 0 else f"{row['op']} (rank {row['rank']})"
        if op not in out or row["ratio"] > out[op][0]:
            out[op] = (row["ratio"], row["step"])
    return out


@pytest.mark.parametrize("run", ["one", "fsdp2", "tp2"])
def test_a_pytorch_layout_is_consistent_with_rounding(runs, run):
    report = parallax.compare(runs / "parallax.h5", runs / f"{run}.h5")
    per_op = largest_per_op(report)
    print(f"\n{run} against Parallax's bitwise reference: {report['verdict']}")
    for op, (ratio, step) in sorted(per_op.items(), key=lambda kv: -kv[1][0])[:8]:
        print(f"  {op:<48} {ratio:8.4f}  (step {step})")
    assert report["within"], report["verdict"]
    assert report["reference_source"] == "parallax" and report["run_source"] == "torch"
    # Compared: every probe transformers has a module boundary for, every step.
    reference = parallax.Trace(runs / "parallax.h5").names()
    assert len(report["rows"]) + len(report["only_reference"]) == len(reference)
    assert not report["only_run"]
    assert set(report["only_reference"]) == {
        f"{s}/{p}" for s in range(1, STEPS + 1)
        for p in ("fwd/0/attn.qkv/out", "fwd/1/attn.qkv/out", "bwd/0/attn.core/dinp",
                  "bwd/1/attn.core/dinp", "fwd/-/loss/out")}
    # Not loose either: the orders of the sums really differ.
    assert report["max_ratio"] > 1e-3


def test_a_rowwise_linear_without_its_all_reduce_is_named(runs):
    report = parallax.compare(runs / "parallax.h5", runs / "tp2_bug.h5")
    assert not report["within"]
    first = report["first_over"]
    assert (first["step"], first["op"]) == (1, "fwd/0/attn.proj/out")
    assert first["ratio"] > 1e3
