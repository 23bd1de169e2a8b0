"""The README's main-job table ("What the main job shows") is the checked-in summary of the main
job's command (docs/main_job/summary.json, the workdir's summary.json of that run), number for
number, as the command prints it (`compare.format_table`)."""

import json
import pathlib
import re

from diloco.runners import compare

ROOT = pathlib.Path(__file__).resolve().parents[1]
SUMMARY = ROOT / "docs" / "main_job" / "summary.json"


def readme_rows(readme: str) -> dict[str, list[str]]:
  """The table's rows under "## What the main job shows": {mode: [its printed cells]}."""
  section = re.split(r"^## What the main job shows\n", readme, flags=re.M)[1].split("\n## ", 1)[0]
  (block,) = re.findall(r"```\n(mode .*?)```", section, re.S)
  return {cells[0]: cells[1:] for cells in (l.split() for l in block.splitlines()[2:]) if cells}


def test_the_readme_main_job_table_is_the_checked_in_summary():
  summary = json.loads(SUMMARY.read_text(encoding="utf-8"))
  assert summary["mode"] == "compare" and summary["finished"]
  order = [line.split()[0] for line in summary["table"].splitlines()[2:]]  # (keys are sorted)
  printed = compare.format_table({mode: summary["runs"][mode] for mode in order})
  assert printed == summary["table"]  # the table the run printed is that of its rows
  readme = readme_rows((ROOT / "README.md").read_text(encoding="utf-8"))
  assert readme == readme_rows(f"## What the main job shows\n```\n{printed}\n```\n")
  assert list(readme) == ["dp", "diloco", "decoupled"]


def test_the_reader_finds_the_rows():
  text = (
      "## What the main job shows\n\nprose\n\n```\nmode        eval bpb  sim time s\n"
      "------\ndp             2.665        6000\n```\n\n## Layout\n```\nmode x\n------\nno 1\n```\n"
  )
  assert readme_rows(text) == {"dp": ["2.665", "6000"]}
