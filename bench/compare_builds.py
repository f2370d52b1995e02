#!/usr/bin/env python3
"""compare_builds: the same benchmark from two build trees (an older commit's and this one's),
taking turns in one run, so that a change's cost is measured against its parent on the same
machine at the same time (a noisy 2-core host hits both alike).

    python3 bench/compare_builds.py OLD_BUILD NEW_BUILD [--rounds N] [--steps N]
                                    [--step-variants fp32] [--train-layouts dp2xtp2xpp2,...]

Two measurements, each run by both builds in alternation, OLD first then NEW, N rounds:
  * bench/bench_step (the model's step on GPT-2 124M shapes: kernels, the model, AdamW) for the
    variants whose name contains --step-variants (default "fp32": fp32 fast and fp32 bitwise);
  * `app/parallax train` of the embedded default job (a tiny GPT, one thread per rank) under
    each layout of --train-layouts: the trainer's whole step under a layout, its ms/step from the
    summary.
Prints, per variant and layout, each build's median over the rounds of its per-run figure (the
median ms per step) and the ratio old/new of their throughputs (above 1: the new build is
faster). Checks its results: every run exits 0, and both builds print the same final loss (its
four decimals) for every train layout; the exit status is 1 otherwise. (That the bits are the
same is the test suites' to show; this is a check that both builds ran the same job.)
"""
import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"compare_builds: {' '.join(map(str, cmd))} failed ({r.returncode}):\n"
                 f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
    return r.stdout


def bench_step(build, variants, steps):
    """{variant: median ms} of one bench_step run."""
    out = run([str(Path(build) / "bench" / "bench_step"), "--only", variants,
               "--steps", str(steps)])
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^(\S.*?)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)%", line)
        if m and not line.startswith("first step"):
            rows[m.group(1).strip()] = float(m.group(3))
    return rows


def train(build, layout, steps, folder):
    """(ms per step, final loss) of one `parallax train` run of the embedded default job."""
    parts = dict(re.findall(r"(dp|tp|pp|cp|z)(\d+)", layout))
    sets = ["train.steps=" + str(steps), "train.threads=1", "train.eval_every=0",
            "output.run_file=false"]
    keys = {"dp": "layout.dp", "tp": "layout.tp", "pp": "layout.pp", "cp": "layout.cp",
            "z": "layout.zero"}
    sets += [f"{keys[k]}={v}" for k, v in parts.items()]
    cmd = [str(Path(build) / "app" / "parallax"), "train", "--quiet", "--out", str(folder)]
    for s in sets:
        cmd += ["--set", s]
    out = run(cmd)
    ms = float(re.search(r"([0-9.]+) ms/step", out).group(1))
    loss = re.search(r"train loss\s+(\S+)", out).group(1)
    return ms, loss


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("old")
    p.add_argument("new")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=5, help="bench_step's steps per variant and run")
    p.add_argument("--train-steps", type=int, default=60)
    p.add_argument("--step-variants", default="fp32")
    p.add_argument("--train-layouts", default="dp1,dp2xz1,tp2,pp2,dp2xtp2xpp2,cp2")
    a = p.parse_args()
    builds = {"old": a.old, "new": a.new}
    failures = 0

    step = {b: {} for b in builds}
    for r in range(a.rounds):
        for b, path in builds.items():
            for v, ms in bench_step(path, a.step_variants, a.steps).items():
                step[b].setdefault(v, []).append(ms)
    print(f"bench_step (GPT-2 124M shapes, B=4 T=64), median ms per step, {a.rounds} runs each, "
          "alternating")
    print(f"{'variant':22s} {'old':>10s} {'new':>10s}  old/new throughput")
    for v in step["old"]:
        o, n = statistics.median(step["old"][v]), statistics.median(step["new"][v])
        print(f"{v:22s} {o:10.1f} {n:10.1f}  {o / n:.3f}")

    layouts = [x for x in a.train_layouts.split(",") if x]
    ms = {b: {l: [] for l in layouts} for b in builds}
    loss = {b: {} for b in builds}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for l in layouts:
                for b, path in builds.items():
                    t, x = train(path, l, a.train_steps, Path(tmp) / f"{b}-{l}")
                    ms[b][l].append(t)
                    loss[b][l] = x
    print(f"\nparallax train (the default job), {a.train_steps} steps, one thread per rank: "
          f"ms per step, median of {a.rounds} runs each, alternating")
    print(f"{'layout':22s} {'old':>10s} {'new':>10s}  old/new throughput  final loss")
    for l in layouts:
        o, n = statistics.median(ms["old"][l]), statistics.median(ms["new"][l])
        same = loss["old"][l] == loss["new"][l]
        failures += 0 if same else 1
        print(f"{l:22s} {o:10.2f} {n:10.2f}  {o / n:.3f}              {loss['new'][l]}"
              f"{'' if same else ' FAIL: old ' + loss['old'][l]}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
