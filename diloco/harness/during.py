"""Harness tasks during training (`eval.harness_tasks`): at the final evaluation, and at every
`eval.harness_every`-th evaluation before it, on the model that evaluation scores (a data-parallel
run's parameters; the synchronizer's global ones for runs of several learners). Their scores join
the evaluation's row (metrics.jsonl and the trackers) and, at the end, the summary."""

from __future__ import annotations

from typing import Any

import ml_collections

from diloco.harness import tasks as tasks_lib


class HarnessEvals:
  """The run's harness tasks, resolved once, scored on an island's model when due."""

  def __init__(self, config: ml_collections.ConfigDict, island):
    from diloco.data import pipeline

    e = config.eval
    self.task_list = tasks_lib.resolve(e.harness_tasks)
    self.every, self.limit = e.harness_every, e.harness_limit or None
    self.island, self.window = island, config.seq_len
    self.tokenizer = pipeline.load_splits(config.data).tokenizer
    self.evaluations = 0

  def due(self, final: bool) -> bool:
    """Counts an evaluation; whether the tasks run at it."""
    self.evaluations += 1
    return final or (self.every > 0 and self.evaluations % self.every == 0)

  def scores(self, params: Any) -> dict[str, Any]:
    """The row's harness columns for `params` (placed on the island's shardings)."""
    from diloco.harness import model, records

    fns = self.island.fns
    lm = model.JaxLM(fns.graphdef, params, self.tokenizer, self.window, fns.mesh)
    found = tasks_lib.scores(tasks_lib.run(lm, self.task_list, limit=self.limit))
    return {
        **records.columns(found, lm.stats.padding),
        **({"harness_truncated": lm.stats.truncated} if lm.stats.truncated else {}),
    }


def make(config: ml_collections.ConfigDict, island) -> HarnessEvals | None:
  """The run's harness evaluations, or None when `eval.harness_tasks` is empty."""
  e = config.get("eval")
  if e is None or not e.harness_tasks:
    return None
  import jax

  if jax.process_count() > 1:  # (each process would score the whole batch as its own slice)
    raise ValueError(
        "eval.harness_tasks scores on one process's island; this run spans "
        f"{jax.process_count()} processes: score its parameters afterwards with "
        "`python -m experiments.evaluate --tasks`"
    )
  return HarnessEvals(config, island)
