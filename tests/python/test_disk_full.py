"""A full disk under every writer: checkpoints, the run file and the dump, in-process and under
mpirun. Each run ends with an error that says so (never a signal), and every file written
before it still verifies. The file systems are small tmpfs mounts the test makes; where the
machine refuses to mount, the tests are skipped with the reason."""
import os
import shutil
import subprocess

import pytest

EXE = os.environ.get("PARALLAX_EXE")
MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")

COMMON = ["--quiet", "--set", "train.threads=1", "--set", "layout.timeout_s=20"]


@pytest.fixture
def small_fs(tmp_path):
    """mount(size) -> a folder on a fresh tmpfs of that size."""
    mounts = []

    def mount(size):
        d = tmp_path / f"fs{len(mounts)}"
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip("cannot mount a tmpfs here: " + r.stderr.strip())
        mounts.append(d)
        return d

    yield mount
    for d in mounts:
        subprocess.run(["umount", str(d)], check=False)


def run(args, mpi=False):
    cmd = ([MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2"] if mpi else []) + [EXE]
    return subprocess.run(cmd + ["train", *COMMON, *args], capture_output=True, text=True,
                          timeout=600)


def ended_cleanly(r, mpi=False):
    # Exit 7 (cannot write) with a sentence, never a signal (mpirun reports a rank's signal as
    # 128 + n, a process killed by one is negative here). Under mpirun the first rank to exit
    # decides the code: 7, or 4 from a rank that the failing one's abort reached first.
    assert r.returncode in ((4, 7) if mpi else (7,)), (r.returncode, r.stderr[-2000:])
    assert "free space" in r.stderr, r.stderr[-2000:]
    assert "Segmentation" not in r.stderr and "signal" not in r.stderr


def verifies(path):
    r = subprocess.run([EXE, "inspect", str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("mpi", [False, pytest.param(True, marks=pytest.mark.skipif(
    not MPIRUN, reason="mpirun is not installed"))])
def test_checkpoints_on_a_full_disk(tmp_path, small_fs, mpi):
    fs = small_fs("3m")  # two checkpoints of about 1.4 MB fit, the third does not
    args = ["--out", str(tmp_path / "out"), "--set", "train.steps=6", "--set",
            f"checkpoint.dir={fs}/ck", "--set", "checkpoint.every=1", "--set", "checkpoint.keep=10"]
    if mpi:
        args += ["--set", "layout.dp=2"]
    r = run(args, mpi=mpi)
    ended_cleanly(r, mpi)
    done = sorted((fs / "ck").glob("ckpt-*.h5"))
    assert len(done) >= 1
    for ck in done:
        verifies(ck)
    assert not list((fs / "ck").glob(".ckpt-*")), "a failed write left its temporary file"


def test_the_run_file_on_a_full_disk(tmp_path, small_fs):
    fs = small_fs("336k")  # the run file starts at about 64 KB, with 256 KB kept in reserve
    tiny = ["--set", "model.layers=1", "--set", "model.hidden=16", "--set", "model.ffn=32",
            "--set", "model.seq_len=16", "--set", "train.batch_size=2"]
    r = run(["--out", str(fs), *tiny, "--set", "train.steps=4000", "--set", "train.eval_every=0",
             "--set", f"checkpoint.dir={tmp_path}/ck", "--set", "checkpoint.every=100"])
    ended_cleanly(r)
    # The checkpoints on the other file system are whole. (The run file itself may be left
    # damaged by the write that failed; a resume moves it aside and starts it anew.)
    done = sorted((tmp_path / "ck").glob("ckpt-*.h5"))
    assert done
    verifies(done[-1])


def test_the_dump_on_a_full_disk(tmp_path, small_fs):
    fs = small_fs("1m")  # the dump is about 1.4 MB
    r = run(["--out", str(tmp_path / "out"), "--set", "train.steps=2", "--set",
             f"checkpoint.dir={tmp_path}/ck", "--dump", str(fs / "dump.h5")])
    ended_cleanly(r)
    assert not (fs / "dump.h5").exists()  # a half-written dump is removed
    # The checkpoint written before the dump is whole.
    verifies(sorted((tmp_path / "ck").glob("ckpt-*.h5"))[-1])
