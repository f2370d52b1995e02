"""scripts/check_layers.sh, the layering rule of the library, on small trees with planted
violations: each is named with its file and line, and a tree without them passes. The order of
the layers comes from the tree's own docs/tree.md table, and core/meson.build must follow it."""
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


# The table the script reads the order from: app/ and bindings/ are peers.
TREE_MD = """# Layout of the tree

| layer | folder | holds |
| --- | --- | --- |
| 1 base | `core/base/` | tensors |
| 2 kernels | `kernels/` | ops |
| 3 model | `core/model/` | the model |
| 4 parallel | `core/parallel/` | the mesh |
| 5 train | `core/train/` | the trainer |
| 6 faces | `app/`, `bindings/` | the executable, the module |
"""

MESON = """core_sources = files(
  # base: tensors
  'base/tensor.cpp',
  # parallel: the mesh
  'parallel/mesh.cpp',
  # train: the trainer
  'train/job.cpp',
)
"""

CLEAN = {
    "docs/tree.md": TREE_MD,
    "core/meson.build": MESON,
    "core/base/tensor.h": "#pragma once\n#include <vector>\n",
    "kernels/ops.h": '#include "core/base/tensor.h"\nnamespace px::cpu { void f(); }\n',
    "kernels/cpu/f.cpp": '#include "kernels/ops.h"\nvoid px::cpu::f() {}\n',
    "core/train/job.h": '#include "core/parallel/mesh.h"\n#include "kernels/ops.h"\n',
    "core/parallel/mesh.h": '#include "core/base/tensor.h"\n',
    "app/main.cpp": '#include "core/train/job.h"\nint main() { return 0; }\n',
    "bindings/module.cpp": '#include "core/train/job.h"\n',
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
    files["core/parallel/long.h"] = "int y;\n" * 901  # a header alone over 900 lines
    files["core/train/unit.cpp"] = "int y;\n" * 500  # a unit over 900 with its header
    files["core/train/unit.h"] = "int w;\n" * 401
    files["core/train/short.cpp"] = "int y;\n" * 500  # 899 with its header: fine
    files["core/train/short.h"] = "int w;\n" * 399
    files["core/stray.cpp"] = "int z;\n"  # in no layer
    files["bindings/peer.cpp"] = '#include "app/main.cpp"\n'  # a peer's file
    r = make_tree(tmp_path, files)
    assert r.returncode == 1
    out = r.stdout
    assert "core/base/bad.h:2 includes core/train/job.h: core/base may not include the higher " \
           "layer core/train" in out
    assert "core/model/direct.cpp:1 calls a CPU kernel directly" in out
    assert "core/parallel/hook.cpp:1 names a test mutation" in out
    assert "core/parallel/long.h has 901 lines, over 900" in out
    assert "core/train/unit.cpp with its header has 901 lines, over 900" in out
    assert "short" not in out
    assert "core/stray.cpp is in no layer" in out
    assert "bindings/peer.cpp:1 includes app/main.cpp: bindings and app are peers" in out
    assert "7 violation(s)" in out


def test_the_order_is_read_from_docs_tree_md(tmp_path):
    """Moving a layer in the table moves the rule: with train below base, base's include of the
    trainer is fine and the trainer's of base is not; core/meson.build's groups are then out of
    the table's order, which is named too."""
    files = dict(CLEAN)
    files["docs/tree.md"] = TREE_MD.replace("| 1 base | `core/base/` | tensors |\n", "").replace(
        "| 5 train | `core/train/` | the trainer |\n",
        "| 5 train | `core/train/` | the trainer |\n| 7 base | `core/base/` | tensors |\n")
    files["core/base/up.h"] = '#include "core/train/job.h"\n'
    r = make_tree(tmp_path, files)
    assert r.returncode == 1
    out = r.stdout
    assert "core/base/up.h" not in out
    assert "kernels/ops.h:1 includes core/base/tensor.h: kernels may not include the higher " \
           "layer core/base" in out
    assert "core/meson.build lists core/parallel after a higher layer" in out


def test_a_tree_without_the_table_is_refused(tmp_path):
    files = dict(CLEAN)
    del files["docs/tree.md"]
    r = make_tree(tmp_path, files)
    assert r.returncode == 1
    assert "no layer table in docs/tree.md" in r.stdout
