"""Harness tasks by name (resolved the harness's way, its own and ours) or as local folders of YAML
and data files, checked before anything runs or is written; run on a model; their scores.

A local task's `dataset_kwargs.data_files` are read relative to its YAML file, so a folder can be
moved and evaluated without a hub. Our shipped tasks (TASKS_DIR: the Shakespeare task) are local
folders too, found by their name.
"""

from __future__ import annotations

import functools
import glob
import math
import os
from typing import Any
from unittest import mock

import tqdm

import yaml

from diloco import errors

TASKS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tasks")
MAIN_METRICS = ("acc", "exact_match", "word_perplexity")  # a task's headline, first found


class TaskError(errors.InputError):
  """--tasks names something that is not a task, or a folder whose YAML does not load."""


def _shipped() -> dict[str, str]:
  return {d: os.path.join(TASKS_DIR, d) for d in sorted(os.listdir(TASKS_DIR))}


class _CheckLoader(yaml.SafeLoader):
  """YAML as the harness reads it, its `!function` tags kept as text (no import of the harness)."""


_CheckLoader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))


def _load(path: str, functions: bool) -> dict:
  """One task YAML: with `functions`, as the harness loads it (includes merged, `!function`s
  imported), else parsed only."""
  if functions:
    from lm_eval.tasks import _yaml_loader

    return _yaml_loader.load_yaml(path, resolve_func=True)
  with open(path) as f:
    cfg = yaml.load(f, Loader=_CheckLoader)
  if not isinstance(cfg, dict):
    raise ValueError(f"expected a mapping, got {type(cfg).__name__}")
  return cfg


def _folder_configs(path: str, functions: bool = True) -> list[dict]:
  """The task configs of a folder's (or one file's) YAML, data files made absolute."""
  files = [path] if os.path.isfile(path) else sorted(glob.glob(os.path.join(path, "*.y*ml")))
  if not files:
    raise TaskError(f"--tasks: {path} holds no task YAML (*.yaml)")
  out = []
  for f in files:
    try:
      cfg = _load(f, functions)
    except Exception as e:  # yaml's errors, a missing include or !function file
      why = " ".join(str(e).split())  # (yaml's messages span lines)
      raise TaskError(f"--tasks: {f} is not a task's YAML ({type(e).__name__}: {why})") from e
    if "task" not in cfg:
      raise TaskError(f"--tasks: {f} names no `task`")
    files_ = (cfg.get("dataset_kwargs") or {}).get("data_files")
    if isinstance(files_, dict):
      base = os.path.dirname(os.path.abspath(f))
      cfg["dataset_kwargs"]["data_files"] = {
          k: os.path.join(base, v) if isinstance(v, str) else [os.path.join(base, x) for x in v]
          for k, v in files_.items()
      }
      missing = [
          v
          for v in cfg["dataset_kwargs"]["data_files"].values()
          if isinstance(v, str) and not os.path.isfile(v)
      ]
      if missing:
        raise TaskError(f"--tasks: {f}: data file {missing[0]} does not exist")
    out.append(cfg)
  return out


def resolve(spec: str, check: bool = False) -> list[str | dict]:
  """The tasks of a comma-separated --tasks: harness task or group names, our shipped tasks'
  names, and paths of local task folders or YAML files. Refuses an unknown name or a bad YAML.
  `check`: parse local YAML without importing the harness (a config's check)."""
  names = [s.strip() for s in spec.split(",") if s.strip()]
  if not names:
    raise TaskError("--tasks: name at least one task")
  shipped, out, unknown = _shipped(), [], []
  for name in names:
    if name in shipped:
      out += _folder_configs(shipped[name], not check)
    elif os.path.exists(name):
      out += _folder_configs(name, not check)
    else:
      out.append(name)
  harness_names = [n for n in out if isinstance(n, str)]
  if harness_names:
    known = set(task_manager().all_tasks)
    unknown = [n for n in harness_names if n not in known]
  if unknown:
    raise TaskError(
        f"--tasks: no harness task, group or local folder named {unknown[0]!r} (ours: "
        f"{', '.join(shipped)}; `lm-eval ls tasks` lists the harness's)"
    )
  return out


_managers = {}


def task_manager(defaults: bool = True):
  """The harness's task index, with its own tasks (built once: reading every task folder's YAML
  takes seconds) or without them (enough for local tasks)."""
  if defaults not in _managers:
    from lm_eval.tasks import TaskManager

    _managers[defaults] = TaskManager(include_defaults=defaults)
  return _managers[defaults]


def run(lm, tasks: list[str | dict], limit: int | None = None, bootstrap_iters: int = 1000) -> dict:
  """The harness's results of `tasks` on `lm` (its `results`, `groups`, `n-samples`, ...), with
  no progress bars: the harness draws one per task it builds, whatever its verbosity, and the
  datasets library one per file it reads (a run draws its own)."""
  import datasets
  from lm_eval import evaluator
  from lm_eval.api import task as lm_task

  datasets.disable_progress_bars()
  quiet = functools.partial(tqdm.tqdm, disable=True)
  with mock.patch.object(lm_task, "tqdm", quiet):
    return evaluator.simple_evaluate(
        model=lm,
        tasks=tasks,
        task_manager=task_manager(defaults=any(isinstance(t, str) for t in tasks)),
        limit=limit,
        bootstrap_iters=bootstrap_iters,
        log_samples=False,
        verbosity="ERROR",
    )


def scores(results: dict) -> dict[str, dict[str, float]]:
  """Each task's headline metric and its standard error: {task: {metric, value, stderr}}, and
  an `average` of the tasks' values (with the standard error of that mean) when there are
  several of one metric."""
  out = {}
  for task, r in sorted(results["results"].items()):
    for m in MAIN_METRICS:
      key = f"{m},none"
      if key in r:
        stderr = r.get(f"{m}_stderr,none")
        out[task] = {
            "metric": m,
            "value": float(r[key]),
            "stderr": float(stderr) if isinstance(stderr, (int, float)) else math.nan,
        }
        break
  metrics = {s["metric"] for s in out.values()}
  if len(out) > 1 and len(metrics) == 1:
    values = [s["value"] for s in out.values()]
    errs = [s["stderr"] for s in out.values()]
    out["average"] = {
        "metric": metrics.pop(),
        "value": sum(values) / len(values),
        "stderr": math.sqrt(sum(e * e for e in errs)) / len(errs),
    }
  return out


def name(tasks: list[str | dict]) -> str:
  """A file name for a set of tasks: their names joined by '+'."""
  return "+".join(t if isinstance(t, str) else t["task"] for t in tasks)
