#!/usr/bin/env python3
"""bench_gui_step: the job's step time with the workbench attached against the same job headless,
on a quiet host and on a loaded one (a busy-loop process on one core, as another user's job).

    python3 bench/bench_gui_step.py [--exe build/app/parallax] [--steps N] [--rounds R]
                                    [--threads N] [--load both|quiet|loaded] [CONFIG]

Each round runs, back to back, `parallax train` (its per-step lines: the median ms of the steps
after the fourth) and `parallax gui --measure` under Xvfb (which alternates, in one process, the
job headless and with the window drawing as a person sees it: its headless and attached medians).
The host is shared, so the figures are ratios within a round, and their median over the rounds:
attached / train and attached / headless (the same process). Prints figures only; it never fails
on a time. Checks its results: every run exits 0 and prints its step times (else exit status 1).
CONFIG defaults to the embedded default job.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys


def train_ms(exe, config, steps, sets):
    args = [exe, "train", *([config] if config else []), "--set", f"train.steps={steps}",
            "--set", "output.run_file=false", "--set", "train.eval_every=0", *sets]
    r = subprocess.run(args, capture_output=True, text=True, timeout=1200)
    if r.returncode != 0:
        raise RuntimeError("parallax train failed: " + r.stderr[-2000:])
    ms = [float(m.group(2)) for m in re.finditer(r"step (\d+)/\d+ .* ([\d.]+) ms", r.stderr)
          if int(m.group(1)) > 4]
    if not ms:
        raise RuntimeError("parallax train printed no step times:\n" + r.stderr[-2000:])
    return statistics.median(ms)


def gui_ms(exe, config, steps, sets):
    # A fresh X server per run, on a free display (as the tests' `parallax gui --screenshot`).
    args = ["xvfb-run", "-a", "-s", "-screen 0 1600x1000x24", exe, "gui", "--measure", "--steps", str(steps), *([config] if config else []),
            "--set", "output.run_file=false", "train.eval_every=0", *sets[1::2]]
    r = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError("parallax gui --measure failed: " + (r.stdout + r.stderr)[-2000:])
    m = re.search(r"headless ([\d.]+) ms, with the workbench ([\d.]+) ms", r.stdout)
    f = re.search(r"frame time .*: median ([\d.]+) ms", r.stdout)
    if not m:
        raise RuntimeError("parallax gui --measure printed no step times:\n" + r.stdout)
    return float(m.group(1)), float(m.group(2)), float(f.group(1)) if f else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", default="")
    ap.add_argument("--exe", default=os.path.join("build", "app", "parallax"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="train.threads (0: the default)")
    ap.add_argument("--load", choices=["both", "quiet", "loaded"], default="both")
    a = ap.parse_args()
    if not shutil.which("xvfb-run"):
        print("xvfb-run is needed (scripts/setup.sh --all installs it)")
        return 1
    sets = ["--set", f"train.threads={a.threads}"] if a.threads else []
    ok = True
    for load in (["quiet", "loaded"] if a.load == "both" else [a.load]):
        rows = []
        for k in range(a.rounds):
            busy = None
            if load == "loaded":  # another user's work on one core, for the whole round
                busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                with open("/proc/loadavg") as f:
                    avg = float(f.read().split()[0])
                t = train_ms(a.exe, a.config, a.steps, sets)
                h, g, frame = gui_ms(a.exe, a.config, a.steps, sets)
                rows.append((t, h, g, frame))
                print(f"{load:6s} round {k + 1}: train {t:7.2f} ms/step | gui --measure: "
                      f"headless {h:7.2f}, attached {g:7.2f} ms/step, frame median "
                      f"{frame:.1f} ms | attached/train {g / t:.3f}, attached/headless "
                      f"{g / h:.3f} (load average {avg:.1f})", flush=True)
            except RuntimeError as e:
                print(f"{load} round {k + 1}: {e}")
                ok = False
            finally:
                if busy:
                    busy.kill()
                    busy.wait()
        if rows:
            print(f"{load:6s} median over {len(rows)} rounds: attached/train "
                  f"{statistics.median(r[2] / r[0] for r in rows):.3f}, attached/headless "
                  f"{statistics.median(r[2] / r[1] for r in rows):.3f}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
