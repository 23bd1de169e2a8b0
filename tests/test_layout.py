"""The package layout is the architecture: imports run downhill and never in a circle.

Every import inside `diloco/` (function-level ones included) is read from the source. A module may
import modules of its own layer or of the layers below it, never one above; and no set of modules
imports itself around a circle.
"""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Lowest first. A package not listed here fails the test: a new one must be placed.
LAYERS = (
    ("diloco.paths",),  # every file read or written, local or in a bucket
    (
        "diloco.jsonl",
        "diloco.metrics",
        "diloco.timing",
        "diloco.models",
        "diloco.data",
        "diloco.watch",
    ),
    ("diloco.inner",),  # mesh, the pure step, island, evaluation, checkpoints, warm start
    ("diloco.outer",),  # protocol, synchronizer, policies, merging, optimizers, fragments, codecs
    ("diloco.recovery", "diloco.chaos", "diloco.sim"),
    ("diloco.config",),  # variants, presets, deploy section, and build.py over all of the above
    ("diloco.plan",),  # a learner compiled for a TPU slice before launch: memory, FLOPs, roofline
    ("diloco.runtime",),  # virtual clock, threads, fault drivers, links, synchronizer host
    ("diloco.rpc",),  # gRPC service, client, learner and synchronizer processes
    ("diloco.runners",),  # dp, islands, compare
    ("diloco.train",),  # the mode table and train_and_evaluate
    ("diloco.studies",),  # many runs through train_and_evaluate: the chaos suite
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
      > _layer("diloco.outer.synchronizer")
  )
