"""mode=dp: one island trains with SPMD data parallelism over all its devices."""

import math
import os
import time
from typing import Any

import jax
import ml_collections
import tqdm

from diloco import checkpoint, evaluation, island as island_lib, metrics
from diloco import step as step_lib


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Trains config.steps inner steps, resuming from `workdir` when it holds a checkpoint."""
  island = island_lib.build_island(config, jax.devices())
  fns, data = island.fns, island.data
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), config.checkpoint_every)
  state, start = island.restore_or_init(ckpt)
  writer = metrics.MetricsWriter(workdir, resume_step=start if start else None)
  tokens_per_step = config.batch_size * config.seq_len
  is_chief = jax.process_index() == 0
  bar = tqdm.tqdm(total=config.steps, initial=start, disable=not (config.progress_bar and is_chief),
                  unit="step", dynamic_ncols=True)
  t_start = time.perf_counter()
  t_steady, steady_from = None, start
  pending = None  # (step, metrics on device): fetched one step late
  first_loss = None
  eval_row: dict[str, Any] = {}

  def log(step: int, device_metrics) -> float:
    nonlocal t_steady, steady_from
    m = jax.device_get(device_metrics)
    loss = float(m["loss"])
    if not math.isfinite(loss):
      raise FloatingPointError(
          f"loss is {loss} at step {step}; stopping (last checkpoint: step"
          f" {ckpt.latest_step()}). Lower optimizer.lr or check the data.")
    now = time.perf_counter()
    if t_steady is None:  # the first fetched step includes compilation
      t_steady, steady_from = now, step
    rate = (step - steady_from) * tokens_per_step / max(now - t_steady, 1e-9)
    if step % config.log_every == 0 or step == config.steps:
      writer.write({"step": step, "tokens": step * tokens_per_step, "loss": loss,
                    "lr": float(m["lr"]), "grad_norm": float(m["grad_norm"]),
                    "tokens_per_s": rate, "wall_s": now - t_start})
    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}", refresh=False)
    return loss

  last = config.steps
  if config.get("stop_after_steps", 0):
    last = min(config.steps, start + config.stop_after_steps)
  for step in range(start + 1, last + 1):
    batch = step_lib.put_batch(next(data.train_iter), fns.mesh)
    state, device_metrics = fns.train(state, batch)
    if pending is not None:
      loss = log(*pending)
      first_loss = loss if first_loss is None else first_loss
    pending = (step, device_metrics)
    bar.update(1)
    due_eval = step % config.eval_every == 0 or step == config.steps
    due_ckpt = step % config.checkpoint_every == 0 or step == last
    if due_eval or due_ckpt:  # never save or evaluate a state that went non-finite
      loss = log(*pending)
      first_loss = loss if first_loss is None else first_loss
      pending = None
    if due_eval:
      eval_row = evaluation.evaluate(fns, state.params, data)
      writer.write({"step": step, "tokens": step * tokens_per_step, **eval_row})
    if due_ckpt:
      ckpt.save(step, state, data.train_iter, force=step == last)
  if pending is not None:
    log(*pending)
  bar.close()
  ckpt.close()
  writer.close()

  wall = time.perf_counter() - t_start
  steady_tokens = (last - steady_from) * tokens_per_step
  summary = {
      "mode": config.mode, "runtime": "spmd", "steps": last, "finished": last == config.steps,
      "tokens": last * tokens_per_step, "resumed_from_step": start,
      "params": island.param_count, "flops_per_token": island.flops_per_token,
      "first_loss": first_loss, "wall_s": wall,
      "tokens_per_s": steady_tokens / max(time.perf_counter() - t_steady, 1e-9)
                      if t_steady is not None else float("nan"),
      **eval_row,
  }
  if not eval_row:  # resumed at the final step: evaluate what was restored
    summary.update(evaluation.evaluate(fns, state.params, data))
  return summary
