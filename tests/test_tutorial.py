"""The tutorial notebook runs from top to bottom (so it cannot rot), in a fresh kernel."""
import os
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_tutorial_notebook_runs(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "docs" / "tutorial.ipynb", as_version=4)
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute(env=env)
    seconds = time.perf_counter() - t0
    outputs = {i: "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in c.outputs)
               for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    text = "\n".join(outputs.values())
    assert "paired difference from rg" in text and "Over 3 seeds" in text       # the 3-seed comparison
    assert "'import_path': '__main__:DealByLabel'" in text                      # the manifest names the class
    assert "tutorial.html" in text
    print(f"tutorial notebook: {seconds:.1f} s")
