"""Golden traces: `parallax record` writes the single device's probes; `parallax validate --golden`
checks a layout (data, tensor, sequence and pipeline parallel, ZeRO, microbatches) against the
trace without
running the reference, in-process and under mpirun, and names the first probe, rank and element
that differ."""
import json
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

EXE = os.environ.get("PARALLAX_EXE")
MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")
needs_mpi = pytest.mark.skipif(not MPIRUN, reason="mpirun is not installed")
MPI = [MPIRUN or "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
JOB = ["--set", "train.threads=1", "--set", "model.seq_len=64", "--set", "numerics.block=32"]
FLIP = ["--set", "fault.kind=flip_grad", "--set", "fault.rank=1", "--set", "fault.step=2",
        "--set", "fault.element=7"]


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("golden")
    r = subprocess.run([EXE, "record", *JOB, "--out", str(d / "ref.h5"), "--steps", "3"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "MB per recorded step" in r.stdout
    return d / "ref.h5"


def as_text(x):
    return x.decode() if isinstance(x, bytes) else str(x)


def validate(tmp_path, trace, *args, mpi=False):
    cmd = [*MPI, EXE] if mpi else [EXE]
    return subprocess.run([*cmd, "validate", *JOB, "--golden", str(trace), "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=300)


def test_trace_file_holds_the_reference_probes(trace):
    with h5py.File(trace, "r") as f:
        assert f.attrs["format"] == b"parallax-trace" and f.attrs["format_version"] == 1
        assert f.attrs["steps"] == 3 and f.attrs["stride"] == 1
        order = bytes(f["order"][()]).decode().split("\n")
        assert order[0] == "1/fwd/-/embed/out"
        assert "3/optim/1/param/mlp.c_fc.weight" in order
        for name in order[:5] + order[-5:]:
            assert f["probes/" + name].dtype == np.float32


def test_layouts_match_the_trace(tmp_path, trace):
    layouts = ["dp2", "dp4xz1xmb2", "dp2xz3", "pp2", "pp2xmb4", "dp2xpp2xz2", "tp2", "tp2xsp",
               "dp2xtp2xz1"]
    r = validate(tmp_path, trace, "--layouts", ",".join(layouts))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((tmp_path / "validate.json").read_text())
    assert [l["verdict"] for l in rep["layouts"]] == ["match"] * len(layouts)


def test_a_flipped_gradient_is_named_by_probe_rank_and_element(tmp_path, trace):
    r = validate(tmp_path, trace, "--layouts", "dp2", *FLIP)
    assert r.returncode == 6, r.stdout + r.stderr
    assert "step 2, 2/grad/-/param/wte on rank 1 [0, 7]" in r.stdout
    l = json.loads((tmp_path / "validate.json").read_text())["layouts"][0]
    assert l["first_op"]["name"] == "2/grad/-/param/wte" and l["first_op_rank"] == 1
    assert l["first_op"]["first_index"] == [0, 7]


def test_another_job_or_a_damaged_trace_is_refused(tmp_path, trace):
    r = validate(tmp_path, trace, "--layouts", "dp2", "--set", "train.lr=0.001")
    assert r.returncode == 2 and "[train]" in r.stderr and str(trace) in r.stderr
    bad = tmp_path / "bad.h5"
    shutil.copy(trace, bad)
    with h5py.File(bad, "r+") as f:
        d = f["probes/2/fwd/0/ln_1/out"]
        x = d[()]
        x.flat[3] = x.flat[3] + 1.0
        d[...] = x
    r = validate(tmp_path, bad, "--layouts", "dp2")
    assert r.returncode == 2 and "2/fwd/0/ln_1/out fails its checksum" in r.stderr


def test_a_trace_whose_tokens_this_machine_does_not_draw_is_refused(tmp_path, trace):
    # The trace holds a hash of the recorded steps' tokens; a machine whose libm draws another
    # Markov table (simulated: another hash) cannot match it, and says why instead of diverging.
    with h5py.File(trace, "r") as f:
        assert as_text(f.attrs["data_hash"]).startswith("0x")
    other = tmp_path / "other.h5"
    shutil.copy(trace, other)
    with h5py.File(other, "r+") as f:
        f.attrs.modify("data_hash", np.bytes_(b"0x0123456789abcdef"))
    r = validate(tmp_path, other, "--layouts", "dp2")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "other tokens" in r.stderr and "0x0123456789abcdef" in r.stderr and str(other) in r.stderr


def test_record_refuses_steps_outside_the_job(tmp_path):
    for steps in ["0", "601"]:
        r = subprocess.run([EXE, "record", *JOB, "--out", str(tmp_path / "x.h5"), "--steps", steps],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, r.stdout + r.stderr
        assert f"--steps {steps} must be in 1..train.steps (600)" in r.stderr
        assert not (tmp_path / "x.h5").exists()


@needs_mpi
def test_golden_validation_under_mpirun(tmp_path, trace):
    r = validate(tmp_path, trace, "--layouts", "dp2", mpi=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("dp2         3  match") == 1  # rank 0 reports
    r = validate(tmp_path, trace, "--layouts", "dp2", *FLIP, mpi=True)
    assert r.returncode == 6, r.stdout + r.stderr
    assert "step 2, 2/grad/-/param/wte on rank 1 [0, 7]" in r.stdout


@needs_mpi
@pytest.mark.parametrize("layout", ["dp2xpp2", "dp2xtp2xsp", "tp2xpp2"])
def test_golden_validation_of_pipeline_and_tensor_layouts_under_mpirun(tmp_path, trace, layout):
    mpi4 = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "4", EXE]
    r = subprocess.run([*mpi4, "validate", *JOB, "--golden", str(trace), "--out", str(tmp_path),
                        "--layouts", layout], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads((tmp_path / "validate.json").read_text())
    assert rep["layouts"][0]["verdict"] == "match"


@needs_mpi
def test_golden_validation_names_a_tp_rank_under_mpirun(tmp_path, trace):
    # World rank 1 of tp2 is tp rank 1: its reduced gradient of wte holds vocabulary rows
    # [V/2, V) only, so the flip of its local element 7 is logical element [V/2, 7].
    r = validate(tmp_path, trace, "--layouts", "tp2", *FLIP, mpi=True)
    assert r.returncode == 6, r.stdout + r.stderr
    l = json.loads((tmp_path / "validate.json").read_text())["layouts"][0]
    assert l["first_op"]["name"] == "2/grad/-/param/wte" and l["first_op_rank"] == 1
