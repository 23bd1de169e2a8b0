"""The README's Layout table names every package under diloco/ and nothing else, and every path
`diloco/...py` that the docs, scripts and notebooks mention exists. The README stays a guide (at
most about 300 lines, every docs/ page linked) whose every command the suite or CI runs."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATH = re.compile(r"diloco/[\w/]+\.(?:py|proto)")


def _listed(readme: str) -> set[str]:
  """The first cell of each row of the Layout table: a package (`diloco/x/`) or a module."""
  section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
  rows = set()
  for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) >= 2 and cells[0].startswith("`diloco/"):
      rows.add(cells[0].strip("`"))
  return rows


def _on_disk() -> set[str]:
  """Every package under diloco/ (a folder with an `__init__.py`), as `diloco/x/`."""
  return {f"{p.parent.relative_to(ROOT)}/" for p in (ROOT / "diloco").rglob("__init__.py")}


def test_layout_table_matches_the_tree():
  listed = _listed((ROOT / "README.md").read_text(encoding="utf-8"))
  packages = {row for row in listed if row.endswith("/")}
  on_disk = _on_disk()
  assert not on_disk - packages, f"not in the README's Layout: {sorted(on_disk - packages)}"
  assert (
      not packages - on_disk
  ), f"in the README's Layout but not on disk: {sorted(packages - on_disk)}"
  modules = listed - packages  # a row for one module (`diloco/train.py`) names one that exists
  assert all((ROOT / m).is_file() for m in modules), sorted(
      m for m in modules if not (ROOT / m).is_file()
  )


def test_the_table_reader_finds_rows_and_ignores_prose():
  text = (
      "## Layout\n\nprose `diloco/x.py`\n\n| package | role |\n|---|---|\n"
      "| `diloco/outer/` | the outer loop |\n| `diloco/train.py` | the mode table |\n\n## Running\n"
      "| `diloco/later/` | after the section |\n"
  )
  assert _listed(text) == {"diloco/outer/", "diloco/train.py"}


def test_every_mentioned_path_exists():
  files = [
      ROOT / "README.md",
      ROOT / "BENCHMARKS.md",
      *ROOT.glob("docs/*.md"),
      *ROOT.glob("scripts/**/*.py"),
      *ROOT.glob("notebooks/*.py"),
      *ROOT.glob("configs/*.py"),
      *ROOT.glob("experiments/*.py"),
      *ROOT.glob("diloco/**/*.py"),
      *ROOT.glob("tests/*.py"),
  ]
  missing = sorted(
      {
          f"{f.relative_to(ROOT)}: {m}"
          for f in files
          if f.name != "test_readme.py"
          for m in PATH.findall(f.read_text(encoding="utf-8"))
          if not (ROOT / m).exists()
      }
  )
  assert not missing, "\n".join(missing)


def _readme() -> str:
  return (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_a_guide_that_links_every_page():
  readme = _readme()
  assert len(readme.splitlines()) <= 300
  pages = {p.name for p in (ROOT / "docs").glob("*.md")}
  linked = set(re.findall(r"docs/([\w-]+\.md)", readme))
  assert linked == pages, f"linked but missing: {linked - pages}; not linked: {pages - linked}"


def _commands(text: str) -> list[str]:
  """The commands of the ```bash blocks (a line ending in a backslash goes on)."""
  out = []
  for block in re.findall(r"```bash\n(.*?)```", text, re.S):
    out += [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]
  return out


# Each README command, by its start, and where it runs: CI, a test, or this file.
RUN_BY = {
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[eval]' && .venv/bin/python -m experiments.train"
    " --config=configs/shakespeare.py:mode=compare": "tests/test_train.py",  # (runlocal there)
    "python3 -m venv .venv && .venv/bin/pip install -q --no-compile -e '.[dev,eval]'": ".ci/run",
    "python -m experiments.config --config=configs/shakespeare.py:mode=decoupled": "tests/test_readme.py",
    "python -m experiments.sweep --config=my_sweep.py:runlocal": "tests/test_own_experiments.py",
}


def test_every_readme_command_is_run_by_the_suite_or_ci():
  commands = _commands(_readme())
  unrun = [c for c in commands if not any(c.startswith(start) for start in RUN_BY)]
  assert not unrun, f"README commands no test or CI runs (add one, then RUN_BY): {unrun}"
  assert len(commands) == len(RUN_BY)
  assert all((ROOT / where).exists() for where in RUN_BY.values())


def test_the_readme_config_command_lists_the_keys():
  (command,) = [c for c in _commands(_readme()) if c.startswith("python -m experiments.config")]
  argv = [sys.executable, *command.split()[1:]]
  out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
  mode = next(line for line in out.stdout.splitlines() if line.startswith("mode "))
  assert "'decoupled'" in mode
  assert any(line.startswith("outer.delivery ") for line in out.stdout.splitlines())
