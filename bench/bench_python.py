#!/usr/bin/env python3
"""Per-step overhead of driving a job from Python (parallax.Job) against the CLI (parallax train).

For each job size it runs, in alternation (the host is noisy: MACHINE-NOTES), the CLI for N steps and
the same job from Python three ways: one call job.step(N); N calls job.step(1) (a hand-off to the
ranks and back per step, the GIL released and re-taken, a Ctrl-C check); and job.step(N) with an
observer (which makes the ranks pause after every step and calls Python). The figure per way is
wall-clock ms per step minus the library's own step time in the same run (the mean of the step_ms the
trainer measures around each step, read from the run file), i.e. what the driver adds per step: both
write a run file, as the CLI does by default. The CLI's wall time is its summary's (from the run's
start to its end, process start-up excluded).

It checks its results: every Python run ends with the same bits as the CLI's --dump.
Usage: bench/bench_python.py [--exe build/app/parallax] [--repeats 5]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

import parallax

ROOT = Path(__file__).resolve().parents[1]

SIZES = {
    # name: (sections, steps)
    "micro (L=1 C=32 T=16 B=4)": ({"model": {"layers": 1, "hidden": 32, "heads": 2, "ffn": 128, "seq_len": 16},
                                   "train": {"batch_size": 4}, "numerics": {"block": 16}}, 400),
    "tiny (L=2 C=64 T=64 B=8)": ({"model": {"seq_len": 64}, "numerics": {"block": 32}}, 100),
}
COMMON = {"train": {"eval_every": 0, "threads": 1}}


def merged(sections, steps):
    out = {k: dict(v) for k, v in sections.items()}
    for k, v in COMMON.items():
        out.setdefault(k, {}).update(v)
    out["train"]["steps"] = steps
    return out


def sets(sections):
    return [a for s, kv in sections.items() for k, v in kv.items() for a in ("--set", f"{s}.{k}={v}")]


def cli(exe, sections, out):
    dump = os.path.join(out, "dump.h5")
    text = subprocess.run([exe, "train", "--quiet", "--out", out, "--dump", dump, *sets(sections)],
                          check=True, capture_output=True, text=True).stdout
    wall = float(re.search(r"([0-9.]+) ms/step", text).group(1))
    lib = float(np.mean(parallax.read_run_file(os.path.join(out, "run.h5"))["metrics"]["step_ms"][1]))
    with h5py.File(dump, "r") as f:
        weights = {k: f["weights"][k][()] for k in f["weights"]}
    return wall, lib, weights


def python_run(sections, steps, how, out):
    job = parallax.Job(**sections, out=out)
    if how == "observer":
        job.add_observer(lambda m: None)
    t = time.perf_counter()
    if how == "one call" or how == "observer":
        job.step(steps)
    else:
        for _ in range(steps):
            job.step(1)
    wall = (time.perf_counter() - t) * 1e3 / steps
    lib = float(np.mean(job.metrics()["step_ms"]))
    return wall, lib, job.weights()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exe", default=os.environ.get("PARALLAX_EXE", str(ROOT / "build" / "app" / "parallax")))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"bench_python: parallax {parallax.__version__}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.2f} at start; {args.repeats} alternating repeats, medians")
    ways = ["one call", "step(1) each", "observer"]
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        for name, (sections, steps) in SIZES.items():
            s = merged(sections, steps)
            wall = {w: [] for w in ["cli"] + ways}
            over = {w: [] for w in ["cli"] + ways}
            lib = []
            for r in range(args.repeats):
                for w in ["cli"] + ways:
                    out = os.path.join(tmp, f"{r}-{w}".replace(" ", "_").replace("(", "").replace(")", ""))
                    if w == "cli":
                        ms, step_ms, ref = cli(args.exe, s, out)
                    else:
                        ms, step_ms, weights = python_run(s, steps, w, out)
                        ok = ok and all(ref[k].tobytes() == weights[k].tobytes() for k in ref)
                    wall[w].append(ms)
                    over[w].append(ms - step_ms)
                    lib.append(step_ms)
            print(f"\n{name}, {steps} steps: the library's own step {statistics.median(lib):.3f} ms "
                  f"(median over runs of the mean step_ms)")
            print(f"  {'driver':24s} {'ms/step':>9s} {'overhead ms/step':>17s}   (each run's wall minus its own step_ms)")
            for w in ["cli"] + ways:
                label = "CLI (parallax train)" if w == "cli" else f"Python, {w}"
                print(f"  {label:24s} {statistics.median(wall[w]):9.3f} {statistics.median(over[w]):17.3f}")
    print(f"\nresults: every Python run {'equals' if ok else 'DIFFERS FROM'} the CLI's --dump bit for bit")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
