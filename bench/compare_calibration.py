#!/usr/bin/env python3
"""compare_calibration: measures the constants κ of parallax compare's error budget
(validators/trace_compare.h) from Parallax's own runs with randomised summation orders.

    python3 bench/compare_calibration.py [--build DIR] [--runs N] [--steps S] [--seed K]
                                         [--config FILE ...] [--keep DIR]

For each job (by default the embedded GPT-2 job with its 4 blocks and with 8, and
examples/llama-tiny.toml; --config names others) it records the
single-device reference (bitwise, numerics.block 16) and N alternates of the same job whose every
sum runs in another order: numerics.block drawn at random from 2..96 (another canonical tree for
every reduction), numerics.mode bitwise or fast (oneDNN's kernels, any order), train.threads 1 or
2 (fast mode's split of each sum). Each alternate is as right as the reference: only the order of
its fp32 sums differs. parallax compare --json gives every probe's relative error rel = ‖a − r‖/‖r‖
and its depth D; the script prints, per phase (fwd, bwd, grad, param: the updated weights, optim: Adam's moments), the largest rel/(u·D) over
every probe, step and alternate, where it occurs, the 99th percentile, and κ = margin × largest
(kCompareMargin), beside the κ this build uses.

Checks its own results (exit 1 otherwise): every alternate is judged within budget by this build's
parallax compare (the calibration's own runs must not be false alarms), and the alternates differ
from the reference (rel > 0 somewhere: the orders really were different).
"""
import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("fwd", "bwd", "grad", "param", "optim")


def phase_of(op):
    """The κ a probe's row is judged with (validators/trace_compare.h): fwd, bwd, grad, the
    updated weights (param) or the optimizer's other state (optim)."""
    parts = op.split("/")
    if parts[0] in ("fwd", "bwd"):
        return parts[0]
    if parts[0] in ("grad", "mgrad"):
        return "grad"
    return "param" if parts[2] == "param" else "optim"


def record(exe, config, out, steps, sets):
    cmd = [str(exe), "record"] + ([config] if config else []) + ["--out", str(out), "--steps",
                                                                 str(steps)]
    for s in sets:
        cmd += ["--set", s]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"compare_calibration: {' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")


def compare(exe, ref, alt, json_path):
    r = subprocess.run([str(exe), "compare", str(ref), str(alt), "--json", str(json_path)],
                       capture_output=True, text=True)
    if r.returncode not in (0, 3):
        sys.exit(f"compare_calibration: parallax compare failed:\n{r.stdout}{r.stderr}")
    with open(json_path) as f:
        return r.returncode, json.load(f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--runs", type=int, default=8, help="alternates per config")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--config", action="append",
                    help="job configs (default: the embedded job with 4 and 8 blocks and "
                         "examples/llama-tiny.toml)")
    ap.add_argument("--keep", help="keep the traces and reports in this folder")
    args = ap.parse_args()
    exe = Path(args.build) / "app" / "parallax"
    jobs = ([(Path(c).stem, c, []) for c in args.config] if args.config else
            [("default", "", []), ("default-8-blocks", "", ["model.layers=8"]),
             ("llama-tiny", str(ROOT / "examples" / "llama-tiny.toml"), [])])
    rng = random.Random(args.seed)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="calibration-"))
    work.mkdir(parents=True, exist_ok=True)

    worst = {p: (0.0, "") for p in PHASES}
    samples = {p: [] for p in PHASES}
    kappa = None
    failures = []
    print(f"compare_calibration: {args.runs} randomised orderings x {len(jobs)} jobs, "
          f"{args.steps} steps, every probe")
    for name, config, job_sets in jobs:
        ref = work / f"{name}-ref.h5"
        record(exe, config, ref, args.steps,
               job_sets + ["numerics.mode=bitwise", "numerics.block=16"])
        for k in range(args.runs):
            block = rng.randint(2, 96)
            mode = rng.choice(["bitwise", "fast"])
            threads = rng.choice([1, 2])
            if mode == "bitwise" and block == 16:
                block = 17
            sets = [f"numerics.mode={mode}", f"numerics.block={block}", f"train.threads={threads}"]
            alt = work / f"{name}-alt{k}.h5"
            record(exe, config, alt, args.steps, job_sets + sets)
            rc, rep = compare(exe, ref, alt, work / f"{name}-alt{k}.json")
            kappa = rep["kappa"]
            unit = rep["unit"]
            nonzero = 0
            for row in rep["rows"]:
                ph = phase_of(row["op"])
                x = row["rel"] / (unit * row["depth"])
                nonzero += row["rel"] > 0
                samples[ph].append(x)
                if x > worst[ph][0]:
                    worst[ph] = (x, f"{name} {' '.join(sets)}: {row['probe']}")
            label = f"{name}: block {block:3d}, {mode:7s}, {threads} thread(s)"
            print(f"  {label}: {'within budget' if rc == 0 else 'OVER'}; largest ratio "
                  f"{rep['max_ratio']:.3g} at {rep['worst']}; {nonzero} of {len(rep['rows'])} "
                  f"probes differ")
            if rc != 0:
                failures.append(f"{label}: {rep['verdict']}")
            if nonzero == 0:
                failures.append(f"{label}: no probe differs from the reference")
            if not args.keep:
                alt.unlink()
        if not args.keep:
            ref.unlink()

    margin = 8.0  # kCompareMargin
    print(f"\nrel/(u·D) per phase over {sum(len(v) for v in samples.values())} probe rows "
          f"(margin {margin:g}):")
    print(f"{'phase':<6} {'largest':>10} {'p99':>10} {'kappa = margin x largest':>26} "
          f"{'kappa in this build':>20}  where")
    for ph in PHASES:
        v = sorted(samples[ph])
        p99 = v[int(0.99 * (len(v) - 1))] if v else 0.0
        print(f"{ph:<6} {worst[ph][0]:>10.4f} {p99:>10.4f} {margin * worst[ph][0]:>26.3f} "
              f"{kappa[ph] if kappa else float('nan'):>20.3f}  {worst[ph][1]}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    if failures:
        print("\nFAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nchecks: every randomised ordering within this build's budget; every one differs "
          "from the reference")
    return 0


if __name__ == "__main__":
    sys.exit(main())
