"""train_and_evaluate(config, workdir): the one entry every main, test and notebook calls.

A mode is a choice made here, once: one table maps each mode to its config preset and its runner.
"""

import dataclasses
import json
import os
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from diloco import metrics
from diloco.config import deploy as deploy_lib, outer_check, presets
from diloco.runners import compare, dp, islands

Runner = Callable[[ml_collections.ConfigDict, str], dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Mode:
  preset: Callable[[ml_collections.ConfigDict, bool, int], None]  # (config, runlocal, learners)
  run: Runner


def _compare(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  return compare.run(config, workdir, apply_mode=apply_mode, train=train_and_evaluate)


MODES: dict[str, Mode] = {
    "dp": Mode(presets.dp, dp.run),
    "diloco": Mode(presets.diloco, islands.run),
    "streaming": Mode(presets.streaming, islands.run),
    "decoupled": Mode(presets.decoupled, islands.run),
    "compare": Mode(presets.compare, _compare),
}


def mode_of(name: str) -> Mode:
  if name not in MODES:
    raise ValueError(f"unknown mode {name!r}; known: {sorted(MODES)}")
  return MODES[name]


def apply_mode(
    c: ml_collections.ConfigDict, mode: str, runlocal: bool = False, learners: int = 0
) -> None:
  """Sets c.mode and the knobs of that mode (`learners` > 0: M learners)."""
  preset = mode_of(mode).preset
  c.mode = mode
  preset(c, runlocal, learners)


def train_and_evaluate(
    config: ml_collections.ConfigDict, workdir: str, **runner_options: Any
) -> dict[str, Any]:
  """Runs the configured mode in `workdir`, writes summary.json and returns the summary.

  `runner_options` go to the mode's runner: `parts=` (from `config.build.local_learners`) lets
  a test or notebook watch a multi-learner run's synchronizer.
  """
  run = mode_of(config.mode).run
  if config.get("distributed", False):
    jax.distributed.initialize()
  if "outer" in config:
    outer_check.check(config.outer)
  if "deploy" in config:
    deploy_lib.check_platform(config.deploy, jax.default_backend())
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    f.write(config.to_json(indent=2))
  summary = run(config, workdir, **runner_options)
  summary["workdir"] = os.path.abspath(workdir)
  if jax.process_index() == 0:
    metrics.write_summary(workdir, summary)
  return summary


def format_summary(summary: dict[str, Any]) -> str:
  """A few lines for the terminal."""
  keys = (
      "mode",
      "steps",
      "tokens",
      "tokens_per_s",
      "eval_loss",
      "eval_bpb",
      "eval_accuracy",
      "wall_s",
      "params",
      "plot",
  )
  lines = [f"  {k:>14}: {_fmt(summary[k])}" for k in keys if k in summary]
  lines.append(f"  {'outputs':>14}: {summary['workdir']} (summary.json, metrics.jsonl, tb/)")
  return "\n".join(["summary:"] + lines)


def _fmt(v: Any) -> str:
  if isinstance(v, float):
    return f"{v:,.4f}" if abs(v) < 100 else f"{v:,.0f}"
  if isinstance(v, int):
    return f"{v:,}"
  return json.dumps(v) if not isinstance(v, str) else v
