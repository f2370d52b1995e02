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
