"""Runs a sweep's points, each through train_and_evaluate in WORKDIR/<point name>, and tabulates.

A point whose directory holds a summary.json is done and skipped; a point that raises is reported
with its error (also in its `error.txt`) and the others go on. `parallel` = N runs the points in N
worker processes (spawned, so each has its own JAX); 0 runs them in this process, one by one.
The table is WORKDIR/results.jsonl and WORKDIR/results.csv: one row per point with its status,
its overrides and the summary keys asked for.
"""

import concurrent.futures as cf
import csv
import json
import multiprocessing
import os
import traceback
from collections.abc import Sequence
from typing import Any

import tqdm

from diloco.config import keys as config_keys
from diloco.sweeps import eval_sets, sweep

DEFAULT_KEYS = ("eval_loss", "eval_bpb", "params", "tokens", "wall_s")
SUMMARY = "summary.json"


def run_point(point: sweep.Point, workdir: str) -> dict[str, Any]:
  """Trains one point in workdir/<name>; returns its summary (raises what the run raised)."""
  from diloco import train  # here, so that spawned workers import JAX themselves

  if point.config is not None and not config_keys.DOMAINS:  # pickled into a fresh worker
    sweep.declare(point)
  config = sweep.build_config(point)
  return train.train_and_evaluate(config, os.path.join(workdir, point.name))


def _worker(
    point: sweep.Point, workdir: str, parent: int | None = None
) -> tuple[dict[str, Any] | None, str]:
  """(summary, '') or (None, the error and its traceback); never raises. A worker whose sweep
  (`parent`, its pid) has exited runs none of the points still queued for it: they would train
  with the code and configs of a sweep that is gone."""
  if parent is not None and os.getppid() != parent:
    return None, f"not run: the sweep that queued it (pid {parent}) has exited"
  _quiet()
  try:
    return run_point(point, workdir), ""
  except Exception as e:  # pylint: disable=broad-except
    err = f"{type(e).__name__}: {e}"
    path = os.path.join(workdir, point.name)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "error.txt"), "w", encoding="utf-8") as f:
      f.write(err + "\n\n" + traceback.format_exc())
    return None, err


def _quiet() -> None:
  from absl import logging

  logging.set_verbosity(logging.WARNING)


def finished(workdir: str, point: sweep.Point) -> dict[str, Any] | None:
  """The summary of a point that finished earlier, or None."""
  path = os.path.join(workdir, point.name, SUMMARY)
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    summary = json.load(f)
  return summary if summary.get("finished", True) else None  # stopped early: resume it


def load(spec: str, workdir: str, keys: Sequence[str] = ()) -> list[dict[str, Any]]:
  """The table's rows of `spec`'s sweep from the summaries in `workdir`, running and writing
  nothing; FileNotFoundError naming every point without one."""
  module = sweep.load_module(sweep.split_spec(spec)[0])
  points = sweep.points(spec, module)
  results = {p.index: (finished(workdir, p), "") for p in points}
  missing = [p.name for p in points if results[p.index][0] is None]
  if missing:
    raise FileNotFoundError(f"no summary.json in {workdir} for: {', '.join(missing)}")
  return rows(points, results, keys or getattr(module, "SWEEP_KEYS", DEFAULT_KEYS))


def load_or_run(spec: str, workdir: str, results_only: bool, **options) -> list[dict[str, Any]]:
  """A notebook's rows: with `results_only`, `load`ed (a missing point is an error, never
  trained); else `run` with `options` (the points without a summary train first). A point that
  failed is a RuntimeError naming it."""
  out = load(spec, workdir) if results_only else run(spec, workdir, **options)
  failed = [f"{r['name']}: {r['error']}" for r in out if r["status"] != "done"]
  if failed:
    raise RuntimeError("points failed:\n" + "\n".join(failed))
  return out


def stage(spec: str, workdir: str, results_only: bool, **options) -> bool:
  """One stage of a staged sweep in a notebook, through `load_or_run`; False when the stage has no
  point (its grid closed: no winner left on an edge)."""
  try:
    load_or_run(spec, workdir, results_only, **options)
    return True
  except sweep.SweepError as e:
    if "non-empty" not in str(e):
      raise
    return False


def stager(path: str, workdir: str, results_only: bool, tiny: bool = False, **options):
  """A notebook's `stage(arg, table)`: `stage` of the sweep file at `path` with `arg` (after "tiny,"
  in a tiny notebook), its rows in `workdir`'s `table`."""

  def run_stage(arg: str, table: str) -> bool:
    spec = f"{path}:{'tiny,' * tiny}{arg}"
    return stage(spec, workdir, results_only, **options, table=table)

  return run_stage


def run(
    spec: str,
    workdir: str,
    parallel: int = 1,
    keys: Sequence[str] = (),
    dry_run: bool = False,
    progress: bool = True,
    table: str = "results",
) -> list[dict[str, Any]]:
  """Runs every unfinished point of `spec`'s sweep and returns the table's rows.

  `keys`: the summary keys of the table (default: the config file's SWEEP_KEYS, else
  DEFAULT_KEYS). `dry_run` prints each point's command and runs nothing. The table is written to
  WORKDIR/<table>.jsonl and .csv (sweeps that share a workdir keep their tables apart).
  """
  if parallel < 0:
    raise sweep.SweepError(f"parallel must be >= 0, got {parallel}")
  module = sweep.load_module(sweep.split_spec(spec)[0])
  points = sweep.points(spec, module)  # every point checked before any runs
  keys = keys or getattr(module, "SWEEP_KEYS", DEFAULT_KEYS)
  if dry_run:
    for p in points:
      print(p.command(workdir), flush=True)
    return []
  os.makedirs(workdir, exist_ok=True)
  results = {p.index: (finished(workdir, p), "") for p in points}
  todo = [p for p in points if results[p.index][0] is None]
  bar = tqdm.tqdm(
      total=len(points),
      initial=len(points) - len(todo),
      desc="sweep",
      unit="point",
      disable=not progress,
      dynamic_ncols=True,
  )
  slots = max(parallel, 1)
  counts = dict(done=len(points) - len(todo), running=min(slots, len(todo)), failed=0)
  bar.set_postfix(counts)
  for n, (point, outcome) in enumerate(_execute(todo, workdir, parallel), start=1):
    results[point.index] = outcome
    counts["running"] = min(slots, len(todo) - n)
    counts["done" if outcome[0] is not None else "failed"] += 1
    if outcome[1]:
      bar.write(f"point {point.index} ({point.name}) failed: {outcome[1]}")
    bar.set_postfix(counts)
    bar.update(1)
    write_table(workdir, points, results, keys, table)  # after every point: a kill keeps the rows
  bar.close()
  return write_table(workdir, points, results, keys, table)


def _execute(todo: list[sweep.Point], workdir: str, parallel: int):
  """Yields (point, (summary or None, error)) as points finish."""
  if parallel == 0:
    for p in todo:
      yield p, _worker(p, workdir)
    return
  ctx = multiprocessing.get_context("spawn")
  with cf.ProcessPoolExecutor(max_workers=parallel, mp_context=ctx) as pool:
    futures = {pool.submit(_worker, p, workdir, os.getpid()): p for p in todo}
    for fut in cf.as_completed(futures):
      try:
        outcome = fut.result()
      except Exception as e:  # pylint: disable=broad-except  (a worker that died)
        outcome = (None, f"worker died: {type(e).__name__}: {e}")
      yield futures[fut], outcome


def rows(points, results, keys) -> list[dict[str, Any]]:
  """One row per point: name, status, its overrides, the summary's keys and harness scores (or
  the error)."""
  out = []
  for p in points:
    summary, err = results.get(p.index, (None, ""))
    status = "done" if summary is not None else ("failed" if err else "pending")
    row = {"name": p.name, "status": status, **p.values}
    for k in keys:  # a summary key that is also an override of the point keeps both
      row[f"summary.{k}" if k in p.values else k] = (summary or {}).get(k)
    for k in sorted(k for k in summary or {} if k.startswith("harness/")):  # eval.harness_tasks:
      row[k] = summary[k]  # each task's score and standard error beside the loss
    row["eval_set"] = eval_sets.summary_set(summary or {})  # what the tables check
    row["error"] = err
    out.append(row)
  return out


def write_table(workdir, points, results, keys, name: str = "results") -> list[dict[str, Any]]:
  """Writes <name>.jsonl and <name>.csv (atomically) and returns the rows."""
  table = rows(points, results, keys)
  columns = list(dict.fromkeys(k for r in table for k in r))
  _atomic(
      os.path.join(workdir, f"{name}.jsonl"),
      lambda f: f.writelines(json.dumps(r) + "\n" for r in table),
  )

  def write_csv(f):
    w = csv.DictWriter(f, fieldnames=columns)
    w.writeheader()
    w.writerows(table)

  _atomic(os.path.join(workdir, f"{name}.csv"), write_csv)
  return table


def _atomic(path: str, write) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w", encoding="utf-8", newline="") as f:
    write(f)
  os.replace(tmp, path)


def export(workdir: str, dest: str) -> int:
  """Copies every finished point's summary.json from workdir to dest/<name>/ (checked-in results:
  without its `workdir`, the path on the machine that ran it, and with its `timeline` picture
  named inside the point's directory); returns how many."""
  count = 0
  for name in sorted(os.listdir(workdir)):
    src = os.path.join(workdir, name, SUMMARY)
    if not os.path.isfile(src):
      continue
    with open(src, encoding="utf-8") as f:
      summary = json.load(f)
    summary.pop("workdir", None)
    if isinstance(summary.get("timeline"), str):
      summary["timeline"] = os.path.basename(summary["timeline"])
    os.makedirs(os.path.join(dest, name), exist_ok=True)
    with open(os.path.join(dest, name, SUMMARY), "w", encoding="utf-8") as f:
      json.dump(summary, f, indent=2, sort_keys=True)
      f.write("\n")
    count += 1
  return count
