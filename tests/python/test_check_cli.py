"""`parallax gradcheck` and `parallax check` through the CLI: exit 0 when every check passes
(or the runs are equal), 3 when a check fails (or the runs differ), 2 on bad input, with the
output naming what was checked and what differs."""
import json
import os
import subprocess

import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")

# A job of a few small steps whose tp2 shards are whole blocks (hidden 32, ffn 64, blocks of 8).
SMALL = ["--set", "train.steps=4", "--set", "train.batch_size=4", "--set", "model.seq_len=32",
         "--set", "model.hidden=32", "--set", "model.ffn=64", "--set", "numerics.block=8",
         "--set", "train.threads=1", "--set", "train.eval_every=0", "--set", "layout.timeout_s=30"]


def run(*args, timeout=120):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def test_gradcheck_every_op_and_the_scaled_model_pass(tmp_path):
    r = run("gradcheck", "--json", str(tmp_path / "g.json"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "scaled down" in r.stdout  # the embedded job's model is larger than the fp64 limit
    for op in ["layernorm", "gelu", "attention", "residual", "embedding", "crossentropy",
               "matmul", "adamw", "sum_squares", "model"]:
        assert op in r.stdout
    assert "checks pass" in r.stdout
    report = json.loads((tmp_path / "g.json").read_text())
    assert report["pass"] is True
    assert any(row["tensor"] == "h.1.mlp.c_proj.weight" for row in report["rows"])
    assert all(row["checked"] >= 1 and row["pass"] for row in report["rows"])


def test_gradcheck_one_op_only():
    r = run("gradcheck", "--op", "attention")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "attention" in r.stdout and "dqkv" in r.stdout
    assert "model " not in r.stdout


def test_gradcheck_unknown_op_names_the_known_ones():
    r = run("gradcheck", "--op", "softmax")
    assert r.returncode == 2
    assert "softmax" in r.stderr and "layernorm" in r.stderr and "crossentropy" in r.stderr


def test_gradcheck_bad_config_key():
    r = run("gradcheck", "--set", "model.nope=1")
    assert r.returncode == 2
    assert "model.nope" in r.stderr


def test_check_determinism_dp2_is_equal():
    r = run("check", "determinism", *SMALL, "--set", "layout.dp=2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "equal" in r.stdout


def test_check_resume_under_another_layout_is_equal():
    r = run("check", "resume", *SMALL, "--at", "2", "--to-layout", "dp2xtp2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resumed under dp2xtp2" in r.stdout


def test_check_resume_with_another_learning_rate_differs():
    r = run("check", "resume", *SMALL, "--at", "2", "--to-set", "train.lr=2e-3")
    assert r.returncode == 3, r.stdout + r.stderr
    assert "params/wte" in r.stdout and "DIFFER" in r.stdout


@pytest.mark.parametrize("args", [["--to-layout", "dp2xq2"], ["--at", "9"], ["--at", "0", "--to-set", "train.steps=6"]])
def test_check_resume_bad_input(args):
    r = run("check", "resume", *SMALL, *args)
    assert r.returncode == 2, r.stdout + r.stderr


def test_check_needs_a_subcommand():
    assert run("check").returncode == 2
