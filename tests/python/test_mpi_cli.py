"""`mpirun -np 4 parallax train` (ranks as processes) writes the same --dump as the in-process run."""
import os
import shutil
import subprocess

import h5py
import pytest

EXE = os.environ.get("PARALLAX_EXE")
MPIRUN = shutil.which("mpirun")
pytestmark = [pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)"),
              pytest.mark.skipif(not MPIRUN, reason="mpirun is not installed")]

LAYOUT = ["--set", "layout.dp=2", "--set", "layout.tp=2", "--set", "numerics.block=32",
          "--set", "train.steps=3", "--set", "train.threads=1"]
# CI runs as root on 2 cores: Open MPI wants both said out loud.
MPI = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "4"]


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        config = f.attrs["config"]
    return out, config


def test_mpi_dump_equals_in_process_dump_byte_for_byte(tmp_path):
    out = str(tmp_path / "out")  # the same output dir: the config attribute records it
    mpi = subprocess.run([*MPI, EXE, "train", *LAYOUT, "--out", out, "--dump", str(tmp_path / "a.h5")],
                         capture_output=True, text=True, timeout=300)
    assert mpi.returncode == 0, mpi.stderr
    # Rank 0 alone reports: one banner, one summary.
    assert mpi.stdout.count("parallax train:") == 1
    assert mpi.stdout.count("summary") == 1
    inproc = subprocess.run([EXE, "train", *LAYOUT, "--out", out, "--dump", str(tmp_path / "b.h5")],
                            capture_output=True, text=True, timeout=300)
    assert inproc.returncode == 0, inproc.stderr
    a, config_a = datasets(tmp_path / "a.h5")
    b, config_b = datasets(tmp_path / "b.h5")
    assert a.keys() == b.keys()
    assert len(a) > 4
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), f"{name} differs between mpirun and in-process"
    assert config_a == config_b


def test_mpi_world_of_the_wrong_size_is_a_config_error(tmp_path):
    r = subprocess.run([*MPI, EXE, "train", "--set", "layout.dp=2", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "the world has 4 ranks" in r.stderr and "mpirun -np 2" in r.stderr
