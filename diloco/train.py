"""train_and_evaluate(config, workdir): the one entry every main, test and notebook calls."""

import json
import os
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from diloco.runners import compare, islands as islands_lib, dp
from diloco import metrics

# A mode is a choice of components made here, once; each runner owns its loop.
RUNNERS: dict[str, Callable[[ml_collections.ConfigDict, str], dict[str, Any]]] = {
    "dp": dp.run,
    "diloco": islands_lib.run,
    "streaming": islands_lib.run,
    "decoupled": islands_lib.run,
    "compare": compare.run,
}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs the configured mode in `workdir`, writes summary.json and returns the summary."""
  if config.mode not in RUNNERS:
    raise ValueError(f"unknown mode {config.mode!r}; known: {sorted(RUNNERS)}")
  if config.get("distributed", False):
    jax.distributed.initialize()
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
    f.write(config.to_json(indent=2))
  summary = RUNNERS[config.mode](config, workdir)
  summary["workdir"] = os.path.abspath(workdir)
  if jax.process_index() == 0:
    metrics.write_summary(workdir, summary)
  return summary


def format_summary(summary: dict[str, Any]) -> str:
  """A few lines for the terminal."""
  keys = ("mode", "steps", "tokens", "tokens_per_s", "eval_loss", "eval_bpb", "wall_s", "params",
          "plot")
  lines = [f"  {k:>14}: {_fmt(summary[k])}" for k in keys if k in summary]
  lines.append(f"  {'outputs':>14}: {summary['workdir']} (summary.json, metrics.jsonl, tb/)")
  return "\n".join(["summary:"] + lines)


def _fmt(v: Any) -> str:
  if isinstance(v, float):
    return f"{v:,.4f}" if abs(v) < 100 else f"{v:,.0f}"
  if isinstance(v, int):
    return f"{v:,}"
  return json.dumps(v) if not isinstance(v, str) else v
