"""The notebooks: each .ipynb holds its jupytext .py's cells with the outputs that
scripts/render_notebooks.py computes from the checked-in results (not stale), and each that trains
runs in tiny mode and draws.

goodput and bandwidth train nothing: the staleness test executes every line of theirs that tiny mode
would (with larger sweeps), so they have no tiny run here (~13 s saved).

The staleness tests share one kernel and the tiny runs another, each notebook in an emptied
namespace (`render.run_in`): a kernel's start and its imports were 4-8 s of each notebook's. A
notebook that leaned on a name another defined would fail here (the namespace is emptied), and
one whose tables depended on what another left in an imported module would differ from its
.ipynb, rendered in a fresh kernel."""

import contextlib
import copy
import importlib.util
import os
import pathlib
import re
import sys

import jupyter_client
import jupytext
import nbformat
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("render", REPO / "scripts" / "render_notebooks.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)

# notebook -> (figures it draws, a line it prints, in its .ipynb and in tiny mode)
NOTEBOOKS = {
    "goodput": (2, "largest |model - published|"),
    "bandwidth": (2, "largest |ratio - 1| over the 50-95% columns"),
    "scaling_laws": (2, "(6) findings (1)-(3) read the same overtrained 4x"),
    "decoupled_ablations": (2, "RDA beats the plain average at M=8"),
    "heterogeneous": (1, "the grace window recovers it"),
    "decoupled_delivery": (1, "rebase against replace"),
    "async_local_sgd": (1, "Delayed Nesterov + DyLU closes the gap"),
    "regime": (1, "regime: DiLoCo M=4 vs data-parallel"),
    "scavenging": (1, "scavenged learners shorten Decoupled DiLoCo's run"),
    "merge_clock": (1, "invariance, period/tokens"),
}
TRAINING = (  # sweeps
    "scaling_laws",
    "decoupled_ablations",
    "heterogeneous",
    "async_local_sgd",
    "decoupled_delivery",
    "scavenging",
    "merge_clock",
)


def _cells(nb) -> list[tuple[str, str, list]]:
  return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]


def test_every_notebook_is_listed():
  assert sorted(NOTEBOOKS) == render.names()


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_ipynb_holds_the_py_and_its_outputs(name):
  source = jupytext.read(REPO / "notebooks" / f"{name}.py")
  stored = render.read(name)
  again = f"regenerate: {render.COMMAND} {name}"
  assert _cells(stored) == _cells(source), again
  assert nbformat.writes(render.clean(copy.deepcopy(stored))) == nbformat.writes(stored), again
  for i, cell in enumerate(stored.cells):
    if cell.cell_type != "code":
      continue
    if re.search(r"\bprint\(|\bshow\(", cell.source):  # show(): plt's or a notebook's table
      assert cell.outputs, f"cell {i} prints or draws but has no outputs; {again}"
    drawn = render.figures(stored)[i]
    assert drawn == cell.source.count("plt.show()"), f"cell {i}: {drawn} figure(s); {again}"
  assert sum(render.figures(stored).values()) == NOTEBOOKS[name][0]
  assert NOTEBOOKS[name][1] in "".join(render.tables(stored).values())


@contextlib.contextmanager
def _kernel():
  """A python3 kernel in notebooks/, started in this process's environment as it is now."""
  km = jupyter_client.KernelManager(kernel_name="python3")
  km.start_kernel(cwd=str(render.NOTEBOOKS), env=dict(os.environ))
  try:
    yield km
  finally:
    km.shutdown_kernel(now=True)


@pytest.fixture(scope="module")
def results_kernel():
  with render.kernel_env(), _kernel() as km:
    yield km


@pytest.fixture(scope="module")
def tiny_kernel():
  """Tiny mode, on one CPU device, as the notebooks' own runs had: with the suite's eight, each of
  M learners got its own device and compiled every program once per device (heterogeneous: 16
  compiles of two train steps, 60 s; on one device 19 s)."""
  with render.kernel_env(tiny=True):
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "").replace(
        "--xla_force_host_platform_device_count=8", "--xla_force_host_platform_device_count=1"
    )  # (kernel_env puts the environment back as it was)
    with _kernel() as km:
      yield km


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_ipynb_outputs_are_those_of_the_checked_in_results(name, results_kernel):
  """Re-executed against notebooks/results/ (never training), the tables are those stored; the
  cells tagged slow (a fit, or figures only) are not re-executed."""
  stored = render.read(name)
  fresh = render.execute(name, timeout=240, skip_slow=True, km=results_kernel)
  stale = render.differences(name, stored, fresh, skip=render.slow_cells(stored))
  if stale:
    pytest.fail(stale, pytrace=False)


@pytest.mark.parametrize("name", sorted(TRAINING))
def test_notebook_runs_in_tiny_mode_and_draws(name, tiny_kernel):
  figures, line = NOTEBOOKS[name]
  nb = jupytext.read(REPO / "notebooks" / f"{name}.py")
  render.run_in(tiny_kernel, nb, timeout=240)
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
