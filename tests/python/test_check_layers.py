"""scripts/check_layers.sh, the layering rule of the library, on small trees with planted
violations: each is named with its file and line, and a tree without them passes."""
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def make_tree(tmp_path, files):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "check_layers.sh", tmp_path / "scripts" / "check_layers.sh")
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, env=env)
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True, env=env)
    return subprocess.run(["bash", "scripts/check_layers.sh"], cwd=tmp_path, capture_output=True,
                          text=True)


CLEAN = {
    "core/base/tensor.h": "#pragma once\n#include <vector>\n",
    "kernels/ops.h": '#include "core/base/tensor.h"\nnamespace px::cpu { void f(); }\n',
    "kernels/cpu/f.cpp": '#include "kernels/ops.h"\nvoid px::cpu::f() {}\n',
    "core/train/job.h": '#include "core/parallel/mesh.h"\n#include "kernels/ops.h"\n',
    "core/parallel/mesh.h": '#include "core/base/tensor.h"\n',
    "app/main.cpp": '#include "core/train/job.h"\nint main() { return 0; }\n',
}


def test_a_tree_that_follows_the_rule_passes(tmp_path):
    r = make_tree(tmp_path, CLEAN)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "follow the layering rule" in r.stdout


def test_each_violation_is_named(tmp_path):
    files = dict(CLEAN)
    files["core/base/bad.h"] = '#pragma once\n#include "core/train/job.h"\n'  # upward include
    files["core/model/direct.cpp"] = "void g() { px::cpu::f(); }\n"  # around the ops door
    files["core/parallel/hook.cpp"] = "// arms a mutation\nint x;\n"  # a test-only hook
    files["core/io/long.cpp"] = "int y;\n" * 901  # over 900 lines
    files["core/stray.cpp"] = "int z;\n"  # in no layer
    r = make_tree(tmp_path, files)
    assert r.returncode == 1
    out = r.stdout
    assert "core/base/bad.h:2 includes core/train/job.h: core/base may not include the higher " \
           "layer core/train" in out
    assert "core/model/direct.cpp:1 calls a CPU kernel directly" in out
    assert "core/parallel/hook.cpp:1 names a test mutation" in out
    assert "core/io/long.cpp has 901 lines, over 900" in out
    assert "core/stray.cpp is in no layer" in out
    assert "5 violation(s)" in out
