"""Injected faults through the CLI, on in-process ranks and on processes under mpirun: each is
caught and named, the exit code tells a cluster script what to do (4: restart, 5: silent data
corruption, take the node out; mpirun's 137: a rank was killed, restart), no checkpoint is
corrupted, and a restart with `checkpoint.resume=auto` ends bit-identical to a run without the
fault."""
import os
import shutil
import subprocess

import h5py
import pytest

EXE = os.environ.get("PARALLAX_EXE")
MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")
needs_mpi = pytest.mark.skipif(not MPIRUN, reason="mpirun is not installed")
MPI = [MPIRUN or "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "4"]

COMMON = ["--quiet", "--set", "train.steps=8", "--set", "train.batch_size=8", "--set", "model.seq_len=32",
          "--set", "train.threads=1", "--set", "output.run_file=false", "--set", "layout.timeout_s=3",
          "--set", "train.eval_every=4", "--set", "train.val_batches=1"]
DP4 = ["--set", "layout.dp=4"]


def train(tmp_path, *args, mpi=False, timeout=300):
    cmd = [*MPI, EXE] if mpi else [EXE]
    return subprocess.run([*cmd, "train", *COMMON, "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=timeout)


def datasets(path):
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out


def assert_same_dump(a, b):
    da, db = datasets(a), datasets(b)
    assert da.keys() == db.keys() and len(da) > 4
    for name in da:
        assert da[name].tobytes() == db[name].tobytes(), f"{name} differs"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The dp4 run without faults: its dump."""
    d = tmp_path_factory.mktemp("ref")
    r = train(d, *DP4, "--dump", str(d / "ref.h5"))
    assert r.returncode == 0, r.stderr
    return d / "ref.h5"


def test_transient_flip_is_named_and_rerun_away(tmp_path, reference):
    r = train(tmp_path, *DP4, "--set", "validate.replica_check_every=4",
              "--fault", "flip_weight:rank=2,step=3,tensor=h.1.mlp.c_proj.weight,element=11",
              "--dump", str(tmp_path / "a.h5"))
    assert r.returncode == 0, r.stderr
    assert "flipped bit 20 of h.1.mlp.c_proj.weight[11]" in r.stderr
    assert "replica check at step 4: the weights of world rank 2 differ" in r.stderr
    assert "the fault on world rank 2 was transient" in r.stderr
    assert_same_dump(tmp_path / "a.h5", reference)


# dp3 x pp2 under ZeRO-2 (three replicas of a two-stage pipeline; each replica owns one token block).
DP3PP2Z2 = ["--set", "layout.dp=3", "--set", "layout.pp=2", "--set", "layout.zero=2", "--set", "train.batch_size=6"]


@pytest.mark.parametrize("fault, named", [
    # a weight rank 1 holds as a mere replica (wpe is dp rank 0's shard), flipped between two checks:
    # step 4 uses it, then the owner's shard overwrites it (this run used to exit 0, its dump apart)
    ("flip_weight:rank=1,step=3,tensor=wpe,element=5", "the weights of world rank 1 differ"),
    # the gradient shard that only rank 0 updates (it used to go unseen: the replicas all take its update)
    ("flip_grad:rank=0,step=3,tensor=wpe,element=5", "world rank 0's reduced gradient shard differs"),
])
def test_zero2_pipeline_fault_between_checks_is_found_and_rerun_exactly(tmp_path, fault, named):
    r = train(tmp_path, *DP3PP2Z2, "--dump", str(tmp_path / "ref.h5"))
    assert r.returncode == 0, r.stderr
    r = train(tmp_path, *DP3PP2Z2, "--set", "validate.replica_check_every=2", "--fault", fault,
              "--dump", str(tmp_path / "a.h5"))
    assert r.returncode == 0, r.stderr
    assert "replica check at step 4: " + named in r.stderr and "(at step 3)" in r.stderr
    assert f"the fault on world rank {fault.split('rank=')[1][0]} was transient" in r.stderr
    assert_same_dump(tmp_path / "a.h5", tmp_path / "ref.h5")


def test_persistent_flip_exits_5_naming_rank_and_step(tmp_path):
    r = train(tmp_path, *DP4, "--set", "validate.replica_check_every=2",
              "--fault", "flip_grad:rank=1,step=3,persistent=true")
    assert r.returncode == 5, r.stderr
    assert "silent data corruption" in r.stderr
    assert "world rank 1 disagree" in r.stderr and "at step 3 of the re-run" in r.stderr
    assert "Take the node of world rank 1 out" in r.stderr


def test_bad_fault_spec_is_bad_input(tmp_path):
    r = train(tmp_path, *DP4, "--fault", "flip_weight:rank")
    assert r.returncode == 2 and "--fault flip_weight:rank" in r.stderr
    r = train(tmp_path, *DP4, "--fault", "melt:rank=1")
    assert r.returncode == 2 and "fault.kind" in r.stderr


def test_killed_thread_rank_is_named_exit_4_and_resume_is_exact(tmp_path, reference):
    ck = ["--set", f"checkpoint.dir={tmp_path / 'ck'}", "--set", "checkpoint.every=2"]
    r = train(tmp_path, *DP4, *ck, "--fault", "kill:rank=3,step=5")
    assert r.returncode == 4, r.stderr
    assert "world rank 3 dies before step 5" in r.stderr
    assert "rank 3" in r.stderr and "did not arrive within 3.00 s" in r.stderr
    assert "restart the job" in r.stderr
    ins = subprocess.run([EXE, "inspect", str(tmp_path / "ck")], capture_output=True, text=True, timeout=120)
    assert ins.returncode == 0, ins.stdout + ins.stderr
    r = train(tmp_path, *DP4, *ck, "--set", "checkpoint.resume=auto", "--dump", str(tmp_path / "b.h5"))
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stderr and "at step 4" in r.stderr
    assert_same_dump(tmp_path / "b.h5", reference)


@needs_mpi
def test_mpi_killed_process_ends_the_job_and_resume_is_exact(tmp_path, reference):
    ck = ["--set", f"checkpoint.dir={tmp_path / 'ck'}", "--set", "checkpoint.every=2"]
    r = train(tmp_path, *DP4, *ck, "--fault", "kill:rank=1,step=5", mpi=True)
    out = r.stdout + r.stderr
    # mpirun sees the process die and ends the job: 128 + SIGKILL, naming the rank.
    assert r.returncode == 137, out
    assert "world rank 1 dies before step 5" in out
    assert "rank 1" in out and "signal 9" in out
    ins = subprocess.run([EXE, "inspect", str(tmp_path / "ck")], capture_output=True, text=True, timeout=120)
    assert ins.returncode == 0, ins.stdout + ins.stderr
    r = train(tmp_path, *DP4, *ck, "--set", "checkpoint.resume=auto", "--dump", str(tmp_path / "b.h5"),
              mpi=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert_same_dump(tmp_path / "b.h5", reference)


@needs_mpi
def test_mpi_stalled_process_is_named_exit_4(tmp_path):
    r = train(tmp_path, *DP4, "--fault", "stall:rank=2,step=3", mpi=True)
    out = r.stdout + r.stderr
    assert r.returncode == 4, out
    assert "world rank 2 stalls before step 3" in out
    assert "rank 2" in out and "did not arrive within 3.00 s" in out


@needs_mpi
def test_mpi_replica_check_transient_and_persistent(tmp_path, reference):
    r = train(tmp_path, *DP4, "--set", "validate.replica_check_every=1",
              "--fault", "flip_weight:rank=3,step=6,tensor=wpe,element=7", "--dump", str(tmp_path / "a.h5"),
              mpi=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "the fault on world rank 3 was transient" in r.stderr
    assert_same_dump(tmp_path / "a.h5", reference)
    r = train(tmp_path, *DP4, "--set", "validate.replica_check_every=1",
              "--fault", "flip_weight:rank=3,step=6,tensor=wpe,element=7,persistent=true", mpi=True)
    assert r.returncode == 5, r.stdout + r.stderr
    assert "world rank 3 disagree" in r.stderr and "at step 6 of the re-run" in r.stderr


def test_an_unchecked_fault_with_a_dump_is_named_not_called_a_bug(tmp_path):
    """A flipped weight that no replica check re-runs leaves the replicas apart: the dump (one
    logical state) cannot be written, and the error names the fault, with exit code 5."""
    r = train(tmp_path, "--set", "layout.dp=2", "--set", "fault.kind=flip_weight",
              "--set", "fault.rank=1", "--set", "fault.step=2", "--set", "fault.tensor=wte",
              "--dump", str(tmp_path / "dump.h5"))
    assert r.returncode == 5, r.stderr
    assert 'fault.kind = "flip_weight"' in r.stderr
    assert "validate.replica_check_every" in r.stderr
    assert "bug in Parallax" not in r.stderr
    assert not (tmp_path / "dump.h5").exists()
