"""The package layout is the architecture: imports run downhill and never in a circle.

Every import inside `diloco/` (function-level ones included) is read from the source. A module may
import modules of its own layer or of the layers below it, never one above; and no set of modules
imports itself around a circle. Across the repository the library (`diloco/`) is below the lab:
the study code (`experiments/studies/`), then the configs and sweeps, the mains (`experiments/`),
and the scripts, notebooks and tests; nothing in the library imports the lab.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Lowest first. A package not listed here fails the test: a new one must be placed.
LAYERS = (
    ("diloco.paths", "diloco.errors"),  # files local or in a bucket; input a command refuses
    (
        "diloco.jsonl",
        "diloco.metrics",
        "diloco.timing",
        "diloco.models",
        "diloco.data",
        "diloco.watch",
    ),
    ("diloco.inner",),  # mesh, the pure step, island, evaluation, checkpoints, warm start
    ("diloco.harness",),  # lm-evaluation-harness: our decoder as its model, tasks, records
    ("diloco.outer",),  # protocol, policies, merging, fragments; sync/, learner/, codecs/
    ("diloco.recovery", "diloco.chaos", "diloco.sim"),
    ("diloco.config",),  # variants, presets, deploy section, and build.py over all of the above
    ("diloco.plan",),  # a learner compiled for a TPU slice before launch: memory, FLOPs, roofline
    ("diloco.runtime",),  # virtual clock, threads, fault drivers, links, synchronizer host
    ("diloco.rpc",),  # gRPC service, client, learner and synchronizer processes
    ("diloco.runners",),  # dp, islands, compare
    ("diloco.train",),  # the mode table and train_and_evaluate
    ("diloco.sweeps",),  # a config's sweep: its points, run in processes, their rows
    ("diloco.launch",),  # past one machine: gcloud, xpk, Ray, the supervisor, token sources
)


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in sorted((ROOT / "diloco").rglob("*.py")):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts.pop()
    out[".".join(parts)] = path
  return out


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
  """The diloco modules `name` imports (a `from package import module` names the module)."""
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  found = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base])
        base = base.rstrip(".")
      for a in node.names:
        found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
  return {m for m in found if m in known and m != name and m != "diloco"}


def _layer(module: str) -> int:
  for i, layer in enumerate(LAYERS):
    if any(module == p or module.startswith(p + ".") for p in layer):
      return i
  raise AssertionError(f"{module} belongs to no layer of tests/test_layout.py")


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  return {m: _imports(m, p, set(modules)) for m, p in modules.items() if m != "diloco"}


def test_imports_run_downhill():
  graph = _graph()
  uphill = [
      f"{m} (layer {_layer(m)}) imports {d} (layer {_layer(d)})"
      for m, deps in sorted(graph.items())
      for d in sorted(deps)
      if _layer(d) > _layer(m)
  ]
  assert not uphill, "\n".join(uphill)


def test_no_import_cycles():
  graph, state, cycles = _graph(), {}, []

  def visit(m: str, stack: list[str]) -> None:
    state[m] = "open"
    for d in sorted(graph[m]):
      if state.get(d) == "open":
        cycles.append(" -> ".join(stack[stack.index(d) :] + [m, d]))
      elif d not in state:
        visit(d, stack + [m])
    state[m] = "done"

  for m in sorted(graph):
    if m not in state:
      visit(m, [])
  assert not cycles, "\n".join(cycles)


# The two sides of the protocol share only what outer/ holds below them: neither imports the
# other, and nothing else in outer/ imports either (their runtimes, a layer up, drive both).
SIDES = ("diloco.outer.sync", "diloco.outer.learner")


def _side(module: str) -> str | None:
  return next((s for s in SIDES if module == s or module.startswith(s + ".")), None)


def test_the_synchronizer_and_the_learner_meet_only_in_the_protocol():
  graph = _graph()
  crossed = [
      f"{m} imports {d}"
      for m, deps in sorted(graph.items())
      if m.startswith("diloco.outer")
      for d in sorted(deps)
      if _side(d) is not None and _side(m) != _side(d)
  ]
  assert not crossed, "\n".join(crossed)
  assert all(any(_side(m) == s for m in graph) for s in SIDES)  # (both packages are read)


@pytest.mark.parametrize(
    "source,imported",
    [
        (
            "from diloco.outer import protocol\nfrom diloco import train",
            {"diloco.outer.protocol", "diloco.train"},
        ),
        ("from . import synchronizer_pb2 as pb", {"diloco.rpc.synchronizer_pb2"}),
        ("def f():\n  from diloco.runners import compare", {"diloco.runners.compare"}),
    ],
)
def test_the_reader_sees_every_kind_of_import(tmp_path, source, imported):
  path = tmp_path / "x.py"
  path.write_text(source)
  assert _imports("diloco.rpc.x", path, set(_modules()) | {"diloco.rpc.x"}) == imported


def test_a_module_above_its_layer_is_named():
  with pytest.raises(AssertionError, match="no layer"):
    _layer("diloco.nowhere")
  assert (
      _layer("diloco.runtime.virtual")
      > _layer("diloco.config.build")
      > _layer("diloco.outer.sync.synchronizer")
  )


# The whole repository, lowest first (each name a package or module prefix; the longest wins).
REPO_LAYERS = (
    ("diloco",),  # the library
    ("experiments.studies",),  # study code: tables, the staged outer-lr search, the chaos suite
    ("configs",),  # configs and their sweeps (staged with the study code)
    ("experiments",),  # the mains
    ("scripts", "notebooks", "tests"),
)
TOP = {name.split(".")[0] for layer in REPO_LAYERS for name in layer}


def _repo_modules() -> dict[str, pathlib.Path]:
  out = {}
  for top in sorted(TOP):
    for path in sorted((ROOT / top).rglob("*.py")):
      parts = list(path.relative_to(ROOT).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      out[".".join(parts)] = path
  return out


def _repo_layer(module: str) -> int:
  best = max(
      ((i, name) for i, layer in enumerate(REPO_LAYERS) for name in layer
       if module == name or module.startswith(name + ".")),
      key=lambda x: len(x[1]),
  )  # fmt: skip
  return best[0]


def _absolute_imports(path: pathlib.Path) -> set[str]:
  """The modules a file imports by absolute name whose first part is a top-level folder here."""
  found = set()
  for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
    if isinstance(node, ast.Import):
      found.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      found.add(node.module)
      found.update(f"{node.module}.{a.name}" for a in node.names)
  return {m for m in found if m.split(".")[0] in TOP}


def test_the_library_is_below_the_lab():
  modules = _repo_modules()
  uphill = []
  for m, path in modules.items():
    for d in sorted(_absolute_imports(path)):
      if d not in modules and d.rpartition(".")[0] in modules:
        d = d.rpartition(".")[0]  # a name imported from a module, not a module
      if _repo_layer(d) > _repo_layer(m):
        uphill.append(f"{m} (layer {_repo_layer(m)}) imports {d} (layer {_repo_layer(d)})")
  assert not uphill, "\n".join(uphill)


def test_the_repository_layers_are_checked():
  assert _repo_layer("diloco.sweeps.sweep") < _repo_layer("experiments.studies.hetero_table")
  assert _repo_layer("experiments.studies.x") < _repo_layer("configs.sweeps.heterogeneous")
  assert _repo_layer("configs.shakespeare") < _repo_layer("experiments.train")


def test_the_repository_reader_sees_lab_imports(tmp_path):
  path = tmp_path / "x.py"
  path.write_text("import configs.shakespeare\ndef f():\n  from experiments.studies import a\n")
  assert _absolute_imports(path) == {
      "configs.shakespeare",
      "experiments.studies",
      "experiments.studies.a",
  }


SMALL = 40  # lines


def test_a_small_module_has_more_than_one_importer_or_says_why():
  """A library module under SMALL lines that one other module alone imports (in the library or
  the lab; tests do not count) folds back into it (issue 71), unless its docstring starts "one
  importer:" and says why it stands alone."""
  modules, graph = _modules(), _graph()
  importers = {m: {o for o, deps in graph.items() if m in deps} for m in graph}
  for o, path in _repo_modules().items():
    if not o.startswith(("diloco", "tests")):
      for d in _absolute_imports(path):
        d = d if d in importers else d.rpartition(".")[0]
        if d in importers:
          importers[d].add(o)
  alone = []
  for m, path in sorted(modules.items()):
    text = path.read_text(encoding="utf-8")
    if m == "diloco" or path.name == "__init__.py" or len(text.splitlines()) >= SMALL:
      continue
    doc = ast.get_docstring(ast.parse(text)) or ""
    if len(importers[m]) <= 1 and not doc.lower().startswith("one importer:"):
      alone.append(f"{m} ({len(text.splitlines())} lines): imported by {sorted(importers[m])}")
  assert not alone, "\n".join(alone)
