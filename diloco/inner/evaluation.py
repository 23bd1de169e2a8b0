"""Held-out loss and, by task, bits per byte (text) or accuracy (images)."""

import math
from typing import Any

import jax
import numpy as np

from diloco.inner import step as step_lib


def evaluate(fns: step_lib.StepFns, params: Any, data: Any) -> dict[str, float]:
  """Each measure's mean over the fixed validation batches as eval_<name> (eval_loss, and
  eval_accuracy for images), and bits per byte of the underlying text when there is one."""
  rows = [fns.measures(params, step_lib.put_batch(b, fns.mesh)) for b in data.eval_batches()]
  if not rows:
    raise ValueError("the validation set yields no batch; lower batch_size or seq_len")
  rows = jax.device_get(rows)
  out = {f"eval_{k}": float(np.mean([r[k] for r in rows])) for k in rows[0]}
  if data.bytes_per_token:
    out["eval_bpb"] = out["eval_loss"] / math.log(2) / data.bytes_per_token
  return out
