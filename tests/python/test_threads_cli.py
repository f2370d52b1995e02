"""The parallax program's idle OpenMP threads sleep instead of spinning (OMP_WAIT_POLICY=passive,
core/base/wait_policy.h) unless the user chose otherwise: the OpenMP runtime's own report of its
spin count (OMP_DISPLAY_ENV=verbose) says which policy the running program got."""
import os
import re
import subprocess

import pytest

EXE = os.environ.get("PARALLAX_EXE")
pytestmark = pytest.mark.skipif(not EXE, reason="PARALLAX_EXE is not set (run through scripts/test.sh)")


def spin_count(**env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(env_extra, OMP_DISPLAY_ENV="verbose")
    r = subprocess.run([EXE, "--version"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "parallax 0.1.0" in r.stdout  # the restart kept the arguments
    counts = re.findall(r"GOMP_SPINCOUNT = '(\d+)'", r.stdout + r.stderr)
    assert counts, r.stderr
    return counts[-1]  # the last report is the program that ran the command


def test_idle_threads_sleep_by_default():
    assert spin_count() == "0"


def test_the_users_choice_stands():
    assert spin_count(GOMP_SPINCOUNT="1000") == "1000"
    assert spin_count(OMP_WAIT_POLICY="active") != "0"
