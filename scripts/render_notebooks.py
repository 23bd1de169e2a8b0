"""Executes the notebooks against the checked-in results and writes each .ipynb with its outputs.

  python scripts/render_notebooks.py [NAME ...] [--check]

NAME is a notebook's stem (`scaling_laws`; default: every notebooks/*.py). Each jupytext percent
source notebooks/NAME.py runs in a python3 kernel in notebooks/, with the repository on PYTHONPATH,
in full mode (DILOCO_NOTEBOOK_TINY unset) and with DILOCO_NOTEBOOK_RESULTS_ONLY=1: the sweep
notebooks load notebooks/results/ and a point without a summary.json is an error, never a training
run (goodput and bandwidth compute their models). The .ipynb keeps what a reader needs and nothing
that changes from run to run: outputs without stderr, no execution counts, timings or language_info,
cell ids derived from the cells' sources. `--check` writes nothing and exits 1 if a notebook's
tables (`tables`) or figure counts differ from those in its .ipynb; tests/test_notebooks.py does the
same, without re-executing the cells tagged `slow` (`# %% tags=["slow"]`: figures only, or a fit).
"""

import argparse
import contextlib
import difflib
import hashlib
import os
import pathlib
import sys

import jupytext
import nbclient
import nbformat

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
COMMAND = "python scripts/render_notebooks.py"
RESULTS_ONLY = "DILOCO_NOTEBOOK_RESULTS_ONLY"
IMAGES = ("image/png", "image/svg+xml", "image/jpeg")
SLOW = "slow"  # the tag of cells the staleness test skips


def names() -> list[str]:
  """Every notebook: the stems of notebooks/*.py."""
  return sorted(p.stem for p in NOTEBOOKS.glob("*.py"))


@contextlib.contextmanager
def kernel_env(tiny: bool = False):
  """The environment the kernel inherits: results-only, full mode (`tiny`: training, in tiny
  mode), the repository importable, the inline backend (MPLBACKEND unset)."""
  saved = dict(os.environ)
  if tiny:
    os.environ["DILOCO_NOTEBOOK_TINY"] = "1"
    os.environ.pop(RESULTS_ONLY, None)
  else:
    os.environ[RESULTS_ONLY] = "1"
    os.environ.pop("DILOCO_NOTEBOOK_TINY", None)
  os.environ.pop("MPLBACKEND", None)
  os.environ["PYTHONPATH"] = os.pathsep.join(
      p for p in (str(REPO), saved.get("PYTHONPATH", "")) if p
  )
  try:
    yield
  finally:
    os.environ.clear()
    os.environ.update(saved)


def slow_cells(nb: nbformat.NotebookNode) -> set[int]:
  """The indices of the cells tagged SLOW."""
  return {i for i, c in enumerate(nb.cells) if SLOW in c.metadata.get("tags", ())}


def execute(
    name: str, timeout: int = 900, skip_slow: bool = False, km=None
) -> nbformat.NotebookNode:
  """notebooks/<name>.py executed in results-only full mode (`clean`ed); raises on a cell's error.
  `skip_slow`: the cells tagged SLOW are not run and have no outputs. `km`: a running kernel to
  run it in (`run_in`), started in results-only mode (`kernel_env`); else a fresh one."""
  nb = jupytext.read(NOTEBOOKS / f"{name}.py")
  skipped = {i: nb.cells[i].source for i in slow_cells(nb)} if skip_slow else {}
  for i in skipped:
    nb.cells[i].source = ""
  if km is not None:
    run_in(km, nb, timeout)
  else:
    with kernel_env():
      run_in(None, nb, timeout)
  for i, source in skipped.items():
    nb.cells[i].source = source
  return clean(nb)


# A shared kernel's namespace between two notebooks: emptied, its figures closed.
RESET = "%reset -f\nimport matplotlib.pyplot as _plt\n_plt.close('all')\ndel _plt"


def run_in(km, nb: nbformat.NotebookNode, timeout: int) -> None:
  """Executes `nb` in place, in a kernel started in notebooks/ (None: a fresh one, in this
  process's environment). A running one (the tests': its start and imports were 4-8 s of each
  notebook's) has its namespace emptied first (`RESET`)."""
  options = dict(timeout=timeout, record_timing=False)
  if km is not None:
    reset = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(RESET)])
    nbclient.NotebookClient(reset, km=km, **options).execute()
  nbclient.NotebookClient(
      nb,
      km=km,
      kernel_name="python3",
      resources={"metadata": {"path": str(NOTEBOOKS)}},
      **options,
  ).execute()


def clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
  """Drops what differs between two runs of the same notebook on the same results."""
  nb.metadata = nbformat.from_dict(
      {k: nb.metadata[k] for k in ("jupytext", "kernelspec") if k in nb.metadata}
  )
  seen = set()
  for cell in nb.cells:
    cell.metadata.pop("execution", None)  # keeps jupytext's (tags, lines_to_next_cell)
    digest = hashlib.sha1(f"{cell.cell_type}\n{cell.source}".encode()).hexdigest()
    cell.id = next(digest[i : i + 8] for i in range(0, 33) if digest[i : i + 8] not in seen)
    seen.add(cell.id)
    if cell.cell_type != "code":
      continue
    cell.execution_count = None
    outputs = []
    for out in cell.outputs:
      if out.output_type == "stream" and out.name == "stderr":
        continue  # warnings and progress bars: machine-dependent
      if out.output_type == "execute_result":
        out.execution_count = None
      if out.output_type == "stream" and outputs and outputs[-1].get("name") == out.name:
        outputs[-1].text += out.text  # one stream output however the kernel flushed it
        continue
      outputs.append(out)
    cell.outputs = outputs
  return nb


def tables(nb: nbformat.NotebookNode) -> dict[int, str]:
  """Per code cell (its index in nb.cells): what it printed and the text (text/html, else
  text/plain) of its results, figures left out."""
  out = {}
  for i, cell in enumerate(nb.cells):
    if cell.cell_type != "code":
      continue
    parts = []
    for o in cell.outputs:
      if o.output_type == "stream" and o.name == "stdout":
        parts.append(o.text)
      elif o.output_type in ("execute_result", "display_data"):
        data = o.get("data", {})
        if not any(k in data for k in IMAGES):
          parts.append(data.get("text/html", data.get("text/plain", "")))
    out[i] = "".join(parts)
  return out


def figures(nb: nbformat.NotebookNode) -> dict[int, int]:
  """Per code cell: how many images it shows."""
  return {
      i: sum(any(k in o.get("data", {}) for k in IMAGES) for o in c.outputs)
      for i, c in enumerate(nb.cells)
      if c.cell_type == "code"
  }


def differences(
    name: str, stored: nbformat.NotebookNode, fresh: nbformat.NotebookNode, skip=()
) -> str:
  """'' when `stored`'s tables and figure counts are `fresh`'s (cells `skip` left out); else what
  differs, cell by cell, and the command that regenerates the notebook."""
  old, new = tables(stored), tables(fresh)
  old_fig, new_fig = figures(stored), figures(fresh)
  for i in skip:
    for d in (old, new, old_fig, new_fig):
      d.pop(i, None)
  msgs = []
  if [c.source for c in stored.cells] != [c.source for c in fresh.cells]:
    msgs.append("its cells are not those of the .py")
  for i in sorted(set(old) | set(new)):
    first = fresh.cells[i].source.splitlines()[0] if i < len(fresh.cells) else "?"
    head = f"cell {i} ({first!r})"
    if old.get(i) != new.get(i):
      diff = difflib.unified_diff(
          (old.get(i) or "").splitlines(),
          (new.get(i) or "").splitlines(),
          "stored",
          "executed",
          lineterm="",
          n=1,
      )
      msgs.append(f"{head}: its output differs\n" + "\n".join(list(diff)[:40]))
    elif old_fig.get(i) != new_fig.get(i):
      msgs.append(f"{head}: {old_fig.get(i)} figure(s) stored, {new_fig.get(i)} drawn")
  stale = f"notebooks/{name}.ipynb is stale; regenerate it with `{COMMAND} {name}`:"
  return "\n".join([stale, *msgs]) if msgs else ""


def read(name: str) -> nbformat.NotebookNode:
  return nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)


def write(name: str, nb: nbformat.NotebookNode) -> None:
  nbformat.validate(nb)
  path = NOTEBOOKS / f"{name}.ipynb"
  text = nbformat.writes(nb)
  text += "" if text.endswith("\n") else "\n"
  tmp = path.with_suffix(f".ipynb.tmp{os.getpid()}")
  tmp.write_text(text, encoding="utf-8")
  os.replace(tmp, path)


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("names", nargs="*", help="notebook stems (default: all)")
  parser.add_argument("--check", action="store_true", help="compare tables, write nothing")
  args = parser.parse_args(argv)
  unknown = sorted(set(args.names) - set(names()))
  if unknown:
    parser.error(f"no notebooks/<name>.py for {unknown}; the notebooks are {names()}")
  stale = 0
  for name in args.names or names():
    fresh = execute(name)
    if args.check:
      msg = differences(name, read(name), fresh)
      print(msg or f"notebooks/{name}.ipynb: up to date", flush=True)
      stale += bool(msg)
    else:
      write(name, fresh)
      print(f"wrote notebooks/{name}.ipynb", flush=True)
  return int(stale > 0)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
