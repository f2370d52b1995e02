"""parallax.torch, the PyTorch recorder (docs/torch.md), on tiny transformers models and a toy model
of our own.

One device: recording changes no loss (bit for bit, GPT-2 and Llama); a recorded fp64 step of a
transformers model has every probe of a `parallax record` trace of the same config (Parallax's
names and shapes; only what has no module boundary in transformers is missing) and agrees with it
to fp32 rounding, its weights after step 1 too; `every` and microbatches; the checksum is
Parallax's; bad arguments are refused naming them; `import parallax` imports no torch.

Two gloo processes (one spawn runs every layout): DDP with two microbatches a rank, FSDP2
(fully_shard), DTensor tensor parallelism (colwise / rowwise), and a two-stage pipeline of the toy
model under a name_map (its second stage numbered from 0: layer_offset) each give the single
device's probes, shapes and values to rounding (relative L2 error < 1e-5); a DDP rank that keeps
its local gradient (a comm hook that drops the all-reduce's result) shows under /replicas, its
pieces listed in /pieces.

torch and transformers are test dependencies only. By hand:
python3 -m pytest tests/python/test_torch_recorder.py
"""
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from llmc_tokens import token_file

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh --all)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
parallax = pytest.importorskip("parallax", reason="the parallax module is not built/installed")
h5py = pytest.importorskip("h5py")
import parallax.torch as pxt  # noqa: E402

V, T, B, STEPS = 97, 32, 4, 2
LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=V, max_position_embeddings=T)
GPT2 = dict(vocab_size=V, n_positions=T, n_embd=64, n_layer=2, n_head=4, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
# Parallax's [model] for the same models (docs/config.md), started from their weights.
PARALLAX_MODEL = {
    "llama": dict(arch="llama", ffn=96, kv_heads=2, head_dim=16, norm_eps=1e-6,
                  rope_theta=10000.0),
    "gpt2": dict(arch="gpt2", ffn=256),
}
# eps 1e-6: Adam's step lr·g / (sqrt(v) + eps) turns a gradient's rounding error δg into
# lr·δg / eps where g is tiny (a sum that cancels), which a layout's other summation order would
# then show at step 2 above 1e-5 with eps 1e-8.
ADAM = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-6, weight_decay=0.0)
# Probes a transformers model has no module boundary for (the spec: attn.qkv/out and
# attn.core/dinp of a Llama are after RoPE with KV heads repeated); the per-token losses
# (fwd/-/loss/out) only when the loop gives them (rec.activation).
NO_BOUNDARY = {"llama": ("attn.qkv/out", "attn.core/dinp"), "gpt2": ()}


def hf_model(kind, dtype=torch.float32):
    """A tiny transformers model, every parameter perturbed (norms away from 1), the same on
    every process."""
    torch.manual_seed(1234)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.to(dtype).train()


# The toy model of the pipeline test: our own module names, mapped by NET_MAP.
class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1, self.attn = torch.nn.LayerNorm(c), torch.nn.Linear(c, c)
        self.ln_2, self.fc = torch.nn.LayerNorm(c), torch.nn.Linear(c, 4 * c)
        self.act, self.proj = torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4 * c, c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(self.act(self.fc(self.ln_2(x))))


class Net(torch.nn.Module):
    """embed, blocks, ln_f, head; a pipeline stage keeps some of them (None: not on it)."""

    def __init__(self, embed, blocks, ln_f, head):
        super().__init__()
        self.embed, self.layers = embed, torch.nn.ModuleList(blocks)
        self.ln_f, self.head = ln_f, head

    def forward(self, x):
        h = self.embed(x) if self.embed is not None else x
        for block in self.layers:
            h = block(h)
        return self.head(self.ln_f(h)) if self.head is not None else h


NET_MAP = {"embed": {"out": "embed"}, "layers.{l}.ln_1": "ln_1",
           "layers.{l}.attn": {"out": "attn.proj", "din": "attn.qkv"},
           "layers.{l}.ln_2": {"in": "residual_1", "out": "ln_2", "din": "ln_2"},
           "layers.{l}.fc": "mlp.fc", "layers.{l}.act": "mlp.gelu", "layers.{l}.proj": "mlp.proj",
           "layers.{l}": {"out": "residual_2"}, "ln_f": "ln_f",
           "head": {"out": "head", "din": "head", "dout": "loss"}}


def net_parts():
    torch.manual_seed(99)
    c = 32
    return torch.nn.Embedding(V, c), [Block(c), Block(c)], torch.nn.LayerNorm(c), \
        torch.nn.Linear(c, V, bias=False)


def batches(steps=STEPS):
    """(x, y) of each step: B sequences of T tokens and their next tokens."""
    tokens = np.random.default_rng(5).integers(0, V, size=(steps, B, T + 1))
    return [(torch.tensor(t[:, :-1]), torch.tensor(t[:, 1:])) for t in tokens]


def grad_norm(params):
    """The global gradient norm, DTensor gradients made whole (the same on every rank)."""
    total = torch.zeros((), dtype=torch.float64)
    for p in params:
        if p.grad is not None:
            g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
            total += g.double().pow(2).sum()
    return total.sqrt()


def train(model, opt, data, rec=None, rows=slice(None), microbatches=1, logits=None):
    """Steps of data on `rows` of each batch, cut into microbatches (gradient accumulation);
    returns the losses (of the last microbatch of each step)."""
    logits = logits or (lambda m, x: m(input_ids=x).logits)
    losses = []
    for x, y in data:
        x, y = x[rows], y[rows]
        n = x.shape[0] // microbatches
        for k in range(microbatches):
            out = logits(model, x[k * n:(k + 1) * n])
            loss = torch.nn.functional.cross_entropy(out.reshape(-1, V).float(),
                                                     y[k * n:(k + 1) * n].reshape(-1))
            (loss / microbatches).backward()
        if rec:
            rec.grads_ready()
            rec.scalar("grad/-/clip/norm", grad_norm(model.parameters()))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def rel_err(ref, run):
    ref, run = ref.astype(np.float64), run.astype(np.float64)
    scale = np.linalg.norm(ref)
    return np.linalg.norm(run - ref) / scale if scale > 0 else np.linalg.norm(run)


def tolerance(name):
    return 1e-5


def assert_same_trace(ref_path, run_path, skip=()):
    """Every probe of ref in run, same shape, relative L2 error within tolerance(name)."""
    ref, run = parallax.Trace(ref_path), parallax.Trace(run_path)
    want = [n for n in ref.names() if not any(s in n for s in skip)]
    assert run.names() == want  # the same probes in the same order
    errs = {}
    for name in want:
        a, b = ref.read(name), run.read(name)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        errs[name] = rel_err(a, b)
    bad = {k: v for k, v in errs.items() if v > tolerance(k)}
    assert not bad, bad
    return errs


# ---- one device ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def refs(tmp_path_factory):
    """Single-device traces of the layouts' runs: GPT-2 and Llama (B rows, one microbatch) and
    the toy model, STEPS steps each."""
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("torch-recorder")
    for kind in ("gpt2", "llama"):
        model = hf_model(kind)
        opt = torch.optim.AdamW(model.parameters(), **ADAM)
        with pxt.record(model, d / f"{kind}.h5", optimizer=opt) as rec:
            train(model, opt, batches(), rec)
    embed, blocks, ln_f, head = net_parts()
    net = Net(embed, blocks, ln_f, head)
    opt = torch.optim.AdamW(net.parameters(), **ADAM)
    with pxt.record(net, d / "net.h5", optimizer=opt, name_map=NET_MAP) as rec:
        train(net, opt, batches(), rec, logits=lambda m, x: m(x))
    return d


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_recording_changes_no_loss_bit_for_bit(tmp_path, kind):
    runs = []
    for recorded in (False, True):
        model = hf_model(kind)
        opt = torch.optim.AdamW(model.parameters(), **ADAM)
        if recorded:
            with pxt.record(model, tmp_path / "t.h5", optimizer=opt) as rec:
                losses = train(model, opt, batches(3), rec, microbatches=2)
        else:
            losses = train(model, opt, batches(3), microbatches=2)
        runs.append((losses, [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_probes_names_shapes_and_values_are_parallaxs(tmp_path, kind):
    """One fp64 step of the transformers model recorded, against `parallax record` of the same
    config from the same weights on the same tokens (Parallax in fp32)."""
    token_file(tmp_path / "tokens.bin", np.random.default_rng(7).integers(0, V, size=400))
    hf_model(kind).save_pretrained(tmp_path / "hf")
    data = {"source": "bin", "train_path": str(tmp_path / "tokens.bin"),
            "val_path": str(tmp_path / "tokens.bin")}
    model = {"vocab": V, "seq_len": T, "layers": 2, "heads": 4, "hidden": 64,
             **PARALLAX_MODEL[kind], "init_from": str(tmp_path / "hf")}
    train_cfg = {"batch_size": B, "steps": 1, "eval_every": 0, "grad_clip": 0.0, "threads": 1,
                 "lr": ADAM["lr"], "min_lr": ADAM["lr"], "warmup_steps": 0, "weight_decay": 0.0,
                 "beta1": 0.9, "beta2": 0.95, "eps": ADAM["eps"]}
    parallax.record_trace(tmp_path / "parallax.h5", steps=1, model=model, data=data,
                          train=train_cfg)
    with parallax.Job(model=model, data=data, train=train_cfg) as job:
        tokens = np.array(job.batch(1)).astype(np.int64)

    net = hf_model(kind, torch.float64)
    opt = torch.optim.AdamW(net.parameters(), **ADAM)
    x, y = torch.tensor(tokens[:, :-1]), torch.tensor(tokens[:, 1:])
    with pxt.record(net, tmp_path / "torch.h5", optimizer=opt) as rec:
        logits = net(input_ids=x).logits
        losses = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1),
                                                   reduction="none")
        rec.activation("fwd/-/loss/out", losses.view(B, T))
        losses.mean().backward()
        rec.scalar("grad/-/clip/norm", grad_norm(net.parameters()))
        opt.step()

    ref, run = parallax.Trace(tmp_path / "parallax.h5"), parallax.Trace(tmp_path / "torch.h5")
    missing = [n for n in ref.names() if n not in run.names()]
    assert sorted(missing) == sorted(f"1/{p}/{layer}/{op}/{t}" for layer in (0, 1)
                                     for op, t in (s.split("/") for s in NO_BOUNDARY[kind])
                                     for p in ["fwd" if t == "out" else "bwd"])
    assert set(run.names()) <= set(ref.names())
    errs = {}
    for name in run.names():
        a, b = ref.read(name), run.read(name)
        assert a.shape == b.shape, (name, a.shape, b.shape)
        errs[name] = rel_err(a, b)
        # The weights after step 1. Adam's first step moves each by lr·g / (|g| + eps): a
        # gradient near eps makes a fraction of lr that rounding decides, hence atol lr / 100.
        if "/optim/" in name and "/param/" in name and tolerance(name) == 1e-5:
            assert np.allclose(b, a, rtol=1e-5, atol=ADAM["lr"] / 100), name
    worst = max(errs, key=errs.get)
    print(f"\n{kind}: {len(errs)} probes, worst {worst}: relative L2 error {errs[worst]:.3g}")
    assert all(e <= tolerance(n) for n, e in errs.items()), \
        {n: e for n, e in errs.items() if e > tolerance(n)}
    # The same checksum as Parallax's writer (core/io/checkpoint.h).
    with h5py.File(tmp_path / "parallax.h5") as f:
        for name in ref.names()[:5]:
            ds = f["probes/" + name]
            assert pxt.checksum_f32(ds[()]) == int(ds.attrs["checksum"])
    with h5py.File(tmp_path / "torch.h5") as f:
        assert f.attrs["source"] == b"torch" and f.attrs["config"] == b""
        assert f.attrs["precision"] == b"fp32" and f.attrs["layout"] == b""


def test_every_and_microbatches(tmp_path, refs):
    model = hf_model("llama")
    opt = torch.optim.AdamW(model.parameters(), **ADAM)
    with pxt.record(model, tmp_path / "t.h5", optimizer=opt, every=2,
                    probes=["*/fwd/**", "*/grad/**"]) as rec:
        train(model, opt, batches(3), rec, microbatches=2)
    trace = parallax.Trace(tmp_path / "t.h5")
    assert {n.split("/")[0] for n in trace.names()} == {"1", "3"}
    assert trace.info["stride"] == 2 and trace.info["steps"] == 3
    assert trace.info["patterns"] == ["*/fwd/**", "*/grad/**"]
    # Two microbatches of two rows fill the four rows of one: step 1 as the reference's.
    ref = parallax.Trace(refs / "llama.h5")
    for name in (n for n in trace.names() if n.startswith("1/")):
        assert rel_err(ref.read(name), trace.read(name)) < 1e-5, name


def test_bad_arguments_are_refused_naming_them(tmp_path):
    model = hf_model("gpt2")
    adam = torch.optim.AdamW(model.parameters(), **ADAM)
    with pytest.raises(ValueError, match=r"\*/fwd/\*/attn\.qkvv/out"):
        pxt.record(model, tmp_path / "t.h5", optimizer=adam, probes=["*/fwd/*/attn.qkvv/out"])
    with pytest.raises(TypeError, match="SGD"):
        pxt.record(model, tmp_path / "t.h5", optimizer=torch.optim.SGD(model.parameters(), lr=1))
    pxt.record(model, tmp_path / "t.h5", optimizer=torch.optim.SGD(model.parameters(), lr=1),
               probes=["*/fwd/**"])  # no optim probes: any optimizer
    with pytest.raises(ValueError, match="layers.{l}.mlp.fc2"):
        pxt.record(Net(*net_parts()), tmp_path / "t.h5",
                   name_map={**NET_MAP, "layers.{l}.mlp.fc2": "mlp.fc"})
    with pytest.raises(ValueError, match="every"):
        pxt.record(model, tmp_path / "t.h5", every=0)
    with pytest.raises(ValueError, match="precision 'fp64'"):
        pxt.record(model, tmp_path / "t.h5", precision="fp64")
    with pytest.raises(ValueError, match="name_map"):
        pxt.record(Net(*net_parts()), tmp_path / "t.h5")  # not a transformers model
    assert not list(tmp_path.iterdir())  # nothing written, no hook left


def test_import_parallax_imports_no_torch():
    code = "import sys, parallax; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


# ---- two processes ------------------------------------------------------------------------------

def _ddp(rank, out, bug=False):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = hf_model("gpt2")
    ddp = DDP(model)
    if bug:  # rank 1 joins every all-reduce but keeps its own (half-batch) gradient
        def keep_local(state, bucket):
            local = bucket.buffer().clone()
            fut = dist.all_reduce(bucket.buffer().div_(2), async_op=True).get_future()
            return fut.then(lambda f: local if rank == 1 else f.value()[0])
        ddp.register_comm_hook(None, keep_local)
    opt = torch.optim.AdamW(ddp.parameters(), **ADAM)
    name = "ddp_bug" if bug else "ddp"
    with pxt.record(ddp, os.path.join(out, name + ".h5"), optimizer=opt) as rec:
        # The bug with one microbatch: under accumulation rank 1's unreduced first gradient
        # would join the second all-reduce and make rank 0's wrong as well.
        train(ddp, opt, batches(), rec, rows=slice(2 * rank, 2 * rank + 2),
              microbatches=1 if bug else 2)


def _fsdp(rank, out, kind):
    """FSDP2 over both ranks: each layer and the root fully_shard (GPT-2's Conv1D weights, held
    (in, out), are cut along `in`: transposed, its pieces are column slabs)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("fsdp",))
    model = hf_model(kind)
    for layer in (model.model.layers if kind == "llama" else model.transformer.h):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), **ADAM)
    with pxt.record(model, os.path.join(out, f"fsdp_{kind}.h5"), optimizer=opt,
                    mesh=mesh) as rec:
        train(model, opt, batches(), rec, rows=slice(2 * rank, 2 * rank + 2))


def tp_llama(tp=2):
    """hf_model("llama") under Megatron's plan through DTensor over a `tp` mesh: q/k/v and
    gate/up colwise, o/down rowwise. Returns the model and its mesh."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
    model = hf_model("llama")
    plan = {"self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(), "self_attn.o_proj": RowwiseParallel(),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel()}
    for layer in model.model.layers:
        parallelize_module(layer, mesh, plan)
    return model, mesh


def _tp(rank, out):
    model, mesh = tp_llama()
    opt = torch.optim.AdamW(model.parameters(), **ADAM)
    with pxt.record(model, os.path.join(out, "tp.h5"), optimizer=opt, mesh=mesh) as rec:
        train(model, opt, batches(), rec)  # every tp rank runs the whole batch


def _tp_sp(rank, out):
    """Llama with sequence parallelism: the residual stream a DTensor cut along T (Shard(1)),
    gathered before each colwise projection (torchtitan's plan on transformers' names)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    model = hf_model("llama")
    seq = Shard(1)
    parallelize_module(model, mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq,
                                              use_local_output=False),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=seq, output_layouts=Replicate())})
    col = lambda: ColwiseParallel(input_layouts=seq)  # noqa: E731
    row = lambda: RowwiseParallel(output_layouts=seq, use_local_output=False)  # noqa: E731
    for layer in model.model.layers:
        parallelize_module(layer, mesh, {
            "input_layernorm": SequenceParallel(), "post_attention_layernorm": SequenceParallel(),
            "self_attn.q_proj": col(), "self_attn.k_proj": col(), "self_attn.v_proj": col(),
            "self_attn.o_proj": row(), "mlp.gate_proj": col(), "mlp.up_proj": col(),
            "mlp.down_proj": row()})
    opt = torch.optim.AdamW(model.parameters(), **ADAM)
    with pxt.record(model, os.path.join(out, "tp_sp.h5"), optimizer=opt, mesh=mesh) as rec:
        train(model, opt, batches(), rec)


def _tp_net(rank, out):
    """The toy model with tensor and sequence parallelism and local tensors between modules: the
    recorder places sequence rows by the step's T, columns by each Linear's DTensor weight, and
    the GELU's columns (no weight) by shard_map."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    net = Net(*net_parts())
    sp = lambda: SequenceParallel(use_local_output=True)  # noqa: E731
    plan = {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "ln_f": sp(), "head": ColwiseParallel(input_layouts=Shard(1),
                                                  output_layouts=Replicate())}
    for i in range(2):
        plan.update({f"layers.{i}.ln_1": sp(), f"layers.{i}.attn": sp(), f"layers.{i}.ln_2": sp(),
                     f"layers.{i}.fc": ColwiseParallel(input_layouts=Shard(1)),
                     f"layers.{i}.proj": RowwiseParallel(output_layouts=Shard(1))})
    parallelize_module(net, mesh, plan)
    opt = torch.optim.AdamW(net.parameters(), **ADAM)
    gelu = {"layers.*.act": lambda side, t: {2: (rank * t.shape[2], 2 * t.shape[2])}}
    with pxt.record(net, os.path.join(out, "tp_net.h5"), optimizer=opt, mesh=mesh,
                    name_map=NET_MAP, shard_map=gelu) as rec:
        train(net, opt, batches(), rec, logits=lambda m, x: m(x))


def _pipelining(rank, out):
    """The toy model's two stages under torch.distributed.pipelining's 1F1B, two microbatches:
    the recorder is given the PipelineStage (its metadata inference is left out). The schedule's
    loss is each microbatch's mean (it scales the parameters' gradients by 1/2, not the
    activations'): dinp_scale 1/2."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
    embed, blocks, ln_f, head = net_parts()
    module = Net(embed, blocks[:1], None, None) if rank == 0 else Net(None, blocks[1:], ln_f, head)
    stage = PipelineStage(module, rank, 2, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=2, loss_fn=lambda out, y:
                            torch.nn.functional.cross_entropy(out.reshape(-1, V), y.reshape(-1)))
    opt = torch.optim.AdamW(module.parameters(), **ADAM)
    with pxt.record(stage, os.path.join(out, "pipelining.h5"), optimizer=opt, mesh=mesh,
                    name_map=NET_MAP, layer_offset=rank, dinp_scale=0.5) as rec:
        for x, y in batches():
            schedule.step(x) if rank == 0 else schedule.step(target=y)
            rec.grads_ready()
            local = grad_norm(module.parameters()).pow(2)
            dist.all_reduce(local)
            rec.scalar("grad/-/clip/norm", local.sqrt())
            opt.step()
            opt.zero_grad()


def _pp(rank, out):
    """Two stages by hand, two microbatches a step, one after the other: stage 0 the embedding
    and block 0, stage 1 block 1 (its layers.0: layer_offset 1), ln_f and the head."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("pp",))
    embed, blocks, ln_f, head = net_parts()
    stage = Net(embed, blocks[:1], None, None) if rank == 0 else Net(None, blocks[1:], ln_f, head)
    opt = torch.optim.AdamW(stage.parameters(), **ADAM)
    with pxt.record(stage, os.path.join(out, "pp.h5"), optimizer=opt, mesh=mesh,
                    name_map=NET_MAP, layer_offset=rank) as rec:
        for x, y in batches():
            for k in range(2):
                rows = slice(2 * k, 2 * k + 2)
                if rank == 0:
                    h = stage(x[rows])
                    dist.send(h.detach(), 1)
                    g = torch.empty_like(h)
                    dist.recv(g, 1)
                    h.backward(g)
                else:
                    h = torch.empty(2, T, 32)
                    dist.recv(h, 0)
                    h.requires_grad_()
                    loss = torch.nn.functional.cross_entropy(stage(h).reshape(-1, V),
                                                             y[rows].reshape(-1))
                    (loss / 2).backward()
                    dist.send(h.grad, 0)
            rec.grads_ready()
            local = grad_norm(stage.parameters()).pow(2)
            dist.all_reduce(local)
            rec.scalar("grad/-/clip/norm", local.sqrt())
            opt.step()
            opt.zero_grad()


def _worker(rank, world, port, out):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    try:
        _ddp(rank, out)
        _ddp(rank, out, bug=True)
        _fsdp(rank, out, "llama")
        _fsdp(rank, out, "gpt2")
        _tp(rank, out)
        _tp_sp(rank, out)
        _tp_net(rank, out)
        _pp(rank, out)
        _pipelining(rank, out)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """Every layout's trace, from one spawn of two gloo processes."""
    import torch.multiprocessing as mp
    d = tmp_path_factory.mktemp("torch-recorder-layouts")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, port, str(d)), nprocs=2)
    return d


@pytest.mark.parametrize("layout,ref", [
    ("ddp", "gpt2"), ("fsdp_llama", "llama"), ("fsdp_gpt2", "gpt2"), ("tp", "llama"),
    ("tp_sp", "llama"), ("tp_net", "net"), ("pp", "net"), ("pipelining", "net")])
def test_a_layout_gives_the_single_devices_trace(layouts, refs, layout, ref):
    errs = assert_same_trace(refs / f"{ref}.h5", layouts / f"{layout}.h5")
    worst = max(errs, key=errs.get)
    print(f"\n{layout}: {len(errs)} probes, worst {worst}: relative L2 error {errs[worst]:.3g}")
    with h5py.File(layouts / f"{layout}.h5") as f:
        assert "replicas" not in f  # replicated pieces agree bit for bit
        layout_attr = f.attrs["layout"].decode()
        pieces = bytes(f["pieces"][()]).decode().split("\n")
    assert '"world": 2' in layout_attr
    assert all(len(line.split("\t")) == 4 for line in pieces)
    held = {int(line.split("\t")[1]) for line in pieces}
    assert held == {0, 1}


def test_a_rank_that_keeps_its_own_gradient_shows_in_replicas(layouts, refs):
    with h5py.File(layouts / "ddp_bug.h5") as f:
        replicas = []
        f["replicas"].visititems(lambda name, obj: replicas.append(name)
                                 if isinstance(obj, h5py.Dataset) else None)
        grad = "1/grad/0/param/attn.c_attn.weight"
        piece = f[f"replicas/{grad}/1"]
        assert list(piece.attrs["lo"]) == [0, 0] and list(piece.attrs["hi"]) == [192, 64]
        assert pxt.checksum_f32(piece[()]) == int(piece.attrs["checksum"])
        theirs = piece[()]
    # Rank 1's every step-1 gradient (and its norm) disagrees; rank 0's, the logical tensor,
    # is the reduced one.
    assert all(name.endswith("/1") for name in replicas)
    step1 = {n for n in parallax.Trace(refs / "gpt2.h5").names() if n.startswith("1/grad/")}
    assert {n[:-2] for n in replicas if n.startswith("1/grad/")} == step1
    ref, run = parallax.Trace(refs / "gpt2.h5"), parallax.Trace(layouts / "ddp_bug.h5")
    assert rel_err(ref.read(grad), run.read(grad)) < 1e-5
    assert rel_err(ref.read(grad), theirs) > 1e-2
