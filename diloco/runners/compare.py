"""mode=compare: data-parallel, synchronous DiLoCo and Decoupled DiLoCo on one token budget.

Each run goes to WORKDIR/<mode>/ through the same train_and_evaluate; the comparison is printed
as a table and drawn as WORKDIR/compare.png (eval loss against simulated time).

Data-parallel has no simulated clock of its own: it is placed on the same islands, so each of its
steps takes as long as the slowest island's (sim.step_s · max(speeds)), with no communication time
counted; its bytes per token are those of a ring all-reduce.
"""

import json
import math
from collections.abc import Callable
from typing import Any

import ml_collections

from diloco import paths
from diloco import metrics
from diloco.config import build, resolve
from diloco.runners import island_summary
from diloco.runtime import preemption
from diloco.watch import progress


def on_the_islands_clock(
    summary: dict[str, Any], config: ml_collections.ConfigDict, workdir: str
) -> None:
  """Places a run without a simulated clock of its own (data-parallel) on the islands' clock:
  each step takes as long as the slowest island's, and it sends what a ring all-reduce does."""
  speeds = build.parse_list(config.sim.speeds, config.outer.learners, float, 1.0, "sim.speeds")
  step_s = config.sim.step_s * max(speeds)
  summary["sim_time_s"] = summary["steps"] * step_s
  summary["eval_curve"] = [
      {"sim_time_s": r["step"] * step_s, "eval_loss": r["eval_loss"]} for r in _eval_rows(workdir)
  ]
  m = config.outer.learners
  summary["dp_bytes_per_token"] = island_summary.dp_bytes_per_token(
      summary["params"], m, config.batch_size * m * config.seq_len
  )
  summary["bytes_per_token"] = summary["dp_bytes_per_token"]
  summary["goodput"] = 1.0 / max(speeds) * sum(speeds) / len(speeds)


def run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    train: Callable[[ml_collections.ConfigDict, str], dict[str, Any]],
) -> dict[str, Any]:
  """Trains every mode of `compare.modes` with `train` into WORKDIR/<mode>; table and plot.

  A mode that stops early (a signal, `stop_after_steps`) stops the comparison there: the next
  mode does not start. The same command resumes: a mode whose directory holds a finished
  summary of the same config is not run again.
  """
  with preemption.stop_on_signals():
    return _run(config, workdir, train)


def _run(config, workdir, train) -> dict[str, Any]:
  rows, runs = {}, resolve.compare_runs(config)
  modes = list(runs)
  bar = progress.bar(config.progress_bar, total=len(modes), desc="compare", unit="mode")
  for mode in modes:
    if preemption.requested():
      return _stopped(rows, preemption.SIGNAL, mode, bar)
    bar.set_postfix(progress.modes_postfix(modes, len(rows)))
    sub_dir, sub = paths.join(workdir, mode), runs[mode]
    summary = _finished_summary(sub, sub_dir) or train(sub, sub_dir)
    rows[mode] = summary
    if not summary.get("finished", True):
      return _stopped(rows, summary.get("stopped_by"), mode, bar)
    if summary["runtime"] != "virtual":
      on_the_islands_clock(summary, config, sub_dir)
    bar.update(1)
  bar.set_postfix(progress.modes_postfix(modes, len(rows)))
  bar.close()
  table = format_table(rows)
  print(table, flush=True)
  plot_path = plot(rows, paths.join(workdir, "compare.png"))
  first = next(iter(rows.values()))
  return {
      "mode": "compare",
      "finished": True,
      "runs": rows,
      "table": table,
      "plot": plot_path,
      "tokens": first["tokens"],
      "params": first["params"],
      "flops_per_token": first["flops_per_token"],
      "wall_s": sum(r["wall_s"] for r in rows.values()),
  }


def _finished_summary(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any] | None:
  """The summary of a finished run of this config in `workdir` (an earlier invocation's)."""
  files = [paths.join(workdir, f) for f in (metrics.SUMMARY_FILE, "config.json")]
  if not all(paths.exists(p) for p in files):
    return None
  summary = json.loads(paths.read_text(files[0]))
  done = preemption.json_digest(json.loads(paths.read_text(files[1])))
  if summary.get("finished") and done == preemption.config_digest(config):
    return summary
  return None


def _stopped(rows: dict[str, dict], stopped_by: str | None, mode: str, bar) -> dict[str, Any]:
  """The summary of a comparison stopped in (or before) `mode`."""
  bar.close()
  return {
      "mode": "compare",
      "finished": False,
      "stopped_by": stopped_by,
      "stopped_in": mode,
      "runs": rows,
      "wall_s": sum(r["wall_s"] for r in rows.values()),
  }


def _eval_rows(workdir: str) -> list[dict]:
  return [
      r for r in metrics.read_jsonl(paths.join(workdir, metrics.METRICS_FILE)) if "eval_loss" in r
  ]


def format_table(rows: dict[str, dict]) -> str:
  """One line per mode: bits per byte for text, held-out accuracy for images, and each harness
  task's headline metric with its standard error (eval.harness_tasks) where every run has it."""
  key = "eval_bpb" if all("eval_bpb" in r for r in rows.values()) else "eval_accuracy"
  name = "eval bpb" if key == "eval_bpb" else "accuracy"
  tasks = [
      k
      for k in next(iter(rows.values()), {})
      if k.startswith("harness/")
      and not k.endswith("_stderr")
      and all(k in r for r in rows.values())
  ]
  heads = [k.removeprefix("harness/").replace("/", " ") for k in tasks]
  header = f"{'mode':<10} {name:>9} {'sim time s':>11} {'goodput':>8} {'bytes/token':>12}"
  header += "".join(f" {h:>{max(len(h), 15)}}" for h in heads)
  lines = [header, "-" * len(header)]
  for mode, r in rows.items():
    cells = "".join(
        f" {_with_stderr(r[k], r.get(k + '_stderr', math.nan)):>{max(len(h), 15)}}"
        for k, h in zip(tasks, heads)
    )
    lines.append(
        f"{mode:<10} {r[key]:>9.3f} {r.get('sim_time_s', 0):>11.0f}"
        f" {r.get('goodput', 1.0):>8.3f} {r.get('bytes_per_token', 0):>12.2f}{cells}"
    )
  return "\n".join(lines)


def _with_stderr(value: float, stderr: float) -> str:
  return f"{value:.3f} ±{stderr:.3f}"


def plot(rows: dict[str, dict], path: str) -> str:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for mode, r in rows.items():
    curve = r.get("eval_curve", [])
    ax.plot(
        [c["sim_time_s"] for c in curve], [c["eval_loss"] for c in curve], marker="o", label=mode
    )
  ax.set_xlabel("simulated time (s)")
  ax.set_ylabel("eval loss (nats)")
  ax.set_title("Shakespeare, same token budget")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  with paths.writing(path, "wb") as f:
    fig.savefig(f, dpi=120, format="png")
  plt.close(fig)
  return path
