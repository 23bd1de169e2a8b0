"""The chaos suite: many short seeded chaos runs, one table of what the faults did.

Each run is `train_and_evaluate` of `configs/shakespeare.py:<base>` with its own chaos seed, in
WORKDIR/run<seed>. A row says how many faults of each kind were injected, what the synchronizer
rejected and why, how many crashed learners rejoined, how often the synchronizer restarted, what
became of every corrupted or poisoned message, and the three verdicts: the global parameters stayed
finite and uncorrupted (no tainted message merged), every crashed learner rejoined (those whose
recovery time fell before the end), training advanced (final eval loss below the initial one).
"""

import collections
import json
import os
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections

from diloco import metrics, train
from diloco.chaos import schedule as chaos
from diloco.inner import evaluation, island as island_lib
from diloco.watch import progress

VERDICTS = ("params_ok", "all_rejoined", "advanced")
GetConfig = Callable[[str], ml_collections.ConfigDict]  # a config file's get_config


def run_config(
    config: ml_collections.ConfigDict, seed: int, get_base: GetConfig
) -> ml_collections.ConfigDict:
  """The suite's run with chaos seed `seed`: `get_base(config.base)` (configs/shakespeare.py's
  get_config) with the suite's settings."""
  c = get_base(config.base)
  c.chaos.seed = seed
  c.sim.step_jitter = config.step_jitter
  c.eval_every = config.eval_every
  c.progress_bar = False
  return c


def initial_eval_loss(c: ml_collections.ConfigDict) -> float:
  """Eval loss of the initial parameters (the same for every run of the suite)."""
  isl = island_lib.build_island(c, jax.devices()[:1])
  return evaluation.evaluate(isl.fns, isl.init_state().params, isl.data)["eval_loss"]


def row(seed: int, s: dict[str, Any], initial_loss: float, wall_s: float) -> dict[str, Any]:
  """One run's line of the table, from its summary."""
  ch = s.get("chaos", {})
  tainted = collections.Counter()
  for fates in ch.get("tainted", {}).values():
    tainted["sent"] += fates.get("sent", 0)
    tainted["caught"] += sum(n for k, n in fates.items() if k.startswith(("rejected", "refused")))
    tainted["merged"] += fates.get("merged", 0)
  return {
      "seed": seed,
      "faults": s["faults"],
      "faults_total": sum(s["faults"].values()),
      "rejected": s["rejected"],
      "crashes": ch.get("crashes", 0),
      "rejoins": s["rejoins"],
      "restarts": s["synchronizer_restarts"],
      "tainted": dict(tainted),
      "merges": s["merges"],
      "merges_lost": ch.get("merges_lost", 0),
      "eval_loss": s["eval_loss"],
      "goodput": s["goodput"],
      "uptime": s["uptime"],
      "params_ok": bool(ch.get("global_params_finite", True)) and tainted["merged"] == 0,
      "all_rejoined": bool(ch.get("every_crashed_learner_rejoined", True)),
      "advanced": s["eval_loss"] < initial_loss,
      "wall_s": wall_s,
  }


def format_table(rows: list[dict[str, Any]], initial_loss: float) -> str:
  """A markdown table: runs x fault counts by kind, rejections by reason, verdicts; totals."""
  kinds = chaos.KINDS
  header = (
      ["seed"]
      + list(kinds)
      + [
          "rejected (by reason)",
          "rejoins/crashes",
          "restarts",
          "tainted caught/sent (merged)",
          "eval loss",
          "goodput",
      ]
      + ["finite, uncorrupted", "all rejoined", "advanced"]
  )
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  yes = {True: "yes", False: "NO"}
  for r in rows:
    t = r["tainted"]
    cells = (
        [str(r["seed"])]
        + [str(r["faults"].get(k, 0)) for k in kinds]
        + [
            " ".join(f"{k}:{n}" for k, n in r["rejected"].items()) or "-",
            f"{r['rejoins']}/{r['crashes']}",
            str(r["restarts"]),
            f"{t.get('caught', 0)}/{t.get('sent', 0)} ({t.get('merged', 0)})",
            f"{r['eval_loss']:.3f}",
            f"{r['goodput']:.3f}",
        ]
        + [yes[r[v]] for v in VERDICTS]
    )
    lines.append("| " + " | ".join(cells) + " |")
  total = collections.Counter()
  for r in rows:
    total.update(r["faults"])
  lines.append("")
  lines.append(
      f"{len(rows)} runs, {sum(total.values())} faults injected ("
      + ", ".join(f"{k} {total.get(k, 0)}" for k in kinds)
      + "); initial eval loss "
      f"{initial_loss:.3f}; runs failing a verdict: "
      f"{sum(not all(r[v] for v in VERDICTS) for r in rows)}"
  )
  return "\n".join(lines)


def run(config: ml_collections.ConfigDict, workdir: str, get_base: GetConfig) -> dict[str, Any]:
  """Runs the suite, each run from `get_base(config.base)`; writes WORKDIR/chaos_suite.md and
  .json and returns the summary."""
  t0 = time.perf_counter()
  os.makedirs(workdir, exist_ok=True)
  initial = initial_eval_loss(run_config(config, config.seed0, get_base))
  rows = []
  bar = progress.bar(config.get("progress_bar", True), total=config.runs, desc="chaos suite",
                     unit="run")  # fmt: skip
  for seed in range(config.seed0, config.seed0 + config.runs):
    t = time.perf_counter()
    s = train.train_and_evaluate(
        run_config(config, seed, get_base), os.path.join(workdir, f"run{seed}")
    )
    rows.append(row(seed, s, initial, time.perf_counter() - t))
    bar.write(
        f"run {seed}: {rows[-1]['faults_total']} faults, eval loss {s['eval_loss']:.3f}, "
        f"{rows[-1]['wall_s']:.0f} s"
    )
    bar.update(1)
    bar.set_postfix(failed=sum(not all(r[v] for v in VERDICTS) for r in rows))
  bar.close()
  table = format_table(rows, initial)
  with open(os.path.join(workdir, "chaos_suite.md"), "w", encoding="utf-8") as f:
    f.write(table + "\n")
  faults = collections.Counter()
  for r in rows:
    faults.update(r["faults"])
  summary = {
      "runs": rows,
      "table": table,
      "initial_eval_loss": initial,
      "faults": dict(sorted(faults.items())),
      "faults_total": sum(faults.values()),
      "failed_runs": [r["seed"] for r in rows if not all(r[v] for v in VERDICTS)],
      "wall_s": time.perf_counter() - t0,
  }
  metrics.write_summary(workdir, summary)
  with open(os.path.join(workdir, "chaos_suite.json"), "w", encoding="utf-8") as f:
    json.dump(metrics._plain(rows), f, indent=1)
  return summary
