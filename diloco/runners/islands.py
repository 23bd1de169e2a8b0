"""mode=diloco|streaming|decoupled: M islands and a synchronizer on the virtual runtime.

The parts come from diloco/config/build.py. With a fault schedule (the `chaos` section) the runtime
is runtime/virtual_chaos.py and the summary gains a `chaos` section; learner and synchronizer
checkpoints (`outer.learner_checkpoint_every`, `outer.sync_checkpoint_every`) can also be on
without faults.
"""

import collections
import math
import os
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from diloco import metrics
from diloco.chaos import schedule as chaos
from diloco.config import build
from diloco.inner import evaluation, island as island_lib, warm_start
from diloco.outer import fragments, protocol
from diloco.outer.learner import Learner
from diloco.outer.synchronizer import Synchronizer
from diloco.runners import island_summary
from diloco.runtime import preemption, virtual, virtual_chaos, virtual_snapshot
from diloco.watch import progress, timeline


def run(
    config: ml_collections.ConfigDict, workdir: str, parts: build.Parts | None = None
) -> dict[str, Any]:
  """Trains M learners to the token budget and evaluates the synchronizer's global model.

  `parts` (from `build.local_learners(config, ...)`, the default) may be given to watch the run.
  SIGTERM/SIGINT or `stop_after_steps` stop it at an event boundary with a whole-run snapshot
  (runtime/virtual_snapshot.py), which the same command resumes from.
  """
  with preemption.stop_on_signals():
    return _run(config, workdir, parts)


def _run(
    config: ml_collections.ConfigDict, workdir: str, parts: build.Parts | None
) -> dict[str, Any]:
  o, t_wall = config.outer, time.perf_counter()
  clocks = _clocks(config)
  parts = parts or build.local_learners(config, stacked_learners=o.stack_learners)
  learners = [parts.make_learner(m) for m in range(o.learners)]
  for learner in learners:
    learner.load_global(parts.params0, [0] * o.fragments)
  sync = parts.make_sync()
  for m in range(o.learners):
    sync.handle(protocol.Join(m, 0.0, tuple([0] * o.fragments)))
  faults = build.faults(config)
  snap = None if faults else virtual_snapshot.load(workdir, config)
  recover = parts.recovery(workdir) if parts.checkpoints_on(bool(faults)) else None
  budget = config.steps * sum(parts.batches) * config.seq_len
  log = _Log(config, workdir, learners, parts.islands[0], budget, snap["extra"] if snap else None)
  stop_at = None
  if config.get("stop_after_steps", 0):  # per learner, like `step` in the logs
    stop_at = log.total_steps // o.learners + config.stop_after_steps
  args = (learners, sync, clocks, virtual.Network(config.sim.latency_s, config.sim.bandwidth_gbps))
  kwargs = dict(
      next_batch=lambda m: next(parts.islands[m].data.train_iter),
      token_budget=budget,
      overlap=o.overlap,
      blocking=o.blocking,
      on_step=log.on_step,
      on_log=log.on_log,
      recovery=recover,
      stop=lambda: preemption.stop_reason(log.total_steps // o.learners, stop_at),
  )
  if faults:
    with open(os.path.join(workdir, "chaos_schedule.txt"), "w", encoding="utf-8") as f:
      f.write(chaos.format_schedule(faults))
    runtime = log.runtime = virtual_chaos.ChaosRuntime(
        *args,
        **kwargs,
        faults=faults,
        make_sync=parts.make_sync,
        seed=config.chaos.seed,
        on_chaos=log.on_chaos,
        wait_timeout_s=o.inner_steps * config.sim.step_s,
    )
  else:
    runtime = log.runtime = virtual.VirtualRuntime(*args, **kwargs)
  iters = [parts.islands[m].data.train_iter for m in range(o.learners)]
  if snap is not None:
    virtual_snapshot.restore(runtime, iters, snap)
  sim_time = runtime.run()
  if runtime.stopped_by is not None:
    return _stopped(
        config, parts, runtime, log, iters, workdir, recover, time.perf_counter() - t_wall
    )
  runtime.finish()
  if recover is not None:
    recover.close()
  final = log.finish(sim_time)
  summary = island_summary.summary(
      config, parts, runtime, log, final, sim_time, time.perf_counter() - t_wall
  )
  summary["params_sha256"] = metrics.params_sha256(runtime.sync.global_params())
  # Each learner's protocol decisions (learner_machine): the threads runtime's must match.
  summary["learner_decisions"] = [m.digest() for m in runtime.machines]
  summary["uploads_skipped"] = sum(m.skipped for m in runtime.machines)
  like = parts.islands[0].abstract_state().params  # saved for evaluate, sample and init_from
  final_params = fragments.unflatten(runtime.sync.global_params(), like=like)
  warm_start.save_final(workdir, summary["steps"], final_params)
  if faults:
    summary.update(island_summary.chaos_summary(runtime, faults, sim_time))
  if config.get("timeline", True):
    summary["timeline"] = draw_timeline(config, runtime, log.merges, sim_time, workdir)
  virtual_snapshot.remove(workdir)
  return summary


def _stopped(config, parts, runtime, log, iters, workdir, recover, wall) -> dict[str, Any]:
  """Saves the snapshot of a run stopped early (not with faults: resumable False) and returns
  its summary: finished False, why, and where it stands."""
  resumable = not isinstance(runtime, virtual_chaos.ChaosRuntime)
  snapshot = ""
  if resumable:
    snap = virtual_snapshot.take(config, runtime, iters, log.state())
    snapshot = virtual_snapshot.save(workdir, snap)
  log.close()
  if recover is not None:
    recover.close()
  preemption.remove_orbax_tmp(workdir)
  m_count, learners, sync = config.outer.learners, log.learners, runtime.sync
  tokens = sum(l.tokens for l in learners)
  return {
      "mode": config.mode,
      "runtime": "virtual",
      "learners": m_count,
      "finished": False,
      "stopped_by": runtime.stopped_by,
      "resumable": resumable,
      "snapshot": snapshot,
      "step": log.total_steps // m_count,
      "steps": max(l.steps for l in learners),
      "tokens": tokens,
      "params": parts.islands[0].param_count,
      "flops_per_token": parts.islands[0].flops_per_token,
      "merges": len(log.merges),
      "sim_time_s": runtime.now,
      "wall_s": wall,
      "tokens_per_s": tokens / wall,
      "params_sha256": (  # None: with faults, the synchronizer was down at the stop
          metrics.params_sha256(sync.global_params()) if sync is not None else None
      ),
  }


def draw_timeline(config, runtime, merges: list[dict], sim_time: float, workdir: str) -> str:
  """WORKDIR/timeline.png of a finished run (diloco/watch/timeline.py), with its crashes and
  synchronizer restarts when it had faults."""
  o, stats = config.outer, getattr(runtime, "stats", None)
  crashes = stats.crashes if stats is not None else []
  restarts = stats.restarts if stats is not None else []
  return timeline.draw(
      os.path.join(workdir, "timeline.png"),
      runtime.trace,
      merges,
      sim_time,
      island_summary.merge_period_s(config),
      o.fragments,
      down=[(c["learner"], c["time"], c["rejoined"] or sim_time) for c in crashes],
      sync_down=[(r["time"], min(r["back"], sim_time)) for r in restarts],
      title=f"mode={config.mode}, M={o.learners}, speeds {config.sim.speeds or 'all 1'}",
  )


def _clocks(config: ml_collections.ConfigDict) -> list[virtual.LearnerClock]:
  """Each learner's simulated clock: step time by speed and batch, seeded jitter, start time."""
  sim, m_count = config.sim, config.outer.learners
  batches = build.batch_sizes(config)
  speeds = build.parse_list(sim.speeds, m_count, float, 1.0, "sim.speeds")
  starts = build.parse_list(sim.start_times, m_count, float, 0.0, "sim.start_times")
  if any(s <= 0 for s in speeds):
    raise ValueError(f"sim.speeds must be positive, got {sim.speeds!r}")
  return [
      virtual.LearnerClock(
          step_s=sim.step_s * speeds[m] * batches[m] / config.batch_size,
          rng=np.random.default_rng([config.seed, m]),
          jitter=sim.step_jitter,
          start_s=starts[m],
      )
      for m in range(m_count)
  ]


class _Log:
  """What a run writes (learner rows, evaluations, synchronizer and chaos records) and keeps."""

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      workdir: str,
      learners: list[Learner],
      isl: island_lib.Island,
      token_budget: int,
      resume: dict[str, Any] | None = None,
  ):
    """`resume`: a `state()` of a stopped run, to go on from."""
    self.config, self.learners, self.island = config, learners, isl
    self.m_count = len(learners)
    self.writer = metrics.MetricsWriter.for_run(
        config, workdir, resume_bytes=resume and resume["position"]
    )
    self.merges: list[dict] = []
    self.evals: list[dict] = []
    self.rejected: collections.Counter = collections.Counter()
    self.total_steps = 0
    self.pending: list[tuple | None] = [None] * self.m_count
    if resume is not None:
      for k in ("merges", "evals", "rejected", "total_steps", "pending"):
        setattr(self, k, resume[k])
    self.eval_every = config.eval_every * self.m_count
    self.runtime: virtual.VirtualRuntime | None = None
    self.bar = progress.bar(
        config.progress_bar, total=token_budget, desc=config.mode, unit="tok", unit_scale=True
    )
    self.show = progress.Throttle()
    if resume is not None:
      self.bar.update(resume["tokens"])

  def state(self) -> dict[str, Any]:
    """What a resumed run's log starts from: its records, counters and the metrics file's
    length (the learner rows still pending with their metrics on the host)."""
    pending = [
        None if p is None else (p[0], virtual_snapshot.host_metrics(p[1]), p[2])
        for p in self.pending
    ]
    return {
        "position": self.writer.position(),
        "merges": self.merges,
        "evals": self.evals,
        "rejected": self.rejected,
        "total_steps": self.total_steps,
        "pending": pending,
        "tokens": sum(l.tokens for l in self.learners),
    }

  def close(self) -> None:
    self.writer.close()
    self.bar.close()

  def evaluate(self, sim_time: float, final: bool = False) -> dict[str, float] | None:
    """Evaluates the synchronizer's global model and logs the row (`model: global`). `final`:
    the run's last evaluation, after every merge. An evaluation due at the last inner step runs
    before the last uploads are merged, at the same `step`: its row says `final: false`."""
    if self.runtime.sync is None:  # down: nothing to evaluate until it restarts
      return None
    row = evaluate_global(self.island, self.runtime.sync, final)
    row.update(
        step=self.total_steps // self.m_count,
        sim_time_s=sim_time,
        tokens=sum(l.tokens for l in self.learners),
    )
    self.writer.write({**row, "model": "global", "final": final})
    self.evals.append(row)
    return row

  def on_step(self, m: int, learner: Learner, device_metrics, now: float) -> None:
    prev, self.pending[m] = self.pending[m], (learner.steps, device_metrics, now)
    if prev is not None:
      _log_learner(self.writer, self.config, m, learner, *prev)
    self.total_steps += 1
    self.bar.update(learner.tokens_per_step)
    if self.show():
      steps = [l.steps for l in self.learners]
      self.bar.set_postfix(progress.learners_postfix(now, len(self.merges), steps), refresh=False)
    if self.total_steps % self.eval_every == 0:
      self.evaluate(now)

  def on_log(self, record: dict) -> None:
    if record["event"] == "merge":
      self.merges.append(record)
    elif record["event"] == "reject":
      self.rejected[record["code"]] += 1
    self.writer.write({"step": self.total_steps // self.m_count, **record}, prefix="sync/")

  def on_chaos(self, record: dict) -> None:
    self.writer.write({"step": self.total_steps // self.m_count, **record}, prefix="chaos/")

  def finish(self, sim_time: float) -> dict[str, float]:
    """Writes the last learner rows and the final evaluation; closes the writer."""
    for m, prev in enumerate(self.pending):
      if prev is not None:
        _log_learner(self.writer, self.config, m, self.learners[m], *prev, force=True)
    final = self.evaluate(sim_time, final=True)
    self.close()
    return final


def _log_learner(writer, config, m, learner, step, device_metrics, now, force=False):
  if step % config.log_every and not force:
    return
  mx = jax.device_get(dict(device_metrics))  # a stacked learner's step runs now if queued
  loss = float(mx["loss"])
  if not math.isfinite(loss):
    raise FloatingPointError(f"learner {m}: loss is {loss} at step {step}; stopping")
  writer.write(
      {
          "step": step,
          "learner": m,
          "loss": loss,
          "lr": float(mx["lr"]),
          "sim_time_s": now,
          "tokens": learner.tokens,
          **metrics.aux_terms(mx),
      },
      prefix=f"learner{m}/",
  )


def evaluate_global(
    isl: island_lib.Island, sync: Synchronizer, final: bool = False
) -> dict[str, float]:
  """Eval loss and bits per byte of the synchronizer's global parameters, on one island (`final`:
  on the final evaluation's records)."""
  flat = sync.global_params()
  shardings = fragments.flatten(isl.fns.state_shardings.params)
  placed = {k: jax.device_put(flat[k], shardings[k]) for k in shardings}
  like = isl.abstract_state().params
  return evaluation.evaluate(isl.fns, fragments.unflatten(placed, like=like), isl.data, final)
