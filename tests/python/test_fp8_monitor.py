"""The FP8 drift monitor from Python and the CLI (core/train/fp8_monitor.h): Job.fp8() gives the
rows as numpy columns, the same bits on a dp2 x tp2 layout as on one device; the provoked drift of
examples/fp8_drift.toml raises alerts at its learning-rate jump and none without it; the run
file's /fp8 table holds the rows Job.fp8() gave (read_run_file and h5py alike), `parallax train`
prints the alerts, and the workbench's FP8 panel draws them."""
import gc
import os
import shutil
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

import parallax

ROOT = Path(__file__).resolve().parents[2]
EXE = os.environ.get("PARALLAX_EXE", str(ROOT / "build" / "app" / "parallax"))
DRIFT = ROOT / "examples" / "fp8_drift.toml"

INTS = ["step", "count", "nonfinite", "alerts"]
REALS = ["amax", "scale", "scale_ratio", "saturated", "underflow", "dynamic_range", "mse",
         "sqnr_db"]


def same_rows(a, b):
    assert sorted(a) == sorted(INTS + REALS + ["tensor", "recipe"])
    assert sorted(a) == sorted(b)
    for name in INTS + REALS:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name
    for name in ["tensor", "recipe"]:
        assert a[name].tolist() == b[name].tolist(), name


def test_job_fp8_columns_and_layouts_agree_bit_for_bit():
    sections = dict(train={"eval_every": 0}, fp8_monitor={"every": 2})
    with parallax.Job(DRIFT, **sections) as job:
        job.step(4)
        rows = job.fp8()
        events = job.events()
    n = 2 * 8 * 3 * 3  # steps 2 and 4, 8 fp8 matmuls x (x, w, dy), delayed + current + block
    assert rows["step"].dtype == np.int64 and rows["amax"].dtype == np.float64
    assert rows["tensor"].shape == (n,) and rows["sqnr_db"].shape == (n,)
    assert rows["tensor"][0] == "h.1.attn.c_attn/x"
    assert set(rows["recipe"].tolist()) == {"delayed", "current", "block"}
    assert set(rows["step"].tolist()) == {2, 4}
    assert (rows["count"] > 0).all() and (rows["amax"] > 0).all()
    mine = rows["recipe"] == "delayed"
    # A weight's count is its size; a row of the run's recipe before the jump alerts nowhere.
    w = rows["tensor"] == "h.1.mlp.c_fc/w"
    assert (rows["count"][w & mine] == 128 * 64).all()
    assert (rows["alerts"] == 0).all()
    assert not [e for e in events if e["kind"] == "alert"]
    # dp2 x tp2 (block tiles of 32 stay within a rank's 32 channels): the same bits.
    with parallax.Job(DRIFT, layout={"dp": 2, "tp": 2}, **sections) as job:
        job.step(4)
        same_rows(rows, job.fp8())


def test_provoked_drift_alerts_at_the_jump_and_the_run_file_holds_the_rows(tmp_path):
    sections = dict(train={"eval_every": 0}, fp8_monitor={"compare": ""})
    with parallax.Job(DRIFT, out=tmp_path, **sections) as job:
        job.step(34)
        rows = job.fp8()
        alerts = [e for e in job.events() if e["kind"] == "alert"]
    fired = rows["alerts"] != 0
    assert fired.any()
    assert rows["step"][fired].min() == 31 and rows["step"][fired].max() <= 34
    assert len(alerts) == fired.sum()
    for e in alerts:
        assert e["message"].startswith("fp8 ") and f"at step {e['step']}: " in e["message"]
    # The evidence in the columns: saturation over fp8_monitor.saturation_max (1%) at step 31.
    at31 = rows["step"] == 31
    assert rows["saturated"][at31].max() > 0.01
    judged = ~fired & (rows["step"] > 1)  # step 1 casts with the initial scale: not judged
    assert (rows["saturated"][judged] <= 0.01).all()

    rec = parallax.read_run_file(tmp_path / "run.h5")
    same_rows(rows, rec["fp8"])
    assert [e["message"] for e in rec["events"] if e["kind"] == "alert"] == \
        [e["message"] for e in alerts]
    del job  # closes the run file (its writer holds HDF5's lock until then)
    gc.collect()
    with h5py.File(tmp_path / "run.h5", "r") as f:
        assert f["fp8/tensor"].asstr()[()].tolist() == rows["tensor"].tolist()
        for name in INTS + REALS:
            assert f["fp8/" + name][()].tobytes() == rows[name].tobytes(), name

    # Without the jump: the same rows up to step 30, and no alert at all.
    with parallax.Job(DRIFT, train={"eval_every": 0, "lr_jump_step": 0},
                      fp8_monitor={"compare": ""}) as job:
        job.step(34)
        clean = job.fp8()
        assert not [e for e in job.events() if e["kind"] == "alert"]
    assert (clean["alerts"] == 0).all()
    before = rows["step"] <= 30
    assert clean["sqnr_db"][before].tobytes() == rows["sqnr_db"][before].tobytes()


def test_cli_prints_alerts_and_empty_columns_without_a_monitor(tmp_path):
    out = subprocess.run(
        [EXE, "train", str(DRIFT), "--out", str(tmp_path), "--set", "fp8_monitor.compare=\"\""],
        capture_output=True, text=True, check=True)
    lines = [l for l in out.stderr.splitlines() if l.startswith("alert: fp8 ")]
    rec = parallax.read_run_file(tmp_path / "run.h5")
    assert len(lines) == (rec["fp8"]["alerts"] != 0).sum() > 0
    with parallax.Job(train={"steps": 2, "threads": 1}) as job:  # fp32, no monitor
        job.step(2)
        rows = job.fp8()
    assert sorted(rows) == sorted(INTS + REALS + ["tensor", "recipe"])
    assert all(len(v) == 0 for v in rows.values())


@pytest.mark.skipif(not shutil.which("xvfb-run"), reason="xvfb-run is needed for screenshots")
def test_workbench_fp8_panel_draws_the_provoked_drift(tmp_path):
    """`parallax gui --screenshot` after step 34 of the provoked drift: the FP8 panel draws the
    chosen tensor's amax and scale lines and red (over-alert) cells in the saturation heatmap."""
    r = subprocess.run(["xvfb-run", "-a", "-s", "-screen 0 1600x1000x24", EXE, "gui", str(DRIFT),
                        "--screenshot", str(tmp_path), "--steps", "34",
                        "--out", str(tmp_path / "run")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    img = np.asarray(Image.open(tmp_path / "fp8.png").convert("RGB")).astype(np.int32)
    h, w, _ = img.shape

    def region(x0, y0, x1, y1):
        return img[int(y0 * h):int(y1 * h), int(x0 * w):int(x1 * w)]

    def near(p, rgb, tol):
        return int((np.abs(p - np.array(rgb)).max(axis=2) <= tol).sum())

    assert near(region(0.03, 0.10, 0.50, 0.33), (86, 156, 255), 20) > 300  # amax: plot::kBlue
    assert near(region(0.50, 0.10, 1.00, 0.33), (255, 160, 60), 25) > 100  # current's scale
    assert near(region(0.00, 0.36, 0.50, 0.68), (255, 40, 40), 10) > 500  # over-alert cells
