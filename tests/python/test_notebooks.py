"""Every notebook in notebooks/ runs top to bottom (nbclient, a fresh python3 kernel), without an
error in any cell, and draws its plots. The notebooks assert what they teach (bit-identical layouts,
the bubble formula, a planted divergence named), so a notebook that runs is one that still holds.

Each runs as a learner's copy would: alone in a temporary folder outside the tree, that folder its
working directory, so it cannot reach ../examples; and it must leave that folder, and the
temporary directory it was given (TMPDIR), as it found them."""
import os
import shutil
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.stem for p in NOTEBOOKS] == ["01_parallelism_tour", "02_why_bits_differ",
                                           "03_layout_validation", "04_precision_and_spikes",
                                           "05_mixture_of_experts", "06_llama_and_gqa",
                                           "07_check_your_pytorch_layout", "08_plan_a_layout"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, monkeypatch):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        f"{path.name} is stored with outputs; clear them (the tests run it)"
    folder = Path(tempfile.mkdtemp(prefix=f"px-{path.stem}-"))
    try:
        assert ROOT not in folder.parents, "the copy must live outside the tree"
        copy = folder / path.name
        shutil.copy(path, copy)
        tmp = folder / "tmp"  # the kernel's TMPDIR: what tempfile hands the notebook lands here
        tmp.mkdir()
        monkeypatch.setenv("TMPDIR", str(tmp))  # the kernel process inherits it
        client = NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(folder)}})
        start = time.monotonic()
        client.execute()  # raises CellExecutionError, naming the cell, on any error
        seconds = time.monotonic() - start
        left = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                      if p not in (copy, tmp))
        assert not left, f"{path.name} left files behind: {left}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                 for o in c.outputs)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    assert images >= 3, f"{path.name} drew {images} plots"
    print(f"{path.name}: {seconds:.1f} s, {images} plots")
