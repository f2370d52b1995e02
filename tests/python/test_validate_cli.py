"""`parallax validate`: the single-device reference and a matrix of layouts compared after every
step; the table, the JSON report (schema in validators/README.md) and the Markdown report; exit
codes 0 (matched), 6 (diverged), 2 (bad input)."""
import json
import os
import subprocess

import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")

BASE = ["--set", "numerics.block=32", "--set", "model.layers=2", "--set", "train.threads=1"]


def validate(tmp_path, *args):
    return subprocess.run([EXE, "validate", *BASE, "--out", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=300)


def report(tmp_path):
    with open(tmp_path / "validate.json") as f:
        return json.load(f)


def check_comparison(c):
    for key, kind in [("name", str), ("shape", list), ("count", int), ("differing", int), ("max_ulp", int),
                      ("ulp_histogram", list), ("max_abs", (int, float)), ("max_rel", (int, float)),
                      ("first", int), ("first_index", list), ("equal", bool)]:
        assert isinstance(c[key], kind), (key, c)
    assert len(c["ulp_histogram"]) == 33


def test_default_matrix_matches_bit_for_bit(tmp_path):
    r = validate(tmp_path, "--steps", "4")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    header = next(i for i, l in enumerate(lines) if l.startswith("layout"))
    rows = [l.split() for l in lines[header + 1:header + 5]]
    assert [row[0] for row in rows] == ["dp2", "tp2", "pp2", "dp2xtp2xpp2"]
    assert all(row[1] == "4" and row[2] == "match" and row[3] == "0" for row in rows)
    rep = report(tmp_path)
    assert rep["schema"] == "parallax-validate" and rep["schema_version"] == 1
    assert rep["mode"] == "bitwise" and rep["steps"] == 4 and rep["all_ok"] is True
    assert [l["layout"] for l in rep["layouts"]] == ["dp2", "tp2", "pp2", "dp2xtp2xpp2"]
    for l in rep["layouts"]:
        assert l["verdict"] == "match" and l["first_step"] == -1 and l["first"] is None
        assert len(l["final_step"]) > 10
        for c in l["final_step"]:
            check_comparison(c)
            assert c["equal"] and c["differing"] == 0
    md = (tmp_path / "validate.md").read_text()
    assert "| dp2xtp2xpp2 | 4 | match | 0 | - |" in md


def test_injected_weight_flip_is_named_with_step_tensor_and_element(tmp_path):
    r = validate(tmp_path, "--steps", "5", "--layouts", "dp2,dp4xz1",
                 "--set", "fault.kind=flip_weight", "--set", "fault.step=3", "--set", "fault.tensor=wpe",
                 "--set", "fault.element=5")
    assert r.returncode == 6, r.stdout + r.stderr
    assert "step 3, params/wpe on rank 0 [0, 5]" in r.stdout
    rep = report(tmp_path)
    assert rep["all_ok"] is False
    for l in rep["layouts"]:
        assert l["verdict"] == "diverged" and l["first_step"] == 3
        assert l["first_rank"] == 0 and l["first_ranks"] == [0]
        assert l["first"]["name"] == "params/wpe" and l["first"]["first_index"] == [0, 5]
        check_comparison(l["first"])
        assert l["first"]["first_reference_bits"] != l["first"]["first_candidate_bits"]


def test_first_divergence_search_names_step_op_rank_and_element(tmp_path):
    # The flip strikes rank 1's weights after step 3's update: rank 1's piece of the state differs
    # from step 3 on (every rank's pieces are compared), and the probes of steps 2..3 name the
    # first op. Under tp2, rank 1 is tp rank 1, whose copy of the replicated wpe flips.
    r = validate(tmp_path, "--steps", "5", "--layouts", "dp2,dp4xz1xmb2,tp2", "--set", "train.batch_size=16",
                 "--set", "fault.kind=flip_weight", "--set", "fault.rank=1", "--set", "fault.step=3",
                 "--set", "fault.tensor=wpe", "--set", "fault.element=5")
    assert r.returncode == 6, r.stdout + r.stderr
    assert "first op: 3/optim/-/param/wpe on rank 1 [0, 5]" in r.stdout
    rep = report(tmp_path)
    dp2, dp4, tp2 = rep["layouts"]
    for l in (dp2, dp4, tp2):
        assert l["first_step"] == 3
        assert l["first_op_rank"] == 1 and l["first_op_ranks"] == [1] and l["first_op_note"] == ""
        assert l["first_op"]["name"] == "3/optim/-/param/wpe" and l["first_op"]["first_index"] == [0, 5]
        check_comparison(l["first_op"])
    # Every replica's copy is compared on its own: only rank 1's differs, in every layout.
    for l in (dp2, dp4, tp2):
        assert l["first_rank"] == 1 and l["first_ranks"] == [1] and l["first"]["name"] == "params/wpe"
    assert dp2["first_op_where"] == "pp0 dp1 tp0" and tp2["first_op_where"] == "pp0 dp0 tp1"
    assert "step 3, params/wpe on rank 1 [0, 5]" in r.stdout
    assert "First op that differs: `3/optim/-/param/wpe" in (tmp_path / "validate.md").read_text()


def test_first_divergence_search_in_a_pipeline(tmp_path):
    # World rank 3 of dp2xpp2 is the second stage of replica 1: its copy of layer 1's c_fc
    # weight flips after step 2's update.
    r = validate(tmp_path, "--steps", "4", "--layouts", "dp2xpp2", "--set", "fault.kind=flip_weight",
                 "--set", "fault.rank=3", "--set", "fault.step=2", "--set", "fault.tensor=h.1.mlp.c_fc.weight",
                 "--set", "fault.element=9")
    assert r.returncode == 6, r.stdout + r.stderr
    assert "first op: 2/optim/1/param/mlp.c_fc.weight on rank 3 [0, 9]" in r.stdout


def test_fast_mode_is_judged_by_the_error_budget(tmp_path):
    r = validate(tmp_path, "--steps", "3", "--mode", "fast", "--layouts", "dp2,tp2")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = report(tmp_path)
    assert rep["mode"] == "fast"
    for l in rep["layouts"]:
        assert l["verdict"] == "within budget" and 0 <= l["budget_ratio"] <= 1


def test_bad_layouts_are_bad_input(tmp_path):
    r = validate(tmp_path, "--layouts", "dp2xq2")
    assert r.returncode == 2 and '"q2"' in r.stderr
    r = validate(tmp_path, "--layouts", "dp3")
    assert r.returncode == 2 and "layout dp3" in r.stderr and "layout.dp=3" in r.stderr
    r = validate(tmp_path, "--layouts", "tp2", "--set", "numerics.block=64")
    assert r.returncode == 2 and "layout tp2" in r.stderr


def test_a_later_steps_or_layouts_wins(tmp_path):
    # scripts/quickstart.sh passes --layouts and --steps, then the user's own.
    r = validate(tmp_path, "--layouts", "dp2,tp2", "--steps", "20", "--layouts", "dp2", "--steps", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = report(tmp_path)
    assert rep["steps"] == 2 and [l["layout"] for l in rep["layouts"]] == ["dp2"]
