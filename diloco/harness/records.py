"""A harness evaluation of a run's parameters, recorded: RUN/eval_harness/<tasks>.json (the
harness's own results, metrics and standard errors, with the step and the packing's padding), a
row in RUN/metrics.jsonl and the run's other trackers, and a line of the printed table."""

from __future__ import annotations

import json
import math
import os
from typing import Any

from diloco import jsonl, paths
from diloco.harness import tasks as tasks_lib
from diloco.watch import trackers

DIRNAME = "eval_harness"


def columns(scores: dict[str, dict[str, float]], padding: float) -> dict[str, Any]:
  """harness/<task>/<metric> and its _stderr for each task (and the average), and the padding."""
  out: dict[str, Any] = {"harness_padding": padding}
  for task, s in scores.items():
    out[f"harness/{task}/{s['metric']}"] = s["value"]
    out[f"harness/{task}/{s['metric']}_stderr"] = s["stderr"]
  return out


def row(step: int, scores: dict[str, dict[str, float]], padding: float) -> dict[str, Any]:
  """A metrics row of a finished run's harness evaluation."""
  return {"step": step, "event": "harness", **columns(scores, padding)}


def write(run, task_list: list, results: dict, metrics_row: dict[str, Any]) -> str:
  """Writes the results file, appends the row to metrics.jsonl and the run's trackers; the
  results file's path."""
  directory = paths.join(run.workdir, DIRNAME)
  paths.makedirs(directory)
  path = paths.join(directory, f"{tasks_lib.name(task_list)}.json")
  kept = {
      k: results[k]
      for k in ("results", "groups", "n-samples", "versions", "higher_is_better")
      if k in results
  }
  record = {"step": metrics_row["step"], "padding": metrics_row["harness_padding"], **kept}
  paths.write_text(path, json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
  jsonl.append(paths.join(run.workdir, "metrics.jsonl"), metrics_row)
  for t in trackers.make(run.config.get("trackers", ""), run.workdir, run.config.to_dict()):
    t.write(metrics_row, "")
    t.close()
  return path


def format_table(lines: list[tuple[str, int, dict[str, dict[str, float]]]]) -> str:
  """One line per run: its workdir, step, and each task's headline metric ± standard error (an
  `average` column where the tasks share a metric)."""
  columns = list(dict.fromkeys(t for _, _, s in lines for t in s))
  head = ["run", "step", *(f"{t} ({lines[0][2][t]['metric']})" for t in columns)]
  cells = [[run, str(step), *(_cell(s.get(t)) for t in columns)] for run, step, s in lines]
  widths = [max(len(c) for c in col) for col in zip(head, *cells)]
  return "\n".join(
      "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
      for line in [head, *cells]
  )


def _cell(s: dict[str, float] | None) -> str:
  if s is None:
    return ""
  err = "" if math.isnan(s["stderr"]) else f" ±{s['stderr']:.4f}"
  return f"{s['value']:.4f}{err}"
