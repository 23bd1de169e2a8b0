"""The README's Layout table names every module under diloco/ and nothing else, and every path
`diloco/...py` that the docs, scripts and notebooks mention exists."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATH = re.compile(r"diloco/[\w/]+\.(?:py|proto)")


def _layout_rows(readme: str) -> list[tuple[str, list[str]]]:
  section = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
  rows = []
  for line in section.splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) >= 3 and cells[0].startswith("`diloco/"):
      rows.append((cells[0].strip("`"), re.findall(r"`([\w.]+\.py)`", cells[1])))
  return rows


def _listed(readme: str) -> set[str]:
  return {f"{package}{module}" for package, modules in _layout_rows(readme) for module in modules}


def _on_disk() -> set[str]:
  return {
      str(p.relative_to(ROOT)) for p in (ROOT / "diloco").rglob("*.py") if p.name != "__init__.py"
  }


def test_layout_table_matches_the_tree():
  listed = _listed((ROOT / "README.md").read_text(encoding="utf-8"))
  on_disk = _on_disk()
  assert not on_disk - listed, f"not in the README's Layout: {sorted(on_disk - listed)}"
  assert not listed - on_disk, f"in the README's Layout but not on disk: {sorted(listed - on_disk)}"


def test_the_table_reader_finds_rows_and_ignores_prose():
  text = (
      "## Layout\n\nprose `diloco/x.py`\n\n| package | modules | role |\n|---|---|---|\n"
      "| `diloco/outer/` | `protocol.py` `merging.py` | the outer loop |\n\n## Running\n"
      "| `diloco/later/` | `no.py` | after the section |\n"
  )
  assert _listed(text) == {"diloco/outer/protocol.py", "diloco/outer/merging.py"}


def test_every_mentioned_path_exists():
  files = [
      ROOT / "README.md",
      ROOT / "BENCHMARKS.md",
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
