"""bench_precision_loss: examples/small.toml at a fixed step budget in every precision, against
the source's entropy floor (issue: mixed precision). Each run is `parallax train` with only the
precision keys changed; the final validation loss is read from its run file.

    python3 bench/bench_precision_loss.py [--steps N] [--exe build/app/parallax]

Prints, per precision, the final validation loss, its distance to the loss floor and to fp32,
and the wall time. Checks its results: every run finishes with a finite loss below the
uniform predictor's (ln 16), and the low precisions stay within 0.1 nats of fp32 (a broken cast
or scale would not)."""
import argparse
import math
import os
import subprocess
import sys
import tempfile
import time

import h5py

PRECISIONS = [
    ("fp32", []),
    ("bf16", ["precision.activations=bf16"]),
    ("fp16", ["precision.activations=fp16"]),
    ("fp8-delayed", ["precision.activations=bf16", "precision.fp8=delayed"]),
    ("fp8-block", ["precision.activations=bf16", "precision.fp8=block", "precision.fp8_block_size=32"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--exe", default=os.path.join(os.path.dirname(__file__), "..", "build", "app", "parallax"))
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "..", "examples", "small.toml"))
    args = ap.parse_args()
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for name, sets in PRECISIONS:
            out = os.path.join(tmp, name)
            cmd = [args.exe, "train", args.config, "--quiet", "--out", out,
                   "--set", f"train.steps={args.steps}", "--set", f"train.eval_every={args.steps}"]
            for s in sets:
                cmd += ["--set", s]
            t0 = time.time()
            r = subprocess.run(cmd, capture_output=True, text=True)
            wall = time.time() - t0
            if r.returncode != 0:
                print(f"{name}: parallax train failed ({r.returncode}): {r.stderr.strip()[-400:]}")
                ok = False
                continue
            with h5py.File(os.path.join(out, "run.h5"), "r") as f:
                val = float(f["metrics/val_loss/value"][-1])
                floor = float(f.attrs["loss_floor"])
            rows.append((name, val, floor, wall))
    fp32 = rows[0][1] if rows and rows[0][0] == "fp32" else math.nan
    print(f"bench_precision_loss: {os.path.basename(args.config)}, {args.steps} steps")
    print(f"{'precision':<12} {'val loss':>9} {'- floor':>9} {'- fp32':>9} {'wall s':>8}")
    for name, val, floor, wall in rows:
        print(f"{name:<12} {val:9.4f} {val - floor:+9.4f} {val - fp32:+9.4f} {wall:8.1f}")
        if not (math.isfinite(val) and val < math.log(16)):
            print(f"  {name}: the loss did not train below ln 16")
            ok = False
        if abs(val - fp32) > 0.1:
            print(f"  {name}: more than 0.1 nats from fp32")
            ok = False
    if rows:
        print(f"loss floor {rows[0][2]:.4f} nats/token")
    return 0 if ok and len(rows) == len(PRECISIONS) else 1


if __name__ == "__main__":
    sys.exit(main())
