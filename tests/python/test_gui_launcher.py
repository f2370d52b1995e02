"""`parallax gui` starts the workbench's own executable, parallax-gui, beside it, and in a build
tree where it is not built yet builds it first (the quick start builds only `parallax`). Run from
a copy of the executable in a folder laid out as a build tree, whose build.ninja makes
app/parallax-gui by copying the real one: so the test sees the launcher find, build and start it.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXE = Path(os.environ.get("PARALLAX_EXE", str(ROOT / "build" / "app" / "parallax")))
GUI = EXE.parent / "parallax-gui"

pytestmark = pytest.mark.skipif(shutil.which("ninja") is None, reason="ninja is needed")


def tree(tmp_path, build_ninja):
    (tmp_path / "app").mkdir()
    shutil.copy2(EXE, tmp_path / "app" / "parallax")
    if build_ninja is not None:
        (tmp_path / "build.ninja").write_text(build_ninja)
    return tmp_path / "app" / "parallax"


def run(exe, *args):
    return subprocess.run([str(exe), "gui", *args], capture_output=True, text=True, timeout=120)


def test_the_first_gui_in_a_build_tree_builds_the_workbench_then_starts_it(tmp_path):
    if not GUI.exists():
        pytest.skip("this build has no workbench (its packages are missing)")
    exe = tree(tmp_path, f"rule copy\n  command = cp {GUI} $out\n"
                         "build app/parallax-gui: copy\n")
    r = run(exe, "--help")
    assert r.returncode == 0, r.stderr
    assert "building the workbench first" in r.stderr
    assert "--screenshot" in r.stdout  # the workbench's own options: it started
    assert (tmp_path / "app" / "parallax-gui").exists()
    r = run(exe, "--help")  # built now: started at once
    assert r.returncode == 0 and "building" not in r.stderr and "--screenshot" in r.stdout
    # Its arguments reach it: a missing config is its error, exit 2.
    r = run(exe, str(tmp_path / "nope.toml"))
    assert r.returncode == 2 and "nope.toml" in r.stderr


def test_a_build_tree_set_up_without_the_gui_packages_says_how_to_get_them(tmp_path):
    exe = tree(tmp_path, "rule copy\n  command = true\nbuild other: copy\n")
    r = run(exe)
    assert r.returncode == 2
    assert "libimgui-dev" in r.stderr and "scripts/setup.sh --gui" in r.stderr


def test_an_installed_parallax_without_the_workbench_beside_it_says_so(tmp_path):
    exe = tree(tmp_path, None)
    r = run(exe)
    assert r.returncode == 2
    assert "parallax-gui" in r.stderr and "not installed" in r.stderr
