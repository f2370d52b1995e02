"""Every notebook in notebooks/ runs top to bottom (nbclient, a fresh python3 kernel), without an
error in any cell, and draws its plots. The notebooks assert what they teach (bit-identical layouts,
the bubble formula, a planted divergence named), so a notebook that runs is one that still holds."""
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS][:3] == ["01_parallelism_tour.ipynb", "02_why_bits_differ.ipynb",
                                              "03_layout_validation.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        f"{path.name} is stored with outputs; clear them (the tests run it)"
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.monotonic()
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    seconds = time.monotonic() - start
    images = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
                 for o in c.outputs)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert images >= 3, f"{path.name} drew {images} plots"
    print(f"{path.name}: {seconds:.1f} s, {images} plots")
