"""How evenly a mixture of experts' learners routed: per learner, from a run's metrics.jsonl.

  python scripts/expert_usage.py --workdir=DIR [--workdir=DIR2 ...]

Reads the routing stats every logged training step carries (`moe_min_load`: the least-loaded
expert of any sparse block over an even share k*T/E; `moe_idle_experts`: the share of experts that
took no token) and prints, per learner (or `dp`), the logged steps, the smallest and the mean
least load, the largest idle share, how many logged steps had an idle expert and the longest
streak of consecutive ones. A workdir of `mode=compare` is read per mode. Run with
`--config.log_every=1` to see every step: an expert can have gone without tokens for a whole inner
phase of H steps (its outer gradient on that learner then carries no data of this phase) only if
a streak reaches H; the last line is the longest streak of any learner.
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np
from absl import app, flags

_WORKDIRS = flags.DEFINE_multi_string("workdir", [], "Run directories (each with metrics.jsonl).")
STATS = ("min_load", "idle_experts")


def usage(path: str) -> dict[str, dict[str, list[float]]]:
  """learner name -> stat -> its values over the logged steps of metrics.jsonl at `path`."""
  out: dict[str, dict[str, list[float]]] = collections.defaultdict(
      lambda: collections.defaultdict(list)
  )
  with open(path) as f:
    for line in f:
      row = json.loads(line)
      name = f"learner{row['learner']}" if "learner" in row else "dp"
      for stat in STATS:
        if isinstance(row.get(f"moe_{stat}"), (int, float)):
          out[name][stat].append(float(row[f"moe_{stat}"]))
  return out


def longest_streak(flags_N: np.ndarray) -> int:
  """The longest run of consecutive true entries."""
  best = run = 0
  for flag in flags_N:
    run = run + 1 if flag else 0
    best = max(best, run)
  return best


def table(name: str, stats: dict[str, dict[str, list[float]]]) -> list[str]:
  """Per learner: logged steps, least load (min, mean), idle share (max), steps with an idle expert
  and the longest streak of consecutive logged steps with one."""
  lines = [name, "  learner  steps  least load: min  mean  idle share: max  idle steps  streak"]
  for learner in sorted(stats):
    least = np.asarray(stats[learner]["min_load"])
    idle = np.asarray(stats[learner]["idle_experts"]) > 0
    top = max(stats[learner]["idle_experts"])
    lines.append(
        f"  {learner:<8} {len(least):>5}  {least.min():>16.3f} {least.mean():>5.3f}"
        f"  {top:>14.3f}  {int(idle.sum()):>10}  {longest_streak(idle):>6}"
    )
  return lines


def runs(workdir: str) -> list[tuple[str, str]]:
  """(name, metrics.jsonl) of a run directory, or of each mode of a compare run."""
  top = os.path.join(workdir, "metrics.jsonl")
  found = [(workdir, top)] if os.path.exists(top) else []
  for sub in sorted(os.listdir(workdir)):
    path = os.path.join(workdir, sub, "metrics.jsonl")
    if os.path.exists(path):
      found.append((os.path.join(workdir, sub), path))
  if not found:
    raise FileNotFoundError(f"no metrics.jsonl in {workdir!r} or its subdirectories")
  return found


def main(argv):
  del argv
  if not _WORKDIRS.value:
    raise app.UsageError("give at least one --workdir")
  streaks = []
  for workdir in _WORKDIRS.value:
    for name, path in runs(workdir):
      stats = usage(path)
      if not stats:
        print(f"{name}: no routing stats (a dense model?)")
        continue
      print("\n".join(table(name, stats)))
      streaks += [longest_streak(np.asarray(s["idle_experts"]) > 0) for s in stats.values()]
  if streaks:
    print(f"longest_idle_expert_streak_steps={max(streaks)}")


if __name__ == "__main__":
  app.run(main)
