"""The bug zoo (tests/zoo/README.md): eleven published, silent bugs of parallel training loops,
planted one at a time in a hand-written Megatron-style PyTorch script (train.py: tensor and
sequence parallelism, a two-stage pipeline with a tied embedding, data parallelism with gradient
accumulation, a MoE layer), each recorded by parallax.torch and named by `parallax compare`
against the one-process run at the step and op where it first changes anything (EXPECTED); and
every clean layout of the same script judged within budget on 5 seeds (no false alarm).

Everything runs under torchrun (gloo, CPU) in a temporary folder: per model (dense, MoE, attention
dropout) the one-process reference of every seed, then per layout one launch holding its clean
runs (every seed) and its bugs (seed 1). Each trace is compared with its seed's reference as soon
as its launch ends, then deleted. About 3 minutes on 2 cores, 3 steps a run. The launches are
shared by the tests of this file through one module fixture: under pytest-xdist keep the file on
one worker (--dist loadfile), or it runs them once per worker.

By hand: python3 -m pytest tests/zoo/test_zoo.py  (PARALLAX_EXE: the parallax executable,
default build/app/parallax; torch is needed, and parallax.torch).
"""
import json
import os
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup.sh --all)")
pytest.importorskip("parallax.torch", reason="the parallax module is not built/installed")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXE = os.environ.get("PARALLAX_EXE", os.path.join(ROOT, "build", "app", "parallax"))
SEEDS = (1, 2, 3, 4, 5)
STEPS = 3

# model -> train.py flags
MODELS = {"dense": [], "moe": ["--moe"], "dropout": ["--dropout", "0.1"]}
# layout -> (processes, model, train.py flags)
LAYOUTS = {
    "dp2_mb2": (2, "dense", ["--dp", "2", "--microbatches", "2"]),
    "tp2": (2, "dense", ["--tp", "2"]),
    "tp2_sp": (2, "dense", ["--tp", "2", "--sp"]),
    "tp4": (4, "dense", ["--tp", "4"]),
    "pp2": (2, "dense", ["--pp", "2"]),
    "dp2_tp2": (4, "dense", ["--dp", "2", "--tp", "2"]),
    "pp2_tp2_sp_mb2": (4, "dense", ["--pp", "2", "--tp", "2", "--sp", "--microbatches", "2"]),
    "tp2_mb2_moe": (2, "moe", ["--tp", "2", "--microbatches", "2"]),
    "tp2_dropout": (2, "dropout", ["--tp", "2"]),
}

# bug -> (layout, step, op): the first probe, in the reference's order, that the bug changes.
# Worked out from where each bug acts (README.md has the reasoning), not read off the output.
EXPECTED = {
    # down_proj's partial sum is the layer's MLP output: the first op after it is wrong.
    "row_fwd_no_allreduce": ("tp2", 1, "fwd/0/mlp.proj/out"),
    # The backward reaches the last block's attention first; d(ln_1 out) is q/k/v's input grad.
    "col_bwd_no_allreduce": ("tp2", 1, "bwd/1/attn.qkv/dinp"),
    # Activations and input gradients are right; the first norm weight's gradient is partial.
    "sp_norm_grad_no_allreduce": ("tp2_sp", 1, "grad/0/param/input_layernorm.weight"),
    "norm_grad_double_reduce": ("tp2", 1, "grad/0/param/input_layernorm.weight"),
    # The per-token losses are right; d loss / d logits carries the wrong normaliser.
    "ga_loss_per_microbatch": ("dp2_mb2", 1, "bwd/-/loss/dinp"),
    # Every gradient is right; their norm is not (the update then differs too, after it). The
    # norms' share of Σ g² is small: tp 4 counts them 4 times, for a clear margin.
    "clip_norm_tp_replicated": ("tp4", 1, "grad/-/clip/norm"),
    # The first parameter gradient: the embedding's lacks the head's part (rank 0, stage 0).
    "tied_embed_grad_no_allreduce": ("pp2", 1, "grad/-/param/model.embed_tokens.weight"),
    # The logits are right (padded columns included in both); the softmax over them is not.
    "vocab_pad_unmasked": ("tp2", 1, "fwd/-/loss/out"),
    # The aux loss has no forward effect; its gradient enters at the last MoE layer's router
    # probabilities, whose logits' gradient is the first bwd probe of that layer.
    "moe_aux_per_microbatch": ("tp2_mb2_moe", 1, "bwd/1/moe.router/dinp"),
    # tp rank 1's heads drop rank 0's positions: the attention output (o_proj's input) of block 0.
    "dropout_rng_not_forked": ("tp2_dropout", 1, "fwd/0/attn.core/out"),
    # dp rank 1 embeds rank 0's rows, which the recorder places at rank 1's rows.
    "dp_same_data": ("dp2_mb2", 1, "fwd/-/embed/out"),
}
CLEAN = sorted(LAYOUTS)
# train.py's line per run:
#   "<layout> <bug> seed <s>: loss <l1> <l2> .. | grad norm .. | <seconds> s | trace <path>"
RUN_LINE = re.compile(r"^\S+ (\S+) seed (\d+): loss ([\d. ]+) \|.* \| trace (\S+)$", re.M)


def _launch(nproc, flags, runs, out):
    """Starts train.py (under torchrun for several processes) on the runs [(bug, seed)]."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), os.path.join(HERE, "train.py")] if nproc > 1 else \
          [sys.executable, os.path.join(HERE, "train.py")]
    cmd += flags + ["--steps", str(STEPS), "--out", out,
                    "--runs", ",".join(f"{b}@{s}" for b, s in runs)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=HERE, env=dict(os.environ, OMP_NUM_THREADS="1"))


def _finish(launch, runs):
    """{(bug, seed): (loss per step, trace)} from a launch's output, once it has ended."""
    out, err = launch.communicate()
    assert launch.returncode == 0, f"{' '.join(launch.args)}\n{out}\n{err[-4000:]}"
    done = {(b, int(s)): ([float(x) for x in ls.split()], path)
            for b, s, ls, path in RUN_LINE.findall(out)}
    assert set(done) == set(runs), out
    return done


def _compare(ref, run):
    report = run + ".json"
    r = subprocess.run([EXE, "compare", ref, run, "--json", report], capture_output=True,
                       text=True)
    assert r.returncode in (0, 3), f"parallax compare {ref} {run}: exit {r.returncode}\n" \
                                   f"{r.stdout}\n{r.stderr}"
    with open(report) as f:
        result = json.load(f)
    assert (r.returncode == 0) == result["within"], r.stdout
    result["text"] = r.stdout
    return result


class Zoo:
    """Runs and compares what a test asks for, each launch once (a failed one fails every test
    that needs it, without running again)."""

    def __init__(self, folder):
        self.folder = folder
        self.done = {}

    def _once(self, key, fn):
        if key not in self.done:
            try:
                self.done[key] = (True, fn())
            except BaseException as e:
                self.done[key] = (False, e)
        ok, value = self.done[key]
        if not ok:
            raise value
        return value

    def references(self, model):
        """{seed: (loss per step, trace)} of a model's one-process runs (the traces stay). Every
        model's are launched side by side, one process each, on the first call."""
        return self._once("references", self._run_references)[model]

    def _run_references(self):
        runs = [("none", s) for s in SEEDS]
        launches = {m: _launch(1, flags, runs, self.folder) for m, flags in MODELS.items()}
        return {m: {s: v for (_, s), v in _finish(p, runs).items()} for m, p in launches.items()}

    def layout(self, name):
        """{(bug, seed): (loss per step, compare's result)} of a layout's launch."""
        return self._once(name, lambda: self._run_layout(name))

    def _run_layout(self, name):
        nproc, model, flags = LAYOUTS[name]
        refs = self.references(model)
        bugs = [b for b, (lay, _, _) in EXPECTED.items() if lay == name]
        runs = [("none", s) for s in SEEDS] + [(b, 1) for b in bugs]
        out = {}
        launch = _launch(nproc, MODELS[model] + flags, runs, self.folder)
        for (bug, seed), (losses, trace) in _finish(launch, runs).items():
            out[(bug, seed)] = (losses, _compare(refs[seed][1], trace))
            os.remove(trace)
            os.remove(trace + ".json")
        return out


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    if not os.path.exists(EXE):
        pytest.skip(f"no parallax executable at {EXE} (set PARALLAX_EXE)")
    r = subprocess.run([EXE, "compare", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"{EXE} has no compare command (exit {r.returncode}): rebuild it")
    return Zoo(str(tmp_path_factory.mktemp("zoo")))


@pytest.mark.parametrize("bug", sorted(EXPECTED))
def test_bug_named_at_its_first_op(zoo, bug):
    layout, step, op = EXPECTED[bug]
    losses, result = zoo.layout(layout)[(bug, 1)]
    first = result["first_over"]
    assert first is not None, f"{bug} on {layout}: not caught\n{result['text']}"
    assert (first["step"], first["op"]) == (step, op), \
        f"{bug} on {layout}: expected step {step} {op}\n{result['text']}"
    # Silent: it trains, and its loss stays within 0.1 nats of the clean run's at every step.
    clean = zoo.references(LAYOUTS[layout][1])[1][0]
    assert all(abs(a - b) < 0.1 for a, b in zip(losses, clean, strict=True)), (losses, clean)


@pytest.mark.parametrize("layout", CLEAN)
def test_clean_layout_within_budget(zoo, layout):
    results = zoo.layout(layout)
    for seed in SEEDS:
        losses, result = results[("none", seed)]
        assert result["within"], f"{layout} seed {seed}: false alarm\n{result['text']}"
        assert not result["only_reference"] and not result["only_run"], result["text"]
        ref = zoo.references(LAYOUTS[layout][1])[seed][0]
        assert all(abs(a - b) < 1e-4 for a, b in zip(losses, ref, strict=True)), (losses, ref)
