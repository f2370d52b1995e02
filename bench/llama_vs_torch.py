#!/usr/bin/env python3
"""llama_vs_torch: one fp32 training step of the Llama-3-shaped 124M model
(examples/llama-124m.toml) in Parallax, fast and bitwise (build/bench/bench_llama_step), and in
PyTorch on the CPU (transformers' LlamaForCausalLM with the same config), side by side.

    python3 bench/llama_vs_torch.py [--build DIR] [--config FILE] [--steps N] [--threads N]
                                    [--batch B] [--seq T] [--attn sdpa|eager] [--no-shares]

Both sides train from the same initial weights (bench_llama_step writes Parallax's as safetensors
under Hugging Face's names; PyTorch loads them strictly) on the same B·(T+1) random tokens, with
the same AdamW (the config's lr held constant, weight decay on matrices only, betas, eps; PyTorch's
fused CPU AdamW, its fastest) and clipping at the config's global norm, fp32, and the same thread
count (OMP_NUM_THREADS and torch.set_num_threads). A step is forward, cross-entropy over the B·T
next tokens, backward, clip, update and zeroing the gradients.

Two processes, PyTorch's (this script as a worker) and bench_llama_step --serve (one model per
mode), each past its warm-up step, take turns step by step: PyTorch, fast and bitwise, each
program first in turn, N timed steps each, so that a noisy host hits them alike; the 1-minute load
average is printed after every turn. Prints each turn's times, bench_llama_step's own report
(its checks, and where a fast step goes by op, unless --no-shares), the medians and bests, and
the ratios fast/PyTorch (time) and bitwise/fast (throughput: fast ms / bitwise ms).

Attention: "sdpa" by default (torch.nn.functional.scaled_dot_product_attention, causal, no
dropout): transformers' default for Llama and the path PyTorch optimises (a fused causal kernel
on the CPU that does not keep the (T,T) probabilities), so PyTorch runs as its users run it;
"eager" is the textbook matmul, softmax, matmul with the probabilities kept, as Parallax's
attention kernel computes it.

Checks its results: every loss is finite and falls over the steps (the same batch every step);
PyTorch's first loss (the warm-up step's) equals Parallax bitwise's within 1e-4 of the loss, and
the next five within 2e-3 of it (the same weights and tokens: only the order of fp32 sums
differs, and such differences grow as training goes on, so later steps are printed, not
checked); bench_llama_step checks its own (determinism, fast against bitwise). A failed check is
printed and the exit status is 1.
torch and transformers are needed for this benchmark only (pip install torch transformers);
without them it says so and exits 0.
"""
import argparse
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_shape(args):
    with open(args.config, "rb") as f:
        cfg = tomllib.load(f)
    model, train = cfg.get("model", {}), cfg.get("train", {})
    if model.get("arch") != "llama":
        sys.exit(f"llama_vs_torch: {args.config} is not model.arch = \"llama\"")
    heads = model["heads"]
    shape = {
        "vocab": model["vocab"], "hidden": model["hidden"], "layers": model["layers"],
        "heads": heads, "kv_heads": model.get("kv_heads", 0) or heads, "ffn": model["ffn"],
        "head_dim": model.get("head_dim", 0) or model["hidden"] // heads,
        "seq_len": model.get("seq_len", 128), "norm_eps": model.get("norm_eps", 1e-5),
        "rope_theta": model.get("rope_theta", 500000.0),
        "tie": model.get("tie_embeddings", False),
        # the trainer's defaults where the config has none (core/base/config_sections.h)
        "lr": train.get("lr", 3e-3), "weight_decay": train.get("weight_decay", 0.0),
        "beta1": train.get("beta1", 0.9), "beta2": train.get("beta2", 0.95),
        "eps": train.get("eps", 1e-8), "clip": train.get("grad_clip", 1.0),
    }
    for key in ("rope_factor", "qk_norm"):
        if model.get(key):
            sys.exit(f"llama_vs_torch: model.{key} is not mapped to transformers here")
    shape["B"] = args.batch or train.get("batch_size", 8)
    shape["T"] = args.seq or shape["seq_len"]
    return shape


# ---- the PyTorch side, in its own process ------------------------------------------------------

def torch_worker(args):
    import numpy as np
    import torch
    import torch.nn.functional as F
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    s = load_shape(args)
    torch.set_num_threads(args.threads)
    config = LlamaConfig(
        vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["ffn"],
        num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"], hidden_act="silu",
        max_position_embeddings=max(s["seq_len"], s["T"]), rms_norm_eps=s["norm_eps"],
        rope_theta=float(s["rope_theta"]), tie_word_embeddings=s["tie"], attention_bias=False,
        attention_dropout=0.0, mlp_bias=False, use_cache=False, attn_implementation=args.attn)
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}
    assert float(rope["rope_theta"]) == float(s["rope_theta"]), rope
    model = LlamaForCausalLM(config).float()
    model.load_state_dict(load_file(args.init), strict=True)
    model.train()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s["weight_decay"]},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=s["lr"], betas=(s["beta1"], s["beta2"]), eps=s["eps"], fused=True)
    B, T = s["B"], s["T"]
    raw = torch.from_numpy(np.fromfile(args.tokens, dtype="<i4").astype(np.int64)).view(B, T + 1)
    x, y = raw[:, :-1].contiguous(), raw[:, 1:].contiguous()

    def step():
        t0 = time.perf_counter()
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.view(-1, s["vocab"]), y.view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s["clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) * 1e3, float(loss.detach())

    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever a library prints goes to the log, not into the protocol
    warm = step()
    proto.write(f"ready {warm[1]!r} {model.config._attn_implementation}\n")
    for line in sys.stdin:
        if line.strip() != "step":
            break
        ms, loss = step()
        proto.write(f"{ms!r} {loss!r}\n")


# ---- the driver ---------------------------------------------------------------------------------

class Program:
    """A worker process that runs one step per line it is sent and answers "ms loss"."""

    def __init__(self, name, cmd, threads, log):
        self.name = name
        env = dict(os.environ, OMP_NUM_THREADS=str(threads))
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                  text=True, bufsize=1, env=env)
        self.head = []  # what it printed before "ready"
        for line in self.p.stdout:
            if line.startswith("ready"):
                self.ready = line.split()[1:]
                break
            self.head.append(line)
        else:
            raise RuntimeError(f"{name} exited before its first step:\n" + "".join(self.head))

    def step(self, command):
        self.p.stdin.write(command + "\n")
        words = self.p.stdout.readline().split()
        if len(words) != 2:
            raise RuntimeError(f"{self.name} exited during a step (its log: stderr above)")
        return float(words[0]), float(words[1])

    def finish(self):
        """Ends the steps; what it prints after them, and its exit status."""
        self.p.stdin.write("end\n")
        self.p.stdin.close()
        rest = self.p.stdout.read()
        return rest, self.p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--config", default=str(ROOT / "examples" / "llama-124m.toml"))
    ap.add_argument("--steps", type=int, default=6, help="timed steps of each program")
    ap.add_argument("--no-shares", action="store_true",
                    help="skip bench_llama_step's per-op timing after the steps")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--batch", type=int, default=0, help="B (default: the config's batch_size)")
    ap.add_argument("--seq", type=int, default=0, help="T (default: the config's seq_len)")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--init", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.steps = max(2, args.steps)
    if args.worker:
        torch_worker(args)
        return 0
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"llama_vs_torch: skipped: PyTorch or transformers is not importable ({e}); "
              "pip install torch transformers")
        return 0
    exe = Path(args.build) / "bench" / "bench_llama_step"
    if not exe.exists():
        sys.exit(f"llama_vs_torch: {exe} not found: build it (ninja -C {args.build})")
    import numpy as np

    s = load_shape(args)
    B, T, V = s["B"], s["T"], s["vocab"]
    print(f"llama_vs_torch: {Path(args.config).name}, L={s['layers']} C={s['hidden']} "
          f"NH={s['heads']} KV={s['kv_heads']} F={s['ffn']} V={V}, B={B} T={T}, fp32, "
          f"{args.threads} threads; torch {torch.__version__}, transformers "
          f"{transformers.__version__}, attention {args.attn}; {args.steps} timed steps each, "
          f"taking turns")
    failures = []
    with tempfile.TemporaryDirectory(prefix="llama_vs_torch") as tmp:
        tokens = os.path.join(tmp, "tokens.i32")
        init = os.path.join(tmp, "init.safetensors")
        rng = np.random.default_rng(1337)
        rng.integers(0, V, B * (T + 1), dtype=np.int32).astype("<i4").tofile(tokens)
        sizes = [] + (["--batch", str(args.batch)] if args.batch else []) + \
            (["--seq", str(args.seq)] if args.seq else [])
        px_cmd = [str(exe), "--config", args.config, "--threads", str(args.threads), "--tokens",
                  tokens, "--save-init", init, "--serve"] + sizes
        if args.no_shares:
            px_cmd.append("--no-shares")
        load0 = os.getloadavg()
        px = Program("bench_llama_step", px_cmd, args.threads, sys.stderr)
        th = Program("the PyTorch worker",
                     [sys.executable, __file__, "--worker", "--init", init, "--tokens", tokens,
                      "--threads", str(args.threads), "--config", args.config, "--attn", args.attn]
                     + sizes, args.threads, sys.stderr)
        order = [("pytorch", th, "step"), ("fast", px, "fast"), ("bitwise", px, "bitwise")]
        ms = {k: [] for k, _, _ in order}
        losses = {"pytorch": [float(th.ready[0])], "fast": [], "bitwise": []}
        loads = [os.getloadavg()[0]]
        print(f"{'step':>4}  {'pytorch ms':>11} {'fast ms':>9} {'bitwise ms':>11}   load average")
        for r in range(args.steps):
            turn = order[r % 3:] + order[:r % 3]  # each program first in turn
            for name, prog, command in turn:
                t, loss = prog.step(command)
                ms[name].append(t)
                losses[name].append(loss)
            loads.append(os.getloadavg()[0])
            print(f"{r + 1:>4}  {ms['pytorch'][-1]:>11.1f} {ms['fast'][-1]:>9.1f} "
                  f"{ms['bitwise'][-1]:>11.1f}   {loads[-1]:.2f}")
        th_rest, th_rc = th.finish()
        px_rest, px_rc = px.finish()
        if px_rc != 0:
            failures.append("bench_llama_step's checks failed (its output below)")
        if th_rc != 0:
            failures.append("the PyTorch worker failed")
        print("bench_llama_step:\n" + "".join(px.head) + px_rest, end="")
        px_losses = {}
        for mode in ("fast", "bitwise"):  # its own record, the warm-up step's loss first
            line = re.search(rf"^losses {mode}:(.*)$", px_rest, re.M)
            px_losses[mode] = [float(v) for v in line.group(1).split()] if line else []
        print(f"load average: {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} before the programs "
              f"started; during the steps {min(loads):.2f}-{max(loads):.2f} (1-minute)")
        print(f"PyTorch attention: {th.ready[1]}")
        med = {k: statistics.median(v) for k, v in ms.items()}
        best = {k: min(v) for k, v in ms.items()}
        print(f"{'':>15} {'pytorch':>10} {'px fast':>10} {'px bitwise':>11} {'fast/pytorch':>13} "
              f"{'bitwise/fast':>13}")
        for name, d in (("median ms/step", med), ("best ms/step", best)):
            print(f"{name:>15} {d['pytorch']:>10.1f} {d['fast']:>10.1f} {d['bitwise']:>11.1f} "
                  f"{d['fast'] / d['pytorch']:>13.3f} {d['fast'] / d['bitwise']:>13.3f}")
        print("fast/pytorch: the time ratio (goal <= 0.6); bitwise/fast: the throughput ratio, "
              "fast ms / bitwise ms (goal >= 0.85)")
        # checks: the same weights and tokens, so the same losses up to the order of fp32 sums
        torch_losses, bit_losses = losses["pytorch"], px_losses["bitwise"]
        for name, ls in (("pytorch", torch_losses), ("px bitwise", bit_losses),
                         ("px fast", px_losses["fast"])):
            print(f"losses {name + ':':<12}" + " ".join(f"{v:.6f}" for v in ls))
            if len(ls) < 2 or not all(math.isfinite(v) for v in ls):
                failures.append(f"{name}: a loss is missing or not finite")
            elif not ls[-1] < ls[0]:
                failures.append(f"{name}: the loss does not fall")
        diffs = [abs(a - b) for a, b in zip(torch_losses, bit_losses)]
        if diffs:
            print("|pytorch - px bitwise| per step: " + " ".join(f"{d:.1e}" for d in diffs))
            if diffs[0] > 1e-4 * bit_losses[0]:
                failures.append(f"PyTorch's first loss {torch_losses[0]:.7f} differs from "
                                f"Parallax's {bit_losses[0]:.7f} by more than 1e-4 of it")
            if max(diffs[:6]) > 2e-3 * bit_losses[0]:
                failures.append("PyTorch's losses of the first 6 steps drift from Parallax's by "
                                "more than 2e-3 of the first loss")
    for f in failures:
        print("FAIL: " + f)
    print("checks passed" if not failures else "checks FAILED")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
