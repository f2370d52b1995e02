"""`parallax compare REF.h5 RUN.h5`: two traces op by op under the error budget
(validators/trace_compare.h). Another summation order is consistent with rounding (exit 0); a
layout trace whose pieces say which rank held what (as parallax.torch writes them: /pieces,
/replicas, the layout attribute) is named at the first op over budget, with the rank whose piece
breaks it (exit 3); bad input exits 2 naming the file. parallax.compare gives the same report."""
import json
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")
JOB = ["--set", "train.threads=1", "--set", "model.seq_len=64", "--set", "model.layers=2",
       "--set", "numerics.block=32"]
K = np.uint64(0x5058434B50543031)


def mix64(x):
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def checksum_f32(a):
    """core/io/checkpoint.h's checksum of a float32 array (row-major logical order)."""
    bits = np.ascontiguousarray(a, dtype="<f4").view("<u4").ravel().astype(np.uint64)
    i = np.arange(bits.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return int(mix64(mix64(i ^ K) ^ bits).sum(dtype=np.uint64))


def record(path, *extra):
    r = subprocess.run([EXE, "record", *JOB, *extra, "--out", str(path), "--steps", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return path


def compare(ref, run, *extra):
    return subprocess.run([EXE, "compare", str(ref), str(run), *extra], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return record(tmp_path_factory.mktemp("compare") / "ref.h5")


def rewrite(f, name, data):
    """Replaces probe `name` of an open trace with `data`, checksum and all."""
    del f["probes/" + name]
    d = f.create_dataset("probes/" + name, data=np.asarray(data, dtype="<f4"))
    d.attrs["checksum"] = np.uint64(checksum_f32(data))


def as_layout_trace(src, dst):
    """A copy of a single-device trace dressed as a 2-rank dp layout's: the batch rows of every
    activation split between the ranks (/pieces), the gradients held whole by both."""
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        f.attrs["source"] = np.bytes_("torch")
        f.attrs["layout"] = np.bytes_(json.dumps(
            {"world": 2, "axes": {"dp": 2}, "ranks": [{"dp": 0}, {"dp": 1}]}))
        lines = []
        for name in bytes(f["order"][()]).decode().split("\n"):
            shape = f["probes/" + name].shape
            if "/fwd/" in name or "/bwd/" in name:
                half = shape[0] // 2
                for r, (lo, hi) in enumerate([(0, half), (half, shape[0])]):
                    lo_s = ",".join(str(x) for x in [lo] + [0] * (len(shape) - 1))
                    hi_s = ",".join(str(x) for x in [hi] + list(shape[1:]))
                    lines.append(f"{name}\t{r}\t{lo_s}\t{hi_s}")
            else:
                for r in range(2):
                    lines.append(f"{name}\t{r}\t{','.join('0' * len(shape))}\t"
                                 f"{','.join(str(x) for x in shape)}")
        f.create_dataset("pieces", data=np.frombuffer("\n".join(lines).encode(), dtype=np.uint8))
    return dst


def test_another_summation_order_is_consistent_with_rounding(ref, tmp_path):
    alt = record(tmp_path / "alt.h5", "--set", "numerics.block=8")
    r = compare(ref, alt, "--json", str(tmp_path / "c.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: consistent with rounding" in r.stdout
    rep = json.loads((tmp_path / "c.json").read_text())
    assert rep["within"] and rep["first_over"] is None
    assert 0 < rep["max_ratio"] <= 1
    assert rep["unit"] == 2.0 ** -24 and rep["layers"] == 2
    assert sum(row["rel"] > 0 for row in rep["rows"]) > len(rep["rows"]) // 2


def test_a_rank_whose_rows_are_off_is_named_with_its_rank(ref, tmp_path):
    run = as_layout_trace(ref, tmp_path / "run.h5")
    name = "1/fwd/1/attn.proj/out"  # dp rank 1's rows 1% high, as a missing scale would leave them
    with h5py.File(run, "r+") as f:
        x = f["probes/" + name][()]
        x[x.shape[0] // 2:] *= np.float32(1.01)
        rewrite(f, name, x)
    r = compare(ref, run, "--json", str(tmp_path / "c.json"))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "over budget: step 1, fwd/1/attn.proj/out" in r.stdout
    rep = json.loads((tmp_path / "c.json").read_text())
    assert rep["first_over"]["probe"] == name and rep["first_over"]["rank"] == -1
    split = {p["rank"]: p for p in rep["split"]}
    assert split[0]["ratio"] == 0 and split[0]["coords"] == "dp 0"
    assert split[1]["ratio"] > 100 and split[1]["coords"] == "dp 1"
    assert "rank 1 (dp 1)" in r.stdout
    # Python gives the same report.
    import parallax
    assert parallax.compare(ref, run)["verdict"] == rep["verdict"]


def test_a_replica_that_differs_is_judged_on_its_rank(ref, tmp_path):
    run = as_layout_trace(ref, tmp_path / "run.h5")
    name = "1/grad/0/param/mlp.c_fc.weight"  # rank 1 never all-reduced: half the gradient
    with h5py.File(run, "r+") as f:
        g = f["probes/" + name][()] * np.float32(0.5)
        d = f.create_dataset(f"replicas/{name}/1", data=g)
        d.attrs["lo"] = np.zeros(g.ndim, dtype=np.int64)
        d.attrs["hi"] = np.array(g.shape, dtype=np.int64)
        d.attrs["checksum"] = np.uint64(checksum_f32(g))
    r = compare(ref, run, "--json", str(tmp_path / "c.json"))
    assert r.returncode == 3, r.stdout + r.stderr
    rep = json.loads((tmp_path / "c.json").read_text())
    assert rep["first_over"] == {"probe": name, "step": 1, "op": name[2:], "rank": 1,
                                 "ratio": rep["first_over"]["ratio"]}
    assert rep["first_over"]["ratio"] > 1e4
    assert f"step 1, {name[2:]} on rank 1" in r.stdout


def test_bad_input_is_refused_naming_the_file(ref, tmp_path):
    r = compare(ref, tmp_path / "missing.h5")
    assert r.returncode == 2 and "missing.h5" in r.stderr and "no such file" in r.stderr
    run = as_layout_trace(ref, tmp_path / "run.h5")
    with h5py.File(run, "r+") as f:
        del f["pieces"]
        f.create_dataset("pieces", data=np.frombuffer(b"1/fwd/-/embed/out\t0\t0,0\t", np.uint8))
    r = compare(ref, run)
    assert r.returncode == 2 and "/pieces has a damaged line" in r.stderr and "run.h5" in r.stderr
    r = subprocess.run([EXE, "compare", str(ref)], capture_output=True, text=True)
    assert r.returncode == 2 and "run" in r.stderr
