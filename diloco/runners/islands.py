"""mode=diloco|streaming|decoupled: M islands and a synchronizer on the virtual runtime.

The parts come from diloco/config/build.py. With a fault schedule (the `chaos` section) the runtime
acts it out through its fault component, runtime/virtual_chaos.py's `Chaos`, and the summary gains
a `chaos` section; learner and synchronizer checkpoints (`outer.learner_checkpoint_every`,
`outer.sync_checkpoint_every`) can also be on without faults.
"""

import time
from typing import Any

import ml_collections
import numpy as np

from diloco import paths
from diloco import metrics
from diloco.chaos import schedule as chaos
from diloco.config import build
from diloco.data.corpus import mixture
from diloco.inner import warm_start
from diloco.outer import fragments, protocol
from diloco.runners import island_log, island_summary
from diloco.runtime import preemption, virtual, virtual_chaos, virtual_snapshot
from diloco.watch import timeline


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
  made = build.virtual_run(config, parts)
  parts, learners, sync, faults = made.parts, made.learners, made.sync, made.faults
  clocks = _clocks(config, made.clocks)
  for m in range(o.learners):
    if clocks[m].joined:  # (one that starts late joins when it starts)
      sync.handle(protocol.Join(m, 0.0, tuple([0] * o.fragments)))
  digest = preemption.config_digest(config)  # names the run's snapshot
  snap = None if faults else virtual_snapshot.load(workdir, digest)
  recover = parts.recovery(workdir) if parts.checkpoints_on(bool(faults)) else None
  budget = config.steps * sum(parts.batches) * config.seq_len
  resume = snap["extra"] if snap else None
  per_token = parts.islands[0].flops_per_token
  log = island_log.RunLog(config, workdir, learners, budget, resume, flops_per_token=per_token)
  evals = island_log.GlobalEvals(config, parts.islands[0], log.writer, resume and resume["evals"])

  def on_step(m: int, learner, device_metrics, now: float) -> None:
    island_log.stop_if_diverged(m, log.on_step(m, learner, device_metrics, now))
    if evals.due(log.total_steps):
      evals.evaluate(runtime.sync, log.step, now, log.tokens)

  if faults:
    paths.write_text(paths.join(workdir, "chaos_schedule.txt"), chaos.format_schedule(faults))
  runtime = _runtime(config, parts, learners, sync, clocks, faults, log, on_step, recover, budget)
  iters = [parts.islands[m].data.train_iter for m in range(o.learners)]
  if snap is not None:
    virtual_snapshot.restore(runtime, iters, snap)
  try:
    sim_time = runtime.run()
  except BaseException:
    log.close()  # the rows so far (a bucket's wait in memory for their upload)
    raise
  if runtime.stopped_by is not None:
    snap = {**log.state(), "evals": evals.rows}
    return _stopped(config, parts, runtime, log, iters, workdir, recover, snap, t_wall, digest)
  runtime.finish()
  if recover is not None:
    recover.close()
  for m, row in log.flush():
    island_log.stop_if_diverged(m, row)
  final = evals.evaluate(runtime.sync, log.step, sim_time, log.tokens, final=True)
  log.close()
  summary = island_summary.summary(
      config, parts, runtime, log, evals.rows, final, sim_time, time.perf_counter() - t_wall
  )
  summary["params_sha256"] = metrics.params_sha256(runtime.sync.global_params())
  # Each learner's protocol decisions (learner_machine): the threads runtime's must match.
  summary["learner_decisions"] = [m.digest() for m in runtime.machines]
  summary["uploads_skipped"] = sum(m.skipped for m in runtime.machines)
  counts = mixture.read_tokens(iters)  # (None unless data.source=corpus)
  if counts is not None:
    summary["corpus_tokens"] = counts
  like = parts.islands[0].abstract_state().params  # saved for evaluate, sample and init_from
  final_params = fragments.unflatten(runtime.sync.global_params(), like=like)
  warm_start.save_final(workdir, summary["steps"], final_params)
  if faults:
    summary.update(island_summary.chaos_summary(runtime, faults, sim_time))
  if config.get("timeline", True):
    shares = [r["merged_share"] for r in summary["per_learner"]]
    summary["timeline"] = draw_timeline(config, runtime, log.merges, sim_time, workdir, shares)
  virtual_snapshot.remove(workdir)
  return summary


def _runtime(config, parts, learners, sync, clocks, faults, log, on_step, recover, budget):
  """The virtual runtime of the run (with its fault schedule, a `virtual_chaos.Chaos` in it)."""
  o = config.outer
  stop_at = None
  if config.get("stop_after_steps", 0):  # per learner, like `step` in the logs
    stop_at = log.step + config.stop_after_steps
  net = virtual.Network(config.sim.latency_s, config.sim.bandwidth_gbps)
  args = (learners, sync, clocks, net)
  kwargs = dict(
      next_batch=lambda m: next(parts.islands[m].data.train_iter),
      token_budget=budget,
      overlap=o.overlap,
      blocking=o.blocking,
      on_step=on_step,
      on_log=log.on_log,
      recovery=recover,
      stop=lambda: preemption.stop_reason(log.step, stop_at),
      time_limit_s=float(config.sim.get("time_limit_s", 0.0)),
  )
  if faults:
    kwargs["faults"] = virtual_chaos.Chaos(
        faults,
        make_sync=parts.make_sync,
        seed=config.chaos.seed,
        on_chaos=log.on_chaos,
        wait_timeout_s=o.inner_steps * config.sim.step_s,
    )
  return virtual.VirtualRuntime(*args, **kwargs)


def _stopped(config, parts, runtime, log, iters, workdir, recover, state, t_wall, digest) -> dict:
  """Saves the snapshot of a run stopped early (`state`: the runner's; `digest`: its config's,
  naming the snapshot; not with faults: resumable False) and returns its summary: finished False,
  why, and where it stands."""
  wall = time.perf_counter() - t_wall
  resumable = not isinstance(runtime.faults, virtual_chaos.Chaos)
  snapshot = ""
  if resumable:
    snap = virtual_snapshot.take(digest, runtime, iters, state)
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


def draw_timeline(
    config, runtime, merges: list[dict], sim_time: float, workdir: str, shares=()
) -> str:
  """WORKDIR/timeline.png of a finished run (diloco/watch/timeline.py), with its crashes and
  synchronizer restarts when it had faults."""
  o, stats = config.outer, getattr(runtime.faults, "stats", None)
  crashes = stats.crashes if stats is not None else []
  restarts = stats.restarts if stats is not None else []
  return timeline.draw(
      paths.join(workdir, "timeline.png"),
      runtime.trace,
      merges,
      sim_time,
      island_summary.merge_period_s(config),
      o.fragments,
      down=[(c["learner"], c["time"], c["rejoined"] or sim_time) for c in crashes],
      sync_down=[(r["time"], min(r["back"], sim_time)) for r in restarts],
      title=f"mode={config.mode}, M={o.learners}, speeds {config.sim.speeds or 'all 1'}",
      shares=shares,
  )


def _clocks(
    config: ml_collections.ConfigDict, clocks: list[build.Clock]
) -> list[virtual.LearnerClock]:
  """Each learner's simulated clock (`build.clocks`), with its seeded jitter."""
  return [
      virtual.LearnerClock(
          step_s=c.step_s,
          rng=np.random.default_rng([config.seed, m]),
          jitter=config.sim.step_jitter,
          start_s=c.start_s,
          stop_s=c.stop_s,
          joined=c.start_s <= 0,
      )
      for m, c in enumerate(clocks)
  ]
