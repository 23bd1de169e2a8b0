"""Held-out loss and, by task, bits per byte (text) or accuracy (images)."""

import math
from typing import Any

import jax
import numpy as np

from diloco.inner import step as step_lib


def evaluate(
    fns: step_lib.StepFns, params: Any, data: Any, final: bool = False
) -> dict[str, float]:
  """Each measure's mean over the records of the evaluation set (`data.eval_set`: its sample, or
  with `final` the final evaluation's records) as eval_<name> (eval_loss, and eval_accuracy for
  images), and bits per byte of the underlying text when there is one. Every record weighs the
  same, so the batching (and the island that scores) does not change the result."""
  batches = data.eval_set.batches(final, multiple=fns.mesh.devices.size)
  # One batch in flight at a time: with every batch of a whole split dispatched at once, XLA's CPU
  # client on several devices deadlocked (one of the all-reduce's participants never arrived, and
  # its 40 s rendezvous timeout aborted the process; tests/test_evaluate.py).
  sums = [jax.device_get(fns.measures(params, step_lib.put_batch(b, fns.mesh))) for b in batches]
  weight = float(np.sum([s.pop("weight") for s in sums], dtype=np.float64))
  out = {
      f"eval_{k}": float(np.sum([s[k] for s in sums], dtype=np.float64)) / weight for k in sums[0]
  }
  if data.bytes_per_token:
    out["eval_bpb"] = out["eval_loss"] / math.log(2) / data.bytes_per_token
  return out
