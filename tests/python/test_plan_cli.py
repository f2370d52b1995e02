"""`parallax plan CONFIG --gpus N --cluster FILE.toml`: a ranked plan and its JSON (exit 0); bad
input names the file, key and value (exit 2); a job that fits no layout names the smallest one
and what dominates its memory (exit 2); --calibrate fits finite values to a training run's file;
parallax.plan gives the same candidates as dicts."""
import json
import os
import subprocess
from pathlib import Path

import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")
ROOT = Path(__file__).resolve().parents[2]
CPU = str(ROOT / "examples" / "clusters" / "cpu-inprocess.toml")
H100 = str(ROOT / "examples" / "clusters" / "h100-nvlink-ib400.toml")
TINY = str(ROOT / "examples" / "tiny.toml")


def run(*args, cwd=None):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_plan_ranks_layouts_and_writes_json(tmp_path):
    out = tmp_path / "plan.json"
    r = run("plan", TINY, "--gpus", "8", "--cluster", H100, "--top", "5", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "why " in r.stdout and "wins over the runner-up" in r.stdout
    p = json.loads(out.read_text())
    assert p["schema"] == "parallax-plan" and p["gpus"] == 8
    fits = [c for c in p["candidates"] if c["fits"]]
    assert len(fits) == p["fitting"] > 1
    steps = [c["time_s"]["step"] for c in fits]
    assert all(a <= b * (1 + 1e-6) for a, b in zip(steps, steps[1:]))  # ties within 1e-6
    for c in p["candidates"]:
        assert c["dp"] * c["tp"] * c["pp"] * c["cp"] == 8
        assert 0 < c["mfu"] < 1
        assert c["memory_bytes"] == pytest.approx(sum(c["memory"].values()))
    assert fits[0]["label"] in r.stdout  # the table's first row


def test_bad_cluster_files_name_file_key_and_value(tmp_path):
    r = run("plan", TINY, "--gpus", "2", "--cluster", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "missing.toml" in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text(Path(H100).read_text().replace("achievable = 0.6", "achievable = 2"))
    r = run("plan", TINY, "--gpus", "2", "--cluster", str(bad))
    assert r.returncode == 2
    assert "bad.toml" in r.stderr and "[compute] achievable = 2" in r.stderr


def test_no_layout_fits_names_the_smallest(tmp_path):
    small = tmp_path / "small.toml"
    small.write_text(Path(H100).read_text().replace("hbm_gib = 80", "hbm_gib = 0.0001")
                     .replace("reserve_gib = 4", "reserve_gib = 0"))
    r = run("plan", TINY, "--gpus", "2", "--cluster", str(small))
    assert r.returncode == 2
    assert "no layout of 2 devices fits" in r.stderr and "the smallest" in r.stderr
    assert "most of it" in r.stderr


def test_calibrate_prints_what_it_fitted(tmp_path):
    t = run("train", TINY, "--out", str(tmp_path / "run"), "--set", "train.steps=4",
            "--set", "train.eval_every=0", "--set", "layout.dp=2", "--quiet")
    assert t.returncode == 0, t.stdout + t.stderr
    r = run("plan", TINY, "--gpus", "2", "--cluster", CPU, "--calibrate",
            str(tmp_path / "run" / "run.h5"))
    assert r.returncode == 0, r.stdout + r.stderr
    line = next(l for l in r.stdout.splitlines() if "[compute] achievable" in l)
    fitted = float(line.split("achievable")[1].split()[0])
    assert 0 < fitted < float("inf")
    assert "comm bytes/step rank 0 measured" in r.stdout


def test_python_plan_gives_the_candidates():
    parallax = pytest.importorskip("parallax")
    c = parallax.plan(TINY, gpus=4, cluster=H100)
    assert c and all(set(("label", "dp", "tp", "pp", "memory_bytes", "time_s", "mfu")) <= set(x)
                     for x in c)
    # ranked by step time; times within a millionth are a tie, broken by compute, then memory
    assert c[0]["fits"] and c[0]["time_s"]["step"] <= c[1]["time_s"]["step"] * (1 + 1e-6)


def test_python_plan_pins_degrees_and_meets_a_run(tmp_path):
    """only_tp/only_pp/only_cp restrict the search; predicted_vs_measured puts a dp2 run's own
    layout beside its run file: rank 0's bytes per step equal, the step time measured, and the
    calibrated prediction nearer the measured step than the file's."""
    parallax = pytest.importorskip("parallax")
    pinned = parallax.plan(TINY, gpus=4, cluster=CPU, only_tp=[2], only_pp=[1], only_cp=[1],
                           numerics={"block": 32})
    assert pinned and all(c["tp"] == 2 and c["pp"] == 1 and c["cp"] == 1 for c in pinned)
    out = tmp_path / "run"
    r = run("train", TINY, "--out", str(out), "--set", "train.steps=6", "--set", "layout.dp=2",
            "--set", "train.eval_every=0")
    assert r.returncode == 0, r.stdout + r.stderr
    run_file = str(out / "run.h5")
    pv = parallax.predicted_vs_measured(run_file, cluster=CPU, calibrate=[run_file])
    assert pv["layout"] == "dp2 m1" and pv["steps"] == 6, pv
    rows = {x["what"]: x for x in pv["rows"]}
    sent = rows["comm sent per step, rank 0"]
    assert sent["measured"] == sent["predicted"] > 0, sent
    before = next(x for k, x in rows.items() if k.startswith("step time (in-process"))
    after = rows["step time (calibrated)"]
    assert after["measured"] == before["measured"] > 0
    assert abs(after["predicted"] / after["measured"] - 1) < 1e-3  # fitted on this very run
    assert rows["memory, rank 0"]["measured"] > 0
    with pytest.raises(parallax.ConfigError, match="no/such.toml"):
        parallax.predicted_vs_measured(run_file, cluster="no/such.toml")
