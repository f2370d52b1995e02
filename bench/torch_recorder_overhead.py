#!/usr/bin/env python3
"""torch_recorder_overhead: what parallax.torch's recorder costs a training step, on a GPT-2-small-
shaped transformers model on the CPU.

    python3 bench/torch_recorder_overhead.py [--steps N] [--layers L] [--hidden C] [--heads NH]
                                             [--vocab V] [--batch B] [--seq T] [--threads N]
                                             [--all]

Trains the same model (same weights, tokens, AdamW) several times side by side, in lockstep: step
s of every run before step s + 1 of any, in a rotating order, so that a shared host's load falls
on every run alike. The runs: unrecorded; recording every activation and activation gradient
(fwd, bwd) every step; the same every 10th step; with --all, every probe (gradients, weights,
Adam's moments too) every step. A step's time is the step's own: the hooks and their copies (the
recorder holds up to 512 MiB of pieces in memory before a writer thread writes them behind the
run). Beside it, the time writing this step's pieces would take if the step waited for it
(Recorder.flush), an upper bound on what the disk costs a longer run. Prints each run's mean step
time and its ratio to the unrecorded run's (goals: fwd+bwd every step <= 1.5x, every 10th <=
1.05x), the bytes per recorded step and the seconds writing the trace takes at the end. Checks
its results: every recorded run's losses equal the unrecorded run's bit for bit (else exit
status 1). The figures are ratios within one process; a loaded host moves them by some 10%.
Defaults: GPT-2 small's width (C 768, 12 heads), 2 layers, V 8192, B 2, T 128, 20 steps.
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import transformers

import parallax.torch as pxt


def model_of(args):
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=args.vocab, n_positions=args.seq,
                                     n_embd=args.hidden, n_layer=args.layers, n_head=args.heads,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config).train()


class Run:
    """One training run: its model, optimizer, recorder (None: unrecorded), losses, step times."""

    def __init__(self, args, label, folder=None, probes=(), every=1, goal=None):
        self.args, self.label, self.goal, self.every = args, label, goal, every
        self.model = model_of(args)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.path = os.path.join(folder, label.replace(" ", "_") + ".h5") if folder else None
        self.rec = pxt.record(self.model, self.path, optimizer=self.opt, probes=list(probes),
                              every=every) if folder else None
        self.losses, self.times, self.waits = [], [], []
        if self.rec:
            self.rec.__enter__()

    def step(self, x, y):
        t0 = time.perf_counter()
        logits = self.model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, self.args.vocab),
                                                 y.reshape(-1))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        t1 = time.perf_counter()
        if self.rec:
            self.rec.flush()
        self.times.append(t1 - t0)
        self.waits.append(time.perf_counter() - t1)
        self.losses.append(loss.item())

    def finish(self):
        """Seconds writing the trace, its bytes per recorded step."""
        if not self.rec:
            return 0.0, 0.0
        t0 = time.perf_counter()
        self.rec.__exit__(None, None, None)
        written = time.perf_counter() - t0
        recorded = len(range(0, len(self.times), self.every))
        size = os.path.getsize(self.path) / recorded
        os.remove(self.path)
        return written, size


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--all", action="store_true", help="also every probe every step")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(1)
    data = []
    for _ in range(args.steps):
        t = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        data.append((t[:, :-1], t[:, 1:]))
    print(f"torch_recorder_overhead: GPT-2 {args.layers} layers, C {args.hidden}, V {args.vocab}, "
          f"B {args.batch}, T {args.seq}, {args.steps} steps, {torch.get_num_threads()} threads, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    acts = ("*/fwd/**", "*/bwd/**")
    with tempfile.TemporaryDirectory() as d:
        runs = [Run(args, "unrecorded"),
                Run(args, "fwd+bwd every step", d, acts, 1, 1.5),
                Run(args, "fwd+bwd every 10th step", d, acts, 10, 1.05)]
        if args.all:
            runs.append(Run(args, "every probe every step", d, ("**",), 1))
        for s, (x, y) in enumerate(data):
            for k in range(len(runs)):
                runs[(s + k) % len(runs)].step(x, y)
        base = sum(runs[0].times) / len(runs[0].times)
        print(f"  {runs[0].label:26s} {base * 1e3:9.1f} ms/step", flush=True)
        ok = True
        for run in runs[1:]:
            written, size = run.finish()
            mean = sum(run.times) / len(run.times)
            same = run.losses == runs[0].losses
            ok &= same
            goal = f"(goal <= {run.goal}x)" if run.goal else ""
            wait = sum(run.waits) / len(run.waits)
            print(f"  {run.label:26s} {mean * 1e3:9.1f} ms/step {mean / base:6.3f}x {goal:16s} "
                  f"(waiting for the disk too: {(mean + wait) / base:.3f}x); {size / 1e6:.1f} MB/"
                  f"recorded step, trace written in {written:.1f} s; losses "
                  f"{'bit for bit' if same else 'DIFFER'}", flush=True)
    if not ok:
        print("torch_recorder_overhead: a recorded run's losses differ from the unrecorded run's",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
