"""mode=dp: one island trains with SPMD data parallelism over all its devices."""

import functools
import math
import time
from typing import Any

import jax
import ml_collections
import tqdm

from diloco import metrics, paths
from diloco.data.corpus import mixture
from diloco.harness import during
from diloco.inner import checkpoint, evaluation, island as island_lib, step as step_lib
from diloco.outer import fragments
from diloco.plan import peak
from diloco.rpc import multihost
from diloco.runtime import preemption


class StepLogger:
  """Fetches a step's metrics one step late, stops on a non-finite loss, logs and shows them."""

  def __init__(
      self,
      config: ml_collections.ConfigDict,
      writer: metrics.MetricsWriter,
      ckpt: checkpoint.Checkpointer,
      start: int,
      flops_per_token: float = 0.0,
  ):
    self.config, self.writer, self.ckpt = config, writer, ckpt
    self.flops_per_token = flops_per_token
    self.tokens_per_step = config.batch_size * config.seq_len
    self.t_start = time.perf_counter()
    self.t_steady: float | None = None  # after the first fetched step (compilation excluded)
    self.steady_from = start
    self.first_loss: float | None = None
    self.pending = None  # (step, metrics still on device)
    show = config.progress_bar and jax.process_index() == 0
    self.bar = tqdm.tqdm(
        total=config.steps, initial=start, disable=not show, unit="step", dynamic_ncols=True
    )

  def push(self, step: int, device_metrics) -> None:
    """Records this step's metrics and fetches the previous step's."""
    self.flush()
    self.pending = (step, device_metrics)
    self.bar.update(1)

  def flush(self) -> None:
    """Fetches the pending step's metrics now (before saving or evaluating its state)."""
    if self.pending is None:
      return
    step, device_metrics = self.pending
    self.pending = None
    m = jax.device_get(device_metrics)
    loss = float(m["loss"])
    if not math.isfinite(loss):
      raise FloatingPointError(
          f"loss is {loss} at step {step}; stopping (last checkpoint: step"
          f" {self.ckpt.latest_step()}). Lower optimizer.lr or check the data."
      )
    self.first_loss = loss if self.first_loss is None else self.first_loss
    now = time.perf_counter()
    if self.t_steady is None:
      self.t_steady, self.steady_from = now, step
    rate = self.tokens_per_s(step, now)
    if step % self.config.log_every == 0 or step == self.config.steps:
      self.writer.write(
          {
              "step": step,
              "tokens": step * self.tokens_per_step,
              "loss": loss,
              "lr": float(m["lr"]),
              "grad_norm": float(m["grad_norm"]),
              **metrics.aux_terms(m),
              "tokens_per_s": rate,
              **self.utilisation(rate),
              "wall_s": now - self.t_start,
          }
      )
    self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}", refresh=False)

  def utilisation(self, rate: float) -> dict[str, Any]:
    """The row's tokens/s per chip and MFU (none before a steady rate or without FLOPs)."""
    if not self.flops_per_token or rate != rate:
      return {}
    u = self.meter(rate, self.flops_per_token)
    return {"tokens_per_s_per_chip": u["tokens_per_s_per_chip"], "mfu": u["mfu"]}

  @functools.cached_property
  def meter(self) -> peak.Meter:
    return peak.Meter(jax.devices())

  def tokens_per_s(self, step: int, now: float | None = None) -> float:
    if self.t_steady is None:
      return float("nan")
    now = time.perf_counter() if now is None else now
    return (step - self.steady_from) * self.tokens_per_step / max(now - self.t_steady, 1e-9)

  def close(self) -> None:
    self.flush()
    self.bar.close()


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains config.steps inner steps, resuming from `workdir` when it holds a checkpoint; stops
  early with a checkpoint on SIGTERM/SIGINT or after `stop_after_steps` (runtime/preemption.py)."""
  with preemption.stop_on_signals():
    return _run(config, workdir)


def _run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  island = island_lib.build_island(config, jax.devices())
  fns, data = island.fns, island.data
  ckpt = checkpoint.Checkpointer(paths.join(workdir, "checkpoints"), config.checkpoint_every)
  state, start = island.restore_or_init(ckpt)
  harness = during.make(config, island)  # (before anything is written)
  writer = metrics.MetricsWriter.for_run(config, workdir, resume_step=start if start else None)
  logger = StepLogger(config, writer, ckpt, start, island.flops_per_token)
  stop_at = start + config.stop_after_steps if config.get("stop_after_steps", 0) else None
  last, stopped_by = start, None
  eval_row: dict[str, Any] = {}
  try:
    for step in range(start + 1, config.steps + 1):
      state, device_metrics = fns.train(state, step_lib.put_batch(next(data.train_iter), fns.mesh))
      logger.push(step, device_metrics)
      last, stopped_by = step, preemption.stop_reason(step, stop_at)
      stopping = stopped_by is not None and step < config.steps
      due_eval = step % config.eval_every == 0 or step == config.steps
      due_ckpt = step % config.checkpoint_every == 0 or step == config.steps or stopping
      if due_eval or due_ckpt:
        logger.flush()  # never save or evaluate a state that went non-finite
      if due_eval:
        final = step == config.steps  # the one model, at the run's last step
        eval_row = evaluation.evaluate(fns, state.params, data, final)
        if harness is not None and harness.due(final):
          eval_row.update(harness.scores(state.params))
        tokens = step * logger.tokens_per_step
        writer.write(
            {"step": step, "tokens": tokens, **eval_row, "model": "global", "final": final}
        )
      if due_ckpt:
        ckpt.save(step, state, data.train_iter, force=step == config.steps or stopping)
        writer.sync()  # (a bucket's metrics hold the rows up to a checkpoint a resume starts at)
      if stopping:
        break
  except BaseException:
    writer.close()  # the rows so far (a bucket's wait in memory for their upload)
    raise
  stopped_by = stopped_by if last < config.steps else None
  logger.close()
  ckpt.close()  # waits for the saves in flight
  writer.close()
  if stopped_by is not None:
    preemption.remove_orbax_tmp(workdir)
  if not eval_row and stopped_by != preemption.SIGNAL:  # resumed at the final step: evaluate
    final = last == config.steps
    eval_row = evaluation.evaluate(fns, state.params, data, final)  # what was restored
  counts = _corpus_tokens(data.train_iter)
  return {
      "mode": config.mode,
      "runtime": "spmd",
      "steps": last,
      "finished": last == config.steps,
      **({"stopped_by": stopped_by} if stopped_by else {}),
      "tokens": last * logger.tokens_per_step,
      "resumed_from_step": start,
      "checkpoint_failures": ckpt.failed_saves,
      # the save of the run's last step (or of its stop) failed: a rerun repeats those steps
      "final_checkpoint_failed": bool(ckpt.failed_steps) and ckpt.failed_steps[-1] == last,
      "params": island.param_count,
      "flops_per_token": island.flops_per_token,
      "first_loss": logger.first_loss,
      "wall_s": time.perf_counter() - logger.t_start,
      "tokens_per_s": logger.tokens_per_s(last),
      # (gathered from every process where FSDP spans processes)
      "params_sha256": metrics.params_sha256(
          {k: multihost.host_value(v) for k, v in fragments.flatten(state.params).items()}
      ),
      **eval_row,
      **({"corpus_tokens": counts} if counts is not None else {}),
  }


def _corpus_tokens(train_iter) -> list[int] | None:
  """The tokens per corpus this island read (all its processes'); None unless source=corpus."""
  counts = mixture.read_tokens([train_iter])
  return None if counts is None else multihost.summed(counts)
