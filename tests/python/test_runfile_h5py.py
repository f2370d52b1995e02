"""The run file as a user reads it: run `parallax train` for three steps, open run.h5 with h5py.

Contract (core/io/runfile.h, docs/files.md): the root attribute `config` holds the job's TOML, and
each metric is a group /metrics/<name> with two 1-D extendible datasets, `step` (int64, 1-based
optimizer steps) and `value` (float64), one row per logged step. A run resumed from a checkpoint
into the same output folder continues the file (or writes it anew from the checkpoint's steps
when it is gone), so it ends with each step once and the uninterrupted run's values, plus a
`resume` row in /events. A damaged run file (HDF5 cannot open it) is moved aside to
run.h5.damaged, kept byte for byte, and written anew; one that can be read but not written is an
error and is left as it is.

Needs PARALLAX_EXE (the built `parallax` executable); `meson test` sets it. By hand:
    PARALLAX_EXE=build/app/parallax python3 -m pytest tests/python/test_runfile_h5py.py
"""
import math
import os
import subprocess
import tomllib

import pytest

h5py = pytest.importorskip("h5py", reason="h5py is not installed: pip install h5py")
np = pytest.importorskip("numpy", reason="numpy is not installed: pip install numpy")

EXE = os.environ.get("PARALLAX_EXE")

pytestmark = pytest.mark.skipif(
    not EXE,
    reason="PARALLAX_EXE is not set; point it at the built parallax executable "
    "(e.g. PARALLAX_EXE=build/app/parallax)",
)

STEPS = 3
EVAL_EVERY = 2
PER_STEP_METRICS = ["loss", "grad_norm", "lr", "tokens_per_s", "step_ms"]


def as_text(attr):
    """h5py gives str for variable-length UTF-8 strings, bytes for fixed-length ones."""
    if isinstance(attr, bytes):
        return attr.decode("utf-8")
    if isinstance(attr, np.ndarray) and attr.shape == ():
        return as_text(attr[()])
    return str(attr)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    assert os.path.isfile(EXE), f"PARALLAX_EXE={EXE} is not a file; build it first (ninja -C build)"
    out = tmp_path_factory.mktemp("run")
    cmd = [EXE, "train",
           "--set", f"train.steps={STEPS}",
           "--set", f"train.eval_every={EVAL_EVERY}",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited with {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    path = out / "run.h5"
    assert path.is_file(), f"the trainer finished but wrote no {path}; files: {os.listdir(out)}"
    with h5py.File(path, "r") as f:
        yield f


def series(f, name):
    """(steps, values) of /metrics/<name>, checking the layout on the way."""
    assert f"metrics/{name}" in f, (
        f"/metrics/{name} is missing; metrics present: {sorted(f['metrics'].keys()) if 'metrics' in f else 'none'}")
    g = f["metrics"][name]
    step, value = g["step"], g["value"]
    assert step.ndim == 1 and value.ndim == 1
    assert step.dtype == np.int64, f"/metrics/{name}/step is {step.dtype}, expected int64"
    assert value.dtype == np.float64, f"/metrics/{name}/value is {value.dtype}, expected float64"
    assert step.maxshape == (None,) and value.maxshape == (None,), "metric datasets must be extendible"
    assert step.chunks is not None and value.chunks is not None, "extendible datasets are chunked"
    assert step.shape == value.shape, f"/metrics/{name}: {step.shape[0]} steps but {value.shape[0]} values"
    return step[()], value[()]


def test_config_attribute_is_the_job_toml(run):
    assert "config" in run.attrs, f"root attributes: {sorted(run.attrs.keys())}"
    cfg = tomllib.loads(as_text(run.attrs["config"]))
    assert "model" in cfg, f"the config has sections {sorted(cfg)}, no [model]"
    assert cfg["model"]["vocab"] > 0
    # The stored config is the one that ran, overrides included.
    assert cfg["train"]["steps"] == STEPS
    assert cfg["train"]["eval_every"] == EVAL_EVERY


def test_version_and_creation_time(run):
    assert as_text(run.attrs["parallax_version"]) == "0.1.0"
    created = as_text(run.attrs["created"])
    assert len(created) >= 19 and created[4] == "-" and created[10] == "T", created


def test_loss_every_step(run):
    step, value = series(run, "loss")
    assert step.tolist() == [1, 2, 3]
    assert all(math.isfinite(v) for v in value), value
    assert all(v > 0 for v in value), value  # a cross-entropy


def test_val_loss_at_eval_steps_and_the_last(run):
    step, value = series(run, "val_loss")
    assert step.tolist() == [2, 3]  # every eval_every steps, and at the last step
    assert all(math.isfinite(v) and v > 0 for v in value), value


@pytest.mark.parametrize("name", PER_STEP_METRICS[1:])
def test_other_training_metrics(run, name):
    step, value = series(run, name)
    assert len(step) > 0, f"/metrics/{name} is empty"
    assert set(step.tolist()) <= {1, 2, 3}, step
    assert np.all(np.diff(step) > 0), f"/metrics/{name}/step is not increasing: {step}"
    assert all(math.isfinite(v) for v in value), value


# ---- across a resume (core/io/runfile.h: RunFileObserver) ----
# Six steps uninterrupted (A), and the same six as four steps that write a checkpoint, then a
# resume to six into the same output folder (B). The warm-up outlasts the run, so the learning
# rate does not depend on train.steps; eval_every=2 puts val_loss at 2, 4, 6 in both.
RESUME_COMMON = ["--quiet", "--set", "train.threads=1", "--set", "train.batch_size=4",
                 "--set", "model.seq_len=32", "--set", "train.warmup_steps=10",
                 "--set", "train.eval_every=2", "--set", "train.val_batches=2"]
SAME_VALUES = ["loss", "grad_norm", "lr", "val_loss"]  # timings differ from run to run


def train(out, steps, *extra):
    cmd = [EXE, "train", *RESUME_COMMON, "--set", f"train.steps={steps}", *extra, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (
        f"{' '.join(cmd)} exited with {proc.returncode}\n"
        f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    return proc


def all_series(path):
    with h5py.File(path, "r") as f:
        return {name: series(f, name) for name in f["metrics"]}


def events(path):
    with h5py.File(path, "r") as f:
        if "events" not in f:
            return []
        e = f["events"]
        return list(zip(e["step"][()].tolist(), e["kind"].asstr()[()], e["message"].asstr()[()]))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("a")
    train(out, 6)
    return all_series(out / "run.h5")


def check_same_run(got, want):
    for name in PER_STEP_METRICS + ["comm_bytes"]:
        assert got[name][0].tolist() == list(range(1, 7)), f"/metrics/{name}/step: {got[name][0]}"
    assert got["val_loss"][0].tolist() == [2, 4, 6]
    for name in SAME_VALUES:
        assert got[name][0].tolist() == want[name][0].tolist(), name
        assert got[name][1].tobytes() == want[name][1].tobytes(), (
            f"/metrics/{name}/value differs from the uninterrupted run's: {got[name][1]} vs {want[name][1]}")


@pytest.mark.parametrize("keep_run_file", [True, False])
def test_resumed_run_continues_the_run_file(tmp_path, uninterrupted, keep_run_file):
    ck = tmp_path / "ck"
    out = tmp_path / "out"
    ckpt = ["--set", f"checkpoint.dir={ck}", "--set", "checkpoint.every=2"]
    train(out, 4, *ckpt)
    first = all_series(out / "run.h5")
    if not keep_run_file:
        (out / "run.h5").unlink()
    proc = train(out, 6, *ckpt, "--set", "checkpoint.resume=auto")
    assert "resumed from" in proc.stderr
    got = all_series(out / "run.h5")
    check_same_run(got, uninterrupted)
    if keep_run_file:  # the first run's rows are kept as they were, timings included
        for name, (step, value) in first.items():
            assert got[name][1][: len(value)].tobytes() == value.tobytes(), name
    (step, kind, message), = events(out / "run.h5")
    assert (step, kind) == (4, "resume")
    assert message.startswith(f"resumed at step 4 from {ck / 'ckpt-00000004.h5'}"), message
    assert ("written anew" in message) == (not keep_run_file), message
    with h5py.File(out / "run.h5", "r") as f:  # the config is the one that finished the run
        assert tomllib.loads(as_text(f.attrs["config"]))["train"]["steps"] == 6


def test_resume_drops_rows_after_the_checkpoint(tmp_path, uninterrupted):
    # The first run went on to step 6 after its checkpoint at 4 (as if killed before writing the
    # next one): the resume drops steps 5 and 6 and runs them again, each step stays once.
    ck = tmp_path / "ck"
    out = tmp_path / "out"
    train(out, 4, "--set", f"checkpoint.dir={ck}")
    train(tmp_path / "other", 6)  # a run file that went on to step 6, copied into place
    (tmp_path / "other" / "run.h5").replace(out / "run.h5")
    train(out, 6, "--set", f"checkpoint.dir={ck}", "--set", "checkpoint.resume=auto")
    check_same_run(all_series(out / "run.h5"), uninterrupted)
    assert [(s, k) for s, k, _ in events(out / "run.h5")] == [(4, "resume")]


def test_damaged_run_file_is_moved_aside_and_the_run_continues(tmp_path, uninterrupted):
    ck = tmp_path / "ck"
    out = tmp_path / "out"
    train(out, 4, "--set", f"checkpoint.dir={ck}")
    (out / "run.h5").write_bytes(b"not an HDF5 file")
    (out / "run.h5.damaged").write_bytes(b"an older damaged one")
    proc = train(out, 6, "--set", f"checkpoint.dir={ck}", "--set", "checkpoint.resume=auto")
    aside = out / "run.h5.damaged-2"
    assert str(aside) in proc.stderr and "HDF5 cannot open it" in proc.stderr, proc.stderr
    assert aside.read_bytes() == b"not an HDF5 file"
    assert (out / "run.h5.damaged").read_bytes() == b"an older damaged one"
    check_same_run(all_series(out / "run.h5"), uninterrupted)
    (step, kind, message), = events(out / "run.h5")
    assert (step, kind) == (4, "resume")
    assert f"was damaged, was moved to {aside}" in message, message


def test_run_file_held_by_another_writer_is_an_error_and_kept(tmp_path):
    ck = tmp_path / "ck"
    out = tmp_path / "out"
    train(out, 4, "--set", f"checkpoint.dir={ck}")
    before = (out / "run.h5").read_bytes()
    cmd = [EXE, "train", *RESUME_COMMON, "--set", "train.steps=6", "--set", f"checkpoint.dir={ck}",
           "--set", "checkpoint.resume=auto", "--out", str(out)]
    with h5py.File(out / "run.h5", "a"):  # another process writing it holds its lock
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode != 0
    assert str(out / "run.h5") in proc.stderr and "has it open" in proc.stderr, proc.stderr
    assert (out / "run.h5").read_bytes() == before
    assert not (out / "run.h5.damaged").exists()
