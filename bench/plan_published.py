"""The planner against published training runs: for each, `parallax plan` on the published device
count and cluster, the layout it picks with its predicted MFU, the published layout's own
prediction (the best candidate with the published dp, tp, pp and cp), and the published figure.
Prints a Markdown table.

    PARALLAX_EXE=build/app/parallax python3 bench/plan_published.py

Sources (the published figures):
  GPT-3 175B, 1024 A100: Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
      Clusters Using Megatron-LM" (arXiv 2104.04473), §5.1: batch 1536 on 1024 GPUs, about 140
      TFLOP/s per GPU (45% of the A100's 312), with t = 8 (and p = 16 here, so that dp divides).
  Llama 3 405B, 16,384 H100: "The Llama 3 Herd of Models" (arXiv 2407.21783), Table 4: TP 8,
      CP 1, PP 16, DP 128, sequence 8192, 16M tokens per batch, 400 TFLOP/s per GPU, 41% BF16 MFU.
  Llama 3.1 8B, 8 H100: TorchTitan (arXiv 2410.06511; docs/performance.md Table 1): FSDP on 8 GPUs,
      global batch 16 of 8192 tokens, 5,762 tokens/s per GPU (about 36% MFU by 6N + attention).

Checks its results: every plan exits 0 and picks a layout that fits, with 0 < MFU < 1.
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXE = os.environ.get("PARALLAX_EXE", str(ROOT / "build" / "app" / "parallax"))

RUNS = [
    {"name": "GPT-3 175B", "config": "examples/plan/gpt3-175b.toml", "gpus": 1024,
     "cluster": "examples/clusters/a100-ib200.toml", "peak": 312e12,
     "published": {"dp": 8, "tp": 8, "pp": 16, "cp": 1}, "published_mfu": 0.45,
     "source": "arXiv 2104.04473 §5.1 (140 TFLOP/s/GPU)"},
    {"name": "Llama 3 405B", "config": "examples/plan/llama3-405b.toml", "gpus": 16384,
     "cluster": "examples/clusters/h100-nvlink-ib400.toml", "peak": 989e12,
     "published": {"dp": 128, "tp": 8, "pp": 16, "cp": 1}, "published_mfu": 0.41,
     "source": "arXiv 2407.21783 Table 4 (400 TFLOP/s/GPU)"},
    {"name": "Llama 3.1 8B", "config": "examples/plan/llama31-8b.toml", "gpus": 8,
     "cluster": "examples/clusters/h100-nvlink-ib400.toml", "peak": 989e12,
     "published": {"dp": 8, "tp": 1, "pp": 1, "cp": 1, "zero": 3}, "published_mfu": None,
     "published_tps": 5762, "source": "TorchTitan, arXiv 2410.06511 / docs Table 1 (FSDP)"},
]


def plan(run, out):
    cmd = [EXE, "plan", str(ROOT / run["config"]), "--gpus", str(run["gpus"]), "--cluster",
           str(ROOT / run["cluster"]), "--json", out, "--top", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    print(r.stdout)
    with open(out) as f:
        return json.load(f)


def matches(c, want):
    return all(c.get(k) == v for k, v in want.items())


def main():
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        for run in RUNS:
            p = plan(run, os.path.join(tmp, "plan.json"))
            fits = [c for c in p["candidates"] if c["fits"]]
            best = fits[0]
            # the published layout's best prediction, fitting in memory or not
            pub = sorted((c for c in p["candidates"] if matches(c, run["published"])),
                         key=lambda c: c["time_s"]["step"])
            mine = pub[0] if pub else None
            ok = ok and 0 < best["mfu"] < 1
            tokens = best["tokens_per_s"] / run["gpus"]
            published = (f"{100 * run['published_mfu']:.0f}%" if run["published_mfu"]
                         else f"{run['published_tps']:,} tok/s/GPU")
            rows.append(
                f"| {run['name']} | {run['gpus']:,} | {best['label']} | "
                f"{best['memory_bytes'] / 2**30:.1f} GiB | {100 * best['mfu']:.1f}% "
                f"({tokens:,.0f} tok/s/GPU) | "
                + (f"{mine['label']}: {100 * mine['mfu']:.1f}%"
                   + ("" if mine["fits"] else f", needs {mine['memory_bytes'] / 2**30:.0f} GiB: does not fit")
                   if mine else "not a valid layout here")
                + f" | {published} | {run['source']} |")
    print("| run | GPUs | planner's pick | memory/GPU | predicted MFU | published layout, predicted | published | source |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print("\nchecks passed" if ok else "\nCHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
