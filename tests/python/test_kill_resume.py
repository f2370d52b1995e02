"""A training process killed with SIGKILL at some moment, then resumed with `checkpoint.resume=auto`
(possibly under another layout), ends with weights, Adam moments and per-step metrics
bit-identical to the uninterrupted run."""
import os
import signal
import subprocess
import time

import h5py
import numpy as np
import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")

STEPS = 300
COMMON = ["--quiet", "--set", f"train.steps={STEPS}", "--set", "train.eval_every=100",
          "--set", "train.batch_size=8", "--set", "model.seq_len=64", "--set", "train.threads=1",
          "--set", "checkpoint.every=2", "--set", "checkpoint.keep=2"]


def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    subprocess.run([EXE, "train", *COMMON, "--set", f"checkpoint.dir={d / 'ck'}", "--out", str(d / "o"),
                    "--dump", str(d / "ref.h5")], check=True, capture_output=True)
    return tensors(d / "ref.h5")


def kill_when(ck, ready, timeout=60.0):
    """Starts the run, waits until ready(files) holds, SIGKILLs it; returns whether it was still running."""
    proc = subprocess.Popen([EXE, "train", *COMMON, "--set", f"checkpoint.dir={ck}", "--out", str(ck.parent / "o1")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    while time.time() - t0 < timeout:
        files = os.listdir(ck) if ck.exists() else []
        if ready(files):
            break
        time.sleep(0.0005)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return alive


@pytest.mark.parametrize("point,layout", [
    ("after the first checkpoint", []),
    ("after a later checkpoint", ["layout.dp=2", "layout.zero=3"]),
    ("while a checkpoint is being written", ["layout.pp=2", "layout.microbatches=2"]),
])
def test_killed_run_resumes_bit_identical(tmp_path, reference, point, layout):
    ck = tmp_path / "ck"
    if point == "after the first checkpoint":
        ready = lambda fs: "ckpt-00000002.h5" in fs
    elif point == "after a later checkpoint":
        ready = lambda fs: "ckpt-00000040.h5" in fs
    else:  # a temporary file exists: the writer is between create and rename
        ready = lambda fs: any(".tmp-" in f for f in fs) and "ckpt-00000010.h5" in fs
    assert kill_when(ck, ready), "the run finished before it could be killed"
    extra = [x for kv in layout for x in ("--set", kv)]
    r = subprocess.run([EXE, "train", *COMMON, "--set", f"checkpoint.dir={ck}", "--set", "checkpoint.resume=auto",
                        *extra, "--out", str(tmp_path / "o2"), "--dump", str(tmp_path / "res.h5")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stderr
    got = tensors(tmp_path / "res.h5")
    same({k: v for k, v in reference.items()}, got)
    assert list(got["steps/step"]) == list(range(1, STEPS + 1))
