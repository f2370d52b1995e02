"""The run file as a user reads it: run `parallax train` for three steps, open run.h5 with h5py.

Contract (core/runfile.h, DESIGN.md §6): the root attribute `config` holds the job's TOML, and
each metric is a group /metrics/<name> with two 1-D extendible datasets, `step` (int64, 1-based
optimizer steps) and `value` (float64), one row per logged step.

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
