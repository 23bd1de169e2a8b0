"""The notebooks: each .ipynb matches its jupytext .py, and each runs in tiny mode and draws."""

import os
import pathlib
import re
import sys

import jupytext
import nbclient
import nbformat
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
# notebook -> (figures it draws, a line its tiny run must print)
NOTEBOOKS = {
    "goodput": (2, "largest |model - published|"),
    "bandwidth": (2, "largest |ratio - 1| over the 50-95% columns"),
    "scaling_laws": (2, "same order as the paper:"),
    "decoupled_ablations": (2, "RDA beats the plain average at M=8 and M=16"),
    "async_local_sgd": (1, "Delayed Nesterov + DyLU closes the gap"),
}


def _cells(nb) -> list[tuple[str, str]]:
  return [(c.cell_type, c.source) for c in nb.cells]


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_ipynb_is_in_sync_with_py(name):
  source = jupytext.read(REPO / "notebooks" / f"{name}.py")
  paired = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
  assert _cells(paired) == _cells(source), f"regenerate: jupytext --to ipynb notebooks/{name}.py"
  assert all(not c.outputs for c in paired.cells if c.cell_type == "code"), "strip the outputs"


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs_in_tiny_mode_and_draws(name, monkeypatch):
  figures, line = NOTEBOOKS[name]
  monkeypatch.setenv("DILOCO_NOTEBOOK_TINY", "1")
  monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
  monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel's inline backend makes the PNGs
  nb = jupytext.read(REPO / "notebooks" / f"{name}.py")
  client = nbclient.NotebookClient(
      nb,
      kernel_name="python3",
      timeout=240,
      resources={"metadata": {"path": str(REPO / "notebooks")}},
  )
  client.execute()
  outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  pngs = [o for o in outputs if "image/png" in o.get("data", {})]
  assert len(pngs) == figures
  text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
  assert line in text
  # The kernel ran this interpreter, in tiny mode.
  ran = re.search(r"python: (\S+); tiny: (\w+)", text)
  assert ran and ran.group(2) == "True"
  assert os.path.realpath(ran.group(1)) == os.path.realpath(sys.executable)
