#!/usr/bin/env python3
"""bench_peers: one training step of GPT-2 124M (B=4, T=64, fp32, AdamW) in Parallax and in its
peers, side by side in one run: Parallax fp32 fast and bitwise (the Python module), PyTorch fp32
and bf16 autocast (a standard GPT-2 written below), and llm.c's CPU trainer (train_gpt2.c) when
--llmc names a folder holding its sources.

    python3 bench/bench_peers.py [--steps N] [--threads N] [--only NAME] [--llmc DIR]
                                 [--layers L] [--build DIR]

A step is forward, backward, gradient clipping at global norm 1.0, the AdamW update and zeroing
the gradients, on random tokens (one token file, fixed seed, for every program). Each program
runs in its own process with --threads threads, unpinned; the contended steps run beside a busy
process pinned to core 0 (a shared host), as bench_step does. The programs take turns step by
step, quiet and contended alternating, so that a noisy host hits them alike. Each program's
first step is printed apart and left out of the statistics.

llm.c is not packaged and never downloaded: it is built from DIR (cc -Ofast -march=native
-fopenmp, as its Makefile; -fgnu89-inline so that its headers' `inline` helpers link) and run
unmodified in a scratch folder holding what its main() opens: gpt2_124M.bin (a random init written
here in its format), the token files at its tiny_shakespeare paths and a stand-in tokenizer file
(its main() samples at step 20 from the tokenizer's end-of-text token). Its main() prints a
step's own time ("step N: train loss X (took Y ms)"); between its steps it is stopped with
SIGSTOP while the others run (50 ms after its step line, inside its next step), and the stopped
time is taken off the step it fell in. Its step has no gradient clipping and a single-threaded
update (as written), and it runs 41 steps, so --steps above 20 gives it fewer.

Parallax's workers get OMP_WAIT_POLICY=passive, as the parallax program sets it for itself (idle
threads sleep; docs/command-line.md), unless the caller set OMP_WAIT_POLICY or GOMP_SPINCOUNT; the
peers run with their own defaults.

Checks its results: every program's first loss on random tokens is within 0.3 of ln(50257) and
every loss is finite; a failed check is printed and the exit status is 1. PyTorch is only needed
for this benchmark (pip install torch); without it its columns are skipped.
"""
import argparse
import math
import os
import pty
import re
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
V, VP, MAXT, NH, C = 50257, 50304, 1024, 12, 768  # GPT-2 124M; VP: llm.c's padded vocabulary
B, T = 4, 64
SEED = 1337
LOSS0 = math.log(V)

PROGRAMS = ["parallax fp32 fast", "parallax fp32 bitwise", "pytorch fp32", "pytorch bf16 autocast",
            "llm.c fp32"]


# ---- token file: llm.c's format (256 int32 header: magic, version, count; then uint16 tokens) ----

def write_tokens(path, n):
    header = np.zeros(256, np.int32)
    header[:3] = (20240520, 1, n)
    tokens = np.random.default_rng(SEED).integers(0, V, n, dtype=np.uint16)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.tobytes())


def read_tokens(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), np.int32)
        return np.frombuffer(f.read(), np.uint16, count=int(header[2])).astype(np.int64)


# ---- workers: one program each, driven over stdin/stdout one step at a time ----------------------

def parallax_module(build):
    """The module built in `build` when it holds one (ahead of any installed copy), else the
    installed one."""
    here = sorted(Path(build, "bindings").glob("parallax*.so"))
    if here:
        # an editable install's finder would rebuild its own tree instead
        sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "_name", None) != "parallax"]
        sys.path.insert(0, str(here[0].parent))
    import parallax
    return parallax


def parallax_stepper(args, mode):
    parallax = parallax_module(args.build)
    job = parallax.Job(
        model={"vocab": V, "seq_len": T, "layers": args.layers, "heads": NH, "hidden": C, "ffn": 4 * C},
        train={"steps": 2 * args.steps + 2, "batch_size": B, "threads": args.threads, "lr": 6e-4,
               "min_lr": 6e-5, "warmup_steps": 0, "weight_decay": 0.1, "grad_clip": 1.0,
               "eval_every": 0, "seed": SEED},
        data={"source": "bin", "train_path": args.tokens, "val_path": args.tokens},
        numerics={"mode": mode})

    def step():
        t0 = time.perf_counter()
        m = job.step(1)
        return (time.perf_counter() - t0) * 1e3, float(m["loss"])
    return step


def torch_stepper(args, bf16):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.fc_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (h.view(b, t, NH, c // NH).transpose(1, 2)
                       for h in self.qkv(self.ln_1(x)).split(c, dim=2))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self, layers):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(MAXT, C)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(C)
            for name, p in self.named_parameters():  # GPT-2's init
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # lm_head tied to wte
            return F.cross_entropy(logits.float().view(-1, V), targets.view(-1))

    model = GPT(args.layers)
    decay = [p for p in model.parameters() if p.dim() == 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    # fused: PyTorch's fastest AdamW on the CPU (7x its foreach path on 2 cores of an Ice Lake Xeon)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    tokens = torch.from_numpy(read_tokens(args.tokens))
    at = [0]

    def step():
        n = B * T + 1
        if at[0] + n > len(tokens):
            at[0] = 0
        chunk = tokens[at[0]:at[0] + n]
        at[0] += B * T
        x, y = chunk[:-1].view(B, T), chunk[1:].view(B, T)
        t0 = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ms = (time.perf_counter() - t0) * 1e3
        return ms, float(loss.detach())
    return step


def worker(args):
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever a library prints goes to the log, not into the protocol
    try:
        if args.worker.startswith("parallax"):
            step = parallax_stepper(args, args.worker.split()[-1])
        else:
            try:
                import torch  # noqa: F401
            except ImportError as e:
                proto.write(f"skip PyTorch is not installed ({e}): pip install torch\n")
                return
            step = torch_stepper(args, "bf16" in args.worker)
    except Exception as e:  # the driver prints it as this program's failure
        proto.write(f"error {type(e).__name__}: {e}\n".replace("\n", " ").rstrip() + "\n")
        return
    proto.write("ready\n")
    for line in sys.stdin:
        if line.strip() != "step":
            break
        ms, loss = step()
        proto.write(f"{ms!r} {loss!r}\n")


class Worker:
    """A program in a Python worker process."""

    def __init__(self, name, args, log):
        self.name = name
        cmd = [sys.executable, __file__, "--worker", name, "--tokens", args.tokens, "--steps", str(args.steps),
               "--threads", str(args.threads), "--layers", str(args.layers), "--build", args.build]
        env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
        if name.startswith("parallax") and "OMP_WAIT_POLICY" not in env and "GOMP_SPINCOUNT" not in env:
            # What the parallax program does for itself (core/base/wait_policy.h); a Python
            # process has to be given it before the module loads the OpenMP runtime.
            env["OMP_WAIT_POLICY"] = "passive"
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True,
                                  bufsize=1, env=env)

    def ready(self):
        line = self.p.stdout.readline().strip()
        return line if line else "error the worker exited (see its log above)"

    def step(self):
        self.p.stdin.write("step\n")
        line = self.p.stdout.readline().split()
        if len(line) != 2:
            raise RuntimeError("the worker exited during a step")
        return float(line[0]), float(line[1])

    def close(self):
        if self.p.poll() is None:
            self.p.stdin.close()
            self.p.wait()


# ---- llm.c: built from its sources, run unmodified, stopped between its steps ---------------------

def write_llmc_checkpoint(path, layers):
    """A random GPT-2 init in llm.c's checkpoint format (version 3: fp32, wte padded to VP rows)."""
    rng = np.random.default_rng(SEED)
    header = np.zeros(256, np.int32)
    header[:8] = (20240326, 3, MAXT, V, layers, NH, C, VP)
    L = layers
    wte = rng.normal(0, 0.02, (VP, C)).astype(np.float32)
    wte[V:] = 0
    normal = lambda *shape, std=0.02: rng.normal(0, std, shape).astype(np.float32)  # noqa: E731
    proj = 0.02 / math.sqrt(2 * L)
    tensors = [wte, normal(MAXT, C),                                  # wte, wpe
               np.ones((L, C), np.float32), np.zeros((L, C), np.float32),  # ln1w, ln1b
               normal(L, 3 * C, C), np.zeros((L, 3 * C), np.float32),     # qkvw, qkvb
               normal(L, C, C, std=proj), np.zeros((L, C), np.float32),   # attprojw, attprojb
               np.ones((L, C), np.float32), np.zeros((L, C), np.float32),  # ln2w, ln2b
               normal(L, 4 * C, C), np.zeros((L, 4 * C), np.float32),     # fcw, fcb
               normal(L, C, 4 * C, std=proj), np.zeros((L, C), np.float32),  # fcprojw, fcprojb
               np.ones(C, np.float32), np.zeros(C, np.float32)]          # lnfw, lnfb
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for t in tensors:
            f.write(t.tobytes())


def write_llmc_tokenizer(path):
    """A stand-in for gpt2_tokenizer.bin (version 2: its end-of-text id in the header); token i
    decodes to its number."""
    header = np.zeros(256, np.uint32)
    header[:4] = (20240328, 2, V, V - 1)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for i in range(V):
            s = f"<{i}>".encode()
            f.write(bytes([len(s)]) + s)


class Llmc:
    """llm.c's train_gpt2 in a scratch folder, on a pseudo-terminal (so that it prints each line
    as it comes), stopped after each step line until its next turn."""
    STEP = re.compile(rb"step (\d+): train loss (\S+) \(took (\S+) ms\)")

    def __init__(self, name, args, work):
        self.name = name
        os.makedirs(work)
        exe = os.path.join(work, "train_gpt2")
        build = subprocess.run(["cc", "-Ofast", "-march=native", "-fopenmp", "-DOMP", "-fgnu89-inline",
                                "-Wno-unused-result", "-I", args.llmc, os.path.join(args.llmc, "train_gpt2.c"),
                                "-lm", "-o", exe], capture_output=True, text=True)
        if build.returncode != 0:
            raise RuntimeError(f"building llm.c from {args.llmc} failed: {build.stderr.strip()[-600:]}")
        write_llmc_checkpoint(os.path.join(work, "gpt2_124M.bin"), args.layers)
        write_llmc_tokenizer(os.path.join(work, "gpt2_tokenizer.bin"))
        data = os.path.join(work, "dev", "data", "tinyshakespeare")
        os.makedirs(data)
        for split in ("train", "val"):
            os.symlink(args.tokens, os.path.join(data, f"tiny_shakespeare_{split}.bin"))
        self.master, slave = pty.openpty()
        self.p = subprocess.Popen([exe], cwd=work, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                                  env=dict(os.environ, OMP_NUM_THREADS=str(args.threads)))
        os.close(slave)
        os.kill(self.p.pid, signal.SIGSTOP)  # its start-up too waits for its first turn
        self.buf, self.log = b"", []
        self.stopped_at = None  # when it was stopped after its last step line
        self.next = 0           # the step its main() runs next

    def ready(self):
        return "ready"

    def _line(self):
        while b"\n" not in self.buf:
            select.select([self.master], [], [])
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                raise RuntimeError("llm.c exited: " + b" | ".join(self.log[-5:]).decode(errors="replace"))
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        self.log.append(line.strip())
        return line

    def step(self):
        os.kill(self.p.pid, signal.SIGCONT)
        stopped = time.perf_counter() - self.stopped_at if self.stopped_at is not None else 0.0
        while True:
            m = self.STEP.search(self._line())
            if m:
                break
        # Stopped a moment after its step line, so that the stop lands inside the next step's
        # timed region (its clock starts just after the line), or in the validation pass that
        # comes first every 10th step; those 50 ms run in this turn.
        time.sleep(0.05)
        os.kill(self.p.pid, signal.SIGSTOP)
        self.stopped_at = time.perf_counter()
        k, loss, ms = int(m.group(1)), float(m.group(2)), float(m.group(3))
        if k % 10 != 0:
            ms -= stopped * 1e3
            if ms <= 0:
                raise RuntimeError(f"step {k} took {ms + stopped * 1e3:.0f} ms by its clock, less than the "
                                   f"{stopped * 1e3:.0f} ms it was stopped: the stop fell outside the step")
        self.next = k + 1
        return ms, loss

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        os.close(self.master)


# ---- the competing load ----------------------------------------------------------------------------

class BusyNeighbour:
    """A child process spinning on CPU 0 while in a `with` block."""

    def __enter__(self):
        self.pid = os.fork()
        if self.pid == 0:
            os.sched_setaffinity(0, {0})
            while True:
                pass
        return self

    def __exit__(self, *exc):
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)


# ---- the run --------------------------------------------------------------------------------------

def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=8, help="timed steps per program and condition (default 8)")
    ap.add_argument("--threads", type=int, default=2, help="threads of each program (default 2)")
    ap.add_argument("--only", default="", help="run only the programs whose name contains this")
    ap.add_argument("--llmc", default="", help="folder holding llm.c's train_gpt2.c and llmc/ (not downloaded)")
    ap.add_argument("--layers", type=int, default=12, help="transformer blocks (12: GPT-2 124M; fewer for a quick try)")
    ap.add_argument("--build", default=str(ROOT / "build"), help="build folder whose Python module to use")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.steps = max(1, args.steps)
    if args.worker:
        return worker(args)

    names = [n for n in PROGRAMS if args.only in n]
    if "llm.c fp32" in names and not args.llmc:
        names.remove("llm.c fp32")
        print("llm.c: skipped (give --llmc DIR, a folder holding its train_gpt2.c and llmc/)")
    if not names:
        print(f"no program matches --only {args.only!r}: {', '.join(PROGRAMS)}")
        return 1
    print(f"bench_peers: GPT-2 shape L={args.layers} C={C} NH={NH} V={V}, B={B} T={T}, fp32 weights, "
          f"AdamW, {args.threads} threads per program, {args.steps} steps quiet and {args.steps} contended each")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores")

    failures, rows = [], {}
    with tempfile.TemporaryDirectory(prefix="bench_peers_") as tmp:
        args.tokens = os.path.join(tmp, "tokens.bin")
        write_tokens(args.tokens, 1 << 16)
        log = open(os.path.join(tmp, "workers.log"), "w+")
        progs = []
        for name in names:  # all made first (in parallel for the workers); none is timed
            try:
                progs.append(Llmc(name, args, os.path.join(tmp, "llmc")) if name.startswith("llm.c")
                             else Worker(name, args, log))
            except Exception as e:
                failures.append(f"{name}: {e}")
        live = []
        for p in progs:
            state = p.ready()
            if state == "ready":
                live.append(p)
                continue
            kind, _, msg = state.partition(" ")
            if kind == "skip":
                print(f"{p.name}: skipped: {msg}")
            else:
                failures.append(f"{p.name}: {msg}")
            p.close()

        results = {p.name: {"first": None, "quiet": [], "busy": [], "loss": []} for p in live}

        def turn(p, key):
            if p not in live or getattr(p, "next", 0) > 40:  # llm.c's main() ends after step 40
                return
            try:
                ms, loss = p.step()
            except Exception as e:
                failures.append(f"{p.name}: {e}")
                live.remove(p)
                p.close()
                return
            r = results[p.name]
            r["loss"].append(loss)
            if key == "first":
                r["first"] = ms
            else:
                r[key].append(ms)
            time.sleep(0.05)  # idle OpenMP threads of the program before stop spinning

        t0 = time.perf_counter()
        for p in list(live):
            turn(p, "first")
        for i in range(args.steps):
            for key in (("quiet", "busy") if i % 2 == 0 else ("busy", "quiet")):
                if key == "busy":
                    with BusyNeighbour():
                        for p in list(live):
                            turn(p, key)
                else:
                    for p in list(live):
                        turn(p, key)
            print(f"  {i + 1}/{args.steps} quiet and contended steps of each program "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
        for p in progs:
            p.close()
        log.seek(0)
        text = log.read().strip()
        if failures and text:
            print("worker log (last lines):\n  " + "\n  ".join(text.splitlines()[-15:]))

    # Results first: every loss finite, the first near ln V (random tokens, a fresh GPT-2 init).
    for name, r in results.items():
        if not r["loss"] or not all(math.isfinite(x) for x in r["loss"]):
            failures.append(f"{name}: a loss is not finite: {r['loss']}")
        elif abs(r["loss"][0] - LOSS0) > 0.3:
            failures.append(f"{name}: first loss {r['loss'][0]:.4f}, expected ln({V}) = {LOSS0:.4f} +- 0.3")
        if r["first"] is not None:
            print(f"check: {name}: first loss {r['loss'][0]:.4f} (ln V = {LOSS0:.4f}), "
                  f"last {r['loss'][-1]:.4f}, {len(r['loss'])} steps, all finite")

    print(f"\n{'program':<24} {'first':>8} {'quiet best':>11} {'median':>8} "
          f"{'contended median':>17} {'worst':>8} {'contended/quiet':>16}   (ms/step)")
    for name, r in results.items():
        if not r["quiet"] or not r["busy"]:
            continue
        q, b = statistics.median(r["quiet"]), statistics.median(r["busy"])
        rows[name] = (q, b)
        print(f"{name:<24} {r['first']:8.0f} {min(r['quiet']):11.0f} {q:8.0f} {b:17.0f} "
              f"{max(r['busy']):8.0f} {b / q:15.2f}x")

    px = rows.get("parallax fp32 fast")
    for peer in ("pytorch fp32", "llm.c fp32"):
        if px and peer in rows:
            print(f"parallax fp32 fast / {peer}: step time {px[0] / rows[peer][0]:.2f}x quiet, "
                  f"{px[1] / rows[peer][1]:.2f}x contended (medians; below 1: Parallax is faster)")
    if rows:
        print("contended slowdown (median/median): " +
              ", ".join(f"{n} {b / q:.2f}x" for n, (q, b) in rows.items()))
    if "parallax fp32 fast" in results:
        print("note: Parallax's wpe holds T=64 rows (its seq_len is the data's T too); the peers' hold 1024")

    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
