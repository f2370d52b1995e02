"""Every path a training run writes is checked before step 1: a file given as a folder, a folder
given as a file, and a folder on a read-only file system are bad input (exit 2), named by their
key or option, and nothing is trained first."""
import os
import subprocess

import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")

# Long enough that a check made after training would show in the time and the output.
COMMON = ["--quiet", "--set", "train.steps=50", "--set", "train.threads=1"]


def train(tmp_path, *args):
    return subprocess.run([EXE, "train", *COMMON, *args], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)


def refused(r, *words):
    assert r.returncode == 2, r.stdout + r.stderr
    for w in words:
        assert w in r.stderr, r.stderr
    assert "summary" not in r.stdout  # refused before any step


def test_out_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    refused(train(tmp_path, "--out", str(tmp_path / "f")), 'output.dir = "', "is a file")


def test_run_file_is_a_folder(tmp_path):
    (tmp_path / "out" / "run.h5").mkdir(parents=True)
    refused(train(tmp_path, "--out", str(tmp_path / "out")), "the run file", "is a folder")


def test_dump_is_a_folder(tmp_path):
    refused(train(tmp_path, "--out", str(tmp_path / "out"), "--dump", str(tmp_path)),
            '--dump = "', "is a folder")


@pytest.fixture
def read_only(tmp_path):
    """A read-only file system of the test's own (a tmpfs mounted ro); skipped where the machine
    refuses to mount."""
    ro = tmp_path / "ro"
    ro.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here: " + r.stderr.strip())
    yield ro
    subprocess.run(["umount", str(ro)], check=False)


@pytest.mark.parametrize("key,value,words", [
    ("--dump", "{ro}/dump.h5", ['--dump = "', "Read-only file system"]),
    ("--set", "output.export_llmc={ro}/w.bin", ['output.export_llmc = "', "Read-only"]),
    ("--set", "checkpoint.dir={ro}/ck", ['checkpoint.dir = "', "cannot be created"]),
    ("--out", "{ro}", ['output.dir = "', "Read-only file system"]),
])
def test_read_only_outputs(tmp_path, read_only, key, value, words):
    out = [] if key == "--out" else ["--out", str(tmp_path / "out")]
    r = train(tmp_path, *out, key, value.format(ro=read_only))
    refused(r, *words)


def test_a_second_run_into_a_running_jobs_folder_stops_and_leaves_it_whole(tmp_path):
    """The first run holds its output folder (an advisory lock): a second run started into it
    exits 2 naming the folder and the holder, and the first run's run file stays readable."""
    import time

    import h5py

    out = tmp_path / "out"
    first = subprocess.Popen([EXE, "train", "--quiet", "--set", "train.steps=150",
                              "--set", "train.threads=1", "--out", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (out / "run.h5").exists() and time.time() < deadline:
            time.sleep(0.05)
        assert (out / "run.h5").exists()
        second = train(tmp_path, "--out", str(out))
        refused(second, 'output.dir = "', "is in use by another run", str(first.pid))
    finally:
        _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    with h5py.File(out / "run.h5", "r") as f:
        assert len(f["metrics/loss/step"]) == 150
    # Once the first run has ended the folder is free again.
    third = train(tmp_path, "--out", str(out), "--set", "train.steps=2")
    assert third.returncode == 0, third.stderr
