"""Loss spikes through the CLI, MPI and the Python module (core/train/spikes.h; the C++ suite
`spikes` holds the bit-identity checks): a corrupted batch is caught, attributed by replay to the
data, rolled back and skipped, and the run file holds the event with its evidence. Under mpirun
the ranks reach the same verdict and the same bits as in-process ranks."""
import os
import shutil
import subprocess

import h5py
import pytest

EXE = os.environ.get("PARALLAX_EXE")
MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")
needs_mpi = pytest.mark.skipif(not MPIRUN, reason="mpirun is not installed")
MPI = [MPIRUN or "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]

COMMON = ["--quiet", "--set", "train.steps=40", "--set", "train.batch_size=8", "--set", "model.seq_len=32",
          "--set", "train.threads=1", "--set", "layout.dp=2", "--set", "train.eval_every=40",
          "--set", "train.val_batches=1", "--set", "data.corrupt_step=30",
          "--set", "spikes.action=rollback", "--set", "spikes.window=20", "--set", "spikes.snapshot_every=10"]


def train(out, mpi=False):
    cmd = [*MPI, EXE] if mpi else [EXE]
    r = subprocess.run([*cmd, "train", *COMMON, "--out", str(out), "--dump", str(out / "dump.h5")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def spike_events(path):
    with h5py.File(path, "r") as f:
        kinds = f["events/kind"].asstr()[()]
        msgs = f["events/message"].asstr()[()]
        evidence = f["events/evidence"].asstr()[()]
        steps = f["events/step"][()]
        names = list(f["metrics"].keys())
    return [(int(s), m, e) for s, k, m, e in zip(steps, kinds, msgs, evidence) if k == "spike"], names


def test_cli_run_file_holds_the_spike_and_its_evidence(tmp_path):
    r = train(tmp_path / "a")
    assert "spike at step 30" in r.stderr
    spikes, names = spike_events(tmp_path / "a" / "run.h5")
    assert len(spikes) == 1
    step, msg, evidence = spikes[0]
    assert step == 30
    assert "verdict: data" in msg and "batch 29 (the one step 30 drew; batches count from 0) caused it" in msg
    assert "rolled back to step 20, batch 29 skipped" in msg
    values = dict(item.split("=") for item in evidence.split(";"))
    assert float(values["layer.h.0.grad_norm"]) > 0 and "spike.grad_norm_z" in values
    assert float(values["spike.grad_norm_z"]) > 6
    for n in ["layer.embed.grad_norm", "layer.h.1.update_ratio", "layer.ln_f.adam_eps_ratio",
              "layer.h.0.attn_logit_max", "spike.loss_z"]:
        assert n in names
    with h5py.File(tmp_path / "a" / "run.h5", "r") as f:  # every step once, in order
        assert list(f["metrics/layer.h.0.grad_norm/step"][()]) == list(range(1, 41))


@needs_mpi
def test_mpi_ranks_reach_the_same_verdict_and_bits(tmp_path):
    train(tmp_path / "threads")
    train(tmp_path / "mpi", mpi=True)
    a, _ = spike_events(tmp_path / "threads" / "run.h5")
    b, _ = spike_events(tmp_path / "mpi" / "run.h5")
    assert [(s, m) for s, m, _ in a] == [(s, m) for s, m, _ in b]
    with h5py.File(tmp_path / "threads" / "dump.h5", "r") as fa, h5py.File(tmp_path / "mpi" / "dump.h5", "r") as fb:
        names = []
        fa.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        assert len(names) > 4
        for n in names:
            assert fa[n][()].tobytes() == fb[n][()].tobytes(), n


def test_python_job_events_and_values():
    import parallax
    job = parallax.Job(train={"steps": 30, "batch_size": 8, "threads": 1, "eval_every": 0},
                       model={"seq_len": 32}, data={"corrupt_step": 25},
                       spikes={"action": "rollback", "window": 20})
    job.run()
    spikes = [e for e in job.events() if e["kind"] == "spike"]
    assert len(spikes) == 1 and spikes[0]["step"] == 25
    assert "verdict: data" in spikes[0]["message"]
    ev = spikes[0]["evidence"]
    steps, norms = job.values()["layer.h.0.grad_norm"]
    assert list(steps) == list(range(1, 31))
    assert ev["layer.h.0.grad_norm"] > 2 * norms[24]  # the first run's spike, not the re-run
