"""What a multi-learner run on the virtual runtime writes and watches, each concern apart:

- `RunLog` writes: learner rows (every `log_every` steps), synchronizer and chaos records, the
  progress bar; it keeps the merges, rejections and step counts the summary reads;
- `GlobalEvals` evaluates the synchronizer's global model every `eval_every` steps of each learner
  and once at the end, on the run's one evaluation set;
- `stop_if_diverged` is the NaN stop: a logged learner loss that is not finite ends the run.
"""

import collections
import functools
import math
import time
from typing import Any

import jax
import ml_collections

from diloco import metrics
from diloco.harness import during
from diloco.inner import evaluation, island as island_lib
from diloco.outer import fragments
from diloco.outer.learner.learner import Learner
from diloco.outer.sync.synchronizer import Synchronizer
from diloco.plan import peak
from diloco.runtime import virtual_snapshot
from diloco.watch import progress


class RunLog:
  """What a run writes (learner rows, synchronizer and chaos records) and keeps."""

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      workdir: str,
      learners: list[Learner],
      token_budget: int,
      resume: dict[str, Any] | None = None,
      flops_per_token: float = 0.0,
  ):
    """`resume`: a `state()` of a stopped run, to go on from. `flops_per_token`: rows then carry
    the run's wall-clock tokens/s per chip and MFU, all learners together (plan/peak.py)."""
    self.config, self.learners = config, learners
    self.flops_per_token = flops_per_token
    self.wall0: tuple[float, int] | None = None  # (wall clock, tokens) at the first step
    self.m_count = len(learners)
    self.writer = metrics.MetricsWriter.for_run(
        config, workdir, resume_bytes=resume and resume["position"]
    )
    self.merges: list[dict] = []
    self.rejected: collections.Counter = collections.Counter()
    self.total_steps = 0
    self.pending: list[tuple | None] = [None] * self.m_count
    if resume is not None:
      for k in ("merges", "rejected", "total_steps", "pending"):
        setattr(self, k, resume[k])
    self.bar = progress.bar(
        config.progress_bar, total=token_budget, desc=config.mode, unit="tok", unit_scale=True
    )
    self.show = progress.Throttle()
    if resume is not None:
      self.bar.update(resume["tokens"])

  @property
  def step(self) -> int:
    """Steps per learner so far (what rows call `step`)."""
    return self.total_steps // self.m_count

  @property
  def tokens(self) -> int:
    return sum(l.tokens for l in self.learners)

  def state(self) -> dict[str, Any]:
    """What a resumed run's log starts from: its records, counters and the metrics file's
    length (the learner rows still pending with their metrics on the host)."""
    pending = [
        None if p is None else (p[0], virtual_snapshot.host_metrics(p[1]), p[2])
        for p in self.pending
    ]
    self.writer.sync()  # (a bucket's file holds every row up to the position saved)
    return {
        "position": self.writer.position(),
        "merges": self.merges,
        "rejected": self.rejected,
        "total_steps": self.total_steps,
        "pending": pending,
        "tokens": self.tokens,
    }

  def close(self) -> None:
    self.writer.close()
    self.bar.close()

  def on_step(self, m: int, learner: Learner, device_metrics, now: float) -> dict | None:
    """Learner m took a step; writes the row of its previous one if due (returned)."""
    prev, self.pending[m] = self.pending[m], (learner.steps, device_metrics, now)
    if self.wall0 is None:  # from the first step on: compiling the step is not counted
      self.wall0 = (time.perf_counter(), self.tokens)
    row = None
    if prev is not None:
      row = _learner_row(self.writer, self.config, m, learner, *prev, extra=self.utilisation)
    self.total_steps += 1
    self.bar.update(learner.tokens_per_step)
    if self.show():
      steps = [l.steps for l in self.learners]
      self.bar.set_postfix(progress.learners_postfix(now, len(self.merges), steps), refresh=False)
    return row

  def flush(self) -> list[tuple[int, dict]]:
    """Writes every learner's last row; (learner, row) of each."""
    return [
        (
            m,
            _learner_row(
                self.writer, self.config, m, self.learners[m], *prev, True, self.utilisation
            ),
        )
        for m, prev in enumerate(self.pending)
        if prev is not None
    ]

  def utilisation(self) -> dict[str, Any]:
    """The run's wall-clock tokens/s, per chip, and MFU since its first step, all learners."""
    if not self.flops_per_token or self.wall0 is None:
      return {}
    wall = time.perf_counter() - self.wall0[0]
    if wall <= 0:
      return {}
    rate = (self.tokens - self.wall0[1]) / wall
    u = self.meter(rate, self.flops_per_token)
    return {
        "tokens_per_s": rate,
        "tokens_per_s_per_chip": u["tokens_per_s_per_chip"],
        "mfu": u["mfu"],
    }

  @functools.cached_property
  def meter(self) -> peak.Meter:
    return peak.Meter(jax.devices())

  def on_log(self, record: dict) -> None:
    if record["event"] == "merge":
      self.merges.append(record)
    elif record["event"] == "reject":
      self.rejected[record["code"]] += 1
    self.writer.write({"step": self.step, **record}, prefix="sync/")

  def on_chaos(self, record: dict) -> None:
    self.writer.write({"step": self.step, **record}, prefix="chaos/")


def _learner_row(writer, config, m, learner, step, device_metrics, now, force=False, extra=None):
  """Writes learner m's row of `step` if it is a logged step (or `force`); the row or None.
  `extra()`: more keys of the row (the run's throughput)."""
  if step % config.log_every and not force:
    return None
  mx = jax.device_get(dict(device_metrics))  # a stacked learner's step runs now if queued
  row = {
      "step": step,
      "learner": m,
      "loss": float(mx["loss"]),
      "lr": float(mx["lr"]),
      "sim_time_s": now,
      "tokens": learner.tokens,
      **metrics.aux_terms(mx),
      **(extra() if extra else {}),
  }
  writer.write(row, prefix=f"learner{m}/")
  return row


def stop_if_diverged(m: int, row: dict | None) -> None:
  """The NaN stop: FloatingPointError if learner m's logged loss is not finite."""
  if row is not None and not math.isfinite(row["loss"]):
    raise FloatingPointError(f"learner {m}: loss is {row['loss']} at step {row['step']}; stopping")


class GlobalEvals:
  """Evaluations of the synchronizer's global model: every `eval_every` steps of each learner,
  and the final one; `rows` keeps them."""

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      isl: island_lib.Island,
      writer: metrics.MetricsWriter,
      rows: list[dict] | None = None,
  ):
    self.island, self.writer, self.rows = isl, writer, list(rows or [])
    self.every = config.eval_every * config.outer.learners
    self.harness = during.make(config, isl)

  def due(self, total_steps: int) -> bool:
    return total_steps % self.every == 0

  def evaluate(
      self, sync: Synchronizer | None, step: int, sim_time: float, tokens: int, final=False
  ) -> dict[str, float] | None:
    """Evaluates the global model and logs the row (`model: global`). `final`: the run's last
    evaluation, after every merge. An evaluation due at the last inner step runs before the
    last uploads are merged, at the same `step`: its row says `final: false`."""
    if sync is None:  # down: nothing to evaluate until it restarts
      return None
    params = global_params(self.island, sync)
    row = evaluation.evaluate(self.island.fns, params, self.island.data, final)
    if self.harness is not None and self.harness.due(final):
      row.update(self.harness.scores(params))
    row.update(step=step, sim_time_s=sim_time, tokens=tokens)
    self.writer.write({**row, "model": "global", "final": final})
    self.rows.append(row)
    return row


def global_params(isl: island_lib.Island, sync: Synchronizer) -> Any:
  """The synchronizer's global parameters, placed on one island's shardings."""
  flat = sync.global_params()
  like = isl.abstract_state().params
  shapes = fragments.flatten(like)  # carrying the shardings (a stacked leaf's views: their own)
  placed = {k: jax.device_put(flat[k], shapes[k].sharding) for k in shapes}
  return fragments.unflatten(placed, like=like)
