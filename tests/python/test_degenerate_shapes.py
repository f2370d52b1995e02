"""Degenerate shapes (hardening): for every layout kind, the smallest shapes the layout check
accepts are run through `parallax validate` bitwise.

For one layout, the shape keys are shrunk one after another, from a base every layout takes: each
key goes to the smallest value that `parallax validate` does not refuse as bad input (exit 2),
given the keys already shrunk. Every shape it accepts on the way must match the single device bit
for bit (exit 0). So a layout either is exact on one column, one head, one token block or one
sequence per rank (and on ranks whose shard of the vocabulary or of the tokens is empty), or its
layout check refuses the shape with a sentence naming a key; an accepted shape that diverges
(exit 6) or cannot run (exit 3, an internal error) fails the test with the run's output.
"""
import os
import subprocess

import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")

# A base that every layout below accepts: 4 layers for pp4, heads and ffn for tp4, 4 sequences
# for dp4, one-token blocks so that every token split lands on a block edge.
BASE = {
    "model.vocab": 8,
    "model.seq_len": 4,
    "model.layers": 4,
    "model.heads": 4,
    "model.hidden": 8,
    "model.ffn": 8,
    "train.batch_size": 4,
}
# The order keys shrink in: the smallest shards first (columns, heads, vocabulary rows), then the
# token dimensions, then depth.
ORDER = ["model.ffn", "model.heads", "model.hidden", "model.vocab", "model.seq_len",
         "train.batch_size", "model.layers"]
FIXED = {"numerics.block": 1, "train.threads": 1, "train.eval_every": 0, "train.microbatches": 1}

# Every layout kind: dp (ZeRO 0-3, microbatches, degrees that are not a power of two), tp (1, 3, 4
# ranks; sequence parallelism), pp (GPipe, 1F1B, interleaved, recomputation), and their products.
# A layout's extra keys may also move the base (dp3: three sequences of one block each; tp3:
# three heads).
LAYOUTS = [
    ("dp2", []),
    ("dp3", ["train.batch_size=3", "numerics.block=4"]),
    # Ranges that are not tree nodes: computed as their nodes (ZeRO-2 then runs dp-major).
    ("dp6xz2", ["train.batch_size=6"]),
    ("dp3xtp2xmb2", ["train.batch_size=6"]),
    ("dp4xz1", []),
    ("dp2xz2xmb2", []),
    ("dp4xz3", []),
    ("tp2", []),
    ("tp3", ["model.heads=3", "model.hidden=6", "model.ffn=6"]),
    ("tp4", []),
    ("tp2xsp", []),
    ("tp4xsp", []),
    ("pp2", ["layout.schedule=gpipe"]),
    ("pp4xmb4", ["layout.schedule=1f1b"]),
    ("pp2xmb2", ["layout.schedule=interleaved", "layout.virtual_stages=2"]),
    ("pp2xmb2", ["layout.recompute=full"]),
    ("dp2xtp2xz3", []),
    ("dp2xpp2xz2", []),
    ("tp2xpp2xsp", []),
    ("dp2xtp2xpp2xz1", []),
]


def run(layout, fixed, shape):
    args = [EXE, "validate", "--layouts", layout, "--steps", "2"]
    for k, v in {**fixed, **shape}.items():
        args += ["--set", f"{k}={v}"]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("layout,extra", LAYOUTS, ids=[l + ("-" + e[0].split("=")[1] if e and e[0].startswith("layout") else "")
                                                       for l, e in LAYOUTS])
def test_smallest_accepted_shapes_are_bitwise(layout, extra):
    fixed, shape = dict(FIXED), dict(BASE)
    for e in extra:
        k, v = e.split("=")
        (shape if k in shape else fixed)[k] = int(v) if v.isdigit() else v
    r = run(layout, fixed, shape)
    assert r.returncode == 0, f"the base shape {shape} under {layout}:\n{r.stdout}\n{r.stderr}"
    accepted = 1
    for key in ORDER:
        for value in range(1, shape[key]):
            trial = dict(shape, **{key: value})
            r = run(layout, fixed, trial)
            if r.returncode == 2:
                # Refused as bad input: the message names a key of the config or the layout.
                assert "error" in r.stderr.lower() or "layout" in r.stderr, r.stderr
                assert any(k.split(".")[1] in r.stderr for k in ORDER) or "layout" in r.stderr, \
                    r.stderr
                continue
            assert r.returncode == 0, \
                f"{layout} accepted {trial} but did not match bit for bit (exit " \
                f"{r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            accepted += 1
            shape = trial
            break
    print(f"{layout} {' '.join(extra)}: smallest accepted shape {shape} ({accepted} shapes run)")
